"""OpenAI chat-completions requests: the internal form itself, so the codec only splits a
request into messages and tools and puts the results back in their places."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ctxrules.formats import Problem
from ctxrules.formats.anthropic import Decoded
from ctxrules.messages import split_input, validate_messages

__all__ = ["decode", "encode", "validate"]


def decode(request: object) -> Decoded:
    """Messages and tools of a list of messages or a ``{"messages": [...], ...}`` body."""
    messages, tools = split_input(request)
    return Decoded(
        list(messages), None if tools is None else list(tools), dict(request) if isinstance(request, Mapping) else {}
    )


def encode(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None, request: Mapping[str, Any] | None
) -> Any:
    """The body in the shape it came in: a list for a list, else the object with its
    ``messages`` (and ``tools``, when it had them) replaced."""
    if request is None or not request:
        return list(messages)
    out = {**request, "messages": list(messages)}
    if "tools" in request and tools is not None:
        out["tools"] = list(tools)
    return out


def validate(request: object) -> list[Problem]:
    """What OpenAI rejects in a chat request: malformed messages, and tool calls not answered
    right after their assistant message (or results that answer nothing)."""
    try:
        messages = validate_messages(request)
    except Exception as exc:
        return [Problem("messages", str(exc))]
    problems: list[Problem] = []
    open_calls: list[str] = []
    for i, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id in open_calls:
                open_calls.remove(call_id)
            else:
                problems.append(Problem(f"messages[{i}]", f"tool result {call_id} answers no open tool call"))
            continue
        if open_calls:
            problems.append(Problem(f"messages[{i}]", f"tool calls {', '.join(open_calls)} are not answered"))
        calls = message.get("tool_calls") if role == "assistant" else None
        open_calls = [str(c.get("id")) for c in calls or [] if isinstance(c, Mapping)]
    return problems
