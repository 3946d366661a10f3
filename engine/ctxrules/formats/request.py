"""``Session.prepare(request, format=...)``: decode at the entry, run, encode at the exit."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from ctxrules.errors import MessagesError, UsageError
from ctxrules.formats import FORMATS, detect
from ctxrules.formats import anthropic as anthropic_format
from ctxrules.json_limits import pointer, scan, short_pointer
from ctxrules.messages import validate_tools
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
    notes: list[str] = []
    request = _within_limits(request, notes)
    decoded = anthropic_format.decode(request)
    given = decoded.tools
    if tools is not None:
        given = anthropic_format.decode({"messages": [], "tools": validate_tools(tools, warnings=notes)}).tools
    result = session._prepare_openai(decoded.messages, given, clock)
    result.report["warnings"][:0] = notes
    result.body = anthropic_format.encode(result.messages, result.tools if given is not None else None, decoded.request)
    result.messages = anthropic_format.strip_private(result.messages)
    result.tools = anthropic_format.strip_private(result.tools)
    result.format = "anthropic"
    return result


def _within_limits(request: Any, notes: list[str]) -> Any:
    """``request`` checked like a message list before the codec walks it (its ``json.dumps``
    of a ``tool_use`` input would recurse, or write ``NaN``): nesting, long integers and
    non-finite numbers raise :class:`MessagesError` with the JSON pointer in the request (tools
    by :func:`validate_tools`, naming the tool); lone surrogates are replaced with U+FFFD,
    each noted in ``notes``. Not an object: the codec says what it expected."""
    if not isinstance(request, Mapping):
        return request
    body = dict(request)
    if isinstance(body.get("tools"), list):
        body["tools"] = validate_tools(body["tools"], warnings=notes)
    rest = {k: v for k, v in body.items() if k != "tools"}
    found = scan(rest)
    if found.problems:
        first = found.problems[0]
        raise MessagesError(f"request {short_pointer(first.path)}: {first.detail}")
    # One note per message (or top-level field), naming its fields, as for a message list.
    fields: dict[tuple[Any, ...], list[str]] = {}
    for path in found.replaced:
        head = tuple(path[:2]) if path[:1] == ("messages",) and len(path) > 1 else tuple(path[:1])
        shown = pointer(tuple(path[len(head) :]))
        if shown not in fields.setdefault(head, []):
            fields[head].append(shown)
    for head, names in fields.items():
        what = f"message {head[1]}" if len(head) == 2 else f"request field {pointer(head)}"
        listed = ", ".join(n for n in names[:5] if n) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        notes.append(f"{what}: a lone surrogate{f' in {listed}' if listed else ''} was replaced with U+FFFD")
    if found.replaced:
        body.update(found.value)
    return body
