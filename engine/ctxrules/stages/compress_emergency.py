"""``compress.emergency``: the safety net at the emergency tier.

The regular stages never touch protected or ``critical`` messages, nor the tail, and they
skip cycles that save too little. When utilization still reaches the emergency threshold,
this pass lifts those limits — only the pins stay untouchable — and works in two levels,
stopping as soon as utilization is below its ``target`` (default ``full``, so the next turn
does not re-trigger it at once):

1. **cut**: long contents (texts and tool-call argument strings) of every unpinned message are
   cut to head + tail (the vault keeps the originals): unprotected standard, then important,
   then protected/critical messages, then the tail; oldest first in each group.
2. **remove**: whole units leave in the same order — steps as ``compress.remove`` removes them,
   and every unpinned loose message (old real user messages, notes, summaries) too — each
   run becoming one placeholder that points at the vault.

**Guarantee.** After level 2 only the pinned messages (leading system messages, the human
anchor, the latest real user message, the newest step) remain, with at most one placeholder in
each gap between them: the *pinned floor*. Hence the output is below the emergency threshold
whenever the pinned floor is — "the pinned messages alone fit". When they do not, the stage
says so in the report's warnings: whether the output still fits the usable window (window -
reserve_output) or not even that. Later stages (``notes.render``, ``reread.recent_files``)
keep their injections below the emergency threshold, so the guarantee holds for the pipeline's
output.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ctxrules.hookspecs import hookimpl
from ctxrules.stages.base import Action, StageOutcome, StageType
from ctxrules.stages.compress_common import Edit, View, apply_edits
from ctxrules.stages.compress_remove import apply_removal, plan_removal
from ctxrules.stages.compress_truncate import TRUNCATE_OPTIONS, TruncateSettings
from ctxrules.types import THRESHOLD_NAMES

if TYPE_CHECKING:
    from ctxrules.pipeline.context import StageContext


class Emergency:
    """The configured stage; see the module docstring."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.settings = TruncateSettings(options, "compress.emergency")
        # Not the runner's generic default (monitor): breaking protection is the last resort,
        # so by default it goes only as far as below `full`.
        self.target = str(options.get("target", "full"))

    def __call__(self, messages: Sequence[dict[str, Any]], ctx: StageContext) -> StageOutcome:
        view = View.build(messages, ctx)
        target = self.target
        if view.below(view.total, target, ctx) and view.below(view.total, "emergency", ctx):
            return StageOutcome(messages=list(messages))
        # Level 1: cut long contents everywhere but in the pins.
        total = view.total
        edits: list[Edit] = []
        for edit in self.settings.edits(view, ctx, force=True):
            if view.below(total, target, ctx):
                break
            edits.append(edit)
            total -= edit.saved
        current, actions = apply_edits(messages, edits, ctx)
        if not view.below(total, target, ctx):
            # Level 2: remove whole units, protected and tail ones included.
            view = View.build(current, ctx)
            built = plan_removal(view, ctx, target, force=True)
            if built.runs:
                actions += apply_removal(view, built, ctx, label=_label(view))
                current = built.messages
                total = built.total
        warnings = self._verdict(total, ctx, actions)
        return StageOutcome(messages=current, actions=actions, warnings=warnings)

    @staticmethod
    def _verdict(total: int, ctx: StageContext, actions: list[Action]) -> list[str]:
        budget = ctx.budget
        if budget.utilization(total) < budget.thresholds["emergency"]:
            return []
        limit = budget.tokens_at("emergency")
        if budget.fits(total):
            message = (f"the pinned messages alone take {total} tokens, at or above the emergency "
                       f"threshold ({limit} tokens); the output still fits the usable window "
                       f"({budget.usable} tokens)")
        else:
            message = (f"the pinned messages alone take {total} tokens and do not fit the "
                       f"usable window ({budget.usable} tokens of {budget.window}); the provider "
                       "will reject this request: raise the window, lower reserve_output, or "
                       "spill the newest tool result")
        actions.append(Action("overflow", message))
        return [message]


def _label(view: View) -> Callable[[int, int], str]:
    def label(start: int, end: int) -> str:
        what = set()
        for i in range(start, end + 1):
            if view.protected[i]:
                what.add("protected")
            elif view.priorities[i] == "critical":
                what.add("critical")
            if i >= view.tail_start:
                what.add("tail")
            if view.messages[i].get("role") == "user" and i not in view.step_of:
                what.add("user message")
        return f" (including {', '.join(sorted(what))})" if what else ""
    return label


STAGE_TYPE = StageType(
    name="compress.emergency",
    phase="content",
    hysteresis=True,
    factory=Emergency,
    description="At the emergency tier, cuts and removes whatever is not pinned (protected, "
                "critical and tail content included) until the output is below its target; "
                "warns when even the pinned messages do not fit.",
    options_schema={
        "type": "object",
        "title": "compress.emergency options",
        "description": "Where the pass stops, and the cut sizes of its first level.",
        "additionalProperties": False,
        "properties": {
            "target": {
                "title": "Target tier",
                "description": "Stop as soon as utilization is below this tier. Default: full "
                               "(protection is broken only as far as needed, with room left "
                               "so the next turn does not re-trigger the pass).",
                "enum": list(THRESHOLD_NAMES), "default": "full",
            },
            **TRUNCATE_OPTIONS,
        },
    },
)


@hookimpl
def ctxrules_register_stages(register: Callable[[StageType], None]) -> None:
    register(STAGE_TYPE)
