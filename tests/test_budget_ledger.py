"""Token usage, USD cost from litellm's price data, and the append-only ledgers."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from ctxrules.budget.ledger import (
    LedgerFile,
    day_ledger_path,
    goal_ledger_path,
    ledger,
    session_ledger_path,
)
from ctxrules.budget.policy import BudgetPolicy
from ctxrules.budget.pricing import price_call, rates_for
from ctxrules.budget.tracker import SessionLedger
from ctxrules.budget.usage import TokenUsage, is_failed_response, parse_usage
from ctxrules.errors import UsageError
from ctxrules.models import registry_path

REPO = Path(__file__).resolve().parents[1]
RAW = json.loads(registry_path().read_bytes())

# One model per provider, each with a cache price in the registry.
PROVIDERS = {
    "openai": "gpt-4o",
    "anthropic": "claude-sonnet-4-5",
    "gemini": "gemini/gemini-2.5-pro",
    "deepseek": "deepseek/deepseek-chat",
}


def expected_cost(key: str, u: TokenUsage) -> float:
    """The provider's bill, written out from the registry entry (no tiers at these sizes)."""
    e = RAW[key]
    inp, out = e["input_cost_per_token"], e["output_cost_per_token"]
    read = e.get("cache_read_input_token_cost", inp)
    write = e.get("cache_creation_input_token_cost", inp)
    reasoning = e.get("output_cost_per_reasoning_token", out)
    return (
        (u.prompt - u.cached - u.cache_write) * inp
        + u.cached * read
        + u.cache_write * write
        + (u.completion - u.reasoning) * out
        + u.reasoning * reasoning
    )


# -- usage shapes ------------------------------------------------------------------------------


def test_openai_usage_counts_cached_and_reasoning_inside_the_totals() -> None:
    u = parse_usage(
        {
            "usage": {
                "prompt_tokens": 1200,
                "completion_tokens": 300,
                "total_tokens": 1500,
                "prompt_tokens_details": {"cached_tokens": 1024},
                "completion_tokens_details": {"reasoning_tokens": 128},
            }
        }
    )
    assert u == TokenUsage(
        prompt=1200,
        completion=300,
        cached=1024,
        cache_write=0,
        reasoning=128,
        citation=0,
        total=1500,
    )


def test_anthropic_usage_adds_cache_reads_and_writes_to_the_prompt() -> None:
    u = parse_usage(
        {
            "input_tokens": 20,
            "output_tokens": 80,
            "cache_read_input_tokens": 3000,
            "cache_creation_input_tokens": 500,
        }
    )
    assert (u.prompt, u.cached, u.cache_write, u.completion, u.total) == (3520, 3000, 500, 80, 3600)
    assert u.uncached_prompt == 20


def test_litellm_anthropic_usage_reads_cache_writes_from_top_level() -> None:
    u = parse_usage(
        {
            "prompt_tokens": 3520,
            "completion_tokens": 80,
            "total_tokens": 3600,
            "cache_read_input_tokens": 3000,
            "cache_creation_input_tokens": 500,
            "prompt_tokens_details": {"cached_tokens": 3000},
        }
    )
    assert (u.cached, u.cache_write, u.uncached_prompt) == (3000, 500, 20)


def test_gemini_usage_counts_thoughts_as_reasoning_completion() -> None:
    u = parse_usage(
        {
            "usageMetadata": {
                "promptTokenCount": 900,
                "candidatesTokenCount": 100,
                "thoughtsTokenCount": 400,
                "cachedContentTokenCount": 512,
                "totalTokenCount": 1400,
            }
        }
    )
    assert (u.prompt, u.completion, u.reasoning, u.cached, u.total) == (900, 500, 400, 512, 1400)


def test_responses_api_and_deepseek_and_perplexity_shapes() -> None:
    r = parse_usage(
        {
            "input_tokens": 500,
            "output_tokens": 50,
            "total_tokens": 550,
            "input_tokens_details": {"cached_tokens": 256},
            "output_tokens_details": {"reasoning_tokens": 20},
        }
    )
    assert (r.prompt, r.cached, r.reasoning) == (500, 256, 20)
    d = parse_usage(
        {
            "prompt_tokens": 100,
            "completion_tokens": 10,
            "prompt_cache_hit_tokens": 64,
            "prompt_cache_miss_tokens": 36,
        }
    )
    assert d.cached == 64
    p = parse_usage({"prompt_tokens": 10, "completion_tokens": 200, "citation_tokens": 3000})
    assert p.citation == 3000 and p.total == 210


