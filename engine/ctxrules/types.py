"""The words every layer shares: a message, the stage phases, the utilization tiers.

A leaf module (it imports nothing from ctxrules), so any module may use these names without
pulling in the pipeline or the stages.
"""

from __future__ import annotations

from typing import Any, Literal, TypeAlias

Message: TypeAlias = dict[str, Any]
"""One OpenAI chat message. Unknown fields are carried through untouched."""

Phase: TypeAlias = Literal["content", "integrity", "finalize"]
PHASES: tuple[Phase, ...] = ("content", "integrity", "finalize")
"""The order a pipeline runs in: content stages, then the integrity pass, then finalize stages."""

TIERS: tuple[str, ...] = ("below", "monitor", "light", "full", "emergency")
"""Utilization tiers, lowest first; ``below`` is under every threshold."""

THRESHOLD_NAMES: tuple[str, ...] = TIERS[1:]
"""The tiers a pack gives a threshold for (``context.thresholds``), in increasing order."""


def tier_rank(tier: str) -> int:
    """Position of ``tier`` in :data:`TIERS` (``below`` is 0): higher is fuller."""
    return TIERS.index(tier)
