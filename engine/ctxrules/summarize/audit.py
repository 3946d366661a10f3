"""``SummaryAuditor``: accept a summary only when it is valid, says something, and claims
nothing the user did not ask.

A reply that is not a JSON object is rejected. Otherwise the audit keeps what it can, field by
field, and every fix is a note of the result (the report shows them):

1. **coercion** — simple type slips are put right first (:func:`coerce_summary`: a string
   where a list is expected, numbers as text, a missing list, a list over its limit);
2. **schema, per field** — a list field that still does not validate against
   ``summary.v1.schema.json`` is dropped alone (emptied), not the whole summary;
3. **goal grounding** — ``user_goal`` must score at least :data:`GOAL_THRESHOLD` (0.5) against
   the *grounding source*: the newest real user message, plus — while that text holds fewer
   than :data:`SOURCE_MIN_WORDS` distinct content words — the next older distinct real user
   messages (so "yes, go ahead" is read with the request it answers). A goal of the wrong form
   (empty, not text) is replaced by the newest real user message, quoted; a well-formed goal
   that is not grounded rejects the whole summary — it is about something the user did not ask
   (another task, an injected instruction), so none of its fields can be trusted;
4. **claimed requests** — a ``pending_user_asks`` entry that scores under
   :data:`ASK_THRESHOLD` (0.5) against every real user message is dropped alone;
5. **empty** — what is left must hold an entry in at least one of the 13 list fields (a goal
   alone says nothing about the compacted span); else the summary is rejected.

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ctxrules.summarize.checkpoint import excerpt
from ctxrules.summarize.grounding import GroundingSource, content_words
from ctxrules.summarize.model import LIST_FIELDS, Summary, coerce_summary, field_problems
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
        if not isinstance(data, Mapping):
            return AuditResult(False, problems=(f"schema: expected a JSON object, got {type(data).__name__}",))
        fixed, notes = coerce_summary(data)
        problems = field_problems(fixed)
        for name, problem in problems.items():
            if name != "user_goal":
                notes.append(f"dropped {name}: {problem}")
                fixed[name] = []
        if "user_goal" in problems:
            # A goal of the wrong form (empty, an object) is a slip: the user's own words stand in.
            problem = f"user_goal: {problems['user_goal']}"
            if not self.user_messages:
                return AuditResult(False, problems=(problem,), notes=tuple(notes))
            fixed["user_goal"] = f"Latest user message: «{excerpt(self.user_messages[-1], 400)}»"
            notes.append(f"{problem}; replaced by the newest user message")
        elif self.user_messages:
            # A well-formed goal that the user never asked for is no slip: the summary is about
            # something else (another task, an injected instruction), and none of it is kept.
            ungrounded = self._goal_problem(str(fixed["user_goal"]))
            if ungrounded:
                return AuditResult(False, problems=(ungrounded,), notes=tuple(notes))
        summary = Summary.from_dict(fixed)
        if not self.user_messages:
            notes.append("no real user message to ground against: grounding skipped")
        else:
            asks = []
            for i, ask in enumerate(summary.pending_user_asks):
                if self._ask_grounded(ask):
                    asks.append(ask)
                else:
                    notes.append(
                        f"dropped pending_user_asks[{i}]: it claims a request no real user "
                        f"message contains: {_short(ask)!r}"
                    )
            if len(asks) != len(summary.pending_user_asks):
                summary = replace(summary, pending_user_asks=tuple(asks))
        if summary.items() == 0:
            return AuditResult(False, problems=("empty: no list field holds an entry",), notes=tuple(notes))
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
            out = out.replace("</ctxrules:", "&lt;/ctxrules:").replace("<ctxrules:", "&lt;ctxrules:")
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
