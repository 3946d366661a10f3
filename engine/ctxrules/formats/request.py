"""``Session.prepare(request, format=...)``: decode at the entry, run, encode at the exit."""

from __future__ import annotations

from typing import Any, Protocol

from ctxrules.errors import UsageError
from ctxrules.formats import FORMATS, detect
from ctxrules.formats import anthropic as anthropic_format
from ctxrules.results import PrepareResult

__all__ = ["prepare_request"]


class _Preparer(Protocol):
    """What of a ``Session`` this module uses (a protocol: ``engine`` imports this module)."""

    def prepare(
        self,
        messages: Any,
        tools: list[dict[str, Any]] | None = None,
        *,
        clock: float | None = None,
        format: str = "openai",
    ) -> PrepareResult: ...

    def _prepare_openai(
        self, messages: Any, tools: list[dict[str, Any]] | None, clock: float | None
    ) -> PrepareResult: ...


def prepare_request(
    session: _Preparer, request: Any, tools: list[dict[str, Any]] | None, *, clock: float | None, format: str
) -> PrepareResult:
    """The whole request in ``format`` (or the detected one) through ``session``'s pipeline:
    the request is decoded completely before any stage runs (a request that does not decode
    is a ``FormatError``, nothing half-done), and ``result.body`` is the same format again."""
    if format not in FORMATS:
        raise UsageError(f"unknown format {format!r} (expected one of {', '.join(FORMATS)})")
    kind = detect(request) if format == "auto" else format
    if kind == "openai":
        return session.prepare(request, tools, clock=clock)
    decoded = anthropic_format.decode(request)
    given = decoded.tools
    if tools is not None:
        given = anthropic_format.decode({"messages": [], "tools": tools}).tools
    result = session._prepare_openai(decoded.messages, given, clock)
    result.body = anthropic_format.encode(result.messages, result.tools if given is not None else None, decoded.request)
    result.messages = anthropic_format.strip_private(result.messages)
    result.tools = anthropic_format.strip_private(result.tools)
    result.format = "anthropic"
    return result
