"""The per-session compaction lock: one compaction of a session at a time.

``Session.prepare`` already runs one at a time per session; this lock also covers code that
compacts outside ``prepare`` (the Python API) and another process that opened the same session
directory with a different engine. It is an ``flock`` on ``<session>/.compaction.lock``, taken
without waiting: a compaction that finds it held is skipped (the context stays as it is, and the
next turn tries again) rather than stacking a second summarization on top of the first.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType

__all__ = ["CompactionBusy", "CompactionLock"]

LOCK_NAME = ".compaction.lock"


class CompactionBusy(Exception):
    """Another compaction of this session holds the lock."""


class CompactionLock:
    """``with CompactionLock(session_dir): ...`` — raises :class:`CompactionBusy` when held."""

    def __init__(self, session_dir: Path) -> None:
        self.path = Path(session_dir) / LOCK_NAME
        self._fd: int | None = None

    def __enter__(self) -> CompactionLock:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise CompactionBusy(f"another compaction of {self.path.parent} is running") from None
        self._fd = fd
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
