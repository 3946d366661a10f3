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

from ctxrules.errors import UsageError

__all__ = ["LEVELS", "configure", "get_logger", "structlog_configured"]

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


def structlog_configured() -> bool:
    """Whether the application configured structlog (never imports it: unimported, it is not)."""
    structlog = sys.modules.get("structlog")
    return structlog is not None and bool(structlog.is_configured())


def get_logger(name: str = ROOT, **bound: Any) -> Any:
    """A structlog logger: the application's structlog configuration when it has one, else one
    that forwards to the standard ``logging`` logger ``name`` (module docstring)."""
    # Not imported by anyone: nobody configured it, and importing it (with asyncio, which it
    # pulls in) would cost a tenth of a `ctxrules validate` start. The stand-in logs the same lines.
    if structlog_configured():
        import structlog

        return structlog.get_logger(name, **bound)
    configure()
    std = logging.getLogger(name)
    level = std.getEffectiveLevel()
    key = (name, level)
    logger = _LOGGERS.get(key)
    if logger is None:
        # Filtered at the stdlib logger's level, so a disabled debug event costs one call (a
        # session asks for a logger on every prepare; building one costs more than that).
        logger = _StdLogger(std, level, {})
        if len(_LOGGERS) > 64:
            _LOGGERS.clear()
        _LOGGERS[key] = logger
    return logger.bind(**bound) if bound else logger


class _StdLogger:
    """The part of structlog's filtering bound logger ctxrules and stage plugins use (``bind``,
    ``new``, ``unbind``, ``debug`` ... ``critical``, ``exception``, ``log``), writing ``event
    key=value ...`` lines (:func:`_render`) to a standard ``logging`` logger; events below the
    level it was made for cost one call, as with structlog's."""

    __slots__ = ("_context", "_level", "_std")

    def __init__(self, std: logging.Logger, level: int, context: dict[str, Any]) -> None:
        self._std, self._level, self._context = std, level, context

    def bind(self, **values: Any) -> _StdLogger:
        return _StdLogger(self._std, self._level, {**self._context, **values})

    def new(self, **values: Any) -> _StdLogger:
        return _StdLogger(self._std, self._level, dict(values))

    def unbind(self, *keys: str) -> _StdLogger:
        missing = [k for k in keys if k not in self._context]
        if missing:
            raise KeyError(missing[0])
        return self.try_unbind(*keys)

    def try_unbind(self, *keys: str) -> _StdLogger:
        return _StdLogger(self._std, self._level, {k: v for k, v in self._context.items() if k not in keys})

    def is_enabled_for(self, level: int) -> bool:
        return level >= self._level

    def _emit(self, level: int, event: Any, args: tuple[Any, ...], values: dict[str, Any]) -> None:
        if level < self._level:
            return
        text = str(event) % args if args else event
        self._std.log(level, _render(None, "", {**self._context, **values, "event": text}))

    def debug(self, event: Any = None, *args: Any, **values: Any) -> None:
        self._emit(logging.DEBUG, event, args, values)

    def info(self, event: Any = None, *args: Any, **values: Any) -> None:
        self._emit(logging.INFO, event, args, values)

    msg = info

    def warning(self, event: Any = None, *args: Any, **values: Any) -> None:
        self._emit(logging.WARNING, event, args, values)

    warn = warning

    def error(self, event: Any = None, *args: Any, **values: Any) -> None:
        self._emit(logging.ERROR, event, args, values)

    err = error

    def exception(self, event: Any = None, *args: Any, **values: Any) -> None:
        values.setdefault("exc_info", True)
        self._emit(logging.ERROR, event, args, values)

    def critical(self, event: Any = None, *args: Any, **values: Any) -> None:
        self._emit(logging.CRITICAL, event, args, values)

    fatal = critical

    def log(self, level: int, event: Any = None, *args: Any, **values: Any) -> None:
        self._emit(level, event, args, values)
