"""The message-list model: validation, injected-message markers, steps, exchanges and pins.

Messages are OpenAI chat-completions messages as plain dicts. Nothing here mutates a message;
helpers that "change" one return a new dict and leave unknown fields untouched (invariant 5,
docs/reference/concepts.md).

**Injected messages.** Everything ctxrules puts into a conversation carries the metadata key
``"ctxrules"`` (a dict such as ``{"kind": "summary"}``) *and* opens its text with a
``<ctxrules:KIND ...>`` tag. A message counts as injected when *either* is present: callers
that round-trip history through strict SDK models lose unknown keys, and the tag is what
survives. A human message that merely *contains* ``<ctxrules:`` stays real; one that *starts*
with such a tag is taken as injected, because mistaking an injected message for the human
anchor (invariant 2) is the worse error. An elision marker (``[ctxrules:elided ...]``, square
brackets) does not make a message injected: a real user message whose content went to the
vault is still the real user message.

**Pairing, steps, exchanges and pins** are in :mod:`ctxrules.structure`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from ctxrules.errors import MessagesError

__all__ = [
    "INJECTED_KEY",
    "ROLES",
    "has_tool_calls",
    "injected_kind",
    "is_injected",
    "is_real_user",
    "mark_injected",
    "message_text",
    "replace_text",
    "split_input",
    "tool_call_id",
    "validate_messages",
]

Message = dict[str, Any]

ROLES: frozenset[str] = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
INJECTED_KEY = "ctxrules"
_LEADING_ROLES = frozenset({"system", "developer"})
_RESULT_ROLES = frozenset({"tool", "function"})
# A tag is "<ctxrules:" + a kind + something that ends the name; "<ctxrules:" followed by
# prose is not a tag.
_TAG_RE = re.compile(r"\s*<ctxrules:[a-z][a-z0-9_.-]*[\s/>]")


# --- validation -----------------------------------------------------------------------------


def split_input(obj: object) -> tuple[list[Any], list[Any] | None]:
    """Split the accepted input shapes into ``(messages, tools)``.

    Accepts a JSON list of messages, or an object with ``"messages"`` and optionally
    ``"tools"`` (other keys of the object, e.g. a whole request body, are ignored). Only the
    shape is checked here; :func:`validate_messages` checks the messages themselves.
    """
    if isinstance(obj, list):
        return obj, None
    if isinstance(obj, Mapping):
        if "messages" not in obj:
            raise MessagesError("input object has no 'messages' key")
        messages = obj["messages"]
        if not isinstance(messages, list):
            raise MessagesError(f"'messages' must be a list, got {_type_name(messages)}")
        tools = obj.get("tools")
        if tools is None:
            return messages, None
        if not isinstance(tools, list):
            raise MessagesError(f"'tools' must be a list, got {_type_name(tools)}")
        for i, tool in enumerate(tools):
            if not isinstance(tool, Mapping):
                raise MessagesError(f"tool {i}: expected an object, got {_type_name(tool)}")
        return messages, tools
    raise MessagesError(
        f"expected a JSON list of chat messages or an object with 'messages', got {_type_name(obj)}"
    )


def validate_messages(obj: object, *, start: int = 0) -> list[Message]:
    """Check the structure of a message list and return it as a new list (same dicts).

    Raises :class:`MessagesError` naming the message index for what no stage can repair: a
    message that is not an object, a missing or unknown role, content of the wrong type,
    ``tool_calls`` that is not a list, a tool call without a function. What agents
    really produce and a stage repairs is accepted: ``function.arguments`` that are not JSON,
    tool results whose call never appeared (``normalize.tool_pairs`` handles those).
    ``start`` skips messages already known to be valid (a history's unchanged prefix).
    """
    messages, _tools = split_input(obj)
    for index in range(start, len(messages)):
        _validate_message(index, messages[index])
    return list(messages)


def _validate_message(index: int, message: object) -> None:
    where = f"message {index}"
    if not isinstance(message, Mapping):
        raise MessagesError(f"{where}: expected an object, got {_type_name(message)}")
    if "role" not in message:
        raise MessagesError(f"{where}: missing 'role'")
    role = message["role"]
    if not isinstance(role, str):
        raise MessagesError(f"{where}: 'role' must be a string, got {_type_name(role)}")
    if role not in ROLES:
        raise MessagesError(
            f"{where}: unknown role {role!r} (expected one of {', '.join(sorted(ROLES))})"
        )
    where = f"message {index} ({role})"
    content = message.get("content")
    if content is None:
        # The API allows a null content only on assistant messages (tool calls, refusals).
        if role != "assistant":
            raise MessagesError(f"{where}: 'content' must be a string or a list of parts")
    elif isinstance(content, list):
        for part_index, part in enumerate(content):
            _validate_part(f"{where}, content part {part_index}", part)
    elif not isinstance(content, str):
        raise MessagesError(
            f"{where}: 'content' must be a string, a list of parts or null, "
            f"got {_type_name(content)}"
        )
    tool_calls = message.get("tool_calls")
    if tool_calls is not None:
        if role != "assistant":
            raise MessagesError(f"{where}: 'tool_calls' is only valid on assistant messages")
        if not isinstance(tool_calls, list):
            raise MessagesError(
                f"{where}: 'tool_calls' must be a list, got {_type_name(tool_calls)}"
            )
        for call_index, call in enumerate(tool_calls):
            _validate_call(f"{where}, tool_calls[{call_index}]", call)
    call_id = message.get("tool_call_id")
    if call_id is not None and not isinstance(call_id, str):
        raise MessagesError(f"{where}: 'tool_call_id' must be a string, got {_type_name(call_id)}")


def _validate_part(where: str, part: object) -> None:
    if not isinstance(part, Mapping):
        raise MessagesError(f"{where}: expected an object, got {_type_name(part)}")
    part_type = part.get("type")
    if not isinstance(part_type, str):
        raise MessagesError(f"{where}: missing or non-string 'type'")
    if part_type == "text" and not isinstance(part.get("text"), str):
        raise MessagesError(f"{where}: a text part needs a string 'text'")
    if part_type == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, Mapping) else image
        if not isinstance(url, str):
            raise MessagesError(f"{where}: an image_url part needs 'image_url.url' (a string)")
    # Other part types (input_audio, file, refusal, provider-specific) pass through unchecked.


def _validate_call(where: str, call: object) -> None:
    if not isinstance(call, Mapping):
        raise MessagesError(f"{where}: expected an object, got {_type_name(call)}")
    call_id = call.get("id")
    # A missing or empty id is repairable (normalize.tool_pairs derives a stable one); a
    # present id of the wrong type is not.
    if call_id is not None and not isinstance(call_id, str):
        raise MessagesError(f"{where}: 'id' must be a string, got {_type_name(call_id)}")
    # OpenAI "custom" tools carry {"custom": {"name", "input"}} instead of "function".
    kind = "custom" if call.get("type") == "custom" else "function"
    function = call.get(kind)
    if not isinstance(function, Mapping):
        raise MessagesError(f"{where}: missing {kind!r} object")
    if not isinstance(function.get("name"), str):
        raise MessagesError(f"{where}: '{kind}.name' must be a string")
    arguments = function.get("arguments")
    if kind == "function" and not (arguments is None or isinstance(arguments, str | Mapping)):
        raise MessagesError(
            f"{where}: 'function.arguments' must be a string, got {_type_name(arguments)}"
        )


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    return {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
        type(value), type(value).__name__
    )


# --- text -----------------------------------------------------------------------------------


def message_text(msg: Mapping[str, Any]) -> str:
    """The message's text: a string content as is; text parts joined with ``"\\n"``."""
    content = msg.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            part["text"]
            for part in content
            if isinstance(part, Mapping)
            and part.get("type") == "text"
            and isinstance(part.get("text"), str)
        )
    return ""


