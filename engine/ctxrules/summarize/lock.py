"""The per-session compaction lock: one compaction of a session at a time.

``Session.prepare`` already runs one at a time per session; this lock also covers code that
compacts outside ``prepare`` (the Python API) and another process that opened the same session
directory with a different engine. It is a :class:`ctxrules.locks.FileLock` on
``<session>/.compaction.lock``, taken without waiting: a compaction that finds it held is
skipped (the context stays as it is, and the next turn tries again) rather than stacking a
second summarization on top of the first.
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from ctxrules.stores.base import CompactionBusy

if TYPE_CHECKING:
    from ctxrules.locks import FileLock

__all__ = ["CompactionBusy", "CompactionLock"]

LOCK_NAME = ".compaction.lock"


class CompactionLock:
    """``with CompactionLock(session_dir): ...`` — raises :class:`CompactionBusy` when held."""

    def __init__(self, session_dir: Path) -> None:
        self.path = Path(session_dir) / LOCK_NAME
        self._lock: FileLock | None = None

    def __enter__(self) -> CompactionLock:
        # Imported here: a pack that merely declares a summarizer loads this module.
        from ctxrules.locks import FileLock, LockTimeout

        lock = FileLock(self.path, timeout=0)
        try:
            lock.acquire()
        except LockTimeout:
            raise CompactionBusy(f"another compaction of {self.path.parent} is running") from None
        self._lock = lock
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None
