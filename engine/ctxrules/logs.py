"""Structured logging that stays quiet unless asked.

If the application configured structlog, ctxrules logs through that configuration. Otherwise
events at ``CTXRULES_LOG`` level (default ``warning``) and above go to stderr, so a library
call or ``ctxrules run --output -`` never writes log lines into the data on stdout.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR, "critical": logging.CRITICAL}


def get_logger(name: str = "ctxrules", **bound: Any) -> Any:
    if structlog.is_configured():
        return structlog.get_logger(name, **bound)
    level = _LEVELS.get(os.environ.get("CTXRULES_LOG", "warning").lower(), logging.WARNING)
    return _fallback(name, level, sys.stderr).bind(**bound)


_FALLBACK: dict[tuple[str, int, int], tuple[Any, Any]] = {}


def _fallback(name: str, level: int, stream: Any) -> Any:
    """The stderr logger for ``name`` at ``level``, made once per stream (a session asks on
    every ``prepare``, and building the renderer costs more than a warm turn's stages)."""
    key = (name, level, id(stream))
    hit = _FALLBACK.get(key)
    if hit is not None and hit[0] is stream:
        return hit[1]
    logger = structlog.wrap_logger(
        structlog.PrintLogger(stream),
        wrapper_class=structlog.make_filtering_bound_logger(level),
        processors=[structlog.processors.add_log_level, structlog.processors.TimeStamper(fmt="iso"),
                    structlog.dev.ConsoleRenderer(colors=False)],
        logger_name=name,
    )
    if len(_FALLBACK) > 64:
        _FALLBACK.clear()
    _FALLBACK[key] = (stream, logger)
    return logger
