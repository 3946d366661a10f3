"""Helper threads that leave the stop signals to the main thread.

The kernel hands a signal sent to the process (Ctrl-C's SIGINT, SIGTERM from ``timeout`` or a
process manager, SIGHUP) to any thread that does not block it. Python runs the handler in the
main thread only, once that thread next runs Python code: when the signal went to a helper while
the main thread waited in a read (of standard input, of a pipe), nothing woke the main thread,
and Ctrl-C did nothing until the writer closed the pipe. Every thread ctxrules starts blocks
those signals first, so they always reach the main thread (and interrupt its read).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["STOP_SIGNALS", "block_stop_signals", "helper_thread"]

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
