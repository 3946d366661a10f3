"""The message-list model: validation, injected-message markers, steps, exchanges and pins.

Messages are OpenAI chat-completions messages as plain dicts. Nothing here mutates a message;
helpers that "change" one return a new dict and leave unknown fields untouched (invariant 5,
docs/reference/concepts.md).

**Injected messages.** Everything ctxrules puts into a conversation opens its text with a
``<ctxrules:KIND ... sig="...">`` tag whose signature is keyed (:mod:`ctxrules.injected`); no
extra key is added to the message, so the output is sendable as it is. A message counts as
injected only when its tag verifies: a human message that contains, or even starts with, a
``<ctxrules:...>`` text it pasted stays real (it can be the anchor). The signature covers the
whole content (the other parts of a list too), so a message that adds a text or an image of
its own to a copied tag stays real, and no stage drops what it added. A stage that rewrites an
injected message keeps the mark (:func:`replace_text`, :func:`keep_mark` re-sign). An elision marker
(``[ctxrules:elided ...]``, square brackets) does not make a message injected: a real user
message whose content went to the vault is still the real user message.

**Pairing, steps, exchanges and pins** are in :mod:`ctxrules.structure`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ctxrules.errors import MessagesError
from ctxrules.injected import InjectionKey, OtherParts, TagHead, current_key, format_attr, parse_head
from ctxrules.json_stream import json_sha256

__all__ = [
    "ROLES",
    "has_tool_calls",
    "injected_kind",
    "injected_meta",
    "is_injected",
    "is_real_user",
    "keep_mark",
    "mark_injected",
    "message_text",
    "replace_text",
    "split_input",
    "tool_call_id",
    "validate_messages",
    "validate_tools",
]

Message = dict[str, Any]

ROLES: frozenset[str] = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_KIND_RE = re.compile(r"[a-z][a-z0-9_.-]*")
_LEADING_ROLES = frozenset({"system", "developer"})
_RESULT_ROLES = frozenset({"tool", "function"})


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
    raise MessagesError(f"expected a JSON list of chat messages or an object with 'messages', got {_type_name(obj)}")


def validate_messages(obj: object, *, start: int = 0, warnings: list[str] | None = None) -> list[Message]:
    """Check the structure of a message list and return it as a new list (same dicts).

    Raises :class:`MessagesError` naming the message index for what no stage can repair: a
    message that is not an object, a missing or unknown role, content of the wrong type,
    ``tool_calls`` or ``thinking_blocks`` that is not a list, a tool call without a function. What agents
    really produce and a stage repairs is accepted: ``function.arguments`` that are not JSON,
    tool results whose call never appeared (``normalize.tool_pairs`` handles those).
    ``start`` skips messages already known to be valid (a history's unchanged prefix).
    Data no JSON writer can take back (see :mod:`ctxrules.json_limits`) is rejected, except
    lone surrogates, replaced in a copy of the message (a note for each goes to ``warnings``).
    """
    messages, _tools = split_input(obj)
    out: list[Message] | None = None
    for index in range(start, len(messages)):
        _validate_message(index, messages[index])
        fixed = _within_limits(index, messages[index], warnings)
        if fixed is not messages[index]:
            if out is None:
                out = list(messages)
            out[index] = fixed
    return out if out is not None else list(messages)


def _within_limits(index: int, message: Message, warnings: list[str] | None) -> Message:
    """``message``, or a repaired copy when it holds lone surrogates (each replaced with
    U+FFFD, with a warning naming the message and field: rejecting would fail every later
    call of an append-only conversation). Nesting too deep, an integer too long to write out
    and a non-finite number raise :class:`MessagesError` naming the field."""
    from ctxrules.json_limits import is_plain, pointer, scan, short_pointer

    if is_plain(message):  # nearly every message: nothing to report, no paths to build
        return message
    found = scan(message)
    where = f"message {index} ({message.get('role')})"
    if found.problems:
        first = found.problems[0]
        raise MessagesError(f"{where}: {short_pointer(first.path)}: {first.detail}")
    if found.replaced and warnings is not None:
        fields = ", ".join(pointer(p) for p in found.replaced[:5])
        more = f" and {len(found.replaced) - 5} more" if len(found.replaced) > 5 else ""
        warnings.append(f"{where}: a lone surrogate in {fields}{more} was replaced with U+FFFD")
    return found.value  # type: ignore[no-any-return]


def validate_tools(
    tools: object, *, warnings: list[str] | None = None, max_depth: int | None = None
) -> list[dict[str, Any]]:
    """Check tool definitions (OpenAI ``{"type": "function", "function": {...}}`` or Anthropic
    ``{"name", "input_schema"}``) as messages are checked, and return them as a new list.

    A JSON schema is data from outside like a message: nesting deeper than
    :data:`~ctxrules.json_limits.MAX_DEPTH`, an integer too long to write out and a non-finite
    number raise :class:`MessagesError` naming the tool and the field; lone surrogates are
    replaced with U+FFFD in a copy of the tool, with a warning naming the tool and field.
    ``None`` is no tools. ``max_depth``: a lower nesting limit (for tools that nest deeper
    once converted)."""
    from ctxrules.json_limits import MAX_DEPTH, pointer, scan, short_pointer

    if tools is None:
        return []
    if not isinstance(tools, list | tuple):
        raise MessagesError(f"'tools' must be a list, got {_type_name(tools)}")
    out: list[dict[str, Any]] = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise MessagesError(f"tool {index}: expected an object, got {_type_name(tool)}")
        found = scan(tool, max_depth=MAX_DEPTH if max_depth is None else max_depth)
        if found.problems or found.replaced:
            where = f"tool {index}" + (f" ({name})" if (name := _tool_name(found.value)) else "")
            if found.problems:
                first = found.problems[0]
                raise MessagesError(f"{where}: {short_pointer(first.path)}: {first.detail}")
            if warnings is not None:
                fields = ", ".join(pointer(p) for p in found.replaced[:5])
                more = f" and {len(found.replaced) - 5} more" if len(found.replaced) > 5 else ""
                warnings.append(f"{where}: a lone surrogate in {fields}{more} was replaced with U+FFFD")
        out.append(found.value)
    return out


def _tool_name(tool: Mapping[str, Any]) -> str | None:
    function = tool.get("function")
    name = function.get("name") if isinstance(function, Mapping) else tool.get("name")
    return name if isinstance(name, str) and name else None


def _validate_message(index: int, message: object) -> None:
    where = f"message {index}"
    # type() first: nearly every message is a dict, and the Mapping check goes through the ABC.
    if not (type(message) is dict or isinstance(message, Mapping)):
        raise MessagesError(f"{where}: expected an object, got {_type_name(message)}")
    if "role" not in message:
        raise MessagesError(f"{where}: missing 'role'")
    role = message["role"]
    if not isinstance(role, str):
        raise MessagesError(f"{where}: 'role' must be a string, got {_type_name(role)}")
    if role not in ROLES:
        raise MessagesError(f"{where}: unknown role {role!r} (expected one of {', '.join(sorted(ROLES))})")
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
        raise MessagesError(f"{where}: 'content' must be a string, a list of parts or null, got {_type_name(content)}")
    tool_calls = message.get("tool_calls")
    if tool_calls is not None:
        if role != "assistant":
            raise MessagesError(f"{where}: 'tool_calls' is only valid on assistant messages")
        if not isinstance(tool_calls, list):
            raise MessagesError(f"{where}: 'tool_calls' must be a list, got {_type_name(tool_calls)}")
        for call_index, call in enumerate(tool_calls):
            _validate_call(f"{where}, tool_calls[{call_index}]", call)
    call_id = message.get("tool_call_id")
    if call_id is not None and not isinstance(call_id, str):
        raise MessagesError(f"{where}: 'tool_call_id' must be a string, got {_type_name(call_id)}")
    # litellm's field for Anthropic's signed thinking: every stage that reads thinking walks
    # it as a list (a number failed them all with a TypeError, a string went by character).
    blocks = message.get("thinking_blocks")
    if blocks is not None and not isinstance(blocks, list):
        raise MessagesError(f"{where}: 'thinking_blocks' must be a list of blocks, got {_type_name(blocks)}")


def _validate_part(where: str, part: object) -> None:
    if not (type(part) is dict or isinstance(part, Mapping)):
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
    if not (type(call) is dict or isinstance(call, Mapping)):
        raise MessagesError(f"{where}: expected an object, got {_type_name(call)}")
    call_id = call.get("id")
    # A missing or empty id is repairable (normalize.tool_pairs derives a stable one); a
    # present id of the wrong type is not.
    if call_id is not None and not isinstance(call_id, str):
        raise MessagesError(f"{where}: 'id' must be a string, got {_type_name(call_id)}")
    # OpenAI "custom" tools carry {"custom": {"name", "input"}} instead of "function".
    kind = "custom" if call.get("type") == "custom" else "function"
    function = call.get(kind)
    if not (type(function) is dict or isinstance(function, Mapping)):
        raise MessagesError(f"{where}: missing {kind!r} object")
    if not isinstance(function.get("name"), str):
        raise MessagesError(f"{where}: '{kind}.name' must be a string")
    arguments = function.get("arguments")
    if kind == "function" and not (arguments is None or isinstance(arguments, str | Mapping)):
        raise MessagesError(f"{where}: 'function.arguments' must be a string, got {_type_name(arguments)}")


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    return {dict: "object", list: "array", str: "string", bool: "boolean"}.get(type(value), type(value).__name__)


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
            if isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str)
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
    return keep_mark(msg, _replace_text(msg, new_text))


def _replace_text(msg: Mapping[str, Any], new_text: str) -> Message:
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


def _first_text(msg: Mapping[str, Any]) -> tuple[str, int]:
    """The first text (what a tag opens) and the index of its part (-1: a string content)."""
    content = msg.get("content")
    if isinstance(content, str):
        return content, -1
    if isinstance(content, list):
        for i, part in enumerate(content):
            if _is_text_part(part) and isinstance(part.get("text"), str):
                return str(part["text"]), i
    return "", -1


def _others(msg: Mapping[str, Any], at: int) -> OtherParts | None:
    """What the signature covers besides the first text (part ``at``): ``None`` when that text
    is all the message holds (a string, or a list of that one part), signed as the text alone."""
    content = msg.get("content")
    if at < 0 or not isinstance(content, list) or len(content) == 1:
        return None
    return OtherParts(content, at)


# --- injected messages ----------------------------------------------------------------------


def _verified(msg: Mapping[str, Any], key: InjectionKey) -> TagHead | None:
    text, at = _first_text(msg)
    # Most texts do not open with "<" (after white space): decided without the regex. lstrip
    # returns the same string object when there is nothing to strip.
    if not text.lstrip().startswith("<ctxrules:"):
        return None
    return key.verified(text, _others(msg, at))


def _signed_head(msg: Mapping[str, Any]) -> TagHead | None:
    return _verified(msg, current_key())


def _signed(msg: Message, key: InjectionKey) -> Message:
    """``msg`` with its first text (which opens with a tag) signed for the whole message."""
    text, at = _first_text(msg)
    return _with_first_text(msg, key.sign(text, _others(msg, at)))


def is_injected(msg: Mapping[str, Any]) -> bool:
    """Whether ctxrules produced ``msg``: its text opens with a tag signed under the current key."""
    return _signed_head(msg) is not None


def injected_kind(msg: Mapping[str, Any]) -> str | None:
    """The ``kind`` of an injected message (``None`` for any other message)."""
    head = _signed_head(msg)
    return head.kind if head is not None else None


def injected_meta(msg: Mapping[str, Any]) -> dict[str, str]:
    """The attributes of an injected message's tag (strings; ``{}`` for any other message)."""
    head = _signed_head(msg)
    return dict(head.attrs) if head is not None else {}


def is_real_user(msg: Mapping[str, Any]) -> bool:
    """A ``user`` message a human (or the agent's harness) wrote, not one ctxrules injected."""
    return msg.get("role") == "user" and not is_injected(msg)


def signed_by(msg: Mapping[str, Any], key: InjectionKey) -> bool | None:
    """Whether ``key`` signed the tag ``msg``'s text opens with; None when the text opens with
    no signed tag (a session's own messages are told apart by the key they were signed with).

    Which key signed, not whether the message is ctxrules' own: the tag counts when it was
    signed for the whole message or for its text alone (a caller's message that copied the tag
    next to parts of its own is not injected, but still shows the key that signed the tag)."""
    text, at = _first_text(msg)
    if not text.lstrip().startswith("<ctxrules:"):
        return None
    head = parse_head(text)
    if head is None or head.sig_span is None:
        return None
    others = _others(msg, at)
    return key.verified(text, others) is not None or (others is not None and key.verified(text) is not None)


def mark_injected(msg: Mapping[str, Any], kind: str, **meta: str | int | float | bool | None) -> Message:
    """A copy of ``msg`` marked as injected: its text opens with a signed ``<ctxrules:KIND>`` tag
    whose attributes hold ``meta`` (scalars, ``None`` left out; read back as strings with
    :func:`injected_meta`).

    Text that already opens with a ``<ctxrules:KIND ...>`` tag keeps it (its attributes win;
    ``meta`` adds the missing ones) and is only signed, so marking twice changes nothing;
    otherwise the text is wrapped in ``<ctxrules:KIND ...>`` ... ``</ctxrules:KIND>``. No key is
    added to the message: the output stays sendable as it is (invariant 8).
    """
    if not _KIND_RE.fullmatch(kind):
        raise ValueError(f"invalid injected kind {kind!r}: use lowercase letters, digits, _.-")
    meta = {k: v for k, v in meta.items() if v is not None}
    for name, value in meta.items():
        if not isinstance(value, str | int | float | bool) or not _KIND_RE.fullmatch(name) or name == "sig":
            raise TypeError(f"injected-message attribute {name}={value!r}: expected a scalar")
    key = current_key()
    text, _at = _first_text(msg)
    head = parse_head(text)
    if head is not None and head.kind == kind:
        missing = {k: v for k, v in meta.items() if k not in head.attrs}
        if missing:
            at = head.end - 1 - len(head.close)
            if head.sig_span is not None:
                at = head.sig_span[0]
            text = text[:at] + "".join(f" {k}={format_attr(v)}" for k, v in missing.items()) + text[at:]
        elif head.sig is not None and _verified(msg, key) is not None:
            return dict(msg)
        return _signed(_with_first_text(msg, text), key)
    attrs = "".join(f" {k}={format_attr(v)}" for k, v in meta.items())
    content = msg.get("content")
    if isinstance(content, list) and not any(_is_text_part(part) for part in content):
        # Keep non-text parts as they are; a leading text part carries the tag.
        tag = {"type": "text", "text": f"<ctxrules:{kind}{attrs}/>"}
        return _signed({**msg, "content": [tag, *content]}, key)
    return _signed(_with_first_text(msg, f"<ctxrules:{kind}{attrs}>\n{text}\n</ctxrules:{kind}>"), key)


def _with_first_text(msg: Mapping[str, Any], text: str) -> Message:
    """``msg`` with its first text replaced (string content, or the first text part)."""
    content = msg.get("content")
    if not isinstance(content, list):
        return {**msg, "content": text}
    parts = list(content)
    for i, part in enumerate(parts):
        if _is_text_part(part) and isinstance(part.get("text"), str):
            parts[i] = {**part, "text": text}
            return {**msg, "content": parts}
    return {**msg, "content": [{"type": "text", "text": text}, *parts]}


def keep_mark(old: Mapping[str, Any], new: Message) -> Message:
    """``new`` (a stage's rewrite of ``old``) still marked as injected when ``old`` was.

    A rewrite of an injected message (a cut, a spill, an image moved to the vault) invalidates
    its signature; the rewritten message is still ctxrules' own: it is signed again, and
    re-tagged when the tag itself was cut away."""
    head = _signed_head(old)
    if head is None or new is old:
        return new
    key = current_key()
    if _verified(new, key) is not None:
        return new
    if parse_head(_first_text(new)[0]) is not None:
        return _signed(new, key)
    return mark_injected(new, head.kind, **head.attrs)


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
    # A 50 MB tool result is hashed in slices (json_stream), not serialised and copied whole.
    return json_sha256(message, sort_keys=True, separators=(",", ":"))


def clone_json(value: Any) -> Any:
    """A copy of JSON-like data; much cheaper than ``copy.deepcopy`` (no memo, no reduce)."""
    kind = type(value)
    if kind is str:  # most values: one test, not two
        return value
    if kind is dict or isinstance(value, dict):
        return {k: clone_json(v) for k, v in value.items()}
    if kind is list or isinstance(value, list):
        return [clone_json(v) for v in value]
    return value
