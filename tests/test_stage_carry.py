"""A stage that carries its per-message work from one turn to the next (ctxrules.carry)
reaches exactly what a full pass over the same list reaches.

Real transcripts are replayed a few messages at a time, each new list holding the last one's
message objects with the new ones appended (what a warm turn hands the stages). At every cut,
one long-lived stage instance (carrying over) and a fresh instance (a full pass) run on the
same list; what they protect, report and keep in their state must be the same.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from compress_kit import make_ctx
from conftest import load_transcript

from ctxrules.carry import Carry
from ctxrules.stages.compress_intent import IntentStage

pytestmark = pytest.mark.corpus

# Sessions whose asks and steps name files and modules (the intent has terms and failed calls).
TRANSCRIPT_NAMES = ["claudecode-ae4a77f8", "claudecode-258c7280", "minisweagent-django__django-11815"]
STEPS = (1, 2, 3)


def _intent_run(stage: IntentStage, messages: list[dict[str, Any]], tmp_path: Path) -> dict[str, Any]:
    ctx = make_ctx(tmp_path, window=400_000, session="s")
    ctx.session_id = "s"
    out = stage(messages, ctx)
    return {
        "protected": sorted(i for i, m in enumerate(messages) if id(m) in ctx.protected),
        "state": ctx.state,
        "actions": [a.as_dict() for a in out.actions],
    }


def _cuts(n: int, start: int) -> list[int]:
    cuts, at, k = [], start, 0
    while at < n:
        at = min(n, at + STEPS[k % len(STEPS)])
        cuts.append(at)
        k += 1
    return cuts


@pytest.mark.parametrize("name", TRANSCRIPT_NAMES)
def test_intent_carried_over_equals_a_full_pass(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    history = load_transcript(name)
    warm = IntentStage({})
    resumed: list[int] = []
    real_resume = Carry.resume

    def spying(self: Carry[Any], session: str, messages: Any, key: Any, **kwargs: Any) -> Any:
        got = real_resume(self, session, messages, key, **kwargs)
        resumed.append(got[0])
        return got

    monkeypatch.setattr(Carry, "resume", spying)
    current: list[dict[str, Any]] = []
    with_terms = 0
    for cut in _cuts(len(history), min(10, len(history))):
        current = [*current, *history[len(current) : cut]]  # the same objects, new ones appended
        got = _intent_run(warm, current, tmp_path)
        want = _intent_run(IntentStage({}), current, tmp_path)
        assert got == want, f"{name}: the carried-over intent differs from a full pass at {cut} messages"
        with_terms += bool(got["protected"])
    # The comparison means something: the intent protected messages, and the carry was used.
    assert with_terms > 0
    assert any(start > 0 for start in resumed)


def _plain(messages: list[dict[str, Any]]) -> str:
    return json.dumps(messages, sort_keys=True, default=str)


@pytest.mark.parametrize("name", TRANSCRIPT_NAMES)
@pytest.mark.parametrize("window", [400_000, 32_000])
def test_tool_output_filter_carried_over_equals_a_full_pass(name: str, window: int, tmp_path: Path) -> None:
    """The filter keeps the outputs it examined and the digests it sent from the last call;
    its result on the next list (the last output with new messages appended) must be the one
    a fresh instance computes on the same list with the same saved state."""
    from ctxrules.stages.tool_output_filter import ToolOutputFilter

    history = load_transcript(name)
    # Low caps, so that outputs are reduced (and settled, and left alone next time) all along.
    options = {"item_tokens": 400, "turn_tokens": 1500}
    warm = ToolOutputFilter(options)
    current: list[dict[str, Any]] = []
    state: dict[str, Any] = {}
    reduced = 0
    for cut in _cuts(len(history), min(10, len(history))):
        current = [*current, *history[len(current) : cut]]
        fresh_state = json.loads(json.dumps(state))
        ctx = make_ctx(tmp_path, window=window, session="s", state=state)
        got = warm(current, ctx)
        ref_ctx = make_ctx(tmp_path, window=window, session="s", state=fresh_state)
        want = ToolOutputFilter(options)(current, ref_ctx)
        assert _plain(got.messages) == _plain(want.messages), f"{name}@{window}: output differs at {cut} messages"
        assert [a.as_dict() for a in got.actions] == [a.as_dict() for a in want.actions]
        assert ctx.state == ref_ctx.state
        reduced += sum(a is not b for a, b in zip(got.messages, current, strict=True))
        current = list(got.messages)  # the next turn extends this turn's output
    assert reduced > 0  # the comparison covered outputs the filter changed


@pytest.mark.parametrize("name", TRANSCRIPT_NAMES)
@pytest.mark.parametrize("model", ["gpt-4o", "claude-sonnet-4-5"])
def test_cache_markers_carried_over_equals_a_full_pass(name: str, model: str, tmp_path: Path) -> None:
    """The cache stage keeps the history digests (list and string) of its last call; on the
    next list it must report, mark and save exactly what a fresh instance does with the same
    saved state. Every few turns an old message is replaced (a compaction), so the carried
    digests are edited, not only appended to."""
    from ctxrules.stages.cache_markers import CacheMarkers

    history = load_transcript(name)
    warm = CacheMarkers({})
    current: list[dict[str, Any]] = []
    state: dict[str, Any] = {}
    clock = 1_750_000_000.0
    for n, cut in enumerate(_cuts(len(history), min(10, len(history)))):
        current = [*current, *history[len(current) : cut]]
        if n % 7 == 6 and len(current) > 8:
            i = len(current) // 2
            current[i] = {**current[i], "content": f"[compacted {n}]"}
        clock += 10
        fresh_state = json.loads(json.dumps(state))
        ctx = make_ctx(tmp_path, window=200_000, model=model, session="s", state=state)
        ctx.clock = clock
        got = warm(current, ctx)
        ref_ctx = make_ctx(tmp_path, window=200_000, model=model, session="s", state=fresh_state)
        ref_ctx.clock = clock
        want = CacheMarkers({})(current, ref_ctx)
        assert _plain(got.messages) == _plain(want.messages), f"{name}/{model}: output differs at {cut} messages"
        assert [a.as_dict() for a in got.actions] == [a.as_dict() for a in want.actions]
        assert (got.request, got.warnings) == (want.request, want.warnings)
        assert ctx.state == ref_ctx.state
        current = list(got.messages)


def test_cache_markers_take_out_what_they_extend() -> None:
    """One stage instance serves every session of its engine (each finds its own memo), and
    prepares may run at the same time in other threads (litellm's hook, ``aprepare``): a call
    takes its session's digests out while it extends them in place, so a call that fails on
    the way, or one of the same session at the same time, finds nothing half-changed; what it
    puts back is what a stage that kept nothing computes."""
    from ctxrules.stages.cache_markers import CacheMarkers

    history = load_transcript(TRANSCRIPT_NAMES[0])[:40]
    stage = CacheMarkers({})
    stage._shorts(history[:30], 0)
    assert stage._last_history.get("") is not None
    real_short = stage._short

    def failing(msg: Any) -> str:
        raise RuntimeError("boom")

    stage._short = failing  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        stage._shorts([*history[:30], history[30]], 0)
    assert stage._last_history.get("") is None  # taken out, not put back half-changed
    stage._short = real_short  # type: ignore[method-assign]
    stage._shorts(history[:30], 0)
    replaced = [*history[:5], {**history[5], "content": "[replaced]"}, *history[6:]]
    for extended in ([*history[:30], *history[30:]], replaced):
        got = stage._shorts(extended, 0)
        want = CacheMarkers({})._shorts(extended, 0)
        assert got == want
        assert stage._last_history.get("")[2:] == (list(map(stage._short, extended)), want)  # type: ignore[index]
