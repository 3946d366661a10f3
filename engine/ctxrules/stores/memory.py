"""An in-memory :class:`~ctxrules.stores.base.Store`: what a Redis store with ``on_error=local``
serves a call from when Redis cannot be reached, and a store for tests and one-off scripts.

Everything lives in this object's dictionaries and is gone with it; locks exclude threads of
this process only. Semantics match the other backends (the conformance tests run all three).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import secrets
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ctxrules.stores.base import (
    SESSION_ID_RE,
    CompactionBusy,
    DocName,
    Log,
    LogChunk,
    LogKind,
    SessionExists,
    SpooledBlobWriter,
    StoreLockTimeout,
    Turn,
    VaultError,
)

__all__ = ["MemoryStore"]

_STAGING = "\x00creating:"  # the prefix of a session being made (creating): no name starts so


@dataclass
class _Session:
    state: bytes | None = None
    output: list[bytes] | None = None
    blobs: set[str] = field(default_factory=set)
    media: dict[str, str] = field(default_factory=dict)
    docs: dict[str, bytes] = field(default_factory=dict)
    secrets: dict[str, bytes] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    compaction: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class _Log:
    gen: str = field(default_factory=lambda: secrets.token_hex(8))
    lines: list[bytes] = field(default_factory=list)
    totals: dict[str, float] = field(default_factory=dict)


def _session_logs(key: str, session: str) -> list[tuple[Log, Log]]:
    """The logs of a session being made under ``key``, and the same of ``session``."""
    return [(Log("session", key), Log("session", session)), (Log("descendants", key), Log("descendants", session))]


class MemoryStore:
    """Sessions in a dictionary (module docstring)."""

    def __init__(self, url: str = "memory://") -> None:
        self.url = url
        self._mutex = threading.RLock()
        self._sessions: dict[str, _Session] = {}
        self._blobs: dict[str, bytes] = {}
        self._logs: dict[Log, _Log] = {}
        self._secrets: dict[str, bytes] = {}
        self._written: dict[str, list[dict[str, Any]]] = {}

    def _s(self, session: str) -> _Session:
        with self._mutex:
            found = self._sessions.get(session)
            if found is None:
                found = self._sessions[session] = _Session()
            return found

    def session_key(self, name: str) -> str:
        if SESSION_ID_RE.fullmatch(name) and name.strip("."):
            return name
        return hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()

    def describe(self, session: str) -> str:
        return f"{self.url}#{session}"

    def sessions(self) -> list[str]:
        with self._mutex:
            return sorted(
                k
                for k, s in self._sessions.items()
                if (s.state is not None or s.blobs or s.docs) and not k.startswith(_STAGING)
            )

    def exists(self, session: str) -> bool:
        return session in self.sessions()

    @contextlib.contextmanager
    def creating(self, session: str) -> Iterator[str]:
        """Written under a key no listing shows, moved to ``session`` at the end."""
        if self.exists(session):
            raise SessionExists(f"{self.describe(session)} exists already")
        key = f"{_STAGING}{secrets.token_hex(8)}:{session}"
        try:
            yield key
            with self._mutex:
                if self.exists(session):
                    raise SessionExists(f"{self.describe(session)} exists already")
                made = self._sessions.pop(key, None)
                self._sessions[session] = made if made is not None else _Session()
                for log_key, log_session in _session_logs(key, session):
                    log = self._logs.pop(log_key, None)
                    if log is not None:
                        self._logs[log_session] = log
                if key in self._written:
                    self._written[session] = self._written.pop(key)
        finally:
            with self._mutex:
                self._sessions.pop(key, None)
                self._written.pop(key, None)
                for log_key, _ in _session_logs(key, session):
                    self._logs.pop(log_key, None)

    def load_turn(self, session: str, *, output: bool = True) -> Turn:
        s = self._s(session)
        with self._mutex:
            if s.state is None:
                return Turn({"version": 1})
            state = json.loads(s.state)
            lines = list(s.output) if s.output is not None else None
        out = None
        if output and lines is not None:
            out = [json.loads(line) for line in lines]
        return Turn(state, out)

    def commit_turn(
        self,
        session: str,
        state: dict[str, Any],
        output: list[dict[str, Any]],
        *,
        records: Sequence[tuple[Sequence[Log], Mapping[str, Any]]] = (),
    ) -> None:
        lines = [json.dumps(m, ensure_ascii=False).encode("utf-8", "surrogatepass") for m in output]
        digest = hashlib.sha256(b"".join(line + b"\n" for line in lines)).hexdigest()
        state["version"] = 1
        state.pop("recovered", None)
        last = state.setdefault("last", {})
        last["output_count"] = len(output)
        last["output_digest"] = digest
        last.pop("output_file", None)
        s = self._s(session)
        with self._mutex:
            s.state = json.dumps(state, ensure_ascii=False, sort_keys=True).encode("utf-8")
            s.output = lines
            self._written[session] = list(output)
        for logs, record in records:
            self.append(logs, record)

    def output_holds(self, session: str, output: list[dict[str, Any]]) -> bool:
        prev = self._written.get(session)
        return prev is not None and len(prev) == len(output) and all(a is b for a, b in zip(prev, output, strict=True))

    def forget(self, session: str) -> None:
        self._written.pop(session, None)

    def save_state(self, session: str, state: dict[str, Any]) -> None:
        s = self._s(session)
        with self._mutex:
            s.state = json.dumps(state, ensure_ascii=False, sort_keys=True).encode("utf-8")
        self.forget(session)

    def open_blob_writer(self, session: str) -> SpooledBlobWriter:
        """Pieces spooled to a private local file, stored whole on commit."""
        return SpooledBlobWriter(self, session)

    def put_blob(self, session: str, data: bytes, media_type: str | None = None) -> str:
        data = bytes(data)
        blob_id = hashlib.sha256(data).hexdigest()
        s = self._s(session)
        with self._mutex:
            self._blobs.setdefault(blob_id, data)
            s.blobs.add(blob_id)
            if media_type is not None:
                s.media[blob_id] = media_type
        return blob_id

    def get_blob(self, session: str, blob_id: str) -> bytes:
        with self._mutex:
            data = self._blobs.get(blob_id) if blob_id in self._s(session).blobs else None
        if data is None:
            raise VaultError(f"vault item {blob_id} is missing from {self.describe(session)} (not found)")
        return data

    def has_blob(self, session: str, blob_id: str) -> bool:
        return not self.missing_blobs(session, [blob_id])

    def missing_blobs(self, session: str, blob_ids: Sequence[str]) -> set[str]:
        s = self._s(session)
        with self._mutex:
            return {b for b in blob_ids if b not in s.blobs or b not in self._blobs}

    def blob_ids(self, session: str, prefix: str = "") -> list[str]:
        with self._mutex:
            return sorted(b for b in self._s(session).blobs if b.startswith(prefix))

    def blob_media_type(self, session: str, blob_id: str) -> str | None:
        return self._s(session).media.get(blob_id)

    def read_doc(self, session: str, name: DocName) -> bytes | None:
        return self._s(session).docs.get(name)

    def update_doc(self, session: str, name: DocName, update: Callable[[bytes | None], bytes | None]) -> None:
        s = self._s(session)
        with self._mutex:
            new = update(s.docs.get(name))
            if new is not None:
                s.docs[name] = new

    def write_doc(self, session: str, name: DocName, data: bytes | None) -> None:
        s = self._s(session)
        with self._mutex:
            if data is None:
                s.docs.pop(name, None)
            else:
                s.docs[name] = data

    def doc_location(self, session: str, name: DocName) -> str:
        return f"{self.describe(session)}/{name}"

    def append(self, logs: Sequence[Log], record: Mapping[str, Any]) -> None:
        line = json.dumps(record, ensure_ascii=False, sort_keys=True, allow_nan=False).encode("utf-8")
        with self._mutex:
            for log in logs:
                entry = self._logs.setdefault(log, _Log())
                entry.lines.append(line)
                if record.get("type") == "reset":
                    entry.totals.clear()
                elif record.get("type") == "call":
                    _add(entry.totals, "calls", 1)
                    for group in ("tokens", "usd"):
                        values = record.get(group)
                        if isinstance(values, Mapping):
                            for k, v in values.items():
                                if isinstance(v, int | float) and not isinstance(v, bool):
                                    _add(entry.totals, f"{group}.{k}", v)

    def append_once(
        self, log: Log, record: Mapping[str, Any], *, key: str, limit: int
    ) -> Literal["added", "present", "full"]:
        with self._mutex:
            entry = self._logs.setdefault(log, _Log())
            wanted = record.get(key)
            for line in entry.lines:
                obj = json.loads(line)
                if isinstance(obj, dict) and obj.get(key) == wanted:
                    return "present"
            if len(entry.lines) >= limit:
                return "full"
            entry.lines.append(json.dumps(dict(record), ensure_ascii=False, sort_keys=True).encode("utf-8"))
            return "added"

    def read_log(self, log: Log, cursor: Any = None) -> LogChunk:
        with self._mutex:
            entry = self._logs.get(log)
            if entry is None:
                return LogChunk([], ("", 0), cursor is not None and cursor != ("", 0))
            gen, offset = cursor if isinstance(cursor, tuple) and len(cursor) == 2 else ("", 0)
            restarted = cursor is not None and gen != entry.gen
            start = offset if gen == entry.gen else 0
            lines = entry.lines[start:]
            return LogChunk(list(lines), (entry.gen, start + len(lines)), restarted)

    def totals(self, log: Log) -> dict[str, float]:
        with self._mutex:
            entry = self._logs.get(log)
            return dict(entry.totals) if entry is not None else {}

    def log_location(self, log: Log) -> str:
        name = f"/{log.name}" if log.name else ""
        return f"{self.url}#ledger/{log.kind}{name}"

    def logs(self, kind: LogKind) -> list[Log]:
        with self._mutex:
            return sorted((lg for lg in self._logs if lg.kind == kind), key=lambda lg: lg.name)

    def prepare_lock(self, session: str, *, timeout: float | None = None) -> _ThreadLock:
        return _ThreadLock(self._s(session).lock, self.describe(session), timeout)

    def compaction_lock(self, session: str) -> AbstractContextManager[Any]:
        return self._compaction(session)

    @contextlib.contextmanager
    def _compaction(self, session: str) -> Iterator[None]:
        lock = self._s(session).compaction
        if not lock.acquire(blocking=False):
            raise CompactionBusy(f"another compaction of {self.describe(session)} is running")
        try:
            yield
        finally:
            lock.release()

    def secret(self, session: str | None, name: str, make: Callable[[], bytes]) -> bytes:
        with self._mutex:
            where = self._s(session).secrets if session is not None else self._secrets
            if name not in where:
                where[name] = make()
            return where[name]

    def close(self) -> None:
        pass


def _add(totals: dict[str, float], key: str, value: float) -> None:
    totals[key] = totals.get(key, 0) + value


class _ThreadLock:
    def __init__(self, lock: threading.Lock, where: str, timeout: float | None) -> None:
        self._lock, self._where, self._timeout = lock, where, timeout

    def __enter__(self) -> _ThreadLock:
        if not self._lock.acquire(timeout=-1 if self._timeout is None else self._timeout):
            raise StoreLockTimeout(f"the prepare lock of {self._where} stayed held for {self._timeout:g}s")
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    def renew(self) -> None:
        pass


if TYPE_CHECKING:
    from ctxrules.stores.base import Store

    def _conforms(store: MemoryStore) -> Store:
        return store  # mypy checks that MemoryStore is a Store
