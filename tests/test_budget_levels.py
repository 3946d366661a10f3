"""Budget levels OK -> WARNING -> FINALIZATION -> EXCEEDED through Session.prepare, with eco mode
visible in the thresholds the pipeline used; sub-agent roll-up and the spawn cap."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any, ClassVar

import jsonschema
import pytest
from llm_server import LLMServer, raw

from ctxrules.budget import BudgetExceeded, Level, SpawnLimitExceeded, TokenUsage
from ctxrules.budget.ledger import day_ledger_path
from ctxrules.budget.notices import NOTICE_KIND, strip_tool_calls, strip_tool_calls_from_response
from ctxrules.budget.policy import BudgetPolicy
from ctxrules.budget.pricing import price_call, rates_for
from ctxrules.budget.tracker import SessionLedger
from ctxrules.engine import Engine
from ctxrules.errors import UsageError
from ctxrules.hookspecs import hookimpl
from ctxrules.messages import injected_kind, is_real_user
from ctxrules.resources import schema_path
from ctxrules.stages.base import StageOutcome, StageType

REPORT_SCHEMA = json.loads(schema_path("report.v1.schema.json").read_text())
MODEL = "gpt-4o"


class Probe:
    """A content stage that records the thresholds and tier the pipeline handed it."""

    seen: ClassVar[list[tuple[dict[str, float], str]]] = []

    def __init__(self, options: dict[str, Any]) -> None:
        pass

    def __call__(self, messages: Any, ctx: Any) -> StageOutcome:
        Probe.seen.append((dict(ctx.budget.thresholds), ctx.tier))
        return StageOutcome(list(messages))


def _plugin() -> Any:
    @hookimpl
    def ctxrules_register_stages(register: Any) -> None:
        register(StageType("probe.budget", "content", Probe))

    return types.SimpleNamespace(ctxrules_register_stages=ctxrules_register_stages)


def make_engine(tmp_path: Path, budgets: str) -> Engine:
    p = tmp_path / "pack.yaml"
    p.write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: b, version: 1.0.0}\n"
        "pipeline:\n  - {id: probe, use: probe.budget}\n" + budgets
    )
    Probe.seen = []
    return Engine.load(p, plugins=[("probe", _plugin())])


def convo(words: int) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": " ".join(["word"] * words)},
    ]


def usd_usage(usd: float) -> TokenUsage:
    """Completion tokens of gpt-4o worth ``usd`` (at the registry's output rate)."""
    rates = rates_for(MODEL)
    assert rates is not None
    return TokenUsage.of(completion=round(usd / rates.output))


def test_levels_move_ok_warning_finalization_exceeded(tmp_path: Path) -> None:
    e = make_engine(tmp_path, "budgets:\n  session: {usd: 1.0}\n")
    msgs = convo(2_000)
    tokens = e.session(tmp_path / "probe", model=MODEL).prepare(msgs).report["before"]["tokens"]
    # A window where the messages are at 45% of the usable window: "monitor", "light" in eco mode.
    s = e.session(tmp_path / "state" / "s1", model=MODEL, window=8192 + round(tokens / 0.45))
    Probe.seen = []
    levels, tiers, thresholds = [], [], []
    for spend in (0.0, 0.85, 0.12, 0.05):
        if spend:
            s.record_usage(usd_usage(spend))
        try:
            r = s.prepare(msgs)
        except BudgetExceeded as exc:
            levels.append("exceeded")
            assert "session (s1) budget" in str(exc) and "usage reset" in str(exc)
            assert exc.status is not None and exc.status.level is Level.EXCEEDED
            continue
        jsonschema.validate(r.report, REPORT_SCHEMA)
        levels.append(r.report["budget_status"]["level"])
        tiers.append(r.report["before"]["tier"])
        thresholds.append(r.report["budget"]["thresholds"])
    assert levels == ["ok", "warning", "finalization", "exceeded"]
    base = {"monitor": 0.40, "light": 0.50, "full": 0.70, "emergency": 0.90}
    eco = {k: round(v * 0.8, 6) for k, v in base.items()}
    assert thresholds == [base, eco, eco]
    # The stage itself ran with the scaled thresholds, and saw the higher tier they imply.
    assert [t for t, _ in Probe.seen] == [base, eco, eco]
    assert tiers == ["monitor", "light", "light"]
    assert [tier for _, tier in Probe.seen] == tiers


def test_exceeded_refuses_before_any_stage_runs(tmp_path: Path) -> None:
    e = make_engine(tmp_path, "budgets:\n  session: {tokens: 1000}\n")
    s = e.session(tmp_path / "state" / "s1", model=MODEL)
    s.record_usage({"prompt_tokens": 900, "completion_tokens": 200})
    with pytest.raises(BudgetExceeded, match=r"1,100 tokens of 1,000 tokens \(110%\)"):
        s.prepare(convo(5))
    assert Probe.seen == []


def test_notices_are_cache_safe_marked_and_not_repeated(tmp_path: Path) -> None:
    e = make_engine(tmp_path, "budgets:\n  session: {usd: 1.0}\n")
    s = e.session(tmp_path / "state" / "s1", model=MODEL)
    msgs = convo(50)
    plain = s.prepare(msgs).messages
    s.record_usage(usd_usage(0.9))
    r = s.prepare(msgs)
    assert r.messages[:-1] == plain  # the prefix is untouched: the notice only appends
    notice = r.messages[-1]
    assert injected_kind(notice) == NOTICE_KIND and not is_real_user(notice)
    assert "90%" in notice["content"] and "$0.9000 of $1.0000" in notice["content"]
    assert r.report["budget_status"]["notice"] in notice["content"]
    # The caller sends the output back: the same notice is not added a second time.
    again = s.prepare(r.messages).messages
    assert sum(injected_kind(m) == NOTICE_KIND for m in again) == 1
    # FINALIZATION says "answer now" and asks for tool calls to be stripped.
    s.record_usage(usd_usage(0.06))
    fin = s.prepare(msgs)
    assert "Answer now" in fin.messages[-1]["content"]
    assert fin.report["budget_status"]["strip_tool_calls"] is True


def test_custom_levels_and_disabled_actions(tmp_path: Path) -> None:
    e = make_engine(
        tmp_path,
        """budgets:
  session: {usd: 1.0, warning: 0.5}
  levels:
    warning: {eco: false, message: "Half the budget is gone ({share})."}
    exceeded: {refuse: false}
""",
    )
    s = e.session(tmp_path / "state" / "s1", model=MODEL)
    s.record_usage(usd_usage(0.6))
    r = s.prepare(convo(20))
    assert r.report["budget_status"]["level"] == "warning"
    assert r.report["budget"]["thresholds"]["monitor"] == 0.40  # eco off
    assert "Half the budget is gone (60%)." in r.messages[-1]["content"]
    s.record_usage(usd_usage(0.6))
    assert s.prepare(convo(20)).report["budget_status"]["level"] == "exceeded"  # observe only


@pytest.mark.parametrize(
    "message", ["over {share:>9999999999}", "{spent.__class__.__mro__}", "{limit[0]} {share:{level}}"]
)
def test_a_notice_message_with_a_huge_width_or_a_lookup_is_a_located_error(tmp_path: Path, message: str) -> None:
    """A level's message is a format string over the budget's values: a width of ten billion
    took the process's memory at the first WARNING, and a lookup reached into Python objects.
    The pack does not load (CR014 at the message, as `validate` says), and the status that
    renders notices sends such a message as written whatever reaches it."""
    from ctxrules.budget.policy import notice_problem
    from ctxrules.errors import PackError

    levels = f"  levels:\n    warning: {{message: {json.dumps(message)}}}\n"
    with pytest.raises(PackError, match=r"pack.yaml:\d+:\d+: error\[CR014\] budgets.levels.warning.message"):
        make_engine(tmp_path, "budgets:\n  session: {usd: 1.0, warning: 0.5}\n" + levels)
    assert notice_problem(message) is not None
    assert notice_problem("Half the budget is gone ({share:>8}, {spent} of {limit}).") is None


def test_turn_cost_cache_savings_burn_rate_and_eta(tmp_path: Path) -> None:
    e = make_engine(tmp_path, "budgets:\n  session: {usd: 10.0}\n")
    s = e.session(tmp_path / "state" / "s1", model=MODEL)
    t0 = 1_800_000_000.0
    s.prepare(convo(10), clock=t0)
    u = TokenUsage.of(prompt=100_000, completion=2_000, cached=80_000)
    for i in range(4):
        s.record_usage(u, at=t0 + 60 * i)
    r = s.prepare(convo(10), clock=t0 + 240)
    st = r.report["budget_status"]
    cost = price_call(u, rates_for(MODEL, prompt_tokens=u.prompt))
    assert cost is not None
    assert st["turn"]["calls"] == 4
    assert st["turn"]["usd"] == pytest.approx(4 * cost.total)
    assert st["turn"]["cache_savings_usd"] == pytest.approx(4 * cost.cache_savings)
    assert st["turn"]["cache_hit_share"] == pytest.approx(0.8)
    # Four calls over the 240 s since the first: per-minute rates and the time left at them.
    assert st["burn"]["usd_per_min"] == pytest.approx(4 * cost.total / 4.0)
    assert st["burn"]["tokens_per_min"] == pytest.approx(4 * u.total / 4.0)
    remaining = 10.0 - 4 * cost.total
    assert st["eta_s"] == pytest.approx(remaining / (cost.total) * 60.0)
    # The next turn counts only its own calls.
    s.record_usage(u, at=t0 + 300)
    nxt = s.prepare(convo(10), clock=t0 + 300)
    assert nxt.report["budget_status"]["turn"]["calls"] == 1


@pytest.mark.parametrize("window", [10, 59.5])
def test_a_burn_window_under_a_minute_averages_over_a_minute(tmp_path: Path, window: float) -> None:
    e = make_engine(tmp_path, f"budgets:\n  session: {{tokens: 1000000}}\n  burn_window_s: {window}\n")
    s = e.session(tmp_path / "state" / "s1", model=MODEL)
    t0 = 1_800_000_000.0
    u = TokenUsage.of(prompt=5_000, completion=1_000)
    s.record_usage(u, at=t0 - 50)  # outside the window as given, within the minute used
    s.record_usage(u, at=t0 - 5)
    burn = s.ledger.status(t0).burn
    # The calls of the last minute, per minute: not per the window's seconds (36,000 tokens a
    # minute from one call 5 s ago), nor the window's calls alone spread over the minute.
    assert (burn.span_s, burn.calls) == (60.0, 2)
    assert burn.tokens_per_min == pytest.approx(2 * u.total)
    assert s.ledger.status(t0).dimensions[0].eta_s == pytest.approx((1_000_000 - 2 * u.total) / (2 * u.total) * 60)


def test_no_budget_still_reports_cost(tmp_path: Path) -> None:
    e = make_engine(tmp_path, "")
    s = e.session(tmp_path / "state" / "s1", model="claude-sonnet-4-5")
    s.record_usage({"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 2000})
    st = s.prepare(convo(5)).report["budget_status"]
    assert st["level"] == "ok" and st["dimensions"] == [] and st["totals"]["tokens"]["cached"] == 2000
    assert st["totals"]["cache_savings_usd"] > 0


def test_day_budget_follows_the_time_zone_and_resets(tmp_path: Path) -> None:
    policy = BudgetPolicy.from_pack({"budgets": {"day": {"tokens": 1000, "timezone": "Asia/Tokyo"}}})
    state = tmp_path / "state"
    a = SessionLedger(state / "a", "a", model=MODEL, policy=policy)
    b = SessionLedger(state / "b", "b", model=MODEL, policy=policy)
    # 2024-01-01 14:30 UTC is 23:30 in Tokyo; 15:30 UTC is the next Tokyo day.
    t = 1_704_119_400.0
    a.record(TokenUsage.of(prompt=600), at=t)
    b.record(TokenUsage.of(prompt=300), at=t + 60)
    st = b.status(now=t + 120)
    assert (st.level, st.dimensions[0].scope, st.dimensions[0].spent) == (
        Level.WARNING,
        "2024-01-01",
        900,
    )
    assert b.status(now=t + 3600).dimensions[0].spent == 0  # a new day in Tokyo
    # Both sessions wrote the same UTC day file.
    assert len(day_ledger_path(state, __import__("datetime").date(2024, 1, 1)).read_text().splitlines()) == 2
    b.reset("day", now=t + 180)
    assert b.status(now=t + 200).level is Level.OK


def test_the_day_after_a_fall_back_to_midnight_starts_at_the_first_midnight(tmp_path: Path) -> None:
    # Havana fell back from 01:00 to 00:00 on 2024-11-03: 00:00-01:00 came twice. A call in the
    # first of those hours is in that day's budget during the second one too.
    policy = BudgetPolicy.from_pack({"budgets": {"day": {"tokens": 1000, "timezone": "America/Havana"}}})
    ledger = SessionLedger(tmp_path / "state" / "a", "a", model=MODEL, policy=policy)
    first = 1_730_608_200.0  # 04:30 UTC, 00:30 -04:00 (the first 00:30)
    ledger.record(TokenUsage.of(prompt=600), at=first)
    for now in (first + 60, first + 3600, first + 7200):  # the first 00:31, the second 00:30, 01:30
        start, end, label = ledger.day_window(now)
        assert (start, end - start, label) == (first - 1800, 25 * 3600, "2024-11-03")
        assert ledger.status(now=now).dimensions[0].spent == 600


def test_goal_budget_spans_sessions(tmp_path: Path) -> None:
    policy = BudgetPolicy.from_pack({"budgets": {"goal": {"tokens": 100}}})
    state = tmp_path / "state"
    SessionLedger(state / "a", "a", model=MODEL, policy=policy, goal="fix-ci").record(TokenUsage.of(prompt=60))
    b = SessionLedger(state / "b", "b", model=MODEL, policy=policy, goal="fix-ci")
    b.record(TokenUsage.of(prompt=45))
    assert b.status().level is Level.EXCEEDED
    # A session without that goal is not bound by it.
    assert SessionLedger(state / "c", "c", model=MODEL, policy=policy).status().dimensions == []
    with pytest.raises(UsageError, match="goal name"):
        SessionLedger(state / "d", "d", goal="../etc")


def test_sub_agent_costs_roll_up_to_the_root(tmp_path: Path) -> None:
    e = make_engine(tmp_path, "budgets:\n  session: {tokens: 1000}\n")
    root = e.session(tmp_path / "state" / "root", model=MODEL)
    child = root.child("researcher")
    grandchild = child.child("reader")
    grandchild.record_usage(TokenUsage.of(prompt=700))
    child.record_usage(TokenUsage.of(prompt=200))
    st = root.ledger.status()
    assert st.totals.tokens.prompt == 900 and st.level is Level.WARNING
    assert child.ledger.root_id == root.id == grandchild.ledger.root_id
    # The child works under the root's budget too, and a restart keeps the link.
    reopened = SessionLedger(grandchild.path, grandchild.id, policy=root.ledger.policy)
    assert reopened.root_id == root.id and reopened.status().totals.tokens.prompt == 900
    root.record_usage(TokenUsage.of(prompt=150))
    with pytest.raises(BudgetExceeded):
        child.prepare(convo(5))


def test_max_descendants_caps_spawning(tmp_path: Path) -> None:
    policy = BudgetPolicy.from_pack({"budgets": {"max_descendants": 3}})
    state = tmp_path / "state"
    root = SessionLedger(state / "root", "root", policy=policy)
    kids = [SessionLedger(state / f"k{i}", f"k{i}", policy=policy) for i in range(4)]
    for k in kids[:3]:
        root.register_child(k)
    root.register_child(kids[0])  # registering the same session again is not a new spawn
    with pytest.raises(SpawnLimitExceeded, match="max_descendants 3"):
        kids[1].register_child(kids[3])  # counted per root, across the whole tree
    assert BudgetPolicy().max_descendants == 20


def test_strip_tool_calls_keeps_the_text() -> None:
    msg = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "a", "type": "function", "function": {"name": "Bash", "arguments": "{}"}}],
    }
    out = strip_tool_calls(msg)
    assert out == {"role": "assistant", "content": ""} and "tool_calls" in msg
    resp = {
        "id": "r",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {"role": "assistant", "content": "Final.", "tool_calls": [1]},
            }
        ],
    }
    stripped = strip_tool_calls_from_response(resp)
    assert stripped["choices"][0] == {
        "index": 0,
        "finish_reason": "stop",
        "message": {"role": "assistant", "content": "Final."},
    }
    assert resp["choices"][0]["finish_reason"] == "tool_calls"


