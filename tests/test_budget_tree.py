"""Budgets add up across a tree of sessions in dollars: a sub-agent's spend lands in its root's
session, day and goal ledgers at the state root; one spawn cap counts child sessions;
``should_continue`` reports the ledger's level; warm-up and keep-alive probes are paid for."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from llm_server import LLMServer, reply

from ctxrules import Engine
from ctxrules.budget import BudgetExceeded, Level, SpawnLimitExceeded
from ctxrules.budget.ledger import day_ledger_path, goal_ledger_path, ledger
from ctxrules.budget.pricing import rates_for
from ctxrules.budget.tracker import SessionLedger

MODEL = "gpt-4o"
BUDGETS = """
budgets:
  session: {usd: 5.00}
  day: {usd: 2.00}
  goal: {usd: 3.00}
  max_descendants: 2
"""


def write_pack(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "pack.yaml"
    p.write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: tree, version: 1.0.0}\n"
        "extends: builtin:default\n" + body
    )
    return p


def usd(amount: float) -> dict[str, int]:
    """An OpenAI usage body that costs ``amount`` dollars at gpt-4o's registry price."""
    rate = rates_for(MODEL, prompt_tokens=0)
    assert rate is not None
    return {"prompt_tokens": round(amount / rate.input), "completion_tokens": 0}


def today(state: Path) -> Path:
    return day_ledger_path(state, datetime.now(UTC).date())


def test_a_childs_spend_lands_in_the_roots_session_day_and_goal_ledgers(tmp_path: Path) -> None:
    state = tmp_path / "state"
    engine = Engine.load(write_pack(tmp_path, BUDGETS))
    root = engine.session(state / "root", model=MODEL, goal="fix-ci")
    worker = root.child("worker")
    worker.record_usage(usd(2.50))
    # The day and goal ledgers are the state root's, not a folder under the root session.
    assert today(state).is_file() and goal_ledger_path(state, "fix-ci").is_file()
    assert not (state / "root" / "children" / "ledger").exists()
    assert sum(e.cost.total for e in ledger(today(state)).entries() if e.cost) == pytest.approx(2.50, rel=1e-3)
    status = {(d.dimension, d.unit): d for d in root.ledger.status().dimensions}
    assert status[("day", "usd")].level is Level.EXCEEDED  # $2.50 of $2.00
    assert status[("goal", "usd")].level is Level.WARNING  # $2.50 of $3.00 = 83 % (warning at 80 %)
    assert status[("session", "usd")].spent == pytest.approx(2.50, rel=1e-3)
    # The root is refused too: the day is spent, whoever spent it.
    with pytest.raises(BudgetExceeded, match="day"):
        root.prepare([{"role": "user", "content": "one more thing"}])
    # Reopened on its own (a restart), the child still records into the state root.
    again = SessionLedger(worker.path, worker.id, policy=root.ledger.policy, model=MODEL)
    assert again.state_root.resolve() == state.resolve() and again.goal == "fix-ci"


def test_a_grandchild_counts_in_the_root_session_budget(tmp_path: Path) -> None:
    state = tmp_path / "state"
    engine = Engine.load(write_pack(tmp_path, "budgets: {session: {usd: 1.00}}\n"))
    root = engine.session(state / "root", model=MODEL)
    reader = root.child("researcher").child("reader")
    reader.record_usage(usd(0.60))
    root.record_usage(usd(0.36))
    st = root.ledger.status()
    assert st.totals.cost.total == pytest.approx(0.96, rel=1e-3) and st.level is Level.FINALIZATION
    assert reader.ledger.status().level is Level.FINALIZATION  # the same root budget


def test_one_spawn_cap_counts_child_sessions_only(tmp_path: Path) -> None:
    state = tmp_path / "state"
    root = Engine.load(write_pack(tmp_path, BUDGETS)).session(state / "root", model=MODEL)
    a = root.child("a")
    a.record_usage(usd(0.01))  # a spending child must not make its ledger folder a "child"
    root.child("b")
    assert root.child("a").path == a.path  # reopening is not a new spawn
    with pytest.raises(SpawnLimitExceeded, match=r"already has 2 sub-agent sessions \(budgets.max_descendants 2\)"):
        a.child("c")  # counted per root, across the tree
    assert not (a.path / "children" / "c").exists()  # a refused spawn leaves nothing behind
    from ctxrules.runtime.subagents import TooManyDescendants

    assert TooManyDescendants is SpawnLimitExceeded  # the older name catches the same error


