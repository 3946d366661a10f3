"""``Session.prepare(request, format=...)``: decode at the entry, run, encode at the exit."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from ctxrules.errors import MessagesError, UsageError
from ctxrules.formats import FORMATS, detect
from ctxrules.formats import anthropic as anthropic_format
from ctxrules.json_limits import MAX_DEPTH, Scan, is_plain, pointer, scan, short_pointer
from ctxrules.json_limits import Path as JsonPath
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
        checked = validate_tools(tools, warnings=notes, max_depth=MAX_DEPTH - anthropic_format.DEEPER)
        given = anthropic_format.decode({"messages": [], "tools": checked}).tools
    result = session._prepare_openai(decoded.messages, given, clock)
    result.report["warnings"][:0] = notes
    result.body = anthropic_format.encode(result.messages, result.tools if given is not None else None, decoded.request)
    result.messages = anthropic_format.strip_private(result.messages)
    result.tools = anthropic_format.strip_private(result.tools)
    result.format = "anthropic"
    return result


def _within_limits(request: Any, notes: list[str]) -> Any:
    """``request`` checked before the codec walks it, every field as sent: the tools by
    :func:`validate_tools` (naming the tool), the messages and the other fields here. Nesting,
    long integers and non-finite numbers raise :class:`MessagesError` with the JSON pointer in
    the request (the codec writes a ``tool_use`` input out with ``json.dumps``, which would
    recurse without end, fail on a long integer, or write ``NaN``); lone surrogates are
    replaced with U+FFFD, each message or field noted in ``notes``. Checked here and not after
    decoding: the internal form numbers and names things otherwise (a system prompt is one
    more message, a turn's tool results are messages of their own, a thinking block is in
    ``thinking_blocks``), and the place given must be one the caller can find. Nesting is
    limited :data:`~ctxrules.formats.anthropic.DEEPER` levels below the usual, so that the
    decoded form is within the limit too. Most messages take the fast walk that only says all
    is well (:func:`is_plain`). Not an object: the codec says what it expected."""
    if not isinstance(request, Mapping):
        return request
    depth = MAX_DEPTH - anthropic_format.DEEPER
    body = dict(request)
    if isinstance(body.get("tools"), list):
        body["tools"] = validate_tools(body["tools"], warnings=notes, max_depth=depth)
    rest = {k: v for k, v in body.items() if k not in ("tools", "messages")}
    found = scan(rest, max_depth=depth)
    _refuse(found)
    replaced = list(found.replaced)
    if found.replaced:
        body.update(found.value)
    messages = body.get("messages")
    if isinstance(messages, list):
        fixed: list[Any] | None = None
        for i, message in enumerate(messages):
            if is_plain(message, max_depth=depth):
                continue
            inner = scan(message, max_depth=depth, base=("messages", i))
            _refuse(inner)
            if inner.replaced:
                fixed = fixed if fixed is not None else list(messages)
                fixed[i] = inner.value
                replaced.extend(inner.replaced)
        if fixed is not None:
            body["messages"] = fixed
    _note_repairs(replaced, notes)
    return body


def _refuse(found: Scan) -> None:
    if found.problems:
        first = found.problems[0]
        raise MessagesError(f"request {short_pointer(first.path)}: {first.detail}")


def _note_repairs(paths: list[JsonPath], notes: list[str]) -> None:
    """One note per message (or top-level field), naming its fields, as for a message list."""
    fields: dict[tuple[Any, ...], list[str]] = {}
    for path in paths:
        head = tuple(path[:2]) if path[:1] == ("messages",) and len(path) > 1 else tuple(path[:1])
        shown = pointer(tuple(path[len(head) :]))
        if shown not in fields.setdefault(head, []):
            fields[head].append(shown)
    for head, names in fields.items():
        what = f"message {head[1]}" if len(head) == 2 else f"request field {pointer(head)}"
        listed = ", ".join(n for n in names[:5] if n) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        notes.append(f"{what}: a lone surrogate{f' in {listed}' if listed else ''} was replaced with U+FFFD")
