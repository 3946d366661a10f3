"""The pipeline runner: stages in order, phases enforced, failures contained.

Order: the integrity stages first (the input may be malformed), then each content stage in
pack order — followed by the integrity stages whenever it changed the messages — then the
finalize stages. ``when:`` is evaluated on the utilization measured just before each stage. A
stage that raises is reported and skipped (``on_error: skip``) or stops the run with the
messages as they were before it (``on_error: fail``); the conversation is never lost.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxrules.errors import CtxrulesError
from ctxrules.messages import message_text
from ctxrules.patterns import remembering
from ctxrules.pipeline.context import StageContext
from ctxrules.stages.base import Message, Stage, StageOutcome, StageType
from ctxrules.structure import replaced
from ctxrules.tokens import TokenCounter
from ctxrules.types import tier_rank


class StageFailed(CtxrulesError):
    """A stage with ``on_error: fail`` raised; the run stops."""

    exit_code = 2


@dataclass
class PlannedStage:
    """A pipeline entry ready to run: the pack item, its type and the configured instance."""

    id: str
    type: StageType
    stage: Stage
    options: dict[str, Any]
    when: dict[str, str] = field(default_factory=dict)
    on_error: str = "skip"
    implicit: bool = False

    @property
    def phase(self) -> str:
        return self.type.phase


@dataclass
class StageRecord:
    """What happened to one stage in one run (a row of the report)."""

    id: str
    type: str
    phase: str
    ran: bool
    reason: str | None = None
    tokens_before: int = 0
    tokens_after: int = 0
    ms: float = 0.0
    actions: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "type": self.type,
            "phase": self.phase,
            "ran": self.ran,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "tokens_saved": self.tokens_before - self.tokens_after,
            "ms": round(self.ms, 3),
            "actions": self.actions,
        }
        if self.reason:
            out["skipped"] = self.reason
        if self.error:
            out["error"] = self.error
        if self.warnings:
            out["warnings"] = self.warnings
        return out


@dataclass
class RunOutcome:
    messages: list[Message]
    tools: list[dict[str, Any]]
    request: dict[str, Any]
    records: list[StageRecord]
    warnings: list[str]
    tokens: int = 0


def when_allows(when: dict[str, str], tier: str) -> bool:
    """Whether a stage's ``when:`` lets it run at ``tier``."""
    return _when_reason(when, tier) is None


def _when_reason(when: dict[str, str], tier: str) -> str | None:
    at_least, below = when.get("at_least"), when.get("below")
    if at_least and tier_rank(tier) < tier_rank(at_least):
        return f"tier `{tier}` is under `{at_least}`"
    if below and tier_rank(tier) >= tier_rank(below):
        return f"tier `{tier}` is not under `{below}`"
    return None


