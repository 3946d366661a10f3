"""``ttl.prune``: tool results past their age go to the vault and leave a placeholder.

A result is **older than** the limit when

- ``max_age_steps``: at least that many steps (docs/reference/concepts.md "step") came after the step it
  belongs to — the newest step has age 0; and/or
- ``max_age_s``: at least that many seconds passed since it was produced. The time comes from
  the message itself when it carries one (``timestamp`` or ``created_at``: epoch seconds,
  epoch milliseconds, or an ISO 8601 string; a naive ISO time is taken as UTC). Chat messages
  usually carry none; then the stage uses the clock at which this session *first saw* the
  result (``ctx.state`` maps a digest of the result to the prepare clock of its first run).

With both limits the first one reached applies. The placeholder is a single marker line whose
ref resolves to the whole original content (the text for a string content, the JSON of the part
list otherwise), on one line::

    [ctxrules:elided kind=lines count=120 ref=vault://<id> reason=ttl tool=Bash
     age_steps=31 tokens=2140]

Its fields depend on the input only (``produced``, epoch seconds, appears when the message
carries its own time): a cold rerun of the same input gives the same bytes.

Never touched: pinned and protected messages, results of ``min_tokens`` or fewer (the
placeholder would cost about as much), and results that are a placeholder already (nothing but
one marker). A result another stage shortened (head, tail and a marker) is archived like any
other: the vault keeps that shortened text, whose own marker still leads to the original.
With ``hot_cache_bypass`` the whole stage is skipped while the provider's prompt cache is hot
and utilization is below ``bypass_below``: pruning then would break a warm cache for little.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ctxrules.hookspecs import hookimpl
from ctxrules.messages import message_text
from ctxrules.stages.base import Action, Message, StageOutcome, StageType
from ctxrules.stages.filter_common import (
    BYPASS_PROPERTIES,
    bypass_active,
    check_options,
    result_digest,
    tokens_saved,
)
from ctxrules.structure import pinned_indices, steps
from ctxrules.toolroles import call_name, calls_by_result
from ctxrules.vault import VaultError, format_marker, parse_marker

if TYPE_CHECKING:
    from ctxrules.pipeline.context import StageContext

__all__ = ["STAGE_TYPE", "TtlPrune", "ctxrules_register_stages", "message_time"]

DEFAULT_MAX_AGE_STEPS = 30
_TIME_KEYS = ("timestamp", "created_at")
_RESULT_ROLES = frozenset({"tool", "function"})


def message_time(msg: Mapping[str, Any]) -> float | None:
    """Epoch seconds from a message's ``timestamp`` / ``created_at``, if it has a usable one."""
    for key in _TIME_KEYS:
        value = msg.get(key)
        if isinstance(value, bool):
            continue
        if isinstance(value, int | float) and math.isfinite(value) and value > 0:
            # Past the year 33658 in seconds is milliseconds in practice (JavaScript clocks).
            return float(value) / 1000.0 if value > 1e12 else float(value)
        if isinstance(value, str) and value.strip():
            try:
                parsed = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
            except ValueError:
                continue
            if parsed.tzinfo is None:
                parsed = parsed.replace(tzinfo=dt.UTC)
            return parsed.timestamp()
    return None


def _is_placeholder(text: str) -> bool:
    """Content that is nothing but one marker: archived already, by this or another stage."""
    try:
        parse_marker(text)
    except VaultError:
        return False
    return True


