"""The message-list model: validation, injected-message markers, steps, exchanges and pins.

Messages are OpenAI chat-completions messages as plain dicts. Nothing here mutates a message;
helpers that "change" one return a new dict and leave unknown fields untouched (DESIGN.md
invariant 5).

**Injected messages.** Everything ctxrules puts into a conversation carries the metadata key
``"ctxrules"`` (a dict such as ``{"kind": "summary"}``) *and* opens its text with a
``<ctxrules:KIND ...>`` tag. A message counts as injected when *either* is present: callers
that round-trip history through strict SDK models lose unknown keys, and the tag is what
survives. A human message that merely *contains* ``<ctxrules:`` stays real; one that *starts*
with such a tag is taken as injected, because mistaking an injected message for the human
anchor (invariant 2) is the worse error. An elision marker (``[ctxrules:elided ...]``, square
brackets) does not make a message injected: a real user message whose content went to the
vault is still the real user message.

**Pairing.** A tool result answers the most recent still-unanswered call with its
``tool_call_id`` (ids may repeat across turns); within one assistant message the earliest such
call goes first. A result that finds no such call is a *duplicate* when an earlier call with
that id exists (already answered), otherwise an *orphan*. :func:`pair_tool_calls` is the one
implementation; :func:`steps`, :func:`pinned_indices` and the ``normalize.tool_pairs`` stage
all use it, so they never disagree about which result belongs where.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ctxrules.errors import MessagesError

__all__ = [
    "INJECTED_KEY",
    "ROLES",
    "Exchange",
    "Step",
    "ToolPairing",
    "exchanges",
    "has_tool_calls",
    "injected_kind",
    "is_injected",
    "is_real_user",
    "mark_injected",
    "message_text",
    "pair_tool_calls",
    "pinned_indices",
    "replace_text",
    "split_input",
    "steps",
    "tool_call_id",
    "validate_messages",
]

Message = dict[str, Any]
CallKey = tuple[int, int]
"""A tool call as ``(index of its assistant message, position in its tool_calls)``."""

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


@dataclass(frozen=True)
class ToolPairing:
    """Which tool result answers which call (see the module docstring for the rule).

    ``positional`` lists results without a ``tool_call_id`` that were matched, in order, to
    id-less calls of the assistant message whose block they sit in: the repair stage gives
    both the same generated id.
    """

    result_of: Mapping[CallKey, int]
    call_of: Mapping[int, CallKey]
    orphans: tuple[int, ...]
    duplicates: Mapping[int, CallKey]
    unanswered: tuple[CallKey, ...]
    positional: frozenset[int] = field(default_factory=frozenset)


_T = TypeVar("_T")
_PerList = list[tuple[Sequence[Mapping[str, Any]], tuple[int, ...], Any]]


def _per_list(memo: _PerList, messages: Sequence[Mapping[str, Any]],
              compute: Callable[[Sequence[Mapping[str, Any]]], _T]) -> _T:
    """``compute(messages)``, remembered for the last few lists. Several stages of one pipeline
    run ask about the same list; the key is the list object and the identity of every message
    in it (message lists are never changed in place within a run), so a repeat costs one pass
    over the ids."""
    ids = tuple(map(id, messages))
    for seq, seen, value in memo:
        if seq is messages and seen == ids:
            return value  # type: ignore[no-any-return]  # stored by this same compute
    value = compute(messages)
    memo.insert(0, (messages, ids, value))
    del memo[4:]
    return value


_PAIRING_MEMO: _PerList = []


def pair_tool_calls(messages: Sequence[Mapping[str, Any]]) -> ToolPairing:
    """Pair tool results with calls in one pass (O(messages + calls)); remembered per list."""
    return _per_list(_PAIRING_MEMO, messages, _pair_tool_calls)


def _pair_tool_calls(messages: Sequence[Mapping[str, Any]]) -> ToolPairing:
    open_calls: dict[str, list[CallKey]] = {}
    last_call: dict[str, CallKey] = {}
    idless: dict[int, list[int]] = {}
    result_of: dict[CallKey, int] = {}
    call_of: dict[int, CallKey] = {}
    orphans: list[int] = []
    duplicates: dict[int, CallKey] = {}
    positional: set[int] = set()
    all_calls: list[CallKey] = []
    block_owner: int | None = None
    for index, msg in enumerate(messages):
        role = msg.get("role")
        if role == "assistant":
            block_owner = index
            if not has_tool_calls(msg):
                continue
            for pos, call in enumerate(msg["tool_calls"]):
                key = (index, pos)
                all_calls.append(key)
                cid = tool_call_id(call)
                if cid is None:
                    idless.setdefault(index, []).append(pos)
                else:
                    open_calls.setdefault(cid, []).append(key)
                    last_call[cid] = key
            continue
        if role not in _RESULT_ROLES:
            block_owner = None
            continue
        if role != "tool":
            continue
        cid = _result_id(msg)
        if cid is None:
            waiting = idless.get(block_owner, []) if block_owner is not None else []
            if block_owner is not None and waiting:
                key = (block_owner, waiting.pop(0))
                result_of[key] = index
                call_of[index] = key
                positional.add(index)
            else:
                orphans.append(index)
            continue
        pending = open_calls.get(cid)
        if pending:
            key = _take_most_recent(pending)
            result_of[key] = index
            call_of[index] = key
        elif cid in last_call:
            duplicates[index] = last_call[cid]
        else:
            orphans.append(index)
    unanswered = tuple(key for key in all_calls if key not in result_of)
    return ToolPairing(
        result_of=result_of,
        call_of=call_of,
        orphans=tuple(orphans),
        duplicates=duplicates,
        unanswered=unanswered,
        positional=frozenset(positional),
    )


def _take_most_recent(pending: list[CallKey]) -> CallKey:
    """Pop the earliest open call of the most recent assistant message in ``pending``."""
    newest_message = pending[-1][0]
    start = len(pending) - 1
    while start > 0 and pending[start - 1][0] == newest_message:
        start -= 1
    return pending.pop(start)


# --- steps, exchanges, pins -----------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One assistant message and the results of its tool calls.

    ``results`` are the indices of the tool results that answer its calls wherever they sit,
    plus unpaired results (orphans, duplicates) and legacy ``function`` results in the block
    right after it. ``start``/``stop`` is the half-open range that covers all of them; when a
    result is misplaced, other messages may lie inside that range, so use ``indices`` for the
    exact membership.
    """

    assistant: int
    results: tuple[int, ...] = ()

    @property
    def indices(self) -> tuple[int, ...]:
        return (self.assistant, *self.results)

    @property
    def start(self) -> int:
        return self.assistant

    @property
    def stop(self) -> int:
        return max(self.indices) + 1


