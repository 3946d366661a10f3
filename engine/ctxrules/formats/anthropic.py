"""Anthropic Messages requests ↔ the internal form (OpenAI chat messages), losslessly.

**Decode** (:func:`decode`): the top-level ``system`` (a string or text blocks) becomes the
leading system message; a user turn's ``tool_result`` blocks become ``tool`` messages (content,
``is_error``, ``cache_control`` kept) followed by the turn's other blocks as user messages (one per text
block, images and documents with the text before them, never with a message ctxrules injected);
an assistant turn's ``tool_use`` blocks become ``tool_calls`` (``input`` as the JSON
``arguments``), its ``thinking``/``redacted_thinking`` blocks ``thinking_blocks`` (the blocks
themselves, signatures byte-exact), everything else its content parts. Images, documents and
text blocks are content parts as they are (the stages read Anthropic-style parts); tools with
``input_schema`` become function tools. What the OpenAI form has no field for (``is_error``,
the order of blocks when it is not thinking → content → tool calls, a ``tool_result`` without
content, extra keys of tools and tool calls) rides on the private key :data:`PRIVATE`, which
:func:`encode` reads and never writes to the wire.

**Encode** (:func:`encode`): the reverse, for any internal message list (also plain OpenAI
messages, or what the pipeline made of a decoded request): leading system/developer messages →
``system``; ``tool`` results → ``tool_result`` blocks at the head of the next user turn;
consecutive messages of one role → one turn (roles alternate); a list that would start with an
assistant turn gets a short opening user turn (and one that would end with an assistant turn
where ``request`` ended with a user turn, a closing one); message-level ``cache_control`` moves onto the
turn's last block; OpenAI ``image_url`` parts become image blocks; every key Anthropic does not
define is left out. A decoded valid request encodes back to the same JSON (key order aside).

**Validate** (:func:`validate`): the rules Anthropic enforces, as :class:`Problem` objects.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxrules.formats import FormatError, Problem
from ctxrules.injected import parse_head
from ctxrules.json_limits import is_plain, scan, short_pointer

__all__ = ["DEEPER", "OPENING_TEXT", "PRIVATE", "Decoded", "decode", "encode", "strip_private", "validate"]

Message = dict[str, Any]

PRIVATE = "_ctxrules_anthropic"
"""Key on internal messages, tool calls and tools holding what the OpenAI form cannot say."""

OPENING_TEXT = "(conversation continues)"
"""The user turn put first when a message list would otherwise start with an assistant turn,
and last when the request ended with a user turn and the message list no longer does."""

CACHE = "cache_control"
DEEPER = 2
"""Levels the internal form nests a request's value deeper, at most: a ``tool_use`` block's
extra keys ride on its tool call's :data:`PRIVATE` ``extra``, a tool's ``input_schema`` is its
``function.parameters``. A request within ``MAX_DEPTH - DEEPER`` decodes within ``MAX_DEPTH``,
so what is too deep is refused naming the place in the request, not in the internal form."""
MAX_BREAKPOINTS = 4
_THINKING = frozenset({"thinking", "redacted_thinking"})
_RESULT_CONTENT = frozenset({"text", "image", "document", "search_result"})
_DATA_URL = re.compile(r"data:(?P<type>[^;,]+);base64,(?P<data>.*)", re.S)
# Keys of an OpenAI message that Anthropic has no place for (dropped on encode, never sent).
_MESSAGE_KEYS = frozenset({"role", "content"})
# Keys of an Anthropic message that the internal form reads as its own (tool calls and results,
# thinking, reasoning, what rides on PRIVATE): given by the caller, they would replace what was
# decoded from the blocks (an assistant turn's tool_use, its thinking) or be acted on (a
# reasoning_content moved to the vault) and then dropped on encode. Anthropic defines none.
_INTERNAL_KEYS = ("tool_calls", "tool_call_id", "function_call", "thinking_blocks", "reasoning_content", PRIVATE)
# The layout letters: thinking, content part, tool use.
_T, _C, _U = "t", "c", "u"


@dataclass
class Decoded:
    """A decoded request: internal ``messages`` and ``tools`` (``None``: the request had no
    ``tools`` key), and the ``request`` itself, whose other keys :func:`encode` keeps."""

    messages: list[Message]
    tools: list[dict[str, Any]] | None
    request: dict[str, Any] = field(default_factory=dict)


# --- decode ------------------------------------------------------------------------------------


def decode(request: object) -> Decoded:
    """The internal form of an Anthropic Messages request body. Raises :class:`FormatError`
    (naming the path) for what is not a readable request; nothing is changed or dropped."""
    if not isinstance(request, Mapping):
        raise FormatError(f"an Anthropic request is a JSON object, got {type(request).__name__}")
    raw = request.get("messages")
    if not isinstance(raw, list):
        raise FormatError("messages: an Anthropic request needs a 'messages' list")
    out: list[Message] = []
    if "system" in request:
        out.append(_decode_system(request["system"]))
    if not raw:
        raise FormatError("messages: an Anthropic request needs at least one message")
    for i, message in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise FormatError(f"{where}: expected an object")
        role = message.get("role")
        content = message.get("content")
        if role not in ("user", "assistant"):
            raise FormatError(f"{where}.role: expected 'user' or 'assistant', got {role!r}")
        if not isinstance(content, str | list):
            raise FormatError(f"{where}.content: expected a string or a list of blocks")
        if isinstance(content, list):
            _check_blocks(where, content)
            _check_roles(where, role, content)
        for key in _INTERNAL_KEYS:
            if key in message:
                raise FormatError(
                    f"{where}.{key}: not a field of an Anthropic message "
                    "(tool calls, results and thinking are blocks in 'content')"
                )
        extra = {k: v for k, v in message.items() if k not in _MESSAGE_KEYS}
        if role == "user":
            out.extend(_decode_user(where, content, extra))
        else:
            out.append(_decode_assistant(where, content, extra))
    tools = request.get("tools")
    decoded_tools: list[dict[str, Any]] | None = None
    if tools is not None:
        if not isinstance(tools, list):
            raise FormatError(f"tools: expected a list of objects, got {type(tools).__name__}")
        for i, tool in enumerate(tools):
            if not isinstance(tool, Mapping):
                raise FormatError(f"tools[{i}]: expected an object, got {type(tool).__name__}")
        decoded_tools = [_decode_tool(f"tools[{i}]", t) for i, t in enumerate(tools)]
    return Decoded(out, decoded_tools, dict(request))


# Blocks only one side of the conversation writes: the model calls tools, the user answers.
_NOT_IN = {"user": ("tool_use",), "assistant": ("tool_result",)}


def _check_roles(where: str, role: str, blocks: list[Any]) -> None:
    """A tool call in a user turn or a tool result in an assistant turn has no place in the
    conversation (Anthropic refuses the request): an error naming the block, not a pass-through."""
    for j, block in enumerate(blocks):
        if block["type"] in _NOT_IN[role]:
            article = "an" if role == "assistant" else "a"
            raise FormatError(f"{where}.content[{j}]: a {block['type']} block in {article} {role} turn")


def _check_blocks(where: str, blocks: list[Any]) -> None:
    for j, block in enumerate(blocks):
        if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
            raise FormatError(f"{where}.content[{j}]: expected a block object with a string 'type'")
        kind = block["type"]
        at = f"{where}.content[{j}]"
        if kind == "text" and not isinstance(block.get("text"), str):
            raise FormatError(f"{at}: a text block needs a string 'text'")
        if kind == "image_url":  # not Anthropic's, but an OpenAI image part encodes as an image
            image = block.get("image_url")
            if not isinstance(image.get("url") if isinstance(image, Mapping) else image, str):
                raise FormatError(f"{at}: an image_url block needs 'image_url.url' (a string)")
        if kind == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise FormatError(f"{at}: a tool_use block needs a string 'id' and 'name'")
            if not isinstance(block.get("input"), Mapping):
                raise FormatError(f"{at}: a tool_use block needs an object 'input'")
        if kind == "tool_result":
            if not isinstance(block.get("tool_use_id"), str):
                raise FormatError(f"{at}: a tool_result block needs a string 'tool_use_id'")
            inner = block.get("content")
            if inner is not None and not isinstance(inner, str | list):
                raise FormatError(f"{at}.content: expected a string or a list of blocks")
            if isinstance(inner, list):
                _check_blocks(at, inner)


def _decode_system(system: object) -> Message:
    if isinstance(system, str):
        return {"role": "system", "content": system}
    if isinstance(system, list) and all(
        isinstance(b, Mapping) and b.get("type") == "text" and isinstance(b.get("text"), str) for b in system
    ):
        return {"role": "system", "content": [dict(b) for b in system]}
    raise FormatError("system: expected a string or a list of text blocks")


def _decode_user(where: str, content: str | list[Any], extra: dict[str, Any]) -> list[Message]:
    if isinstance(content, str):
        return [{"role": "user", "content": content, **extra}]
    out: list[Message] = []
    rest: list[Any] = []
    for block in content:
        if block["type"] == "tool_result":
            out.append(_decode_result(block))
        else:
            rest.append(block)
    groups = _text_groups(rest)
    for group in groups:
        out.append({"role": "user", "content": group, **extra})
    if not groups and not out:
        out.append({"role": "user", "content": [], **extra})
    return out


def _text_groups(blocks: list[Any]) -> list[list[Any]]:
    """A turn's blocks as one user message per text block, other blocks (images, documents)
    with the text before them (leading ones with the first text). Agents put several messages
    into one turn (a resumed session's summary, command output, then the actual request):
    kept apart, the latest real user message is the request, not the whole turn. Encoding
    joins them back into the same block list.

    A text that ctxrules wrapped in a signed tag (notes, a summary, a notice) is a message of
    its own: the image of the caller's message next to it in the turn goes with the caller's
    text. With it, the signature (which covers a message's every part) would not verify: the
    notes would be rendered again on every turn that opens with an image. The images of a
    message ctxrules made of images alone follow its self-closing tag and stay with it."""
    groups: list[list[Any]] = []
    alone = False  # the last group is a wrapped ctxrules text: nothing joins it
    for block in blocks:
        text = block["type"] == "text"
        own = text and _wrapped_tag(block.get("text"))
        if groups and not (own or alone or (text and any(b["type"] == "text" for b in groups[-1]))):
            groups[-1].append(block)
        else:
            groups.append([block])
        alone = own
    return groups


def _wrapped_tag(text: object) -> bool:
    """Whether ``text`` opens with a signed ``<ctxrules:KIND ...>`` tag that is not self-closing
    (whether the signature verifies is the session's business, not the codec's)."""
    if not isinstance(text, str) or not text.lstrip().startswith("<ctxrules:"):
        return False
    head = parse_head(text)
    return head is not None and head.sig is not None and not head.close


def _decode_result(block: Mapping[str, Any]) -> Message:
    msg: Message = {"role": "tool", "tool_call_id": block["tool_use_id"]}
    private: dict[str, Any] = {}
    if "content" in block and block["content"] is not None:
        inner = block["content"]
        msg["content"] = [dict(b) for b in inner] if isinstance(inner, list) else inner
    else:
        msg["content"] = ""
        private["content"] = block.get("content", _ABSENT)
    if CACHE in block:
        msg[CACHE] = block[CACHE]
    if "is_error" in block:
        private["is_error"] = block["is_error"]
    extra = {k: v for k, v in block.items() if k not in ("type", "tool_use_id", "content", "is_error", CACHE)}
    if extra:
        private["extra"] = extra
    if private:
        msg[PRIVATE] = private
    return msg


_ABSENT = "absent"


def _decode_assistant(where: str, content: str | list[Any], extra: dict[str, Any]) -> Message:
    if isinstance(content, str):
        return {"role": "assistant", "content": content, **extra}
    thinking: list[dict[str, Any]] = []
    parts: list[Any] = []
    calls: list[dict[str, Any]] = []
    layout = []
    for block in content:
        kind = block["type"]
        if kind in _THINKING:
            thinking.append(dict(block))
            layout.append(_T)
        elif kind == "tool_use":
            calls.append(_decode_call(block))
            layout.append(_U)
        else:
            parts.append(block)
            layout.append(_C)
    msg: Message = {"role": "assistant", "content": parts if parts or not (thinking or calls) else None}
    if calls:
        msg["tool_calls"] = calls
    if thinking:
        msg["thinking_blocks"] = thinking
    msg.update(extra)
    order = "".join(layout)
    if order != _canonical(order.count(_T), order.count(_C), order.count(_U)):
        msg[PRIVATE] = {"layout": order}
    return msg


def _canonical(t: int, c: int, u: int) -> str:
    return _T * t + _C * c + _U * u


def _decode_call(block: Mapping[str, Any]) -> dict[str, Any]:
    call: dict[str, Any] = {
        "id": block["id"],
        "type": "function",
        "function": {"name": block["name"], "arguments": json.dumps(block["input"], ensure_ascii=False)},
    }
    if CACHE in block:
        call[CACHE] = block[CACHE]
    extra = {k: v for k, v in block.items() if k not in ("type", "id", "name", "input", CACHE)}
    if extra:
        call[PRIVATE] = {"extra": extra}
    return call


def _decode_tool(where: str, tool: Mapping[str, Any]) -> dict[str, Any]:
    if "input_schema" not in tool:
        return dict(tool)  # a server tool (web search, bash, text editor, ...): opaque
    if not isinstance(tool.get("name"), str):
        raise FormatError(f"{where}: a tool needs a string 'name'")
    function: dict[str, Any] = {"name": tool["name"]}
    if "description" in tool:
        function["description"] = tool["description"]
    function["parameters"] = tool["input_schema"]
    out: dict[str, Any] = {"type": "function", "function": function}
    if CACHE in tool:
        out[CACHE] = tool[CACHE]
    extra = {k: v for k, v in tool.items() if k not in ("name", "description", "input_schema", CACHE)}
    if extra:
        out[PRIVATE] = {"extra": extra}
    return out


# --- encode ------------------------------------------------------------------------------------


def encode(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    request: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """An Anthropic request body from internal messages and tools. ``request``'s other keys
    (``model``, ``max_tokens``, ``thinking``, ...) are kept in their order; ``tools`` is written
    when given non-empty or when ``request`` had it."""
    system: list[Mapping[str, Any]] = []
    built: list[_Turn] = []
    results: list[dict[str, Any]] = []  # a run of tool results, added to a turn together
    leading = True
    for message in messages:
        role = message.get("role")
        if leading and role in ("system", "developer"):
            system.append(message)
            continue
        leading = False
        if role in ("tool", "function"):
            results.append(_result_block(message))
            continue
        _add_results(built, results)
        results = []
        if role == "assistant":
            content = _assistant_content(message)
            if content or isinstance(message.get("content"), list):  # an empty OpenAI reply says nothing
                _add_turn(built, "assistant", content)
        else:  # user, and a system message in the middle (Anthropic has none there)
            _add_turn(built, "user", _user_content(message))
    _add_results(built, results)
    turns = _without_empty_text([{"role": turn.role, "content": turn.content()} for turn in built])
    if turns and turns[0]["role"] != "user":
        turns.insert(0, {"role": "user", "content": OPENING_TEXT})
    if not turns or (_ended_with_user(request) and turns[-1]["role"] != "user"):
        # The pipeline emptied the last user turn (a tool result answering no call), or the
        # caller's turns were all empty: an assistant turn last would be a prefill the model
        # continues, and no turn at all is a request Anthropic refuses.
        turns.append({"role": "user", "content": OPENING_TEXT})
    base = dict(request or {})
    out: dict[str, Any] = {}
    wrote_system = wrote_messages = False
    for key, value in base.items():
        if key == "system":
            if system:
                out["system"] = _system_value(system)
                wrote_system = True
        elif key == "messages":
            out["messages"] = turns
            wrote_messages = True
        elif key == "tools":
            out["tools"] = [_encode_tool(t) for t in tools or []]
        else:
            out[key] = value
    if system and not wrote_system:
        out = {"system": _system_value(system), **out}
    if not wrote_messages:
        out["messages"] = turns
    if tools and "tools" not in out:
        out["tools"] = [_encode_tool(t) for t in tools]
    return out


def _ended_with_user(request: Mapping[str, Any] | None) -> bool:
    messages = request.get("messages") if request is not None else None
    last = messages[-1] if isinstance(messages, list) and messages else None
    return isinstance(last, Mapping) and last.get("role") == "user"


def _system_value(system: list[Mapping[str, Any]]) -> str | list[dict[str, Any]]:
    if len(system) == 1 and isinstance(system[0].get("content"), str) and CACHE not in system[0]:
        return str(system[0]["content"])
    blocks: list[dict[str, Any]] = []
    for message in system:
        blocks.extend(b for b in _blocks(message, keep_empty=False) if b.get("type") == "text")
    return _drop_empty_text(blocks)


def _is_empty_text(block: Mapping[str, Any]) -> bool:
    # Whitespace alone too: Anthropic refuses "text content blocks must contain non-whitespace
    # text", and a session that keeps sending the block back fails on every turn.
    text = block.get("text")
    return block.get("type") == "text" and isinstance(text, str) and not text.strip()


def _drop_empty_text(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``blocks`` without empty text blocks, which Anthropic refuses (an input may hold them:
    ``"text": ""`` carries nothing). A breakpoint on a dropped block moves to the block before
    it when that one can hold it and has none."""
    if not any(_is_empty_text(b) for b in blocks):
        return blocks
    out: list[dict[str, Any]] = []
    for block in blocks:
        if not _is_empty_text(block):
            out.append(block)
        elif CACHE in block and out and CACHE not in out[-1] and out[-1].get("type") not in _THINKING:
            out[-1] = {**out[-1], CACHE: block[CACHE]}
    return out


def _without_empty_text(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The turns with no empty text block, in a turn or in a tool result, and no turn left
    empty by that or given empty (``"content": []``; a user turn ``""``): the guarantee holds
    for a caller's request too. Turns of one role that become neighbours are joined."""
    out: list[dict[str, Any]] = []
    for turn in turns:
        content = turn["content"]
        if isinstance(content, list):
            blocks = []
            for block in _drop_empty_text(content):
                inner = block.get("content")
                if block.get("type") == "tool_result" and isinstance(inner, list):
                    block = {**block, "content": _drop_empty_text(inner)}
                blocks.append(block)
            content = blocks
        blank = isinstance(content, str) and not content.strip()
        if (not content or blank) and (isinstance(content, list) or turn["role"] == "user"):
            continue
        if out and out[-1]["role"] == turn["role"]:
            # Joined in place (the turn is this function's copy): a copy of the joined
            # blocks for each turn joined was quadratic in a long run of them.
            if not isinstance(out[-1]["content"], list):
                out[-1]["content"] = _as_list(out[-1]["content"])
            out[-1]["content"].extend(_as_list(content))
        else:
            out.append({**turn, "content": content})
    return out


def _blocks(message: Mapping[str, Any], *, keep_empty: bool = True) -> list[dict[str, Any]]:
    """The content of ``message`` as Anthropic blocks; message-level ``cache_control`` moves
    onto the last block."""
    content = message.get("content")
    if isinstance(content, str):
        blocks = [{"type": "text", "text": content}] if content or keep_empty else []
    elif isinstance(content, list):
        blocks = [_encode_part(p) for p in content if isinstance(p, Mapping)]
    else:
        blocks = []
    return _with_cache(blocks, message)


def _with_cache(blocks: list[dict[str, Any]], message: Mapping[str, Any]) -> list[dict[str, Any]]:
    if CACHE in message and blocks and CACHE not in blocks[-1]:
        blocks[-1] = {**blocks[-1], CACHE: message[CACHE]}
    return blocks


def _encode_part(part: Mapping[str, Any]) -> dict[str, Any]:
    kind = part.get("type")
    if kind == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, Mapping) else image
        match = _DATA_URL.fullmatch(url) if isinstance(url, str) else None
        source: dict[str, Any] = (
            {"type": "base64", "media_type": match["type"], "data": match["data"]}
            if match
            else {"type": "url", "url": url}
        )
        block: dict[str, Any] = {"type": "image", "source": source}
        if CACHE in part:
            block[CACHE] = part[CACHE]
        return block
    if kind == "file" and isinstance(part.get("file"), Mapping):
        data = part["file"].get("file_data")
        match = _DATA_URL.fullmatch(data) if isinstance(data, str) else None
        if match:
            return {
                "type": "document",
                "source": {"type": "base64", "media_type": match["type"], "data": match["data"]},
            }
    return dict(part)


def _user_content(message: Mapping[str, Any]) -> str | list[dict[str, Any]]:
    content = message.get("content")
    if isinstance(content, str) and CACHE not in message:
        return content
    return _blocks(message)


def _assistant_content(message: Mapping[str, Any]) -> str | list[dict[str, Any]]:
    content = message.get("content")
    thinking = [dict(b) for b in message.get("thinking_blocks") or [] if isinstance(b, Mapping)]
    calls = [_encode_call(c) for c in message.get("tool_calls") or [] if isinstance(c, Mapping)]
    if isinstance(content, str) and not thinking and not calls and CACHE not in message:
        return content
    parts = _blocks({"content": content}, keep_empty=False)
    private = message.get(PRIVATE)
    layout = private.get("layout") if isinstance(private, Mapping) else None
    # Iterators, not lists popped from the front: that shifted the rest of the list for each
    # block of a turn of 50,000 tool calls.
    queues = {_T: iter(thinking), _C: iter(parts), _U: iter(calls)}
    blocks: list[dict[str, Any]] = []
    for letter in layout if isinstance(layout, str) else "":
        queue = queues.get(letter)
        if queue is not None:
            block = next(queue, None)
            if block is not None:
                blocks.append(block)
    for queue in queues.values():  # what the layout does not place, in the canonical order
        blocks.extend(queue)
    return _with_cache(blocks, message)


def _encode_call(call: Mapping[str, Any]) -> dict[str, Any]:
    function = call.get("function") if isinstance(call.get("function"), Mapping) else call.get("custom")
    function = function if isinstance(function, Mapping) else {}
    arguments = function.get("arguments", function.get("input"))
    value: Any = arguments
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):
            value = {"arguments": arguments}  # Anthropic needs an object; the text is kept
    if not isinstance(value, Mapping):
        value = {} if value is None else {"arguments": value}
    block: dict[str, Any] = {"type": "tool_use", "id": call.get("id"), "name": function.get("name"), "input": value}
    if CACHE in call:
        block[CACHE] = call[CACHE]
    private = call.get(PRIVATE)
    if isinstance(private, Mapping) and isinstance(private.get("extra"), Mapping):
        block.update(private["extra"])
    return block


def _result_block(message: Mapping[str, Any]) -> dict[str, Any]:
    """The ``tool_result`` block of a ``tool`` message."""
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.get("tool_call_id")}
    found = message.get(PRIVATE)
    private: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    content = message.get("content")
    if "content" in private and content in ("", None):
        if private["content"] != _ABSENT:
            block["content"] = private["content"]
    elif isinstance(content, list):
        block["content"] = [_encode_part(p) for p in content if isinstance(p, Mapping)]
    else:
        block["content"] = "" if content is None else content
    if "is_error" in private:
        block["is_error"] = private["is_error"]
    if isinstance(private.get("extra"), Mapping):
        block.update(private["extra"])
    if CACHE in message:
        block[CACHE] = message[CACHE]
    return block


