"""What a budget check finds: per-dimension spend, level, burn rate and the notice to show.

Its own module so that the ledger (``budget.tracker``) and the cost estimates
(``budget.preflight``) can both use these types without importing each other.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ctxrules.budget.ledger import Totals
from ctxrules.budget.policy import BudgetPolicy, Level, notice_problem

__all__ = ["BudgetStatus", "BurnRate", "DimensionStatus"]


@dataclass(frozen=True)
class BurnRate:
    """Spend per minute over the trailing window (at least one minute)."""

    tokens_per_min: float
    usd_per_min: float
    span_s: float
    calls: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "tokens_per_min": round(self.tokens_per_min, 3),
            "usd_per_min": round(self.usd_per_min, 8),
            "span_s": round(self.span_s, 3),
            "calls": self.calls,
        }


@dataclass(frozen=True)
class DimensionStatus:
    """One (dimension, unit) pair: its limit, spend, share, level, burn and ETA."""

    dimension: str
    scope: str
    unit: str
    limit: float
    spent: float
    level: Level
    burn: BurnRate
    eta_s: float | None

    @property
    def share(self) -> float:
        return self.spent / self.limit if self.limit > 0 else 1.0

    @property
    def remaining(self) -> float:
        return max(0.0, self.limit - self.spent)

    def describe(self) -> str:
        return f"{self.dimension} ({self.scope})"

    def amount(self, value: float) -> str:
        if self.unit == "tokens":
            return f"{int(value):,} tokens"
        return f"${value:,.2f}" if value >= 10 else f"${value:,.4f}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "dimension": self.dimension,
            "scope": self.scope,
            "unit": self.unit,
            "limit": self.limit,
            "spent": round(self.spent, 10),
            "remaining": round(self.remaining, 10),
            "share": round(self.share, 6),
            "level": self.level.label,
            "burn": self.burn.as_dict(),
            "eta_s": None if self.eta_s is None else round(self.eta_s, 3),
        }


@dataclass
class BudgetStatus:
    """Everything the report's ``budget_status`` shows, and what the levels make ctxrules do."""

    level: Level
    dimensions: list[DimensionStatus]
    totals: Totals
    burn: BurnRate
    policy: BudgetPolicy
    turn: Totals = field(default_factory=Totals)
    own_calls: int = 0
    bad_lines: int = 0
    _report: dict[str, Any] | None = field(default=None, init=False, repr=False, compare=False)
    _report_plan: _Plan = field(default=(), init=False, repr=False, compare=False)

    @property
    def binding(self) -> DimensionStatus | None:
        """The pair closest to (or furthest past) its limit."""
        return max(self.dimensions, key=lambda d: (d.level, d.share), default=None)

    @property
    def eta_s(self) -> float | None:
        etas = [d.eta_s for d in self.dimensions if d.eta_s is not None]
        return min(etas) if etas else None

    @property
    def eco(self) -> bool:
        return self.level >= Level.WARNING and self.policy.actions.eco

    @property
    def strip_tool_calls(self) -> bool:
        return self.level >= Level.FINALIZATION and self.policy.actions.strip_tool_calls

    @property
    def refuses(self) -> bool:
        return self.level >= Level.EXCEEDED and self.policy.actions.refuse

    def scaled_thresholds(self, thresholds: Mapping[str, float]) -> dict[str, float]:
        """The compression thresholds in force: eco mode scales each by ``eco_factor``."""
        if not self.eco:
            return dict(thresholds)
        f = self.policy.actions.eco_factor
        return {k: round(v * f, 6) for k, v in thresholds.items()}

    def notice(self) -> str | None:
        """The notice text of the current level (``None`` at OK or when the level has none)."""
        d = self.binding
        if d is None or self.level < Level.WARNING:
            return None
        template = (
            self.policy.actions.warning_notice
            if self.level == Level.WARNING
            else self.policy.actions.finalization_notice
        )
        if template is None:
            return None
        values = {
            "dimension": d.describe(),
            "share": f"{d.share:.0%}",
            "spent": d.amount(d.spent),
            "limit": d.amount(d.limit),
            "level": self.level.label,
        }
        if notice_problem(template) is not None:  # a lookup, a huge width: as written (CR014)
            return template
        try:
            return template.format(**values)
        except (KeyError, IndexError, ValueError):
            return template  # a message without (or with unknown) placeholders is used as written

    def refusal(self) -> str:
        d = self.binding
        assert d is not None
        return (
            f"budget exceeded: the {d.describe()} budget is {d.amount(d.spent)} of "
            f"{d.amount(d.limit)} ({d.share:.0%}); no further model calls until it is reset "
            f"(ctxrules usage reset --dimension {d.dimension}) or raised in the pack's budgets:"
        )

    def report_dict(self) -> dict[str, Any]:
        """:meth:`as_dict` for a report, as JSON would give it back (lists, not tuples): made once
        per status and copied for each report (a new dict each time, the caller's to change). A
        session whose ledgers did not change gets the same status on every prepare
        (``SessionLedger.status``); the copy follows where the report holds lists and dicts
        (:func:`_containers`, found once per status), a ``copy()`` of each, instead of a
        ``clone_json`` call per value (about a hundred calls per turn) or a JSON decode."""
        made = self._report
        if made is None:
            made = self._report = json.loads(json.dumps(self.as_dict()))
            self._report_plan = _containers(made)
        copied: dict[str, Any] = _copy(made, self._report_plan)
        return copied

    def as_dict(self) -> dict[str, Any]:
        b = self.binding
        return {
            "level": self.level.label,
            "dimensions": [d.as_dict() for d in self.dimensions],
            "binding": None if b is None else f"{b.dimension}:{b.unit}",
            "eco": self.eco,
            "eco_factor": self.policy.actions.eco_factor if self.eco else 1.0,
            "strip_tool_calls": self.strip_tool_calls,
            "notice": self.notice(),
            "totals": self.totals.as_dict(),
            "turn": self.turn.as_dict(),
            "burn": self.burn.as_dict(),
            "eta_s": None if self.eta_s is None else round(self.eta_s, 3),
            "bad_ledger_lines": self.bad_lines,
        }


# Where JSON data holds containers: for each list or dict in it, the (key or index, plan) of
# each list or dict directly inside it (empty for one that holds only scalars).
_Plan = tuple[tuple[Any, "_Plan"], ...]


def _containers(value: dict[str, Any] | list[Any]) -> _Plan:
    """The :data:`_Plan` of ``value`` (a dict or a list of JSON data)."""
    items = value.items() if isinstance(value, dict) else enumerate(value)
    return tuple((key, _containers(item)) for key, item in items if isinstance(item, dict | list))


def _copy(value: Any, plan: _Plan) -> Any:
    """A copy of ``value`` whose every list and dict is new (``plan``: its :func:`_containers`);
    scalars are shared, as :func:`ctxrules.messages.clone_json` shares them."""
    out = value.copy()
    for key, inner in plan:
        out[key] = _copy(value[key], inner)
    return out
