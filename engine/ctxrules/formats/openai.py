"""OpenAI chat-completions requests: the internal form itself, so the codec only splits a
request into messages and tools and puts the results back in their places."""

from __future__ import annotations

from collections import Counter
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
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    request: Mapping[str, Any] | None,
    options: Mapping[str, Any] | None = None,
) -> Any:
    """The body in the shape it came in: a list for a list, else the object with its
    ``messages`` (and ``tools``, when it had them) replaced, and the call ``options`` a pack
    adds (``PrepareResult.request``: ``prompt_cache_key``, ``tool_choice``) as request
    parameters where the caller set none: a body sent as it is carries them, and what the
    caller set wins."""
    if request is None or not request:
        return list(messages)
    out = {**request, "messages": list(messages)}
    if "tools" in request and tools is not None:
        out["tools"] = list(tools)
    for key, value in (options or {}).items():
        out.setdefault(key, value)
    return out


def validate(request: object) -> list[Problem]:
    """What OpenAI rejects in a chat request: malformed messages, and tool calls not answered
    right after their assistant message (or results that answer nothing)."""
    try:
        messages = validate_messages(request)
    except Exception as exc:
        return [Problem("messages", str(exc))]
    problems: list[Problem] = []
    calls: list[str] = []  # the ids of the last assistant message's calls, in order
    open_calls: Counter[object] = Counter()  # how many calls of each id are not answered yet
    for i, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if open_calls[call_id] > 0:
                open_calls[call_id] -= 1
            else:
                problems.append(Problem(f"messages[{i}]", f"tool result {call_id} answers no open tool call"))
            continue
        if open_calls.total():
            unanswered = ", ".join(_unanswered(calls, open_calls))
            problems.append(Problem(f"messages[{i}]", f"tool calls {unanswered} are not answered"))
        found = message.get("tool_calls") if role == "assistant" else None
        calls = [str(c.get("id")) for c in found or [] if isinstance(c, Mapping)]
        open_calls = Counter(calls)
    return problems


def _unanswered(calls: list[str], open_calls: Counter[object]) -> list[str]:
    """The ``calls`` not answered, in their order. A result answers the first call of its id
    not answered yet, so those left of an id are its last ones. Counted, not removed from a
    list: a scan and a shift of the list for each result of 50,000 calls was quadratic."""
    left = open_calls.copy()
    kept: list[str] = []
    for call_id in reversed(calls):
        if left[call_id] > 0:
            left[call_id] -= 1
            kept.append(call_id)
    return kept[::-1]
