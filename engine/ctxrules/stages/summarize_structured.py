"""``summarize.structured``: replace the oldest part of the conversation with a structured summary.

Content phase, with hysteresis: it does nothing when utilization is already below its
``target`` tier (default ``monitor``), and it compacts the smallest span of old messages that
brings the estimate below the target (see :mod:`ctxrules.summarize.span`). Around that:

1. per-session **compaction lock** (a held lock skips the turn, the context is unchanged);
2. **pre-compaction backup**: the whole input list goes to the vault (action ``backup``);
3. the removed messages go to the vault as one JSON list, and the summary carries their
   marker ``[ctxrules:elided kind=message count=<n> ref=vault://<id>]``;
4. the **summarizer** (:mod:`ctxrules.summarize.summarizer`): the pack's models through
   litellm, streaming, audited; or the deterministic checkpoint — at once when no model has
   credentials, and whenever the models fail, time out or are rejected;
5. **incremental merge** into the earlier summary the span contained, **redaction** of the
   result, and its storage in the session state (``summaries``, newest last, redacted);
6. the summary goes in as one marked ``assistant`` message right after the human anchor, with
   a marked bridge user turn where role alternation needs one (see
   :mod:`ctxrules.summarize.render`).

Pinned and protected messages stay where they are (after the summary). What the report shows:
actions ``backup``, ``summarizer`` (one per model tried), ``breaker`` (per model), ``merge``,
``checkpoint`` (why no model wrote the summary), ``summary``; and a warning whenever the
checkpoint was used.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ctxrules.hookspecs import hookimpl
from ctxrules.stages.base import Message, StageOutcome, StageType

if TYPE_CHECKING:
    from ctxrules.pipeline.context import StageContext
    from ctxrules.summarize.llm import Completion

__all__ = ["STAGE_TYPE", "StructuredSummary", "ctxrules_register_stages"]


class StructuredSummary:
    """The configured stage. ``completion`` (Python API, tests) replaces ``litellm.completion``."""

    def __init__(self, options: Mapping[str, Any], *, completion: Completion | None = None) -> None:
        tail = options.get("tail_budget")
        self.tail_budget: float | None = float(tail) if isinstance(tail, int | float) else None
        self.completion = completion

    def __call__(self, messages: Sequence[Message], ctx: StageContext) -> StageOutcome:
        # The compaction code (summarizer, audit, redaction) is imported on the first run:
        # building the stage, which validate does for every pack, needs none of it.
        from ctxrules.stages.summarize_compaction import Compaction

        return Compaction(self.tail_budget, self.completion)(messages, ctx)


OPTIONS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "tail_budget": {
            "title": "Tail budget",
            "description": "Share of the usable window kept verbatim at the end of the "
            "conversation "
            "(the newest steps); never summarized. Default: the pack's context.tail_budget.",
            "type": "number",
            "exclusiveMinimum": 0,
            "exclusiveMaximum": 1,
        },
    },
}

STAGE_TYPE = StageType(
    name="summarize.structured",
    phase="content",
    factory=StructuredSummary,
    options_schema=OPTIONS_SCHEMA,
    description="Replace the oldest messages with an audited, redacted 14-field summary (LLM "
    "through "
    "litellm, or a deterministic checkpoint); originals go to the vault.",
    hysteresis=True,
)


@hookimpl
def ctxrules_register_stages(register: Callable[[StageType], None]) -> None:
    register(STAGE_TYPE)
