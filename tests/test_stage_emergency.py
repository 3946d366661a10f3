"""``compress.emergency``: the guarantee that the output fits whenever the pins alone fit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from compress_kit import (
    clone,
    expand,
    filler,
    make_ctx,
    recovers,
    step,
    system,
    text_of,
    user,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from invariants import pairing_problems

from ctxrules import Engine
from ctxrules.pipeline.context import StageContext
from ctxrules.stages.base import options_schema_for
from ctxrules.stages.compress_emergency import STAGE_TYPE, Emergency
from ctxrules.structure import pinned_indices
from ctxrules.vault import parse_markers

Msg = dict[str, Any]
ALL_CRITICAL = [{"id": "all", "match": {}, "priority": "critical"}]


def emergency_ctx(tmp_path: Path, window: int, **kw: Any) -> StageContext:
    ctx = make_ctx(tmp_path, window=window, target=kw.pop("target", "full"), **kw)
    ctx.pack["priorities"] = ALL_CRITICAL
    return ctx


def pins_unchanged(before: list[Msg], after: list[Msg], vault: Any = None) -> None:
    """Every pinned message is in the output unchanged — or, given the ``vault``, spilled
    (level 3: the pins alone did not fit): same role and call id, its text in the vault whole
    behind a spill marker."""
    kept = [before[i] for i in sorted(pinned_indices(before))]
    if vault is None:
        assert [m for m in after if m in kept] == kept
        return
    for m in kept:
        if m in after:
            continue
        twins = [
            o
            for o in after
            if o.get("role") == m.get("role")
            and o.get("tool_call_id") == m.get("tool_call_id")
            and any(
                mk.extra.get("reason") == "spill" and vault.get_text(mk.vault_id) == text_of(m)
                for mk in parse_markers(text_of(o))
            )
        ]
        assert twins, f"pinned message changed without a spill: {str(m)[:200]}"


def test_below_target_and_emergency_nothing_happens(tmp_path: Path) -> None:
    msgs = [system(), user("hi"), *step("a", "ok")]
    out = Emergency({})(msgs, emergency_ctx(tmp_path, 32_000))
    assert out.messages == msgs and out.actions == [] and out.warnings == []


def test_protected_critical_and_tail_content_is_cut_first(tmp_path: Path) -> None:
    msgs = [
        system(),
        user("start"),
        *[m for n in range(6) for m in step(f"s{n}", filler(260, f"big{n}"))],
        user("continue"),
        *step("last", "ok"),
    ]
    window = int(make_ctx(tmp_path).count(msgs) / 0.95) + 8192
    ctx = emergency_ctx(tmp_path, window, tail_budget=0.6, protected=[id(m) for m in msgs])
    assert ctx.budget.tier(ctx.count(msgs)) == "emergency"
    before = clone(msgs)
    out = Emergency({})(msgs, ctx)
    assert msgs == before
    assert ctx.below(out.messages, "full")
    assert {a.kind for a in out.actions} == {"truncate"}, "cutting was enough: nothing removed"
    assert any("protected" in a.detail for a in out.actions)
    assert any("tail" in a.detail for a in out.actions)
    for old, new in zip(msgs, out.messages, strict=True):
        assert recovers(text_of(old), text_of(new), ctx.vault)
    pins_unchanged(msgs, out.messages)


def test_whole_units_go_when_cuts_are_not_enough(tmp_path: Path) -> None:
    # Many medium results (under max_tokens: nothing to cut) and old real user messages.
    msgs: list[Msg] = [system(), user("start")]
    for n in range(40):
        msgs += step(f"s{n}", filler(40, f"m{n}"))
        if n % 10 == 5:
            msgs.append(user(f"also check item {n}"))
    msgs += [user("latest ask"), *step("last", "ok")]
    ctx = emergency_ctx(tmp_path, 32_000, protected=[id(m) for m in msgs])
    assert ctx.budget.tier(ctx.count(msgs)) == "emergency"
    out = Emergency({})(msgs, ctx)
    assert ctx.below(out.messages, "full")
    assert pairing_problems(out.messages) == []
    assert "remove" in {a.kind for a in out.actions}
    assert expand(out.messages, ctx.vault) == msgs
    pins_unchanged(msgs, out.messages)
    assert out.warnings == []


def test_pinned_too_big_for_the_threshold_is_spilled_first_and_keeps_the_history(tmp_path: Path) -> None:
    msgs = [
        system(),
        user("start"),
        *[m for n in range(10) for m in step(f"s{n}", filler(40, f"a{n}"))],
        user("latest: " + filler(1290, "huge")),
    ]  # floor ~22.5K: above 21.4K, below 23.8K
    ctx = emergency_ctx(tmp_path, 32_000)
    out = Emergency({})(msgs, ctx)
    spills = [a for a in out.actions if a.kind == "spill_pinned"]
    # The newest step's output is too small to save anything: the latest ask goes.
    assert [a.index for a in spills] == [len(msgs) - 1] and out.warnings == []
    assert ctx.vault.get_text(spills[-1].vault_id) == msgs[-1]["content"]
    assert out.messages[:-1] == msgs[:-1], "the pins were spilled first: no step had to go"
    assert ctx.budget.utilization(ctx.count(out.messages)) < ctx.budget.thresholds["emergency"]
    pins_unchanged(msgs, out.messages, ctx.vault)


def test_a_newest_result_larger_than_the_window_is_spilled(tmp_path: Path) -> None:
    msgs = [system(), user("start"), *step("a", "ok"), *step("b", filler(1600, "newest"))]
    ctx = emergency_ctx(tmp_path, 32_000)
    out = Emergency({})(msgs, ctx)
    assert [a.index for a in out.actions if a.kind == "spill_pinned"] == [len(msgs) - 1]
    assert out.warnings == [] and ctx.budget.fits(ctx.count(out.messages))
    pins_unchanged(msgs, out.messages, ctx.vault)
    assert pairing_problems(out.messages) == []


@pytest.mark.parametrize("window", [12_000, 32_000])
def test_long_tool_call_arguments_in_the_newest_step_are_spilled(tmp_path: Path, window: int) -> None:
    """The newest step writes a whole file (its call's arguments are most of the request):
    the long string values are cut to a preview around a marker, the arguments stay valid
    JSON with every other key as it was, and the vault gives each value back whole."""
    body = filler(200 * window // 1000, "file")
    msgs = [
        system(),
        user("start"),
        *step("a", "ok"),
        *step("w", "File written.", name="Write", file_path="/repo/app.py", content=body, note="short"),
    ]
    ctx = emergency_ctx(tmp_path, window)
    assert ctx.budget.utilization(ctx.count(msgs)) >= ctx.budget.thresholds["emergency"]
    out = Emergency({})(msgs, ctx)
    (spill,) = [a for a in out.actions if a.kind == "spill_pinned"]
    assert spill.index == len(msgs) - 2 and out.warnings == []
    assert ctx.budget.utilization(ctx.count(out.messages)) < ctx.budget.thresholds["emergency"]
    assert pairing_problems(out.messages) == []
    (new_call,) = out.messages[spill.index]["tool_calls"]
    args = json.loads(new_call["function"]["arguments"])
    assert args["file_path"] == "/repo/app.py" and args["note"] == "short"
    assert len(args["content"]) < len(body) // 4
    (marker,) = parse_markers(args["content"])
    assert ctx.vault.get_text(marker.vault_id) == body and spill.vault_id == marker.vault_id
    assert args["content"].startswith(body[:40]) and args["content"].endswith(body[-40:])


def test_pins_that_cannot_be_spilled_are_reported(tmp_path: Path) -> None:
    # The instructions are never spilled: a system prompt larger than the window stays and is reported.
    msgs = [system(filler(2500, "rules")), user("start"), *step("a", "ok")]
    ctx = emergency_ctx(tmp_path, 32_000)
    out = Emergency({})(msgs, ctx)
    assert out.warnings and "do not fit the usable window" in out.warnings[0]
    assert not [a for a in out.actions if a.kind == "spill_pinned"]
    pins_unchanged(msgs, out.messages)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=400), min_size=1, max_size=30),
    users=st.sets(st.integers(min_value=0, max_value=29), max_size=5),
    protect=st.sets(st.integers(min_value=0, max_value=80), max_size=20),
    latest=st.integers(min_value=1, max_value=1500),
    window=st.sampled_from([16_000, 32_000, 64_000]),
)
def test_output_fits_whenever_the_pinned_floor_fits(
    tmp_path: Path, sizes: list[int], users: set[int], protect: set[int], latest: int, window: int
) -> None:
    msgs: list[Msg] = [system(), user("the first ask")]
    for n, lines in enumerate(sizes):
        msgs += step(f"c{n}", filler(lines, f"r{n}"))
        if n in users:
            msgs.append(user(f"more {n}"))
    msgs[-1] = {**msgs[-1], "content": filler(latest, "newest")}
    ctx = emergency_ctx(tmp_path, window, protected=[id(msgs[i]) for i in protect if i < len(msgs)])
    out = Emergency({})(msgs, ctx)
    assert pairing_problems(out.messages) == []
    pins_unchanged(msgs, out.messages, ctx.vault)
    assert expand([m for m in out.messages], ctx.vault) == msgs or any(
        a.kind in ("truncate", "spill_pinned") for a in out.actions
    )
    # The pins are spilled until they fit: only a system prompt could keep the output over.
    assert ctx.budget.utilization(ctx.count(out.messages)) < ctx.budget.thresholds["emergency"]
    assert out.warnings == []


PACK = """\
apiVersion: ctxrules/v1
kind: RulePack
metadata: {name: all-critical, version: 1.0.0}
context: {window: auto, reserve_output: 8192, tail_budget: 0.2,
          thresholds: {monitor: 0.40, light: 0.50, full: 0.70, emergency: 0.90}}
pipeline:
  - {id: intent, use: compress.intent}
  - {id: dedup, use: compress.dedup, when: {at_least: light}, with: {target: monitor}}
  - {id: truncate, use: compress.truncate, when: {at_least: light}, with: {target: monitor}}
  - {id: remove, use: compress.remove, when: {at_least: full}, with: {target: light}}
  - {id: emergency, use: compress.emergency, when: {at_least: emergency}, with: {target: full}}
  - {id: pairs, use: normalize.tool_pairs}
priorities:
  - {id: everything, match: {}, priority: critical}
"""


def test_end_to_end_with_everything_critical(tmp_path: Path) -> None:
    """Through the Engine: a pack that makes every message critical leaves the regular stages
    nothing to do; the emergency pass still brings the output under the threshold."""
    (tmp_path / "all-critical.yaml").write_text(PACK)
    engine = Engine.load(tmp_path / "all-critical.yaml")
    msgs = [
        system(),
        user("start"),
        *[m for n in range(30) for m in step(f"s{n}", filler(70, f"e{n}"))],
        user("go on"),
        *step("last", "ok"),
    ]
    session = engine.session(tmp_path / "s", model="gpt-4o", window=32_000)
    assert session.budget.tier(session.counter.count_messages(msgs)) == "emergency"
    result = session.prepare(msgs)
    stages = {s["id"]: s for s in result.report["stages"]}
    for regular in ("dedup", "truncate", "remove"):
        assert stages[regular]["tokens_saved"] == 0
    assert stages["emergency"]["ran"] and stages["emergency"]["tokens_saved"] > 0
    assert result.report["after"]["utilization"] < 0.7
    assert not any("pinned" in w for w in result.report["warnings"])


def test_option_schema_documents_every_option() -> None:
    schema = options_schema_for(STAGE_TYPE)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert "target" in schema["properties"]
    for name, prop in schema["properties"].items():
        assert prop.get("title") and prop.get("description"), name
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"max_tokens": "big"}, schema)


@pytest.mark.corpus
def test_golden_sympy_transcript_whose_newest_result_cannot_fit(tmp_path: Path) -> None:
    """minisweagent-sympy ends with an 85K-character tool result (~56K tokens) in the pinned
    newest step: at 32K the pins alone cannot fit, so that result is spilled (whole, to the
    vault) before anything else, and the rest of the session stays."""
    import json

    from conftest import TRANSCRIPTS

    msgs = json.loads((TRANSCRIPTS / "minisweagent-sympy__sympy-13877.json").read_text())
    ctx = make_ctx(tmp_path, window=32_000)
    out = Emergency({})(msgs, ctx)
    pins_unchanged(msgs, out.messages, ctx.vault)
    big = max(range(len(msgs)), key=lambda i: len(text_of(msgs[i])))
    assert [a.index for a in out.actions if a.kind == "spill_pinned"] == [big]
    assert out.warnings == [] and ctx.budget.utilization(ctx.count(out.messages)) < ctx.budget.thresholds["emergency"]
    restored = expand(out.messages, ctx.vault)
    assert len(restored) == len(msgs)
    for old, new in zip(msgs, restored, strict=True):
        assert recovers(text_of(old), text_of(new), ctx.vault)
