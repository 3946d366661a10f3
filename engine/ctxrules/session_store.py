"""A session directory on disk: state file, last output, and the cross-process lock.

Layout (README "Sessions"): ``state.json`` (stage states, fingerprint, digests of the last
history), ``last_output.json`` (what the last ``prepare`` returned), ``vault/``, ``.lock``.
Files are written atomically (temp file + rename) with mode 0600; directories are 0700.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any

from ctxrules.errors import CtxrulesError

STATE_VERSION = 1


def ensure_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)


def write_atomic(path: Path, data: bytes) -> None:
    ensure_dir(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class SessionStore:
    def __init__(self, path: Path) -> None:
        self.path = path

    @property
    def state_file(self) -> Path:
        return self.path / "state.json"

    @property
    def output_file(self) -> Path:
        return self.path / "last_output.json"

    def load(self) -> dict[str, Any]:
        try:
            raw = self.state_file.read_bytes()
        except FileNotFoundError:
            return {"version": STATE_VERSION}
        except OSError as exc:
            raise CtxrulesError(f"cannot read session state {self.state_file}: {exc.strerror}") from exc
        try:
            data = json.loads(raw)
        except ValueError:
            # A damaged state file costs the reuse of the last compaction, never the conversation.
            return {"version": STATE_VERSION, "recovered": "state.json was unreadable and was reset"}
        if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
            return {"version": STATE_VERSION}
        return data

    def load_output(self) -> list[dict[str, Any]] | None:
        try:
            data = json.loads(self.output_file.read_bytes())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, list) else None

    def save(self, state: dict[str, Any], output: list[dict[str, Any]]) -> None:
        state["version"] = STATE_VERSION
        state.pop("recovered", None)
        write_atomic(self.output_file, json.dumps(output, ensure_ascii=False).encode("utf-8"))
        write_atomic(self.state_file, json.dumps(state, ensure_ascii=False, sort_keys=True).encode("utf-8"))


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
