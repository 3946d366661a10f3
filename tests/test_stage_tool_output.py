"""``tool_output.filter``: compressors (a), structure-aware reduction (b), hard spill (c),
sub-agent handover, exemptions, hot-cache bypass, predictive strength, the semantic-filter
hook, and behaviour on real transcripts."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import transcript_paths
from filtering_kit import (
    Msg,
    assert_markers_resolve,
    call,
    make_ctx,
    step,
    text_of,
    user,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from invariants import pairing_problems

from ctxrules import Engine
from ctxrules.compressors.api import CompressResult
from ctxrules.hookspecs import hookimpl
from ctxrules.plugins import default_registry
from ctxrules.stages.tool_output_filter import STAGE_TYPE, ToolOutputFilter, keep_ratio
from ctxrules.structure import pinned_indices
from ctxrules.vault import parse_markers

BIG_TEXT = "".join(f"collecting item {i} ... ok\n" for i in range(3000))  # 85K chars, ~24K tokens
BIG_JSON = json.dumps(
    {"results": [{"id": i, "path": f"src/m{i}.py", "score": i / 3, "tags": ["x", "y"]} for i in range(1000)]}
)


def convo(*steps_: list[Msg], tail: bool = True) -> list[Msg]:
    msgs: list[Msg] = [{"role": "system", "content": "sys"}, user("fix it")]
    for s in steps_:
        msgs.extend(s)
    if tail:  # a newest step that pins nothing of interest
        msgs.extend(step("last", "ok"))
    return msgs


def run(
    messages: list[Msg], tmp_path: Path, options: dict[str, Any] | None = None, **ctx_args: Any
) -> tuple[list[Msg], Any, Any]:
    ctx = make_ctx(tmp_path, **ctx_args)
    outcome = ToolOutputFilter(options)(messages, ctx)
    return outcome.messages, outcome, ctx


def kinds(outcome: Any) -> list[str]:
    return [a.kind for a in outcome.actions]


# --- level (b): single outputs ---------------------------------------------------------------


def test_a_big_text_output_is_reduced_to_head_and_tail_with_the_original_in_the_vault(tmp_path: Path) -> None:
    messages = convo(step("a", BIG_TEXT, command="pytest -q"))
    out, outcome, ctx = run(messages, tmp_path, {"compressors": False})
    assert kinds(outcome) == ["reduce"]
    reduced = out[3]["content"]
    assert reduced.startswith("collecting item 0 ... ok\n") and "collecting item 2999" in reduced
    assert ctx.counter.count_text(reduced) <= 5000 * 0.6
    action = outcome.actions[0]
    assert action.tokens_saved > 20_000
    assert ctx.vault.get_text(action.vault_id) == BIG_TEXT  # the whole original, byte-identical
    marker = next(m for m in parse_markers(reduced) if m.kind == "lines")
    assert marker.lines is not None
    cut = ctx.vault.get_lines(marker.vault_id, *marker.lines).decode()
    head, _, tail = reduced.partition(marker.ref)
    head = head[: head.rindex("\n") + 1]
    tail = tail[tail.index("\n") + 1 :]
    assert head + cut + tail == BIG_TEXT


def test_a_big_json_output_keeps_a_valid_skeleton(tmp_path: Path) -> None:
    messages = convo(step("a", BIG_JSON, "mcp__search__query", q="x"))
    out, outcome, ctx = run(messages, tmp_path)
    doc = json.loads(out[3]["content"])
    assert doc["_ctxrules"].startswith("[ctxrules:elided kind=json")
    assert any(isinstance(x, str) and "more items" in x for x in doc["results"])
    assert ctx.vault.get_text(outcome.actions[0].vault_id) == BIG_JSON


def test_outputs_under_the_item_threshold_are_left_alone(tmp_path: Path) -> None:
    small = "".join(f"line {i}\n" for i in range(200))
    messages = convo(step("a", small), step("b", small))
    out, outcome, _ = run(messages, tmp_path)
    assert outcome.actions == [] and all(a is b for a, b in zip(out, messages, strict=True))


# --- level (b): a step over turn_tokens ------------------------------------------------------


def test_a_step_whose_outputs_together_exceed_turn_tokens_is_capped(tmp_path: Path) -> None:
    part = "".join(f"entry {i} of a moderately long listing\n" for i in range(450))  # ~4.5K tokens
    calls = [
        {
            "id": f"p{i}",
            "type": "function",
            "function": {"name": "Bash", "arguments": json.dumps({"command": f"ls {i}"})},
        }
        for i in range(5)
    ]
    parallel: list[Msg] = [{"role": "assistant", "content": None, "tool_calls": calls}]
    parallel += [{"role": "tool", "tool_call_id": f"p{i}", "content": part} for i in range(5)]
    messages = convo(parallel)
    ctx_probe = make_ctx(tmp_path)
    each = ctx_probe.counter.count_text(part)
    assert each < 5000 < 15_000 < each * 5  # only the turn rule can fire
    out, outcome, ctx = run(messages, tmp_path, {"compressors": False})
    assert kinds(outcome) == ["reduce"] * 5
    total = sum(ctx.counter.count_message(out[i]) for i in range(3, 8))
    assert total <= 15_000 * 0.6 + 50


def test_exempt_outputs_count_toward_the_turn_but_are_not_reduced(tmp_path: Path) -> None:
    file_text = "".join(f"    code line {i}\n" for i in range(1600))  # ~8K tokens, a file read
    log = "".join(f"log entry {i}: something happened\n" for i in range(700))  # ~4.9K tokens
    calls = [call("r", "Read", file_path="a.py"), call("b", command="make"), call("c", command="make")]
    block: list[Msg] = [
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "r", "content": file_text},
        {"role": "tool", "tool_call_id": "b", "content": log},
        {"role": "tool", "tool_call_id": "c", "content": log + "more\n"},
    ]
    messages = convo(block)
    out, outcome, _ = run(messages, tmp_path, {"compressors": False})
    assert out[3] is messages[3]  # the Read result is exempt
    assert out[4] is not messages[4] and out[5] is not messages[5]
    assert {a.index for a in outcome.actions} == {4, 5}


def test_file_read_and_edit_outputs_are_exempt_even_when_huge(tmp_path: Path) -> None:
    messages = convo(
        step("r", BIG_TEXT, "Read", file_path="x.py"),
        step("e", BIG_TEXT + "!", "str_replace_editor", command="view", path="/x"),
    )
    out, outcome, _ = run(messages, tmp_path)
    assert outcome.actions == [] and out[3] is messages[3] and out[5] is messages[5]


def test_exempt_roles_can_be_changed(tmp_path: Path) -> None:
    messages = convo(step("r", BIG_TEXT, "Read", file_path="x.py"))
    _, outcome, _ = run(messages, tmp_path, {"exempt_roles": []})
    assert kinds(outcome) == ["reduce"]


# --- pinned, protected, and the hard spill (c) ------------------------------------------------


def test_pinned_outputs_are_not_reduced_but_are_spilled_over_spill_chars(tmp_path: Path) -> None:
    huge = "".join(f"{i:08d} " + "data " * 20 + "\n" for i in range(1200))  # ~130K chars
    messages = [{"role": "system", "content": "sys"}, user("go"), *step("a", BIG_TEXT), *step("n", huge)]
    pins = pinned_indices(messages)
    assert {4, 5} <= pins and 3 not in pins
    out, outcome, ctx = run(messages, tmp_path, {"compressors": False})
    by_index = {a.index: a for a in outcome.actions}
    assert by_index[3].kind == "reduce"
    assert by_index[5].kind == "spill"
    assert ctx.vault.get_text(by_index[5].vault_id) == huge
    first = parse_markers(out[5]["content"].splitlines()[0])[0]
    assert first.extra["reason"] == "spill" and first.lines is None
    assert len(out[5]["content"]) < 5_000


def test_the_hard_spill_applies_to_every_message_role_and_to_protected_ones(tmp_path: Path) -> None:
    huge = "x" * 120_000
    system = {"role": "system", "content": huge}
    anchor = {"role": "user", "content": [{"type": "text", "text": "short"}, {"type": "text", "text": huge}]}
    reply = {"role": "assistant", "content": huge}
    messages = [system, anchor, reply, user("latest")]
    out, outcome, _ctx = run(messages, tmp_path, protected=[id(reply)])
    assert [a.kind for a in outcome.actions] == ["spill", "spill", "spill"]
    assert out[1]["content"][0] == {"type": "text", "text": "short"}
    assert out[1]["content"][1]["text"].startswith("[ctxrules:elided kind=lines count=1 ")
    assert all(len(text_of(m)) < 5_000 for m in out)


def test_protected_outputs_are_not_reduced(tmp_path: Path) -> None:
    messages = convo(step("a", BIG_TEXT))
    out, outcome, _ = run(messages, tmp_path, protected=[id(messages[3])])
    assert outcome.actions == [] and out[3] is messages[3]


# --- sub-agent handover ----------------------------------------------------------------------

REPORT = (
    "Done with the investigation.\n\n## Changes made\n- Fixed `src/app/db.py` pooling\n"
    "- Added tests/test_db.py\n\n## Next steps\n- Roll out to staging\n\n"
    "## Risks\n- Migration 0042 is irreversible\n\n" + "".join(f"trace {i}: detail detail detail\n" for i in range(400))
)


def test_a_long_subagent_result_becomes_head_tail_pointer_and_handover(tmp_path: Path) -> None:
    messages = convo(step("t", REPORT, "Task", prompt="investigate", description="db"))
    out, outcome, ctx = run(messages, tmp_path)
    assert kinds(outcome) == ["handover"]
    text = out[3]["content"]
    assert "done:\n- Fixed src/app/db.py pooling\n- Added tests/test_db.py" in text
    assert "todo:\n- Roll out to staging" in text
    assert "risks:\n- Migration 0042 is irreversible" in text
    assert "files: src/app/db.py, tests/test_db.py" in text
    assert "trace 399" in text and "Done with the investigation." in text
    assert ctx.vault.get_text(outcome.actions[0].vault_id) == REPORT
    assert len(text) < len(REPORT) / 2


def test_a_huge_subagent_result_gets_the_handover_not_the_spill(tmp_path: Path) -> None:
    huge = REPORT + "".join(f"trace line {i}: " + "z" * 80 + "\n" for i in range(1500))
    assert len(huge) > 100_000
    messages = convo(step("t", huge, "Task", prompt="p"))
    out, outcome, ctx = run(messages, tmp_path)
    assert kinds(outcome) == ["handover"]
    assert "todo:\n- Roll out to staging" in out[3]["content"]
    assert ctx.vault.get_text(outcome.actions[0].vault_id) == huge
    # Pinned, it cannot be handed over: the hard spill applies.
    pinned = convo(step("t", huge, "Task", prompt="p"), tail=False)
    _, outcome, _ = run(pinned, tmp_path / "p")
    assert kinds(outcome) == ["spill"]


def test_a_short_subagent_result_is_kept(tmp_path: Path) -> None:
    messages = convo(step("t", REPORT[:7000], "Task", prompt="p"))
    out, outcome, _ = run(messages, tmp_path)
    assert outcome.actions == [] and out[3] is messages[3]


# --- level (a): compressors -------------------------------------------------------------------


def _fake_compressors(
    monkeypatch: pytest.MonkeyPatch, seen: list[tuple[Any, ...]], with_marker: bool = False, raise_: bool = False
) -> None:
    def fake(
        pack: dict[str, Any], command: str, output: str, exit_code: int | None, vault: Any, *, registry: Any
    ) -> CompressResult | None:
        assert registry is default_registry()  # the context's registry reaches the compressors
        seen.append((command, exit_code))
        if raise_:
            raise RuntimeError("rule exploded")
        if not command.startswith("git status"):
            return None
        vid = vault.put_text(output)
        text = "M src/a.py (3 files changed)"
        if with_marker:
            text += f"\n[ctxrules:elided kind=lines count=40 ref=vault://{vid}]"
        return CompressResult(
            text=text, rule_id="git-status", vault_id=vid, lines_before=len(output.splitlines()), lines_after=1
        )

    monkeypatch.setattr("ctxrules.stages.tool_output_filter.compress_tool_output", fake)


def test_shell_outputs_go_through_the_compressors_with_command_and_exit_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[Any, ...]] = []
    _fake_compressors(monkeypatch, seen)
    status = "".join(f"\tmodified:   src/f{i}.py\n" for i in range(40)) + "Exit code 0"
    loud = "".join(f"hello {i}\n" for i in range(150)) + "Exit code 3"
    messages = convo(
        step("g", status, command="git status"),
        step("h", loud, command="echo hello"),
        step("t", "hi\nExit code 0", command="echo hi"),
        step("m", status, "mcp__git__status", command="git status"),
    )
    out, outcome, ctx = run(messages, tmp_path)
    # Shell role only, and not outputs within min_saving_tokens (they cannot save that much).
    assert seen == [("git status", 0), ("echo hello", 3)]
    assert kinds(outcome) == ["compress"]
    text = out[3]["content"]
    assert text.startswith("M src/a.py (3 files changed)\n[ctxrules:elided kind=lines count=40 ")
    marker = parse_markers(text)[0]
    assert marker.extra["rule"] == "git-status"
    assert ctx.vault.get_text(marker.vault_id) == status


def test_a_compressor_marker_is_not_doubled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_compressors(monkeypatch, [], with_marker=True)
    messages = convo(step("g", "modified: some/file.py\n" * 40, command="git status"))
    out, _, _ = run(messages, tmp_path)
    assert len(parse_markers(out[3]["content"])) == 1


def test_a_failing_compressor_is_a_warning_not_a_lost_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_compressors(monkeypatch, [], raise_=True)
    messages = convo(step("g", BIG_TEXT, command="git status"))
    _out, outcome, _ = run(messages, tmp_path)
    assert kinds(outcome) == ["reduce"]  # level (b) still applies
    assert "compressor failed" in outcome.warnings[0] and "rule exploded" in outcome.warnings[0]


def test_without_a_registry_in_the_context_level_a_is_a_no_op(tmp_path: Path) -> None:
    # A context built by hand without the engine's registry has no compressor actions to run
    # (never the process-wide default: a plugin given to Engine.load would be missed).
    messages = convo(step("g", "x\n" * 40, command="git status"))
    ctx = dataclasses.replace(make_ctx(tmp_path), registry=None)
    outcome = ToolOutputFilter(None)(messages, ctx)
    assert outcome.actions == [] and outcome.messages[3] is messages[3]


# --- hot-cache bypass -------------------------------------------------------------------------


def test_already_sent_outputs_are_left_alone_while_the_cache_is_hot(tmp_path: Path) -> None:
    messages = convo(step("a", BIG_TEXT))
    state: dict[str, Any] = {}
    # A first run in which the output was pinned (the newest step) records it as sent.
    first = messages[:-2]
    run(first, tmp_path, {"compressors": False}, state=state)
    assert state["sent"]
    out, outcome, _ = run(messages, tmp_path, {"compressors": False}, state=state, cache_hot=True)
    assert out[3] is messages[3] and kinds(outcome) == ["hot_cache_bypass"]
    # Cold cache, or the bypass off, or utilization at bypass_below: reduced.
    cases: list[tuple[dict[str, Any], dict[str, Any]]] = [
        ({}, {"cache_hot": False}),
        ({"hot_cache_bypass": False}, {"cache_hot": True}),
        ({}, {"cache_hot": True, "tier": "full"}),
    ]
    for extra, ctx_args in cases:
        out, outcome, _ = run(
            messages, tmp_path, {"compressors": False, **extra}, state=copy.deepcopy(state), **ctx_args
        )
        assert kinds(outcome) == ["reduce"], (extra, ctx_args)


def test_an_output_sent_with_the_cache_breakpoint_on_it_is_still_sent_once_it_moves(tmp_path: Path) -> None:
    # Anthropic: cache.markers puts the rolling breakpoint on the last message, turning its
    # content into one text part with cache_control; the next call runs on that output and
    # the breakpoint moves on. The output was sent all the same: reducing it now would rewrite
    # the cached prefix (a cache break on a realistic agent loop, found by replaying one).
    messages = convo(step("a", BIG_TEXT))
    with_marker = copy.deepcopy(messages)
    text = with_marker[3]["content"]
    with_marker[3]["content"] = [{"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}]
    state: dict[str, Any] = {}
    run(with_marker[:-2], tmp_path, {"compressors": False}, state=state)
    run(with_marker, tmp_path, {"compressors": False}, state=state, cache_hot=True)  # seen with the marker
    out, outcome, _ = run(messages, tmp_path, {"compressors": False}, state=state, cache_hot=True)
    assert out[3] is messages[3] and kinds(outcome) == ["hot_cache_bypass"]


def test_a_new_output_is_reduced_even_when_the_cache_is_hot(tmp_path: Path) -> None:
    messages = convo(step("a", BIG_TEXT))
    _out, outcome, _ = run(messages, tmp_path, {"compressors": False}, state={"sent": []}, cache_hot=True)
    assert kinds(outcome) == ["reduce"]


def test_outputs_no_keep_ratio_can_touch_stay_settled_when_trimming_gets_harder(tmp_path: Path) -> None:
    medium = "".join(f"line {i}: ok\n" for i in range(200))  # over min_saving, under item_tokens
    reduced_once = "".join(f"collecting item {i} ... ok\n" for i in range(3000))
    messages = convo(step("a", medium), step("b", medium), step("c", reduced_once))
    stage = ToolOutputFilter({"compressors": False})
    state: dict[str, Any] = {}
    first = stage(messages, make_ctx(tmp_path, state=state))
    assert kinds(first) == ["reduce"] and state["sent"]
    # The window filled up (a lower keep ratio) and the prompt cache is hot: the medium outputs
    # could not be reduced at any ratio and the reduced one carries its marker, so nothing is
    # re-examined, and nothing is reported as left alone for the cache's sake.
    later = stage(first.messages, make_ctx(tmp_path, state=state, utilization=0.85, cache_hot=True))
    assert later.messages == first.messages and kinds(later) == []
    # A fresh instance examines the marked output once (it is not "hot"), then settles it.
    fresh = ToolOutputFilter({"compressors": False})
    again = fresh(first.messages, make_ctx(tmp_path, state=copy.deepcopy(state), utilization=0.85, cache_hot=True))
    assert kinds(again) == ["hot_cache_bypass"] and "2 output(s)" in again.actions[0].detail


# --- predictive strength ----------------------------------------------------------------------


def test_the_less_budget_remains_the_harder_it_trims(tmp_path: Path) -> None:
    assert keep_ratio(0.0, 0.9, 0.15, 0.6) == pytest.approx(0.6)
    assert keep_ratio(0.45, 0.9, 0.15, 0.6) == pytest.approx(0.375)
    assert keep_ratio(0.95, 0.9, 0.15, 0.6) == pytest.approx(0.15)
    messages = convo(step("a", BIG_TEXT))
    sizes = []
    for utilization in (0.1, 0.5, 0.85):
        out, _, ctx = run(messages, tmp_path / str(utilization), {"compressors": False}, utilization=utilization)
        sizes.append(ctx.counter.count_text(out[3]["content"]))
    assert sizes[0] > sizes[1] > sizes[2]
    assert sizes[0] <= 5000 * keep_ratio(0.1, 0.9, 0.15, 0.6)


# --- the semantic filter hook -----------------------------------------------------------------


class _Semantic:
    def __init__(self, answer: Any = "SUMMARY: 4000 items collected, all ok") -> None:
        self.answer = answer
        self.calls: list[int] = []

    @hookimpl
    def ctxrules_semantic_filter(self, text: str, budget_tokens: int, ctx: Any) -> Any:
        self.calls.append(budget_tokens)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def _hooks(plugin: Any) -> Any:
    from ctxrules.plugins import build_plugin_manager

    pm, _ = build_plugin_manager([("semantic", plugin)], entry_points=False)
    return pm.hook


@pytest.mark.parametrize(
    ("answer", "used"),
    [
        ("SUMMARY: 4000 items collected, all ok", True),
        (None, False),
        (RuntimeError("llm down"), False),
        ("x" * 200_000, False),  # over its budget
    ],
)
def test_the_semantic_filter_plugin_is_used_only_when_enabled_and_sane(tmp_path: Path, answer: Any, used: bool) -> None:
    plugin = _Semantic(answer)
    messages = convo(step("a", BIG_TEXT))
    out, outcome, ctx = run(messages, tmp_path, {"compressors": False, "semantic_filter": True}, hooks=_hooks(plugin))
    assert plugin.calls and plugin.calls[0] <= 3000
    text = out[3]["content"]
    if used:
        assert text.startswith("[ctxrules:elided kind=tokens") and "reason=semantic" in text
        assert text.endswith("SUMMARY: 4000 items collected, all ok")
        assert ctx.vault.get_text(parse_markers(text)[0].vault_id) == BIG_TEXT
    else:
        assert "collecting item 0" in text  # the structure-aware reduction
    if isinstance(answer, Exception) or (isinstance(answer, str) and not used):
        assert outcome.warnings


def test_the_semantic_filter_is_not_called_when_off_or_for_structured_output(tmp_path: Path) -> None:
    plugin = _Semantic()
    run(convo(step("a", BIG_TEXT)), tmp_path, {"compressors": False}, hooks=_hooks(plugin))
    run(convo(step("a", BIG_JSON)), tmp_path, {"semantic_filter": True}, hooks=_hooks(plugin))
    assert plugin.calls == []


def test_the_semantic_filter_hook_works_through_engine_plugins(tmp_path: Path) -> None:
    plugin = _Semantic()
    pack = tmp_path / "pack.yaml"
    pack.write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: t, version: 1.0.0}\n"
        "pipeline:\n  - {id: outputs, use: tool_output.filter, "
        "with: {semantic_filter: true, compressors: false}}\n"
    )
    engine = Engine.load(pack, plugins=[("semantic", plugin)])
    result = engine.session(tmp_path / "s", model="gpt-4o").prepare(convo(step("a", BIG_TEXT)))
    assert result.messages[3]["content"].endswith("SUMMARY: 4000 items collected, all ok")


# --- invariants -------------------------------------------------------------------------------


def test_input_is_not_mutated_unchanged_messages_are_the_same_objects_and_rerun_is_a_no_op(tmp_path: Path) -> None:
    messages = convo(
        step("a", BIG_TEXT),
        step("j", BIG_JSON, "mcp__x"),
        step("t", REPORT, "Task"),
        step("s", "small"),
        step("h", "y" * 150_000),
    )
    frozen = copy.deepcopy(messages)
    ctx = make_ctx(tmp_path)
    stage = ToolOutputFilter({"compressors": False})
    out = stage(messages, ctx).messages
    assert messages == frozen
    changed = {i for i, (a, b) in enumerate(zip(messages, out, strict=True)) if a is not b}
    assert changed == {3, 5, 7, 11}
    again = stage(out, ctx)
    assert again.actions == [] and all(a is b for a, b in zip(out, again.messages, strict=True))
    assert assert_markers_resolve(out, ctx.vault) >= 5


_OUTPUTS = st.sampled_from(
    [
        "ok",
        "".join(f"row {i}: value\n" for i in range(1500)),
        BIG_JSON,
        "".join(f"collecting item {i} ... ok\n" for i in range(600)),
    ]
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    turns=st.lists(
        st.tuples(
            st.lists(_OUTPUTS, min_size=1, max_size=3), st.sampled_from([0.0, 0.3, 0.85]), st.booleans(), st.booleans()
        ),
        min_size=2,
        max_size=6,
    )
)
def test_a_warm_stage_decides_like_a_fresh_one(tmp_path: Path, turns: list[Any]) -> None:
    """The stage carries what it examined from call to call; a new instance on the same input
    (and the same state) must decide exactly the same on every turn."""
    warm = ToolOutputFilter({"compressors": False})
    state: dict[str, Any] = {}
    history: list[Msg] = [{"role": "system", "content": "sys"}, user("fix it")]
    for n, (outputs, utilization, hot, protect) in enumerate(turns):
        history = list(history)
        calls = [call(f"t{n}_{k}") for k in range(len(outputs))]
        history.append({"role": "assistant", "content": None, "tool_calls": calls})
        history.extend(
            {"role": "tool", "tool_call_id": c["id"], "content": o} for c, o in zip(calls, outputs, strict=True)
        )
        protected = [id(history[-1])] if protect and len(history) > 6 else []
        fresh_state = copy.deepcopy(state)
        got = warm(
            history, make_ctx(tmp_path, utilization=utilization, cache_hot=hot, state=state, protected=protected)
        )
        want = ToolOutputFilter({"compressors": False})(
            history, make_ctx(tmp_path, utilization=utilization, cache_hot=hot, state=fresh_state, protected=protected)
        )
        assert got.messages == want.messages
        # The hot-cache count differs on purpose: the warm stage knows which outputs it left
        # alone before and counts only the ones a cold cache would have let it examine.
        assert [(a.kind, a.detail) for a in got.actions if a.kind != "hot_cache_bypass"] == [
            (a.kind, a.detail) for a in want.actions if a.kind != "hot_cache_bypass"
        ]
        assert state == fresh_state
        history = got.messages


def test_options_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="item_tokens"):
        ToolOutputFilter({"item_tokens": 0})
    with pytest.raises(ValueError, match="min_keep_ratio"):
        ToolOutputFilter({"min_keep_ratio": 0.9, "max_keep_ratio": 0.5})
    assert STAGE_TYPE.options_schema["properties"]["item_tokens"]["default"] == 5000
    for name, prop in STAGE_TYPE.options_schema["properties"].items():
        assert prop.get("title") and prop.get("description"), name


@pytest.mark.parametrize(
    "options",
    [
        "{item_tokens: -5}",
        "{spill_char: 10}",
        "{json: {depth: 0}}",
        "{exempt_roles: [reader]}",
        "{bypass_below: never}",
    ],
)
def test_bad_options_are_rejected_by_validate(tmp_path: Path, cli: Any, options: str) -> None:
    pack = tmp_path / "pack.yaml"
    pack.write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: t, version: 1.0.0}\n"
        f"pipeline:\n  - {{id: outputs, use: tool_output.filter, with: {options}}}\n"
    )
    code, out, err = cli("validate", str(pack))
    assert code == 1 and "CR061" in out + err


# --- real transcripts -------------------------------------------------------------------------


def _filter_pack(tmp_path: Path) -> Path:
    pack = tmp_path / "pack.yaml"
    pack.write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: t, version: 1.0.0}\n"
        "extends: [builtin:default]\npipeline:\n"
        "  - {id: outputs, with: {item_tokens: 3000, turn_tokens: 9000}}\n"
    )
    return pack


@pytest.mark.corpus
@pytest.mark.parametrize(
    "name",
    [
        "claudecode-fa812bfe",
        "claudecode-subagent-afc096d",
        "openhands-ponylang__ponyc-4595",
        "minisweagent-mwaskom__seaborn-3069",
    ],
)
def test_real_transcripts_reduce_only_what_they_may_and_every_ref_is_the_exact_original(
    tmp_path: Path, name: str
) -> None:
    path = next(p for p in transcript_paths() if p.stem == name)
    history = json.loads(path.read_text())
    frozen = copy.deepcopy(history)
    engine = Engine.load(_filter_pack(tmp_path))
    session = engine.session(tmp_path / "s", model="gpt-4o", window=1_000_000)
    result = session.prepare(history)
    assert history == frozen
    assert pairing_problems(result.messages) == []
    outputs = next(s for s in result.report["stages"] if s["id"] == "outputs")
    assert outputs["ran"] and not outputs.get("error")
    roles = {"Read", "Edit", "Write", "str_replace_editor"}
    names = {c["id"]: c["function"]["name"] for m in history for c in m.get("tool_calls") or []}
    pins = pinned_indices(history)
    assert len(result.messages) == len(history)
    for action in outputs["actions"]:
        i = action["index"]
        original = history[i]
        assert i not in pins and names.get(original.get("tool_call_id")) not in roles
        # The vault holds exactly what left the context.
        assert session.vault.get_text(action["vault_id"]) == original["content"]
        assert action["tokens_saved"] > 0
    for i, (before, after) in enumerate(zip(history, result.messages, strict=True)):
        if before["role"] == "tool" and names.get(before.get("tool_call_id")) in roles:
            assert after == before, i
    assert_markers_resolve(result.messages, session.vault)
    # Shell outputs may be compressed (level a) before they need a reduction (level b).
    expected = {
        "claudecode-fa812bfe": {"handover"},
        "claudecode-subagent-afc096d": {"reduce", "compress"},
        "openhands-ponylang__ponyc-4595": set(),
        "minisweagent-mwaskom__seaborn-3069": {"reduce", "compress"},
    }[name]
    found = {a["kind"] for a in outputs["actions"]}
    assert (found & expected) if expected else not found - {"compress"}
    # Invariant 4 through the session: preparing the same history again changes nothing.
    again = session.prepare(copy.deepcopy(history))
    assert again.messages == result.messages


@pytest.mark.corpus
def test_the_claudecode_bash_output_of_28k_chars_is_reduced_structure_aware(tmp_path: Path) -> None:
    path = next(p for p in transcript_paths() if p.stem == "claudecode-subagent-afc096d")
    history = json.loads(path.read_text())
    results = [i for i, m in enumerate(history) if m["role"] == "tool"]
    index = max(results, key=lambda i: len(text_of(history[i])))
    assert len(history[index]["content"]) > 25_000
    out, outcome, ctx = run(history, tmp_path, {"compressors": False})
    action = next(a for a in outcome.actions if a.index == index)
    assert action.kind == "reduce" and "head and tail" in action.detail
    reduced = out[index]["content"]
    assert reduced.splitlines()[0] == history[index]["content"].splitlines()[0]
    assert ctx.vault.get_text(action.vault_id) == history[index]["content"]
    for marker in parse_markers(reduced):
        if marker.lines:
            assert ctx.vault.get_lines(marker.vault_id, *marker.lines)


@pytest.mark.corpus
def test_every_transcript_passes_through_the_stage_without_error(tmp_path: Path) -> None:
    stage = ToolOutputFilter({"compressors": False})
    for path in transcript_paths():
        history = json.loads(path.read_text())
        ctx = make_ctx(tmp_path / path.stem, utilization=0.8)
        out = stage(history, ctx)
        again = stage(out.messages, ctx)
        assert again.actions == [], (path.name, [a.detail for a in again.actions])
        assert pairing_problems(out.messages) == pairing_problems(history)
        assert_markers_resolve(out.messages, ctx.vault)


def test_registered_as_a_builtin_stage() -> None:
    engine = Engine.load("builtin:default")
    assert any(p.type.name == "tool_output.filter" for p in engine.plan)


# --- properties over generated outputs ---------------------------------------------------------

_line = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=120)


@st.composite
def _output(draw: Any) -> str:
    kind = draw(st.sampled_from(["lines", "json", "csv", "xml", "blob", "tiny"]))
    n = draw(st.integers(1, 400))
    if kind == "lines":
        return "\n".join(draw(st.lists(_line, min_size=1, max_size=n)))
    if kind == "json":
        return json.dumps({"rows": [{"i": i, "v": draw(_line)} for i in range(n)]})
    if kind == "csv":
        return "a,b,c\n" + "".join(f"{i},{i * 2},x{i}\n" for i in range(n))
    if kind == "xml":
        return "<r>" + "".join(f"<i n='{i}'>{i}</i>" for i in range(n)) + "</r>"
    if kind == "blob":
        return "B" * draw(st.integers(100, 5000))
    return draw(_line)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    outputs=st.lists(
        st.tuples(st.sampled_from(["Bash", "Read", "Task", "mcp__x", "Grep"]), _output()), min_size=1, max_size=8
    ),
    utilization=st.floats(0, 1.2),
)
def test_any_outputs_filter_safely_and_come_back_from_the_vault(
    tmp_path_factory: pytest.TempPathFactory, outputs: list[tuple[str, str]], utilization: float
) -> None:
    messages: list[Msg] = [{"role": "system", "content": "s"}, user("go")]
    for n, (tool, text) in enumerate(outputs):
        messages.extend(step(f"c{n}", text, tool, command="cat x"))
    frozen = copy.deepcopy(messages)
    ctx = make_ctx(tmp_path_factory.mktemp("p"), utilization=utilization)
    stage = ToolOutputFilter(
        {
            "item_tokens": 60,
            "turn_tokens": 150,
            "spill_chars": 3000,
            "subagent_chars": 400,
            "subagent_keep_tokens": 60,
            "min_saving_tokens": 1,
            "compressors": False,
        }
    )
    outcome = stage(messages, ctx)
    assert messages == frozen
    assert pairing_problems(outcome.messages) == []
    pins = pinned_indices(messages)
    for action in outcome.actions:
        original = messages[action.index]
        assert action.index not in pins or action.kind == "spill"
        assert ctx.vault.get_text(action.vault_id) == original["content"]
    for i in pins:
        if len(text_of(messages[i])) <= 3000:
            assert outcome.messages[i] is messages[i]
    assert_markers_resolve(outcome.messages, ctx.vault)
    again = stage(outcome.messages, ctx)
    assert again.actions == [] and all(a is b for a, b in zip(outcome.messages, again.messages, strict=True))


def test_cli_run_then_vault_get_lines_returns_the_cut_lines(tmp_path: Path, cli: Any) -> None:
    history = convo(step("a", BIG_TEXT, command="pytest -q"))
    src, dst, session = tmp_path / "in.json", tmp_path / "out.json", tmp_path / "s"
    src.write_text(json.dumps(history))
    code, _, err = cli(
        "run",
        "--pack",
        str(_filter_pack(tmp_path)),
        "--model",
        "gpt-4o",
        "--input",
        str(src),
        "--output",
        str(dst),
        "--session",
        str(session),
    )
    assert code == 0, err
    reduced = json.loads(dst.read_text())[3]["content"]
    marker = next(m for m in parse_markers(reduced) if m.lines is not None)
    first, last = marker.lines
    code, out, err = cli("vault", "get", marker.vault_id[:12], "--lines", f"{first}:{last}", "--session", str(session))
    assert code == 0, err
    assert out == "".join(BIG_TEXT.splitlines(keepends=True)[first - 1 : last])


def test_a_spill_never_grows_what_it_stands_for(tmp_path: Path) -> None:
    """At a usable window of one token every message is over the hard-spill limit. A short one
    whose stand-in (marker, note, preview) would be longer stays as it is, and so does a
    stand-in on the next turn: before, "Fix it" became a 266-character stand-in, then a
    stand-in of the stand-in, 1,300 characters after four warm turns. A long message is still
    spilled, and stays the same stand-in turn after turn."""
    long = "".join(f"line {i} of a pasted log with some words\n" for i in range(200))
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "Fix it"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": long},
    ]
    session = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o", window=8193)
    seen: list[list[str]] = []
    for turn in range(5):
        result = session.prepare(history)
        contents = [m["content"] for m in result.messages if m["role"] == "user" and "<ctxrules:" not in m["content"]]
        seen.append(contents)
        assert "Fix it" in contents, contents
        assert all(len(c) <= len(long) for c in contents)
        history = [*history, {"role": "assistant", "content": f"ok {turn}"}]
    spilled = [c for c in seen[0] if c != "Fix it"]
    assert spilled and all(parse_markers(c) for c in spilled)
    assert all(turn[-1] == seen[0][-1] for turn in seen), "the long message's stand-in changed between turns"


def test_a_long_text_that_opens_like_a_stand_in_is_still_spilled(tmp_path: Path) -> None:
    """Only a short text whose spill marker says it stands for more is left alone as a stand-in:
    a 300,000-character paste opening with a copied spill marker is spilled like any other."""
    session = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o", window=32_000)
    stand_in = session.prepare(
        [{"role": "user", "content": "".join(f"pasted line {i} of a very long log\n" for i in range(20_000))}]
    ).messages[0]["content"]
    first_line = stand_in.split("\n", 1)[0]
    assert "reason=spill" in first_line
    paste = first_line + "\n" + "".join(f"another line {i} with words\n" for i in range(12_000))
    out = session.prepare([{"role": "user", "content": "Fix it"}, {"role": "assistant", "content": "ok"},
                           {"role": "user", "content": paste}]).messages  # fmt: skip
    assert len(out[-1]["content"]) < len(paste) // 10