def _is_text_part(part: object) -> bool:
    return isinstance(part, Mapping) and part.get("type") == "text"


def replace_text(msg: Mapping[str, Any], new_text: str) -> Message:
    """A new message whose text is ``new_text``; every other field is kept.

    For list content the non-text parts keep their order and the text goes into one text
    part at the position of the first one (its other keys, e.g. ``cache_control``, kept);
    without a text part, one is put first.
    """
    content = msg.get("content")
    if not isinstance(content, list):
        return {**msg, "content": new_text}
    parts: list[Any] = []
    placed = False
    for part in content:
        if not _is_text_part(part):
            parts.append(part)
        elif not placed:
            parts.append({**part, "text": new_text})
            placed = True
    if not placed:
        parts.insert(0, {"type": "text", "text": new_text})
    return {**msg, "content": parts}


def _first_text(msg: Mapping[str, Any]) -> str:
    content = msg.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        for part in content:
            if _is_text_part(part) and isinstance(part.get("text"), str):
                return str(part["text"])
    return ""


# --- injected messages ----------------------------------------------------------------------


def is_injected(msg: Mapping[str, Any]) -> bool:
    """Whether ctxrules produced ``msg`` (metadata key, or text that opens with a tag)."""
    if msg.get(INJECTED_KEY) is not None:
        return True
    text = _first_text(msg)
    # Most texts do not open with "<" (after white space): decided without the regex. lstrip
    # returns the same string object when there is nothing to strip.
    return text.lstrip().startswith("<ctxrules:") and _TAG_RE.match(text) is not None


