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

3. **spill pins**: when the pins alone reach the emergency threshold (a newest step holding a
   56K-token tool output at a 32K window) — checked first, so that levels 1 and 2 then keep
   what history still fits, and again after level 2 — their largest contents are spilled,
   largest first — a tool output, a user's paste, the newest assistant text, the long string
   values of a tool call's arguments; never a system/developer message — each going to the
   vault whole and leaving the spill marker and a short preview (``spill_preview_tokens``),
   until the pins are below the emergency threshold. Like the hard spill of
   ``tool_output.filter``, this is an exception to "pinned messages survive unchanged"
   (docs/reference/concepts.md), taken only because the provider would reject the request
   otherwise.

**Guarantee.** After level 2 only the pinned messages (leading system messages, the human
anchor, the latest real user message, the newest step) remain, with at most one placeholder in
each gap between them: the *pinned floor*; level 3 shrinks the pins themselves. Hence the
output is below the emergency threshold unless the system messages (or contents too small to
spill) alone reach it. When it is not, the stage says so in the report's warnings and in an
``overflow`` action: whether the output still fits the usable window (window -
reserve_output) or not even that — the report's ``after.fits`` is false with that reason, and
``ctxrules run`` exits 1. Later stages (``notes.render``, ``reread.recent_files``) keep their
injections below the emergency threshold, so the guarantee holds for the pipeline's output.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ctxrules.hookspecs import hookimpl
from ctxrules.stages.base import Action, StageOutcome, StageType, unchanged
from ctxrules.stages.compress_common import Edit, View, apply_edits, argument_strings, truncate_arguments
from ctxrules.stages.compress_remove import apply_removal, plan_removal
from ctxrules.stages.compress_truncate import TRUNCATE_OPTIONS, TruncateSettings
from ctxrules.structure import pinned_indices
from ctxrules.types import THRESHOLD_NAMES
from ctxrules.vault import is_spill_stand_in

# The instructions are never spilled: without them the request is not the agent's any more.
_NEVER_SPILLED = frozenset({"system", "developer"})
# A spill leaves a marker and a preview; below this size it would not save enough to matter.
_MIN_SPILL_CHARS = 2000
# The candidate "part position" that stands for a message's tool-call arguments.
_CALLS = -1

if TYPE_CHECKING:
    from ctxrules.pipeline.context import StageContext


