"""Progress notes from deep inside a run (the summarizer's stream) to whoever shows progress.

``with listening(callback):`` installs a callback for the current context (thread or task);
:func:`note` hands it an event dict and does nothing when no one listens, so library users pay
one context-variable lookup. A failing callback is ignored: progress display must never cost a
run. The CLI's terminal display (``ctxrules.cli.progress``) is the listener; a session's
``on_event`` callback receives the same notes while its ``prepare`` runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

__all__ = ["listening", "note"]

Listener = Callable[[dict[str, Any]], None]

_LISTENER: ContextVar[Listener | None] = ContextVar("ctxrules_progress", default=None)


@contextlib.contextmanager
def listening(callback: Listener | None) -> Iterator[None]:
    """Send :func:`note` events to ``callback`` inside the block (``None``: no one)."""
    token = _LISTENER.set(callback)
    try:
        yield
    finally:
        _LISTENER.reset(token)


def note(event: str, **fields: Any) -> None:
    """Tell the listener, if any, that ``event`` happened."""
    listener = _LISTENER.get()
    if listener is None:
        return
    with contextlib.suppress(Exception):  # a display's failure is not the run's
        listener({"event": event, **fields})
