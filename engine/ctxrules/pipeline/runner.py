"""The pipeline runner: stages in order, phases enforced, failures contained.

Order: the integrity stages first (the input may be malformed), then each content stage in
pack order — followed by the integrity stages whenever it changed the messages — then, for
content stage types marked ``after_compaction``, a second run on the result when a stage after
them changed it (``thinking.clean`` strips signatures whose prefix this call changed), then the
finalize stages. ``when:`` is evaluated on the utilization measured just before each stage. A
stage that raises is reported and skipped (``on_error: skip``) or stops the run with the
messages as they were before it (``on_error: fail``); the conversation is never lost.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxrules.errors import CtxrulesError
from ctxrules.messages import message_text
from ctxrules.patterns import Memory, remembering
from ctxrules.pipeline.context import StageContext
from ctxrules.stages.base import Message, Stage, StageOutcome, StageType
from ctxrules.stores.base import StoreUnavailable
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
    # (the run's logger, this stage's logger bound from it): a warm turn builds no new one.
    _log: tuple[Any, Any] | None = field(default=None, repr=False, compare=False)
    # (options, their target): see ``target``.
    _target: tuple[dict[str, Any], str] | None = field(default=None, repr=False, compare=False)

    def logger(self, base: Any) -> Any:
        """``base`` bound to this stage (remembered while the run's logger is the same)."""
        memo = self._log
        if memo is None or memo[0] is not base:
            memo = self._log = (base, base.bind(stage=self.id, stage_type=self.type.name))
        return memo[1]

    @property
    def phase(self) -> str:
        return self.type.phase

    @property
    def target(self) -> str:
        """The ``target`` tier of its options (``monitor`` by default), as every context gets it."""
        memo = self._target
        if memo is None or memo[0] is not self.options:
            memo = self._target = (self.options, str(self.options.get("target", "monitor")))
        return memo[1]


@dataclass(slots=True)  # one per stage per turn: slots make it cheaper to build and read
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
    # The list the finalize stages started from, and its tokens with the tools as given: the
    # messages of ``messages`` without the markers finalize stages add. A session's next turn
    # runs on it plus the new messages, so that content stages see their last input extended,
    # not a list whose cache breakpoints moved (Anthropic models: every turn).
    basis: list[Message] | None = None
    basis_tokens: int | None = None


def when_allows(when: dict[str, str], tier: str) -> bool:
    """Whether a stage's ``when:`` lets it run at ``tier``."""
    return _when_reason(when, tier) is None


def _when_reason(when: dict[str, str], tier: str) -> str | None:
    key = (tier, when.get("at_least"), when.get("below"))
    try:
        return _WHEN[key]
    except KeyError:
        pass
    reason = _WHEN[key] = _when_verdict(when, tier)
    return reason


# (tier, at_least, below) -> the reason a stage is skipped or None: a few tiers and packs.
_WHEN: dict[tuple[str, str | None, str | None], str | None] = {}


def _when_verdict(when: dict[str, str], tier: str) -> str | None:
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
    return _Run(plan, messages, base, states, known_tokens, on_event).run()


class _Run:
    """One run of a plan: the messages and tools as they stand, what each stage did."""

    def __init__(
        self,
        plan: Sequence[PlannedStage],
        messages: list[Message],
        base: StageContext,
        states: dict[str, dict[str, Any]],
        known_tokens: int | None,
        on_event: Callable[[dict[str, Any]], None] | None,
    ) -> None:
        self.plan, self.base, self.states, self.on_event = plan, base, states, on_event
        self.records: list[StageRecord] = []
        self.warnings: list[str] = []
        self.request: dict[str, Any] = {}
        self.tools = list(base.tools)
        self.initial = list(messages)  # the first integrity pass may rely on base.valid_prefix
        self.compactions: list[str] = []
        self.counted: list[tuple[list[Message], list[dict[str, Any]], int]] = []
        if known_tokens is not None:
            self.counted.append((self.initial, self.tools, known_tokens))
        # Tier and utilization by prompt size: most stages of a turn see the same count.
        self._tiers: dict[int, tuple[str, float]] = {}
        # The fields every stage's context shares (a context is a plain dataclass instance, so
        # one made from these and the few per-stage fields costs a dict copy, not a constructor
        # call with twenty arguments per stage).
        self._shared = {f: getattr(base, f) for f in _SHARED_FIELDS}
        # Asked once per run: a warm turn's stages then make no debug call each (an event
        # below the logger's level costs a call and its keyword dict, twice per stage).
        self._debug = _debug_enabled(base.log)
        self._compactions: tuple[str, ...] = ()

    def run(self) -> RunOutcome:
        integrity, content, finalize = _phases(self.plan)
        current = self._each(integrity, self.initial)
        settled: list[tuple[PlannedStage, list[Message]]] = []  # after_compaction stages, what they left
        for p in content:
            before = current
            current = self._one(p, current)
            record = self.records[-1]
            if record.ran and record.tokens_after < record.tokens_before:
                self.compactions.append(p.type.name)
            if current is not before:  # _one hands back its input list when nothing changed
                current = self._each(integrity, current)
            if p.type.after_compaction and record.ran and not record.error:
                settled.append((p, current))
        for p, left in settled:
            if _changed(left, current):
                before = current
                current = self._one(p, current)
                if current is not before:
                    current = self._each(integrity, current)
        basis, basis_tokens = current, self._count(current)  # with the tools as given
        current = self._each(finalize, current)
        return RunOutcome(
            current, self.tools, self.request, self.records, self.warnings, self._count(current), basis, basis_tokens
        )

    def _each(self, stages: list[PlannedStage], msgs: list[Message]) -> list[Message]:
        for p in stages:
            msgs = self._one(p, msgs)
        return msgs

    def _count(self, msgs: list[Message]) -> int:
        # Lists are never mutated once made, so a list counted before has the same count.
        counted = self.counted
        if counted and counted[-1][1] is self.tools:
            last, _, tokens = counted[-1]
            if last is msgs:
                return tokens
            delta = _count_delta(self.base.counter, last, msgs)
            if delta is not None:
                counted[:] = [(msgs, self.tools, tokens + delta)]
                return tokens + delta
        tokens = self.base.counter.count_messages(msgs, self.tools)
        counted[:] = [(msgs, self.tools, tokens)]
        return tokens

    def _emit(self, event: str, **fields: Any) -> None:
        if self.on_event is not None:
            self.on_event({"event": event, **fields})

    def _context(self, p: PlannedStage, msgs: list[Message], tier: str, utilization: float) -> StageContext:
        ctx: StageContext = object.__new__(StageContext)
        fields = ctx.__dict__
        fields.update(self._shared)
        fields["stage_id"] = p.id
        fields["tools"] = self.tools
        fields["log"] = p.logger(self.base.log)
        fields["tier"] = tier
        fields["utilization"] = utilization
        fields["state"] = self.states.setdefault(p.id, {})
        fields["target"] = p.target
        fields["valid_prefix"] = self.base.valid_prefix if msgs is self.initial else 0
        compactions = self._compactions
        if len(compactions) != len(self.compactions):  # only ever appended to
            compactions = self._compactions = tuple(self.compactions)
        fields["compactions"] = compactions
        return ctx

    def _tier(self, tokens: int) -> tuple[str, float]:
        known = self._tiers.get(tokens)
        if known is None:
            budget = self.base.budget
            utilization = budget.utilization(tokens)
            known = self._tiers[tokens] = (budget.tier_of(utilization), utilization)
        return known

    def _one(self, p: PlannedStage, msgs: list[Message]) -> list[Message]:
        """Run one stage (when its ``when:`` allows); a failure is contained unless on_error: fail."""
        # The common case inline (a warm turn runs this for every stage): the list counted last
        # and a tier already worked out for its count.
        counted = self.counted
        last = counted[-1] if counted else None
        tokens = last[2] if last is not None and last[0] is msgs and last[1] is self.tools else self._count(msgs)
        known = self._tiers.get(tokens)
        tier, utilization = known if known is not None else self._tier(tokens)
        phase = p.type.phase
        record = StageRecord(p.id, p.type.name, phase, False, None, tokens, tokens)
        self.records.append(record)
        if p.when:
            reason = _when_reason(p.when, tier)
            if reason:
                record.reason = reason
                return msgs
        ctx = self._context(p, msgs, tier, utilization)
        started = time.perf_counter()
        if self._debug:
            ctx.log.debug("stage.start", tier=tier, tokens=tokens)
        if self.on_event is not None:
            self._emit("stage.start", stage=p.id, type=p.type.name, phase=phase, tier=tier, tokens=tokens)
        memories: list[Memory] = []  # of each attempt, the failed one's too (timed-out patterns)
        had_state = bool(ctx.state)
        try:
            try:
                outcome, result = self._attempt(p, msgs, ctx, memories)
            except _DATA_ERRORS as first:
                if not had_state:
                    raise
                # Perhaps the state saved by an earlier turn is what broke it (state.json is a
                # cache: damaged, or written by another version): once more from an empty one,
                # or the stage would fail on every later turn of the session.
                saved = self.states[p.id]
                self.states[p.id] = {}
                ctx = self._context(p, msgs, tier, utilization)
                try:
                    outcome, result = self._attempt(p, msgs, ctx, memories)
                except Exception:
                    self.states[p.id] = saved  # not the state's fault: keep it
                    raise first from None
                self.warnings.append(
                    f"stage '{p.id}': its saved state could not be used ({type(first).__name__}: {first}) and was reset"
                )
        except StoreUnavailable:
            # The session's store stopped answering: every later stage would wait its own
            # timeout on it. The turn fails at once (the store's on_error decides what then).
            record.ms = (time.perf_counter() - started) * 1000
            raise
        except Exception as exc:  # contained: a failing stage never loses the conversation
            record.ms = (time.perf_counter() - started) * 1000
            record.error = f"{type(exc).__name__}: {exc}"
            ctx.log.warning("stage.error", error=record.error)
            self._emit("stage.error", stage=p.id, type=p.type.name, error=record.error)
            if p.on_error == "fail":
                raise StageFailed(f"stage '{p.id}' ({p.type.name}) failed: {record.error}") from exc
            self.warnings.append(f"stage '{p.id}' failed and was skipped: {record.error}")
            if memories:
                record.warnings = list(memories[0].reports)
                self.warnings.extend(f"{p.id}: {w}" for w in memories[0].reports if w not in record.error)
            return msgs
        self._ran(p, record, outcome, result, started, ctx, memories[-1].reports)
        return result

    def _attempt(
        self, p: PlannedStage, msgs: list[Message], ctx: StageContext, memories: list[Memory]
    ) -> tuple[StageOutcome, list[Message]]:
        # Pack patterns that time out are remembered in the stage's state: a rerun skips
        # them at once instead of timing out (or not) again, whatever the machine's load.
        with remembering(ctx.state) as memory:
            memories.append(memory)
            outcome = p.stage(msgs, ctx)
        if not isinstance(outcome, StageOutcome):
            raise TypeError(f"stage returned {type(outcome).__name__}, expected StageOutcome")
        result = outcome.messages
        if result is msgs:  # unchanged: the stage handed its input back
            return outcome, result
        if p.type.phase == "finalize":
            result = _finalize_guard(p, msgs, result)
        if not _changed(msgs, result):
            result = msgs  # same messages in a new list: keep the list its count belongs to
        return outcome, result

    def _ran(
        self,
        p: PlannedStage,
        record: StageRecord,
        outcome: StageOutcome,
        result: list[Message],
        started: float,
        ctx: StageContext,
        timed_out: list[str],
    ) -> None:
        """Record what a stage that ran did; a finalize stage's request options and tools apply."""
        record.ran = True
        record.ms = (time.perf_counter() - started) * 1000
        record.actions = [a.as_dict() for a in outcome.actions] if outcome.actions else []
        if outcome.warnings or timed_out:
            record.warnings = list(outcome.warnings) + [w for w in timed_out if w not in outcome.warnings]
            self.warnings.extend(f"{p.id}: {w}" for w in record.warnings)
        if p.type.phase == "finalize":
            self.request.update(outcome.request)
            if outcome.tools is not None:
                self.tools = outcome.tools
        counted = self.counted
        last = counted[-1] if counted else None
        record.tokens_after = (
            last[2] if last is not None and last[0] is result and last[1] is self.tools else self._count(result)
        )
        if self._debug:
            ctx.log.debug("stage.end", ms=round(record.ms, 3), saved=record.tokens_before - record.tokens_after)
        if self.on_event is None:
            return
        self._emit(
            "stage.end",
            stage=p.id,
            type=p.type.name,
            ms=round(record.ms, 3),
            tokens_before=record.tokens_before,
            tokens_after=record.tokens_after,
            actions=len(record.actions),
        )


# StageContext fields a run hands every stage as the session gave them (see _Run._context).
_SHARED_FIELDS = (
    "model",
    "counter",
    "budget",
    "vault",
    "pack",
    "session_id",
    "protected",
    "clock",
    "cache_hot",
    "hooks",
    "registry",
    "cache_key",
    "ledger",
)
_PER_STAGE_FIELDS = frozenset(
    ("stage_id", "tools", "log", "tier", "utilization", "state", "target", "valid_prefix", "compactions")
)
if {f.name for f in dataclasses.fields(StageContext)} != set(_SHARED_FIELDS) | _PER_STAGE_FIELDS:
    raise ImportError("a StageContext field is neither shared nor set per stage in pipeline.runner._Run._context")

_PHASES: dict[int, tuple[tuple[PlannedStage, ...], tuple[list[PlannedStage], ...]]] = {}


def _phases(plan: Sequence[PlannedStage]) -> tuple[list[PlannedStage], ...]:
    """The plan's integrity, content and finalize stages, remembered per plan (an engine runs
    the same plan on every turn); a plan changed since is split again."""
    known = _PHASES.get(id(plan))
    if known is None or len(known[0]) != len(plan) or not all(map(operator.is_, known[0], plan)):
        split = tuple([p for p in plan if p.phase == phase] for phase in ("integrity", "content", "finalize"))
        if len(_PHASES) > 64:
            _PHASES.clear()
        known = _PHASES[id(plan)] = (tuple(plan), split)
    return known[1]


def _debug_enabled(log: Any) -> bool:
    """Whether ``log`` writes debug events (True when it cannot say: then it decides)."""
    try:
        enabled = getattr(log, "is_enabled_for", None)
        return True if enabled is None else bool(enabled(logging.DEBUG))
    except Exception:  # a logger of the application's that cannot answer: let it filter
        return True


# What a stage raises when its saved state holds something it did not expect (a string where
# it counted, a number where it kept a mapping): worth one more try from an empty state.
_DATA_ERRORS = (TypeError, ValueError, KeyError, AttributeError, IndexError)


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
    if after is before:
        return after
    if len(before) != len(after) or any(
        message_text(before[i]) != message_text(after[i]) for i in replaced(before, after)
    ):
        raise TypeError(f"finalize stage '{p.id}' changed message text; finalize stages may only add markers")
    return after
