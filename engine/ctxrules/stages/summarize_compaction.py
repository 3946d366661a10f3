"""The work of the ``summarize.structured`` stage (see :mod:`ctxrules.stages.summarize_structured`
for what it does): span, lock, backup, summarizer, merge, redaction, storage.

Kept apart from the stage type so that building the stage (``validate`` builds every stage of
every pack) imports none of the summarizer, the audit or the redaction patterns.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ctxrules.errors import CtxrulesError
from ctxrules.messages import injected_kind, injected_meta, is_injected, is_real_user, message_text
from ctxrules.redaction import Redactor, redactor_for
from ctxrules.stages.base import Action, Message, StageOutcome
from ctxrules.structure import pinned_indices
from ctxrules.summarize.checkpoint import build_checkpoint
from ctxrules.summarize.config import SummarizerConfig
from ctxrules.summarize.llm import Completion
from ctxrules.summarize.merge import merge_summaries
from ctxrules.summarize.model import Summary, validate_summary
from ctxrules.summarize.render import (
    BRIDGE_KIND,
    SUMMARY_KIND,
    bridge_message,
    parse_rendered,
    summary_message,
)
from ctxrules.summarize.span import SpanPlan, plan_span
from ctxrules.summarize.summarizer import Summarizer, SummarizeResult
from ctxrules.toolroles import tool_roles
from ctxrules.vault import VaultError, format_marker

if TYPE_CHECKING:
    from ctxrules.models import ModelInfo
    from ctxrules.pipeline.context import StageContext

__all__ = ["KEEP_SUMMARIES", "SUMMARY_ESTIMATE_CAP", "Compaction"]

KEEP_SUMMARIES = 8
"""How many summaries the session state keeps (newest last)."""
SUMMARY_ESTIMATE_CAP = 2048
"""Tokens a summary is assumed to take when choosing the span (at most ``max_output_tokens``)."""
_MESSAGE_OVERHEAD = 200  # the tag, the marker, the note and a possible bridge turn
_BRIDGE_ALLOWANCE = 40  # the marked bridge turns that may go around a real summary message
_ID_ATTR = re.compile(r'<ctxrules:summary\b[^>]*\bid="([0-9a-f]{6,64})"')


class Compaction:
    """One run of the stage with its options: ``tail_budget`` (None: the pack's) and
    ``completion`` (None: ``litellm.completion``)."""

    def __init__(self, tail_budget: float | None, completion: Completion | None) -> None:
        self.tail_budget = tail_budget
        self.completion = completion

    def __call__(self, messages: Sequence[Message], ctx: StageContext) -> StageOutcome:
        if ctx.below(messages, ctx.target):
            return StageOutcome(list(messages))
        if _nothing_new(messages, ctx.state):
            # Everything real here was already in the output of the last compaction, which kept
            # it on purpose; compacting again now would only follow changes of other stages'
            # protection and break invariant 4 (the pipeline on its own output changes nothing).
            return StageOutcome(
                list(messages),
                warnings=["no compaction: nothing new since the last summary, which kept the rest"],
            )
        config = SummarizerConfig.from_pack(ctx.pack)
        current = ctx.count(messages)
        pinned = pinned_indices(messages)
        protected = ctx.protected

        def keep(i: int) -> bool:
            return i in pinned or id(messages[i]) in protected

        tail_share = self.tail_budget if self.tail_budget is not None else ctx.budget.tail_budget
        plan = plan_span(
            messages,
            tokens=ctx.counter.count_each(messages),
            current=current,
            keep=keep,
            tail_tokens=int(tail_share * ctx.budget.usable),
            target_tokens=ctx.budget.tokens_at(ctx.target),
            summary_estimate=min(config.max_output_tokens, SUMMARY_ESTIMATE_CAP) + _MESSAGE_OVERHEAD,
        )
        if plan is None or not plan.remove:
            notes = list(plan.notes) if plan is not None else ["nothing follows the protected head"]
            return StageOutcome(list(messages), warnings=[f"no compaction: {n}" for n in notes])
        from ctxrules.summarize.lock import CompactionBusy

        try:
            with ctx.vault.store.compaction_lock(ctx.vault.session):
                return self._compact(messages, ctx, plan, config, current)
        except CompactionBusy as exc:
            return StageOutcome(list(messages), warnings=[f"{exc}: this turn is not compacted"])

    # --- the compaction -----------------------------------------------------------------------

    def _compact(
        self,
        messages: Sequence[Message],
        ctx: StageContext,
        plan: SpanPlan,
        config: SummarizerConfig,
        current: int,
    ) -> StageOutcome:
        redactor = redactor_for(ctx.pack)
        actions: list[Action] = []
        warnings: list[str] = []
        backup_id = ctx.vault.put_text(json.dumps(list(messages), ensure_ascii=False))
        actions.append(Action("backup", f"pre-compaction messages ({len(messages)}) stored", vault_id=backup_id))
        previous = self._previous(messages, plan, ctx.state)
        user_texts = [message_text(m) for m in messages if is_real_user(m)]
        roles = tool_roles(ctx.pack)
        summarizer = Summarizer(
            config,
            ctx.model,
            redactor=redactor,
            roles=roles,
            breaker_states=ctx.state.setdefault("breakers", {}),
            now=ctx.clock,
            count_for=_count_for(ctx),
            completion=self.completion,
            marker_exists=_exists(ctx),
            ledger=ctx.ledger,
        )
        result = summarizer.summarize(
            _span(messages, plan, previous),
            user_messages=user_texts,
            previous=previous,
            first_index=plan.head_end,
        )
        actions.extend(Action("summarizer", a.describe()) for a in result.attempts)
        actions.extend(Action("breaker", f"{model}: {state}") for model, state in result.breakers.items())
        warnings.extend(result.warnings)
        # The span was chosen with an estimate of the summary's size; with the real one known,
        # the newest units it took that are not needed to reach the target stay verbatim.
        for _ in range(3):
            draft = self._message(previous, result, redactor, plan, "")
            smaller = _give_back(plan, ctx.count([draft]), ctx.budget.tokens_at(ctx.target))
            if smaller is plan:
                break
            plan = smaller
            if result.source == "checkpoint":  # a pure function of the span: rebuild it
                checkpoint = build_checkpoint(_span(messages, plan, previous), user_messages=user_texts, roles=roles)
                result.summary = Summary.from_dict(redactor.redact_data(checkpoint.as_dict()))
        removed_at = plan.removed_indices
        removed = [messages[i] for i in removed_at]
        span_id = ctx.vault.put_text(json.dumps(removed, ensure_ascii=False))
        if result.source == "checkpoint":
            actions.append(Action("checkpoint", f"deterministic checkpoint used: {result.checkpoint_reason}"))
            warnings.append(
                f"the deterministic checkpoint replaced {len(removed)} messages: {result.checkpoint_reason}"
            )
        merged = merge_summaries(previous, result.summary)
        summary = Summary.from_dict(redactor.redact_data(merged.summary.as_dict()))
        problems = validate_summary(summary.as_dict())
        if problems:  # merging and redaction keep a valid summary valid; never inject a broken one
            raise CtxrulesError(f"merged summary does not validate: {'; '.join(problems)}")
        if previous is not None:
            dropped = ", ".join(f"{name} {len(items)}" for name, items in merged.dropped.items())
            actions.append(
                Action(
                    "merge",
                    f"folded into the earlier summary {previous.id}"
                    + (f"; resolved or done, dropped: {dropped}" if dropped else ""),
                )
            )

        message = summary_message(
            summary,
            marker=format_marker("message", len(removed), span_id),
            source=result.source,
            removed=len(removed),
            model=result.model,
            extra_meta={"ref": span_id, "backup": backup_id},
        )
        out = self._assemble(messages, plan, message)
        after = ctx.count(out)
        first, last = removed_at[0], removed_at[-1]
        actions.append(
            Action(
                "summary",
                f"{len(removed)} messages (#{first}-#{last}) replaced by a {result.source} "
                f"summary {summary.id}" + (f" from {result.model}" if result.model else ""),
                index=plan.head_end,
                tokens_saved=max(0, current - after),
                vault_id=span_id,
            )
        )
        if not ctx.below(out, ctx.target):
            warnings.append(
                f"still at {ctx.budget.tier(after)} after the summary ({after} tokens): the "
                "head, the tail, pinned and protected messages hold the rest"
            )
        ctx.state["kept"] = sorted({_fingerprint(m) for m in out if not is_injected(m)})
        self._store(
            ctx.state,
            summary,
            result.source,
            result.model,
            len(removed),
            span_id,
            backup_id,
            ctx.clock,
        )
        return StageOutcome(out, actions, warnings=warnings)

    @staticmethod
    def _message(
        previous: Summary | None,
        result: SummarizeResult,
        redactor: Redactor,
        plan: SpanPlan,
        span_id: str,
    ) -> Message:
        """The summary message as it would be injected (for its size; the vault id is a
        placeholder of the same length)."""
        merged = merge_summaries(previous, result.summary).summary
        summary = Summary.from_dict(redactor.redact_data(merged.as_dict()))
        ref = span_id or "0" * 64
        return summary_message(
            summary,
            marker=format_marker("message", len(plan.removed_indices), ref),
            source=result.source,
            removed=len(plan.removed_indices),
            model=result.model,
            extra_meta={"ref": ref, "backup": ref},
        )

    @staticmethod
    def _assemble(messages: Sequence[Message], plan: SpanPlan, message: Message) -> list[Message]:
        gone = set(plan.removed_indices)
        head = list(messages[: plan.head_end])
        rest = [m for i, m in enumerate(messages) if i >= plan.head_end and i not in gone]
        out = head
        if not head or head[-1].get("role") != "user":
            out.append(bridge_message("before"))  # no anchor: a user turn must open the dialogue
        out.append(message)
        if rest and rest[0].get("role") == "assistant":
            out.append(bridge_message("after"))
        out.extend(rest)
        return out

    @staticmethod
    def _previous(messages: Sequence[Message], plan: SpanPlan, state: Mapping[str, Any]) -> Summary | None:
        stored = {e.get("id"): e for e in state.get("summaries") or [] if isinstance(e, Mapping)}
        found: Summary | None = None
        for index in plan.prior_summaries:
            msg = messages[index]
            sid = injected_meta(msg).get("id")
            if sid is None:
                match = _ID_ATTR.search(message_text(msg))
                sid = match.group(1) if match else None
            entry = stored.get(sid)
            data = entry.get("summary") if isinstance(entry, Mapping) else None
            if isinstance(data, Mapping) and not validate_summary(data):
                found = Summary.from_dict(data)
            else:
                found = parse_rendered(message_text(msg)) or found
        return found

    @staticmethod
    def _store(
        state: dict[str, Any],
        summary: Summary,
        source: str,
        model: str | None,
        count: int,
        span_id: str,
        backup_id: str,
        clock: float,
    ) -> None:
        entries = [e for e in state.get("summaries") or [] if isinstance(e, dict)]
        entries.append(
            {
                "id": summary.id,
                "source": source,
                "model": model,
                "at": clock,
                "messages": count,
                "ref": span_id,
                "backup": backup_id,
                "summary": summary.as_dict(),
            }
        )
        state["summaries"] = entries[-KEEP_SUMMARIES:]


def _span(messages: Sequence[Message], plan: SpanPlan, previous: Summary | None) -> list[Message]:
    """The messages the summary is written from: the removed ones, except an earlier summary
    (and its bridges) when that summary is known and merged instead of re-read."""
    return [
        messages[i]
        for i in plan.removed_indices
        if previous is None or injected_kind(messages[i]) not in (SUMMARY_KIND, BRIDGE_KIND)
    ]


def _give_back(plan: SpanPlan, summary_tokens: int, target_tokens: int) -> SpanPlan:
    """``plan`` without its newest removed units that the target does not need, now that the
    summary's real size is known (``plan`` itself when none can stay). Units leave the span from
    its newest end only, so the summary still replaces the oldest messages; earlier summaries and
    bridges always stay in it (they are merged), and at least one real unit is still replaced."""
    remove = list(plan.remove)
    summary_tokens += _BRIDGE_ALLOWANCE
    after = plan.estimate - plan.summary_estimate + summary_tokens
    while len(remove) > 1 and remove[-1].kind in ("step", "message"):
        unit = remove[-1]
        if after + unit.tokens > target_tokens:
            break
        if not any(u.kind in ("step", "message") for u in remove[:-1]):
            break
        remove.pop()
        after += unit.tokens
    if len(remove) == len(plan.remove):
        return plan
    return replace(
        plan,
        remove=tuple(remove),
        estimate=after,
        reaches_target=after <= target_tokens,
        summary_estimate=summary_tokens,
    )


def _fingerprint(msg: Mapping[str, Any]) -> str:
    """What a message says, not how later stages decorated it (``cache_control`` markers and
    other extra keys are left out): role, text, tool-call ids, names and arguments."""
    calls = [
        [
            c.get("id"),
            (c.get("function") or {}).get("name"),
            (c.get("function") or {}).get("arguments"),
        ]
        for c in msg.get("tool_calls") or []
        if isinstance(c, Mapping) and isinstance(c.get("function") or {}, Mapping)
    ]
    data = [msg.get("role"), message_text(msg), msg.get("tool_call_id"), calls]
    raw = json.dumps(data, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _nothing_new(messages: Sequence[Message], state: Mapping[str, Any]) -> bool:
    kept = state.get("kept")
    if not isinstance(kept, list) or not kept:
        return False
    known = set(kept)
    return all(_fingerprint(m) in known for m in messages if not is_injected(m))


def _count_for(ctx: StageContext) -> Callable[[ModelInfo | None], Callable[[str], int]]:
    def count_for(info: ModelInfo | None) -> Callable[[str], int]:
        if info is None:
            return ctx.counter.count_text
        from ctxrules.tokens import TokenCounter

        counter = TokenCounter.for_model(info)
        return lambda text: counter.padded(counter.count_text(text))

    return count_for


def _exists(ctx: StageContext) -> Callable[[str], bool]:
    def exists(vault_id: str) -> bool:
        try:
            return ctx.vault.exists(vault_id)
        except VaultError:
            return False

    return exists