def test_strip_tool_calls_from_the_response_session_complete_returns(tmp_path: Path) -> None:
    """``session.complete`` returns litellm's ``ModelResponse``, an object, not a dict: its
    choices were kept as they were, tool calls and all, so FINALIZATION stripped nothing."""
    call = {"id": "c1", "type": "function", "function": {"name": "Bash", "arguments": "{}"}}
    body = {
        "id": "r",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-4o",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {"role": "assistant", "content": "Final.", "tool_calls": [call]},
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14},
    }
    session = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o")
    with LLMServer() as server:
        server.script(raw(json.dumps(body).encode()))
        done = session.complete(
            [{"role": "user", "content": "go"}], model="openai/gpt-4o", api_base=server.base_url, api_key="k"
        )
    assert done.response.choices[0].message.tool_calls  # (what came back had a call)
    (choice,) = strip_tool_calls_from_response(done.response)["choices"]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"] == "Final."
    assert not choice["message"].get("tool_calls") and not choice["message"].get("function_call")


def test_bad_policy_values_are_clear_errors() -> None:
    with pytest.raises(UsageError, match=r"warning .* below finalization"):
        BudgetPolicy.from_pack({"budgets": {"session": {"usd": 1, "warning": 0.9, "finalization": 0.5}}})
    with pytest.raises(UsageError, match="time zone"):
        BudgetPolicy.from_pack({"budgets": {"day": {"usd": 1, "timezone": "Mars/Olympus"}}})