@dataclass(frozen=True)
class Exchange:
    """A real user message and everything up to the next real user message.

    ``start``/``stop`` is the half-open range (``start`` is the user message); ``steps`` are
    the steps whose assistant message lies in that range.
    """

    user: int
    start: int
    stop: int
    steps: tuple[Step, ...] = ()


def steps(messages: Sequence[Mapping[str, Any]]) -> list[Step]:
    """Every step, in the order of its assistant message."""
    return _steps(messages, pair_tool_calls(messages))


def _steps(messages: Sequence[Mapping[str, Any]], pairing: ToolPairing) -> list[Step]:
    members: dict[int, list[int]] = {}
    block_owner: int | None = None
    for index, msg in enumerate(messages):
        role = msg.get("role")
        if role == "assistant":
            members[index] = []
            block_owner = index
        elif role in _RESULT_ROLES:
            key = pairing.call_of.get(index)
            owner = key[0] if key is not None else block_owner
            if owner is not None:
                members[owner].append(index)
        else:
            block_owner = None
    return [Step(assistant, tuple(sorted(results))) for assistant, results in members.items()]


def exchanges(messages: Sequence[Mapping[str, Any]]) -> list[Exchange]:
    """Every exchange, in order. Messages before the first real user message (the system
    prompt, or steps of an agent that started on its own) belong to no exchange."""
    users = [i for i, msg in enumerate(messages) if is_real_user(msg)]
    if not users:
        return []
    all_steps = steps(messages)
    bounds = [*users, len(messages)]
    out: list[Exchange] = []
    step_iter = 0
    while step_iter < len(all_steps) and all_steps[step_iter].assistant < users[0]:
        step_iter += 1
    for n, user in enumerate(users):
        stop = bounds[n + 1]
        inside: list[Step] = []
        while step_iter < len(all_steps) and all_steps[step_iter].assistant < stop:
            inside.append(all_steps[step_iter])
            step_iter += 1
        out.append(Exchange(user=user, start=user, stop=stop, steps=tuple(inside)))
    return out


_PINS_MEMO: _PerList = []


def pinned_indices(messages: Sequence[Mapping[str, Any]]) -> frozenset[int]:
    """Indices that never leave the context (DESIGN.md "pinned"); remembered per list."""
    return _per_list(_PINS_MEMO, messages, _pinned_indices)


def _pinned_indices(messages: Sequence[Mapping[str, Any]]) -> frozenset[int]:
    """Indices that never leave the context (DESIGN.md "pinned").

    The leading system/developer messages, the human anchor (first real user message), the
    latest real user message, and every message of the newest step. One pass over the list
    (plus one pairing pass when the newest step has tool calls), no text beyond the first
    characters of user messages is looked at.
    """
    pinned: set[int] = set()
    n = len(messages)
    i = 0
    while i < n and messages[i].get("role") in _LEADING_ROLES:
        pinned.add(i)
        i += 1
    first_user = next((j for j in range(n) if is_real_user(messages[j])), None)
    if first_user is not None:
        pinned.add(first_user)
        last_user = next(j for j in range(n - 1, -1, -1) if is_real_user(messages[j]))
        pinned.add(last_user)
    last_assistant = next(
        (j for j in range(n - 1, -1, -1) if messages[j].get("role") == "assistant"), None
    )
    if last_assistant is not None:
        pinned.update(_newest_step(messages, last_assistant).indices)
    return frozenset(pinned)


def _newest_step(messages: Sequence[Mapping[str, Any]], last_assistant: int) -> Step:
    tail = range(last_assistant + 1, len(messages))
    if not any(messages[j].get("role") == "tool" for j in tail):
        # Only legacy function results (or nothing) follow: membership is positional.
        results: list[int] = []
        for j in tail:
            if messages[j].get("role") not in _RESULT_ROLES:
                break
            results.append(j)
        return Step(last_assistant, tuple(results))
    # Whether a later tool result answers this step or an older unanswered call with the same
    # id depends on the whole history, so defer to the one pairing implementation. The tail
    # is usually a handful of messages; the pairing pass is linear and touches no text.
    pairing = pair_tool_calls(messages)
    results = []
    in_block = True
    for j in tail:
        in_block = in_block and messages[j].get("role") in _RESULT_ROLES
        key = pairing.call_of.get(j)
        if (key is not None and key[0] == last_assistant) or (key is None and in_block):
            results.append(j)
    return Step(last_assistant, tuple(results))