class _Turn:
    """A turn as the encoder builds it: the content of its one message as given (a string
    stays a string), or once more is added, its blocks in two lists that are only appended
    to: the tool results at its head, and the rest from the first other block on. Results
    go after those at the head, a message's blocks at the end. A join that copied the blocks
    already in the turn made 100,000 messages of one role in a row, or tool results and user
    texts taking turns, quadratic."""

    __slots__ = ("given", "head", "role", "tail")

    def __init__(self, role: str, content: str | list[dict[str, Any]]) -> None:
        self.role = role
        self.given: str | list[dict[str, Any]] | None = content
        self.head: list[dict[str, Any]] = []
        self.tail: list[dict[str, Any]] = []

    def content(self) -> str | list[dict[str, Any]]:
        return self.given if self.given is not None else [*self.head, *self.tail]

    def add(self, blocks: list[dict[str, Any]]) -> None:
        """``blocks`` at the end of the turn."""
        self._split()
        self._append(blocks)

    def add_results(self, blocks: list[dict[str, Any]]) -> None:
        """Tool result ``blocks`` after the results at the head, before anything else."""
        self._split()
        self.head.extend(blocks)

    def _split(self) -> None:
        if self.given is not None:
            given, self.given = self.given, None
            self._append(_as_list(given))

    def _append(self, blocks: list[dict[str, Any]]) -> None:
        at = 0
        if not self.tail:  # the leading results of what is added are still at the turn's head
            at = next((k for k, b in enumerate(blocks) if b.get("type") != "tool_result"), len(blocks))
            self.head.extend(blocks[:at])
        self.tail.extend(blocks[at:])


