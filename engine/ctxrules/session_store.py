"""A session directory on disk: state file, last output, and the cross-process lock.

Layout (docs/reference/api.md "Sessions and the vault"): ``state.json`` (stage states,
fingerprint, a chained digest of the last history), ``last_output.jsonl`` (what the last
``prepare`` returned, a message per line), ``vault/``, ``.lock``. Files have mode 0600,
directories 0700. Both files are caches: losing them costs the reuse of the last compaction,
never the conversation. ``last_output.jsonl`` is replaced by rename or appended to (the state
says how many of its lines count), and ``state.json`` is rewritten in place through a handle
kept open (:meth:`SessionStore._write_state`).
"""

from __future__ import annotations

import contextlib
import json
import operator
import os
import tempfile
import weakref
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ctxrules.errors import CtxrulesError

if TYPE_CHECKING:
    from ctxrules.locks import FileLock

DEFAULT_STATE_ROOT = ".ctxrules"
"""Where sessions and the day and goal ledgers live when nothing else is said."""


def state_root_from_env() -> Path:
    """The state root: ``CTXRULES_STATE`` when set, else :data:`DEFAULT_STATE_ROOT`."""
    return Path(os.environ.get("CTXRULES_STATE", DEFAULT_STATE_ROOT))


STATE_VERSION = 1


def ensure_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)


