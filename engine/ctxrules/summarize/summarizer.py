"""The summarizer: models in order, each behind its breaker and the auxiliary-ratio guard; the
audit; and the deterministic checkpoint when no model delivers.

For each model of the chain (:func:`ctxrules.summarize.config.resolve_chain`):

1. not callable (no credentials) → skipped, nothing is imported or sent;
2. its breaker is open → skipped until the cool-down ends;
3. **auxiliary-ratio guard**: when the prompt does not fit the model's window (minus the reply
   budget), then with ``on_small_window: main`` and a callable fallback with a larger window the
   model is skipped for it (a warning says so); otherwise the transcript is trimmed to fit (a
   warning says how much was left out); a window too small even for the trimmed prompt skips
   the model;
4. the streaming call under the progress-aware limits; the ceiling ``total_s`` covers the
   whole chain. A provider's context-length error is retried once with the prompt trimmed to
   half its size;
5. the reply is parsed as JSON (within the limits of :mod:`ctxrules.json_limits`: nested at
   most :data:`REPLY_MAX_DEPTH` levels, lone surrogates replaced), redacted, and audited
   (:class:`SummaryAuditor`).

A call that delivered usage is recorded in the session's ledger (``source`` ``summarizer``),
whatever becomes of its reply; a failed call records nothing. A failure at 4-5 counts against
the model's breaker, a success closes it: whatever a reply holds, it is at worst an ``invalid``
or ``rejected`` attempt, never the stage's failure. When every model was skipped or failed,
:func:`build_checkpoint` writes the summary.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ctxrules.json_limits import NonFinite, is_plain, repair_surrogates, scan, short_pointer
from ctxrules.redaction import Redactor
from ctxrules.stores.base import StoreUnavailable
from ctxrules.summarize.audit import AuditResult, SummaryAuditor
from ctxrules.summarize.breaker import CircuitBreaker
from ctxrules.summarize.checkpoint import build_checkpoint
from ctxrules.summarize.config import Candidate, SummarizerConfig, resolve_chain
from ctxrules.summarize.llm import (
    CallFailed,
    Completion,
    StreamLimits,
    StreamResult,
    ensure_litellm,
    stream_completion,
)
from ctxrules.summarize.model import Summary
from ctxrules.summarize.prompt import SummaryPrompt, build_prompt, render_entries
from ctxrules.toolroles import ToolRoles

if TYPE_CHECKING:
    from ctxrules.budget.tracker import SessionLedger
    from ctxrules.models import ModelInfo

__all__ = ["CHARS_PER_TOKEN_CAP", "REPLY_MAX_DEPTH", "Attempt", "SummarizeResult", "Summarizer", "parse_reply"]

_PROMPT_MARGIN = 256
"""Tokens kept free in the summarizer's window besides the reply budget (counting slack)."""

CHARS_PER_TOKEN_CAP = 32
"""The longest reply kept is the reply budget times this (128K characters for 4096 tokens).
A token is about 4 characters of English and 1 of CJK; 32 leaves room for whitespace runs
and any tokenizer, and still stops a server that ignores ``max_tokens`` long before memory
does."""

REPLY_MAX_DEPTH = 8
"""How deep a reply may nest: a summary is an object of lists of strings (an entry a model
wrote as an object adds a level or two). Deeper is no summary, and would take Python's
recursion limit in what walks it next (redaction, the schema check)."""


@dataclass(frozen=True)
class Attempt:
    """One model of the chain and what became of it: ``ok``, ``skipped``, ``failed``,
    ``invalid`` (not JSON) or ``rejected`` (by the auditor)."""

    model: str
    role: str
    outcome: str
    detail: str = ""
    seconds: float = 0.0

    def describe(self) -> str:
        took = f" after {self.seconds:.1f} s" if self.seconds else ""
        return f"{self.role} {self.model}: {self.outcome}{took}" + (f" ({self.detail})" if self.detail else "")


@dataclass
class SummarizeResult:
    """The summary (before merging), where it came from, and what happened on the way."""

    summary: Summary
    source: str
    model: str | None
    attempts: list[Attempt] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    breakers: dict[str, str] = field(default_factory=dict)
    checkpoint_reason: str = ""


_FENCE = re.compile(r"^```[A-Za-z0-9_-]*\s*\n?|\n?```\s*$")


