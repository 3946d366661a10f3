"""Keyed tags: how ctxrules knows a message is one it injected, with nothing extra on the wire.

Every message ctxrules puts into a conversation (summary, notes, reread, notices, placeholders,
synthetic tool results) opens its text with a tag such as::

    <ctxrules:notes count="3" sig="3f9a0c1d5e7b2a64">

``sig`` is an HMAC-SHA256 (truncated to 16 hex digits), under a key only ctxrules holds, of
everything the message holds: its first text with the `` sig="..."`` attribute taken out and,
when the content is a list with more than that one text part, every other part too
(:class:`OtherParts`). A message is injected when its tag verifies; a tagged text whose
signature does not verify (a user pasting an earlier summary, a tool printing
``<ctxrules:summary ...>``) is an ordinary message. Nothing but the text carries the mark, so
the output is sendable to endpoints that reject unknown message fields (invariant 8,
docs/reference/concepts.md).

**Why the whole message.** Stages drop and replace injected messages (a new notes rendering,
a summary replacing the last one, removed steps merged into one placeholder). A caller that
copies a signed tag into a message of its own (a notes message merged with the next question
into one user turn, an image added to it) must not have its text or image dropped with it: the
signature covers everything that would be lost by treating the message as ours. A text alone
(a string content, or a list holding only that text part) is signed as the text, as ctxrules
always did, so a session whose history was signed by an earlier version keeps its marks; the
payload of a message with other parts opens with NUL, which no text payload can (a tag opens
the text), so neither form passes for the other.

**The key** is 32 random bytes in ``injection.key`` (hex, mode 0600, created on first use) in the
state root when the session has one, else in the session directory. Sessions that share a
state root share the key, so history moved between them keeps its marks. A session's
``prepare`` runs under its key (:func:`key_scope`); code outside any session (a stage called on
its own) signs with a per-process key and recognises what any session of the process signed.

**Cost.** Most texts do not start with ``<ctxrules:`` and are decided without hashing. A
tagged text is verified once and remembered per key (by the text string, whose hash Python
caches), so the warm path does not hash the same summary on every stage. A message with other
parts is remembered by the text and a hashable copy of those parts that shares their strings
(an image's data is hashed by Python once, not serialized on every stage).
"""

from __future__ import annotations

import contextvars
import hmac
import json
import re
import secrets
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ctxrules.scoped import Scoped

if TYPE_CHECKING:
    from ctxrules.stores.base import Store


def _filesystem_store(root: Path) -> Store:
    # The store package (locks, staging, the session layout) only where a key is read or made:
    # the stage modules that import this one are also loaded to validate a pack, which never
    # reads a key.
    from ctxrules.stores.filesystem import FilesystemStore

    return FilesystemStore(root)


__all__ = [
    "KEY_FILE",
    "InjectionKey",
    "OtherParts",
    "TagHead",
    "current_key",
    "existing_secret",
    "key_for_session",
    "key_in_store",
    "key_scope",
    "parse_head",
]

KEY_FILE = "injection.key"
SIG_HEX = 16
_MEMO_LIMIT = 4096

# "<ctxrules:" + kind + attributes (quoted or bare values) + optional "/" + ">". The signature,
# when present, is the last attribute.
_ATTR = r'[a-z_][a-z0-9_.-]*=(?:"[^"\n]*"|[^\s"/>]+)'
_HEAD_RE = re.compile(
    rf"\s*<ctxrules:(?P<kind>[a-z][a-z0-9_.-]*)(?P<attrs>(?:[ \t]+{_ATTR})*?)"
    rf'(?P<sig>[ \t]+sig="(?P<hex>[0-9a-f]{{{SIG_HEX}}})")?[ \t]*(?P<close>/?)>'
)
_ATTR_RE = re.compile(r'([a-z_][a-z0-9_.-]*)=(?:"([^"\n]*)"|([^\s"/>]+))')


class TagHead:
    """A parsed opening tag: kind, attributes (unescaped), where the signature sits."""

    __slots__ = ("attrs", "close", "end", "kind", "sig", "sig_span")

    def __init__(self, match: re.Match[str]) -> None:
        self.kind = match.group("kind")
        self.attrs = {
            m.group(1): _unescape(m.group(2) if m.group(2) is not None else m.group(3))
            for m in _ATTR_RE.finditer(match.group("attrs"))
        }
        self.sig = match.group("hex")
        self.sig_span = match.span("sig") if self.sig is not None else None
        self.close = match.group("close")
        self.end = match.end()


