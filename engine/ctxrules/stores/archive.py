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
import hashlib
import json
import secrets
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any, Final

from ctxrules.injected import existing_secret
from ctxrules.stores.base import DOCS, SECRET_BYTES, Log, Store, StoreUsageError

__all__ = ["ARCHIVE_FORMAT", "export_session", "import_session", "read_archive"]

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
        for blob_id in store.blob_ids(session):
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


def _all_lines(store: Store, log: Log) -> list[bytes]:
    chunk = store.read_log(log)
    return [ln for ln in chunk.lines if ln.strip()]


def read_archive(lines: Iterable[bytes], where: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The header and the records of an archive; a usage error (naming ``where`` and the line)
    for anything that is not a whole archive of this format."""
    it: Iterator[bytes] = iter(lines)
    records: list[dict[str, Any]] = []
    header: dict[str, Any] | None = None
    ended = False
    digest = hashlib.sha256()  # of the lines before the end record, as the writer wrote them
    for n, raw in enumerate(it, 1):
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


def import_session(store: Store, session: str, lines: Iterable[bytes], *, where: str) -> dict[str, int]:
    """Write the archive ``lines`` into ``session`` of ``store``; returns the counts. A session
    that exists already is refused (nothing of it is overwritten); everything is checked before
    anything is written."""
    _header, records = read_archive(lines, where)
    _check_counts(records, where)
    blobs: list[tuple[bytes, str | None]] = []
    docs: list[tuple[Any, bytes]] = []
    ledger: list[dict[str, Any]] = []
    turn: dict[str, Any] | None = None
    secret: bytes | None = None
    for obj in records:
        kind, n = obj["kind"], obj["_line"]
        if kind == "blob":
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
    if store.exists(session):
        raise _bad(f"{store.describe(session)} exists already; import into another session (--session NAME)")
    with store.prepare_lock(session):
        if secret is not None:
            value = secret
            store.secret(session, "injection.key", lambda: value)
        for data, media in blobs:
            store.put_blob(session, data, media)
        for name, data in docs:
            store.write_doc(session, name, data)
        for rec in ledger:
            store.append([Log("session", session)], rec)
        if turn is not None:
            state = dict(turn["state"])
            if turn["output"] is not None:
                store.commit_turn(session, state, list(turn["output"]))
            else:
                # No verified output to go with it: the state alone, with nothing to reuse.
                state.pop("last", None)
                store.save_state(session, state)
    return {"blobs": len(blobs), "docs": len(docs), "ledger": len(ledger)}
