"""Helper threads that leave the stop signals to the main thread.

The kernel hands a signal sent to the process (Ctrl-C's SIGINT, SIGTERM from ``timeout`` or a
process manager, SIGHUP) to any thread that does not block it. Python runs the handler in the
main thread only, once that thread next runs Python code: when the signal went to a helper while
the main thread waited in a read (of standard input, of a pipe), nothing woke the main thread,
and Ctrl-C did nothing until the writer closed the pipe. Every thread ctxrules starts blocks
those signals first, so they always reach the main thread (and interrupt its read).

It also holds :class:`ForkSafeLock`, the thread lock of state that outlives a ``fork()``: a
server that forks workers after ``Engine.load`` (gunicorn's ``--preload``, ``multiprocessing``'s
default start method on Linux) copies every lock as it was, and a lock another thread held at
that moment is held for good in the child, where that thread does not exist. Objects with more
than a lock to set right in the child (the Redis store's leases) register with
:func:`after_fork_in_child`.
"""

from __future__ import annotations

import os
import signal
import threading
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol

__all__ = [
    "STOP_SIGNALS",
    "ForkSafeLock",
    "abandon",
    "abandoned_alive",
    "after_fork_in_child",
    "block_stop_signals",
    "helper_thread",
]

STOP_SIGNALS: frozenset[int] = frozenset(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)


def block_stop_signals() -> None:
    """Block :data:`STOP_SIGNALS` in the calling thread (nothing where the platform has no
    per-thread signal masks)."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


def helper_thread(
    target: Callable[..., Any], name: str, *, args: tuple[Any, ...] = (), daemon: bool = True
) -> threading.Thread:
    """A thread (not started) that runs ``target(*args)`` with the stop signals blocked; a
    daemon unless ``daemon=False`` (work the process must finish before it exits)."""

    def run() -> None:
        block_stop_signals()
        target(*args)

    return threading.Thread(target=run, name=name, daemon=daemon)


_ABANDONED: weakref.WeakSet[threading.Thread] = weakref.WeakSet()


def abandon(thread: threading.Thread) -> None:
    """Record that the caller gave up on ``thread`` (a model call past its time): it may still
    be inside a library (litellm's stream, its error formatting) when the process ends."""
    _ABANDONED.add(thread)


def abandoned_alive() -> bool:
    """Whether a thread given up on (:func:`abandon`) still runs. At interpreter exit such a
    thread is frozen wherever it is, holding what it holds (the import lock, inside litellm),
    and a finalizer of the main thread that needs it waits forever: the CLI ends its process
    without the interpreter's teardown then."""
    return any(thread.is_alive() for thread in list(_ABANDONED))


class ForkSafeLock:
    """A ``threading.Lock`` (``with``, ``acquire``, ``release``) that a child forked while
    another thread held it finds free: that thread is not in the child, and would never
    release it (the child's first ``prepare`` of a session the parent was preparing in another
    thread waited forever).

    ``on_abandoned`` is called by the child's first holder, under the lock, when the lock was
    taken from a vanished holder: what that holder was changing may be half changed (a session
    forgets what it holds in memory and reads its last turn back from the store). The thread
    that forks keeps a lock it holds itself: it goes on in the child and releases it."""

    __slots__ = ("__weakref__", "_abandoned", "_lock", "_on_abandoned", "_owner")

    def __init__(self, on_abandoned: Callable[[], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None  # the holding thread's ident (None: free, or being taken)
        self._on_abandoned = on_abandoned
        self._abandoned = False
        after_fork_in_child(self)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if not self._lock.acquire(blocking, timeout):
            return False
        self._owner = threading.get_ident()
        if self._abandoned:
            self._taken_over()
        return True

    def _taken_over(self) -> None:
        """The first holder after a fork took the lock from a vanished holder: say so."""
        self._abandoned = False
        if self._on_abandoned is not None:
            try:
                self._on_abandoned()
            except BaseException:
                self.release()
                raise

    def release(self) -> None:
        self._owner = None
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    # `with` is on every prepare's path: __enter__ and __exit__ repeat acquire() and release()
    # rather than call them (half the Python calls a turn spends on its locks).
    def __enter__(self) -> bool:
        self._lock.acquire()
        self._owner = threading.get_ident()
        if self._abandoned:
            self._taken_over()
        return True

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._owner = None
        self._lock.release()

    def _after_fork(self) -> None:
        # Only the forking thread survives: a lock held by any other one is a new, free lock.
        if self._lock.locked() and self._owner != threading.get_ident():
            self._lock, self._owner, self._abandoned = threading.Lock(), None, True


class _ForkAware(Protocol):
    def _after_fork(self) -> None: ...


_fork_aware: weakref.WeakSet[_ForkAware] = weakref.WeakSet()


def after_fork_in_child(obj: _ForkAware) -> None:
    """Have ``obj._after_fork()`` called in every child forked while ``obj`` lives (first
    thing, in the forking thread, the only one the child has)."""
    _fork_aware.add(obj)


def _after_fork_in_child() -> None:
    for obj in list(_fork_aware):
        obj._after_fork()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_after_fork_in_child)
