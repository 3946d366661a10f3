"""Which messages a compaction replaces (the *span*), chosen by construction.

1. The **protected head** is taken first, before anything is injected: the leading
   system/developer messages and everything up to and including the human anchor (the first
   real user message). No synthetic message can be inside it, so the anchor found here is the
   human's (invariant 2, docs/reference/concepts.md).
2. The rest is cut into **units** that are removed or kept whole: a step (an assistant message
   with its tool results — tool pairs stay intact) or a single other message. A unit that holds
   a pinned message (latest real user message, newest step) or a protected one is *kept*, in
   place.
3. The **tail** — the newest units whose tokens fit the tail budget — is kept verbatim.
4. Between head and tail, units are taken **oldest first** until the estimated size after the
   compaction (current - removed + summary estimate) is below the target tier: hysteresis, the
   span is no larger than it needs to be. Earlier summaries and their bridges are always taken
   when met, so a new summary merges them.

A plan whose span holds nothing but ctxrules' own injected messages is no plan: compacting the
stage's own output again changes nothing (invariant 4).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxrules.messages import injected_kind, is_injected, is_real_user
from ctxrules.summarize.render import BRIDGE_KIND, SUMMARY_KIND

__all__ = ["SpanPlan", "Unit", "plan_span", "protected_head_end", "units_after"]

_LEADING = frozenset({"system", "developer"})
_RESULTS = frozenset({"tool", "function"})


@dataclass(frozen=True)
class Unit:
    """Messages ``start``..``stop-1`` that are removed or kept together."""

    start: int
    stop: int
    tokens: int
    keep: bool = False
    kind: str = "message"  # "step", "message", "summary", "bridge"

    @property
    def indices(self) -> range:
        return range(self.start, self.stop)


@dataclass(frozen=True)
class SpanPlan:
    """``head_end``: messages before it are the protected head. ``remove``: the units the
    summary replaces, in order. ``estimate``: prompt tokens expected after the compaction."""

    head_end: int
    remove: tuple[Unit, ...]
    estimate: int
    reaches_target: bool
    tail_start: int
    notes: tuple[str, ...] = field(default_factory=tuple)
    summary_estimate: int = 0  # the summary's size that ``estimate`` assumes

    @property
    def removed_indices(self) -> list[int]:
        return [i for unit in self.remove for i in unit.indices]

    @property
    def removed_tokens(self) -> int:
        return sum(unit.tokens for unit in self.remove)

    @property
    def prior_summaries(self) -> list[int]:
        return [u.start for u in self.remove if u.kind == "summary"]


def protected_head_end(messages: Sequence[Mapping[str, Any]]) -> int:
    """Index after the protected head: leading system messages and everything up to and
    including the first real user message (or just the leading system messages without one)."""
    n = len(messages)
    lead = 0
    while lead < n and messages[lead].get("role") in _LEADING:
        lead += 1
    anchor = next((i for i in range(lead, n) if is_real_user(messages[i])), None)
    return anchor + 1 if anchor is not None else lead


def units_after(
    messages: Sequence[Mapping[str, Any]],
    start: int,
    tokens: Sequence[int],
    keep: Callable[[int], bool],
) -> list[Unit]:
    """The units of ``messages[start:]`` (``tokens``: each message's count)."""
    units: list[Unit] = []
    i, n = start, len(messages)
    while i < n:
        msg = messages[i]
        role = msg.get("role")
        j = i + 1
        kind = "message"
        if role == "assistant":
            while j < n and messages[j].get("role") in _RESULTS:
                j += 1
            kind = "step"
        if is_injected(msg) and role != "tool":
            injected = injected_kind(msg)
            if injected == SUMMARY_KIND:
                kind = "summary"
            elif injected == BRIDGE_KIND:
                kind = "bridge"
        # A result with no assistant before it (never after the pair stage ran) is kept as is.
        held = any(keep(k) for k in range(i, j)) or role in _RESULTS
        units.append(Unit(i, j, sum(tokens[i:j]), held, kind))
        i = j
    return units


def plan_span(
    messages: Sequence[Mapping[str, Any]],
    *,
    tokens: Sequence[int],
    current: int,
    keep: Callable[[int], bool],
    tail_tokens: int,
    target_tokens: int,
    summary_estimate: int,
) -> SpanPlan | None:
    """The span to compact (``None`` when nothing follows the protected head; an empty
    ``remove`` with a note when nothing is worth compacting).

    ``tokens`` are per-message counts, ``current`` the prompt size now (with tool schemas),
    ``keep(i)`` whether message ``i`` must stay (pinned or protected), ``tail_tokens`` the tail
    budget, ``target_tokens`` the largest size that is below the target tier.
    """
    head_end = protected_head_end(messages)
    units = units_after(messages, head_end, tokens, keep)
    if not units:
        return None
    # The tail: newest units within the tail budget (the newest unit always).
    tail_from = len(units)
    used = 0
    for k in range(len(units) - 1, -1, -1):
        if k < len(units) - 1 and used + units[k].tokens > tail_tokens:
            break
        used += units[k].tokens
        tail_from = k
    tail_start = units[tail_from].start if tail_from < len(units) else len(messages)
    removable = [u for u in units[:tail_from] if not u.keep]
    remove: list[Unit] = []
    removed = 0
    estimate = current
    for unit in removable:
        remove.append(unit)
        removed += unit.tokens
        estimate = current - removed + summary_estimate
        if estimate <= target_tokens and unit.kind not in ("summary", "bridge"):
            break
    if not any(u.kind not in ("summary", "bridge") for u in remove):
        return SpanPlan(
            head_end,
            (),
            current,
            False,
            tail_start,
            (
                "nothing to compact outside the protected head, the tail, pinned and "
                "protected messages, and ctxrules' own summary",
            ),
        )
    if removed <= summary_estimate:
        return SpanPlan(
            head_end,
            (),
            current,
            False,
            tail_start,
            (
                f"the compactable messages hold {removed} tokens, no more than a summary "
                f"is expected to take ({summary_estimate})",
            ),
        )
    return SpanPlan(
        head_end,
        tuple(remove),
        estimate,
        estimate <= target_tokens,
        tail_start,
        summary_estimate=summary_estimate,
    )