def parse_reply(text: str) -> tuple[object | None, str]:
    """The JSON object in a model's reply (code fences and text around it tolerated) and a note
    (``""``, or where lone surrogates were replaced with U+FFFD), or ``(None, why)``.

    Never raises: nesting deeper than :data:`REPLY_MAX_DEPTH`, ``NaN``/``Infinity`` and an
    integer too long to convert are refused like invalid JSON (:mod:`ctxrules.json_limits`)."""
    stripped = _FENCE.sub("", text.strip()).strip()
    start = stripped.find("{")
    if start < 0:
        return None, "no JSON object in the reply"
    try:
        value, _end = json.JSONDecoder(parse_constant=NonFinite).raw_decode(stripped[start:])
    except RecursionError:
        return None, f"invalid JSON: nested deeper than {REPLY_MAX_DEPTH} levels"
    except ValueError as exc:  # a syntax error, or Python's integer digit limit
        return None, f"invalid JSON: {exc}"
    if not isinstance(value, dict):
        return None, f"expected a JSON object, got {type(value).__name__}"
    if is_plain(value, max_depth=REPLY_MAX_DEPTH):
        return value, ""
    found = scan(value, max_depth=REPLY_MAX_DEPTH)
    if found.problems:
        first = found.problems[0]
        return None, f"invalid JSON: {short_pointer(first.path)}: {first.detail}"
    shown = ", ".join(short_pointer(p, 40) for p in found.replaced[:3])
    more = f" and {len(found.replaced) - 3} more" if len(found.replaced) > 3 else ""
    return found.value, f"a lone surrogate in {shown}{more} was replaced with U+FFFD"