def test_own_shape_and_clear_errors_for_garbage() -> None:
    assert parse_usage({"prompt": 5, "completion": 2, "cached": 1}).total == 7
    with pytest.raises(UsageError, match="no token counts"):
        parse_usage({"foo": 1})
    with pytest.raises(UsageError, match="whole number"):
        parse_usage({"prompt_tokens": -3})
    with pytest.raises(UsageError, match="exceed the prompt"):
        TokenUsage.of(prompt=10, cached=11)
    with pytest.raises(UsageError, match="JSON object"):
        parse_usage([1, 2])


def test_an_error_body_is_a_failed_call() -> None:
    body = {"error": {"message": "rate limited", "type": "rate_limit_error"}}
    assert is_failed_response(body)
    assert not is_failed_response({"usage": {"prompt_tokens": 1}, "error": None})
    assert is_failed_response({**body, "usage": None})
    with pytest.raises(UsageError, match="failed call"):
        parse_usage(body)


# -- prices ------------------------------------------------------------------------------------


@pytest.mark.parametrize("provider", sorted(PROVIDERS))
def test_cost_matches_the_registry_with_cached_tokens(provider: str) -> None:
    model = PROVIDERS[provider]
    u = TokenUsage.of(prompt=40_000, completion=3_000, cached=30_000, reasoning=1_000)
    rates = rates_for(model, prompt_tokens=u.prompt)
    assert rates is not None and rates.source == f"registry:{model}"
    cost = price_call(u, rates)
    assert cost is not None
    assert cost.total == pytest.approx(expected_cost(model, u), rel=1e-12)
    e = RAW[model]
    # Cache reads are priced below input for every one of these providers: a real saving.
    assert cost.cache_read == pytest.approx(30_000 * e["cache_read_input_token_cost"])
    assert cost.cache_savings == pytest.approx(30_000 * (e["input_cost_per_token"] - e["cache_read_input_token_cost"]))
    assert 0 < cost.savings_share < 1


def test_cache_writes_are_priced_as_anthropic_bills_them() -> None:
    u = TokenUsage.of(prompt=10_000, completion=500, cache_write=9_000)
    cost = price_call(u, rates_for("claude-sonnet-4-5"))
    e = RAW["claude-sonnet-4-5"]
    assert cost is not None
    assert cost.cache_write == pytest.approx(9_000 * e["cache_creation_input_token_cost"])
    # Writing the cache costs more than plain input: the turn's net "savings" is negative.
    assert cost.cache_savings == pytest.approx(
        -9_000 * (e["cache_creation_input_token_cost"] - e["input_cost_per_token"])
    )
    assert cost.total == pytest.approx(expected_cost("claude-sonnet-4-5", u))


def test_long_context_tier_switches_every_rate_above_its_threshold() -> None:
    key = "gemini/gemini-2.5-pro"
    e = RAW[key]
    small = TokenUsage.of(prompt=200_000, completion=1_000, cached=100_000)
    big = TokenUsage.of(prompt=200_001, completion=1_000, cached=100_000)
    r_small, r_big = (
        rates_for(key, prompt_tokens=small.prompt),
        rates_for(key, prompt_tokens=big.prompt),
    )
    assert r_small is not None and r_big is not None
    assert r_small.input == e["input_cost_per_token"]
    assert r_big.input == e["input_cost_per_token_above_200k_tokens"]
    assert r_big.output == e["output_cost_per_token_above_200k_tokens"]
    assert r_big.cache_read == e["cache_read_input_token_cost_above_200k_tokens"]
    assert r_big.tier_threshold == 200_000


def test_reasoning_and_citation_rates_where_the_registry_has_them() -> None:
    key = "perplexity/sonar-deep-research"
    e = RAW[key]
    u = TokenUsage.of(prompt=1_000, completion=2_000, reasoning=1_500, citation=4_000)
    cost = price_call(u, rates_for(key))
    assert cost is not None
    assert cost.reasoning == pytest.approx(1_500 * e["output_cost_per_reasoning_token"])
    assert cost.citation == pytest.approx(4_000 * e["citation_cost_per_token"])
    assert cost.output == pytest.approx(500 * e["output_cost_per_token"])


def test_service_tier_uses_the_tier_rates() -> None:
    e = RAW["gpt-4o"]
    r = rates_for("gpt-4o", service_tier="priority")
    assert r is not None and r.input == e["input_cost_per_token_priority"]
    with pytest.raises(UsageError, match="service tier"):
        rates_for("gpt-4o", service_tier="gold")


