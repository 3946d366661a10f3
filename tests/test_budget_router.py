"""The complexity router: rule scores, momentum, the regeneration floor, misroutes decaying over
24 h, privacy routing and the LLM-judge hook."""

from __future__ import annotations

import contextvars
import time
import types
from pathlib import Path
from typing import Any

import pytest

from ctxrules.budget.router import JUDGE_TIMEOUT_S, ComplexityRouter
from ctxrules.engine import Engine
from ctxrules.errors import UsageError
from ctxrules.hookspecs import hookimpl

ROUTER = {
    "tiers": {
        "simple": {"model": "gpt-4o-mini"},
        "standard": {"model": "claude-sonnet-4-5"},
        "reasoning": {"model": "o3"},
    }
}
T0 = 1_800_000_000.0
HI = "thanks!"
TASK = "Please add a --verbose flag to the CLI and update the tests."
HARD = (
    "Design a caching architecture for the build system and analyze the trade-offs step by step:\n"
    "1. invalidation\n2. remote storage\n3. concurrency"
)


def router(**over: Any) -> ComplexityRouter:
    return ComplexityRouter({"router": {**ROUTER, **over}})


def test_rules_score_each_tier_and_map_it_to_the_pack_model(tmp_path: Path) -> None:
    r = router()
    got = {t: r.route(t, session_dir=tmp_path / f"s{i}", now=T0) for i, t in enumerate((HI, TASK, HARD))}
    assert [(d.tier, d.model) for d in got.values()] == [
        ("simple", "gpt-4o-mini"),
        ("standard", "claude-sonnet-4-5"),
        ("reasoning", "o3"),
    ]
    assert "greeting" in got[HI].matched and "reasoning" in got[HARD].matched
    assert got[HARD].score >= 4 and got[HI].score < 1


def test_pack_rules_merge_over_the_builtins(tmp_path: Path) -> None:
    r = router(
        rules={"greeting": {"enabled": False}, "deploy": {"keywords": ["deploy"], "score": 5}},
        cutoffs={"standard": 1, "reasoning": 5},
    )
    assert r.route(HI, session_dir=tmp_path / "a", now=T0).tier == "standard"  # greeting removed
    assert r.route("deploy it", session_dir=tmp_path / "b", now=T0).tier == "reasoning"
    with pytest.raises(UsageError, match="does not compile"):
        router(rules={"bad": {"regex": "(", "score": 1}})


def test_momentum_keeps_follow_ups_at_the_recent_tier_then_releases(tmp_path: Path) -> None:
    r = router()  # momentum.turns defaults to 2
    s = tmp_path / "s"
    assert r.route(HARD, session_dir=s, now=T0).tier == "reasoning"
    follow = r.route(HI, session_dir=s, now=T0 + 60)
    assert follow.tier == "reasoning" and follow.rules_tier == "simple"
    assert any(x.startswith("momentum") for x in follow.reasons)
    # The reasoning turn is one of the last 2 decisions: the floor holds once more.
    assert r.route(HI, session_dir=s, now=T0 + 120).tier == "reasoning"
    # Then it is out of the last 2 turns; the turns momentum raised do not count, so five
    # "thanks" in a row fall back to simple after the declared turns.
    assert [r.route(HI, session_dir=s, now=T0 + 180 + i).tier for i in range(3)] == ["simple"] * 3
    # After the time window passes, a simple message is simple even right after a hard one.
    r.route(HARD, session_dir=s, now=T0 + 400)
    assert r.route(HI, session_dir=s, now=T0 + 400 + 901).tier == "simple"
    # Momentum off: no inheritance.
    r0 = router(momentum={"turns": 0})
    r0.route(HARD, session_dir=tmp_path / "t", now=T0)
    assert r0.route(HI, session_dir=tmp_path / "t", now=T0 + 1).tier == "simple"


@pytest.mark.parametrize("turns", [1, 3, 5])
def test_momentum_lasts_exactly_the_declared_turns(tmp_path: Path, turns: int) -> None:
    r = router(momentum={"turns": turns})
    s = tmp_path / "s"
    r.route(HARD, session_dir=s, now=T0)
    tiers = [r.route(HI, session_dir=s, now=T0 + 1 + i).tier for i in range(turns + 3)]
    assert tiers == ["reasoning"] * turns + ["simple"] * 3


def test_a_regenerated_or_momentum_tier_does_not_feed_momentum(tmp_path: Path) -> None:
    r = router(momentum={"turns": 1}, regenerate={"min_tier": "reasoning", "step_up": False})
    s = tmp_path / "s"
    assert r.route(HI, session_dir=s, now=T0, regenerate=True).tier == "reasoning"
    assert r.route(HI, session_dir=s, now=T0 + 1).tier == "simple"  # the regeneration asked, not the text


