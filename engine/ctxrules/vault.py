"""The vault: a content-addressed store for everything that leaves the context.

Whatever a stage removes or shortens goes here first (invariant 3, docs/reference/concepts.md), and the context
keeps a one-line marker that points back to it::

    [ctxrules:elided kind=lines count=120 ref=vault://<sha256>#L10-L129]

Layout on disk (``root`` is ``<session>/vault``)::

    root/ab/ab12...ef          the stored bytes, named by their full sha256 hex id
    root/ab/ab12...ef.meta     optional JSON sidecar ({"media_type": ...}) for media

A *line* is what ends with ``\\n`` (``\\r\\n`` stays part of its line; a lone ``\\r`` is not a
break), as for ``sed -n A,Bp`` and GitHub's ``#L<a>-L<b>`` anchors, so a line range is
byte-exact whatever the line endings are. Stages that count lines for a marker use
:func:`split_lines` so the counts agree with :meth:`Vault.get_lines`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from ctxrules.errors import VaultError

# The store package (locks, staging, session layout) is imported where a vault is opened: the
# stage modules that import this one for its markers are also loaded to validate a pack.
if TYPE_CHECKING:
    from ctxrules.stores.base import BlobWriter, Store

__all__ = [
    "MARKER_KINDS",
    "MARKER_RE",
    "MIN_PREFIX",
    "Marker",
    "Vault",
    "VaultError",
    "VaultWriter",
    "format_marker",
    "format_ref",
    "is_spill_stand_in",
    "parse_marker",
    "parse_markers",
    "parse_ref",
    "split_lines",
]

MIN_PREFIX = 12
"""Shortest id prefix :meth:`Vault.get` accepts (a unique prefix of ≥ 12 hex digits)."""

_ID_LEN = 64
_HEX_RE = re.compile(r"[0-9a-f]+")
_SLICE_CHARS = 1 << 20  # texts longer than this are encoded and written in slices
_BLOCK = 1 << 20  # what copy_to reads and writes at a time
if TYPE_CHECKING:
    VaultWriter = BlobWriter
    """An entry being written in pieces (:class:`ctxrules.stores.BlobWriter`): ``write``,
    ``size``, ``path`` (readable until commit), ``vault_id``, ``commit``, ``discard``."""


def __getattr__(name: str) -> object:
    if name == "VaultWriter":  # the store's writer, named here too; imported when asked for
        from ctxrules.stores.base import BlobWriter

        return BlobWriter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Lone surrogates survive json.loads; "surrogatepass" keeps them storable and round-trippable
# instead of failing a stage on a transcript that contains one.
_TEXT_ERRORS = "surrogatepass"


def split_lines(data: bytes) -> list[bytes]:
    """Split ``data`` into lines that keep their terminators (only ``\\n`` ends a line).

    ``bytes.splitlines`` would also break at a lone ``\\r``, which no editor or ``#L`` anchor
    counts as a line, so a range computed one way would not come back byte-exact the other way.
    """
    if not data:
        return []
    parts = data.split(b"\n")
    lines = [part + b"\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _line_end(data: bytes, start: int, lines: int) -> int:
    """The offset just past ``lines`` lines of ``data`` from ``start`` (its end when fewer)."""
    at = start
    for _ in range(lines):
        found = data.find(b"\n", at)
        if found < 0:
            return len(data)
        at = found + 1
    return at


def _line_offsets(handle: BinaryIO, first: int, last: int) -> tuple[int, int, int]:
    """:meth:`Vault.get_lines`'s offsets found in a file a block at a time: (the start of line
    ``first``, the end of line ``last``, the number of lines), offsets past the end when there
    are fewer lines."""
    newlines = position = 0
    start: int | None = 0 if first == 1 else None
    end: int | None = None
    tail = b""
    while block := handle.read(_BLOCK):
        count = block.count(b"\n")
        if start is None and newlines + count >= first - 1:
            start = position + _line_end(block, 0, first - 1 - newlines)
        if end is None and newlines + count >= last:
            end = position + _line_end(block, 0, last - newlines)
        newlines += count
        position += len(block)
        tail = block[-1:]
    total = newlines + (1 if tail and tail != b"\n" else 0)
    return (position if start is None else start), (position if end is None else end), total


def _normalize_id(id_or_prefix: str) -> str:
    """Validate an id or prefix; ids name files, so only plain hex ever reaches the filesystem."""
    if not isinstance(id_or_prefix, str):
        raise VaultError(f"vault id must be a string, got {type(id_or_prefix).__name__}")
    candidate = id_or_prefix.strip().lower()
    candidate = candidate.removeprefix("vault://")
    if not candidate:
        raise VaultError("empty vault id")
    # Shown cut: an id is 64 characters, and a 10 MB argument (or a model's runaway recall
    # call) was echoed whole into the message.
    shown = (
        repr(id_or_prefix)
        if len(id_or_prefix) <= 2 * _ID_LEN
        else f"{id_or_prefix[:_ID_LEN]!r}... ({len(id_or_prefix):,} characters)"
    )
    if not _HEX_RE.fullmatch(candidate):
        raise VaultError(f"invalid vault id {shown}: expected hex digits (0-9, a-f)")
    if len(candidate) > _ID_LEN:
        raise VaultError(f"invalid vault id {shown}: longer than a sha256 id ({_ID_LEN} hex digits)")
    if len(candidate) < MIN_PREFIX:
        raise VaultError(f"vault id prefix {id_or_prefix!r} is too short: give at least {MIN_PREFIX} hex digits")
    return candidate


class Vault:
    """The vault of one session in a :class:`ctxrules.stores.Store`: ids, prefixes, text, line
    ranges and media types over the store's content-addressed blobs.

    ``Vault(root)`` is the filesystem vault in the directory ``root`` (a session's ``vault/``);
    ``Vault.of(store, session)`` the vault of a session in any store. Nothing is created until
    the first ``put``; reading an empty or missing vault reports "not found". Writes are atomic
    and durable before an id is handed out (within a session's ``prepare``, on the filesystem
    store: before the output naming it is saved, all of the turn's items in one flush), and
    idempotent.
    """

    def __init__(self, root: Path | None = None, *, store: Store | None = None, session: str | None = None) -> None:
        if store is None:
            if root is None:
                raise TypeError("Vault() needs a directory, or store= and session=")
            root = Path(root)
            from ctxrules.stores.filesystem import FilesystemStore

            store, session = FilesystemStore(root.parent, vault_name=root.name), str(root.parent)
        elif session is None:
            raise TypeError("Vault(store=...) needs session=")
        self.store: Store = store
        self.session: str = session

    @classmethod
    def of(cls, store: Store, session: str) -> Vault:
        """The vault of ``session`` in ``store``."""
        return cls(store=store, session=session)

    @classmethod
    def for_session(cls, session_dir: Path) -> Vault:
        """The vault of the session directory ``session_dir`` (``<session>/vault``)."""
        return cls(Path(session_dir) / "vault")

    @property
    def root(self) -> Path:
        """The vault's directory (filesystem stores only)."""
        vault_dir = getattr(self.store, "vault_dir", None)
        if vault_dir is None:
            raise VaultError(f"the vault of {self.where} is not a directory (store {self.store.url})")
        path: Path = vault_dir(self.session)
        return path

    @property
    def where(self) -> str:
        """How messages name this vault."""
        vault_dir = getattr(self.store, "vault_dir", None)
        return str(vault_dir(self.session)) if vault_dir is not None else self.store.describe(self.session)

    def __repr__(self) -> str:
        return f"Vault({self.where!r})"

    # --- writing ----------------------------------------------------------------------------

    def put_text(self, text: str) -> str:
        """Store ``text`` as its UTF-8 bytes; return the id (sha256 hex of those bytes)."""
        if len(text) > _SLICE_CHARS:
            return self._put_long_text(text)
        return self.store.put_blob(self.session, text.encode("utf-8", _TEXT_ERRORS))

    def _put_long_text(self, text: str) -> str:
        """:meth:`put_text` for a long text, encoded a slice at a time (never whole in memory)."""
        slices = range(0, len(text), _SLICE_CHARS)
        digest = hashlib.sha256()
        for start in slices:
            digest.update(text[start : start + _SLICE_CHARS].encode("utf-8", _TEXT_ERRORS))
        vault_id = digest.hexdigest()
        if self.store.has_blob(self.session, vault_id):
            return vault_id
        writer = self.open_writer()
        try:
            for start in slices:
                writer.write(text[start : start + _SLICE_CHARS].encode("utf-8", _TEXT_ERRORS))
            return writer.commit()
        finally:
            writer.discard()

    def open_writer(self) -> VaultWriter:
        """A new entry written piece by piece (an output too large to hold in memory); its id
        is known once :meth:`VaultWriter.commit` has stored it."""
        opener = getattr(self.store, "open_blob_writer", None)
        if opener is None:  # a store of an earlier protocol version: spool to a local file
            from ctxrules.stores.base import SpooledBlobWriter

            return SpooledBlobWriter(self.store, self.session)
        writer: VaultWriter = opener(self.session)
        return writer

    def put_bytes(self, data: bytes, media_type: str | None = None) -> str:
        """Store raw bytes (media); return the id (sha256 hex of ``data``)."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"put_bytes() needs bytes, got {type(data).__name__}")
        return self.store.put_blob(self.session, bytes(data), media_type)

    # --- reading ----------------------------------------------------------------------------

    def resolve(self, id_or_prefix: str) -> str:
        """The full id for an id or a unique prefix (≥ 12 hex digits, ``vault://`` allowed)."""
        candidate = _normalize_id(id_or_prefix)
        if len(candidate) == _ID_LEN:
            if self.store.has_blob(self.session, candidate):
                return candidate
            raise VaultError(
                f"vault item {candidate} is missing from {self.where} "
                "(not found: deleted, or never stored in this session)"
            )
        matches = self.store.blob_ids(self.session, candidate)
        if not matches:
            raise VaultError(f"vault item {candidate}... is missing from {self.where} (no entry starts with it)")
        if len(matches) > 1:
            shown = ", ".join(sorted(matches)[:5])
            raise VaultError(
                f"vault id prefix {candidate} is ambiguous ({len(matches)} entries: {shown}); give more digits"
            )
        return matches[0]

    def get(self, id_or_prefix: str) -> bytes:
        """The exact stored bytes, verified against their id."""
        return self.store.get_blob(self.session, self.resolve(id_or_prefix))

    def get_text(self, id_or_prefix: str) -> str:
        """The stored text (inverse of :meth:`put_text`)."""
        return self.get(id_or_prefix).decode("utf-8", _TEXT_ERRORS)

    def get_lines(self, id_or_prefix: str, first: int, last: int) -> bytes:
        """Lines ``first``..``last`` (1-based, inclusive, as ``#L<a>-L<b>``), byte-exact."""
        if first < 1 or last < first:
            raise VaultError(f"invalid line range {first}-{last}: need 1 <= first <= last")
        data = self.get(id_or_prefix)
        # Found by offsets, not by splitting: a list of every line of a 100 MB output costs
        # several times the output (``ctxrules compress`` stores far larger ones in bounded memory).
        total = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
        if last > total:
            raise VaultError(f"line range {first}-{last} is outside vault entry {id_or_prefix} ({total} lines)")
        start = _line_end(data, 0, first - 1)
        return data[start : _line_end(data, start, last - first + 1)]

    def copy_to(
        self, id_or_prefix: str, write: Callable[[bytes], object], lines: tuple[int, int] | None = None
    ) -> None:
        """Pass what :meth:`get` (or, with ``lines``, :meth:`get_lines`) returns to ``write``, a
        block at a time on a store that hands an item over as a file (the filesystem store's
        ``open_blob``; other stores hold it whole): an item of gigabytes is never in memory. It
        is checked against its id, and a line range against its lines, before the first
        ``write``; an item changed in place while copied raises :class:`VaultError` at the end."""
        if lines is not None and (lines[0] < 1 or lines[1] < lines[0]):
            raise VaultError(f"invalid line range {lines[0]}-{lines[1]}: need 1 <= first <= last")
        opener = getattr(self.store, "open_blob", None)
        if opener is None:
            write(self.get_lines(id_or_prefix, *lines) if lines else self.get(id_or_prefix))
            return
        blob_id = self.resolve(id_or_prefix)
        handle: BinaryIO
        with opener(self.session, blob_id) as handle:
            left: int | None = None
            if lines is not None:
                start, end, total = _line_offsets(handle, *lines)
                if lines[1] > total:
                    raise VaultError(
                        f"line range {lines[0]}-{lines[1]} is outside vault entry {id_or_prefix} ({total} lines)"
                    )
                handle.seek(start)
                left = end - start
            digest = hashlib.sha256()  # of the whole item (a line range was checked by opener)
            while block := handle.read(_BLOCK if left is None else min(_BLOCK, left)):  # read(0): b""
                write(block)
                if left is None:
                    digest.update(block)
                else:
                    left -= len(block)
        if lines is None and digest.hexdigest() != blob_id:
            raise VaultError(f"vault entry {blob_id} changed while it was read: what was printed is not its bytes")

    def media_type(self, id_or_prefix: str) -> str | None:
        """The media type recorded by :meth:`put_bytes`, if any."""
        return self.store.blob_media_type(self.session, self.resolve(id_or_prefix))

    def exists(self, id_or_prefix: str) -> bool:
        """Whether an entry has this id (or starts with this prefix).

        A malformed id raises :class:`VaultError` like :meth:`get`: ``exists("../x")`` is a
        caller's bug, not a missing entry.
        """
        candidate = _normalize_id(id_or_prefix)
        if len(candidate) == _ID_LEN:
            return self.store.has_blob(self.session, candidate)
        return bool(self.store.blob_ids(self.session, candidate))

    def missing(self, ids: Iterable[str]) -> set[str]:
        """The ids of ``ids`` this vault does not hold (one store round trip). Only a full id
        names an item: a shorter one (a marker anyone can write may hold a prefix) is missing
        on every store, never an error of one of them."""
        given = set(ids)
        full = [i for i in given if len(i) == _ID_LEN and _HEX_RE.fullmatch(i)]
        return given.difference(full) | self.store.missing_blobs(self.session, full)

    def list_ids(self) -> list[str]:
        """Every stored id, sorted."""
        return self.store.blob_ids(self.session)

    def __iter__(self) -> Iterator[str]:
        return iter(self.list_ids())


# --- markers --------------------------------------------------------------------------------

MARKER_KINDS: tuple[str, ...] = ("lines", "tokens", "json", "image", "message")
"""The documented marker kinds; :func:`parse_markers` also accepts kinds added later."""

_KEY = r"[A-Za-z_][A-Za-z0-9_.-]*"
_QUOTED = r'"(?:[^"\\\r\n]|\\.)*"'
_BARE = r'[^\s"\]]+'
_FIELD = rf"{_KEY}=(?:{_QUOTED}|{_BARE})"
MARKER_RE = re.compile(rf"\[ctxrules:elided((?:[ \t]+{_FIELD})*)[ \t]*\]")
"""Matches one marker; group 1 holds its fields. :func:`parse_markers` checks the fields."""

_FIELD_RE = re.compile(rf"({_KEY})=({_QUOTED}|{_BARE})")
# Counts and line numbers of at most 18 digits: anyone can write a marker-like text, and int()
# refuses more than 4,300 digits with a ValueError that would stop the whole turn.
_NUMBER = r"[0-9]{1,18}"
_REF_RE = re.compile(rf"vault://([0-9a-f]{{12,64}})(?:#L({_NUMBER})-L({_NUMBER}))?")
_KIND_RE = re.compile(r"[a-z][a-z0-9_]*")
_COUNT_RE = re.compile(_NUMBER)
_BARE_RE = re.compile(_BARE)
_RESERVED = frozenset({"kind", "count", "ref"})
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_UNESCAPES = {"n": "\n", "r": "\r", "t": "\t"}
_LINE_BREAKS = frozenset("\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")
_HEXDIGITS = frozenset("0123456789abcdefABCDEF")


@dataclass(frozen=True)
class Marker:
    """One parsed elision marker. ``span`` is its ``(start, end)`` in the parsed text."""

    kind: str
    count: int
    vault_id: str
    lines: tuple[int, int] | None = None
    extra: Mapping[str, str] = field(default_factory=dict)
    span: tuple[int, int] = (0, 0)

    @property
    def ref(self) -> str:
        """The pointer as written: ``vault://<id>`` plus ``#L<a>-L<b>`` when it has a range."""
        return format_ref(self.vault_id, self.lines)


def format_ref(vault_id: str, lines: tuple[int, int] | None = None) -> str:
    """``vault://<id>`` with an optional ``#L<a>-L<b>`` range."""
    ref = f"vault://{vault_id}"
    if lines is not None:
        ref += f"#L{lines[0]}-L{lines[1]}"
    return ref


def parse_ref(ref: str) -> tuple[str, tuple[int, int] | None]:
    """Split ``vault://<id>[#L<a>-L<b>]`` (or a bare id) into the id and the line range."""
    text = ref.strip()
    if not text.startswith("vault://"):
        text = "vault://" + text
    pointer, hash_mark, anchor = text.partition("#")
    # Ids are hex and case-insensitive for users; the "#L" anchor is written upper-case.
    match = _REF_RE.fullmatch(pointer.lower() + hash_mark + anchor)
    if match is None:
        raise VaultError(f"invalid vault pointer {ref[:200]!r}: expected vault://<id>[#L<a>-L<b>]")
    lines = _lines(match.group(2), match.group(3))
    if match.group(2) is not None and lines is None:
        raise VaultError(f"invalid line range in {ref[:200]!r}: need 1 <= a <= b")
    return match.group(1), lines


def _lines(first: str | None, last: str | None) -> tuple[int, int] | None:
    if first is None or last is None:
        return None
    a, b = int(first), int(last)
    return (a, b) if 1 <= a <= b else None


def _quote(value: str) -> str:
    if value and _BARE_RE.fullmatch(value):
        return value
    return '"' + "".join(_escape(ch) for ch in value) + '"'


def _escape(ch: str) -> str:
    if ch in _ESCAPES:
        return _ESCAPES[ch]
    if ch in _LINE_BREAKS:
        # str.splitlines() breaks at these too; escaping keeps a marker on one line for
        # every reader, not only for those that split at "\n".
        return f"\\u{ord(ch):04x}"
    return ch


def _unquote(raw: str) -> str:
    if not raw.startswith('"'):
        return raw
    body = raw[1:-1]
    out: list[str] = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        escaped = body[i + 1]  # MARKER_RE guarantees a character after every backslash
        code = body[i + 2 : i + 6]
        if escaped == "u" and len(code) == 4 and all(c in _HEXDIGITS for c in code):
            out.append(chr(int(code, 16)))
            i += 6
        else:
            out.append(_UNESCAPES.get(escaped, escaped))
            i += 2
    return "".join(out)


def format_marker(
    kind: str,
    count: int,
    vault_id: str,
    *,
    lines: tuple[int, int] | None = None,
    **extra: object,
) -> str:
    """The marker line for an elision: ``[ctxrules:elided kind=.. count=.. ref=vault://..]``.

    ``extra`` fields follow the three required ones in the order given; values are written
    bare when they contain no space, quote or ``]``, and quoted (with ``\\`` escapes) otherwise,
    so a marker is always a single line.
    """
    if kind not in MARKER_KINDS:
        raise ValueError(f"unknown marker kind {kind!r} (expected one of {', '.join(MARKER_KINDS)})")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"marker count must be a non-negative int, got {count!r}")
    if len(vault_id) != _ID_LEN or not _HEX_RE.fullmatch(vault_id):
        raise ValueError(f"marker needs a full vault id (64 lowercase hex digits), got {vault_id!r}")
    if lines is not None and not (
        isinstance(lines[0], int) and isinstance(lines[1], int) and 1 <= lines[0] <= lines[1]
    ):
        raise ValueError(f"invalid line range {lines!r}: need 1 <= a <= b")
    parts = [f"kind={kind}", f"count={count}", f"ref={format_ref(vault_id, lines)}"]
    for key, value in extra.items():
        if key in _RESERVED or not re.fullmatch(_KEY, key):
            raise ValueError(f"invalid extra marker field name {key!r}")
        parts.append(f"{key}={_quote(str(value))}")
    return "[ctxrules:elided " + " ".join(parts) + "]"


def _marker_from_match(match: re.Match[str]) -> Marker | None:
    fields: dict[str, str] = {}
    for field_match in _FIELD_RE.finditer(match.group(1)):
        key = field_match.group(1)
        if key in fields:
            return None  # ambiguous: which value would the writer have meant?
        fields[key] = _unquote(field_match.group(2))
    kind, count, ref = fields.pop("kind", None), fields.pop("count", None), fields.pop("ref", None)
    if kind is None or count is None or ref is None:
        return None
    if not _KIND_RE.fullmatch(kind) or not _COUNT_RE.fullmatch(count):
        return None
    ref_match = _REF_RE.fullmatch(ref)
    if ref_match is None:
        return None
    lines = _lines(ref_match.group(2), ref_match.group(3))
    if ref_match.group(2) is not None and lines is None:
        return None
    return Marker(
        kind=kind,
        count=int(count),
        vault_id=ref_match.group(1),
        lines=lines,
        extra=fields,
        span=match.span(),
    )


def parse_markers(text: str) -> list[Marker]:
    """Every well-formed marker in ``text``, in order.

    Fields may come in any order and unknown fields are kept in ``extra`` (the grammar only
    ever grows). Text that looks like a marker but lacks ``kind``, ``count`` or a valid ``ref``
    is not a marker and is skipped.
    """
    markers: list[Marker] = []
    for match in MARKER_RE.finditer(text):
        marker = _marker_from_match(match)
        if marker is not None:
            markers.append(marker)
    return markers


def parse_marker(text: str) -> Marker:
    """Parse ``text`` that must be exactly one marker (surrounding whitespace allowed)."""
    stripped = text.strip()
    match = MARKER_RE.fullmatch(stripped)
    marker = _marker_from_match(match) if match is not None else None
    if marker is None:
        raise VaultError(f"not a ctxrules marker: {text[:200]!r}")
    return marker


def is_spill_stand_in(text: str) -> bool:
    """Whether ``text`` is what :func:`ctxrules.stages.reduce.spill_summary` made: it opens with a spill marker.
    Spilling it again would only stand a stand-in for a stand-in (two hops to the original)."""
    if len(text) > _STAND_IN_CHARS or not text.startswith("[ctxrules:elided "):
        return False  # (a long text that only opens like one is spilled like any other)
    first = text[: text.find("\n")] if "\n" in text[:512] else text[:512]
    markers = parse_markers(first)
    if not markers or markers[0].extra.get("reason") != "spill":
        return False
    chars = markers[0].extra.get("chars", "")
    return chars.isdigit() and len(chars) < 19 and int(chars) > len(text)  # it stands for more than it is


# A stand-in is a marker, a sentence and a preview of spill_preview_tokens: far below this.
_STAND_IN_CHARS = 200_000