@pytest.mark.parametrize(
    ("node", "code"),
    [
        ("budgets:\n  sesion: {usd: 1}\n", "CR010"),
        ("budgets:\n  session: {usd: -1}\n", "CR014"),
        ("budgets:\n  levels: {warning: {at: 1.5}}\n", "CR014"),
        ("budgets:\n  prices: {gpt-x: {input: 1}}\n", "CR013"),
        ("router:\n  tiers: {simple: {model: a}, huge: {model: b}}\n", "CR010"),
        ("router:\n  rules: {r: {regex: x, weight: 2}}\n", "CR010"),
        ("router:\n  regenerate: {min_tier: giant}\n", "CR012"),
        ("timeouts:\n  chunk_ms: '120s'\n", "CR011"),
    ],
)
def test_the_schema_checks_budgets_router_and_timeouts(cli, tmp_path: Path, node: str, code: str) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "pack.yaml"
    p.write_text("apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: b, version: 1.0.0}\n" + node)
    rc, out, _ = cli("validate", "--format", "json", str(p))
    assert rc == 1 and code in {d["code"] for d in json.loads(out)["diagnostics"]}, out


@pytest.mark.parametrize(
    ("node", "where"),
    [
        ("  day: {usd: 5, timezone: Mars/Olympus}\n", (5, 27)),
        ("  day: {usd: 5, timezone: Europe/Berlin/}\n", (5, 27)),
        ("  session: {usd: 5, warning: 0.9, finalization: 0.5}\n", (5, 30)),
        ("  levels: {warning: {at: 0.97}}\n  goal: {tokens: 100}\n", (5, 26)),
        ("  levels: {finalization: {at: 0.5}}\n  day: {usd: 5}\n", (5, 31)),
    ],
    ids=["unknown-zone", "zone-not-normalized", "own-shares", "level-warning", "level-finalization"],
)
def test_budgets_that_no_check_could_use_are_validate_errors_with_a_place(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path, node: str, where: tuple[int, int]
) -> None:
    # BudgetPolicy.from_pack refuses these at every budget check (exit 2, no file:line:col):
    # validate must say so, and `run` must refuse the pack as invalid (exit 1) with the place.
    p = tmp_path / "pack.yaml"
    p.write_text("apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: b, version: 1.0.0}\nbudgets:\n" + node)
    rc, out, _ = cli("validate", "--format", "json", str(p))
    diags = [d for d in json.loads(out)["diagnostics"] if d["severity"] == "error"]
    assert rc == 1 and [(d["code"], d["line"], d["col"]) for d in diags] == [("CR014", *where)], out
    (tmp_path / "in.json").write_text('[{"role": "user", "content": "hi"}]')
    argv = ("run", "--pack", str(p), "--model", "gpt-4o", "--input", str(tmp_path / "in.json"))
    rc, _, err = cli(*argv, "--session", str(tmp_path / "s"))
    assert rc == 1 and f"pack.yaml:{where[0]}:{where[1]}: error[CR014]" in err, err