def test_decisions_written_before_own_tier_count_their_rules_tier(tmp_path: Path) -> None:
    import json

    s = tmp_path / "s"
    s.mkdir()
    old = [
        {"ts": T0, "tier": "reasoning", "rules_tier": "reasoning", "score": 9, "regenerate": False},
        {"ts": T0 + 1, "tier": "reasoning", "rules_tier": "simple", "score": 0, "regenerate": False},
    ]
    (s / "router.json").write_text(json.dumps({"decisions": old}))
    r = router()
    assert r.route(HI, session_dir=s, now=T0 + 2).tier == "reasoning"  # the first one is in the last 2
    assert r.route(HI, session_dir=s, now=T0 + 3).tier == "simple"


def test_a_router_state_nested_past_the_stack_starts_afresh(tmp_path: Path) -> None:
    """A damaged router.json raised RecursionError out of ``route`` (``session.route``)."""
    s = tmp_path / "s"
    s.mkdir()
    (s / "router.json").write_text("[" * 100_000 + "]" * 100_000)
    assert router().route(HARD, session_dir=s, now=T0).tier == "reasoning"
    assert router().route(HI, session_dir=s, now=T0 + 5).tier == "reasoning"  # momentum: written afresh


def test_momentum_survives_a_restart(tmp_path: Path) -> None:
    s = tmp_path / "s"
    router().route(HARD, session_dir=s, now=T0)
    assert router().route(HI, session_dir=s, now=T0 + 5).tier == "reasoning"  # a new router object


def test_regeneration_floor_steps_up(tmp_path: Path) -> None:
    r = router(momentum={"turns": 0})
    s = tmp_path / "s"
    assert r.route(HI, session_dir=s, now=T0).tier == "simple"
    regen = r.route(HI, session_dir=s, now=T0 + 1, regenerate=True)
    assert regen.tier == "standard" and any(x.startswith("regeneration floor") for x in regen.reasons)
    assert r.route(HI, session_dir=s, now=T0 + 2, regenerate=True).tier == "reasoning"  # again: one more up
    assert r.route(HI, session_dir=s, now=T0 + 3, regenerate=True).tier == "reasoning"  # capped
    low = router(momentum={"turns": 0}, regenerate={"min_tier": "simple", "step_up": False})
    assert low.route(HI, session_dir=tmp_path / "u", now=T0, regenerate=True).tier == "simple"


def test_misroutes_shift_and_decay_over_24_hours(tmp_path: Path) -> None:
    r = router(momentum={"turns": 0})
    state = tmp_path / "state"
    s = state / "s"
    assert r.route(TASK, session_dir=s, now=T0).tier == "standard"
    r.record_misroute("standard", "reasoning", session_dir=s, now=T0)
    assert r.route(TASK, session_dir=s, now=T0 + 60).tier == "reasoning"
    # Weight 1 - age/24h: still >= 0.5 at 12 h, below it after.
    assert r.route(TASK, session_dir=s, now=T0 + 12 * 3600).tier == "reasoning"
    assert r.route(TASK, session_dir=s, now=T0 + 12 * 3600 + 60).tier == "standard"
    # Two misroutes at once reach further in time (2 * (1 - t/24) >= 0.5 until 18 h).
    r.record_misroute("standard", "reasoning", session_dir=s, now=T0)
    assert r.route(TASK, session_dir=s, now=T0 + 17 * 3600).tier == "reasoning"
    assert r.route(TASK, session_dir=s, now=T0 + 24 * 3600).tier == "standard"
    # Only messages the rules put in the misrouted tier move; they span sessions.
    assert r.route(HI, session_dir=state / "other", now=T0 + 60).tier == "simple"
    assert r.route(TASK, session_dir=state / "other", now=T0 + 60).tier == "reasoning"
    # Over-routing is corrected downwards.
    r.record_misroute("reasoning", "standard", session_dir=s, now=T0)
    assert r.route(HARD, session_dir=s, now=T0 + 60).tier == "standard"
    r.record_misroute("reasoning", "standard", session_dir=s, now=T0)  # two: two tiers down
    assert r.route(HARD, session_dir=s, now=T0 + 60).tier == "simple"
    with pytest.raises(UsageError, match="unknown tier"):
        r.record_misroute("huge", "simple", session_dir=s)


