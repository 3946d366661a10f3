"""``SummaryAuditor``: accept a summary only when it is valid, says something, and claims
nothing the user did not ask.

Checks, in order (the first failing one rejects the summary):

1. **schema** — the object validates against ``summary.v1.schema.json`` (14 fields, strings,
   ``blocked_items`` ≤ 3, ``next_steps`` ≤ 5, nothing else);
2. **empty** — at least one of the 13 list fields holds an entry (a goal alone says nothing
   about the compacted span);
3. **goal grounding** — ``user_goal`` scores at least :data:`GOAL_THRESHOLD` (0.5) against the
   *grounding source*: the newest real user message, plus — while that text holds fewer than
   :data:`SOURCE_MIN_WORDS` distinct content words — the next older distinct real user
   messages (so "yes, go ahead" is read with the request it answers);
4. **claimed requests** — every ``pending_user_asks`` entry scores at least
   :data:`ASK_THRESHOLD` (0.5) against some real user message.

The score (:class:`ctxrules.summarize.grounding.GroundingSource`) is the weighted share of the
claim's content words found in the best 80-word passage of the source, everyday words weighing
0.1. Without any real user message there is nothing to ground against, and checks 3-4 are
skipped (noted in the result).

An accepted summary is also made safe to inject: ``<ctxrules:`` tags inside entries are
escaped (only ctxrules opens such tags), and elision markers whose vault entry does not exist
are replaced by ``[unresolved vault pointer]`` (a model may garble a pointer it copied).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ctxrules.summarize.grounding import GroundingSource, content_words
from ctxrules.summarize.model import LIST_FIELDS, Summary, validate_summary
from ctxrules.vault import MARKER_RE, parse_markers

__all__ = [
    "ASK_THRESHOLD",
    "GOAL_THRESHOLD",
    "SOURCE_MIN_WORDS",
    "AuditResult",
    "SummaryAuditor",
    "grounding_source",
]

GOAL_THRESHOLD = 0.5
"""The goal's least grounding score against the grounding source."""
ASK_THRESHOLD = 0.5
"""A pending ask's least grounding score against one real user message."""
SOURCE_MIN_WORDS = 40
"""The grounding source grows backwards until it holds this many distinct content words."""

UNRESOLVED_POINTER = "[unresolved vault pointer]"


@dataclass(frozen=True)
class AuditResult:
    """The verdict. ``summary`` is the sanitized summary when accepted; ``problems`` say why
    not; ``notes`` record what was fixed or skipped on the way."""

    accepted: bool
    summary: Summary | None = None
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def reason(self) -> str:
        return "; ".join(self.problems)


def grounding_source(user_messages: Sequence[str], *, min_words: int = SOURCE_MIN_WORDS) -> str:
    """The newest real user message, extended backwards with older distinct ones while it
    holds fewer than ``min_words`` distinct content words."""
    taken: list[str] = []
    words: set[str] = set()
    seen: set[str] = set()
    for text in reversed(user_messages):
        key = text.strip()
        if not key or key in seen:
            continue
        seen.add(key)
        taken.append(text)
        words |= content_words(text)
        if len(words) >= min_words:
            break
    return "\n".join(reversed(taken))


class SummaryAuditor:
    """Audits summaries against the real user messages of a conversation (oldest first).

    ``marker_exists(vault_id)`` tells whether a pointer resolves; without it markers are kept.
    """

    def __init__(
        self,
        user_messages: Sequence[str],
        *,
        goal_threshold: float = GOAL_THRESHOLD,
        ask_threshold: float = ASK_THRESHOLD,
        source_min_words: int = SOURCE_MIN_WORDS,
        marker_exists: Callable[[str], bool] | None = None,
    ) -> None:
        self.user_messages = [t for t in user_messages if t.strip()]
        self.goal_threshold = goal_threshold
        self.ask_threshold = ask_threshold
        self.source = grounding_source(self.user_messages, min_words=source_min_words)
        self._source = GroundingSource(self.source)
        self._each = [GroundingSource(t) for t in dict.fromkeys(self.user_messages)]
        self._marker_exists = marker_exists

    def audit(self, data: object) -> AuditResult:
        errors = validate_summary(data)
        if errors:
            shown = errors[:5] + ([f"... and {len(errors) - 5} more"] if len(errors) > 5 else [])
            return AuditResult(False, problems=tuple(f"schema: {e}" for e in shown))
        assert isinstance(data, dict)  # validate_summary accepts mappings only
        summary = Summary.from_dict(data)
        if summary.items() == 0:
            return AuditResult(False, problems=("empty: no list field holds an entry",))
        notes: list[str] = []
        if not self.user_messages:
            notes.append("no real user message to ground against: grounding skipped")
        else:
            problem = self._goal_problem(summary.user_goal)
            if problem:
                return AuditResult(False, problems=(problem,))
            for i, ask in enumerate(summary.pending_user_asks):
                if not self._ask_grounded(ask):
                    return AuditResult(
                        False,
                        problems=(
                            f"pending_user_asks[{i}] claims a request no real user message "
                            "contains: "
                            f"{_short(ask)!r}",
                        ),
                    )
        return AuditResult(True, self._sanitize(summary, notes), notes=tuple(notes))

    def goal_score(self, goal: str) -> float:
        """The goal's grounding score against the grounding source."""
        return self._source.score(goal)

    def ask_score(self, ask: str) -> float:
        """An ask's best grounding score against any one real user message."""
        return max((source.score(ask) for source in self._each), default=0.0)

    def _goal_problem(self, goal: str) -> str | None:
        if not content_words(goal):
            return f"user_goal has no content words: {_short(goal)!r}"
        score = self.goal_score(goal)
        if score < self.goal_threshold:
            return (
                f"user_goal is not grounded in the newest user message (score {score:.2f} < "
                f"{self.goal_threshold:.2f}): {_short(goal)!r}"
            )
        return None

    def _ask_grounded(self, ask: str) -> bool:
        return self.ask_score(ask) >= self.ask_threshold

    def _sanitize(self, summary: Summary, notes: list[str]) -> Summary:
        changed: dict[str, Any] = {}
        goal = self._clean(summary.user_goal, notes)
        if goal != summary.user_goal:
            changed["user_goal"] = goal
        for name in LIST_FIELDS:
            items = getattr(summary, name)
            cleaned = tuple(self._clean(item, notes) for item in items)
            if cleaned != items:
                changed[name] = cleaned
        return replace(summary, **changed) if changed else summary

    def _clean(self, text: str, notes: list[str]) -> str:
        out = text
        if "<ctxrules:" in out or "</ctxrules:" in out:
            out = out.replace("</ctxrules:", "&lt;/ctxrules:").replace(
                "<ctxrules:", "&lt;ctxrules:"
            )
            notes.append("escaped a <ctxrules:...> tag inside the summary")
        if self._marker_exists is not None and "[ctxrules:elided" in out:
            exists = self._marker_exists
            good = {m.span for m in parse_markers(out) if exists(m.vault_id)}

            def keep_or_drop(match: re.Match[str]) -> str:
                if match.span() in good:
                    return match.group(0)
                notes.append("replaced a vault pointer that does not resolve")
                return UNRESOLVED_POINTER

            out = MARKER_RE.sub(keep_or_drop, out)
        return out


def _short(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
