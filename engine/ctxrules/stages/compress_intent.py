"""``compress.intent``: decide what the compression must keep before anything is removed.

The **compression intent** is built from

- the latest real user message: the file paths (``src/x.py``, ``a/b/c.ts``, ``./run.sh``,
  ``/abs/path/Makefile.am``, bare ``setup.cfg``) and dotted module names (``ctxrules.stages``,
  ``django.db.models``) it mentions;
- the assistant's own text in the newest ``history_steps`` steps (what it says it is working
  on), scanned the same way;
- the tool calls that failed within the newest ``failed_steps`` steps (so the agent can retry
  or explain the error).

Every message that mentions a focus term — in its text or in a tool call's arguments — is
marked **protected** (``ctx.protected``), together with the other half of its tool call: the
result of a matching call (the file's content after ``Read src/x.py``) and the call of a
matching result. Failed calls and their results are protected too. A module ``a.b.c`` also
matches the path ``a/b/c`` (``a/b/c.py``, ``a/b/c/__init__.py``).

What the latest ask names ranks first. The newest message that mentions each file or module of
the latest real user message (with the other half of its tool call) is always protected, so
what the user just asked about is never reduced, archived or removed while that ask is the
latest; only the emergency pass may move it to the vault, leaving a pointer. Every other match
is capped (``max_share`` of the usable window): matches of the ask's terms come first, then the
incidental ones (the assistant's recent text, failed calls), each newest first, and the first
match over the cap ends the protection, so that a latest message naming many files cannot freeze
the whole history. Every later stage except the emergency pass skips protected messages.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from ctxrules.carry import Carry
from ctxrules.hookspecs import hookimpl
from ctxrules.message_memo import MessageMemo
from ctxrules.messages import message_text
from ctxrules.stages.base import Action, StageOutcome, StageType, unchanged
from ctxrules.structure import facts_of, pair_tool_calls, pinned_indices, shape
from ctxrules.text_memo import TextMemo
from ctxrules.toolroles import ToolRoles, tool_roles
from ctxrules.vault import VaultError, is_spill_stand_in, parse_markers

if TYPE_CHECKING:
    from ctxrules.pipeline.context import StageContext
    from ctxrules.vault import Vault

__all__ = ["Intent", "IntentStage", "build_intent", "extract_terms"]

# File extensions a bare name ("setup.cfg") must end with to count as a file; paths with a
# directory part accept any extension.
CODE_EXTENSIONS = frozenset(
    (
        "py",
        "pyi",
        "pyx",
        "ipynb",
        "js",
        "jsx",
        "mjs",
        "cjs",
        "ts",
        "tsx",
        "vue",
        "svelte",
        "java",
        "kt",
        "kts",
        "scala",
        "groovy",
        "go",
        "rs",
        "c",
        "h",
        "cc",
        "cpp",
        "cxx",
        "hpp",
        "hh",
        "m",
        "mm",
        "swift",
        "rb",
        "php",
        "pl",
        "pm",
        "lua",
        "r",
        "jl",
        "ex",
        "exs",
        "erl",
        "hrl",
        "hs",
        "ml",
        "mli",
        "fs",
        "fsx",
        "cs",
        "vb",
        "dart",
        "zig",
        "nim",
        "pony",
        "sh",
        "bash",
        "zsh",
        "fish",
        "ps1",
        "bat",
        "sql",
        "graphql",
        "proto",
        "thrift",
        "json",
        "jsonl",
        "yaml",
        "yml",
        "toml",
        "ini",
        "cfg",
        "conf",
        "env",
        "xml",
        "html",
        "htm",
        "css",
        "scss",
        "sass",
        "less",
        "md",
        "rst",
        "txt",
        "csv",
        "tsv",
        "lock",
        "gradle",
        "cmake",
        "mk",
        "make",
        "dockerfile",
        "tf",
        "hcl",
        "nix",
    )
)
_NOT_MODULE_FIRST = frozenset({"self", "cls", "this", "e", "i", "eg", "ie", "etc", "vs", "cf"})
_TLDS = frozenset(
    {
        "com",
        "org",
        "net",
        "io",
        "dev",
        "ai",
        "co",
        "uk",
        "de",
        "fr",
        "edu",
        "gov",
        "app",
        "me",
        "info",
        "us",
        "cn",
        "jp",
        "ru",
        "html",
        "htm",
        "php",
    }
)

_SEGMENT = r"[\w@+-][\w@+.-]*"
_FILE = r"[\w@+-][\w@+.-]*\.[A-Za-z][A-Za-z0-9]{0,9}"
_PATH_RE = re.compile(
    r"(?<![\w@+.~/-])("
    rf"(?:~|\.{{1,2}})?/(?:{_SEGMENT}/)*{_FILE}"  # /abs/x.py, ./x.py, ../x.py, ~/x.py
    rf"|(?:{_SEGMENT}/)+{_FILE}"  # src/x.py
    r")(?![\w/-])"
)
_BARE_FILE_RE = re.compile(r"(?<![\w@+.~/-])([\w@+-][\w@+-]*(?:\.[\w@+-]+)*\.([A-Za-z][A-Za-z0-9]{0,9}))(?![\w/-])")
_MODULE_RE = re.compile(r"(?<![\w./:@-])([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+)(?![\w(/-])")
_DOT_WORD = re.compile(r"\.[A-Za-z_]")  # in every match of the three above (see _terms)


def extract_terms(text: str, *, limit: int = 64) -> tuple[list[str], list[str]]:
    """``(file paths, module names)`` mentioned in ``text``, in order of first mention."""
    files, modules = _terms(text, limit)
    return list(files), list(modules)


def _terms(text: str, limit: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    # Remembered per text: every turn reads the latest ask and the newest steps again.
    return _TEXT_TERMS.get(text, limit, lambda t: _find_terms(t, limit))


_TEXT_TERMS: TextMemo[tuple[tuple[str, ...], tuple[str, ...]]] = TextMemo(256)


def _find_terms(text: str, limit: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    # Every term holds a dot before a letter (a file's extension, a module's separator), a
    # path also a slash: a text without them (prose ends its sentences with a dot and a space)
    # is spared the regexes, which try every position.
    if _DOT_WORD.search(text) is None:
        return (), ()
    files: dict[str, None] = {}
    modules: dict[str, None] = {}
    for match in _PATH_RE.finditer(text) if "/" in text else ():
        path = match.group(1)
        # "./x.py" and "x.py" name the same file; the match then finds "/abs/.../x.py" too.
        files[path[2:] if path.startswith("./") else path] = None
    for match in _BARE_FILE_RE.finditer(text):
        if match.group(2).lower() in CODE_EXTENSIONS:
            files.setdefault(match.group(1), None)
    for match in _MODULE_RE.finditer(text):
        name = match.group(1)
        parts = name.split(".")
        last = parts[-1].lower()
        if last in CODE_EXTENSIONS or last in _TLDS or parts[0].lower() in _NOT_MODULE_FIRST:
            continue
        if len(name) < 5 or max(len(p) for p in parts) < 3:
            continue
        # Module paths are lower-case by convention; "ds.Rows" or "Dataset.pixel_array" are
        # attribute accesses, not modules being discussed.
        if not all(p[0].islower() or p[0] == "_" for p in parts):
            continue
        if any(name in f for f in files):
            continue
        modules[name] = None
    return tuple(files)[:limit], tuple(modules)[:limit]


@dataclass
class Intent:
    """What the compression must keep: focus files, modules and recently failed calls."""

    files: list[str] = field(default_factory=list)
    modules: list[str] = field(default_factory=list)
    failed_calls: list[str] = field(default_factory=list)
    # The files and modules the latest real user message itself names (a subset of the above).
    asked: list[str] = field(default_factory=list)

    def pattern(self) -> re.Pattern[str] | None:
        """One regex that finds any focus term (a module also as its path form)."""
        return _terms_pattern(tuple(self.needles()))

    def needles(self) -> tuple[str, ...]:
        """The literal strings :meth:`pattern` looks for (a cheap prefilter)."""
        return (*self.files, *self.modules, *(m.replace(".", "/") for m in self.modules))

    def asked_needles(self) -> dict[str, tuple[str, ...]]:
        """Each asked term with the literal strings that find it (a module also as its path)."""
        modules = set(self.modules)
        return {t: (t, t.replace(".", "/")) if t in modules else (t,) for t in self.asked}

    def as_dict(self) -> dict[str, list[str]]:
        return {"files": self.files, "modules": self.modules, "failed_calls": self.failed_calls, "asked": self.asked}


@lru_cache(maxsize=256)
def _terms_pattern(terms: tuple[str, ...]) -> re.Pattern[str] | None:
    # Remembered per term set: the same ask is matched again on every warm turn.
    if not terms:
        return None
    alternatives = "|".join(re.escape(t) for t in sorted(set(terms), key=len, reverse=True))
    return re.compile(rf"(?<![\w-])(?:{alternatives})(?![\w-])")


def build_intent(
    messages: Sequence[Mapping[str, Any]],
    pack: Mapping[str, Any],
    *,
    history_steps: int = 3,
    failed_steps: int = 5,
    max_terms: int = 64,
    vault: Vault | None = None,
) -> Intent:
    """The intent of ``messages``: see the module docstring. ``vault``: where the texts that
    were spilled are read back from (see :func:`_message_terms`)."""
    intent = Intent()
    known = shape(messages)
    facts = known.facts
    users = known.where("real_user")
    latest = users[-1] if users else None
    read: list[Mapping[str, Any]] = []  # the messages whose text gives the focus terms
    if latest is not None:
        read.append(messages[latest])
        asked_files, asked_modules = _message_terms(messages[latest], max_terms, vault)
        intent.asked = [*asked_files, *asked_modules]
    # The newest assistant messages, as many as either option looks at (newest first).
    wanted = max(history_steps, failed_steps, 1)
    assistants: list[int] = []
    for i in range(len(facts) - 1, -1, -1):
        if facts[i].role == "assistant":
            assistants.append(i)
            if len(assistants) == wanted:
                break
    read.extend(messages[i] for i in assistants[:history_steps])
    files: dict[str, None] = {}
    modules: dict[str, None] = {}
    for msg in read:
        f, m = _message_terms(msg, max_terms, vault)
        files.update(dict.fromkeys(f))
        modules.update(dict.fromkeys(m))
    intent.files = list(files)[:max_terms]
    intent.modules = list(modules)[:max_terms]
    if failed_steps > 0 and assistants:
        # Stages run after normalize.tool_pairs: every tool result here answers a call.
        boundary = assistants[min(failed_steps, len(assistants)) - 1]
        roles = tool_roles(pack)
        for index in range(boundary, len(messages)):
            if facts[index].role != "tool":
                continue
            msg = messages[index]
            cid = msg.get("tool_call_id")
            if isinstance(cid, str) and cid and _failed(msg, roles):
                intent.failed_calls.append(cid)
    return intent


# Per message object: what its text gives (the latest ask and the newest steps are read on
# every turn, and a text made of parts would be joined, hashed and compared again for a memo
# keyed by text).
_FAILED: MessageMemo[bool] = MessageMemo()


def _message_terms(
    msg: Mapping[str, Any], limit: int, vault: Vault | None = None
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """:func:`extract_terms` of the message's text (tuples: shared, never changed). With
    ``vault``, of what a spilled text stands for: the ask a first run read whole is still the ask
    when a run on its own output reads its stand-in (invariant 4)."""
    if vault is not None:
        ids = _STAND_INS.get(msg, None, _stand_in_ids)
        if ids:
            key = (ids, limit)
            known = _SPILLED_TERMS.get(key)
            if known is None:
                text = _spilled_text(msg, vault)
                if text is None:  # an item that cannot be read: its stand-in is all there is
                    return _TERMS.get(msg, limit, lambda m: _terms(message_text(m), limit))
                if len(_SPILLED_TERMS) > 256:
                    _SPILLED_TERMS.clear()
                # Vault ids are digests of what they hold: the same ids, the same terms.
                known = _SPILLED_TERMS[key] = _terms(text, limit)
            return known
    return _TERMS.get(msg, limit, lambda m: _terms(message_text(m), limit))


def _stand_in_ids(msg: Mapping[str, Any]) -> tuple[str, ...]:
    """The vault ids of the spill stand-ins the message's content is (or its text parts are)."""
    content = msg.get("content")
    texts = [content] if isinstance(content, str) else _part_texts(content)
    return tuple(vid for text in texts if is_spill_stand_in(text) and (vid := _stand_in_id(text)))