class Summarizer:
    """Writes one summary of a span; see the module docstring for the order of things.

    ``breaker_states`` is the persisted dict of per-model breaker states (changed in place);
    ``now`` is the prepare's clock for the breakers; ``completion`` replaces
    ``litellm.completion``; ``env`` replaces ``os.environ`` for credential checks; ``ledger``
    (the session's) records the usage of every call that delivered one.
    """

    def __init__(
        self,
        config: SummarizerConfig,
        main: ModelInfo,
        *,
        redactor: Redactor,
        roles: ToolRoles,
        breaker_states: MutableMapping[str, Any],
        now: float,
        count_for: Callable[[ModelInfo | None], Callable[[str], int]],
        completion: Completion | None = None,
        env: Mapping[str, str] | None = None,
        marker_exists: Callable[[str], bool] | None = None,
        ledger: SessionLedger | None = None,
    ) -> None:
        self.config = config
        self.main = main
        self.redactor = redactor
        self.roles = roles
        self.breaker_states = breaker_states
        self.now = now
        self.count_for = count_for
        self.completion = completion
        self.chain = resolve_chain(config, main, env)
        self.marker_exists = marker_exists
        self.ledger = ledger

    def breaker(self, model: str) -> CircuitBreaker:
        state = self.breaker_states.setdefault(model, {})
        return CircuitBreaker(state, self.config.breaker_failures, self.config.breaker_cooldown_s)

    def summarize(
        self,
        span: Sequence[Mapping[str, Any]],
        *,
        user_messages: Sequence[str],
        previous: Summary | None,
        first_index: int = 0,
    ) -> SummarizeResult:
        redacted_users = [self.redactor(t) for t in user_messages]
        auditor = SummaryAuditor(redacted_users, marker_exists=self.marker_exists)
        result = SummarizeResult(summary=Summary(user_goal="-"), source="checkpoint", model=None)
        if not any(c.callable for c in self.chain):
            reasons = "; ".join(f"{c.name}: {c.why_not}" for c in self.chain)
            result.checkpoint_reason = f"no summarizer credentials ({reasons})"
            for cand in self.chain:
                result.attempts.append(Attempt(cand.name, cand.role, "skipped", cand.why_not))
        else:
            entries = render_entries(span, redact=self.redactor, first_index=first_index)
            note = f"(messages #{first_index}-#{first_index + len(span) - 1})" if span else ""
            summary = self._run_chain(entries, note, redacted_users, previous, auditor, result)
            if summary is not None:
                result.summary = summary
                result.source = "llm"
        for cand in self.chain:
            if cand.name in self.breaker_states:
                result.breakers[cand.name] = self.breaker(cand.name).describe()
        if result.source == "checkpoint":
            if not result.checkpoint_reason:
                result.checkpoint_reason = "every summarizer model failed or was skipped: " + "; ".join(
                    a.describe() for a in result.attempts
                )
            checkpoint = build_checkpoint(span, user_messages=user_messages, roles=self.roles)
            result.summary = Summary.from_dict(self.redactor.redact_data(checkpoint.as_dict()))
        return result

    # --- the chain ----------------------------------------------------------------------------

    def _run_chain(
        self,
        entries: list[str],
        note: str,
        users: list[str],
        previous: Summary | None,
        auditor: SummaryAuditor,
        result: SummarizeResult,
    ) -> Summary | None:
        if self.completion is None:
            ensure_litellm()  # seconds of import time belong to no model's ceiling
        deadline = time.monotonic() + self.config.total_s
        for position, cand in enumerate(self.chain):
            if not cand.callable:
                result.attempts.append(Attempt(cand.name, cand.role, "skipped", cand.why_not))
                continue
            breaker = self.breaker(cand.name)
            if not breaker.allow(self.now):
                result.attempts.append(
                    Attempt(
                        cand.name,
                        cand.role,
                        "skipped",
                        f"circuit breaker open ({breaker.describe()})",
                    )
                )
                continue
            count = self.count_for(cand.info)
            reply_budget = self._reply_budget(cand)
            budget = cand.window - reply_budget - _PROMPT_MARGIN if cand.window else None
            prompt = build_prompt(
                entries,
                user_messages=users,
                previous=previous,
                count=count,
                budget=None,
                span_note=note,
            )
            if budget is not None and prompt.tokens > budget:
                later = self._larger_callable(position, cand.window or 0)
                if self.config.on_small_window == "main" and later is not None:
                    result.warnings.append(
                        f"summarizer {cand.name} (window {cand.window}) is too small for the input "
                        f"({prompt.tokens} tokens): {later.name} summarizes instead"
                    )
                    result.attempts.append(Attempt(cand.name, cand.role, "skipped", "window too small"))
                    continue
                prompt = build_prompt(
                    entries,
                    user_messages=users,
                    previous=previous,
                    count=count,
                    budget=budget,
                    span_note=note,
                )
                if prompt.tokens > budget:
                    result.attempts.append(
                        Attempt(
                            cand.name,
                            cand.role,
                            "skipped",
                            f"window {cand.window} too small even after trimming",
                        )
                    )
                    continue
                result.warnings.append(
                    f"summarizer input trimmed to fit {cand.name}'s window ({cand.window}): "
                    f"{prompt.entries_dropped} of {prompt.entries_total} messages left out"
                )
            summary = self._attempt(
                cand,
                prompt,
                entries,
                users,
                previous,
                note,
                count,
                auditor,
                breaker,
                deadline,
                result,
            )
            if summary is not None:
                return summary
            if time.monotonic() >= deadline:
                result.attempts.extend(
                    Attempt(
                        c.name,
                        c.role,
                        "skipped",
                        f"the {self.config.total_s:g} s ceiling is used up",
                    )
                    for c in self.chain[position + 1 :]
                )
                break
        return None

    def _reply_budget(self, cand: Candidate) -> int:
        budget = self.config.max_output_tokens
        if cand.max_output:
            budget = min(budget, cand.max_output)
        return budget

    def _larger_callable(self, position: int, window: int) -> Candidate | None:
        for later in self.chain[position + 1 :]:
            if later.callable and (later.window is None or later.window > window):
                return later
        return None

    def _request(self, cand: Candidate, prompt: SummaryPrompt) -> dict[str, Any]:
        request: dict[str, Any] = {
            "model": cand.call_model,
            "messages": prompt.messages,
            "max_tokens": self._reply_budget(cand),
            "temperature": 0,
            "max_retries": 0,  # the breaker and the fallback handle failures, not blind retries
            "num_retries": 0,
            "drop_params": True,  # e.g. reasoning models that refuse temperature
            # The stream's final usage chunk is what the session's ledger records.
            "stream_options": {"include_usage": True},
        }
        if cand.api_base:
            request["api_base"] = cand.api_base
        if cand.api_key:
            request["api_key"] = cand.api_key
        return request

    def _attempt(
        self,
        cand: Candidate,
        prompt: SummaryPrompt,
        entries: list[str],
        users: list[str],
        previous: Summary | None,
        note: str,
        count: Callable[[str], int],
        auditor: SummaryAuditor,
        breaker: CircuitBreaker,
        deadline: float,
        result: SummarizeResult,
    ) -> Summary | None:
        retried = False
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                result.attempts.append(
                    Attempt(
                        cand.name,
                        cand.role,
                        "skipped",
                        f"the {self.config.total_s:g} s ceiling is used up",
                    )
                )
                return None
            limits = StreamLimits(self.config.inactivity_s, remaining, self._reply_budget(cand) * CHARS_PER_TOKEN_CAP)
            try:
                reply = stream_completion(self._request(cand, prompt), limits, completion=self.completion)
            except CallFailed as exc:
                took = exc.seconds
                if exc.kind == "context_length" and not retried and prompt.tokens > 1000:
                    retried = True
                    prompt = build_prompt(
                        entries,
                        user_messages=users,
                        previous=previous,
                        count=count,
                        budget=prompt.tokens // 2,
                        span_note=note,
                    )
                    result.warnings.append(
                        f"{cand.name} reported a context-length error: retrying with "
                        f"the input trimmed to {prompt.tokens} tokens"
                    )
                    continue
                message = str(exc)
                if exc.kind == "total":
                    # The call's own limit was what was left of the summarization's ceiling.
                    message = f"the summarization's {self.config.total_s:g} s ceiling was reached"
                breaker.failure(self.now, message)
                result.attempts.append(Attempt(cand.name, cand.role, "failed", f"{exc.kind}: {message}", took))
                return None
            took = reply.seconds
            self._record(cand, reply, result)
            data, note = parse_reply(reply.text)
            if data is None:
                breaker.failure(self.now, note)
                result.attempts.append(Attempt(cand.name, cand.role, "invalid", note, took))
                return None
            verdict = self._audit(data, auditor)
            if not verdict.accepted or verdict.summary is None:
                breaker.failure(self.now, verdict.reason)
                result.attempts.append(Attempt(cand.name, cand.role, "rejected", verdict.reason, took))
                return None
            breaker.success()
            detail = "; ".join(x for x in (note, *verdict.notes) if x)
            if reply.finish_reason == "length":
                detail = "; ".join(x for x in (detail, "reply hit max_output_tokens") if x)
            result.attempts.append(Attempt(cand.name, cand.role, "ok", detail, took))
            result.model = cand.name
            return verdict.summary

    def _audit(self, data: object, auditor: SummaryAuditor) -> AuditResult:
        """The audit of a parsed reply, redacted first. Whatever the reply still breaks on the
        way (in redaction, the audit or the summary built from it) rejects it: it is the
        model's failure, not the stage's."""
        try:
            verdict = auditor.audit(self.redactor.redact_data(data))
            if verdict.summary is not None:
                _ = verdict.summary.id  # encodes the summary, as storing it will
        except Exception as exc:  # contained: what breaks here is the reply's doing
            return AuditResult(False, problems=(f"the reply could not be audited: {_describe(exc)}",))
        return verdict

    def _record(self, cand: Candidate, reply: StreamResult, result: SummarizeResult) -> None:
        """The call's usage in the session's ledger, whatever becomes of its reply (the tokens
        were spent). A stream without usage records nothing, as a probe without usage does;
        usage the ledger refuses is a warning. A store that stopped answering fails the turn,
        as it does for every stage."""
        if self.ledger is None or not reply.usage:
            return
        try:
            self.ledger.record(reply.usage, model=cand.call_model, source="summarizer")
        except StoreUnavailable:
            raise
        except Exception as exc:  # contained: the usage is the model server's (UsageError: bad counts)
            result.warnings.append(f"the usage of {cand.name}'s summarizer call was not recorded: {_describe(exc)}")


def _describe(exc: Exception) -> str:
    """``Type: message`` on one line, at most 200 characters of message, printable (an error
    may quote what the model's server sent)."""
    message = " ".join(repair_surrogates(str(exc)).split())
    message = message if len(message) <= 200 else message[:200] + "…"
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__
