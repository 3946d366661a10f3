"""A session as one portable file, to move it between stores (``ctxrules sessions export`` /
``import``), written and read through the :class:`~ctxrules.stores.Store` protocol only, so it
works between any two backends.

The archive is JSON lines (UTF-8), one record per line::

    {"format": "ctxrules-session", "version": 1, "session": ID, "from": URL, "exported": TS}
    {"kind": "turn", "state": {...}, "output": [...] | null}
    {"kind": "blob", "id": SHA256, "media_type": null | "...", "data": BASE64}   one per blob
    {"kind": "doc", "name": "notes" | "touched" | ..., "data": BASE64}           one per document
    {"kind": "secret", "name": "injection.key", "data": BASE64}  the key its injected tags are signed with
    {"kind": "ledger", "lines": [LINE, ...]}                  the session's own ledger, as written
    {"kind": "end", "blobs": N, "docs": N, "ledger": N, "turns": 1, "secrets": N, "sha256": HEX}

Vault blobs keep their exact bytes (and so their ids); an import checks every blob against its
id and refuses a truncated archive (no ``end`` record), one whose records are not those its
``end`` record counts (a line lost or repeated), one whose lines do not hash to the end
record's ``sha256`` (a line altered; archives written before it was added are checked on the
counts only), or a record of the wrong shape, before it writes anything. The day and
goal ledgers are the store's own history and stay where they are. The archive holds the whole
conversation and the session's signing key: keep it as private as the session itself.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import secrets
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any, BinaryIO, Final

from ctxrules.injected import existing_secret
from ctxrules.json_limits import MAX_INPUT_BYTES
from ctxrules.session_store import MAX_STATE_BYTES
from ctxrules.stores.base import DOC_MAX_BYTES, DOCS, SECRET_BYTES, Log, SessionExists, Store, StoreUsageError

__all__ = ["ARCHIVE_FORMAT", "ArchiveFile", "export_session", "import_session", "read_archive"]

ARCHIVE_FORMAT: Final = "ctxrules-session"
ARCHIVE_VERSION: Final = 1


def _bad(message: str) -> StoreUsageError:
    return StoreUsageError("CR146", message)


def _line(obj: dict[str, Any]) -> bytes:
    # Key order kept: the last output goes back byte for byte (a provider cache keys on bytes).
    return json.dumps(obj, ensure_ascii=False).encode("utf-8") + b"\n"


def export_session(store: Store, session: str, out: IO[bytes], *, name: str | None = None) -> dict[str, int]:
    """Write ``session`` of ``store`` to ``out`` (under the session's prepare lock, so the
    snapshot is one turn's); returns the counts written. ``name``: the session id recorded
    (default: the last part of the key)."""
    if not store.exists(session):
        raise StoreUsageError("CR147", f"no session {store.describe(session)} to export")
    counts = {"blobs": 0, "docs": 0, "ledger": 0}
    digest = hashlib.sha256()

    def write(obj: dict[str, Any]) -> None:
        line = _line(obj)
        _check_readable(line, session)
        digest.update(line)
        out.write(line)

    with store.prepare_lock(session):
        turn = store.load_turn(session)
        header = {
            "format": ARCHIVE_FORMAT,
            "version": ARCHIVE_VERSION,
            "session": name or session.rstrip("/").rsplit("/", 1)[-1],
            "from": store.url,
            "exported": time.time(),
        }
        write(header)
        write({"kind": "turn", "state": turn.state, "output": turn.output})
        ids = store.blob_ids(session)
        gone = store.missing_blobs(session, ids)  # listed, but no item (expired, removed): absent
        for blob_id in ids:
            if blob_id in gone:
                continue
            data = store.get_blob(session, blob_id)
            media_type = store.blob_media_type(session, blob_id)
            encoded = base64.b64encode(data).decode()
            write({"kind": "blob", "id": blob_id, "media_type": media_type, "data": encoded})
            counts["blobs"] += 1
        for doc in DOCS:
            raw = store.read_doc(session, doc)
            if raw is not None:
                write({"kind": "doc", "name": doc, "data": base64.b64encode(raw).decode()})
                counts["docs"] += 1
        # The key the session's injected messages are signed with: without it they would read
        # as the caller's own messages in the other store.
        secret = existing_secret(store, session) or existing_secret(store, None)
        _check_key(store, session, turn.output or [], secret)
        if secret is not None:
            write({"kind": "secret", "name": "injection.key", "data": base64.b64encode(secret).decode()})
        lines = _all_lines(store, Log("session", session))
        write({"kind": "ledger", "lines": [ln.decode("utf-8", "replace") for ln in lines]})
        counts["ledger"] = len(lines)
        # What the reader checks the records against: a line lost, repeated or altered in
        # transit is refused.
        end = {"kind": "end", **counts, "turns": 1, "secrets": int(secret is not None)}
        out.write(_line({**end, "sha256": digest.hexdigest()}))
    out.flush()
    return counts


def _check_readable(line: bytes, session: str) -> None:
    """Refuse to write a record ``sessions import`` would refuse as too long (:data:`_LINE_MAX`):
    an archive it cannot read back is lost data for whoever removes the session after export.
    A vault item that streams (its record in the shape the reader decodes a chunk at a time)
    has no bound. The bound, as the reader applies it, leaves out the line end."""
    limit, what = _line_limit(line[:_HEAD_BYTES])
    if len(line) - 1 > limit and not (line.startswith(b'{"kind": "blob"') and _BLOB_HEAD.match(line)):
        raise _bad(
            f"cannot export {session}: {what} would take {len(line) >> 20} MiB, more than "
            f"sessions import reads ({limit >> 20} MiB); nothing usable was written"
        )


def _all_lines(store: Store, log: Log) -> list[bytes]:
    chunk = store.read_log(log)
    return [ln for ln in chunk.lines if ln.strip()]


_CHUNK: Final = 1 << 20
"""An archive is read this much at a time: a line longer than this is a vault item streamed
(decoded and hashed a chunk at a time), or read on only when it can parse at all."""
# A blob record as export_session writes it, up to the start of its base64 data.
_BLOB_HEAD: Final = re.compile(
    rb'\{"kind": "blob", "id": "([0-9a-f]{64})", "media_type": (null|"[A-Za-z0-9!#$&^_.+/-]{1,200}"), "data": "'
)
_BASE64: Final = re.compile(rb"[A-Za-z0-9+/]*={0,2}")
_HEAD_BYTES: Final = 512  # at least this much of a line is read at once: a blob record's start


def _base64_size(size: int) -> int:
    return (size + 2) // 3 * 4


_SMALL_LINE_MAX: Final = 1 << 20
_ITEM_LINE_MAX: Final = _base64_size(DOC_MAX_BYTES) + (1 << 20)
_LINE_MAX: Final[dict[bytes, tuple[int, str]]] = {
    # The state (state.json is read to 64 MiB, and written with the same separators) and the
    # last output, which a message file of at most 256 MiB became: written with a space after
    # every separator, at most 1.5 times its bytes.
    b"turn": (MAX_STATE_BYTES + 2 * MAX_INPUT_BYTES, "a turn record"),
    b"doc": (_ITEM_LINE_MAX, "a document"),
    # A vault item's line read whole: one that does not stream (damaged, or a media type of
    # unusual characters: an image, 64 MiB of base64 at most); an intact one streams at any size.
    b"blob": (_ITEM_LINE_MAX, "a vault item it cannot stream"),
    # The session's own ledger, a few hundred bytes a call: a million calls.
    b"ledger": (MAX_INPUT_BYTES, "the session ledger"),
    b"secret": (_SMALL_LINE_MAX, "a secret"),
    b"end": (_SMALL_LINE_MAX, "the end record"),
    b"format": (_SMALL_LINE_MAX, "the header"),
}
"""How long a line of each kind (told by its start, as export writes it) may be: what export
can write for it, from the caps of the stores it reads. A longer line is refused as soon as it
passes its bound, never held: a line of gigabytes (a sparse file) would take the memory before
it failed to parse. A line whose start names no kind may be as long as the longest."""
_RECORD_START: Final = re.compile(rb'\{"(?:kind|(format))": "([a-z-]*)"')


def _line_limit(first: bytes) -> tuple[int, str]:
    """The bound of the line that starts with ``first`` (:data:`_LINE_MAX`), and what it is."""
    start = _RECORD_START.match(first)
    kind = None if start is None else b"format" if start.group(1) else start.group(2)
    found = _LINE_MAX.get(kind) if kind is not None else None
    return found if found is not None else (max(limit for limit, _ in _LINE_MAX.values()), "any record")


class ArchiveFile:
    """An archive in a binary file (``sessions import``), read a line at a time and never
    whole: a vault item on a line of its own longer than :data:`_CHUNK` is decoded and hashed a
    chunk at a time, checked with the rest, and read again when it is written. A file that
    cannot seek (a pipe) is copied to a private temporary file as it is read, for that second
    reading. Close it when done (the copy goes with it)."""

    def __init__(self, handle: BinaryIO, where: str) -> None:
        self.where = where
        self._in = handle
        try:
            seekable = handle.seekable()
            self._start = handle.tell() if seekable else 0
        except OSError:
            seekable, self._start = False, 0
        self._copy: BinaryIO | None = None if seekable else tempfile.TemporaryFile()  # noqa: SIM115
        self._offset = 0  # of the next line, from the start

    def close(self) -> None:
        if self._copy is not None:
            self._copy.close()

    def __enter__(self) -> ArchiveFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self, limit: int) -> bytes:
        piece = self._in.readline(limit)
        if self._copy is not None:
            self._copy.write(piece)
        self._offset += len(piece)
        return piece

    def records(self, digest: Any) -> Iterator[tuple[bytes, dict[str, Any] | None]]:
        """Each line (``b""`` and its record for a streamed vault item, whose line ``digest``
        is updated here); ``digest``: see :func:`read_archive`."""
        while True:
            offset = self._offset
            first = self._read(max(_CHUNK, _HEAD_BYTES))
            if not first:
                return
            if first.endswith(b"\n") or len(first) < max(_CHUNK, _HEAD_BYTES):
                yield first.removesuffix(b"\n"), None  # a line as split at "\n" (a parse error reads the same)
                continue
            limit, what = _line_limit(first)
            head = _BLOB_HEAD.match(first)
            if head is not None:
                record = self._stream_blob(first, head, offset, digest, limit)
                if record is not None:
                    yield b"", record
                    continue
                if self._offset - offset > limit:  # damaged past any item line read whole
                    yield b"", _too_long(limit, what)
                    return
                yield self._line_at(offset), None
                continue
            try:
                json.loads(first)
            except ValueError as exc:
                # An error well before the end of what was read is where the whole line fails
                # too (a scanner goes left to right): read no more of it (gigabytes of NULs).
                # Not so an unterminated string: it names where the string starts.
                position = getattr(exc, "pos", getattr(exc, "start", len(first)))
                cut_short = getattr(exc, "msg", "").startswith("Unterminated string")
                if position < len(first) - 64 and not cut_short:
                    yield first, None
                    return
            # Measured before it is read whole: read on (and not kept) to its end or its bound.
            size, piece, ending = len(first), first, first[-2:]
            while not piece.endswith(b"\n") and size <= limit and (piece := self._read(_CHUNK)):
                size, ending = size + len(piece), (ending + piece)[-2:]
            if size - (len(ending) - len(ending.rstrip(b"\r\n")) if ending.endswith(b"\n") else 0) > limit:
                yield b"", _too_long(limit, what)
                return
            yield self._line_at(offset), None

    def _stream_blob(
        self, first: bytes, head: re.Match[bytes], offset: int, digest: Any, limit: int
    ) -> dict[str, Any] | None:
        """The record of a long vault-item line, decoded and hashed a chunk at a time, the line
        read to its end: ``_error`` when its bytes do not hash to its id (raised in its turn, as
        for a record read whole). None when the line is not as export writes it (a character
        that is not base64, padding before the end, no '"}' closing it): then the caller parses
        it whole, for the very verdict the whole archive would get, unless it is longer than
        ``limit``: then it is read no further than that."""
        item = hashlib.sha256()
        pending, piece, well_formed = b"", first[head.end() :], True
        while True:
            quote = piece.find(b'"')
            data = piece if quote < 0 else piece[:quote]
            if quote < 0 and data.endswith(b"\n"):  # the line ends inside the data
                well_formed = False
            if well_formed:
                pending += data
                # Padding comes last: the last quartet waits for the closing quote.
                cut = max(0, len(pending) - len(pending) % 4 - 4) if quote < 0 else len(pending)
                done, pending = pending[:cut], pending[cut:]
                if not _BASE64.fullmatch(done) or (quote < 0 and b"=" in done):
                    well_formed = False
                else:
                    try:
                        item.update(base64.b64decode(done, validate=True))
                    except binascii.Error:
                        well_formed = False
            if quote >= 0 or piece.endswith(b"\n") or (not well_formed and self._offset - offset > limit):
                break
            piece = self._read(_CHUNK)
            if not piece:
                break
        tail = piece[quote:] if quote >= 0 else b""
        # After the data: '"}' and the line's end (what follows is read to the line's end, a
        # chunk at a time, and not kept).
        start, size = tail[:4], len(tail)
        while tail and not tail.endswith(b"\n") and (tail := self._read(_CHUNK)):
            start, size = (start + tail)[:4], size + len(tail)
        if not well_formed or quote < 0 or size > 4 or start.rstrip(b"\r\n") != b'"}':
            return None
        record: dict[str, Any] = {"kind": "blob", "id": head.group(1).decode(), "media_type": json.loads(head.group(2))}
        record["_offset"], record["_error"] = offset, None
        if item.hexdigest() != record["id"]:
            record["_error"] = f"blob {record['id']} does not hash to its id (a damaged archive)"
        self._rehash(offset, digest)  # the line as read_archive hashes it, read again
        return record

    def _line_at(self, offset: int) -> bytes:
        """The line at ``offset``, whole (without its ``\\n``), the read position kept."""
        source = self._source()
        at = source.tell()
        source.seek(self._start + offset)
        line = source.readline()
        source.seek(at)
        return line.removesuffix(b"\n")

    def _rehash(self, offset: int, digest: Any) -> None:
        """Add the line at ``offset`` to ``digest`` (its end as ``\\n``), a chunk at a time."""
        source = self._source()
        at = source.tell()
        source.seek(self._start + offset)
        held = b""
        while piece := source.readline(_CHUNK):
            done = piece.endswith(b"\n")
            piece = held + piece
            held = b""
            if done:
                digest.update(piece.rstrip(b"\r\n") + b"\n")
                break
            piece, held = piece[:-1], piece[-1:]  # a "\r" may end the line
            digest.update(piece)
        else:
            digest.update(held.rstrip(b"\r") + b"\n")
        source.seek(at)

    def _source(self) -> BinaryIO:
        return self._copy if self._copy is not None else self._in

    def blob_chunks(self, offset: int) -> Iterator[bytes]:
        """The bytes of the vault item on the line at ``offset``, a chunk at a time."""
        source = self._source()
        source.seek(self._start + offset)
        first = source.readline(max(_CHUNK, _HEAD_BYTES))
        head = _BLOB_HEAD.match(first)
        if head is None:
            raise _bad(f"{self.where}: the archive changed while it was imported")
        pending, piece = b"", first[head.end() :]
        while True:
            quote = piece.find(b'"')
            pending += piece if quote < 0 else piece[:quote]
            cut = max(0, len(pending) - len(pending) % 4 - 4) if quote < 0 else len(pending)  # padding comes last
            try:
                yield base64.b64decode(pending[:cut], validate=True)
            except binascii.Error:
                raise _bad(f"{self.where}: the archive changed while it was imported") from None
            pending = pending[cut:]
            if quote >= 0:
                return
            piece = source.readline(_CHUNK)
            if not piece:
                return


def _too_long(limit: int, what: str) -> dict[str, Any]:
    """What :meth:`ArchiveFile.records` gives for a line past its bound (``read_archive``
    refuses it, naming the line)."""
    return {"_refused": f"longer than {limit >> 20} MiB, more than sessions export writes for {what}"}


def read_archive(lines: Iterable[bytes] | ArchiveFile, where: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The header and the records of an archive; a usage error (naming ``where`` and the line)
    for anything that is not a whole archive of this format. From an :class:`ArchiveFile`, a
    long vault-item line is a record without its data (``_offset``, and ``_error`` when it is
    damaged): :func:`import_session` reads it again to write it."""
    records: list[dict[str, Any]] = []
    header: dict[str, Any] | None = None
    ended = False
    digest = hashlib.sha256()  # of the lines before the end record, as the writer wrote them
    it: Iterator[tuple[bytes, dict[str, Any] | None]] = (
        lines.records(digest) if isinstance(lines, ArchiveFile) else ((raw, None) for raw in lines)
    )
    for n, (raw, streamed) in enumerate(it, 1):
        if streamed is not None:
            if "_refused" in streamed:
                raise _bad(f"{where}:{n}: not a ctxrules session archive line ({streamed['_refused']})")
            if header is None:
                raise _bad(f"{where}:{n}: not a ctxrules session archive (no format header)")
            if ended:
                raise _bad(f"{where}:{n}: data after the end record")
            streamed["_line"] = n
            records.append(streamed)
            continue  # (its line is in the digest already)
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except ValueError as exc:
            raise _bad(f"{where}:{n}: not a ctxrules session archive line ({exc})") from None
        except RecursionError:
            raise _bad(f"{where}:{n}: not a ctxrules session archive line (nested too deep)") from None
        if not isinstance(obj, dict):
            raise _bad(f"{where}:{n}: not a ctxrules session archive line (not an object)")
        if header is None:
            if obj.get("format") != ARCHIVE_FORMAT:
                raise _bad(f"{where}:{n}: not a ctxrules session archive (no format header)")
            if obj.get("version") != ARCHIVE_VERSION:
                raise _bad(f"{where}:{n}: archive version {obj.get('version')!r} is not supported (need 1)")
            header = obj
            digest.update(raw.rstrip(b"\r\n") + b"\n")
            continue
        if ended:
            raise _bad(f"{where}:{n}: data after the end record")
        kind = obj.get("kind")
        if kind == "end":
            ended = True
            obj["_sha256"] = digest.hexdigest()
        elif kind not in ("turn", "blob", "doc", "ledger", "secret"):
            raise _bad(f"{where}:{n}: unknown record kind {kind!r}")
        obj["_line"] = n
        records.append(obj)
        digest.update(raw.rstrip(b"\r\n") + b"\n")
    if header is None:
        raise _bad(f"{where}: empty file, not a ctxrules session archive")
    if not ended:
        raise _bad(f"{where}: the archive is truncated (no end record); nothing was imported")
    return header, records


def _decode(obj: dict[str, Any], where: str) -> bytes:
    try:
        return base64.b64decode(str(obj["data"]), validate=True)
    except (KeyError, ValueError) as exc:
        raise _bad(f"{where}:{obj['_line']}: bad base64 data ({exc})") from None


def _check_counts(records: list[dict[str, Any]], where: str) -> None:
    """Refuse an archive whose records are not the ones its end record counts: one turn, one
    ledger record with ``ledger`` lines, ``blobs`` blobs, ``docs`` documents and (archives that
    count them) ``secrets`` secrets; or whose lines do not hash to its ``sha256`` (archives
    that carry one). A line lost, repeated or altered would otherwise import a session whose
    output names vault items it lacks, whose injected messages lose their key, or whose next
    turn sends text nobody wrote."""
    end = records[-1]
    found = {"turn": 0, "blob": 0, "doc": 0, "secret": 0, "ledger": 0}
    ledger_lines = 0
    for obj in records[:-1]:
        found[obj["kind"]] += 1
        if obj["kind"] == "ledger":
            listed = obj.get("lines")
            ledger_lines += len(listed) if isinstance(listed, list) else 0
    expected = [
        ("turn record(s)", found["turn"], end.get("turns", 1)),
        ("ledger record(s)", found["ledger"], 1),
        ("ledger line(s)", ledger_lines, end.get("ledger")),
        ("vault item(s)", found["blob"], end.get("blobs")),
        ("document(s)", found["doc"], end.get("docs")),
        ("secret(s)", found["secret"], end.get("secrets", found["secret"])),
    ]
    for what, got, want in expected:
        if type(want) is not int or got != want:
            raise _bad(
                f"{where}:{end['_line']}: the end record counts {want!r} {what}, the archive holds {got} "
                "(a line lost or added: a damaged archive); nothing was imported"
            )
    if "sha256" in end and end["sha256"] != end["_sha256"]:
        raise _bad(
            f"{where}:{end['_line']}: the archive's lines do not hash to the end record's sha256 "
            "(a line altered: a damaged archive); nothing was imported"
        )


def _check_key(store: Store, session: str, output: Iterable[Any], secret: bytes | None) -> None:
    """Refuse an export whose last output holds signed messages that ``secret`` (the session's
    key, else its store's) did not sign: the session ran under another state root's key, and
    imported with this one its summaries and notes would read as the caller's own messages."""
    from ctxrules.injected import InjectionKey
    from ctxrules.messages import signed_by

    # Without a key of its own or its store's, a fresh one: it signed nothing.
    key = InjectionKey(secret if secret is not None and len(secret) >= 16 else secrets.token_bytes(32))
    verdicts = [v for m in output if isinstance(m, dict) and (v := signed_by(m, key)) is not None]
    if verdicts and not any(verdicts):
        raise StoreUsageError(
            "CR150",
            f"the injected messages of {store.describe(session)} are signed with a key {store.url} does not "
            "hold: it ran under another state root; give that one (--state DIR, or its --store URL)",
        )


def import_session(
    store: Store,
    session: str | Callable[[dict[str, Any]], str],
    lines: Iterable[bytes] | ArchiveFile,
    *,
    where: str,
) -> dict[str, int]:
    """Write the archive ``lines`` (or an :class:`ArchiveFile`: an item of any size, never
    held whole) into ``session`` of ``store``, or into the session a function of the archive's
    header names (read once: a pipe cannot be read twice); returns the counts. A session that
    exists already is refused (nothing of it is overwritten); everything is checked before
    anything is written."""
    header, records = read_archive(lines, where)
    if callable(session):
        session = session(header)
    _check_counts(records, where)
    blobs: list[tuple[bytes | dict[str, Any], str | None]] = []
    docs: list[tuple[Any, bytes]] = []
    ledger: list[dict[str, Any]] = []
    turn: dict[str, Any] | None = None
    secret: bytes | None = None
    for obj in records:
        kind, n = obj["kind"], obj["_line"]
        if kind == "blob" and "_offset" in obj:  # streamed: checked as it was read
            if obj["_error"] is not None:
                raise _bad(f"{where}:{n}: {obj['_error']}")
            blobs.append((obj, obj["media_type"]))
        elif kind == "blob":
            data = _decode(obj, where)
            if hashlib.sha256(data).hexdigest() != obj.get("id"):
                raise _bad(f"{where}:{n}: blob {obj.get('id')} does not hash to its id (a damaged archive)")
            media = obj.get("media_type")
            blobs.append((data, media if isinstance(media, str) else None))
        elif kind == "doc":
            if obj.get("name") not in DOCS:
                raise _bad(f"{where}:{n}: unknown document {obj.get('name')!r}")
            docs.append((obj["name"], _decode(obj, where)))
        elif kind == "ledger":
            listed = obj.get("lines")
            if not isinstance(listed, list) or not all(isinstance(raw, str) for raw in listed):
                raise _bad(f"{where}:{n}: the ledger record needs a list of lines (strings)")
            for raw in listed:
                try:
                    rec = json.loads(raw)
                except (TypeError, ValueError):
                    continue  # a line the source ledger could not read either
                if isinstance(rec, dict):
                    ledger.append(rec)
        elif kind == "secret":
            if obj.get("name") != "injection.key":
                raise _bad(f"{where}:{n}: unknown secret {obj.get('name')!r}")
            secret = _decode(obj, where)
            low, high = SECRET_BYTES
            if not low <= len(secret) <= high:  # written, a key every later turn would refuse
                raise _bad(
                    f"{where}:{n}: the injection key is {len(secret)} bytes, not {low} to {high} (a damaged archive)"
                )
        elif kind == "turn":
            state, output = obj.get("state"), obj.get("output")
            if not isinstance(state, dict) or not (output is None or isinstance(output, list)):
                raise _bad(f"{where}:{n}: the turn record needs a state object and an output list or null")
            if not isinstance(state.get("last", {}), dict):
                raise _bad(f"{where}:{n}: the turn record's state.last must be an object")
            if output is not None and not all(isinstance(msg, dict) for msg in output):
                raise _bad(f"{where}:{n}: the turn record's output must be a list of message objects")
            turn = obj
    exists = f"{store.describe(session)} exists already; import into another session (--session NAME)"
    if store.exists(session):
        raise _bad(exists)
    # All or nothing: written under a key no listing shows, made the session in one step at
    # the end; an import that fails (or is killed) leaves nothing a retry would find.
    try:
        with store.creating(session) as key:
            _write(store, key, lines, secret, blobs, docs, ledger, turn)
    except SessionExists:
        raise _bad(exists) from None
    except OSError as exc:
        if exc.filename is not None:
            raise
        # A write of the store (a full disk) names no file: named as the session, not taken for
        # a failure to read the archive.
        raise OSError(exc.errno, exc.strerror or str(exc), store.describe(session)) from exc
    return {"blobs": len(blobs), "docs": len(docs), "ledger": len(ledger)}


def _write(
    store: Store,
    key: str,
    lines: Iterable[bytes] | ArchiveFile,
    secret: bytes | None,
    blobs: list[tuple[bytes | dict[str, Any], str | None]],
    docs: list[tuple[Any, bytes]],
    ledger: list[dict[str, Any]],
    turn: dict[str, Any] | None,
) -> None:
    """Write the checked records of an archive into the new session ``key``."""
    if secret is not None:
        value = secret
        store.secret(key, "injection.key", lambda: value)
    for blob, media in blobs:
        if isinstance(blob, bytes):
            store.put_blob(key, blob, media)
        else:
            assert isinstance(lines, ArchiveFile)
            _put_streamed(store, key, lines, blob, media)
    for name, data in docs:
        store.write_doc(key, name, data)
    for rec in ledger:
        store.append([Log("session", key)], rec)
    if turn is not None:
        state = dict(turn["state"])
        if turn["output"] is not None:
            store.commit_turn(key, state, list(turn["output"]))
        else:
            # No verified output to go with it: the state alone, with nothing to reuse.
            state.pop("last", None)
            store.save_state(key, state)


def _put_streamed(store: Store, session: str, archive: ArchiveFile, blob: dict[str, Any], media: str | None) -> None:
    """Write the vault item of a long line, read again a chunk at a time (one with a media
    type, an image, whole: ``put_blob`` records the type)."""
    chunks = archive.blob_chunks(blob["_offset"])
    if media is not None:
        data = b"".join(chunks)
        if hashlib.sha256(data).hexdigest() != blob["id"]:
            raise _bad(f"{archive.where}: the archive changed while it was imported")
        store.put_blob(session, data, media)
        return
    writer = store.open_blob_writer(session)
    try:
        for chunk in chunks:
            writer.write(chunk)
        if writer.vault_id != blob["id"]:
            raise _bad(f"{archive.where}: the archive changed while it was imported")
        writer.commit()
    finally:
        writer.discard()