def _part_texts(content: Any) -> list[str]:
    if not isinstance(content, list):
        return []
    return [
        t for p in content if isinstance(p, Mapping) and p.get("type") == "text" and isinstance(t := p.get("text"), str)
    ]


def _stand_in_id(stand_in: str) -> str:
    markers = parse_markers(stand_in[: stand_in.find("\n")] if "\n" in stand_in else stand_in)
    return markers[0].vault_id if markers else ""


def _spilled_text(msg: Mapping[str, Any], vault: Vault) -> str | None:
    """The message's text with each spill stand-in read back from the vault; None when an
    item cannot be read."""

    def original(text: str) -> str:
        if not is_spill_stand_in(text):
            return text
        vid = _stand_in_id(text)
        if not vid:
            return text
        return vault.get_text(vid)

    content = msg.get("content")
    try:
        if isinstance(content, str):
            return message_text({**msg, "content": original(content)})
        parts = [
            {**p, "text": original(p["text"])}
            if isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str)
            else p
            for p in content or []
        ]
    except (VaultError, OSError):
        return None
    return message_text({**msg, "content": parts})


def _scan_text(msg: Mapping[str, Any], vault: Vault | None) -> str:
    """The text a message is searched in for the focus terms: for a spill stand-in, what it
    stands for. The first run matched a hard-spilled output (or ask) before the spill; a run on
    its own output must match it alike (invariant 4). Read once per session: a warm turn
    searches only the new messages."""
    if vault is not None and _STAND_INS.get(msg, None, _stand_in_ids):
        text = _spilled_text(msg, vault)
        if text is not None:
            return text
    return message_text(msg)