def parse_head(text: str) -> TagHead | None:
    """The opening ``<ctxrules:KIND ...>`` tag of ``text`` (signed or not), or ``None``."""
    match = _HEAD_RE.match(text)
    return TagHead(match) if match is not None else None


def format_attr(value: object) -> str:
    text = str(value).replace("&", "&amp;").replace('"', "&quot;")
    return '"' + text.replace("<", "&lt;").replace(">", "&gt;") + '"'


def _unescape(value: str) -> str:
    if "&" not in value:
        return value
    return value.replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


class OtherParts:
    """What a list content holds besides the text part a tag opens: every other part, in order,
    and where the signed one sits. Each part is taken without ``cache_control``, a caching hint
    a client (or the ``cache.markers`` stage) adds to the last parts of a request, not content
    anything would lose; keys are taken in sorted order, so a client that rebuilds the dicts
    keeps the mark."""

    __slots__ = ("at", "key", "parts")

    def __init__(self, content: Sequence[object], at: int) -> None:
        self.at = at
        self.parts = [_without_cache_hint(part) for i, part in enumerate(content) if i != at]
        key: Hashable | None
        try:
            key = (at, tuple(_frozen(part) for part in self.parts))
        except (TypeError, RecursionError):  # not JSON data (the Python API): nothing verifies
            key = None
        self.key = key
        """What the memo knows the parts by; ``None`` for parts that are not JSON data."""

    def payload(self, text: str) -> str:
        """The signed string: NUL, then the signed text and the other parts as canonical JSON."""
        return "\x00" + json.dumps(
            [self.at, text, self.parts], ensure_ascii=False, sort_keys=True, separators=(",", ":")
        )


def _without_cache_hint(part: object) -> object:
    if isinstance(part, Mapping) and "cache_control" in part:
        return {k: v for k, v in part.items() if k != "cache_control"}
    return part


