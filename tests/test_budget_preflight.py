"""Multi-agent cost preflight: the call formulas, USD from the registry, and the budget check."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctxrules.budget import BudgetPolicy, Level, SessionLedger, TokenUsage
from ctxrules.budget.preflight import count_calls, preflight
from ctxrules.budget.pricing import price_call, rates_for
from ctxrules.errors import UsageError

MODEL = "claude-sonnet-4-5"
PER_CALL = TokenUsage.of(prompt=20_000, completion=1_500, cached=12_000)


def one_call_usd() -> float:
    cost = price_call(PER_CALL, rates_for(MODEL, prompt_tokens=PER_CALL.prompt))
    assert cost is not None
    return cost.total


@pytest.mark.parametrize(
    ("mode", "counts", "calls"),
    [
        ("batch", {"tasks": 7}, 7),
        ("batch", {"tasks": 7, "calls_per_task": 3}, 21),
        ("council", {"experts": 3, "review_rounds": 2}, 3 * (1 + 2) + 1),
        ("council", {"experts": 5}, 5 * (1 + 0) + 1),
        ("alternatives", {"agents": 4}, 4),
        ("alternatives", {"agents": 4, "calls_per_agent": 2}, 8),
    ],
)
def test_call_formulas(mode: str, counts: dict[str, int], calls: int) -> None:
    assert count_calls(mode, **counts) == calls
    est = preflight(mode, model=MODEL, per_call=PER_CALL, **counts)
    assert est.calls == calls
    assert est.tokens.total == calls * PER_CALL.total and est.tokens.cached == calls * PER_CALL.cached
    assert est.usd == pytest.approx(calls * one_call_usd())
    assert est.fits and est.fits_against == ()


def test_bad_sizes_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="at least one expert"):
        count_calls("council", experts=0)
    with pytest.raises(UsageError, match="tasks"):
        count_calls("batch", tasks=-1)
    with pytest.raises(UsageError, match="unknown preflight mode"):
        count_calls("swarm")


def test_checked_against_what_is_left_in_the_budget(tmp_path: Path) -> None:
    policy = BudgetPolicy.from_pack({"budgets": {"session": {"usd": 1.0, "tokens": 2_000_000}}})
    s = SessionLedger(tmp_path / "st" / "s", "s", model=MODEL, policy=policy)
    s.record(TokenUsage.of(prompt=100_000, completion=5_000))  # spend some first
    spent = s.status().totals.usd
    small = s.preflight("council", PER_CALL, experts=2, review_rounds=1)  # 5 calls
    usd_fit = next(f for f in small.fits_against if f.unit == "usd")
    assert usd_fit.remaining == pytest.approx(1.0 - spent)
    assert usd_fit.estimate == pytest.approx(5 * one_call_usd())
    assert small.fits == (spent + 5 * one_call_usd() < 1.0)
    # A run too big for what is left: refused up front, with the level it would reach.
    n = int((1.0 - spent) / one_call_usd()) + 1
    big = s.preflight("batch", PER_CALL, tasks=n)
    assert not big.fits and big.level_after is Level.EXCEEDED
    assert "does NOT fit" in big.describe() and f"{n} LLM calls" in big.describe()
    assert len(s.own) == 1  # nothing recorded by a preflight


def test_unpriced_model_is_checked_against_token_limits_only(tmp_path: Path) -> None:
    policy = BudgetPolicy.from_pack({"budgets": {"session": {"usd": 1.0, "tokens": 10_000}}})
    s = SessionLedger(tmp_path / "st" / "s", "s", model="in-house-model", policy=policy)
    est = s.preflight("alternatives", {"prompt": 1_000, "completion": 500}, agents=3)
    assert est.usd is None
    assert [(f.unit, f.estimate) for f in est.fits_against] == [("tokens", 4_500.0)]
    assert est.fits and est.level_after is Level.OK
