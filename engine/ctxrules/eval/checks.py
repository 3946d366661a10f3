"""The invariants ``ctxrules eval`` checks on every call: pairing, pins, and fitting whenever the
pinned messages alone fit. Written apart from the pipeline's own code, so a bug there cannot
hide itself here."""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from itertools import repeat
from operator import is_
from typing import Any

from ctxrules.eval.shared import shared_prefix
from ctxrules.messages import is_real_user

__all__ = ["Pairing", "Pins", "pairing_problems", "pin_problems"]


def pairing_problems(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every call answered exactly once in the tool block right after it, no orphan result,
    call ids unique across the request."""
    return Pairing()(messages)


class Pairing:
    """:func:`pairing_problems` for the requests of one replay, in order. The walk over a
    request is resumed where it last read a message the request before did not send at the
    same place (the problems and call ids found up to there are kept): a replay of N calls
    walked N²/4 messages."""

    def __init__(self) -> None:
        self._messages: list[Mapping[str, Any]] = []  # the last request
        self._at: list[int] = []  # where each step of the walk started ...
        self._state: list[tuple[int, int]] = []  # ... and (problems, ids) found before it
        self._problems: list[str] = []
        self._ids: list[str] = []  # the call ids, in the order they were first seen
        self._seen: set[str] = set()

    def __call__(self, messages: Sequence[Mapping[str, Any]]) -> list[str]:
        # A step that starts at i has read messages up to i (the step before stopped on it).
        same = shared_prefix(self._messages, messages)
        step = bisect_left(self._at, same) - 1
        i, (found, ids) = (self._at[step], self._state[step]) if step >= 0 else (0, (0, 0))
        del self._at[max(step, 0) :], self._state[max(step, 0) :], self._problems[found:]
        self._seen.difference_update(self._ids[ids:])
        del self._ids[ids:]
        self._messages = list(messages)
        problems, seen_ids = self._problems, self._seen
        n = len(messages)
        while i < n:
            self._at.append(i)
            self._state.append((len(problems), len(self._ids)))
            msg = messages[i]
            role = msg.get("role")
            if role == "tool":
                problems.append(f"message {i}: tool result {msg.get('tool_call_id')!r} answers no call")
                i += 1
                continue
            if role != "assistant" or not msg.get("tool_calls"):
                i += 1
                continue
            wanted: dict[str, int] = {}
            for call in msg.get("tool_calls") or []:
                cid = call.get("id") if isinstance(call, Mapping) else None
                if not isinstance(cid, str) or not cid:
                    problems.append(f"message {i}: a tool call without an id")
                    continue
                if cid in seen_ids:
                    problems.append(f"message {i}: tool call id {cid!r} used before")
                else:
                    seen_ids.add(cid)
                    self._ids.append(cid)
                wanted[cid] = 0
            j = i + 1
            while j < n and messages[j].get("role") == "tool":
                cid = messages[j].get("tool_call_id")
                if cid in wanted:
                    wanted[str(cid)] += 1
                else:
                    problems.append(f"message {j}: tool result {cid!r} answers no call of message {i}")
                j += 1
            for cid, count in wanted.items():
                if count != 1:
                    problems.append(f"message {i}: tool call {cid!r} answered {count} times")
            i = j
        return list(problems)


def pin_problems(history: Sequence[Mapping[str, Any]], output: Sequence[Mapping[str, Any]]) -> list[str]:
    """The leading system messages, the human anchor and the latest real user message of
    ``history`` are in ``output``, unchanged."""
    return Pins(history).problems(len(history), output)


class Pins:
    """:func:`pin_problems` for the calls of one replay: the transcript is walked once, oldest
    first, for its anchor and latest real user message (walking each call's whole history
    again made a replay of N messages N²/4 steps), and a pinned message the output still holds
    as the same object is found without reading the output's contents."""

    def __init__(self, messages: Sequence[Mapping[str, Any]]) -> None:
        self.messages = messages
        self._at = 0
        self._anchor: Mapping[str, Any] | None = None
        self._latest: Mapping[str, Any] | None = None
        lead = 0
        while lead < len(messages) and messages[lead].get("role") in ("system", "developer"):
            lead += 1
        self._lead = lead

    def problems(self, end: int, output: Sequence[Mapping[str, Any]]) -> list[str]:
        """The problems of ``output`` for the history ``messages[:end]`` (``end`` never
        decreases between calls)."""
        for msg in self.messages[self._at : end]:
            if is_real_user(msg):
                if self._anchor is None:
                    self._anchor = msg
                self._latest = msg
        self._at = max(self._at, end)
        problems: list[str] = []
        lead = min(self._lead, end)
        if [_as_read(m) for m in output[:lead]] != [_as_read(m) for m in self.messages[:lead]]:
            problems.append("the leading system messages changed")
        if self._anchor is not None and self._latest is not None:
            kept = _Kept(output)
            if not kept(self._anchor):
                problems.append("the human anchor is not in the output unchanged")
            if not kept(self._latest):
                problems.append("the latest real user message is not in the output unchanged")
        return problems


class _Kept:
    """Whether a user message of the history is in ``output`` unchanged: the same object (a
    user message, so its content is among the output's), or a user message with its content."""

    def __init__(self, output: Sequence[Mapping[str, Any]]) -> None:
        self.output = output
        self._contents: list[Any] | None = None
        self._spilled: set[int] = set()

    def __call__(self, msg: Mapping[str, Any]) -> bool:
        if any(map(is_, reversed(self.output), repeat(msg))):  # the latest ask is near the end
            return True
        if self._contents is None:
            self._contents = [_as_read(m).get("content") for m in self.output if m.get("role") == "user"]
            # The documented exception: when the pinned messages alone reach the emergency
            # threshold, compress.emergency spills their largest contents (marker reason=spill
            # with the original's length) - a pinned user message may stand as its spill.
            self._spilled = {
                int(m.group(1)) for c in self._contents if isinstance(c, str) for m in _SPILL_CHARS.finditer(c)
            }
        content = _as_read(msg).get("content")
        return content in self._contents or (isinstance(content, str) and len(content) in self._spilled)


def _as_read(msg: Mapping[str, Any]) -> dict[str, Any]:
    """``msg`` as the model reads it: without cache breakpoints (``cache_control``), and a
    content that is one text part as that text. On Anthropic models the pack's cache stage puts
    a breakpoint on the system prompt (a string content becomes one marked text part): every
    call of such a replay reported the pinned messages changed, and eval exited 1."""
    out = {k: v for k, v in msg.items() if k != "cache_control"}
    content = out.get("content")
    if isinstance(content, list):
        parts = [{k: v for k, v in p.items() if k != "cache_control"} if isinstance(p, Mapping) else p for p in content]
        only = parts[0] if len(parts) == 1 else None
        if isinstance(only, Mapping) and set(only) == {"type", "text"} and only["type"] == "text":
            out["content"] = only["text"]
        else:
            out["content"] = parts
    return out


_SPILL_CHARS = re.compile(r"\[ctxrules:elided [^\]\n]*\breason=spill\b[^\]\n]*\bchars=([0-9]{1,18})(?![0-9])")