def _frozen(value: object) -> Hashable:
    """``value`` (JSON data) as a hashable value equal for equal JSON: strings as they are (their
    hash is cached), objects as sets of items, arrays as tuples, other scalars with their type
    (``1``, ``1.0`` and ``true`` are equal in Python, not in JSON)."""
    kind = type(value)
    if kind is str:
        return value
    if isinstance(value, Mapping):
        if not all(type(k) is str for k in value):
            raise TypeError("a JSON object has string keys")
        return ("{", frozenset((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return ("[", tuple(_frozen(v) for v in value))
    if kind not in _SCALARS:
        raise TypeError(f"not JSON data: {kind.__name__}")
    return (kind.__name__, value)


_SCALARS = frozenset({int, float, bool, type(None)})


class InjectionKey:
    """The secret that signs and verifies tags, with a memo of texts already verified."""

    __slots__ = ("_memo", "_secret")

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("an injection key needs at least 16 bytes")
        self._secret = secret
        self._memo: dict[Hashable, TagHead | None] = {}

    def __repr__(self) -> str:  # never show the secret
        return "InjectionKey(...)"

    def _digest(self, text: str, others: OtherParts | None) -> str:
        payload = text if others is None else others.payload(text)
        return hmac.digest(self._secret, payload.encode("utf-8", "surrogatepass"), "sha256").hex()[:SIG_HEX]

    def sign(self, text: str, others: OtherParts | None = None) -> str:
        """``text`` (which must open with a tag) with its signature set for its current content
        and, when the message has them, its other parts ``others``."""
        head = parse_head(text)
        if head is None:
            raise ValueError("only a text that opens with a <ctxrules:KIND> tag can be signed")
        if others is not None and others.key is None:
            raise TypeError("only a message of JSON data can be signed")
        if head.sig_span is not None:
            a, b = head.sig_span
            text = text[:a] + text[b:]
            head = parse_head(text)
            assert head is not None
        at = head.end - 1 - len(head.close)
        signed = f'{text[:at]} sig="{self._digest(text, others)}"{text[at:]}'
        self._remember(_memo_key(signed, others), parse_head(signed))
        return signed

    def verified(self, text: str, others: OtherParts | None = None) -> TagHead | None:
        """The head of ``text`` when it opens with a tag signed under this key for this text and
        the message's other parts ``others`` (``None``: the text is all the message holds)."""
        if others is not None and others.key is None:
            return None
        memo = self._memo
        key = _memo_key(text, others)
        if key in memo:
            return memo[key]
        head = parse_head(text)
        good: TagHead | None = None
        if head is not None and head.sig_span is not None:
            a, b = head.sig_span
            try:
                digest = self._digest(text[:a] + text[b:], others)
            except (TypeError, ValueError):  # not JSON data (the Python API): not ours
                digest = ""
            if digest and hmac.compare_digest(digest, head.sig or ""):
                good = head
        self._remember(key, good)
        return good

    def _remember(self, key: Hashable, head: TagHead | None) -> None:
        if len(self._memo) >= _MEMO_LIMIT:
            self._memo.clear()
        self._memo[key] = head

    @classmethod
    def load_or_create(cls, path: Path) -> InjectionKey:
        """The key in ``path``; a new random one is written there (mode 0600) when it is absent.

        Two processes creating it at once agree: the file is created exclusively and the loser
        reads the winner's key. Symlinks are not followed (the filesystem store's secrets)."""
        path = Path(path)
        return cls(_filesystem_store(path.parent).secret(None, path.name, lambda: secrets.token_bytes(32)))


def _memo_key(text: str, others: OtherParts | None) -> Hashable:
    return text if others is None else (text, others.key)


def key_for_session(session_dir: Path, state_root: Path | None) -> InjectionKey:
    """The key a session signs with: its own when it has one (a session moved here by
    ``sessions import`` brings the key its history was signed with), else the state root's when
    it has one, else a new one of its own."""
    if state_root is None:
        return key_in_store(_filesystem_store(session_dir), None)
    return key_in_store(_filesystem_store(state_root), str(session_dir))


class _Absent(Exception):
    """No such secret yet (and the caller does not want one made)."""


def _absent() -> bytes:
    raise _Absent


def existing_secret(store: Store, session: str | None) -> bytes | None:
    """The injection key ``store`` holds for ``session`` (None: the store's), without making one."""
    try:
        return store.secret(session, KEY_FILE, _absent)
    except _Absent:
        return None


def key_in_store(store: Store, session: str | None) -> InjectionKey:
    """The key a session signs with, kept in ``store``: the session's own when it has one, else
    the store's (every worker of a shared store signs alike), made on first use."""
    secret = existing_secret(store, session) if session is not None else None
    if secret is None:
        secret = store.secret(None, KEY_FILE, lambda: secrets.token_bytes(32))
    key = InjectionKey(secret)
    _known(key)
    return key


class _AnyKnownKey(InjectionKey):
    """Outside a session's ``prepare``: signs with the process key and recognises what any
    session of this process signed, so code that inspects a ``prepare`` output afterwards (an
    application, a test) needs no scope. Inside ``prepare`` only the session's key counts."""

    __slots__ = ("_keys",)

    def __init__(self, process: InjectionKey, keys: tuple[InjectionKey, ...]) -> None:
        super().__init__(process._secret)
        self._keys = keys

    def verified(self, text: str, others: OtherParts | None = None) -> TagHead | None:
        head = super().verified(text, others)
        for key in self._keys:
            if head is not None:
                break
            head = key.verified(text, others)
        return head


_PROCESS_KEY = InjectionKey(secrets.token_bytes(32))
_KNOWN: list[InjectionKey] = []
# A new object whenever a key is added, so memos keyed on "the current key" notice.
_ANY: list[_AnyKnownKey] = [_AnyKnownKey(_PROCESS_KEY, ())]
_KNOWN_LIMIT = 64
_CURRENT: contextvars.ContextVar[InjectionKey | None] = contextvars.ContextVar("ctxrules_injection_key", default=None)


def _known(key: InjectionKey) -> None:
    if any(k._secret == key._secret for k in _KNOWN):
        return
    _KNOWN.append(key)
    del _KNOWN[:-_KNOWN_LIMIT]
    _ANY[0] = _AnyKnownKey(_PROCESS_KEY, tuple(_KNOWN))


def current_key() -> InjectionKey:
    """The key of the session whose ``prepare`` is running; outside one, a key that signs with
    the process key and recognises every key this process loaded."""
    return _CURRENT.get() or _ANY[0]


def key_scope(key: InjectionKey) -> Scoped[InjectionKey | None]:
    """Run the enclosed code (a ``prepare``) with ``key`` as the current key."""
    return Scoped(_CURRENT, key)