def injected_kind(msg: Mapping[str, Any]) -> str | None:
    """The ``kind`` of an injected message (from the metadata, else from the tag)."""
    meta = msg.get(INJECTED_KEY)
    if isinstance(meta, Mapping) and isinstance(meta.get("kind"), str):
        return str(meta["kind"])
    match = re.match(r"\s*<ctxrules:([a-z][a-z0-9_.-]*)", _first_text(msg))
    if match is not None:
        return match.group(1)
    return None


def is_real_user(msg: Mapping[str, Any]) -> bool:
    """A ``user`` message a human (or the agent's harness) wrote, not one ctxrules injected."""
    return msg.get("role") == "user" and not is_injected(msg)


def mark_injected(msg: Mapping[str, Any], kind: str, **meta: Any) -> Message:
    """A copy of ``msg`` marked as injected: metadata ``{"kind": kind, **meta}`` and a tag.

    Text that already opens with a ``<ctxrules:...>`` tag is kept as it is (so marking twice
    changes nothing); otherwise it is wrapped in ``<ctxrules:KIND>`` ... ``</ctxrules:KIND>``.
    """
    if not re.fullmatch(r"[a-z][a-z0-9_.-]*", kind):
        raise ValueError(f"invalid injected kind {kind!r}: use lowercase letters, digits, _.-")
    old_meta = msg.get(INJECTED_KEY)
    merged = {**(old_meta if isinstance(old_meta, Mapping) else {}), **meta, "kind": kind}
    marked: Message = {**msg, INJECTED_KEY: merged}
    if _TAG_RE.match(_first_text(msg)) is not None:
        return marked
    content = msg.get("content")
    if isinstance(content, list) and not any(_is_text_part(part) for part in content):
        # Keep non-text parts as they are; a leading text part carries the tag.
        return {**marked, "content": [{"type": "text", "text": f"<ctxrules:{kind}/>"}, *content]}
    text = _first_text(msg)
    return replace_text(marked, f"<ctxrules:{kind}>\n{text}\n</ctxrules:{kind}>")


# --- tool calls and their results -----------------------------------------------------------


def has_tool_calls(msg: Mapping[str, Any]) -> bool:
    """An assistant message with a non-empty ``tool_calls`` list."""
    calls = msg.get("tool_calls")
    return msg.get("role") == "assistant" and isinstance(calls, list) and len(calls) > 0


def tool_call_id(call: object) -> str | None:
    """A call's id, or ``None`` when it has none usable (missing, empty, not a string)."""
    if isinstance(call, Mapping):
        value = call.get("id")
        if isinstance(value, str) and value:
            return value
    return None


def _result_id(msg: Mapping[str, Any]) -> str | None:
    value = msg.get("tool_call_id")
    return value if isinstance(value, str) and value else None


def message_digest(message: Mapping[str, Any]) -> str:
    """A stable digest of a message across processes (canonical JSON, sha256)."""
    data = json.dumps(message, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(data.encode("utf-8", errors="surrogatepass")).hexdigest()


def clone_json(value: Any) -> Any:
    """A copy of JSON-like data; much cheaper than ``copy.deepcopy`` (no memo, no reduce)."""
    if isinstance(value, dict):
        return {k: clone_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clone_json(v) for v in value]
    return value
