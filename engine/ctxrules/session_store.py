"""A session directory on disk: state file, last output, and the cross-process lock.

Layout (README "Sessions"): ``state.json`` (stage states, fingerprint, a chained digest of the
last history), ``last_output.jsonl`` (what the last ``prepare`` returned, a message per line),
``vault/``, ``.lock``. Files have mode 0600, directories 0700. A reader never sees a partly
written file: ``last_output.jsonl`` is replaced by rename or appended to (its line count is in
the state), and ``state.json`` is written beside itself first (:meth:`SessionStore._write_state`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import operator
import os
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any

from ctxrules.errors import CtxrulesError

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

    @property
    def state_file(self) -> Path:
        return self.path / "state.json"

    @property
    def _new_state_file(self) -> Path:
        return self.path / "state.json.new"

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
            try:  # a crash between removing the old state and renaming the new one in
                raw = self._new_state_file.read_bytes()
            except OSError:
                return {"version": STATE_VERSION}
        except OSError as exc:
            raise CtxrulesError(f"cannot read session state {self.state_file}: {exc.strerror}") from exc
        try:
            data = json.loads(raw)
        except ValueError:
            return {"version": STATE_VERSION, "recovered": "state.json was unreadable and was reset"}
        if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
            return {"version": STATE_VERSION}
        return data

    def forget(self) -> None:
        """Drop the in-memory state (after a run that failed part-way changed it)."""
        self._state = self._state_stat = None

    def load_output(self, count: int) -> list[dict[str, Any]] | None:
        """The first ``count`` messages of the last output, or None when they are not all there."""
        out: list[dict[str, Any]] = []
        try:
            with self.output_file.open("rb") as fh:
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

    def save(self, state: dict[str, Any], output: list[dict[str, Any]]) -> None:
        state["version"] = STATE_VERSION
        state.pop("recovered", None)
        state.setdefault("last", {})["output_count"] = len(output)
        prev = self._written
        # Append only to the file this object wrote last (another process may have rewritten it).
        if (prev is not None and self._stat() == self._written_stat and len(prev) <= len(output)
                and all(map(operator.is_, prev, output))):
            if len(prev) < len(output):
                with self.output_file.open("ab") as fh:
                    fh.write(_jsonl(output[len(prev):]))
        else:
            write_atomic(self.output_file, _jsonl(output), durable=False)
        self._written = list(output)
        self._written_stat = self._stat()
        self._write_state(json.dumps(state, ensure_ascii=False, sort_keys=True).encode("utf-8"))
        self._state, self._state_stat = state, _stat(self.state_file)

    def _write_state(self, data: bytes) -> None:
        """Replace ``state.json`` on every turn without renaming over it.

        Renaming a new file over an existing one makes ext4 write the new data out first
        (``auto_da_alloc``), which costs a warm turn more than the whole pipeline. So the new
        state is written to ``state.json.new``, and only once it is complete is the old file
        removed and the new one renamed into the free name. A crash between the two leaves no
        ``state.json`` but a complete ``state.json.new``, which :meth:`load` then reads.
        """
        new = self._new_state_file
        with contextlib.suppress(FileNotFoundError):
            os.unlink(new)  # left by a crash while it was being written
        try:
            fd = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileNotFoundError:  # the session directory went away
            ensure_dir(self.path)
            fd = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.state_file)
        os.rename(new, self.state_file)


    def _stat(self) -> tuple[int, int] | None:
        return _stat(self.output_file)


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
    a thread lock too) and across processes (``flock`` on ``<session>/.lock``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def __enter__(self) -> SessionLock:
        try:
            ensure_dir(self.path)
            self._fd = os.open(self.path / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise CtxrulesError(f"cannot use session directory {self.path}: {exc.strerror}") from exc
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
