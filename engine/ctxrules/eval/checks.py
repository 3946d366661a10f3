"""The invariants ``ctxrules eval`` checks on every call: pairing, pins, and fitting whenever the
pinned messages alone fit. Written apart from the pipeline's own code, so a bug there cannot
hide itself here."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ctxrules.messages import is_real_user

__all__ = ["pairing_problems", "pin_problems"]


def pairing_problems(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every call answered exactly once in the tool block right after it, no orphan result,
    call ids unique across the request."""
    problems: list[str] = []
    seen_ids: set[str] = set()
    i, n = 0, len(messages)
    while i < n:
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
            seen_ids.add(cid)
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
    return problems


def pin_problems(history: Sequence[Mapping[str, Any]], output: Sequence[Mapping[str, Any]]) -> list[str]:
    """The leading system messages, the human anchor and the latest real user message of
    ``history`` are in ``output``, unchanged."""
    problems: list[str] = []
    lead = 0
    while lead < len(history) and history[lead].get("role") in ("system", "developer"):
        lead += 1
    if [dict(m) for m in output[:lead]] != [dict(m) for m in history[:lead]]:
        problems.append("the leading system messages changed")
    users = [m for m in history if is_real_user(m)]
    if users:
        contents = [m.get("content") for m in output if m.get("role") == "user"]
        # The documented exception: when the pinned messages alone reach the emergency
        # threshold, compress.emergency spills their largest contents (marker reason=spill
        # with the original's length) - a pinned user message may stand as its spill.
        spilled = {int(m.group(1)) for c in contents if isinstance(c, str) for m in _SPILL_CHARS.finditer(c)}

        def kept(msg: Mapping[str, Any]) -> bool:
            content = msg.get("content")
            return content in contents or (isinstance(content, str) and len(content) in spilled)

        if not kept(users[0]):
            problems.append("the human anchor is not in the output unchanged")
        if not kept(users[-1]):
            problems.append("the latest real user message is not in the output unchanged")
    return problems


_SPILL_CHARS = re.compile(r"\[ctxrules:elided [^\]\n]*\breason=spill\b[^\]\n]*\bchars=([0-9]{1,18})(?![0-9])")