class TtlPrune:
    """The ``ttl.prune`` stage (see the module docstring)."""

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        opts = check_options(STAGE_TYPE.name, OPTIONS_SCHEMA, options)
        given = dict(options or {})
        self.options = opts
        self.max_age_s: float | None = given.get("max_age_s")
        steps_limit = given.get("max_age_steps")
        if steps_limit is None and self.max_age_s is None:
            steps_limit = DEFAULT_MAX_AGE_STEPS
        self.max_age_steps: int | None = steps_limit
        self.min_tokens: int = opts["min_tokens"]

    def __repr__(self) -> str:
        return f"TtlPrune(max_age_steps={self.max_age_steps}, max_age_s={self.max_age_s})"

    def __call__(self, messages: Sequence[Message], ctx: StageContext) -> StageOutcome:
        out = list(messages)
        first_seen: dict[str, float] = dict(ctx.state.get("first_seen") or {})
        seen_now: dict[str, float] = {}
        born_at: dict[int, float] = {}
        for index, msg in enumerate(messages):
            if msg.get("role") in _RESULT_ROLES:
                born = message_time(msg)
                if born is None:
                    digest = result_digest(msg)
                    born = seen_now[digest] = first_seen.get(digest, ctx.clock)
                born_at[index] = born
        # Only results still in the context are remembered, so the state stays bounded; the
        # clock is recorded even on a bypassed run, so ages stay true.
        ctx.state["first_seen"] = seen_now
        if bypass_active(ctx, self.options):
            return StageOutcome(
                messages=out,
                actions=[
                    Action(
                        "hot_cache_bypass",
                        f"skipped: the prompt cache is hot and utilization is below {self.options['bypass_below']}",
                    )
                ],
            )
        ages = self._step_ages(messages)
        pins = pinned_indices(messages)
        calls = calls_by_result(messages)
        archived: list[tuple[int, str, Message, Message, str]] = []
        for index, born in born_at.items():
            msg = messages[index]
            if index in pins or id(msg) in ctx.protected:
                continue
            reason = self._expired(ages.get(index, 0), ctx.clock - born)
            if reason is None or ctx.counter.count_message(msg) <= self.min_tokens:
                continue
            if _is_placeholder(message_text(msg)):
                continue
            call = calls.get(index)
            tool = call_name(call) if call is not None else msg.get("name")
            new, vid = self._archive(msg, ctx, ages.get(index, 0), tool if isinstance(tool, str) else None)
            out[index] = new
            seen_now.pop(result_digest(msg), None)
            archived.append((index, reason, msg, new, vid))
        # The placeholders counted in one call (dozens of short texts): tokens_saved below and
        # the runner's recount find them counted.
        ctx.counter.count_each([new for _, _, _, new, _ in archived])
        actions = [
            Action(
                "ttl_archived",
                f"message {index}: tool result {reason}",
                index=index,
                tokens_saved=tokens_saved(ctx, msg, new),
                vault_id=vid,
            )
            for index, reason, msg, new, vid in archived
        ]
        return StageOutcome(messages=out, actions=actions)

    def _expired(self, age_steps: int, age_s: float) -> str | None:
        if self.max_age_steps is not None and age_steps >= self.max_age_steps:
            return f"is {age_steps} steps old (max_age_steps {self.max_age_steps})"
        if self.max_age_s is not None and age_s >= self.max_age_s:
            return f"is {age_s:.0f} s old (max_age_s {self.max_age_s:g})"
        return None

    @staticmethod
    def _step_ages(messages: Sequence[Message]) -> dict[int, int]:
        all_steps = steps(messages)
        last = len(all_steps) - 1
        return {result: last - n for n, step in enumerate(all_steps) for result in step.results}

    @staticmethod
    def _archive(msg: Message, ctx: StageContext, age_steps: int, tool: str | None) -> tuple[Message, str]:
        content = msg.get("content")
        if isinstance(content, str):
            vid = ctx.vault.put_text(content)
            # len(text_lines(content)), without making the lines
            kind, count = "lines", content.count("\n") + (0 if not content or content.endswith("\n") else 1)
        else:
            vid = ctx.vault.put_text(json.dumps(content, ensure_ascii=False))
            kind, count = "message", 1
        fields: dict[str, object] = {"reason": "ttl"}
        if tool:
            fields["tool"] = tool
        # Only fields the input decides: the age in steps, and the message's own time when it
        # carries one. An age in seconds (or the clock of the run) would make a cold rerun of
        # the same input give other bytes, and change the cached prefix on every turn.
        fields["age_steps"] = age_steps
        produced = message_time(msg)
        if produced is not None:
            fields["produced"] = int(produced)
        fields["tokens"] = ctx.counter.count_message(msg)
        return {**msg, "content": format_marker(kind, count, vid, lines=None, **fields)}, vid


OPTIONS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "title": "ttl.prune options",
    "description": (
        "How old a tool result may get before it is archived. Without either age "
        f"option, max_age_steps {DEFAULT_MAX_AGE_STEPS} applies."
    ),
    "additionalProperties": False,
    "properties": {
        "max_age_steps": {
            "title": "Maximum age in steps",
            "description": (
                "A tool result is archived once at least this many steps came after "
                "its own (the newest step has age 0)."
            ),
            "type": "integer",
            "minimum": 1,
        },
        "max_age_s": {
            "title": "Maximum age in seconds",
            "description": (
                "A tool result is archived this many seconds after it was produced "
                "(its timestamp/created_at field, else the first prepare that saw "
                "it)."
            ),
            "type": "number",
            "exclusiveMinimum": 0,
        },
        "min_tokens": {
            "title": "Smallest result archived",
            "description": "Results of at most this many tokens are left alone (a placeholder "
            "would cost about as much).",
            "type": "integer",
            "minimum": 0,
            "default": 200,
        },
        **BYPASS_PROPERTIES,
    },
}

STAGE_TYPE = StageType(
    name="ttl.prune",
    phase="content",
    factory=TtlPrune,
    description=(
        "Archives tool results older than a number of steps or seconds to the vault, "
        "leaving a placeholder marker; skipped while the prompt cache is hot."
    ),
    options_schema=OPTIONS_SCHEMA,
)


@hookimpl
def ctxrules_register_stages(register: Callable[[StageType], None]) -> None:
    register(STAGE_TYPE)
