"""Exclusive locks on files, across processes and threads, on every platform.

On POSIX a lock is ``flock`` on a descriptor the lock object keeps open between acquires (a warm
``prepare`` takes its session lock once per turn: one ``flock`` call, not an open, a lock and a
close through a general-purpose library, which cost more than a warm turn's stages). Windows has
no ``fcntl``: there the lock is ``filelock``'s (``LockFileEx``). Either way the lock file is opened
without following a symbolic link, so a ``.lock`` planted as a link to a file elsewhere is refused
instead of being created or opened through the link.

Only code that writes shared state imports this module, and it imports it where it takes a lock:
verbs that only read packs (``validate``, ``explain``, ``assemble``, ``test``) never load it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
import threading
import time
import weakref
from pathlib import Path
from types import TracebackType
from typing import Any

from ctxrules.errors import CtxrulesError
from ctxrules.threads import ForkSafeLock

__all__ = ["FileLock", "LockError", "LockTimeout", "held_elsewhere", "hold_shared"]

# A wait shorter than this goes unmentioned (another run's save takes milliseconds).
_QUIET_WAIT_S = 1.0
_POLL_S = 0.05  # how often a lock with a timeout tries again (filelock's default interval)


class LockError(CtxrulesError):
    """A lock file could not be used (a symbolic link, a permission problem, a full disk)."""


class LockTimeout(LockError):
    """The lock is held by another process (or thread) and the timeout ran out."""


class FileLock:
    """``with FileLock(path): ...`` holds an exclusive lock on ``path``, a file that holds
    nothing but the lock (it is created 0600, its directory 0700, and kept after release).

    Threads exclude one another too: through one object they queue on its thread lock, through
    two objects each holds its own descriptor. A child forked while the parent holds the lock
    does not inherit the hold: its first acquire opens a descriptor of its own, which waits for
    the parent like any other process.
    Acquiring twice in one thread through the same object nests; through two objects for the
    same path it is an error rather than a deadlock (:class:`LockTimeout` with a timeout, as
    for any other holder).

    ``timeout``: ``None`` waits as long as it takes, ``0`` tries once, otherwise seconds;
    :class:`LockTimeout` when it runs out.
    """

    def __init__(self, path: str | Path, *, timeout: float | None = None) -> None:
        self.path = Path(path)
        self.timeout = timeout
        self._impl: _FlockLock | _PortableLock = (
            _PortableLock(self.path, timeout) if _fcntl is None else _FlockLock(self.path, timeout)
        )

    @property
    def is_locked(self) -> bool:
        return self._impl.is_locked

    def acquire(self) -> None:
        self._impl.acquire()

    def release(self) -> None:
        self._impl.release()

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


# POSIX: flock on a kept descriptor --------------------------------------------------------------

if sys.platform != "win32":
    import fcntl as _fcntl_module

    _fcntl: Any = _fcntl_module
else:  # pragma: no cover - exercised on Windows only
    _fcntl = None

# (st_dev, st_ino) of every lock file a thread of this process holds -> the holding thread's
# (pid, ident): a second object taking a file its own thread holds would wait for itself forever.
# The pid too: a forked child's thread has the ident of the parent's thread that forked.
_held: dict[tuple[int, int], tuple[int, int]] = {}
_held_mutex = ForkSafeLock()


class _FlockLock:
    def __init__(self, path: Path, timeout: float | None) -> None:
        self.path, self.timeout = path, timeout
        self._str = os.fspath(path)
        self._mutex = threading.RLock()  # threads of this process queue here, and a thread nests
        self._depth = 0
        self._fd: int | None = None
        self._pid = 0
        self._ident: tuple[int, int] | None = None
        self._close: weakref.finalize[Any, Any] | None = None
        self._dir_made = False

    @property
    def is_locked(self) -> bool:
        return self._depth > 0 and self._pid == os.getpid()

    def acquire(self) -> None:
        pid = os.getpid()  # once: every prepare takes the lock, and each call is a system call
        if self._pid and self._pid != pid:
            # A forked child: the thread lock may be held by the parent's hold; start afresh.
            self._mutex, self._depth = threading.RLock(), 0
        deadline = None if self.timeout is None else time.monotonic() + max(self.timeout, 0.0)
        if not self._mutex.acquire(timeout=-1 if deadline is None else max(self.timeout or 0.0, 0.0)):
            raise LockTimeout(f"{self.path} is held by another process")
        try:
            if self._depth > 0 and self._pid == pid:
                self._depth += 1
                return
            self._depth = 0
            self._lock(deadline, (pid, threading.get_ident()))
            self._depth = 1
        except BaseException:
            self._mutex.release()
            raise

    def release(self) -> None:
        pid = os.getpid()
        if self._depth <= 0 or self._pid != pid:
            return
        self._depth -= 1
        if self._depth == 0:
            with _held_mutex:
                if self._ident is not None and _held.get(self._ident) == (pid, threading.get_ident()):
                    del _held[self._ident]
            if self._fd is not None:
                _fcntl.flock(self._fd, _fcntl.LOCK_UN)
        self._mutex.release()

    def _lock(self, deadline: float | None, me: tuple[int, int]) -> None:
        """Take the flock; the file locked must still be the one at the path (a lock file
        removed or replaced meanwhile would lock nothing another process opens). ``me``:
        this thread's (pid, ident), its key in ``_held``."""
        for _attempt in range(8):
            fd = self._fd if self._fd is not None and self._pid == me[0] else self._descriptor()
            ident = self._ident
            assert ident is not None
            with _held_mutex:
                owner = _held.get(ident)
            if owner == me:
                # Waiting would be for this very thread: forever without a timeout (an error,
                # not a deadlock), in vain with one (held, as for any other holder).
                if deadline is None:
                    raise LockError(f"cannot lock {self.path}: this thread holds it through another lock object")
                raise LockTimeout(f"{self.path} is held by another lock object of this thread")
            try:
                if deadline is None:  # the usual case: wait as long as it takes, saying so
                    self._flock_waiting(fd)
                else:
                    self._flock(fd, deadline)
            except OSError as exc:
                raise LockError(_describe(self.path, exc)) from None
            try:
                st = os.lstat(self._str)
                current = (st.st_dev, st.st_ino) == ident and stat.S_ISREG(st.st_mode)
            except FileNotFoundError:
                current = False
            if current:
                with _held_mutex:
                    _held[ident] = me
                return
            _fcntl.flock(fd, _fcntl.LOCK_UN)
            self._drop()  # the file went away under the lock: lock the one at the path now
        raise LockError(f"cannot lock {self.path}: the lock file keeps being replaced")

    def _flock_waiting(self, fd: int) -> None:
        """Take the flock however long it is held elsewhere; past a short wait, say once (a
        warning log event) that this process is waiting and for what, so a holder that is
        stopped or slow does not look like a hang."""
        try:
            _fcntl.flock(fd, _fcntl.LOCK_EX | _fcntl.LOCK_NB)  # free: every prepare's case, one call
            return
        except BlockingIOError:
            pass
        try:
            self._flock(fd, time.monotonic() + _QUIET_WAIT_S)
            return
        except LockTimeout:
            pass
        from ctxrules.logs import get_logger  # here: taking a free lock never imports logging

        get_logger("ctxrules.locks").warning(
            "lock.wait",
            path=str(self.path),
            message=f"waiting for {self.path}: another process or session object holds it (a run of the same session?)",
        )
        _fcntl.flock(fd, _fcntl.LOCK_EX)

    def _flock(self, fd: int, deadline: float | None) -> None:
        if deadline is None:
            _fcntl.flock(fd, _fcntl.LOCK_EX)
            return
        while True:
            try:
                _fcntl.flock(fd, _fcntl.LOCK_EX | _fcntl.LOCK_NB)
                return
            except BlockingIOError:
                pass
            except OSError as exc:
                if exc.errno not in (errno.EACCES, errno.EAGAIN):
                    raise
            left = deadline - time.monotonic()
            if left <= 0:
                raise LockTimeout(f"{self.path} is held by another process")
            time.sleep(min(_POLL_S, left))

    def _descriptor(self) -> int:
        """The kept descriptor; a new one after a fork (a descriptor shared with the parent
        shares its lock) or when the file is not the one at the path any more."""
        pid = os.getpid()
        if self._fd is not None and self._pid == pid:
            return self._fd
        self._drop()
        try:
            if not self._dir_made:  # once per object: a warm turn pays for the lock alone
                self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                self._dir_made = True
            flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
            fd = os.open(self._str, flags, 0o600)
        except OSError as exc:
            raise LockError(_describe(self.path, exc)) from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise LockError(f"cannot lock {self.path}: it is not a regular file")
        self._fd, self._pid, self._ident = fd, pid, (st.st_dev, st.st_ino)
        self._close = weakref.finalize(self, os.close, fd)
        return fd

    def _drop(self) -> None:
        if self._close is not None:
            # Closing (never unlocking) a descriptor inherited from a parent leaves the parent's
            # lock in place: flock holds while any descriptor of the open file is open.
            self._close()
        self._fd = self._close = self._ident = None


