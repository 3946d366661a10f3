"""Cost ledger, budget policies, multi-agent preflight and complexity routing (docs/budgets.md).

The public surface; each name is documented in its module:

- :mod:`ctxrules.budget.usage`: :class:`TokenUsage` (the seven token kinds), :func:`parse_usage`;
- :mod:`ctxrules.budget.pricing`: :func:`rates_for`, :func:`price_call` (litellm's price data);
- :mod:`ctxrules.budget.ledger`: append-only JSONL ledgers (session, day, goal);
- :mod:`ctxrules.budget.policy`: :class:`BudgetPolicy` and the four :class:`Level` s;
- :mod:`ctxrules.budget.tracker`: :class:`SessionLedger` (``session.ledger``) and
  :class:`BudgetExceeded`;
- :mod:`ctxrules.budget.notices`: the notice message and :func:`strip_tool_calls`;
- :mod:`ctxrules.budget.preflight`: cost estimates for batch, council and alternatives runs;
- :mod:`ctxrules.budget.router`: the SIMPLE / STANDARD / REASONING complexity router.
"""

from __future__ import annotations

from ctxrules.budget.ledger import Totals
from ctxrules.budget.policy import BudgetPolicy, Level
from ctxrules.budget.pricing import Cost, Rates, price_call, rates_for
from ctxrules.budget.tracker import (
    BudgetExceeded,
    BudgetStatus,
    SessionLedger,
    SpawnLimitExceeded,
)
from ctxrules.budget.usage import TOKEN_KINDS, TokenUsage, is_failed_response, parse_usage

__all__ = [
    "TOKEN_KINDS",
    "BudgetExceeded",
    "BudgetPolicy",
    "BudgetStatus",
    "Cost",
    "Level",
    "Rates",
    "SessionLedger",
    "SpawnLimitExceeded",
    "TokenUsage",
    "Totals",
    "is_failed_response",
    "parse_usage",
    "price_call",
    "rates_for",
]
