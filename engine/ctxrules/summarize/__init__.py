"""Structured summarization that never loses the session.

The pieces, each usable on its own (the ``summarize.structured`` stage in
:mod:`ctxrules.stages.summarize_structured` puts them together; docs/summarization.md explains the whole):

- :mod:`~ctxrules.summarize.model` — the 14-field :class:`Summary` and its JSON Schema;
- :mod:`~ctxrules.summarize.span` — which messages a compaction replaces (protected head first);
- :mod:`~ctxrules.summarize.config` — the pack's ``summarizer:`` section and the model chain;
- :mod:`~ctxrules.summarize.llm` — the streaming litellm call with progress-aware timeouts;
- :mod:`~ctxrules.summarize.breaker` — the per-model circuit breaker;
- :mod:`~ctxrules.summarize.audit` — :class:`SummaryAuditor` (schema, empty, grounding);
- :mod:`~ctxrules.summarize.merge` — incremental merge;
- :mod:`~ctxrules.summarize.checkpoint` — the deterministic fallback checkpoint;
- :mod:`~ctxrules.summarize.render` — the summary message and role-alternation bridges;
- :mod:`~ctxrules.summarize.lock` — the per-session compaction lock;
- :mod:`~ctxrules.summarize.title` — the background title helper (no model call).

Nothing here imports litellm at import time.
"""

from __future__ import annotations

from ctxrules.summarize.audit import AuditResult, SummaryAuditor, grounding_source
from ctxrules.summarize.breaker import CircuitBreaker
from ctxrules.summarize.checkpoint import build_checkpoint
from ctxrules.summarize.config import Candidate, SummarizerConfig, resolve_chain
from ctxrules.summarize.llm import (
    CallFailed,
    InactivityTimeout,
    ProgressClock,
    StreamLimits,
    StreamResult,
    TotalTimeout,
    stream_completion,
)
from ctxrules.summarize.merge import MergeResult, merge_summaries
from ctxrules.summarize.model import FIELDS, Summary, summary_schema, validate_summary
from ctxrules.summarize.render import parse_rendered, render_summary, summary_message
from ctxrules.summarize.span import SpanPlan, plan_span, protected_head_end
from ctxrules.summarize.summarizer import Attempt, Summarizer, SummarizeResult, parse_reply
from ctxrules.summarize.title import clean_for_title, title

__all__ = [
    "FIELDS",
    "Attempt",
    "AuditResult",
    "CallFailed",
    "Candidate",
    "CircuitBreaker",
    "InactivityTimeout",
    "MergeResult",
    "ProgressClock",
    "SpanPlan",
    "StreamLimits",
    "StreamResult",
    "SummarizeResult",
    "Summarizer",
    "SummarizerConfig",
    "Summary",
    "SummaryAuditor",
    "TotalTimeout",
    "build_checkpoint",
    "clean_for_title",
    "grounding_source",
    "merge_summaries",
    "parse_rendered",
    "parse_reply",
    "plan_span",
    "protected_head_end",
    "render_summary",
    "resolve_chain",
    "stream_completion",
    "summary_message",
    "summary_schema",
    "title",
    "validate_summary",
]


def __getattr__(name: str) -> object:
    # The compaction lock is loaded on use: verbs that only read packs import no lock module.
    if name in ("CompactionBusy", "CompactionLock"):
        from ctxrules.summarize import lock

        return getattr(lock, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