def write_atomic(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Write ``data`` so that readers see the old or the new file, never a mix. ``durable``
    also survives a power loss (fsync); caches that can be rebuilt skip that cost."""
    ensure_dir(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class SessionStore:
    """``state.json`` and ``last_output.jsonl`` (one message per line, so that a turn that
    only appends messages appends lines instead of rewriting the file). Both are caches:
    losing them costs the reuse of the last compaction, never the conversation, so they are
    written without fsync."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._written: list[dict[str, Any]] | None = None
        self._written_stat: tuple[int, int] | None = None
        self._state: dict[str, Any] | None = None
        self._state_stat: tuple[int, int] | None = None
        # Handles kept open between turns (opening, and above all creating, a file costs more
        # than a warm turn's stages): state.json, and last_output.jsonl for appending.
        self._state_handle = _Handle(self.state_file, os.O_RDWR | os.O_CREAT)
        self._output_handle = _Handle(self.output_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT)

    @property
    def state_file(self) -> Path:
        return self.path / "state.json"

    @property
    def output_file(self) -> Path:
        return self.path / "last_output.jsonl"

    def load(self) -> dict[str, Any]:
        # The state this object wrote last is still what is on disk unless another process
        # wrote since (the session lock orders the writers): then it need not be parsed again.
        if self._state is not None and self._state_stat == _stat(self.state_file):
            return self._state
        try:
            raw = self.state_file.read_bytes()
        except FileNotFoundError:
            return {"version": STATE_VERSION}
        except OSError as exc:
            raise CtxrulesError(f"cannot read session state {self.state_file}: {exc.strerror}") from exc
        try:
            # The first JSON value: a writer stopped between writing the new state and cutting
            # the file to its length leaves the end of the old one behind it.
            data, _end = json.JSONDecoder().raw_decode(raw.decode("utf-8"))
        except ValueError:
            return {"version": STATE_VERSION, "recovered": "state.json was unreadable and was reset"}
        if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
            return {"version": STATE_VERSION}
        return data

    def forget(self) -> None:
        """Drop the in-memory state (after a run that failed part-way changed it)."""
        self._state = self._state_stat = None

    def load_output(self, count: int, written: Any = None) -> list[dict[str, Any]] | None:
        """The first ``count`` messages of the last output, or None when they are not all there
        or the file is not the one the state was saved with (``written``: the state's
        ``last.output_file``, inode and size; a process that died between writing the output
        and writing the state leaves a file the state does not describe)."""
        out: list[dict[str, Any]] = []
        try:
            with self.output_file.open("rb") as fh:
                if written is not None:
                    st = os.fstat(fh.fileno())
                    if written != [st.st_ino, st.st_size]:
                        return None
                for line in fh:
                    if len(out) == count:
                        break
                    msg = json.loads(line)
                    if not isinstance(msg, dict):
                        return None
                    out.append(msg)
        except (OSError, ValueError):
            return None
        return out if len(out) == count else None

    def holds(self, output: list[dict[str, Any]]) -> bool:
        """Whether ``last_output.jsonl`` is the file this object last wrote and holds exactly
        ``output`` (the same message objects), so its first lines can stand for them."""
        prev = self._written
        return (prev is not None and len(prev) == len(output) and self._stat() == self._written_stat
                and all(map(operator.is_, prev, output)))

    def save(self, state: dict[str, Any], output: list[dict[str, Any]]) -> None:
        state["version"] = STATE_VERSION
        state.pop("recovered", None)
        state.setdefault("last", {})["output_count"] = len(output)
        prev = self._written
        # Append only to the file this object wrote last (another process may have rewritten it).
        if (prev is not None and self._stat() == self._written_stat and len(prev) <= len(output)
                and all(map(operator.is_, prev, output))):
            if len(prev) < len(output):
                _write_all(self._output_handle.fd(), _jsonl(output[len(prev):]))
        else:
            write_atomic(self.output_file, _jsonl(output), durable=False)
        self._written = list(output)
        st = os.stat(self.output_file)
        self._written_stat = (st.st_size, st.st_mtime_ns)
        state["last"]["output_file"] = [st.st_ino, st.st_size]
        self._write_state(json.dumps(state, ensure_ascii=False, sort_keys=True).encode("utf-8"))
        self._state, self._state_stat = state, _stat(self.state_file)

    def _write_state(self, data: bytes) -> None:
        """Rewrite ``state.json`` in place: the new state from offset 0, then the file cut to
        its length.

        Not a temp file renamed over it: creating a file and renaming it over another made
        ext4 write the data out (``auto_da_alloc``), which cost a warm turn more than all of its
        stages. A writer stopped between the two steps leaves the end of the old state behind
        the new one, which :meth:`load` ignores; a state torn by a power loss (it is never
        fsynced) reads as damaged and costs the reuse of one compaction, like a lost cache.
        """
        fd = self._state_handle.fd()
        _write_all(fd, data, offset=0)
        os.ftruncate(fd, len(data))

    def _stat(self) -> tuple[int, int] | None:
        return _stat(self.output_file)


class _Handle:
    """A file descriptor kept open between turns, reopened when the file at ``path`` is no
    longer the one it refers to (replaced by rename, or removed); closed when the handle is
    collected."""

    def __init__(self, path: Path, flags: int) -> None:
        self.path, self.flags = path, flags
        self._fd: int | None = None
        self._close: weakref.finalize[..., Any] | None = None
        self._ident: tuple[int, int, int] | None = None

    def fd(self) -> int:
        try:
            st = os.stat(self.path)
            ident: tuple[int, int, int] | None = (st.st_dev, st.st_ino, os.getpid())
        except FileNotFoundError:
            ident = None
        # The pid is part of the identity: after a fork the child needs its own open file
        # description (a handle shared across a fork would share its file offset and state).
        if self._fd is not None and ident == self._ident:
            return self._fd
        if self._close is not None:
            self._close()
            self._fd = self._close = None
        try:
            fd = os.open(self.path, self.flags | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:
            ensure_dir(self.path.parent)
            fd = os.open(self.path, self.flags | os.O_CLOEXEC, 0o600)
        self._fd, self._close = fd, weakref.finalize(self, os.close, fd)
        st = os.fstat(fd)
        self._ident = (st.st_dev, st.st_ino, os.getpid())
        return fd


def _write_all(fd: int, data: bytes, *, offset: int | None = None) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view) if offset is None else os.pwrite(fd, view, offset)
        view = view[written:]
        if offset is not None:
            offset += written


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns)


def _jsonl(messages: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(m, ensure_ascii=False).encode("utf-8") + b"\n" for m in messages)


class SessionLock:
    """One ``prepare`` at a time per session, across threads of one process (the caller holds
    a thread lock too) and across processes (:class:`ctxrules.locks.FileLock` on
    ``<session>/.lock``). The lock module is imported on first use, so loading a session store
    to read it (``explain``, pack tests) does not load it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock: FileLock | None = None

    def __enter__(self) -> SessionLock:
        if self._lock is None:
            from ctxrules.locks import FileLock

            self._lock = FileLock(self.path / ".lock")
        self._lock.acquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._lock is not None and self._lock.is_locked:
            self._lock.release()
