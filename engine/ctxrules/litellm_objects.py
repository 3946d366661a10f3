"""litellm's response objects (pydantic models) as the plain dicts they stand for.

A caller continues a conversation with ``messages.append(response.choices[0].message)``: litellm
takes its own message object back, and so must what ctxrules puts in front of litellm.
"""

from __future__ import annotations

from typing import Any

__all__ = ["as_dicts"]


def as_dicts(messages: list[Any]) -> list[Any]:
    """``messages`` with litellm's (pydantic) message and tool-call objects as the dicts they
    stand for. ``litellm.completion`` takes them (``messages.append(response.choices[0].message)``
    continues a conversation), and so must ctxrules' entry points that stand in front of it
    (``integrations.litellm.completion``, ``session.complete``): read as they were, such a
    message was "not an object". Fields left unset (``None``) are left out, ``content``
    excepted: an assistant message with tool calls has a null content. Everything else is the
    same object."""
    out: list[Any] | None = None
    for i, message in enumerate(messages):
        plain = _as_dict(message)
        if isinstance(plain, dict):
            calls = plain.get("tool_calls")
            if isinstance(calls, list) and any(_as_dict(c) is not c for c in calls):
                plain = {**plain, "tool_calls": [_as_dict(c) for c in calls]}
        if plain is not message:
            out = out if out is not None else list(messages)
            out[i] = plain
    return out if out is not None else messages


def _as_dict(value: Any) -> Any:
    """A pydantic model as its dict (unset fields but ``content`` left out); anything else as is."""
    dump = getattr(value, "model_dump", None)
    if isinstance(value, dict | list | str) or not callable(dump):
        return value
    plain = dump(exclude_none=True)
    if not isinstance(plain, dict):
        return value
    if "content" not in plain and "content" in getattr(type(value), "model_fields", {}):
        plain["content"] = None
    return plain
