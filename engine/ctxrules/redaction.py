"""Masking credentials and personal data in what ctxrules writes.

Applied to everything ctxrules *writes* into a context or persists as a summary (the summary
text, the stored structured summaries, the transcript sent to a summarizer model). The vault is
the exception by design: it keeps originals byte for byte (invariant 3, docs/reference/concepts.md), readable only
by the session's owner (files mode 0600).

The built-in patterns (:data:`DEFAULT_PATTERNS`) find

- **credentials**: provider API keys (OpenAI, Anthropic, AWS, GitHub, GitLab, Slack, Stripe,
  Google, Hugging Face, npm, SendGrid), JWTs, bearer/basic ``Authorization`` values, PEM private
  key blocks, passwords in URLs (``scheme://user:password@host``) and ``password=``-style
  assignments of literal values;
- **PII**: e-mail addresses, phone numbers (international ``+CC`` form or the separated
  ``(555) 123-4567`` form) and payment card numbers (13-19 digits that pass the Luhn check and
  start like a card).

They are tuned not to flag what coding transcripts are full of: hashes, UUIDs, git SHAs,
version strings, timestamps, line numbers and identifiers (see ``tests/test_redaction.py``,
which measures the false positives on the real transcripts).

A pack configures this with its ``redaction:`` section::

    redaction:
      defaults: true            # the built-in patterns (default true)
      disabled: [phone]         # built-in pattern ids to leave out
      patterns:                 # extra patterns; items merge by id
        - {id: employee-id, regex: 'EMP-\\d{6}', kind: pii}
        - {id: db-pass, regex: 'DB_PASS=(?P<secret>\\S+)', replacement: '***'}

A match is replaced by ``replacement`` (default ``[REDACTED:<id>]``); when the regex has a group
named ``secret``, only that group is replaced, so the surrounding text (a key name, a user
name) stays readable.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache, lru_cache
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from ctxrules.patterns import Match, Pattern
from ctxrules.patterns import compile as patterns_compile

__all__ = [
    "DEFAULT_PATTERNS",
    "DEFAULT_PATTERN_IDS",
    "Finding",
    "Redaction",
    "RedactionPattern",
    "Redactor",
    "default_redactor",
    "luhn_valid",
    "redactor_for",
]

Kind = Literal["credential", "pii"]
SECRET_GROUP = "secret"


def luhn_valid(digits: str) -> bool:
    """Whether a string of digits passes the Luhn checksum (payment card numbers do)."""
    if not digits.isdigit():
        return False
    total = 0
    for position, char in enumerate(reversed(digits)):
        value = int(char)
        if position % 2 == 1:
            value *= 2
            if value > 9:
                value -= 9
        total += value
    return total % 10 == 0


# Issuer prefixes of the major card networks: Visa 4, Mastercard 51-55 and 2221-2720, Amex
# 34/37, Discover 6011/65/644-649, JCB 3528-3589, Diners 36/38/300-305, UnionPay 62. A Luhn-valid
# run of digits that starts otherwise (millisecond timestamps, ids) is not taken for a card.
# The module's own regexes are compiled on first use, not at import: most commands that import
# this module (``validate``, ``explain``) never redact anything.
@cache
def _card_prefix() -> re.Pattern[str]:
    return re.compile(
        r"^(?:4|5[1-5]|2(?:2[2-9][1-9]|2[3-9]\d|[3-6]\d\d|7[01]\d|720)|3[47]|6011|65|64[4-9]"
        r"|35(?:2[89]|[3-8]\d)|3(?:0[0-5]|[68])|62)"
    )


def _card_number(match: str) -> bool:
    digits = re.sub(r"[ -]", "", match)
    if not 13 <= len(digits) <= 19 or len(set(digits)) < 2:
        return False
    if not _card_prefix().match(digits):
        return False
    groups = re.split(r"[ -]", match)
    if len(groups) > 1:
        # Written with separators: the usual 4-4-4-4(-3) or Amex 4-6-5 layouts only, so that a
        # run of small numbers ("1 2 3 4 ...") is never read as a card.
        sizes = [len(g) for g in groups]
        if sizes not in ([4, 6, 5], [4, 6, 4]) and not (all(s == 4 for s in sizes[:-1]) and 1 <= sizes[-1] <= 4):
            return False
    return luhn_valid(digits)


def _phone_number(match: str) -> bool:
    digits = re.sub(r"\D", "", match)
    if not 8 <= len(digits) <= 15:
        return False
    # Runs such as +00000000 or +12345678 are test data, not numbers of people.
    return len(set(digits)) > 2 and digits not in "0123456789012345"


def _mixed_secret(value: str) -> bool:
    """A literal that looks like a generated secret: long, letters *and* digits, not a path,
    an identifier, a placeholder or an expression."""
    if len(value) < 10 or len(value) > 200:
        return False
    if not (re.search(r"[A-Za-z]", value) and re.search(r"\d", value)):
        return False
    if re.fullmatch(r"[a-z]+(?:_[a-z0-9]+)+", value):  # snake_case identifier with digits
        return False
    lowered = value.lower()
    placeholders = (
        "xxxx",
        "<",
        "${",
        "{{",
        "your",
        "example",
        "changeme",
        "redacted",
        "dummy",
        "placeholder",
        "test",
        "fake",
    )
    return not any(p in lowered for p in placeholders)


@dataclass(frozen=True)
class RedactionPattern:
    """One pattern: what it finds (``regex``), what kind of data that is, and its replacement.

    ``check`` is an extra test of the matched text (e.g. the Luhn checksum); a match it rejects
    is left alone. When ``regex`` has a group named ``secret``, only that group is replaced.
    """

    id: str
    regex: re.Pattern[str] | Pattern  # built-in ones on `re`, a pack's on ctxrules.patterns
    kind: Kind = "credential"
    replacement: str | None = None
    check: Callable[[str], bool] | None = None
    description: str = ""
    hints: tuple[str, ...] = ()
    """Literals of which at least one occurs in every match (case-folded when
    ``hints_casefold``): a text without any is skipped without running the regex."""
    hints_casefold: bool = False

    def may_match(self, text: str, folded: Callable[[], str]) -> bool:
        if not self.hints:
            return True
        haystack = folded() if self.hints_casefold else text
        return any(hint in haystack for hint in self.hints)

    @property
    def mask(self) -> str:
        return self.replacement if self.replacement is not None else f"[REDACTED:{self.id}]"


class _Spec(NamedTuple):
    """A built-in pattern before its regex is compiled (see :func:`default_patterns`)."""

    id: str
    regex: str
    kind: Kind
    check: Callable[[str], bool] | None
    description: str
    flags: int


def _p(
    id_: str,
    regex: str,
    kind: Kind = "credential",
    *,
    check: Callable[[str], bool] | None = None,
    description: str = "",
    flags: int = 0,
) -> _Spec:
    return _Spec(id_, regex, kind, check, description, flags)


# Order matters: specific provider formats first, so that e.g. an Anthropic key is labelled as
# one rather than as a generic "sk-" key; the generic assignment pattern comes last.
# Boundaries use (?<![A-Za-z0-9_]) / (?![A-Za-z0-9_]) so a key glued into a longer token (a
# hash, a path segment) is not cut out of it.
_B = r"(?<![A-Za-z0-9_])"
_E = r"(?![A-Za-z0-9_])"
_PATTERNS: tuple[_Spec, ...] = (
    _p(
        "private-key",
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"
        r"(?:[\s\S]*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|[\s\S]{0,8000})",
        description="PEM/OpenSSH private key blocks (an unterminated one: 8,000 chars masked)",
    ),
    _p(
        "anthropic-key",
        _B + r"sk-ant-(?:api|admin|oat)\d{2}-[A-Za-z0-9_-]{20,}" + _E,
        description="Anthropic API keys",
    ),
    _p(
        "openai-key",
        _B + r"sk-(?:proj-|svcacct-|admin-|None-)?(?=[A-Za-z0-9_-]*\d)(?=[A-Za-z0-9_-]*[A-Za-z])"
        r"[A-Za-z0-9_-]{20,}" + _E,
        description="OpenAI (and OpenAI-style sk-...) API keys",
    ),
    _p(
        "aws-access-key",
        _B + r"(?:AKIA|ASIA|ABIA|ACCA|AROA|AIDA)[0-9A-Z]{16}" + _E,
        description="AWS access key ids",
    ),
    _p(
        "aws-secret-key",
        r"(?i)\baws_?secret_?(?:access_?)?key\b[\"']?\s*[:=]\s*[\"']?(?P<secret>[A-Za-z0-9/+=]{40})" + _E,
        description="AWS secret access keys in an assignment",
    ),
    _p(
        "github-token",
        _B + r"(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})" + _E,
        description="GitHub personal, OAuth, app and fine-grained tokens",
    ),
    _p(
        "gitlab-token",
        _B + r"glpat-[A-Za-z0-9_-]{20,}" + _E,
        description="GitLab personal access tokens",
    ),
    _p(
        "slack-token",
        _B + r"xox[abposr]-(?:\d+-)+[A-Za-z0-9-]{8,}" + _E,
        description="Slack tokens",
    ),
    _p(
        "slack-webhook",
        r"https://hooks\.slack\.com/services/T[A-Z0-9]+/B[A-Z0-9]+/[A-Za-z0-9]{16,}",
        description="Slack incoming-webhook URLs",
    ),
    _p(
        "stripe-key",
        _B + r"(?:sk|rk|whsec)_(?:live|test)_[A-Za-z0-9]{16,}" + _E,
        description="Stripe secret and restricted keys",
    ),
    _p("google-api-key", _B + r"AIza[0-9A-Za-z_-]{35}" + _E, description="Google API keys"),
    _p("huggingface-token", _B + r"hf_[A-Za-z0-9]{30,}" + _E, description="Hugging Face tokens"),
    _p("npm-token", _B + r"npm_[A-Za-z0-9]{36}" + _E, description="npm access tokens"),
    _p(
        "sendgrid-key",
        _B + r"SG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}" + _E,
        description="SendGrid API keys",
    ),
    _p(
        "jwt",
        _B + r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}" + _E,
        description="JSON Web Tokens (header.payload.signature)",
    ),
    _p(
        "bearer-token",
        r"(?i)(?:\bbearer\s+|\bauthorization:\s*(?:token\s+)?)(?P<secret>(?=[A-Za-z0-9._~+/-]*\d)(?=[A-Za-z0-9._~+/-]*[A-Za-z])"
        r"[A-Za-z0-9._~+/-]{20,}=*)",
        description="bearer tokens and Authorization header values (20+ chars, letters and digits)",
    ),
    _p(
        "basic-auth",
        r"(?i)\bauthorization:\s*basic\s+(?P<secret>[A-Za-z0-9+/]{8,}={0,2})",
        description="HTTP basic credentials",
    ),
    _p(
        "url-password",
        r"(?i)\b[a-z][a-z0-9+.-]{1,20}://[^\s:/@\"'<>]+:(?P<secret>[^\s@/\"'<>]+)@[A-Za-z0-9.-]",
        description="the password part of scheme://user:password@host",
    ),
    _p(
        "secret-assignment",
        r"(?i)(?<![A-Za-z0-9])(?:password|passwd|pwd|secret|api[_-]?key|apikey|access[_-]?token"
        r"|auth[_-]?token|client[_-]?secret|secret[_-]?key|private[_-]?key)[\"']?\s*[:=]\s*"
        r"(?P<q>[\"']?)(?P<secret>[^\s\"'`,;(){}\[\]<>]{10,200})(?P=q)(?![A-Za-z0-9(])",
        check=lambda m: _mixed_secret(_secret_of_assignment(m)),
        description="password=/api_key:/secret= assignments of literal values that look generated",
    ),
    _p(
        "email",
        r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9][A-Za-z0-9._%+-]{0,63}@(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}"
        r"[A-Za-z0-9])?\.)+[A-Za-z]{2,24}(?![A-Za-z0-9-])",
        "pii",
        check=lambda m: not _not_personal_email(m),
        description="e-mail addresses (not git@host: remotes, not example.com/.invalid/.local)",
    ),
    _p(
        "phone",
        r"(?<![\w.+/:#=-])(?:\+\d{1,3}[ .-]?(?:\(\d{1,4}\)[ .-]?)?\d{1,4}(?:[ .-]\d{2,5}){1,4}"
        r"|\+\d{8,15}|\(\d{3}\)[ .-]?\d{3}[ .-]\d{4}|\d{3}[.-]\d{3}[.-]\d{4})(?![\w.-]|:\d)",
        "pii",
        check=_phone_number,
        description="phone numbers: +CC international form, (555) 123-4567 and 555-123-4567",
    ),
    _p(
        "card-number",
        r"(?<![\w.-])(?:\d[ -]?){12,18}\d(?![\w.-])",
        "pii",
        check=_card_number,
        description="payment card numbers (13-19 digits, Luhn-valid, a card network's prefix)",
    ),
)

# Most texts hold none of these literals; checking for them first (a substring search) spares
# the regexes, whose boundary lookbehinds make them scan every position.
_HINTS: dict[str, tuple[tuple[str, ...], bool]] = {
    "private-key": (("PRIVATE KEY",), False),
    "anthropic-key": (("sk-ant-",), False),
    "openai-key": (("sk-",), False),
    "aws-access-key": (("AKIA", "ASIA", "ABIA", "ACCA", "AROA", "AIDA"), False),
    "aws-secret-key": (("aws",), True),
    "github-token": (("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"), False),
    "gitlab-token": (("glpat-",), False),
    "slack-token": (("xox",), False),
    "slack-webhook": (("hooks.slack.com",), False),
    "stripe-key": (("_live_", "_test_"), False),
    "google-api-key": (("AIza",), False),
    "huggingface-token": (("hf_",), False),
    "npm-token": (("npm_",), False),
    "sendgrid-key": (("SG.",), False),
    "jwt": (("eyJ",), False),
    "bearer-token": (("bearer", "authorization"), True),
    "basic-auth": (("authorization",), True),
    "url-password": (("://",), False),
    "secret-assignment": (("pass", "pwd", "secret", "key", "token"), True),
    "email": (("@",), False),
}
DEFAULT_PATTERN_IDS: tuple[str, ...] = tuple(p.id for p in _PATTERNS)


@cache
def default_patterns() -> tuple[RedactionPattern, ...]:
    """The built-in patterns, compiled once per process on first use (also importable as
    :data:`DEFAULT_PATTERNS`)."""
    built = []
    for spec in _PATTERNS:
        hints, folded = _HINTS.get(spec.id, ((), False))
        regex = re.compile(spec.regex, spec.flags)
        built.append(RedactionPattern(spec.id, regex, spec.kind, None, spec.check, spec.description, hints, folded))
    return tuple(built)


if TYPE_CHECKING:
    DEFAULT_PATTERNS: tuple[RedactionPattern, ...]


def __getattr__(name: str) -> tuple[RedactionPattern, ...]:
    # DEFAULT_PATTERNS is computed on first access (PEP 562), so importing the module compiles nothing.
    if name == "DEFAULT_PATTERNS":
        return default_patterns()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@cache
def _non_personal_domains() -> re.Pattern[str]:
    return re.compile(r"(?i)(?:^|\.)(?:example\.(?:com|org|net)|[a-z0-9-]+\.(?:invalid|test|example|localhost|local))$")


def _not_personal_email(text: str) -> bool:
    local, _, domain = text.rpartition("@")
    # git@github.com:owner/repo remotes and the like are host logins, not a person's address.
    if local.lower() in {"git", "hg", "svn"}:
        return True
    return bool(_non_personal_domains().search(domain))


@cache
def _assignment_value() -> re.Pattern[str]:
    return re.compile(r"[:=]\s*[\"']?([^\s\"'`,;(){}\[\]<>]+)")


def _secret_of_assignment(text: str) -> str:
    match = _assignment_value().search(text)
    return match.group(1) if match else text


@dataclass(frozen=True)
class Finding:
    """One match: the pattern, its kind, and the span of the masked text in the input."""

    pattern: str
    kind: Kind
    start: int
    end: int
    text: str


@dataclass(frozen=True)
class Redaction:
    """The redacted text and how many matches each pattern masked."""

    text: str
    counts: Mapping[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


class Redactor:
    """Applies an ordered list of patterns; each later pattern sees the earlier ones' masks."""

    def __init__(self, patterns: Iterable[RedactionPattern]) -> None:
        self.patterns: tuple[RedactionPattern, ...] = tuple(patterns)

    def __repr__(self) -> str:
        return f"Redactor({', '.join(p.id for p in self.patterns)})"

    def findings(self, text: str) -> list[Finding]:
        """What each pattern would mask in ``text`` (each pattern run on the original text)."""
        out: list[Finding] = []
        folded = _Folded(text)
        for pattern in self.patterns:
            if not pattern.may_match(text, folded):
                continue
            for match in pattern.regex.finditer(text):
                if pattern.check is not None and not pattern.check(match.group(0)):
                    continue
                start, end = _secret_span(pattern, match)
                if end > start:
                    out.append(Finding(pattern.id, pattern.kind, start, end, text[start:end]))
        return sorted(out, key=lambda f: (f.start, f.end))

    def redact(self, text: str) -> Redaction:
        counts: dict[str, int] = {}
        folded = _Folded(text)
        for pattern in self.patterns:
            if not text:
                break
            if not pattern.may_match(text, folded):
                continue
            text, n = _apply(pattern, text)
            if n:
                counts[pattern.id] = counts.get(pattern.id, 0) + n
                folded = _Folded(text)
        return Redaction(text, counts)

    def __call__(self, text: str) -> str:
        return self.redact(text).text

    def redact_data(self, value: Any) -> Any:
        """A copy of JSON-like data with every string value redacted (keys are kept)."""
        if isinstance(value, str):
            return self.redact(value).text
        if isinstance(value, Mapping):
            return {k: self.redact_data(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.redact_data(v) for v in value]
        return value

    def count_data(self, value: Any) -> int:
        """How many matches the string values of JSON-like data hold."""
        if isinstance(value, str):
            return self.redact(value).total
        if isinstance(value, Mapping):
            return sum(self.count_data(v) for v in value.values())
        if isinstance(value, list | tuple):
            return sum(self.count_data(v) for v in value)
        return 0


class _Folded:
    """``text.casefold()``, computed once and only when a case-folded hint asks for it."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._folded: str | None = None

    def __call__(self) -> str:
        if self._folded is None:
            self._folded = self._text.casefold()
        return self._folded


def _secret_span(pattern: RedactionPattern, match: re.Match[str] | Match) -> tuple[int, int]:
    # by the group's number: an RE2 match takes only numbers in span()/start()/end()
    number = pattern.regex.groupindex.get(SECRET_GROUP)
    if number is not None and match.group(number) is not None:
        return match.span(number)
    return match.span()


def _apply(pattern: RedactionPattern, text: str) -> tuple[str, int]:
    count = 0

    def replace(match: re.Match[str] | Match) -> str:
        nonlocal count
        whole = match.group(0)
        if pattern.check is not None and not pattern.check(whole):
            return whole
        start, end = _secret_span(pattern, match)
        if end <= start:
            # an empty match hides nothing; masking it would put the mask between characters
            return whole
        count += 1
        base = match.start()
        return whole[: start - base] + pattern.mask + whole[end - base :]

    return pattern.regex.sub(replace, text), count


def default_redactor() -> Redactor:
    """A redactor with every built-in pattern."""
    return _build(True, (), ())


def redactor_for(pack: Mapping[str, Any]) -> Redactor:
    """The redactor a resolved pack's ``redaction:`` section describes (cached per section).

    Raises ``ValueError`` naming the pattern when an extra pattern's regex does not compile
    (``ctxrules validate`` reports that as CR070 before a pack is ever run).
    """
    section = pack.get("redaction") or {}
    if not isinstance(section, Mapping):
        section = {}
    defaults = section.get("defaults", True) is not False
    disabled = tuple(sorted(str(x) for x in section.get("disabled") or ()))
    extra: list[tuple[str, str, str, str | None]] = []
    for item in section.get("patterns") or ():
        if not isinstance(item, Mapping) or item.get("enabled") is False:
            continue
        regex, ident = item.get("regex"), item.get("id")
        if not isinstance(regex, str) or not isinstance(ident, str):
            continue
        kind = item.get("kind") if item.get("kind") in ("credential", "pii") else "credential"
        replacement = item.get("replacement")
        extra.append((ident, regex, str(kind), replacement if isinstance(replacement, str) else None))
    return _build(defaults, disabled, tuple(extra))


@lru_cache(maxsize=64)
def _build(defaults: bool, disabled: tuple[str, ...], extra: tuple[tuple[str, str, str, str | None], ...]) -> Redactor:
    # A pack's own patterns run first: they are the more specific ones, and their masks are
    # then left alone by the broader built-in patterns.
    patterns: list[RedactionPattern] = []
    for ident, regex, kind, replacement in extra:
        try:
            compiled = patterns_compile(regex)
        except re.error as exc:
            raise ValueError(f"redaction pattern '{ident}': regex does not compile: {exc}") from exc
        patterns.append(RedactionPattern(ident, compiled, "pii" if kind == "pii" else "credential", replacement))
    if defaults:
        patterns.extend(p for p in default_patterns() if p.id not in disabled)
    return Redactor(patterns)


def describe_defaults() -> list[dict[str, str]]:
    """The built-in patterns as ``{"id", "kind", "description"}`` (docs and ``explain``)."""
    return [{"id": p.id, "kind": p.kind, "description": p.description} for p in default_patterns()]


def redact_json_text(redactor: Redactor, text: str) -> str:
    """Redact a JSON document's string values, keeping it valid JSON (falls back to plain text)."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested past Python's limit
        return redactor(text)
    return json.dumps(redactor.redact_data(data), ensure_ascii=False)
