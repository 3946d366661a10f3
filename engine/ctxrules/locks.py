"""Exclusive locks on files, across processes and threads, on every platform.

Built on ``filelock`` (``flock`` on POSIX, ``LockFileEx`` on Windows) rather than on ``fcntl``,
which does not exist on Windows. The lock file is opened without following a symbolic link
(``filelock`` >= 3.20.1), so a ``.lock`` planted as a link to a file elsewhere is refused instead
of being created or opened through the link.

Only code that writes shared state imports this module, and it imports it where it takes a lock:
verbs that only read packs (``validate``, ``explain``, ``assemble``, ``test``) never load it.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from types import TracebackType

import filelock

from ctxrules.errors import CtxrulesError

__all__ = ["FileLock", "LockError", "LockTimeout"]


class LockError(CtxrulesError):
    """A lock file could not be used (a symbolic link, a permission problem, a full disk)."""


class LockTimeout(LockError):
    """The lock is held by another process (or thread) and the timeout ran out."""


class FileLock:
    """``with FileLock(path): ...`` holds an exclusive lock on ``path``, a file that holds
    nothing but the lock (it is created 0600, its directory 0700, and kept after release).

    Threads exclude one another too: each thread acquires through its own descriptor. A child
    forked while the parent holds the lock does not inherit the hold: its first acquire builds
    a fresh ``filelock`` instance (a new descriptor), which waits for the parent like any other
    process.
    Acquiring twice in one thread through the same object nests; through two objects for the
    same path it is an error rather than a deadlock.

    ``timeout``: ``None`` waits as long as it takes, ``0`` tries once, otherwise seconds;
    :class:`LockTimeout` when it runs out.
    """

    def __init__(self, path: str | Path, *, timeout: float | None = None) -> None:
        self.path = Path(path)
        self.timeout = timeout
        self._pid = 0
        self._dir_made = False
        self._lock = self._native()

    def _native(self) -> filelock.FileLock:
        # filelock refuses an instance inherited across a fork: a forked child gets its own.
        self._pid = os.getpid()
        return filelock.FileLock(self.path, timeout=-1 if self.timeout is None else self.timeout, mode=0o600)

    @property
    def is_locked(self) -> bool:
        return self._pid == os.getpid() and self._lock.is_locked

    def acquire(self) -> None:
        if self._pid != os.getpid():
            self._lock = self._native()
        try:
            if not self._dir_made:  # once per object: a warm turn pays for the lock alone
                self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                self._dir_made = True
            self._lock.acquire()
        except filelock.Timeout:
            raise LockTimeout(f"{self.path} is held by another process") from None
        except RuntimeError as exc:  # filelock's same-thread deadlock detection
            raise LockError(f"cannot lock {self.path}: {exc}") from None
        except OSError as exc:
            raise LockError(_describe(self.path, exc)) from None

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def _describe(path: Path, exc: OSError) -> str:
    if exc.errno in (errno.ELOOP, getattr(errno, "EMLINK", -1), getattr(errno, "EFTYPE", -1)):
        # What O_NOFOLLOW reports for a link (ELOOP on Linux, EMLINK/EFTYPE on the BSDs).
        return f"refusing to use {path}: it is a symbolic link, not a lock file of ctxrules"
    return f"cannot lock {path}: {exc.strerror or exc}"