def test_pack_prices_win_and_unknown_models_are_unpriced() -> None:
    prices = {"acme-*": {"input": 1.0, "output": 2.0, "cache_read": 0.1}}
    r = rates_for("acme-coder-7b", prices=prices)
    assert r is not None and r.input == pytest.approx(1e-6) and r.cache_read == pytest.approx(1e-7)
    assert r.cache_write == r.input  # absent write price: billed as input
    assert rates_for("no-such-model-xyz") is None
    assert price_call(TokenUsage.of(prompt=1), None) is None


ORACLE = textwrap.dedent("""
    import json, os, sys, warnings
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    warnings.simplefilter("ignore")
    from litellm.litellm_core_utils.llm_cost_calc.utils import generic_cost_per_token
    from litellm.types.utils import (
        CompletionTokensDetailsWrapper, PromptTokensDetailsWrapper, Usage)
    out = {}
    for provider, model, p, c, cached, reasoning in json.loads(sys.argv[1]):
        u = Usage(prompt_tokens=p, completion_tokens=c, total_tokens=p + c,
                  prompt_tokens_details=PromptTokensDetailsWrapper(cached_tokens=cached),
                  completion_tokens_details=CompletionTokensDetailsWrapper(reasoning_tokens=reasoning))
        out[model] = sum(generic_cost_per_token(model.split("/", 1)[-1], u, provider))
    print(json.dumps(out))
""")