def _add_results(turns: list[_Turn], blocks: list[dict[str, Any]]) -> None:
    """A run of result ``blocks`` into the last user turn (or a new one), first in it: after
    the results already there, before anything else. A run at once, not block by block: each
    block scanned and copied the turn, and 20,000 results of one turn took a minute."""
    if not blocks:
        return
    if not turns or turns[-1].role != "user":
        turns.append(_Turn("user", list(blocks)))
        return
    turns[-1].add_results(blocks)


def _add_turn(turns: list[_Turn], role: str, content: str | list[dict[str, Any]]) -> None:
    if turns and turns[-1].role == role:
        turns[-1].add(_as_list(content))
        return
    turns.append(_Turn(role, content))


def _as_list(content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return list(content)


def _encode_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    function = tool.get("function")
    if tool.get("type") != "function" or not isinstance(function, Mapping):
        return dict(tool)
    out: dict[str, Any] = {"name": function.get("name")}
    if "description" in function:
        out["description"] = function["description"]
    out["input_schema"] = function.get("parameters") or {"type": "object", "properties": {}}
    private = tool.get(PRIVATE)
    if isinstance(private, Mapping) and isinstance(private.get("extra"), Mapping):
        out.update(private["extra"])
    if CACHE in tool:
        out[CACHE] = tool[CACHE]
    return out


def strip_private(value: Any) -> Any:
    """``value`` (messages, tools) without the codec's private keys: what a caller may keep."""
    if isinstance(value, Mapping):
        return {k: strip_private(v) for k, v in value.items() if k != PRIVATE}
    if isinstance(value, list):
        return [strip_private(v) for v in value]
    return value


# --- validate ----------------------------------------------------------------------------------


def validate(
    request: object, *, original: Mapping[str, Any] | None = None, preserved_thinking: bool = False
) -> list[Problem]:
    """The rules of Anthropic's Messages API that a request (as sent) breaks.

    - the first message is ``user``; roles alternate (only ``user``/``assistant``);
    - every ``tool_use`` is answered by a ``tool_result`` in the next user turn, the results
      first in that turn's blocks; every ``tool_result`` answers a ``tool_use`` of the turn
      right before; tool_use ids are unique;
    - at most 4 ``cache_control`` breakpoints, counting tools and system;
    - text blocks are not empty; thinking blocks carry their ``signature`` (``data`` for
      redacted ones) and sit in assistant turns only;
    - it is JSON data (no ``NaN``, no key that is not a string, nesting within
      :data:`~ctxrules.json_limits.MAX_DEPTH`): if not, only that is reported (in ``original``
      too), as the other checks would have to walk it.

    With ``original`` (the request before ctxrules changed it), signed thinking is checked
    against it: every thinking block is byte-exact one of the original's; the latest assistant
    turn's thinking is the original's, unchanged; and with ``preserved_thinking`` (models that
    keep earlier thinking, whose signature covers the whole prefix) a thinking block is only
    kept when everything before its turn is unchanged (cache markers aside).
    """
    problems: list[Problem] = []
    if not isinstance(request, Mapping):
        return [Problem("", "an Anthropic request is a JSON object")]
    unwritable = _not_json(request, "")
    if original is not None:
        unwritable += _not_json(original, "the original request: ")
    if unwritable:  # the checks below walk and write out the request: not such data
        return unwritable
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        return [Problem("messages", "must be a non-empty list")]
    _check_system(request.get("system"), problems)
    seen_ids: dict[str, str] = {}
    previous_calls: list[str] = []
    previous_role: str | None = None
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            problems.append(Problem(where, "not an object"))
            previous_calls = []
            continue
        role = message.get("role")
        extra = sorted(set(message) - _MESSAGE_KEYS)
        if extra:
            problems.append(Problem(where, f"fields Anthropic does not accept: {', '.join(extra)}"))
        if role not in ("user", "assistant"):
            problems.append(Problem(f"{where}.role", f"must be 'user' or 'assistant', got {role!r}"))
        if i == 0 and role != "user":
            problems.append(Problem(where, "the first message must be a user message"))
        if role == previous_role:
            problems.append(Problem(where, f"two {role} turns in a row (roles must alternate)"))
        content = message.get("content")
        blocks = content if isinstance(content, list) else []
        if not isinstance(content, str | list):
            problems.append(Problem(f"{where}.content", "must be a string or a list of blocks"))
        elif not content and (isinstance(content, list) or role == "user"):
            problems.append(Problem(f"{where}.content", "is empty"))
        elif isinstance(content, str) and not content.strip() and role == "user":
            problems.append(Problem(f"{where}.content", "holds only whitespace"))
        results = [b for b in blocks if isinstance(b, Mapping) and b.get("type") == "tool_result"]
        answered = [b["tool_use_id"] for b in results if isinstance(b.get("tool_use_id"), str)]
        if len(answered) < len(results):
            problems.append(Problem(where, "a tool_result without a string tool_use_id"))
        if role == "user":
            first_other = next(
                (k for k, b in enumerate(blocks) if not (isinstance(b, Mapping) and b.get("type") == "tool_result")),
                len(blocks),
            )
            if any(isinstance(b, Mapping) and b.get("type") == "tool_result" for b in blocks[first_other:]):
                problems.append(Problem(f"{where}.content", "tool_result blocks must come first in the turn"))
            # Sets to look in: a scan of the other list for each of 50,000 parallel calls
            # and their results was quadratic.
            answered_ids, called_ids = set(answered), set(previous_calls)
            for call_id in previous_calls:
                if call_id not in answered_ids:
                    problems.append(Problem(where, f"tool_use {call_id} is not answered in this turn"))
            for result_id in answered:
                if result_id not in called_ids:
                    problems.append(Problem(where, f"tool_result {result_id} answers no tool_use of the turn before"))
            if len(answered_ids) != len(answered):
                problems.append(Problem(where, "a tool_use is answered twice"))
        elif previous_calls:
            problems.append(Problem(where, f"tool_use {', '.join(previous_calls)} not answered by the next turn"))
        if role == "assistant" and results:
            problems.append(Problem(where, "tool_result blocks in an assistant turn"))
        calls: list[str] = []
        for j, block in enumerate(blocks):
            _check_block(f"{where}.content[{j}]", block, role, problems)
            if isinstance(block, Mapping) and block.get("type") == "tool_use":
                use_id = block.get("id")
                if not isinstance(use_id, str) or not use_id:
                    problems.append(Problem(f"{where}.content[{j}]", "tool_use without an id"))
                    continue
                if role != "assistant":
                    problems.append(Problem(f"{where}.content[{j}]", "tool_use in a user turn"))
                if use_id in seen_ids:
                    problems.append(
                        Problem(f"{where}.content[{j}]", f"tool_use id {use_id} reused (first at {seen_ids[use_id]})")
                    )
                else:
                    seen_ids[use_id] = f"{where}.content[{j}]"
                calls.append(use_id)
        previous_calls = calls if role == "assistant" else []
        previous_role = role if isinstance(role, str) else None
    if previous_calls:
        problems.append(
            Problem(
                f"messages[{len(messages) - 1}]",
                "the request ends with unanswered tool_use (assistant prefill cannot call tools)",
            )
        )
    breakpoints = _count_cache(request.get("tools")) + _count_cache(request.get("system")) + _count_cache(messages)
    if breakpoints > MAX_BREAKPOINTS:
        problems.append(
            Problem(
                "", f"{breakpoints} cache_control breakpoints (at most {MAX_BREAKPOINTS}, counting tools and system)"
            )
        )
    if original is not None:
        _check_thinking(request, original, preserved_thinking, problems)
    return problems


def _not_json(value: object, what: str) -> list[Problem]:
    """What in ``value`` no JSON writer takes (nesting past the limit, a key that is not a
    string, ``NaN``, an integer too long, a non-JSON value), each at its JSON pointer."""
    if is_plain(value):
        return []
    return [Problem(short_pointer(p.path), what + p.detail) for p in scan(value).problems]


def _check_system(system: object, problems: list[Problem]) -> None:
    if system is None or isinstance(system, str):
        return
    if not isinstance(system, list) or not all(isinstance(b, Mapping) and b.get("type") == "text" for b in system):
        problems.append(Problem("system", "must be a string or a list of text blocks"))
        return
    for j, block in enumerate(system):
        if not isinstance(block.get("text"), str) or not block["text"]:
            problems.append(Problem(f"system[{j}]", "text blocks must be non-empty"))


def _check_block(where: str, block: object, role: object, problems: list[Problem]) -> None:
    if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
        problems.append(Problem(where, "not a block with a string 'type'"))
        return
    kind = block["type"]
    if kind == "text" and (not isinstance(block.get("text"), str) or not block["text"]):
        problems.append(Problem(where, "text blocks must be non-empty"))
    elif kind == "text" and not block["text"].strip():
        problems.append(Problem(where, "text blocks must contain non-whitespace text"))
    elif kind == "thinking":
        if role != "assistant":
            problems.append(Problem(where, "thinking outside an assistant turn"))
        if not isinstance(block.get("signature"), str) or not block["signature"]:
            problems.append(Problem(where, "a thinking block without its signature"))
        if CACHE in block:
            problems.append(Problem(where, "thinking blocks cannot carry cache_control"))
    elif kind == "redacted_thinking":
        if role != "assistant":
            problems.append(Problem(where, "redacted_thinking outside an assistant turn"))
        if not isinstance(block.get("data"), str) or not block["data"]:
            problems.append(Problem(where, "a redacted_thinking block without its data"))
    elif kind == "tool_result":
        inner = block.get("content")
        if isinstance(inner, list):
            for k, sub in enumerate(inner):
                if (
                    not isinstance(sub, Mapping)
                    or not isinstance(sub.get("type"), str)
                    or sub["type"] not in _RESULT_CONTENT
                ):
                    problems.append(
                        Problem(
                            f"{where}.content[{k}]",
                            "tool_result content holds only text, image, document or search_result",
                        )
                    )
                elif sub.get("type") == "text" and not sub.get("text"):
                    problems.append(Problem(f"{where}.content[{k}]", "text blocks must be non-empty"))
    elif kind == "tool_use" and not isinstance(block.get("input"), Mapping):
        problems.append(Problem(where, "tool_use input must be an object"))


def _count_cache(value: object) -> int:
    if isinstance(value, Mapping):
        return (CACHE in value) + sum(_count_cache(v) for k, v in value.items() if k != CACHE)
    if isinstance(value, list):
        return sum(_count_cache(v) for v in value)
    return 0


def _is_thinking(block: Mapping[str, Any]) -> bool:
    kind = block.get("type")
    return isinstance(kind, str) and kind in _THINKING


def _signature(block: Mapping[str, Any]) -> str | None:
    value = block.get("signature") if block.get("type") == "thinking" else block.get("data")
    return value if isinstance(value, str) and value else None


def _thinking_turns(request: Mapping[str, Any]) -> list[tuple[int, list[Mapping[str, Any]]]]:
    out = []
    messages = request.get("messages")
    for i, message in enumerate(messages if isinstance(messages, list) else []):
        if not isinstance(message, Mapping) or message.get("role") != "assistant":
            continue
        if isinstance(message.get("content"), list):
            thinking = [b for b in message["content"] if isinstance(b, Mapping) and _is_thinking(b)]
            if thinking:
                out.append((i, thinking))
    return out


def _canon(value: Any) -> str:
    return json.dumps(_uncached(value), sort_keys=True, ensure_ascii=False)


def _uncached(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _uncached(v) for k, v in value.items() if k != CACHE}
    if isinstance(value, list):
        return [_uncached(v) for v in value]
    return value


def _same_prefix(messages: list[Any], original: list[Any]) -> int:
    """How many messages at the start of ``messages`` are the original's (cache markers aside):
    what is before turn ``i`` is unchanged when ``i`` is within it and the turn was at ``i``
    in the original too. Counted once, each message written out once: a comparison of the
    whole prefix for each thinking block was quadratic in a long conversation."""
    for k, (mine, theirs) in enumerate(zip(messages, original, strict=False)):
        if _canon(mine) != _canon(theirs):
            return k
    return min(len(messages), len(original))


def _check_thinking(
    request: Mapping[str, Any], original: Mapping[str, Any], preserved: bool, problems: list[Problem]
) -> None:
    before: dict[str, tuple[int, str]] = {}
    found = original.get("messages")
    original_messages = found if isinstance(found, list) else []
    for i, thinking in _thinking_turns(original):
        for block in thinking:
            signature = _signature(block)
            if signature:
                before[signature] = (i, _canon(block))
    messages = list(request.get("messages") or [])
    same = _same_prefix(messages, original_messages) if preserved else 0
    for i, thinking in _thinking_turns(request):
        for block in thinking:
            signature = _signature(block)
            if signature is None:
                continue
            if signature not in before:
                problems.append(Problem(f"messages[{i}]", "a signed thinking block not in the original request"))
                continue
            at, exact = before[signature]
            if _canon(block) != exact:
                problems.append(Problem(f"messages[{i}]", "a signed thinking block was edited"))
            if preserved and (i != at or i > same or _canon(request.get("system")) != _canon(original.get("system"))):
                problems.append(Problem(f"messages[{i}]", "signed thinking kept after its prefix changed"))
    latest = _thinking_turns(original)
    last_assistant = max(
        (k for k, m in enumerate(original_messages) if isinstance(m, Mapping) and m.get("role") == "assistant"),
        default=None,
    )
    if latest and latest[-1][0] == last_assistant:
        want = [_canon(b) for b in latest[-1][1]]
        kept = [t for t in _thinking_turns(request) if [_canon(b) for b in t[1]] == want]
        if not kept:
            problems.append(Problem("messages", "the thinking of the latest assistant turn was changed or dropped"))