def test_privacy_routing_uses_the_redaction_patterns(tmp_path: Path) -> None:
    tiers = {**ROUTER["tiers"], "standard": {"model": "local-llama", "privacy_safe": True}}
    r = ComplexityRouter({"router": {"tiers": tiers, "momentum": {"turns": 0}}})
    secret = HARD + "\nuse key sk-proj-" + "a1B2" * 12
    d = r.route(secret, session_dir=tmp_path / "s", now=T0)
    assert d.privacy and d.tier == "standard" and d.model == "local-llama"
    assert any("privacy" in x for x in d.reasons)
    # An e-mail address is PII: a simple message goes up to the privacy-safe tier.
    assert r.route("mail bob.smith@acme-corp.com thanks?", session_dir=tmp_path / "t", now=T0).model == "local-llama"
    assert not r.route(HARD, session_dir=tmp_path / "u", now=T0).privacy
    off = ComplexityRouter({"router": {"tiers": tiers, "privacy": {"enabled": False}}})
    assert off.route(secret, session_dir=tmp_path / "v", now=T0).tier == "reasoning"


class Judge:
    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.calls: list[tuple[str, str, float]] = []

        @hookimpl
        def ctxrules_route_judge(text: str, tier: str, score: float, reasons: list[str]) -> Any:
            self.calls.append((text, tier, score))
            if isinstance(self.answer, Exception):
                raise self.answer
            return self.answer

        self.plugin = types.SimpleNamespace(ctxrules_route_judge=ctxrules_route_judge)


def judged_session(tmp_path: Path, judge: Any, judge_node: str = "{enabled: true, band: 1}") -> Any:
    p = tmp_path / "pack.yaml"
    p.write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: r, version: 1.0.0}\n"
        "router:\n  tiers:\n    simple: {model: gpt-4o-mini}\n    standard: {model: gpt-4o}\n"
        f"    reasoning: {{model: o3}}\n  judge: {judge_node}\n  momentum: {{turns: 0}}\n"
    )
    return Engine.load(p, plugins=[("judge", judge.plugin)]).session(tmp_path / "st" / "s", model="gpt-4o")


def test_a_judge_whose_endpoint_trickles_is_given_up_at_the_judge_timeout(tmp_path: Path) -> None:
    """An LLM judge asks its model over HTTP with litellm's ``timeout``, which bounds each read:
    an endpoint that sends a space every 0.2 s never lets one time out, and ``route`` waited as
    long as the server went on (a minute here). With ``judge.timeout_s: 1`` the rules' tier
    stands after about a second, and the reasons say why."""
    from llm_server import LLMServer, raw

    from ctxrules.llm import load_litellm

    litellm = load_litellm()
    with LLMServer() as server:

        @hookimpl
        def ctxrules_route_judge(text: str, tier: str, score: float, reasons: list[str]) -> Any:
            response = litellm.completion(
                model="openai/judge",
                messages=[{"role": "user", "content": f"Which tier for: {text}"}],
                api_base=server.base_url,
                api_key="k",
                timeout=1,
                max_retries=0,
            )
            return response.choices[0].message.content

        plugin = types.SimpleNamespace(plugin=types.SimpleNamespace(ctxrules_route_judge=ctxrules_route_judge))
        session = judged_session(tmp_path, plugin, "{enabled: true, band: 1, timeout_s: 1}")
        server.script(raw(b" ", interval_s=0.2, repeat=True))
        started = time.monotonic()
        decision = session.route(TASK)
        took = time.monotonic() - started
        assert len(server.requests) == 1
    assert decision.tier == "standard"
    assert "judge gave no answer within 1 s; kept standard" in decision.reasons
    assert took < 15, took


def test_the_judge_sees_the_callers_context_variables(tmp_path: Path) -> None:
    """The judge runs on a helper thread now; what the caller set in a context variable (a
    request id, a tenant) is still what the hook reads, as it was on the caller's thread."""
    tenant: contextvars.ContextVar[str] = contextvars.ContextVar("tenant", default="none")

    @hookimpl
    def ctxrules_route_judge(text: str, tier: str, score: float, reasons: list[str]) -> Any:
        return "reasoning" if tenant.get() == "acme" else "simple"

    plugin = types.SimpleNamespace(plugin=types.SimpleNamespace(ctxrules_route_judge=ctxrules_route_judge))
    session = judged_session(tmp_path, plugin)
    token = tenant.set("acme")
    try:
        assert session.route(TASK).tier == "reasoning"
    finally:
        tenant.reset(token)


def test_the_judge_timeout_is_a_pack_setting_with_a_default() -> None:
    assert ComplexityRouter({"router": {"judge": {"enabled": True}}}).judge_timeout_s == JUDGE_TIMEOUT_S
    assert ComplexityRouter({"router": {"judge": {"timeout_s": 2.5}}}).judge_timeout_s == 2.5


