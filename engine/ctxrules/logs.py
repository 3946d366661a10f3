"""Structured logging that stays quiet unless asked.

- If the application configured structlog, ctxrules logs through that configuration.
- Otherwise events go to the standard ``logging`` logger of their name (``ctxrules``,
  ``ctxrules.session``, ``ctxrules.pipeline``, ...), rendered as ``event key=value ...``: an
  application that uses only ``logging`` receives them through its own handlers and levels.
- ``CTXRULES_LOG=LEVEL`` (``debug``, ``info``, ``warning``, ``error``, ``critical``) sets the
  ``ctxrules`` logger's level and attaches one stderr handler to it, so
  ``CTXRULES_LOG=info ctxrules run ...`` shows one line per ``prepare``. An unknown level is a
  :class:`~ctxrules.errors.UsageError` (the CLI exits 2), never silently ignored.

Log lines go to stderr only: a library call or ``ctxrules run --output -`` never writes them
into the data on stdout.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

from ctxrules.errors import UsageError

__all__ = ["LEVELS", "configure", "get_logger"]

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
ROOT = "ctxrules"
_FORMAT = "%(asctime)s %(name)s %(levelname)s: %(message)s"


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]  # generic only in typeshed
    """The handler ``CTXRULES_LOG`` attaches; writes to the *current* ``sys.stderr`` (a test or
    an application may replace it after the handler was made)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)
        self.setFormatter(logging.Formatter(_FORMAT, "%H:%M:%S"))

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


_configured: tuple[str | None] | None = None


def configure() -> None:
    """Apply ``CTXRULES_LOG`` (once per value): level and stderr handler of the ``ctxrules``
    logger. Raises ``UsageError`` for an unknown level."""
    global _configured
    raw = os.environ.get("CTXRULES_LOG")
    if _configured == (raw,):
        return
    logger = logging.getLogger(ROOT)
    for handler in [h for h in logger.handlers if isinstance(h, _StderrHandler)]:
        logger.removeHandler(handler)
    if raw is None or not raw.strip():
        if _configured is not None:  # it was set before: back to the application's logging
            logger.setLevel(logging.NOTSET)
            logger.propagate = True
        _configured = (raw,)
        return
    level = LEVELS.get(raw.strip().lower())
    if level is None:
        raise UsageError(f"CTXRULES_LOG={raw!r} is not a log level; use one of {', '.join(LEVELS)}")
    logger.setLevel(level)
    logger.addHandler(_StderrHandler())
    logger.propagate = False  # our handler prints them; the root's would print them again
    _configured = (raw,)


def _render(_: Any, __: str, event: MutableMapping[str, Any]) -> str:
    """``event key=value ...``: one line, the event name first."""
    name = str(event.pop("event", ""))
    fields = " ".join(f"{k}={_value(v)}" for k, v in event.items())
    return f"{name} {fields}" if fields else name


def _value(value: Any) -> str:
    text = str(value)
    return text if text and not any(c.isspace() for c in text) else repr(text)


_LOGGERS: dict[tuple[str, int], Any] = {}


def get_logger(name: str = ROOT, **bound: Any) -> Any:
    """A structlog logger: the application's structlog configuration when it has one, else one
    that forwards to the standard ``logging`` logger ``name`` (module docstring)."""
    if structlog.is_configured():
        return structlog.get_logger(name, **bound)
    configure()
    std = logging.getLogger(name)
    level = std.getEffectiveLevel()
    key = (name, level)
    logger = _LOGGERS.get(key)
    if logger is None:
        # Filtered at the stdlib logger's level, so a disabled debug event costs one call (a
        # session asks for a logger on every prepare; building one costs more than that).
        logger = structlog.wrap_logger(
            std, wrapper_class=structlog.make_filtering_bound_logger(level), processors=[_render]
        )
        if len(_LOGGERS) > 64:
            _LOGGERS.clear()
        _LOGGERS[key] = logger
    return logger.bind(**bound) if bound else logger
