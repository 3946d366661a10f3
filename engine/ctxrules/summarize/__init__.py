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

import importlib
from typing import TYPE_CHECKING

# Imported at once: the submodule shares the function's name, and importing the submodule later
# would rebind the package attribute ``title`` to it.
from ctxrules.summarize.title import clean_for_title, title

if TYPE_CHECKING:
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
    from ctxrules.summarize.lock import CompactionBusy as CompactionBusy
    from ctxrules.summarize.lock import CompactionLock as CompactionLock
    from ctxrules.summarize.merge import MergeResult, merge_summaries
    from ctxrules.summarize.model import FIELDS, Summary, summary_schema, validate_summary
    from ctxrules.summarize.render import parse_rendered, render_summary, summary_message
    from ctxrules.summarize.span import SpanPlan, plan_span, protected_head_end
    from ctxrules.summarize.summarizer import Attempt, Summarizer, SummarizeResult, parse_reply

# The names are loaded on first use (PEP 562): a stage module that needs one piece (the
# checkpoint, the config) imports that submodule only, not the whole package.
_SUBMODULE: dict[str, str] = {
    "AuditResult": "audit",
    "SummaryAuditor": "audit",
    "grounding_source": "audit",
    "CircuitBreaker": "breaker",
    "build_checkpoint": "checkpoint",
    "Candidate": "config",
    "SummarizerConfig": "config",
    "resolve_chain": "config",
    "CallFailed": "llm",
    "InactivityTimeout": "llm",
    "ProgressClock": "llm",
    "StreamLimits": "llm",
    "StreamResult": "llm",
    "TotalTimeout": "llm",
    "stream_completion": "llm",
    "MergeResult": "merge",
    "merge_summaries": "merge",
    "FIELDS": "model",
    "Summary": "model",
    "summary_schema": "model",
    "validate_summary": "model",
    "parse_rendered": "render",
    "render_summary": "render",
    "summary_message": "render",
    "SpanPlan": "span",
    "plan_span": "span",
    "protected_head_end": "span",
    "Attempt": "summarizer",
    "SummarizeResult": "summarizer",
    "Summarizer": "summarizer",
    "parse_reply": "summarizer",
    "CompactionBusy": "lock",
    "CompactionLock": "lock",
}

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
    submodule = _SUBMODULE.get(name)
    if submodule is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{submodule}"), name)
    globals()[name] = value  # later lookups skip this function
    return value
