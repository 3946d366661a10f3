"""Progress on a terminal for CLI work that takes more than about a second.

:class:`TerminalProgress` receives a session's events (``on_event``: ``stage.start``,
``compacting``, ...) and the progress notes of ``ctxrules.progress`` (the summarizer's stream)
and keeps one status line on stderr, redrawn in place: the current stage, the summarizer's
tokens, the time so far. Nothing is drawn for work that ends within ``delay_s`` (1 s), nothing
when stderr is not a terminal or with ``--quiet``, and never anything on stdout; the line is
erased when the work ends, so what stays on the terminal is the command's own output.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from types import TracebackType
from typing import Any, TextIO

from ctxrules.threads import helper_thread

__all__ = ["TerminalProgress", "columns", "wanted"]

_CLEAR = "\r\x1b[K"


def columns(stream: TextIO) -> int:
    """How many characters a status line redrawn in place on ``stream`` may have: one less than
    the terminal's width (``$COLUMNS`` when set to a number, else the terminal's own; 80 when
    neither says, or a size of 0). A longer line wraps, and ``\\r`` goes back to the start of its last row only:
    each redraw then left a row behind."""
    try:
        width = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        width = 0
    if width <= 0:
        try:
            width = os.get_terminal_size(stream.fileno()).columns
        except (OSError, ValueError, AttributeError):
            width = 0
    return max(1, (width if width > 0 else 80) - 1)  # a terminal that tells no size says 0


def wanted(quiet: bool, stream: TextIO | None = None) -> bool:
    """Whether to show progress: stderr is a terminal and ``--quiet`` was not given."""
    stream = stream or sys.stderr
    try:
        return not quiet and stream.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


class TerminalProgress:
    """The status line (module docstring); a context manager around the work."""

    def __init__(
        self, stream: TextIO | None = None, *, delay_s: float = 1.0, interval_s: float = 0.25, label: str = "ctxrules"
    ) -> None:
        self.stream = stream or sys.stderr
        self.delay_s = delay_s
        self.interval_s = interval_s
        self.label = label
        self.stage = "starting"
        self.detail = ""
        self.drawn = 0  # lines drawn (for tests and for the final erase)
        self._started = time.monotonic()
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._thread = helper_thread(self._run, "ctxrules-progress")

    def on_event(self, event: dict[str, Any]) -> None:
        """A session event or a progress note."""
        kind = event.get("event")
        with self._lock:
            if kind == "stage.start":
                self.stage, self.detail = str(event.get("stage")), ""
            elif kind == "compacting":
                self.stage = "compacting"
                self.detail = f"{event.get('tokens', 0):,} tokens at {event.get('tier', '?')}"
            elif kind == "summarizer.stream":
                self.detail = f"summarizer {event.get('model', '')} streaming: {event.get('tokens', 0)} tokens"
            elif kind == "prepare.end":
                self.stage, self.detail = "writing the output", ""

    def __enter__(self) -> TerminalProgress:
        self._started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._done.set()
        self._thread.join(timeout=2)
        with self._lock:
            if self.drawn:
                self._write(_CLEAR)

    def _run(self) -> None:
        if self._done.wait(self.delay_s):
            return
        while not self._done.is_set():
            with self._lock:
                elapsed = time.monotonic() - self._started
                parts = [f"{self.label}: {self.stage}", self.detail, f"{elapsed:.0f}s"]
                self._write(_CLEAR + " · ".join(p for p in parts if p)[: columns(self.stream)])
                self.drawn += 1
            self._done.wait(self.interval_s)

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # the terminal went away: stop drawing, keep working
            self._done.set()
