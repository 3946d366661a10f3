"""``compress.remove``: whole steps leave the context, oldest first, one placeholder per run.

A step (an assistant message with the results of its calls) is removed as a unit — never half
a step, so no call loses its result. Each run of consecutive removed steps becomes one
injected ``user`` message (kind ``removed``) whose marker
``[ctxrules:elided kind=message count=<messages> ref=vault://<id> steps=<n>]`` points at the
JSON of the removed message list in the vault; a placeholder next to newly removed steps is
merged into the new run (its messages are read back from the vault, so one placeholder always
stands for a flat list of original messages).

Why a user message: after a tool result or a user message it joins that user turn (Anthropic
merges consecutive same-role turns; a tool result is a user turn there) and before the next
step's assistant message it keeps user/assistant alternation; OpenAI accepts a user message
anywhere outside a call's result block. An assistant placeholder would merge into the next
assistant turn and put text ahead of its thinking blocks.

Only steps that are entirely outside the tail, unpinned, unprotected and not ``critical`` are
candidates (standard steps first, important last, oldest first), plus injected messages no
other stage owns (an old reread). Real user messages are never removed here (the emergency
pass may). The stage stops as soon as utilization is below ``target``. In a long autonomous
exchange (one user message, hundreds of steps) the older steps go like any others: only the
pins and the tail are kept.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ctxrules.hookspecs import hookimpl
from ctxrules.stages.base import Action, Message, StageOutcome, StageType, unchanged
from ctxrules.stages.compress_common import (
    GUARD_OPTIONS,
    RemovalPlan,
    ThrashGuard,
    View,
    removal_units,
)

if TYPE_CHECKING:
    from ctxrules.pipeline.context import StageContext


@dataclass
class BuiltRemoval:
    """A removal plan built into a message list; nothing is written to the vault yet."""

    plan: RemovalPlan
    messages: list[Message]
    runs: list[tuple[int, int, Message, str]]
    total: int


def plan_removal(view: View, ctx: StageContext, tier: str, *, force: bool) -> BuiltRemoval:
    """Add units in order until the total is below ``tier`` (or no unit is left).

    Units are added on an estimate of the placeholders' size; the exact count is then taken
    on the built list, and more units are added while that is still not below ``tier``.
    Earlier placeholders are read back from the vault (read-only) to be merged.
    """
    units = sorted(removal_units(view, force=force))
    plan = RemovalPlan(view)
    position = 0
    while True:
        while position < len(units) and not view.below(plan.estimate, tier, ctx):
            plan.add(units[position][1])
            position += 1
        messages, runs = plan.build(ctx.vault)
        total = ctx.count(messages) if runs else view.total
        if view.below(total, tier, ctx) or position >= len(units):
            return BuiltRemoval(plan, messages, runs, total)
        plan.add(units[position][1])
        position += 1


def apply_removal(
    view: View, built: BuiltRemoval, ctx: StageContext, label: Callable[[int, int], str] | None = None
) -> list[Action]:
    """Write the removed runs to the vault; one action per run."""
    actions: list[Action] = []
    for start, end, placeholder, payload in built.runs:
        vault_id = ctx.vault.put_text(payload)
        before = sum(view.counts[start : end + 1])
        saved = before - ctx.counter.count_message(placeholder)
        n_steps = sum(1 for i in range(start, end + 1) if view.messages[i].get("role") == "assistant")
        note = label(start, end) if label else ""
        actions.append(
            Action(
                "remove",
                f"messages {start}-{end}: {n_steps} step(s), "
                f"{end - start + 1} message(s) replaced by one "
                f"placeholder{note}",
                index=start,
                tokens_saved=saved,
                vault_id=vault_id,
            )
        )
    return actions


class Remove:
    """The configured stage; see the module docstring."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.guard = ThrashGuard.from_options(options)

    def __call__(self, messages: Sequence[dict[str, Any]], ctx: StageContext) -> StageOutcome:
        view = View.build(messages, ctx)
        if view.below(view.total, ctx.target, ctx):
            return StageOutcome(messages=unchanged(messages))
        built = plan_removal(view, ctx, ctx.target, force=False)
        go, actions, warnings = self.guard.check(view.total - built.total, ctx, "remove")
        if not go:
            return StageOutcome(messages=unchanged(messages), actions=actions, warnings=warnings)
        return StageOutcome(messages=built.messages, actions=apply_removal(view, built, ctx))


STAGE_TYPE = StageType(
    name="compress.remove",
    phase="content",
    hysteresis=True,
    factory=Remove,
    description="Removes whole steps, oldest and lowest priority first, leaving one marked "
    "placeholder per run whose vault entry holds the removed messages.",
    options_schema={
        "type": "object",
        "title": "compress.remove options",
        "description": "When a removal cycle is worth it (the target tier is the runner's 'target' option).",
        "additionalProperties": False,
        "properties": {**GUARD_OPTIONS},
    },
)


@hookimpl
def ctxrules_register_stages(register: Callable[[StageType], None]) -> None:
    register(STAGE_TYPE)