def test_llm_judge_hook_decides_ambiguous_cases_only(tmp_path: Path) -> None:
    judge = Judge("reasoning")
    s = judged_session(tmp_path, judge)
    d = s.route(TASK)  # score 1: on the standard cutoff, ambiguous
    assert d.tier == "reasoning" and "judge: reasoning" in d.reasons and len(judge.calls) == 1
    far = s.route("x " * 10 + HARD + "\n```py\nprint(1)\n```\n" + "more " * 500)  # far above every cutoff
    assert far.tier == "reasoning" and len(judge.calls) == 1
    # The history form routes the latest real user message.
    assert (
        s.route(
            [
                {"role": "user", "content": HI},
                {"role": "assistant", "content": "hi"},
                {"role": "user", "content": TASK},
            ]
        ).tier
        == "reasoning"
    )


@pytest.mark.parametrize("answer", [RuntimeError("judge down"), "gigantic"])
def test_a_failing_judge_never_breaks_routing(tmp_path: Path, answer: Any) -> None:
    d = judged_session(tmp_path, Judge(answer)).route(TASK)
    assert d.tier == "standard" and any("judge" in x for x in d.reasons)


class Incomparable:
    """An answer whose comparison raises (an array-like object, say)."""

    def __eq__(self, other: object) -> bool:
        raise ValueError("the truth value is ambiguous")

    __hash__ = None  # type: ignore[assignment]


def test_a_judge_answer_that_is_no_tier_name_is_ignored_and_shown_cut(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    d = judged_session(tmp_path / "a", Judge(Incomparable())).route(TASK)  # raised ValueError
    assert d.tier == "standard" and any("judge answered" in x and "not a tier" in x for x in d.reasons)
    answer = "reasoning, because " + "x" * 5_000_000
    huge = judged_session(tmp_path / "b", Judge(answer)).route(TASK)
    (said,) = [x for x in huge.reasons if x.startswith("judge answered")]
    assert huge.tier == "standard" and len(said) < 200 and f"({len(answer)} characters)" in said


def test_undeclared_tiers_borrow_the_nearest_model(tmp_path: Path) -> None:
    r = ComplexityRouter({"router": {"tiers": {"standard": {"model": "gpt-4o"}}}})
    assert r.route(HI, session_dir=tmp_path / "s", now=T0).model == "gpt-4o"
    assert r.route(HARD, session_dir=tmp_path / "t", now=T0).model == "gpt-4o"


def test_a_pattern_that_times_out_never_breaks_routing(tmp_path: Path) -> None:
    # A run of blank lines made the built-in code and step-list patterns backtrack quadratically:
    # route() raised PatternTimeout, and every later route() raised it at once (the pattern is
    # remembered as timed out). They are linear now, and a rule whose pattern times out (a
    # pack's own) does not hold.
    r = router(rules={"slow": {"regex": r"(\w|\w\w)+$", "score": 5}})  # off RE2: backtracks
    for _ in range(2):  # times out, then is skipped at once: neither raises
        d = r.route("q" * 100 + "!", session_dir=tmp_path / "s", now=T0, remember=False)
        assert "slow" not in d.matched and d.tier == "standard"
    blank = "\n" * 20_000 + "def main():\n    return 1\n"
    assert "code" in r.route(blank, session_dir=tmp_path / "s", now=T0, remember=False).matched
    steps = "\n" * 20_000 + "1. build\n2. test\n3. ship\n"
    assert "multi-step" in r.route(steps, session_dir=tmp_path / "s", now=T0, remember=False).matched
    assert r.route(HI, session_dir=tmp_path / "s", now=T0, remember=False).tier == "simple"


def test_a_rule_timed_out_by_a_huge_message_still_holds_for_the_next_short_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # route(" " * 12M) used to switch the rule off for the rest of the process: every later
    # message, in every session, was routed without it.
    from ctxrules import patterns

    monkeypatch.setattr(patterns, "MATCH_TIME_LIMIT_S", 0.001)
    monkeypatch.setattr(patterns, "_PROCESS_MEMORY", patterns.Memory())
    r = router(rules={"deploy": {"regex": r"\b\w+\d\b", "score": 5}}, cutoffs={"standard": 1, "reasoning": 5})
    huge = r.route("é " * 2_000_000, session_dir=tmp_path / "a", now=T0, remember=False)
    assert "deploy" not in huge.matched
    after = r.route("please deploy2 it", session_dir=tmp_path / "b", now=T0, remember=False)
    assert "deploy" in after.matched and after.tier == "reasoning"