# A file in use: a shared hold others can see -------------------------------------------------


def hold_shared(fd: int) -> None:
    """Mark the open file ``fd`` as in use by this process until every descriptor of it is
    closed (a vault writer's spool file, ctxrules.stores.filesystem): :func:`held_elsewhere`,
    in any process, then says so. A shared ``flock``; best effort (a file system without
    locks marks nothing). On Windows nothing is marked: :func:`held_elsewhere` says held."""
    if _fcntl is None:  # pragma: no cover - Windows
        return
    with contextlib.suppress(OSError):
        _fcntl.flock(fd, _fcntl.LOCK_SH)


def held_elsewhere(fd: int) -> bool:
    """Whether a process (another descriptor of this one included) holds a lock on the open
    file ``fd``: a writer that marked it with :func:`hold_shared` is still there. When it says
    no, ``fd`` holds it exclusively until it is closed.
    Whatever cannot be told (Windows, a file system without locks) counts as held: the file is
    left alone."""
    if _fcntl is None:  # pragma: no cover - Windows
        return True
    try:
        _fcntl.flock(fd, _fcntl.LOCK_EX | _fcntl.LOCK_NB)
    except OSError:  # EWOULDBLOCK: held; anything else: cannot tell
        return True
    return False


# Windows: filelock ----------------------------------------------------------------------------


class _PortableLock:  # pragma: no cover - exercised on Windows only
    def __init__(self, path: Path, timeout: float | None) -> None:
        self.path, self.timeout = path, timeout
        self._pid = 0
        self._dir_made = False
        self._lock = self._native()

    def _native(self) -> Any:
        import filelock

        # filelock refuses an instance inherited across a fork: a forked child gets its own.
        self._pid = os.getpid()
        return filelock.FileLock(self.path, timeout=-1 if self.timeout is None else self.timeout, mode=0o600)

    @property
    def is_locked(self) -> bool:
        return bool(self._pid == os.getpid() and self._lock.is_locked)

    def acquire(self) -> None:
        import filelock

        if self._pid != os.getpid():
            self._lock = self._native()
        try:
            if not self._dir_made:
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


def _describe(path: Path, exc: OSError) -> str:
    if exc.errno in (errno.ELOOP, getattr(errno, "EMLINK", -1), getattr(errno, "EFTYPE", -1)):
        # What O_NOFOLLOW reports for a link (ELOOP on Linux, EMLINK/EFTYPE on the BSDs).
        return f"refusing to use {path}: it is a symbolic link, not a lock file of ctxrules"
    return f"cannot lock {path}: {exc.strerror or exc}"