_TERMS: MessageMemo[tuple[tuple[str, ...], tuple[str, ...]]] = MessageMemo()
_STAND_INS: MessageMemo[tuple[str, ...]] = MessageMemo()
# (vault ids, limit) -> the terms of what they hold (see _message_terms).
_SPILLED_TERMS: dict[tuple[tuple[str, ...], int], tuple[tuple[str, ...], tuple[str, ...]]] = {}


def _failed(msg: Mapping[str, Any], roles: ToolRoles) -> bool:
    """Whether the tool result ``msg`` reports a failure (:meth:`ToolRoles.is_error`)."""
    return _FAILED.get(msg, roles, lambda m: roles.is_error(message_text(m)))


def _arguments_text(msg: Mapping[str, Any]) -> str:
    parts = []
    for call in msg.get("tool_calls") or []:
        fn = call.get("function") if isinstance(call, Mapping) else None
        args = fn.get("arguments") if isinstance(fn, Mapping) else None
        if isinstance(args, str):
            parts.append(args)
        elif isinstance(args, Mapping):
            parts.append(" ".join(str(v) for v in args.values()))
    return "\n".join(parts)


class IntentStage:
    """The configured stage; see the module docstring."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.history_steps = int(options.get("history_steps", 3))
        self.failed_steps = int(options.get("failed_steps", 5))
        self.max_share = float(options.get("max_share", 0.25))
        self.max_terms = int(options.get("max_terms", 64))
        # Per session, what the last list's messages matched (see _matches).
        self._text_carry: Carry[_TextMatches] = Carry()
        self._ids_carry: Carry[dict[str, tuple[int, ...]]] = Carry()

    def __call__(self, messages: Sequence[dict[str, Any]], ctx: StageContext) -> StageOutcome:
        intent = build_intent(
            messages,
            ctx.pack,
            history_steps=self.history_steps,
            failed_steps=self.failed_steps,
            max_terms=self.max_terms,
            vault=ctx.vault,
        )
        ctx.state["intent"] = intent.as_dict()
        if not (intent.files or intent.modules or intent.failed_calls):
            return StageOutcome(messages=unchanged(messages))  # nothing to match, protect or say
        hits, asked_of = self._matches(messages, intent, ctx.session_id, ctx.vault)
        # The ask's matches first, then the incidental ones; each newest first.
        ranked = [*sorted(asked_of, reverse=True), *sorted(hits - asked_of.keys(), reverse=True)]
        pinned = pinned_indices(messages) if ranked else frozenset()
        # The newest mention of an asked term is most often the ask itself (pinned: kept as it
        # is anyway): what is always protected is the newest mention besides the pinned ones.
        always = _newest_per_term({i: terms for i, terms in asked_of.items() if i not in pinned})
        cap = int(self.max_share * ctx.budget.usable)
        counts = dict(zip(ranked, ctx.counter.count_each([messages[i] for i in ranked]), strict=True))
        used = 0
        protected: list[int] = []
        skipped = 0
        for index in sorted(always, reverse=True):
            if index not in pinned and id(messages[index]) not in ctx.protected:
                used += counts[index]
                protected.append(index)
        # A prefix of the ranked matches: the first one over the cap ends the protection.
        # (Skipping it and protecting older, smaller ones would make protection depend on sizes
        # that later stages change, and a run on its own output could then compress what the
        # first run kept: invariant 4.)
        for index in ranked:
            if index in always or index in pinned or id(messages[index]) in ctx.protected:
                continue
            if skipped or used + counts[index] > cap:
                skipped += 1
                continue
            used += counts[index]
            protected.append(index)
        ctx.protected.update(id(messages[i]) for i in protected)
        actions = []
        if intent.files or intent.modules or intent.failed_calls:
            focus = ", ".join([*intent.files, *intent.modules][:12]) or "-"
            detail = (
                f"focus: {focus}; failed calls: {len(intent.failed_calls)}; protected "
                f"{len(protected)} message(s), {used} tokens"
            )
            if always:
                detail += f" ({len(always)} always, for what the latest ask names)"
            if skipped:
                detail += f"; {skipped} more matched over the cap of {cap} tokens (max_share)"
            actions.append(Action("intent", detail))
        return StageOutcome(messages=unchanged(messages), actions=actions)

    def _matches(
        self, messages: Sequence[Mapping[str, Any]], intent: Intent, session: str = "", vault: Vault | None = None
    ) -> tuple[set[int], dict[int, frozenset[str]]]:
        """Every matching index, and for those that match what the latest ask names, which of
        its terms they mention (a call's result shares its call's terms and the reverse).

        What a message matches depends on it and the intent's terms alone: on a list that
        extends the last one of this session (a warm turn) under the same terms, the older
        messages' matches are carried over and only the new messages are searched."""
        pattern = intent.pattern()
        failed = set(intent.failed_calls)
        if pattern is None and not failed:
            return set(), {}
        facts = shape(messages).facts
        asked = intent.asked_needles()
        hits: set[int] = set()
        asked_of: dict[int, frozenset[str]] = {}
        if pattern is not None:
            hits, asked_of = self._text_matches(messages, facts, intent, pattern, asked, session, vault)
        if failed:
            by_id = self._results_by_id(messages, facts, session)
            found = [i for cid in failed for i in by_id.get(cid, ())]
            if found:
                hits, asked_of = set(hits), dict(asked_of)  # the carried ones stay as they are
                hits.update(found)
                _pair_in(messages, pair_tool_calls(messages), pattern, asked, found, hits, asked_of)
        return set(hits), dict(asked_of)

    def _text_matches(
        self,
        messages: Sequence[Mapping[str, Any]],
        facts: Sequence[Any],
        intent: Intent,
        pattern: re.Pattern[str],
        asked: Mapping[str, tuple[str, ...]],
        session: str,
        vault: Vault | None = None,
    ) -> tuple[set[int], dict[int, frozenset[str]]]:
        """The messages whose text or call arguments mention a focus term, with the other half
        of each such call (see :func:`_pair_in`); the asked terms of each.

        On a list that extends the session's last one under the same terms, the older
        messages' matches are carried over: only the new messages are searched, and only the
        old calls that a new result answers are looked at again."""
        needles = intent.needles()
        terms_key = (needles, tuple(asked.items()))
        start, carried = self._text_carry.resume(session, messages, terms_key, alike=_alike)
        if carried is not None:
            direct, direct_asked, hits, asked_of = carried
            direct, direct_asked, hits, asked_of = set(direct), dict(direct_asked), set(hits), dict(asked_of)
        else:
            direct, direct_asked, hits, asked_of = set(), {}, set(), {}
        new: list[int] = []
        for index in range(start, len(messages)):
            if facts[index].injected:
                continue
            msg = messages[index]
            for text in (_scan_text(msg, vault), _arguments_text(msg)):
                # A plain substring test first (C speed); the regex only confirms the boundaries.
                if any(n in text for n in needles) and pattern.search(text):
                    if index not in direct:
                        new.append(index)
                        direct.add(index)
                    terms = _asked_in(text, asked)
                    if terms:
                        direct_asked[index] = direct_asked.get(index, frozenset()) | terms
        if new or start:
            pairing = pair_tool_calls(messages)
            for index in new:
                hits.add(index)
                if index in direct_asked:
                    asked_of[index] = asked_of.get(index, frozenset()) | direct_asked[index]
            _pair_in(messages, pairing, pattern, asked, new, hits, asked_of)
            # An older matching call that a new result answers: that result is its other half.
            for index in range(start, len(messages)):
                key = pairing.call_of.get(index)
                if key is not None and key[0] < start and key[0] in direct:
                    _pair_call(messages, pattern, asked, key, index, hits, asked_of)
        self._text_carry.keep(session, messages, terms_key, (direct, direct_asked, hits, asked_of))
        return hits, asked_of

    def _results_by_id(
        self, messages: Sequence[Mapping[str, Any]], facts: Sequence[Any], session: str
    ) -> Mapping[str, tuple[int, ...]]:
        """The tool results (not injected) by the call id they carry; carried over like the
        text matches, so a warm turn looks only at the new messages."""
        start, carried = self._ids_carry.resume(session, messages, (), alike=_alike)
        by_id = dict(carried) if carried is not None else {}
        for index in range(start, len(messages)):
            msg = messages[index]
            cid = msg.get("tool_call_id")
            if not facts[index].injected and msg.get("role") == "tool" and isinstance(cid, str):
                by_id[cid] = (*by_id.get(cid, ()), index)
        self._ids_carry.keep(session, messages, (), by_id)
        return by_id