def run_pipeline(
    plan: Sequence[PlannedStage],
    messages: list[Message],
    base: StageContext,
    states: dict[str, dict[str, Any]],
    *,
    known_tokens: int | None = None,
    on_event: Callable[[dict[str, Any]], None] | None = None,
) -> RunOutcome:
    """Run ``plan`` over ``messages``; ``states`` holds each stage's persistent state by id.
    ``known_tokens`` is the prompt size of ``messages`` with ``base.tools`` when the caller
    already knows it (the session does, for a history that was only appended to).
    ``on_event`` receives ``stage.start`` / ``stage.end`` / ``stage.error`` events."""

    def emit(event: str, **fields: Any) -> None:
        if on_event is not None:
            on_event({"event": event, **fields})

    integrity = [p for p in plan if p.phase == "integrity"]
    content = [p for p in plan if p.phase == "content"]
    finalize = [p for p in plan if p.phase == "finalize"]
    records: list[StageRecord] = []
    warnings: list[str] = []
    request: dict[str, Any] = {}
    tools = list(base.tools)
    current = list(messages)
    initial = current  # the first integrity pass may rely on base.valid_prefix
    counted: list[tuple[list[Message], list[dict[str, Any]], int]] = []
    if known_tokens is not None:
        counted.append((current, tools, known_tokens))

    def count(msgs: list[Message]) -> int:
        # Lists are never mutated once made, so a list counted before has the same count.
        if counted and counted[-1][1] is tools:
            last, _, tokens = counted[-1]
            if last is msgs:
                return tokens
            delta = _count_delta(base.counter, last, msgs)
            if delta is not None:
                counted[:] = [(msgs, tools, tokens + delta)]
                return tokens + delta
        tokens = base.counter.count_messages(msgs, tools)
        counted[:] = [(msgs, tools, tokens)]
        return tokens

    def run_one(p: PlannedStage, msgs: list[Message]) -> list[Message]:
        nonlocal tools
        tokens = count(msgs)
        tier = base.budget.tier(tokens)
        record = StageRecord(p.id, p.type.name, p.phase, ran=False, tokens_before=tokens, tokens_after=tokens)
        records.append(record)
        reason = _when_reason(p.when, tier)
        if reason:
            record.reason = reason
            return msgs
        ctx = StageContext(
            stage_id=p.id,
            model=base.model,
            counter=base.counter,
            budget=base.budget,
            vault=base.vault,
            tools=tools,
            pack=base.pack,
            log=base.log.bind(stage=p.id, stage_type=p.type.name),
            tier=tier,
            utilization=base.budget.utilization(tokens),
            state=states.setdefault(p.id, {}),
            session_id=base.session_id,
            protected=base.protected,
            target=str(p.options.get("target", "monitor")),
            clock=base.clock,
            cache_hot=base.cache_hot,
            hooks=base.hooks,
            valid_prefix=base.valid_prefix if msgs is initial else 0,
            compactions=tuple(compactions),
            registry=base.registry,
            cache_key=base.cache_key,
        )
        started = time.perf_counter()
        ctx.log.debug("stage.start", tier=tier, tokens=tokens)
        emit("stage.start", stage=p.id, type=p.type.name, phase=p.phase, tier=tier, tokens=tokens)
        memory = None
        try:
            # Pack patterns that time out are remembered in the stage's state: a rerun skips
            # them at once instead of timing out (or not) again, whatever the machine's load.
            with remembering(ctx.state) as memory:
                outcome = p.stage(msgs, ctx)
            if not isinstance(outcome, StageOutcome):
                raise TypeError(f"stage returned {type(outcome).__name__}, expected StageOutcome")
            result = outcome.messages if p.phase != "finalize" else _finalize_guard(p, msgs, outcome.messages)
            if not _changed(msgs, result):
                result = msgs  # same messages in a new list: keep the list its count belongs to
        except Exception as exc:  # contained: a failing stage never loses the conversation
            record.ms = (time.perf_counter() - started) * 1000
            record.error = f"{type(exc).__name__}: {exc}"
            ctx.log.warning("stage.error", error=record.error)
            emit("stage.error", stage=p.id, type=p.type.name, error=record.error)
            if p.on_error == "fail":
                raise StageFailed(f"stage '{p.id}' ({p.type.name}) failed: {record.error}") from exc
            warnings.append(f"stage '{p.id}' failed and was skipped: {record.error}")
            if memory is not None:
                record.warnings = list(memory.reports)
                warnings.extend(f"{p.id}: {w}" for w in memory.reports if w not in record.error)
            return msgs
        record.ran = True
        record.ms = (time.perf_counter() - started) * 1000
        record.actions = [a.as_dict() for a in outcome.actions]
        timed_out = memory.reports if memory is not None else []
        record.warnings = list(outcome.warnings) + [w for w in timed_out if w not in outcome.warnings]
        warnings.extend(f"{p.id}: {w}" for w in record.warnings)
        if p.phase == "finalize":
            request.update(outcome.request)
            if outcome.tools is not None:
                tools = outcome.tools
        record.tokens_after = count(result)
        ctx.log.debug("stage.end", ms=round(record.ms, 3), saved=record.tokens_before - record.tokens_after)
        emit(
            "stage.end",
            stage=p.id,
            type=p.type.name,
            ms=round(record.ms, 3),
            tokens_before=record.tokens_before,
            tokens_after=record.tokens_after,
            actions=len(record.actions),
        )
        return result

    def integrity_pass(msgs: list[Message]) -> list[Message]:
        for p in integrity:
            msgs = run_one(p, msgs)
        return msgs

    compactions: list[str] = []
    current = integrity_pass(current)
    for p in content:
        before = current
        current = run_one(p, current)
        if records[-1].ran and records[-1].tokens_after < records[-1].tokens_before:
            compactions.append(p.type.name)
        if _changed(before, current):
            current = integrity_pass(current)
    for p in finalize:
        current = run_one(p, current)
    return RunOutcome(current, tools, request, records, warnings, count(current))


def _count_delta(counter: TokenCounter, old: list[Message], new: list[Message]) -> int | None:
    """How many tokens ``new`` has more than ``old`` when it holds the same number of messages
    and only some were replaced: just those are counted (a stage that changes a few messages
    costs a few counts, not a pass over the list). None when the lengths differ or a replaced
    message is (or was) a system message, which changes what the tool schemas cost."""
    if len(old) != len(new):
        return None
    changed = list(replaced(old, new))
    if not changed:
        return 0
    before = [old[i] for i in changed]
    after = [new[i] for i in changed]
    if any(m.get("role") == "system" for m in (*before, *after)):
        return None
    return sum(counter.count_each(after)) - sum(counter.count_each(before))


def _changed(a: list[Message], b: list[Message]) -> bool:
    # map(operator.is_) keeps the per-message identity test in C: it runs after every stage.
    return a is not b and (len(a) != len(b) or not all(map(operator.is_, a, b)))


def _finalize_guard(p: PlannedStage, before: list[Message], after: list[Message]) -> list[Message]:
    """Finalize stages may add markers (e.g. ``cache_control``) but never change text."""
    if len(before) != len(after) or any(
        message_text(before[i]) != message_text(after[i]) for i in replaced(before, after)
    ):
        raise TypeError(f"finalize stage '{p.id}' changed message text; finalize stages may only add markers")
    return after