def test_a_full_example_pack_validates_cleanly(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "pack.yaml"
    p.write_text("""apiVersion: ctxrules/v1
kind: RulePack
metadata: {name: b, version: 1.0.0}
extends: [builtin:default]
budgets:
  session: {usd: 5.0}
  day: {usd: 50, timezone: Europe/Berlin}
  goal: {tokens: 20000000, warning: 0.7}
  levels:
    warning: {at: 0.8, eco: true, eco_factor: 0.8, message: "Budget {share} used."}
    finalization: {at: 0.95, strip_tool_calls: true}
    exceeded: {refuse: true}
  max_descendants: 20
  burn_window_s: 600
  prices: {"acme-*": {input: 0.5, output: 1.5}}
router:
  tiers:
    simple: {model: gpt-4o-mini}
    standard: {model: claude-sonnet-4-5, privacy_safe: true}
    reasoning: {model: o3}
  cutoffs: {standard: 1, reasoning: 4}
  rules: {deploy: {keywords: [deploy], score: 2}, greeting: {enabled: false}}
  momentum: {turns: 2, window_s: 900}
  regenerate: {min_tier: standard, step_up: true}
  misroutes: {decay_h: 24, threshold: 0.5}
  privacy: {enabled: true, kinds: [credential, pii]}
  judge: {enabled: false, band: 1}
""")
    rc, out, _ = cli("validate", "--format", "json", str(p))
    assert rc == 0 and json.loads(out)["diagnostics"] == [], out
    Engine.load(p).session(tmp_path / "st" / "s", model=MODEL).prepare(convo(5))


def test_each_report_gets_its_own_budget_status_as_json_would_give_it(tmp_path: Path) -> None:
    # The status is made once and copied per report: an edit of one report's copy must not
    # reach the next report, and the copy is what JSON gives back (lists, not tuples).
    e = Engine.load("builtin:default")
    s = e.session(tmp_path / "s", model="gpt-4o")
    msgs = [{"role": "user", "content": "hello"}]
    first = s.prepare(msgs).report["budget_status"]
    assert first == json.loads(json.dumps(first))
    first["level"] = "edited"
    first["totals"].clear()
    second = s.prepare(msgs).report["budget_status"]
    assert second["level"] == "ok" and second["totals"]
    assert second is not first and second["totals"] is not first["totals"]
