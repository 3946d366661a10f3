"""``compress.truncate``: long contents are cut to head + tail around one elision marker.

A message text over ``max_tokens`` keeps about ``head_tokens`` at the start and
``tail_tokens`` at the end; the lines in between become one marker line whose ref points at
the vault copy of the whole original with the elided line range
(``[ctxrules:elided kind=lines count=N ref=vault://<id>#L<a>-L<b>]``). Text without usable
line breaks is cut by characters (``kind=tokens ... chars=<a>-<b>``). Tool-call arguments are
cut the same way, string value by string value, so they stay valid JSON (Claude Code's
``Write``/``Edit`` calls carry whole files there).

Candidates: tool results, assistant messages and real user messages that are not pinned, not
protected, not ``critical`` and not in the tail, plus injected messages no other stage owns
(e.g. an old reread); system/developer messages are left to the emergency pass. Standard
messages first, important last, oldest first; the stage stops as soon as utilization is
below ``target``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ctxrules.errors import PackError
from ctxrules.hookspecs import hookimpl
from ctxrules.messages import injected_kind, is_injected
from ctxrules.stages.base import StageOutcome, StageType, unchanged
from ctxrules.stages.compress_common import (
    GUARD_OPTIONS,
    OWNED_KINDS,
    Edit,
    ThrashGuard,
    View,
    apply_edits,
    truncate_message,
)

if TYPE_CHECKING:
    from ctxrules.pipeline.context import StageContext

_ROLES = frozenset({"tool", "function", "assistant", "user"})


class TruncateSettings:
    """The cut sizes shared by ``compress.truncate`` and the emergency pass."""

    def __init__(self, options: Mapping[str, Any], stage: str = "compress.truncate") -> None:
        self.max_tokens = int(options.get("max_tokens", 1000))
        self.head_tokens = int(options.get("head_tokens", 300))
        self.tail_tokens = int(options.get("tail_tokens", 200))
        if self.head_tokens + self.tail_tokens >= self.max_tokens:
            # A pack error, reported in one line: JSON Schema cannot compare two options.
            raise PackError(
                f"{stage}: head_tokens + tail_tokens "
                f"({self.head_tokens + self.tail_tokens}) must be below max_tokens "
                f"({self.max_tokens}), or nothing would ever be cut"
            )

    def edits(
        self, view: View, ctx: StageContext, *, force: bool = False, order: Sequence[int] | None = None
    ) -> Iterator[Edit]:
        """Lazily, one edit per candidate in ``order`` (default: every eligible message in
        priority order) that gets shorter; the caller stops when below its target."""
        if order is None:
            order = sorted(
                (
                    i
                    for i in range(len(view.messages))
                    if view.eligible(i, force=force) and self.applies(view, i, force)
                ),
                key=lambda i: view.order_key(i, force=force),
            )
        for index in order:
            tokens = view.counts[index]
            if tokens <= self.max_tokens:
                continue
            msg = view.messages[index]
            result = truncate_message(
                msg,
                tokens,
                max_tokens=self.max_tokens,
                head_tokens=self.head_tokens,
                tail_tokens=self.tail_tokens,
                count_text=ctx.counter.count_text,
            )
            if result is None:
                continue
            new, stored, pieces = result
            saved = tokens - ctx.counter.count_message(new)
            if saved <= 0:
                continue
            why = []
            if force and view.guarded(index):
                why.append("protected" if view.protected[index] else "critical")
            if force and index >= view.tail_start:
                why.append("tail")
            note = f" ({', '.join(why)})" if why else ""
            yield Edit(
                index,
                new,
                saved,
                stored,
                "truncate",
                f"message {index} ({msg.get('role')}, {view.priorities[index]}){note}: "
                f"{pieces} piece{'s' if pieces != 1 else ''} cut to head + tail",
            )

    @staticmethod
    def applies(view: View, index: int, force: bool) -> bool:
        msg = view.messages[index]
        if force:
            return True
        if msg.get("role") not in _ROLES:
            return False
        return not (is_injected(msg) and injected_kind(msg) in OWNED_KINDS)


class Truncate:
    """The configured stage; see the module docstring."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.settings = TruncateSettings(options)
        self.guard = ThrashGuard.from_options(options)

    def __call__(self, messages: Sequence[dict[str, Any]], ctx: StageContext) -> StageOutcome:
        view = View.build(messages, ctx)
        if view.below(view.total, ctx.target, ctx):
            return StageOutcome(messages=unchanged(messages))
        total = view.total
        edits: list[Edit] = []
        for edit in self.settings.edits(view, ctx):
            if view.below(total, ctx.target, ctx):
                break
            edits.append(edit)
            total -= edit.saved
        go, actions, warnings = self.guard.check(view.total - total, ctx, "truncate")
        if not go:
            return StageOutcome(messages=unchanged(messages), actions=actions, warnings=warnings)
        out, actions = apply_edits(messages, edits, ctx)
        return StageOutcome(messages=out, actions=actions)


TRUNCATE_OPTIONS: dict[str, Any] = {
    "max_tokens": {
        "title": "Longest untouched content (tokens)",
        "description": "A message text (or a tool-call argument string) over this many tokens is cut to head + tail.",
        "type": "integer",
        "minimum": 50,
        "default": 1000,
    },
    "head_tokens": {
        "title": "Head kept (tokens)",
        "description": "About this many tokens are kept at the start of a cut content (whole "
        "lines when the text has lines).",
        "type": "integer",
        "minimum": 0,
        "default": 300,
    },
    "tail_tokens": {
        "title": "Tail kept (tokens)",
        "description": "About this many tokens are kept at the end of a cut content (where "
        "errors and summaries usually are).",
        "type": "integer",
        "minimum": 0,
        "default": 200,
    },
}

STAGE_TYPE = StageType(
    name="compress.truncate",
    phase="content",
    hysteresis=True,
    factory=Truncate,
    description="Cuts long message texts and tool-call arguments to head + tail around an "
    "elision marker; the vault keeps the original.",
    options_schema={
        "type": "object",
        "title": "compress.truncate options",
        "description": "How long a content may be and how much of it a cut keeps.",
        "additionalProperties": False,
        "properties": {**TRUNCATE_OPTIONS, **GUARD_OPTIONS},
    },
)


@hookimpl
def ctxrules_register_stages(register: Callable[[StageType], None]) -> None:
    register(STAGE_TYPE)
