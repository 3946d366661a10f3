"""Message priorities from the pack's ``priorities:`` rules: critical, important, standard.

Each rule has a ``match`` (every given condition must hold; ``{}`` matches everything) and a
``priority``; rules are tried in pack order and the **first match wins**. A message no rule
matches is ``standard``. The compression stages read the result: ``standard`` messages go
first, ``important`` ones last, ``critical`` ones never (only the emergency pass may touch
them).

Conditions (schema: ``$defs/priority`` in ``schemas/rulepack.v1.schema.json``):

``role``
    the message's role; ``tool`` also matches legacy ``function`` results.
``error``
    ``true``: a tool result that reports failure (``ToolRoles.is_error``: a non-zero exit
    code found by the pack's ``tools.exit_code`` patterns, else error-looking text).
    ``false``: any message that is not such a result.
``within_steps``
    the message lies within the newest N steps (docs/reference/concepts.md "step"): its index is at or after
    the assistant message of the N-th newest step, so user or injected messages between those
    steps count too. ``0`` matches nothing; with fewer than N steps, everything from the first
    step on matches.
``tool`` / ``tool_role``
    a tool result whose call has that name (globs, case-sensitive) / role (``tools.roles``),
    or an assistant message with at least one such call.
``contains``
    a regular expression searched in the message text (text parts joined).
``injected``
    the message was injected by ctxrules (summary, notes, reread, placeholders) or not.

Evaluation is one pass over the messages (plus one tool-pairing pass); rules are compiled once
per distinct ``priorities:``/``tools:`` pair and cached.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from fnmatch import fnmatchcase
from functools import lru_cache
from typing import Any, Literal, NamedTuple, TypeAlias

from ctxrules.messages import is_injected, message_text
from ctxrules.patterns import Pattern
from ctxrules.patterns import compile as patterns_compile
from ctxrules.structure import pair_tool_calls
from ctxrules.toolroles import ToolRoles, call_name, tool_roles

__all__ = [
    "PRIORITIES",
    "Priority",
    "PriorityRule",
    "PriorityRules",
    "evaluate_priorities",
    "priority_rank",
    "priority_rules",
]

Priority: TypeAlias = Literal["critical", "important", "standard"]
PRIORITIES: tuple[Priority, ...] = ("critical", "important", "standard")
_RANK: dict[str, int] = {"standard": 0, "important": 1, "critical": 2}
_RESULT_ROLES = frozenset({"tool", "function"})


def priority_rank(priority: str) -> int:
    """0 for standard, 1 for important, 2 for critical (higher = compressed later)."""
    return _RANK[priority]


@dataclass(frozen=True)
class PriorityRule:
    """One compiled ``priorities:`` item."""

    id: str
    priority: Priority
    role: str | None = None
    error: bool | None = None
    within_steps: int | None = None
    tools: tuple[str, ...] | None = None
    tool_role: str | None = None
    contains: Pattern | None = None
    injected: bool | None = None


class _Facts(NamedTuple):
    """What the rules may ask about one message, computed lazily by the evaluator."""

    role: str
    names: tuple[str, ...]


class PriorityRules:
    """The compiled rules of one pack; :meth:`evaluate` gives one priority per message."""

    def __init__(self, rules: Sequence[PriorityRule], roles: ToolRoles) -> None:
        self.rules = tuple(rules)
        self.roles = roles
        self._needs_steps = any(r.within_steps is not None for r in self.rules)
        self._needs_names = any(r.tools is not None or r.tool_role is not None for r in self.rules)
        # Rules that match any message (every condition unset, ``match: {}``).
        conditions = [f.name for f in fields(PriorityRule) if f.name not in ("id", "priority")]
        self._unconditional = {id(r) for r in self.rules if all(getattr(r, name) is None for name in conditions)}

    def __repr__(self) -> str:
        return f"PriorityRules({[r.id for r in self.rules]})"

    def evaluate(self, messages: Sequence[Mapping[str, Any]]) -> list[Priority]:
        """The priority of each message (same order as ``messages``)."""
        if not self.rules:
            return ["standard"] * len(messages)
        names = self._tool_names(messages) if self._needs_names else {}
        starts = self._step_starts(messages) if self._needs_steps else []
        old, priority = self._before_windows(starts, len(messages))
        out: list[Priority] = [priority] * old if priority is not None else []
        for index in range(len(out), len(messages)):
            msg = messages[index]
            facts = _Facts(str(msg.get("role")), names.get(index, ()))
            out.append(self._first_match(index, msg, facts, starts))
        return out

    def _before_windows(self, starts: list[int], count: int) -> tuple[int, Priority | None]:
        """``(end, priority)``: the messages before ``end`` lie outside the step window of every
        rule that has one, so those rules cannot match them, and ``priority`` is what the first
        rule without a window gives each of them when it asks nothing of a message (None when
        it does: they are evaluated one by one). A compaction asks for the priorities of every
        message several times per run; most of a long history is older than any window."""
        end = count
        for rule in self.rules:
            n = rule.within_steps
            if n is not None and n > 0 and starts:  # n <= 0 or no step: the rule never matches
                end = min(end, starts[min(n, len(starts)) - 1])
        for rule in self.rules:
            if rule.within_steps is None:
                return end, rule.priority if id(rule) in self._unconditional else None
        return end, "standard"  # only windowed rules: an older message matches none of them

    def _first_match(self, index: int, msg: Mapping[str, Any], facts: _Facts, starts: list[int]) -> Priority:
        text: str | None = None
        error: bool | None = None
        for rule in self.rules:
            if rule.role is not None and not _role_matches(rule.role, facts.role):
                continue
            if rule.within_steps is not None and not _within(index, rule.within_steps, starts):
                continue
            if rule.injected is not None and is_injected(msg) != rule.injected:
                continue
            if rule.tools is not None and not any(
                fnmatchcase(name, glob) for name in facts.names for glob in rule.tools
            ):
                continue
            if rule.tool_role is not None and not any(
                self.roles.role_of(name) == rule.tool_role for name in facts.names
            ):
                continue
            if rule.error is not None or rule.contains is not None:
                if text is None:
                    text = message_text(msg)
                if rule.error is not None:
                    if error is None:
                        error = facts.role in _RESULT_ROLES and self.roles.is_error(text)
                    if error != rule.error:
                        continue
                if rule.contains is not None and rule.contains.search(text) is None:
                    continue
            return rule.priority
        return "standard"

    @staticmethod
    def _tool_names(messages: Sequence[Mapping[str, Any]]) -> dict[int, tuple[str, ...]]:
        """Tool names per message: an assistant's calls; the call a tool result answers."""
        out: dict[int, tuple[str, ...]] = {}
        for index, msg in enumerate(messages):
            calls = msg.get("tool_calls")
            if msg.get("role") == "assistant" and isinstance(calls, list):
                names = tuple(n for c in calls if isinstance(c, Mapping) and (n := call_name(c)))
                if names:
                    out[index] = names
        if not any(m.get("role") in _RESULT_ROLES for m in messages):
            return out
        pairing = pair_tool_calls(messages)
        for result, (owner, pos) in pairing.call_of.items():
            calls = messages[owner].get("tool_calls") or []
            if pos < len(calls) and isinstance(calls[pos], Mapping):
                name = call_name(calls[pos])
                if name:
                    out[result] = (name,)
        return out

    @staticmethod
    def _step_starts(messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """Index of each step's assistant message, newest first (a step starts at its
        assistant message; pairing is not needed for the boundary)."""
        return [i for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == "assistant"]


def _role_matches(wanted: str, role: str) -> bool:
    return role == wanted or (wanted == "tool" and role == "function")


def _within(index: int, n: int, starts_newest_first: list[int]) -> bool:
    if n <= 0 or not starts_newest_first:
        return False
    boundary = starts_newest_first[min(n, len(starts_newest_first)) - 1]
    return index >= boundary


def priority_rules(pack: Mapping[str, Any]) -> PriorityRules:
    """The compiled ``priorities:`` of a resolved pack (cached per distinct rules and tools)."""
    rules = pack.get("priorities") or []
    key = json.dumps(rules, sort_keys=True, default=str)
    return _compiled(key, tool_roles(pack))


@lru_cache(maxsize=64)
def _compiled(key: str, roles: ToolRoles) -> PriorityRules:
    items = json.loads(key)
    compiled: list[PriorityRule] = []
    for n, item in enumerate(items if isinstance(items, list) else []):
        if not isinstance(item, dict) or item.get("enabled") is False:
            continue
        compiled.append(_compile_rule(n, item))
    return PriorityRules(compiled, roles)


def _compile_rule(n: int, item: Mapping[str, Any]) -> PriorityRule:
    ident = str(item.get("id", f"#{n}"))
    priority = item.get("priority", "standard")
    if priority not in _RANK:
        raise ValueError(f"priorities rule '{ident}': unknown priority {priority!r}")
    match = item.get("match") or {}
    if not isinstance(match, Mapping):
        raise ValueError(f"priorities rule '{ident}': match must be a mapping")
    tools = match.get("tool")
    if isinstance(tools, str):
        tools = [tools]
    contains = match.get("contains")
    try:
        pattern = patterns_compile(contains) if isinstance(contains, str) else None
    except re.error as exc:
        raise ValueError(f"priorities rule '{ident}': contains {contains!r} does not compile: {exc}") from exc
    within = match.get("within_steps")
    return PriorityRule(
        id=ident,
        priority=priority,
        role=match.get("role"),
        error=match.get("error"),
        within_steps=int(within) if within is not None else None,
        tools=tuple(str(t) for t in tools) if tools is not None else None,
        tool_role=match.get("tool_role"),
        contains=pattern,
        injected=match.get("injected"),
    )


def evaluate_priorities(messages: Sequence[Mapping[str, Any]], pack: Mapping[str, Any]) -> list[Priority]:
    """Shortcut: ``priority_rules(pack).evaluate(messages)``."""
    return priority_rules(pack).evaluate(messages)