def test_the_guard_key_is_a_deprecated_alias_with_a_validate_warning(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    pack = write_pack(tmp_path, "guards: {subagents: {max_descendants: 1}}\n")
    root = Engine.load(pack).session(tmp_path / "state" / "root", model=MODEL)
    root.child("only")
    with pytest.raises(SpawnLimitExceeded, match="max_descendants 1"):
        root.child("second")
    code, out, err = cli("validate", str(pack))
    assert code == 0, out + err
    assert "CR125" in out and "deprecated" in out and "budgets: {max_descendants: 1}" in out
    both = write_pack(tmp_path, "budgets: {max_descendants: 4}\nguards: {subagents: {max_descendants: 1}}\n")
    code, out, _ = cli("validate", str(both))
    assert code == 0 and "CR125" in out and "ignored" in out
    assert Engine.load(both).session(tmp_path / "s2", model=MODEL).ledger.policy.max_descendants == 4


def test_should_continue_reports_the_ledgers_real_level(tmp_path: Path) -> None:
    engine = Engine.load(write_pack(tmp_path, "budgets: {session: {usd: 0.10}}\n"))
    s = engine.session(tmp_path / "state" / "s", model=MODEL)
    first = s.should_continue({"messages": []})
    assert first.proceed and first.checks["budget"] == "ok"
    s.record_usage(usd(0.096))  # 96 %: finalization at 95 %
    warned = s.should_continue({"messages": []})
    assert warned.proceed and warned.checks["budget"] == "finalization"
    assert warned.budget is not None and warned.budget["level"] == "finalization"
    s.record_usage(usd(2.40))  # 25x over
    stop = s.should_continue({"messages": []})
    assert not stop.proceed and stop.checks["budget"] == "stop"
    assert stop.reason is not None and "budget exceeded" in stop.reason and "session" in stop.reason


def test_warmup_and_keepalive_probes_are_recorded_and_stop_when_the_budget_refuses(tmp_path: Path) -> None:
    engine = Engine.load(write_pack(tmp_path, "budgets: {session: {usd: 0.10}}\n"))
    s = engine.session(tmp_path / "state" / "s", model=MODEL)
    result = s.prepare([{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "hi"}])
    with LLMServer() as server:
        server.script(reply("."), reply("."))
        ka = s.keepalive(
            request={"api_base": server.base_url, "api_key": "k"}, interval_s=240, time_scale=0.001, max_idle_s=None
        )  # the first probe imports litellm: seconds of "idle"
        with ka:
            ka.after_prepare(result)  # session start: one warm-up
            deadline = datetime.now(UTC).timestamp() + 120  # the first probe imports litellm
            while len(ka.probes) < 2 and datetime.now(UTC).timestamp() < deadline:
                time.sleep(0.01)
        probes = ka.probes
        assert [p.kind for p in probes[:2]] == ["warmup", "keepalive"] and all(p.ok for p in probes[:2])
        lines = [json.loads(ln) for ln in (s.path / "ledger.jsonl").read_text().splitlines()]
        assert {rec["source"] for rec in lines} >= {"warmup", "keepalive"}
        assert all(rec["usd"]["total"] > 0 for rec in lines)
        assert s.ledger.status().totals.cost.total > 0
        # Once the budget refuses calls, a probe is not sent at all.
        s.record_usage(usd(1.00))
        from ctxrules.cache.warmup import send_probe

        sent_before = len(server.requests)
        refused = send_probe(
            "openai/gpt-4o", result.messages, request={"api_base": server.base_url, "api_key": "k"}, ledger=s.ledger
        )
        assert not refused.ok and refused.error is not None and "budget exceeded" in refused.error
        assert len(server.requests) == sent_before
