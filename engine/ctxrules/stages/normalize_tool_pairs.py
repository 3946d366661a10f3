"""``normalize.tool_pairs``: make every tool call answered exactly once, right after it.

invariant 1 (docs/reference/concepts.md) is what OpenAI and Anthropic both enforce: each ``tool_calls[i].id`` of
an assistant message is answered by exactly one ``tool`` message in the contiguous block that
follows it, and no ``tool`` message answers nothing. Content stages remove and move messages,
and agents crash mid-turn, so this stage runs after all of them (integrity phase, essential).

How it repairs (pairing rule: :mod:`ctxrules.messages`, "Pairing"):

- a result that sits elsewhere is moved into its call's block, which is then laid out in call
  order; a block that is already valid is kept exactly as it is, in its own order;
- a duplicate result (its call is already answered) and an orphan (no call) are dropped;
- an unanswered call gets a synthesized, marked result (``synthesize``), or is removed from
  its assistant message (``remove``); an assistant message left with neither content nor
  calls is dropped. A removed call whose result arrives on a later turn (which runs on the
  last output, where the call is gone) is put back at its place in the message that kept its
  other calls, so that the result is paired as in a run over the whole history;
- a real result that arrives after the call got that synthesized stand-in (later in the list,
  or on a later turn: a session's next turn runs on the last output) answers the call, and
  the stand-in is dropped: the model sees what the tool returned. Only a stand-in signed
  under the session's key counts as one; another is a result like any other;
- a call without an id gets one derived from its position, name and arguments, so the same
  history always gets the same id; a result without ``tool_call_id`` in that message's block
  is matched to such calls in order;
- a call id already used by an earlier call — in the same assistant message or an earlier step
  (Anthropic rejects both) — is renamed ``<id>_<n>`` (the smallest ``n`` ≥ 2 not used yet), and
  its result with it; the first use keeps the id. The renaming depends only on what comes
  before, so appending messages never renames an earlier call (the prompt-cache prefix holds);
- ``function.arguments`` that are not valid JSON (a model cut off mid-call, prose instead of
  JSON) are kept verbatim in the vault and replaced by a JSON object saying so, with the
  marker that brings them back: ``{"ctxrules_invalid_arguments": "[ctxrules:elided kind=json
  ...]", "note": ...}``; blank arguments become ``{}``. Providers that convert the arguments
  (Anthropic's ``tool_use.input``) would reject the request otherwise.

Pinned messages (:func:`ctxrules.structure.pinned_indices`) are kept unchanged: under
``remove``, a pinned assistant message's unanswered calls are answered with a synthesized
result instead. Validity wins over pinning in these cases only, because the request would be
rejected otherwise: an id-less call gets its id, a reused id is renamed (with its result),
invalid arguments are replaced, and a pinned orphan or duplicate result (or a superseded
stand-in) is dropped. The stage is idempotent: its output is valid, and a valid list is
returned as is.

Nothing is lost: :func:`repair_tool_pairs` is pure, and the stage stores every dropped result
and removed call in the session vault, recording the vault id in the action. A superseded
stand-in is not stored: ctxrules wrote it, and the result that replaces it says more.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

from ctxrules import structure
from ctxrules.hookspecs import hookimpl
from ctxrules.json_limits import MAX_DEPTH
from ctxrules.messages import mark_injected, tool_call_id
from ctxrules.stages.base import Action, Message, StageOutcome, StageType, unchanged
from ctxrules.stages.compress_common import text_id
from ctxrules.structure import STAND_IN_KIND, pair_tool_calls, pinned_indices
from ctxrules.vault import format_marker

if TYPE_CHECKING:
    from ctxrules.pipeline.context import StageContext

__all__ = [
    "DERIVED_ID_PREFIX",
    "STAGE_TYPE",
    "ToolPairRepair",
    "UnansweredPolicy",
    "ctxrules_register_stages",
    "repair_tool_pairs",
]

UnansweredPolicy = Literal["synthesize", "remove"]
_POLICIES: tuple[str, ...] = get_args(UnansweredPolicy)

# Action kinds, stable for reports and tests.
ID_ASSIGNED = "call_id_assigned"
RESULT_MOVED = "result_moved"
ORPHAN_DROPPED = "orphan_dropped"
DUPLICATE_DROPPED = "duplicate_dropped"
STAND_IN_REPLACED = "stand_in_replaced"
RESULT_SYNTHESIZED = "result_synthesized"
CALL_REMOVED = "call_removed"
CALL_RESTORED = "call_restored"
MESSAGE_DROPPED = "message_dropped"
EMPTY_CALLS_DROPPED = "empty_tool_calls_dropped"
ID_RENAMED = "call_id_renamed"
ARGUMENTS_REPLACED = "arguments_replaced"

INVALID_ARGUMENTS_KEY = "ctxrules_invalid_arguments"
DERIVED_ID_PREFIX = "call_ctxrules_"
"""How the ids this stage gives id-less calls (and their results) begin."""
_INVALID_NOTE = (
    "The model produced arguments for this call that are not valid JSON; the marker "
    "points at them, verbatim, in the vault."
)


@dataclass(frozen=True)
class _Event:
    """An action plus what left the context (``payload``), which the stage puts in the vault."""

    kind: str
    detail: str
    index: int | None
    payload: str | None = None

    def action(self, vault_id: str | None = None) -> Action:
        return Action(kind=self.kind, detail=self.detail, index=self.index, vault_id=vault_id)


def repair_tool_pairs(
    messages: Sequence[Message],
    *,
    unanswered: UnansweredPolicy = "synthesize",
) -> tuple[list[Message], list[Action]]:
    """Return a new list in which invariant 1 holds, and what was done.

    Pure: the input list and its dicts are not touched, and unchanged messages are the same
    objects in the output. Dropped contents are only described in the actions; the stage
    (:class:`ToolPairRepair`) keeps them in the vault. ``messages`` is expected to have passed
    :func:`ctxrules.messages.validate_messages` (tool calls are objects).
    """
    out, events = _Repair(messages, unanswered).run()
    return out, [event.action() for event in events]


class _Repair:
    """One repair pass; holds the pairing so the per-step helpers stay small."""

    def __init__(self, messages: Sequence[Message], unanswered: UnansweredPolicy) -> None:
        if unanswered not in _POLICIES:
            raise ValueError(f"unanswered must be one of {', '.join(_POLICIES)}, got {unanswered!r}")
        self.messages = messages
        self.unanswered = unanswered
        self.pairing = pair_tool_calls(messages)
        self.pins = pinned_indices(messages)
        self.events: list[_Event] = []
        self.used: set[str] = set()
        """Call ids emitted so far: a later call with one of them is renamed."""
        self.suffix: dict[str, int] = {}
        """For an id renamed before, the ``n`` to try first for it next time: every smaller one
        is in :attr:`used` already (which only grows)."""
        self.removed: dict[str, dict[str, Any]] = {}
        """Calls removed from a message that kept other calls, by id (see :func:`_restored`)."""

    def run(self) -> tuple[list[Message], list[_Event]]:
        out: list[Message] = []
        for index, msg in enumerate(self.messages):
            role = msg.get("role")
            if role == "tool":
                if index not in self.pairing.call_of:
                    self.events.append(self._dropped_result(index, msg))
                # A paired result is emitted in its call's block, right after the call.
                continue
            calls = msg.get("tool_calls")
            if role == "assistant" and isinstance(calls, list):
                out.extend(self._step(index) if calls else self._without_empty_calls(index))
                continue
            out.append(msg)
        return out, self.events

    def _without_empty_calls(self, index: int) -> list[Message]:
        # OpenAI rejects an empty tool_calls array; without the key the message is valid.
        msg = self.messages[index]
        self.events.append(_Event(EMPTY_CALLS_DROPPED, f"message {index}: removed an empty tool_calls list", index))
        return [{k: v for k, v in msg.items() if k != "tool_calls"}]

    def _dropped_result(self, index: int, msg: Message) -> _Event:
        cid = msg.get("tool_call_id")
        if index in self.pairing.superseded:
            assistant, pos = self.pairing.superseded[index]
            return _Event(
                STAND_IN_REPLACED,
                f"message {index}: dropped the interrupted stand-in for call {cid!r} (message "
                f"{assistant}, tool_calls[{pos}]): its real result (message "
                f"{self.pairing.result_of[(assistant, pos)]}) answers it",
                index,
            )
        payload = _content_payload(msg.get("content"))
        if index in self.pairing.duplicates:
            assistant, pos = self.pairing.duplicates[index]
            return _Event(
                DUPLICATE_DROPPED,
                f"message {index}: dropped another result for call {cid!r} "
                f"(message {assistant}, tool_calls[{pos}]); the first one is kept",
                index,
                payload,
            )
        if not isinstance(cid, str) or not cid:
            # ("a tool result for None: no earlier call has that id" said nothing true)
            what = "without a tool_call_id" if cid is None else f"with the tool_call_id {cid!r}"
            detail = f"message {index}: dropped a tool result {what}: it answers no call"
        else:
            detail = f"message {index}: dropped a tool result for {cid!r}: no earlier call has that id"
        return _Event(ORPHAN_DROPPED, detail, index, payload)

    def _step(self, index: int) -> list[Message]:
        """The assistant message at ``index`` followed by exactly one result per call."""
        msg = self.messages[index]
        calls: list[Any] = msg["tool_calls"]
        block_end = index + 1
        while block_end < len(self.messages) and self.messages[block_end].get("role") == "tool":
            block_end += 1
        block = range(index + 1, block_end)
        results = [self.pairing.result_of.get((index, pos)) for pos in range(len(calls))]
        ids = [tool_call_id(call) for call in calls]
        derived = [
            cid if cid is not None else _derived_id(call, pos)
            for pos, (call, cid) in enumerate(zip(calls, ids, strict=True))
        ]
        call_ids = self._unique(derived)
        fixed = [_fixed_arguments(call) for call in calls]
        if (
            None not in ids
            and None not in results
            and set(results) == set(block)
            and not self.pairing.positional.intersection(block)
            and call_ids == ids
            and not any(fixed)
        ):
            # Already valid: keep the block verbatim, in its own order, so that a valid history
            # comes back identical (and the stage is idempotent).
            return [msg, *(self.messages[j] for j in block)]

        assistant = msg
        if None in ids or call_ids != derived or any(fixed):
            assistant = {**msg, "tool_calls": self._with_ids(index, calls, call_ids, derived, fixed)}
            calls = assistant["tool_calls"]

        missing = [pos for pos, result in enumerate(results) if result is None]
        if missing and self.unanswered == "remove" and index not in self.pins:
            return self._remove_calls(index, assistant, results, call_ids, block)

        emitted: list[Message] = [assistant]
        for pos, result_index in enumerate(results):
            if result_index is not None:
                emitted.append(self._placed(result_index, index, call_ids[pos], block))
                continue
            emitted.append(_synthesized(call_ids[pos], _call_name(calls[pos]), derived[pos]))
            pinned_note = ""
            if self.unanswered == "remove":
                pinned_note = " (the message is pinned, so its call is kept)"
            self.events.append(
                _Event(
                    RESULT_SYNTHESIZED,
                    f"message {index}: call {call_ids[pos]!r} ({_call_name(calls[pos])}) was "
                    f"not answered; added an interrupted result{pinned_note}",
                    index,
                )
            )
        return emitted

    def _unique(self, ids: list[str]) -> list[str]:
        """``ids`` with every id already used (earlier, or earlier in this list) renamed."""
        out: list[str] = []
        for cid in ids:
            new = cid
            if new in self.used:
                # Counting up from 2 for each reuse took a step per earlier rename of the same
                # id: 20,000 calls sharing one id (a broken client) took half a minute.
                n = self.suffix.get(cid, 2)
                new = f"{cid}_{n}"
                while new in self.used:
                    n += 1
                    new = f"{cid}_{n}"
                self.suffix[cid] = n + 1
            self.used.add(new)
            out.append(new)
        return out

    def _with_ids(
        self,
        index: int,
        calls: list[Any],
        call_ids: list[str],
        derived: list[str],
        fixed: list[tuple[object, str] | None],
    ) -> list[Any]:
        new_calls: list[Any] = []
        for pos, call in enumerate(calls):
            if not isinstance(call, Mapping):
                new_calls.append(call)
                continue
            new = dict(call)
            if tool_call_id(call) is None:
                self.events.append(
                    _Event(
                        ID_ASSIGNED,
                        f"message {index}: tool_calls[{pos}] ({_call_name(call)}) had no id; assigned {derived[pos]}",
                        index,
                    )
                )
            if call_ids[pos] != derived[pos]:
                self.events.append(
                    _Event(
                        ID_RENAMED,
                        f"message {index}: tool_calls[{pos}] ({_call_name(call)}) reused the id "
                        f"{derived[pos]!r} of an earlier call; renamed it {call_ids[pos]!r} (and its result)",
                        index,
                    )
                )
            new["id"] = call_ids[pos]
            if fixed[pos] is not None:
                original, replacement = fixed[pos]  # type: ignore[misc]
                new["function"] = {**call["function"], "arguments": replacement}
                where = f"message {index}: tool_calls[{pos}] ({_call_name(call)})"
                if not isinstance(original, str):  # an object or null: its JSON text, nothing lost
                    kind = "null" if original is None else "an object"
                    detail = f"{where}: arguments were {kind}, not a JSON string; sent as {replacement[:40]!r}"
                    payload = None
                elif original.strip():
                    size = len(original)
                    detail = (
                        f"{where}: arguments were not valid JSON ({size} chars); replaced by an object that says so"
                    )
                    payload = original
                else:
                    detail, payload = f"{where}: blank arguments became {{}}", None
                self.events.append(_Event(ARGUMENTS_REPLACED, detail, index, payload))
            if new == call:
                new_calls.append(call)
            else:
                new_calls.append(new)
        return new_calls

    def _placed(self, result_index: int, index: int, call_id: str, block: range) -> Message:
        result = self.messages[result_index]
        if result.get("tool_call_id") != call_id:  # id-less, or its call was renamed
            result = {**result, "tool_call_id": call_id}
        if result_index not in block:
            self.events.append(
                _Event(
                    RESULT_MOVED,
                    f"message {result_index}: result for call {call_id!r} moved into the block after message {index}",
                    result_index,
                )
            )
        return result

    def _remove_calls(
        self,
        index: int,
        assistant: Message,
        results: list[int | None],
        call_ids: list[str],
        block: range,
    ) -> list[Message]:
        calls: list[Any] = assistant["tool_calls"]
        removed = [call for call, result in zip(calls, results, strict=True) if result is None]
        names = ", ".join(f"{tool_call_id(call)!r} ({_call_name(call)})" for call in removed)
        self.events.append(
            _Event(
                CALL_REMOVED,
                f"message {index}: removed {len(removed)} unanswered call(s): {names}",
                index,
                _json(removed),
            )
        )
        answered = [(pos, r) for pos, r in enumerate(results) if r is not None]
        if answered:
            kept: Message = {**assistant, "tool_calls": [calls[pos] for pos, _ in answered]}
            record = {"kept": [call_ids[pos] for pos, _ in answered], "order": list(call_ids)}
            for pos, result in enumerate(results):
                if result is None:
                    self.removed[call_ids[pos]] = {**record, "call": calls[pos]}
            return [kept, *(self._placed(r, index, call_ids[pos], block) for pos, r in answered)]
        bare = {k: v for k, v in assistant.items() if k != "tool_calls"}
        if not _is_empty_assistant(bare):
            return [bare]
        self.events.append(
            _Event(
                MESSAGE_DROPPED,
                f"message {index}: dropped the assistant message: empty once its calls were removed",
                index,
                _json(self.messages[index]),
            )
        )
        return []


# --- helpers --------------------------------------------------------------------------------


def _derived_id(call: object, pos: int) -> str:
    """A stable id for an id-less call: the same history always yields the same id.

    The message index is left out on purpose: content stages shift indices, and an id that
    changed with them would break the prompt-cache prefix on every call.
    """
    function = call.get("function") if isinstance(call, Mapping) else None
    name = function.get("name") if isinstance(function, Mapping) else None
    arguments = function.get("arguments") if isinstance(function, Mapping) else None
    seed = json.dumps([pos, name, arguments], ensure_ascii=False, sort_keys=True, default=str)
    return DERIVED_ID_PREFIX + hashlib.sha256(seed.encode("utf-8", "surrogatepass")).hexdigest()[:24]


def _fixed_arguments(call: object) -> tuple[object, str] | None:
    """``(original, replacement)`` when the call's ``function.arguments`` is not a JSON string:
    text that does not parse, blank text, or an object or null where the wire format holds a
    string (invariant 7; some clients pass the parsed object, and OpenAI refuses it)."""
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping) or (isinstance(call, Mapping) and call.get("type") == "custom"):
        return None
    arguments = function.get("arguments")
    if isinstance(arguments, Mapping):
        return arguments, json.dumps(arguments, ensure_ascii=False)
    if arguments is None:
        return None, "{}"
    if not isinstance(arguments, str) or (arguments[:1] in _JSON_OPENERS and _is_json(arguments)):
        return None
    if not arguments.strip():
        return arguments, "{}"
    if _is_json(arguments):
        return None
    marker = format_marker("json", len(arguments), text_id(arguments), reason="invalid_arguments")
    return arguments, json.dumps({INVALID_ARGUMENTS_KEY: marker, "note": _INVALID_NOTE}, ensure_ascii=False)


_JSON_OPENERS = frozenset("{[")


def _is_json(text: str) -> bool:
    # The integrity pass runs after every content stage that changed something, over the same
    # unchanged arguments strings: each is parsed once.
    # Long ones in a memo of their own, a few entries: one holds its text alive, and a text
    # with many brackets is also walked for its depth (in Python).
    if len(text) > _JSON_MEMO_MAX_CHARS:
        return _parses_long(text)
    return _parses_memo(text)


def _parses(text: str) -> bool:
    """Whether ``json.loads(text)`` succeeds on a value nested at most ``MAX_DEPTH`` levels. Its
    scanner is called directly: ``loads`` wraps it in Python (two whitespace regex matches, the
    decoder's methods), which with the caches cold cost more than scanning a call's arguments;
    the verdict is the same (JSON whitespace around one value, nothing else; a BOM fails the
    scan as it fails ``loads``).

    Deeper nesting counts as not JSON (it goes to the vault like other unusable arguments):
    the scanner recurses, so near Python's recursion limit its verdict would depend on how deep
    the caller's stack happens to be, and past it it raises ``RecursionError``."""
    start = len(text) - len(text.lstrip(_JSON_SPACE))
    try:
        _, end = _SCAN(text, start)
    except (StopIteration, ValueError, RecursionError):
        return False
    if text[end:].strip(_JSON_SPACE):
        return False
    # It parsed here; at a few hundred levels it might not have with a deeper stack.
    return text.count("[") + text.count("{") <= MAX_DEPTH or not _deeper_than(text, MAX_DEPTH)


# A JSON string (skipped whole: brackets inside it do not nest) or a bracket.
_NESTING_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def _deeper_than(text: str, limit: int) -> bool:
    """Whether arrays and objects in the JSON ``text`` nest more than ``limit`` levels deep
    (stops at the first bracket past it). Only called for texts with more brackets than that."""
    depth = 0
    for match in _NESTING_TOKEN.finditer(text):
        token = match.group()
        if token == "[" or token == "{":
            depth += 1
            if depth > limit:
                return True
        elif token == "]" or token == "}":
            depth -= 1
    return False


_JSON_SPACE = " \t\n\r"


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # 1e400: read as infinity, written back as `Infinity`, which is not JSON
        raise ValueError(f"{text} overflows a double")
    return value


# `NaN`, `Infinity` and `-Infinity` are Python's, not JSON: a provider (or litellm converting
# the history for another one) that parses the arguments refuses them.
_SCAN: Callable[[str, int], tuple[Any, int]] = json.decoder.JSONDecoder(  # type: ignore[attr-defined]
    parse_constant=_not_json, parse_float=_finite
).scan_once


_JSON_MEMO_MAX_CHARS = 65_536
_parses_memo = functools.lru_cache(maxsize=4096)(_parses)
_parses_long = functools.lru_cache(maxsize=8)(_parses)


def _call_name(call: object) -> str:
    if isinstance(call, Mapping):
        for key in ("function", "custom"):
            inner = call.get(key)
            if isinstance(inner, Mapping) and isinstance(inner.get("name"), str):
                return str(inner["name"])
    return "?"


def _synthesized(call_id: str, name: str, given: str | None = None) -> Message:
    """The stand-in result of an unanswered call. When the repair renamed the call's id
    (``given`` is the id the agent gave it), the tag says so (``call``): the real result,
    arriving later with the agent's id, then answers the renamed call."""
    result: Message = {
        "role": "tool",
        "tool_call_id": call_id,
        "content": (
            f"[ctxrules:interrupted] tool call was not answered: no result was recorded for "
            f"{name} (call {call_id}). Run it again if its result is still needed."
        ),
    }
    return mark_injected(result, STAND_IN_KIND, call=given if given is not None and given != call_id else None)


def _is_empty_assistant(msg: Mapping[str, Any]) -> bool:
    """No content an API would accept on its own (text, parts, legacy call, refusal, audio)."""
    if any(msg.get(key) for key in ("function_call", "refusal", "audio")):
        return False
    content = msg.get("content")
    if isinstance(content, str):
        return not content.strip()
    if isinstance(content, list):
        return all(
            isinstance(part, Mapping) and part.get("type") == "text" and not str(part.get("text") or "").strip()
            for part in content
        )
    return content is None


def _content_payload(content: object) -> str:
    """What the vault keeps for a dropped result: text as is, anything else as JSON."""
    return content if isinstance(content, str) else _json(content)


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


# --- the stage ------------------------------------------------------------------------------


def already_valid(messages: Sequence[Mapping[str, Any]], start: int = 0) -> bool:
    """True when invariants 1 and 7 already hold and nothing else needs repair: every call has
    an id used by no other call, answered exactly once in the block right after it, with JSON
    arguments; no tool result stands elsewhere, no ``tool_calls`` list is empty and no
    assistant message is empty. Conservative: False only means "run the full repair"."""
    n = len(messages)
    i = min(max(start, 0), n)
    # Messages before ``start`` are known valid; scanning resumes at the assistant message whose
    # block ``start`` may extend (a result appended right after a valid prefix belongs to it).
    while i > 0 and messages[i - 1].get("role") in ("tool", "function"):
        i -= 1
    if i > 0 and messages[i - 1].get("role") == "assistant":
        i -= 1
    before: AbstractSet[str] | None = None  # call ids before the scan, gathered when a call needs them
    used: set[str] = set()  # call ids of the scan so far
    while i < n:
        msg = messages[i]
        role = msg.get("role")
        if role in ("tool", "function"):
            return False
        if role == "assistant":
            calls = msg.get("tool_calls")
            if calls is None:
                if _is_empty_assistant(msg):
                    return False
                i += 1
                continue
            if not calls:
                return False
            if before is None:
                before = _ids_before(messages, i)
            ids = []
            for call in calls:
                cid = call.get("id") if isinstance(call, Mapping) else None
                if (
                    not isinstance(cid, str)
                    or not cid
                    or cid in used
                    or cid in before
                    or _fixed_arguments(call) is not None
                ):
                    return False
                ids.append(cid)
                used.add(cid)
            j = i + 1
            answered = []
            while j < n and messages[j].get("role") in ("tool", "function"):
                if messages[j].get("role") != "tool":
                    return False
                answered.append(messages[j].get("tool_call_id"))
                j += 1
            if len(answered) != len(ids) or set(answered) != set(ids) or len(set(ids)) != len(ids):
                return False
            i = j
            continue
        i += 1
    return True


# The last list this stage found valid (and the structure generation then): the pipeline runs
# the stage again after every content stage that changed something, and a stage that only
# rewrote results' or messages' text left the pairing as it was.
_LAST_VALID: list[tuple[list[Mapping[str, Any]], int]] = []


def _follows_valid(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether ``messages`` is the last list found valid with some messages replaced by ones
    that cannot break what :func:`already_valid` checks: a result answering the same call, an
    assistant message with the very same ``tool_calls`` (or none, and not empty), any other
    message of the same role. Conservative: False only means "scan"."""
    if not _LAST_VALID:
        return False
    last, generation = _LAST_VALID[0]
    if generation != structure.generation() or len(last) != len(messages):
        return False
    for i in [i for i, same in enumerate(map(operator.is_, last, messages)) if not same]:
        old, new = last[i], messages[i]
        role = new.get("role")
        if role != old.get("role"):
            return False
        if role in ("tool", "function"):
            if new.get("tool_call_id") != old.get("tool_call_id"):
                return False
        elif role == "assistant":
            calls = new.get("tool_calls")
            if calls is not old.get("tool_calls") or (calls is None and _is_empty_assistant(new)):
                return False
    return True


_PREFIX_IDS: dict[int, tuple[Mapping[str, Any], int, set[str]]] = {}
_PREFIX_IDS_KEEP = 16


def _ids_before(messages: Sequence[Mapping[str, Any]], end: int) -> AbstractSet[str]:
    """The call ids of ``messages[:end]``, remembered by the last message object and ``end``:
    on a warm turn the scan asks about the same valid prefix after every content stage, and a
    prefix of hundreds of steps would otherwise be walked each time. (A prefix whose last
    object and length match but whose earlier steps were removed yields extra ids: a
    conservative "run the full repair".)

    The next turn's prefix extends this turn's: the set of the longest remembered prefix it
    extends moves to the new prefix and gets the ids of the appended messages, in place (a
    copy would cost a pass over every id of the session). Extra ids can only make
    :func:`already_valid` say "run the full repair", so a set that two threads grow at once
    errs on the safe side."""
    if end <= 0:
        return frozenset()
    last = messages[end - 1]
    hit = _PREFIX_IDS.get(id(last))
    if hit is not None and hit[0] is last and hit[1] == end:
        return hit[2]
    start, base, base_key = 0, None, None
    for key, (obj, n, ids) in list(_PREFIX_IDS.items()):
        if start < n <= end and messages[n - 1] is obj:
            start, base, base_key = n, ids, key
    if base_key is not None:
        _PREFIX_IDS.pop(base_key, None)  # its set becomes the new prefix's
    grown = base if base is not None else set()
    grown.update(
        cid
        for m in messages[start:end]
        if m.get("role") == "assistant"
        for cid in map(tool_call_id, m.get("tool_calls") or ())
        if cid is not None
    )
    if len(_PREFIX_IDS) >= _PREFIX_IDS_KEEP:
        _PREFIX_IDS.clear()
    _PREFIX_IDS[id(last)] = (last, end, grown)
    return grown


class ToolPairRepair:
    """The ``normalize.tool_pairs`` stage: :func:`repair_tool_pairs` plus the vault.

    Options (``with:``): ``unanswered: synthesize | remove`` (default ``synthesize``).
    """

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        options = dict(options or {})
        unknown = sorted(set(options) - {"unanswered"})
        if unknown:
            raise ValueError(f"normalize.tool_pairs: unknown option(s) {', '.join(unknown)}")
        policy = options.get("unanswered", "synthesize")
        if policy not in _POLICIES:
            raise ValueError(f"normalize.tool_pairs: unanswered must be one of {', '.join(_POLICIES)}, got {policy!r}")
        self.unanswered: UnansweredPolicy = policy

    def __repr__(self) -> str:
        return f"ToolPairRepair(unanswered={self.unanswered!r})"

    def __call__(self, messages: Sequence[Message], ctx: StageContext) -> StageOutcome:
        if _follows_valid(messages) or already_valid(messages, ctx.valid_prefix):
            _LAST_VALID[:] = [(list(messages), structure.generation())]
            # The common case on every call: nothing to repair. A single cheap scan keeps the
            # warm path of `prepare` fast; the full pairing only runs when something is off.
            return StageOutcome(messages=unchanged(messages))
        records = _records(ctx.state.get(_REMOVED_KEY)) if self.unanswered == "remove" else {}
        given, restored = _restored(messages, records) if records else (messages, [])
        repair = _Repair(given, self.unanswered)
        out, events = repair.run()
        actions = [
            Action(
                CALL_RESTORED, f"message {index}: put back call {cid!r}: its result came after it was removed", index
            )
            for index, cid in restored
        ]
        actions.extend(
            event.action(ctx.vault.put_text(event.payload) if event.payload is not None else None) for event in events
        )
        if self.unanswered == "remove" and (restored or repair.removed):
            for _, cid in restored:
                records.pop(cid, None)
            records.update(repair.removed)
            ctx.state[_REMOVED_KEY] = dict(list(records.items())[-_REMOVED_KEPT:])
        return StageOutcome(messages=out, actions=actions)


# Under ``unanswered: remove``, what a later turn needs to put a removed call back when its
# result arrives after all (a session's next turn runs on the last output, where the call is
# gone): per removed call id, the ids of the calls its message kept (which find the message),
# the ids of all its calls in order, and the call itself. Only calls whose message kept other
# calls are recorded; the newest _REMOVED_KEPT stay.
_REMOVED_KEY = "removed_calls"
_REMOVED_KEPT = 256


def _records(value: object) -> dict[str, dict[str, Any]]:
    """The usable records of the stage's state (a damaged or edited state.json: fewer)."""
    if not isinstance(value, dict):
        return {}
    out: dict[str, dict[str, Any]] = {}
    for cid, record in value.items():
        if not isinstance(record, dict):
            continue
        kept, order, call = record.get("kept"), record.get("order"), record.get("call")
        if not (
            isinstance(kept, list)
            and kept
            and isinstance(order, list)
            and all(isinstance(i, str) for i in (*kept, *order))
            and cid in order
            and set(kept) <= set(order)
            and isinstance(call, dict)
            and tool_call_id(call) == cid
            and isinstance(call.get("function"), dict)
            and isinstance(call["function"].get("name"), str)
            and isinstance(call["function"].get("arguments"), str)
        ):
            continue
        out[cid] = record
    return out


def _restored(
    messages: Sequence[Message], records: Mapping[str, Mapping[str, Any]]
) -> tuple[list[Message], list[tuple[int, str]]]:
    """``messages`` with each removed call put back whose result is there while the call is
    not (a result that came after the call was removed), into the message that kept the other
    calls, at its place among them: what a run over the whole history keeps, since there the
    call has its result. Returns the list and ``(message index, call id)`` of each call put back."""
    present: set[str] = set()
    answers: set[str] = set()
    for msg in messages:
        if msg.get("role") == "assistant":
            present.update(i for c in msg.get("tool_calls") or () if (i := tool_call_id(c)) is not None)
        elif msg.get("role") == "tool" and isinstance(msg.get("tool_call_id"), str):
            answers.add(msg["tool_call_id"])
    late = (answers & records.keys()) - present
    if not late:
        return list(messages), []
    # A removal's records name the calls its message kept; any of them finds the message (ids
    # are unique in a repaired list), also once another of its removed calls was put back.
    by_anchor: dict[str, list[str]] = {}
    for cid in sorted(late):
        by_anchor.setdefault(records[cid]["kept"][0], []).append(cid)
    out = list(messages)
    restored: list[tuple[int, str]] = []
    for index, msg in enumerate(messages):
        calls = msg.get("tool_calls")
        if msg.get("role") != "assistant" or not isinstance(calls, list) or not calls:
            continue
        current = {tool_call_id(c): c for c in calls}
        back = next((by_anchor.pop(i) for i in current if i in by_anchor), None)
        if back is None:
            continue
        order = records[back[0]]["order"]
        back = [cid for cid in back if records[cid]["order"] == order]  # one removal's records
        if not set(current) <= set(order):
            continue  # not the message the calls were removed from
        wanted = {*current, *back}
        out[index] = {
            **msg,
            "tool_calls": [current[i] if i in current else records[i]["call"] for i in order if i in wanted],
        }
        restored.extend((index, cid) for cid in back)
    return out, restored


STAGE_TYPE = StageType(
    name="normalize.tool_pairs",
    phase="integrity",
    essential=True,
    factory=ToolPairRepair,
    description=(
        "Pairs tool calls and results by id so that every call is answered exactly once in "
        "the block right after it and no result is orphaned; dropped results go to the vault."
    ),
    options_schema={
        "type": "object",
        "title": "normalize.tool_pairs options",
        "description": "How tool calls and their results are repaired.",
        "additionalProperties": False,
        "properties": {
            "unanswered": {
                "title": "Unanswered tool calls",
                "description": (
                    "What to do with a tool call that has no result: 'synthesize' adds a marked "
                    "'interrupted' tool result; 'remove' removes the call from its assistant "
                    "message (a pinned message keeps its call and gets a synthesized result)."
                ),
                "type": "string",
                "enum": list(_POLICIES),
                "default": "synthesize",
            },
        },
    },
)


@hookimpl
def ctxrules_register_stages(register: Callable[[StageType], None]) -> None:
    """Built-ins register through the same hook as third-party plugins (see ``plugins``)."""
    register(STAGE_TYPE)
