"""What the Python API hands back, apart from the engine that makes it (so the recovery and
report modules can name it without importing ``ctxrules.engine``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ctxrules.types import Message


@dataclass
class PrepareResult:
    """What ``prepare`` returns: new lists (the input is untouched), call options, the report,
    and ``body``: the request in the format it came in (``prepare(..., format=...)``)."""

    messages: list[Message]
    tools: list[dict[str, Any]]
    request: dict[str, Any]
    report: dict[str, Any]
    body: Any = None
    format: str = "openai"