def test_same_numbers_as_litellms_own_calculator() -> None:
    """An independent oracle: litellm's cost calculator on the same usage. It runs in a child
    process, so importing litellm cannot disturb other tests (nor reach for the network)."""
    u = TokenUsage.of(prompt=12_000, completion=900, cached=8_000, reasoning=300)
    cases = [[prov, model, u.prompt, u.completion, u.cached, u.reasoning] for prov, model in PROVIDERS.items()]
    proc = subprocess.run(
        [sys.executable, "-c", ORACLE, json.dumps(cases)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0:  # pragma: no cover - depends on the installed litellm's internals
        pytest.skip(f"litellm's calculator is not usable here: {proc.stderr.strip()[-300:]}")
    theirs = json.loads(proc.stdout)
    for model in PROVIDERS.values():
        ours = price_call(u, rates_for(model, prompt_tokens=u.prompt))
        assert ours is not None
        assert ours.total == pytest.approx(theirs[model], rel=1e-9), model


# -- ledgers -----------------------------------------------------------------------------------


def _session(tmp_path: Path, name: str = "s1", **kw: Any) -> SessionLedger:
    return SessionLedger(tmp_path / "state" / name, name, model="gpt-4o", **kw)


def test_a_call_goes_to_the_session_day_and_goal_ledgers(tmp_path: Path) -> None:
    s = _session(tmp_path, goal="ship-v2")
    rec = s.record(
        {
            "prompt_tokens": 1000,
            "completion_tokens": 100,
            "prompt_tokens_details": {"cached_tokens": 512},
        },
        at=1_700_000_000.0,
    )
    assert rec is not None
    state = tmp_path / "state"
    from datetime import date

    day = day_ledger_path(state, date(2023, 11, 14))
    for path in (session_ledger_path(state / "s1"), day, goal_ledger_path(state, "ship-v2")):
        lines = path.read_text().splitlines()
        assert [json.loads(ln)["id"] for ln in lines] == [rec["id"]]
        assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert rec["tokens"]["cached"] == 512
    assert rec["usd"]["total"] == pytest.approx(
        expected_cost("gpt-4o", TokenUsage.of(prompt=1000, completion=100, cached=512))
    )


def test_failed_calls_record_nothing(tmp_path: Path) -> None:
    s = _session(tmp_path)
    assert s.record({"error": {"message": "overloaded"}}) is None
    with pytest.raises(RuntimeError), s.track() as call:
        raise RuntimeError("HTTP 529")
    assert call.record is None
    assert not session_ledger_path(s.dir).exists()
    with s.track() as ok:
        ok.response = {"usage": {"prompt_tokens": 10, "completion_tokens": 1}}
    assert ok.record is not None and len(s.own) == 1


def test_ledgers_survive_a_restart(tmp_path: Path) -> None:
    s = _session(tmp_path)
    for _ in range(3):
        s.record(TokenUsage.of(prompt=100, completion=10))
    fresh = LedgerFile(session_ledger_path(s.dir))  # a new process reads the file afresh
    assert len(fresh) == 3
    assert sum(e.tokens.total for e in fresh.entries()) == 330


def test_resets_count_from_the_reset_and_keep_history(tmp_path: Path) -> None:
    s = _session(tmp_path)
    s.record(TokenUsage.of(prompt=100), at=1000.0)
    s.reset("session", now=2000.0)
    s.record(TokenUsage.of(prompt=7), at=3000.0)
    assert [e.tokens.prompt for e in s.own.entries()] == [7]
    assert len(s.own.entries(honor_resets=False)) == 2
    with pytest.raises(UsageError, match="dimension"):
        s.reset("week")


def test_a_torn_last_line_costs_one_line_not_the_ledger(tmp_path: Path) -> None:
    s = _session(tmp_path)
    s.record(TokenUsage.of(prompt=1))
    path = session_ledger_path(s.dir)
    with path.open("ab") as fh:
        fh.write(b'{"type": "call", "tok')  # a writer died mid-line
    s.record(TokenUsage.of(prompt=2))
    fresh = LedgerFile(path)
    assert [e.tokens.prompt for e in fresh.entries()] == [1, 2]
    assert fresh.bad_lines == 1


def test_readers_pick_up_appends_incrementally(tmp_path: Path) -> None:
    s = _session(tmp_path)
    reader = ledger(session_ledger_path(s.dir))
    assert len(reader) == 0
    s.record(TokenUsage.of(prompt=1))
    assert len(reader) == 1
    s.record(TokenUsage.of(prompt=1))
    assert len(reader) == 2


def test_one_status_reads_each_ledger_once_and_the_next_sees_new_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = _session(tmp_path, goal="g")
    s.record(TokenUsage.of(prompt=100, completion=10), at=1_700_000_000.0)
    reads: list[str] = []
    real = type(s.store).read_log

    def counting(store: Any, log: Any, cursor: Any = None) -> Any:
        reads.append(f"{log.kind}:{log.name}")
        return real(store, log, cursor)

    monkeypatch.setattr(type(s.store), "read_log", counting)
    first = s.status(1_700_000_100.0)
    assert first.totals.calls == 1
    # the session ledger is asked for root totals, resets, own calls and bad lines: read once
    assert len(reads) == len(set(reads)), reads
    # another writer appends between two checks: the next check reads it
    other = _session(tmp_path, goal="g")
    other.record(TokenUsage.of(prompt=5), at=1_700_000_050.0)
    reads.clear()
    second = s.status(1_700_000_100.0)
    assert second.totals.calls == 2 and second.own_calls == 2
    assert len(reads) == len(set(reads)), reads


WRITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {engine!r})
    from ctxrules.budget.tracker import SessionLedger
    from ctxrules.budget.usage import TokenUsage
    worker, n = int(sys.argv[1]), int(sys.argv[2])
    s = SessionLedger({session!r}, "shared", model="claude-sonnet-4-5", goal="g")
    for i in range(n):
        s.record(TokenUsage.of(prompt=1000 + worker, completion=i, cached=worker))
""")


def test_concurrent_writers_lose_no_record(tmp_path: Path) -> None:
    session = tmp_path / "state" / "shared"
    script = tmp_path / "writer.py"
    script.write_text(WRITER.format(engine=str(REPO / "engine"), session=str(session)))
    workers, per = 6, 40
    procs = [subprocess.Popen([sys.executable, str(script), str(w), str(per)]) for w in range(workers)]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    for path in (session_ledger_path(session), goal_ledger_path(tmp_path / "state", "g")):
        lines = path.read_bytes().split(b"\n")
        assert lines[-1] == b""
        records = [json.loads(ln) for ln in lines[:-1]]  # every line parses: no interleaving
        assert len(records) == workers * per
        assert len({r["id"] for r in records}) == workers * per
        assert sum(r["tokens"]["prompt"] for r in records) == sum((1000 + w) * per for w in range(workers))
        assert sum(r["tokens"]["completion"] for r in records) == workers * sum(range(per))


def test_unknown_model_calls_are_recorded_unpriced(tmp_path: Path) -> None:
    s = SessionLedger(tmp_path / "st" / "x", "x", model="my-private-llm")
    rec = s.record(TokenUsage.of(prompt=10, completion=5))
    assert rec is not None and rec["usd"] is None
    st = s.status()
    assert st.totals.unpriced_calls == 1 and st.totals.tokens.total == 15


def test_pack_prices_price_a_private_model(tmp_path: Path) -> None:
    policy = BudgetPolicy.from_pack({"budgets": {"prices": {"my-*": {"input": 2.0, "output": 4.0}}}})
    s = SessionLedger(tmp_path / "st" / "x", "x", model="my-private-llm", policy=policy)
    rec = s.record(TokenUsage.of(prompt=1_000_000, completion=500_000))
    assert rec is not None and rec["usd"]["total"] == pytest.approx(4.0)
    assert rec["rates"] == "pack:my-*"
