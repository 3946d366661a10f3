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
    return structlog.wrap_logger(
        structlog.PrintLogger(sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(level),
        processors=[structlog.processors.add_log_level, structlog.processors.TimeStamper(fmt="iso"),
                    structlog.dev.ConsoleRenderer(colors=False)],
        logger_name=name,
    ).bind(**bound)