class Emergency:
    """The configured stage; see the module docstring."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.settings = TruncateSettings(options, "compress.emergency")
        self.spill_preview_tokens = int(options.get("spill_preview_tokens", 400))
        # Not the runner's generic default (monitor): breaking protection is the last resort,
        # so by default it goes only as far as below `full`.
        self.target = str(options.get("target", "full"))

    def __call__(self, messages: Sequence[dict[str, Any]], ctx: StageContext) -> StageOutcome:
        view = View.build(messages, ctx)
        target = self.target
        if view.below(view.total, target, ctx) and view.below(view.total, "emergency", ctx):
            return StageOutcome(messages=unchanged(messages))
        actions: list[Action] = []
        start: Sequence[dict[str, Any]] = messages
        floor = view.total - sum(c for i, c in enumerate(view.counts) if i not in view.pinned)
        if not view.below(floor, "emergency", ctx):
            # Level 3 first: the pins alone cannot fit, so spilling them is unavoidable, and
            # doing it before levels 1-2 keeps whatever history then still fits.
            start, total = self._spill_pins(list(messages), view.total, ctx, actions)
            view = View.build(start, ctx)
            if view.below(view.total, target, ctx):
                return StageOutcome(
                    messages=list(start), actions=actions, warnings=self._verdict(view.total, ctx, actions)
                )
        # Level 1: cut long contents everywhere but in the pins.
        total = view.total
        edits: list[Edit] = []
        for edit in self.settings.edits(view, ctx, force=True):
            if view.below(total, target, ctx):
                break
            edits.append(edit)
            total -= edit.saved
        current, cut = apply_edits(start, edits, ctx)
        actions += cut
        if not view.below(total, target, ctx):
            # Level 2: remove whole units, protected and tail ones included.
            view = View.build(current, ctx)
            built = plan_removal(view, ctx, target, force=True)
            if built.runs:
                actions += apply_removal(view, built, ctx, label=_label(view))
                current = built.messages
                total = built.total
        if not view.below(total, "emergency", ctx):
            # Level 3 (again): what the placeholders and the pins take together still does not fit.
            current, total = self._spill_pins(current, total, ctx, actions)
        warnings = self._verdict(total, ctx, actions)
        return StageOutcome(messages=current, actions=actions, warnings=warnings)

    def _spill_pins(
        self, messages: list[dict[str, Any]], total: int, ctx: StageContext, actions: list[Action]
    ) -> tuple[list[dict[str, Any]], int]:
        out = list(messages)
        pins = pinned_indices(out)
        # (chars, index, part position: None for a string content, CALLS for the tool calls)
        candidates: list[tuple[int, int, int | None]] = []
        for index in pins:
            msg = out[index]
            if msg.get("role") in _NEVER_SPILLED:
                continue
            arguments = sum(map(len, argument_strings(msg)))
            if arguments:
                candidates.append((arguments, index, _CALLS))
            content = msg.get("content")
            if isinstance(content, str):
                candidates.append((len(content), index, None))
            elif isinstance(content, list):
                candidates.extend(
                    (len(p["text"]), index, pos)
                    for pos, p in enumerate(content)
                    if isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str)
                )
        # Tool outputs and the newest assistant text go first (largest first); the human anchor
        # and the latest ask only when that was not enough: they say what the task is.
        candidates.sort(key=lambda c: (out[c[1]].get("role") == "user", -c[0], c[1], -1 if c[2] is None else c[2]))
        preview = self.spill_preview_tokens
        for chars, index, pos in candidates:
            if ctx.budget.utilization(total) < ctx.budget.thresholds["emergency"]:
                break
            if chars < _MIN_SPILL_CHARS:
                continue  # too small for a marker and a preview to save anything
            msg = out[index]
            if pos == _CALLS:
                total = self._spill_arguments(out, index, total, ctx, actions)
                continue
            content = msg["content"]
            text = content if pos is None else content[pos]["text"]
            if is_spill_stand_in(text):
                continue  # spilled already: a stand-in for the stand-in would only add a hop
            vid = ctx.vault.put_text(text)
            what = "tool output" if msg.get("role") in ("tool", "function") else f"pinned {msg.get('role')} message"
            from ctxrules.stages.reduce import spill_summary  # not at import: validate builds the stage only

            summary, fmt = spill_summary(
                text, vault_id=vid, count=ctx.counter.count_text, preview_tokens=preview, what=what
            )
            if len(summary) >= chars:
                continue
            if pos is None:
                new = {**msg, "content": summary}
            else:
                parts = list(content)
                parts[pos] = {**parts[pos], "text": summary}
                new = {**msg, "content": parts}
            before = ctx.counter.count_message(msg)
            after = ctx.counter.count_message(new)
            out[index] = new
            total -= before - after
            actions.append(
                Action(
                    "spill_pinned",
                    f"message {index} (pinned {msg.get('role')}): {chars:,} chars ({fmt}) "
                    "spilled to the vault: the pinned messages alone did not fit",
                    index=index,
                    tokens_saved=before - after,
                    vault_id=vid,
                )
            )
        if out != messages:
            total = ctx.count(out)
        return out, total

    def _spill_arguments(
        self, out: list[dict[str, Any]], index: int, total: int, ctx: StageContext, actions: list[Action]
    ) -> int:
        """The long string values in the tool-call arguments of pinned message ``index`` cut
        to a preview (head + tail, ``spill_preview_tokens`` in all) around a marker; the
        arguments stay valid JSON, the originals go to the vault. Returns the new total."""
        msg = out[index]
        before = ctx.counter.count_message(msg)
        half = max(1, self.spill_preview_tokens // 2)
        cut = truncate_arguments(
            msg, before, max_tokens=self.spill_preview_tokens, head_tokens=half, tail_tokens=half,
            count_text=ctx.counter.count_text,
        )  # fmt: skip
        if cut is None:
            return total  # no string value long enough (or not JSON): nothing a preview can stand for
        new, stored = cut
        after = ctx.counter.count_message(new)
        if after >= before:
            return total
        ids = [ctx.vault.put_text(text) for text in stored]
        out[index] = new
        actions.append(
            Action(
                "spill_pinned",
                f"message {index} (pinned {msg.get('role')}): {len(stored)} tool-call argument value(s), "
                f"{sum(map(len, stored)):,} chars, cut to a preview (the vault keeps them): the pinned "
                "messages alone did not fit",
                index=index,
                tokens_saved=before - after,
                vault_id=ids[0],
            )
        )
        return total - (before - after)

    @staticmethod
    def _verdict(total: int, ctx: StageContext, actions: list[Action]) -> list[str]:
        budget = ctx.budget
        if budget.utilization(total) < budget.thresholds["emergency"]:
            return []
        limit = budget.tokens_at("emergency")
        spilled = any(a.kind == "spill_pinned" for a in actions)
        after = " after spilling their largest contents" if spilled else ""
        if budget.fits(total):
            message = (
                f"the pinned messages alone take {total} tokens{after}, at or above the "
                f"emergency threshold ({limit} tokens); the output still fits the usable "
                f"window ({budget.usable} tokens)"
            )
        else:
            message = (
                f"the pinned messages alone take {total} tokens{after} and do not fit the "
                f"usable window ({budget.usable} tokens of {budget.window}); the provider "
                "will reject this request: raise the window, lower reserve_output, or "
                "shorten the system prompt"
            )
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
    "when the pinned messages alone do not fit, spills their largest contents to the "
    "vault; warns when the output still does not fit.",
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
                "enum": list(THRESHOLD_NAMES),
                "default": "full",
            },
            **TRUNCATE_OPTIONS,
            "spill_preview_tokens": {
                "title": "Pinned spill preview size",
                "description": (
                    "Tokens of the preview a pinned content leaves when the pinned "
                    "messages alone do not fit and it is spilled (level 3)."
                ),
                "type": "integer",
                "minimum": 50,
                "default": 400,
            },
        },
    },
)


@hookimpl
def ctxrules_register_stages(register: Callable[[StageType], None]) -> None:
    register(STAGE_TYPE)