def _alike(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether the stage finds the same in ``new`` as in ``old``, another object at the same
    position of the next list (Carry.resume): the same facts (role, injected, calls, the call
    answered), tool calls, call id and text. A warm turn's list is the last output, on which
    ``cache.markers`` put its breakpoints: a content made one text part with cache_control."""
    try:
        return (
            facts_of(old) == facts_of(new)
            and old.get("tool_call_id") == new.get("tool_call_id")
            and old.get("tool_calls") == new.get("tool_calls")
            and message_text(old) == message_text(new)
        )
    except Exception:  # a value whose comparison fails (not JSON): not known to be alike
        return False


_TextMatches = tuple[set[int], dict[int, frozenset[str]], set[int], dict[int, frozenset[str]]]
"""What _text_matches keeps per session: the direct matches and their asked terms, then the
same with the other halves of their calls added."""


def _pair_in(
    messages: Sequence[Mapping[str, Any]],
    pairing: Any,
    pattern: re.Pattern[str] | None,
    asked: Mapping[str, tuple[str, ...]],
    indices: Sequence[int],
    hits: set[int],
    asked_of: dict[int, frozenset[str]],
) -> None:
    """Adds the other half of each matched call at ``indices``: a result's call (with the
    result's asked terms), and the result of each call of an assistant message whose own
    arguments match. What it adds does not depend on the order the indices come in (a call's
    arguments are part of its message's text), so matches carried over from the last turn and
    the new ones can be expanded apart."""
    for index in indices:
        key = pairing.call_of.get(index)
        if key is not None:
            hits.add(key[0])
            if index in asked_of:
                asked_of[key[0]] = asked_of.get(key[0], frozenset()) | asked_of[index]
        if pattern is not None and messages[index].get("role") == "assistant":
            for pos in range(len(messages[index].get("tool_calls") or [])):
                result = pairing.result_of.get((index, pos))
                if result is not None:
                    _pair_call(messages, pattern, asked, (index, pos), result, hits, asked_of)


def _pair_call(
    messages: Sequence[Mapping[str, Any]],
    pattern: re.Pattern[str],
    asked: Mapping[str, tuple[str, ...]],
    key: tuple[int, int],
    result: int,
    hits: set[int],
    asked_of: dict[int, frozenset[str]],
) -> None:
    """The result of the call ``key`` is matched when that call's own arguments match."""
    calls = messages[key[0]].get("tool_calls") or []
    if key[1] >= len(calls):
        return
    args = _arguments_text({"tool_calls": [calls[key[1]]]})
    if pattern.search(args):
        hits.add(result)
        terms = _asked_in(args, asked)
        if terms:
            asked_of[result] = asked_of.get(result, frozenset()) | terms


def _asked_in(text: str, asked: Mapping[str, tuple[str, ...]]) -> frozenset[str]:
    """The asked terms ``text`` mentions, on the same word boundaries as the focus pattern."""
    found = set()
    for term, forms in asked.items():
        present = tuple(f for f in forms if f in text)
        if present:
            pattern = _terms_pattern(present)
            if pattern is not None and pattern.search(text):
                found.add(term)
    return frozenset(found)


def _newest_per_term(asked_of: Mapping[int, frozenset[str]]) -> set[int]:
    """For each asked term, the newest message that mentions it, with the other half of its
    tool call when that half mentions the term too (a read's call and its result)."""
    newest: dict[str, int] = {}
    for index in sorted(asked_of, reverse=True):
        for term in asked_of[index]:
            newest.setdefault(term, index)
    keep = set(newest.values())
    # A call and its result are adjacent halves of one step; keep both when both name the term.
    for term, index in newest.items():
        for other in (index - 1, index + 1):
            if term in asked_of.get(other, frozenset()):
                keep.add(other)
    return keep


STAGE_TYPE = StageType(
    name="compress.intent",
    phase="content",
    factory=IntentStage,
    description="Builds the compression intent (files and modules the latest ask and recent "
    "steps mention, recently failed tool calls) and protects the messages that "
    "match it from every later stage except the emergency pass.",
    options_schema={
        "type": "object",
        "title": "compress.intent options",
        "description": "Where the intent comes from and how much it may protect.",
        "additionalProperties": False,
        "properties": {
            "history_steps": {
                "title": "Assistant steps scanned",
                "description": "File paths and modules in the assistant's text of the newest N "
                "steps join the focus (0: the latest user message only).",
                "type": "integer",
                "minimum": 0,
                "default": 3,
            },
            "failed_steps": {
                "title": "Failed calls looked at (steps)",
                "description": "Tool calls that failed within the newest N steps are protected "
                "with their results (0: none).",
                "type": "integer",
                "minimum": 0,
                "default": 5,
            },
            "max_share": {
                "title": "Most protected (share of the usable window)",
                "description": "Protection stops, newest matches first, once the protected "
                "messages reach this share of the usable window.",
                "type": "number",
                "minimum": 0,
                "maximum": 1,
                "default": 0.25,
            },
            "max_terms": {
                "title": "Most focus terms",
                "description": "At most this many file paths and this many module names make up the focus.",
                "type": "integer",
                "minimum": 1,
                "default": 64,
            },
        },
    },
)


@hookimpl
def ctxrules_register_stages(register: Callable[[StageType], None]) -> None:
    register(STAGE_TYPE)
