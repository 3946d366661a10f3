"""Sub-agent sessions and the handover of their results.

``session.child(name)`` opens ``<parent>/children/<name>``: the same pack, the parent's prompt
cache routing key (sub-agents reuse the parent's provider cache), state root and goal, and the
root session as the budget root. ``budgets.max_descendants`` (default 20; the older
``guards.subagents.max_descendants`` is read as a deprecated alias) caps how many child
sessions one root may spawn in all, counted in the root's registry of child sessions
(``descendants.jsonl``, under a file lock) so that it holds across processes.

``child.handover(result)`` caps what goes back to the parent: a result within
``max_result_tokens`` (default 4,000) and ``spill_chars`` (default 8,000) is returned as it is;
a larger one goes to the vault and comes back as head + tail + pointer plus a structured
handover (done, todo, risks, files) extracted without an LLM.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxrules.budget.tracker import SpawnLimitExceeded
from ctxrules.errors import UsageError
from ctxrules.stages.reduce import handover_text

DEFAULTS = {"max_descendants": 20, "max_result_tokens": 4000, "spill_chars": 8000}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")  # fullmatch: "$" lets a final newline in


TooManyDescendants = SpawnLimitExceeded
"""The older name of :class:`ctxrules.budget.tracker.SpawnLimitExceeded` (one spawn cap, one error)."""


def settings(pack: dict[str, Any]) -> dict[str, int]:
    guards = pack.get("guards") or {}
    own = guards.get("subagents") if isinstance(guards, dict) else None
    return {**DEFAULTS, **(own or {})}


def child_path(parent: Path, name: str) -> Path:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise UsageError(f"sub-agent name {name!r}: use letters, digits, '.', '_' and '-' (at most 100)")
    return parent / "children" / name


@dataclass
class Handover:
    """What a sub-agent hands back: the text for the parent's context and how it was made."""

    text: str
    spilled: bool
    vault_id: str | None = None
    tokens_before: int = 0
    tokens_after: int = 0
    done: list[str] = field(default_factory=list)
    todo: list[str] = field(default_factory=list)
    risks: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)


def make_handover(result: str, *, vault: Any, counter: Any, max_result_tokens: int, spill_chars: int) -> Handover:
    if not isinstance(result, str):
        # A sub-agent that returned nothing (None) or its raw bytes: said here, not as a
        # TypeError from deep in the counting (and nothing is counted or spilled).
        raise UsageError(f"handover takes the sub-agent's result as text (a str), got {type(result).__name__}")
    before = counter.count_text(result)
    if len(result) <= spill_chars and before <= max_result_tokens:
        return Handover(result, False, None, before, before)
    vault_id = vault.put_text(result)
    text, extracted = handover_text(
        result, vault_id=vault_id, keep_tokens=max(200, max_result_tokens // 2), count=counter.count_text
    )
    after = counter.count_text(text)
    if after > max_result_tokens:
        # The handover itself must respect the cap: keep its head. The pointer (the first line)
        # stays whatever it costs: without it the parent could not find the result in the vault
        # (at a cap of 50-80 tokens it alone is above the cap).
        pointer, *lines = text.splitlines(keepends=True)
        kept, used = [pointer], counter.count_text(pointer)
        for ln in lines:
            cost = counter.count_text(ln)
            if used + cost > max_result_tokens:
                break
            kept.append(ln)
            used += cost
        text = "".join(kept)
        after = counter.count_text(text)
    return Handover(
        text,
        True,
        vault_id,
        before,
        after,
        list(extracted.done),
        list(extracted.todo),
        list(extracted.risks),
        list(extracted.files),
    )
