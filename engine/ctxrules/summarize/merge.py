"""Incremental merge: a new summary folds into the previous one.

A session compacts more than once; each new summary covers only the span compacted since the
last one, so it is merged into the stored previous summary instead of replacing it:

- ``user_goal``: the new one (it was grounded in the newest user message);
- **history** fields — ``constraints``, ``completed_actions``, ``errors``, ``decisions``,
  ``relevant_files``, ``key_facts`` — accumulate: previous entries, then new ones, duplicates
  removed, the oldest dropped beyond the field's cap (:data:`CAPS`);
- **state** fields — ``active_tasks``, ``open_questions``, ``pending_user_asks``, ``risks``,
  ``blocked_items``, ``next_steps`` — describe *now*: the new entries first, then previous
  entries that are still open, up to the cap (3 blocked items, 5 next steps);
- ``tool_state`` is a snapshot: the new one, or the previous one when the new one is empty.

A previous state entry is **resolved** (and dropped) when an entry of the new
``completed_actions`` or ``decisions`` (for open questions also ``key_facts``) covers it: the
two share at least :data:`RESOLVED_SHARE` of the smaller one's content words, and at least
two words (one when the smaller has only one). The summarizer is asked to record what it
resolved in ``completed_actions``, so an exact copy always matches.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxrules.summarize.grounding import content_words
from ctxrules.summarize.model import Summary

__all__ = [
    "CAPS",
    "HISTORY_FIELDS",
    "RESOLVED_SHARE",
    "STATE_FIELDS",
    "MergeResult",
    "merge_summaries",
    "resolved_by",
]

HISTORY_FIELDS: tuple[str, ...] = (
    "constraints",
    "completed_actions",
    "errors",
    "decisions",
    "relevant_files",
    "key_facts",
)
STATE_FIELDS: tuple[str, ...] = (
    "active_tasks",
    "open_questions",
    "pending_user_asks",
    "risks",
    "blocked_items",
    "next_steps",
)
CAPS: dict[str, int] = {
    "constraints": 20,
    "active_tasks": 10,
    "completed_actions": 40,
    "errors": 12,
    "decisions": 20,
    "open_questions": 10,
    "relevant_files": 30,
    "key_facts": 30,
    "tool_state": 12,
    "pending_user_asks": 10,
    "risks": 10,
    "blocked_items": 3,
    "next_steps": 5,
}
"""The most entries a merged field keeps (``blocked_items`` and ``next_steps`` per the schema)."""
RESOLVED_SHARE = 0.6

_EVIDENCE: dict[str, tuple[str, ...]] = {
    "open_questions": ("completed_actions", "decisions", "key_facts"),
}
_DEFAULT_EVIDENCE = ("completed_actions", "decisions")


@dataclass(frozen=True)
class MergeResult:
    summary: Summary
    dropped: dict[str, list[str]] = field(default_factory=dict)
    """Previous state entries that were resolved or done, by field."""


def _key(text: str) -> str:
    return " ".join(text.casefold().split())


def _covers(evidence: frozenset[str], item: frozenset[str]) -> bool:
    if not evidence or not item:
        return False
    shared = len(evidence & item)
    smaller = min(len(evidence), len(item))
    return shared >= min(2, smaller) and shared / smaller >= RESOLVED_SHARE


def resolved_by(item: str, evidence: Iterable[str]) -> str | None:
    """The first evidence entry that covers ``item`` (see the module docstring), if any."""
    item_key = _key(item)
    words = content_words(item)
    for entry in evidence:
        if item_key and item_key in _key(entry):
            return entry
        if _covers(content_words(entry), words):
            return entry
    return None


def _dedup(items: Iterable[str]) -> list[str]:
    seen: set[str] = set()
    out: list[str] = []
    for item in items:
        key = _key(item)
        if key and key not in seen:
            seen.add(key)
            out.append(item)
    return out


def merge_summaries(previous: Summary | None, new: Summary) -> MergeResult:
    """Fold ``new`` into ``previous`` (``previous=None``: ``new``, capped)."""
    values: dict[str, Any] = {"user_goal": new.user_goal}
    dropped: dict[str, list[str]] = {}
    for name in HISTORY_FIELDS:
        old: Sequence[str] = getattr(previous, name) if previous else ()
        merged = _dedup([*old, *getattr(new, name)])
        values[name] = tuple(merged[-CAPS[name] :])
    for name in STATE_FIELDS:
        fresh = list(getattr(new, name))
        kept: list[str] = []
        if previous is not None:
            evidence = [e for source in _EVIDENCE.get(name, _DEFAULT_EVIDENCE) for e in getattr(new, source)]
            for item in getattr(previous, name):
                if resolved_by(item, evidence) is not None:
                    dropped.setdefault(name, []).append(item)
                else:
                    kept.append(item)
        values[name] = tuple(_dedup([*fresh, *kept])[: CAPS[name]])
    state = new.tool_state or (previous.tool_state if previous else ())
    values["tool_state"] = tuple(_dedup(state)[: CAPS["tool_state"]])
    return MergeResult(Summary(**values), dropped)
