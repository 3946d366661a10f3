"""Request formats at the edges: the pipeline works on OpenAI chat messages; codecs turn a
provider's request into that form at the entry and back at the exit (docs/integrations.md).

- :mod:`ctxrules.formats.openai`: OpenAI chat completions (the internal form itself).
- :mod:`ctxrules.formats.anthropic`: Anthropic Messages (``system``, content blocks,
  ``tool_use``/``tool_result``, signed thinking, ``cache_control``), lossless both ways.

:func:`detect` decides which one a request is; a request readable as neither is a
:class:`FormatError` before anything runs on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ctxrules.errors import MessagesError

__all__ = ["FORMATS", "FormatError", "Problem", "detect"]

Format = Literal["openai", "anthropic"]
FORMATS: tuple[str, ...] = ("openai", "anthropic", "auto")
_ANTHROPIC_BLOCKS = frozenset({"tool_use", "tool_result"})


class FormatError(MessagesError):
    """A request that cannot be read in the format asked for (or in any, with ``auto``)."""

    code = "CR141"

    def __init__(self, message: str) -> None:
        super().__init__(f"[{self.code}] {message}")


@dataclass(frozen=True)
class Problem:
    """One rule a request breaks: where (a JSON-pointer-like path) and what."""

    path: str
    message: str
    code: str = "CR140"

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def detect(request: object) -> Format:
    """``anthropic`` when the request has a top-level ``system``, a content block of type
    ``tool_use``/``tool_result``, or a tool with ``input_schema``;
    ``openai`` for a list of messages or any other object with ``messages``. Raises
    :class:`FormatError` for anything else."""
    if isinstance(request, list):
        return "openai"
    if not isinstance(request, Mapping):
        raise FormatError(f"expected a JSON list of chat messages or a request object, got {_kind(request)}")
    if "messages" not in request:
        raise FormatError("the request object has no 'messages' key (neither OpenAI nor Anthropic format)")
    if "system" in request:
        return "anthropic"
    tools = request.get("tools")
    if isinstance(tools, list) and any(isinstance(t, Mapping) and "input_schema" in t for t in tools):
        return "anthropic"
    messages = request.get("messages")
    if isinstance(messages, list):
        for message in messages:
            content = message.get("content") if isinstance(message, Mapping) else None
            if isinstance(content, list) and any(
                isinstance(b, Mapping) and isinstance(b.get("type"), str) and b["type"] in _ANTHROPIC_BLOCKS
                for b in content
            ):
                return "anthropic"
    return "openai"


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "object", list: "array", str: "string", bool: "boolean"}.get(type(value), type(value).__name__)
