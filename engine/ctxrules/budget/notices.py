"""What the budget levels do to messages: the cache-safe notice and stripping tool calls.

The notice is *appended* after everything else, so the cached prefix of the request stays
byte-identical (it is cache-safe), and it is marked as injected (``<ctxrules:budget>`` tag and
metadata) so it can never be taken for a real user message. It is added to what ``prepare``
returns only, never to the session's record of its output: the next ``prepare`` does not see
it again unless the caller sends it back, and then it is not added twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ctxrules.messages import injected_kind, mark_injected

__all__ = [
    "NOTICE_KIND",
    "append_notice",
    "budget_notice",
    "strip_tool_calls",
    "strip_tool_calls_from_response",
]

NOTICE_KIND: Final = "budget"

Message = dict[str, Any]


def budget_notice(text: str, level: str) -> Message:
    """The notice as a marked user message (user role: every provider accepts it last)."""
    return mark_injected({"role": "user", "content": text}, NOTICE_KIND, level=level)


def append_notice(messages: list[Message], notice: Message) -> list[Message]:
    """``messages`` with ``notice`` last, unless the same notice already ends them."""
    if messages and injected_kind(messages[-1]) == NOTICE_KIND and messages[-1].get("content") == notice["content"]:
        return messages
    return [*messages, notice]


def strip_tool_calls(message: Mapping[str, Any]) -> Message:
    """A copy of an assistant message without ``tool_calls`` (or a legacy ``function_call``).

    At FINALIZATION the agent must answer instead of calling tools: whatever calls the model
    still emits are dropped, and its text stays. Other messages are returned as copies unchanged.
    """
    out = dict(message)
    if out.get("role") not in (None, "assistant"):
        return out
    had = bool(out.pop("tool_calls", None)) | bool(out.pop("function_call", None))
    if had and out.get("content") is None:
        out["content"] = ""  # an assistant message without calls needs content
    return out


def strip_tool_calls_from_response(response: Any) -> dict[str, Any]:
    """A copy of a chat-completions response, as a dict, whose choices carry no tool calls; a
    choice that finished for ``tool_calls`` now finishes with ``stop``. ``response`` is a dict
    or an SDK's response object (litellm's ``ModelResponse``, which ``session.complete``
    returns; openai's ``ChatCompletion``): read through its ``model_dump()``, as the ledger
    reads it. (Taken apart as it was, its choices were objects, not mappings, and kept their
    tool calls: the FINALIZATION level stripped nothing.)"""
    response = _plain(response)
    out = dict(response)
    choices = []
    for choice in response.get("choices") or []:
        if not isinstance(choice, Mapping):
            choices.append(choice)
            continue
        c = dict(choice)
        for key in ("message", "delta"):
            if isinstance(c.get(key), Mapping):
                c[key] = strip_tool_calls(c[key])
        if c.get("finish_reason") in ("tool_calls", "function_call"):
            c["finish_reason"] = "stop"
        choices.append(c)
    if "choices" in response:
        out["choices"] = choices
    return out


def _plain(value: Any) -> Any:
    """A pydantic object (an SDK's response) as the dict it dumps to; anything else as it is."""
    dump = getattr(value, "model_dump", None)
    return dump() if callable(dump) and not isinstance(value, Mapping) else value
