"""``ttl.prune``: tool results past an age in steps or seconds are archived to the vault and
replaced by a placeholder marker; pinned, protected, small and already-archived results stay."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import transcript_paths
from filtering_kit import Msg, make_ctx, step, user
from invariants import pairing_problems

from ctxrules import Engine
from ctxrules.stages.ttl_prune import STAGE_TYPE, TtlPrune, message_time
from ctxrules.structure import pinned_indices
from ctxrules.vault import parse_marker

# About 900 tokens.
OUTPUT = "".join(f"src/module_{i}.py:{i}: warning: unused import\n" for i in range(60))


def history(n_steps: int, output: str = OUTPUT) -> list[Msg]:
    msgs: list[Msg] = [{"role": "system", "content": "sys"}, user("clean up the warnings")]
    for i in range(n_steps):
        msgs.extend(step(f"c{i}", f"{output}# run {i}\n", command=f"lint --pass {i}"))
    return msgs


def run(
    messages: list[Msg], tmp_path: Path, options: dict[str, Any] | None = None, **ctx_args: Any
) -> tuple[list[Msg], Any, Any]:
    ctx = make_ctx(tmp_path, **ctx_args)
    outcome = TtlPrune(options)(messages, ctx)
    return outcome.messages, outcome, ctx


def result_indices(messages: list[Msg]) -> list[int]:
    return [i for i, m in enumerate(messages) if m["role"] == "tool"]


def test_results_older_than_max_age_steps_are_archived(tmp_path: Path) -> None:
    messages = history(10)
    out, outcome, ctx = run(messages, tmp_path, {"max_age_steps": 4})
    results = result_indices(messages)  # step k's result; the newest step has age 0
    archived = [a.index for a in outcome.actions]
    assert archived == results[:6]  # ages 9..4
    for action in outcome.actions:
        marker = parse_marker(out[action.index]["content"])
        assert marker.extra["reason"] == "ttl" and marker.extra["tool"] == "Bash"
        assert int(marker.extra["age_steps"]) >= 4
        assert ctx.vault.get_text(marker.vault_id) == messages[action.index]["content"]
        assert marker.count == messages[action.index]["content"].count("\n")
        assert action.tokens_saved > 500
    assert all(out[i] is messages[i] for i in results[6:])


def test_the_default_age_is_30_steps(tmp_path: Path) -> None:
    messages = history(33)
    _, outcome, _ = run(messages, tmp_path)
    assert len(outcome.actions) == 3


def test_pinned_protected_and_small_results_are_never_archived(tmp_path: Path) -> None:
    messages = history(6)
    messages[3] = {**messages[3], "content": "ok"}  # small
    results = result_indices(messages)
    out, outcome, _ = run(messages, tmp_path, {"max_age_steps": 1}, protected=[id(messages[results[1]])])
    archived = {a.index for a in outcome.actions}
    assert archived == set(results[2:5])
    assert results[-1] in pinned_indices(messages) and out[results[-1]] is messages[results[-1]]


def test_message_timestamps_give_the_age_in_seconds(tmp_path: Path) -> None:
    now = 1_700_000_000.0
    messages = history(4)
    results = result_indices(messages)
    # 2 h old, 1 h old (epoch ms), 10 min old (ISO, the clock is 2023-11-14T22:13:20Z), newest.
    stamps: list[Any] = [now - 7200, (now - 3600) * 1000, "2023-11-14T22:03:20Z", now - 10]
    for index, stamp in zip(results, stamps, strict=True):
        messages[index] = {**messages[index], "timestamp": stamp}
    out, outcome, _ = run(messages, tmp_path, {"max_age_s": 1800}, clock=now)
    assert [a.index for a in outcome.actions] == results[:2]
    assert out[results[0]]["timestamp"] == now - 7200  # other fields are kept
    # The marker holds the message's own time, never an age that depends on the clock.
    assert f"produced={int(now - 7200)}" in out[results[0]]["content"]
    assert " age_s=" not in out[results[0]]["content"]


def test_markers_do_not_depend_on_the_clock_a_cold_rerun_gives_the_same_bytes(tmp_path: Path) -> None:
    """Two cold runs of the same timestamped input an hour apart archive the same results with
    the same markers (an age in seconds in the marker would differ)."""
    pack = tmp_path / "pack.yaml"
    pack.write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: t, version: 1.0.0}\n"
        "pipeline:\n  - {id: ttl, use: ttl.prune, with: {max_age_s: 600, "
        "hot_cache_bypass: false}}\n"
    )
    messages = history(4)
    for n, index in enumerate(result_indices(messages)):
        messages[index] = {**messages[index], "timestamp": 1_000_000 + n}
    outs = []
    for n, clock in enumerate((1_010_000.0, 1_013_600.0)):
        session = Engine.load(pack).session(tmp_path / f"cold{n}", model="gpt-4o")
        outs.append(json.dumps(session.prepare(messages, clock=clock).messages))
    assert "reason=ttl" in outs[0] and outs[0] == outs[1]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1_700_000_000, 1_700_000_000.0),
        (1_700_000_000_500, 1_700_000_000.5),
        ("2023-11-14T22:13:20+00:00", 1_700_000_000.0),
        ("2023-11-14T22:13:20", 1_700_000_000.0),
        ("yesterday", None),
        (True, None),
        (-5, None),
    ],
)
def test_message_time_reads_epoch_seconds_milliseconds_and_iso(value: Any, expected: float | None) -> None:
    assert message_time({"role": "tool", "timestamp": value}) == expected
    assert message_time({"role": "tool", "created_at": value}) == expected


def test_without_timestamps_the_age_counts_from_the_first_prepare_that_saw_a_result(tmp_path: Path) -> None:
    pack = tmp_path / "pack.yaml"
    pack.write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: t, version: 1.0.0}\n"
        "pipeline:\n  - {id: ttl, use: ttl.prune, with: {max_age_s: 600, "
        "hot_cache_bypass: false}}\n"
    )
    session = Engine.load(pack).session(tmp_path / "s", model="gpt-4o")
    h1 = history(3)
    session.prepare(h1, clock=1000.0)
    h2 = [*h1, *step("n1", OUTPUT, command="lint again")]
    r2 = session.prepare(h2, clock=1500.0)
    ttl = next(s for s in r2.report["stages"] if s["id"] == "ttl")
    assert ttl["actions"] == []  # 500 s: nothing is old enough yet
    h3 = [*h2, *step("n2", OUTPUT, command="lint once more")]
    r3 = session.prepare(h3, clock=1700.0)
    ttl = next(s for s in r3.report["stages"] if s["id"] == "ttl")
    # The three results first seen at 1000 are 700 s old; the one first seen at 1500 is not.
    assert [a["index"] for a in ttl["actions"]] == result_indices(h3)[:3]
    assert pairing_problems(r3.messages) == []


def test_skipped_while_the_prompt_cache_is_hot(tmp_path: Path) -> None:
    messages = history(8)
    out, outcome, _ = run(messages, tmp_path, {"max_age_steps": 2}, cache_hot=True)
    assert [a.kind for a in outcome.actions] == ["hot_cache_bypass"]
    assert all(a is b for a, b in zip(out, messages, strict=True))
    _, outcome, _ = run(messages, tmp_path, {"max_age_steps": 2}, cache_hot=True, tier="full")
    assert {a.kind for a in outcome.actions} == {"ttl_archived"}
    _, outcome, _ = run(messages, tmp_path, {"max_age_steps": 2, "hot_cache_bypass": False}, cache_hot=True)
    assert {a.kind for a in outcome.actions} == {"ttl_archived"}


def test_first_seen_clocks_are_recorded_even_when_bypassed(tmp_path: Path) -> None:
    state: dict[str, Any] = {}
    messages = history(3)
    run(messages, tmp_path, {"max_age_s": 100}, cache_hot=True, state=state, clock=1000.0)
    assert len(state["first_seen"]) == 3
    _, outcome, _ = run(messages, tmp_path, {"max_age_s": 100}, state=state, clock=1200.0)
    assert len(outcome.actions) == 2  # the newest is pinned


def test_shortened_results_are_archived_but_placeholders_are_not(tmp_path: Path) -> None:
    messages = history(6)
    out, _, ctx = run(messages, tmp_path, {"max_age_steps": 2, "min_tokens": 0})
    first = out[3]["content"]
    marker = f"[ctxrules:elided kind=lines count=50 ref=vault://{'b' * 64}#L9-L58]"
    shortened = f"{OUTPUT[:400]}{marker}\n"
    again_in = list(out)
    again_in[5] = {**out[5], "content": shortened}  # e.g. reduced by tool_output.filter
    again, outcome, _ = run(again_in, tmp_path, {"max_age_steps": 2, "min_tokens": 0})
    assert again[3]["content"] == first  # a placeholder stays as it is
    assert [a.index for a in outcome.actions] == [5]
    assert ctx.vault.get_text(parse_marker(again[5]["content"]).vault_id) == shortened


def test_list_content_is_archived_as_its_json(tmp_path: Path) -> None:
    messages = history(4)
    parts = [{"type": "text", "text": OUTPUT}, {"type": "text", "text": "tail"}]
    messages[3] = {**messages[3], "content": parts}
    out, _, ctx = run(messages, tmp_path, {"max_age_steps": 2})
    marker = parse_marker(out[3]["content"])
    assert marker.kind == "message"
    assert json.loads(ctx.vault.get_text(marker.vault_id)) == parts


def test_input_not_mutated_and_rerun_on_own_output_changes_nothing(tmp_path: Path) -> None:
    messages = history(12)
    frozen = copy.deepcopy(messages)
    state: dict[str, Any] = {}
    out, _, _ = run(messages, tmp_path, {"max_age_steps": 3, "max_age_s": 50}, state=state)
    assert messages == frozen
    again, outcome, _ = run(out, tmp_path, {"max_age_steps": 3, "max_age_s": 50}, state=state)
    assert outcome.actions == [] and all(a is b for a, b in zip(out, again, strict=True))


def test_builtin_default_prunes_under_pressure_only() -> None:
    engine = Engine.load("builtin:default")
    ttl = next(p for p in engine.plan if p.id == "ttl")
    assert ttl.type.name == "ttl.prune" and ttl.when == {"at_least": "light"}
    assert ttl.options["max_age_steps"] == 30


@pytest.mark.corpus
def test_a_real_transcript_under_pressure(tmp_path: Path) -> None:
    path = next(p for p in transcript_paths() if p.stem == "claudecode-ae4a77f8")
    original = json.loads(path.read_text())
    pack = tmp_path / "pack.yaml"
    pack.write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: t, version: 1.0.0}\n"
        "pipeline:\n  - {id: ttl, use: ttl.prune, when: {at_least: light}, "
        "with: {max_age_steps: 30, min_tokens: 200}}\n"
    )
    session = Engine.load(pack).session(tmp_path / "s", model="gpt-4o", window=160_000)
    result = session.prepare(original)
    ttl = next(s for s in result.report["stages"] if s["id"] == "ttl")
    assert ttl["ran"], ttl.get("skipped")
    assert ttl["actions"] and all(a["kind"] == "ttl_archived" for a in ttl["actions"])
    assert pairing_problems(result.messages) == []
    for action in ttl["actions"]:
        assert session.vault.exists(action["vault_id"])


def test_options_are_checked(tmp_path: Path, cli: Any) -> None:
    with pytest.raises(ValueError, match="max_age_steps"):
        TtlPrune({"max_age_steps": 0})
    assert TtlPrune({"max_age_s": 60}).max_age_steps is None
    for name, prop in STAGE_TYPE.options_schema["properties"].items():
        assert prop.get("title") and prop.get("description"), name
    pack = tmp_path / "pack.yaml"
    pack.write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: t, version: 1.0.0}\n"
        "pipeline:\n  - {id: ttl, use: ttl.prune, with: {max_age_s: -1}}\n"
    )
    code, out, err = cli("validate", str(pack))
    assert code == 1 and "CR061" in out + err
