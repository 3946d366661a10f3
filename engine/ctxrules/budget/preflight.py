"""Multi-agent cost preflight: calls and USD of a batch, council or alternatives run, checked
against what is left in the budget *before* any sub-agent is spawned.

Calls per mode (the seed's formulas):

- ``batch``: ``tasks * calls_per_task``;
- ``council``: ``experts * (1 + review_rounds) + 1`` (each expert answers, reviews the others
  once per round, and one chair call synthesizes);
- ``alternatives``: ``agents * calls_per_agent`` (parallel experts, each producing one version).

Each call is assumed to use ``per_call`` tokens (a :class:`TokenUsage`, cached tokens included,
priced like a real call of ``model``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from ctxrules.budget.policy import Level
from ctxrules.budget.pricing import price_call, rates_for
from ctxrules.budget.status import BudgetStatus, DimensionStatus
from ctxrules.budget.usage import TokenUsage
from ctxrules.errors import UsageError

__all__ = ["MODES", "DimensionFit", "Mode", "PreflightEstimate", "count_calls", "preflight"]

Mode = Literal["batch", "council", "alternatives"]
MODES: Final = ("batch", "council", "alternatives")


def count_calls(
    mode: str,
    *,
    tasks: int = 0,
    calls_per_task: int = 1,
    experts: int = 0,
    review_rounds: int = 0,
    agents: int = 0,
    calls_per_agent: int = 1,
) -> int:
    """The number of LLM calls a run of ``mode`` makes (module docstring)."""
    for name, value in (
        ("tasks", tasks),
        ("calls_per_task", calls_per_task),
        ("experts", experts),
        ("review_rounds", review_rounds),
        ("agents", agents),
        ("calls_per_agent", calls_per_agent),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise UsageError(f"{name} must be a whole number >= 0, got {value!r}")
    if mode == "batch":
        return tasks * calls_per_task
    if mode == "council":
        if experts < 1:
            raise UsageError("a council needs at least one expert")
        return experts * (1 + review_rounds) + 1
    if mode == "alternatives":
        return agents * calls_per_agent
    raise UsageError(f"unknown preflight mode {mode!r}; one of: {', '.join(MODES)}")


@dataclass(frozen=True)
class DimensionFit:
    """The estimate against one limited (dimension, unit) pair."""

    dimension: str
    unit: str
    limit: float
    spent: float
    estimate: float
    level_after: Level

    @property
    def remaining(self) -> float:
        return max(0.0, self.limit - self.spent)

    @property
    def fits(self) -> bool:
        return self.spent + self.estimate < self.limit

    def as_dict(self) -> dict[str, Any]:
        return {
            "dimension": self.dimension,
            "unit": self.unit,
            "limit": self.limit,
            "spent": round(self.spent, 10),
            "remaining": round(self.remaining, 10),
            "estimate": round(self.estimate, 10),
            "fits": self.fits,
            "level_after": self.level_after.label,
        }


@dataclass(frozen=True)
class PreflightEstimate:
    """What a run would cost, and whether the budget has room for it."""

    mode: str
    calls: int
    tokens: TokenUsage
    usd: float | None
    fits_against: tuple[DimensionFit, ...]

    @property
    def fits(self) -> bool:
        return all(f.fits for f in self.fits_against)

    @property
    def level_after(self) -> Level:
        return max((f.level_after for f in self.fits_against), default=Level.OK)

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "calls": self.calls,
            "tokens": self.tokens.as_dict(),
            "usd": None if self.usd is None else round(self.usd, 10),
            "fits": self.fits,
            "level_after": self.level_after.label,
            "budget": [f.as_dict() for f in self.fits_against],
        }

    def describe(self) -> str:
        cost = "unpriced" if self.usd is None else f"${self.usd:,.4f}"
        head = f"{self.mode}: {self.calls} LLM calls, {self.tokens.total:,} tokens, {cost}"
        parts = [head]
        for f in self.fits_against:
            parts.append(
                f"{f.dimension} budget: {_amount(f.unit, f.remaining)} left of "
                f"{_amount(f.unit, f.limit)}, "
                + ("fits" if f.fits else "does NOT fit")
                + f" (level after: {f.level_after.label})"
            )
        return "; ".join(parts)


def preflight(
    mode: str,
    *,
    model: str,
    per_call: TokenUsage,
    status: BudgetStatus | None = None,
    prices: Mapping[str, Any] | None = None,
    **counts: int,
) -> PreflightEstimate:
    """Estimate a multi-agent run of ``mode`` and check it against ``status`` (if given)."""
    calls = count_calls(mode, **counts)
    tokens = TokenUsage(*(calls * v for v in per_call.as_tuple()))
    rates = rates_for(
        model,
        prompt_tokens=per_call.prompt,
        prices=prices if prices is not None else (status.policy.prices if status else None),
    )
    one = price_call(per_call, rates)
    usd = None if one is None else calls * one.total
    fits: list[DimensionFit] = []
    for d in status.dimensions if status is not None else []:
        estimate = _estimate_in(d, usd, tokens)
        if estimate is None:
            continue  # an unpriced model cannot be checked against a USD limit
        lim = status.policy.limit(d.dimension) if status is not None else None
        share = (d.spent + estimate) / d.limit if d.limit > 0 else 1.0
        level = lim.level_of(share) if lim is not None else Level.OK
        fits.append(DimensionFit(d.dimension, d.unit, d.limit, d.spent, estimate, level))
    return PreflightEstimate(mode, calls, tokens, usd, tuple(fits))


def _amount(unit: str, value: float) -> str:
    return f"${value:,.4f}" if unit == "usd" else f"{int(value):,} tokens"


def _estimate_in(d: DimensionStatus, usd: float | None, tokens: TokenUsage) -> float | None:
    return usd if d.unit == "usd" else float(tokens.total)
