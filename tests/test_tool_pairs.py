"""``normalize.tool_pairs``: invariant 1 (every call answered exactly once, right after it)."""

from __future__ import annotations

import copy
import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import jsonschema
import pytest
import structlog
from cli_kit import run_default
from conftest import transcript_paths
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from invariants import id_problems

from ctxrules import Engine
from ctxrules.injected import InjectionKey, key_scope
from ctxrules.messages import injected_kind, is_injected, mark_injected
from ctxrules.pipeline.context import StageContext
from ctxrules.stages.base import Action, StageOutcome
from ctxrules.stages.normalize_tool_pairs import STAGE_TYPE, ToolPairRepair, _fixed_arguments, repair_tool_pairs
from ctxrules.structure import pair_tool_calls, pinned_indices
from ctxrules.vault import Vault, parse_marker

CORPUS = transcript_paths()

Msg = dict[str, Any]


def call(cid: str | None, name: str = "Bash", arguments: str = '{"command": "ls"}') -> Msg:
    out: Msg = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if cid is not None:
        out["id"] = cid
    return out


def asst(*ids: str | None, content: str | None = "") -> Msg:
    msg: Msg = {"role": "assistant", "content": content}
    if ids:
        msg["tool_calls"] = [call(i, arguments=f'{{"n": {n}}}') for n, i in enumerate(ids)]
    return msg


def tool(cid: str | None, content: str = "ok") -> Msg:
    msg: Msg = {"role": "tool", "content": content}
    if cid is not None:
        msg["tool_call_id"] = cid
    return msg


def user(text: str = "go") -> Msg:
    return {"role": "user", "content": text}


def assert_valid_pairs(messages: Sequence[Msg]) -> None:
    """Independent check of invariant 1, written without the code under test."""
    i = 0
    while i < len(messages):
        msg = messages[i]
        assert msg.get("role") != "tool", f"tool result at {i} is outside a call's block"
        if msg.get("tool_calls") is None:
            i += 1
            continue
        assert msg["role"] == "assistant", f"tool_calls on a {msg['role']} message at {i}"
        calls = msg["tool_calls"]
        assert isinstance(calls, list) and calls, f"empty tool_calls at {i}"
        ids = [c.get("id") for c in calls]
        assert all(isinstance(x, str) and x for x in ids), f"call without id at {i}"
        j = i + 1
        answered = []
        while j < len(messages) and messages[j].get("role") == "tool":
            answered.append(messages[j].get("tool_call_id"))
            j += 1
        assert Counter(answered) == Counter(ids), f"block after {i}: {answered} vs calls {ids}"
        i = j


def kinds(actions: list[Action]) -> list[str]:
    return [a.kind for a in actions]


def make_ctx(tmp_path: Path) -> StageContext:
    none = cast(Any, None)
    return StageContext(
        stage_id="pairs",
        model=none,
        counter=none,
        budget=none,
        vault=Vault.for_session(tmp_path / "session"),
        tools=[],
        pack={},
        log=structlog.get_logger(),
    )


# --- valid input stays identical ------------------------------------------------------------


def test_valid_history_comes_back_identical() -> None:
    messages = [
        {"role": "system", "content": "s"},
        user(),
        asst("a", "b"),
        tool("b"),  # parallel results in their own order: valid, kept as they are
        tool("a"),
        asst(content="done"),
    ]
    out, actions = repair_tool_pairs(messages)
    assert out == messages and actions == []
    assert all(o is m for o, m in zip(out, messages, strict=True))
    assert out is not messages


@pytest.mark.corpus
@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
@pytest.mark.parametrize("policy", ["synthesize", "remove"])
def test_corpus_transcripts_are_unchanged(path: Path, policy: Any) -> None:
    messages = json.loads(path.read_text())
    snapshot = copy.deepcopy(messages)
    out, actions = repair_tool_pairs(messages, unanswered=policy)
    assert actions == []
    assert out == snapshot
    assert all(o is m for o, m in zip(out, messages, strict=True))
    assert messages == snapshot


# --- pairing by id --------------------------------------------------------------------------


def test_ids_reused_across_turns_are_renamed_with_their_results() -> None:
    messages = [
        user(),
        asst("x"),
        tool("x", "first"),
        asst("x"),
        tool("x", "second"),
        user("more"),
        asst("x"),
        tool("x", "third"),
    ]
    out, actions = repair_tool_pairs(messages)
    assert_valid_pairs(out)
    assert out[:3] == messages[:3], "the first use keeps its id"
    assert [c["id"] for m in out for c in m.get("tool_calls") or []] == ["x", "x_2", "x_3"]
    assert [(m["tool_call_id"], m["content"]) for m in out if m["role"] == "tool"] == [
        ("x", "first"),
        ("x_2", "second"),
        ("x_3", "third"),
    ]
    assert kinds(actions) == ["call_id_renamed", "call_id_renamed"]
    # Stable: appending a turn renames nothing earlier, and the output is left as it is.
    grown, _ = repair_tool_pairs([*messages, asst("x"), tool("x", "fourth")])
    assert grown[: len(out)] == out and grown[-2]["tool_calls"][0]["id"] == "x_4"
    assert repair_tool_pairs(out) == (out, [])


def test_a_rename_takes_the_smallest_free_number_also_past_a_taken_one() -> None:
    messages = [user(), asst("a", "a_3", "a", "a", "a"), *(tool(c) for c in ("a", "a_3", "a", "a", "a"))]
    out, _actions = repair_tool_pairs(messages)
    assert [c["id"] for c in out[1]["tool_calls"]] == ["a", "a_3", "a_2", "a_4", "a_5"]
    assert_valid_pairs(out)


def test_many_calls_sharing_one_id_are_renamed_in_linear_time() -> None:
    """Each rename counted up from ``_2`` past every earlier rename of the same id, and the
    pairing scan walked back over the message's open calls with that id for each result:
    40,000 calls sharing one id (a broken client) took three minutes."""
    n = 40_000
    messages = [user(), asst(*["same"] * n), *(tool("same", str(i)) for i in range(n))]
    start = time.perf_counter()
    out, _actions = repair_tool_pairs(messages)
    assert time.perf_counter() - start < 30  # a few seconds
    assert [c["id"] for c in out[1]["tool_calls"]] == ["same", *(f"same_{i}" for i in range(2, n + 1))]
    assert [m["tool_call_id"] for m in out[2:4]] == ["same", "same_2"]


def test_duplicate_ids_inside_one_message_are_renamed_in_order() -> None:
    messages = [user(), asst("a", "a", "b"), tool("a", "A1"), tool("a", "A2"), tool("b", "B")]
    out, actions = repair_tool_pairs(messages)
    assert_valid_pairs(out)
    assert [c["id"] for c in out[1]["tool_calls"]] == ["a", "a_2", "b"]
    assert [(m["tool_call_id"], m["content"]) for m in out[2:]] == [("a", "A1"), ("a_2", "A2"), ("b", "B")]
    assert kinds(actions) == ["call_id_renamed"]


def test_invalid_json_arguments_go_to_the_vault_and_a_valid_object_says_so(tmp_path: Path) -> None:
    cut = '{"command": "grep -rn foo src/'
    messages = [user(), asst("a", "b", "c"), tool("a"), tool("b"), tool("c")]
    calls = messages[1]["tool_calls"]
    messages[1] = {
        **messages[1],
        "tool_calls": [
            {**calls[0], "function": {"name": "Bash", "arguments": cut}},
            {**calls[1], "function": {"name": "Bash", "arguments": ""}},
            calls[2],
        ],
    }
    ctx = make_ctx(tmp_path)
    outcome = ToolPairRepair({})(messages, ctx)
    fixed = outcome.messages[1]["tool_calls"]
    replaced = json.loads(fixed[0]["function"]["arguments"])
    marker = parse_marker(replaced["ctxrules_invalid_arguments"])
    assert marker.kind == "json" and ctx.vault.get_text(marker.vault_id) == cut
    assert "not valid JSON" in replaced["note"]
    assert fixed[1]["function"]["arguments"] == "{}" and fixed[2] is calls[2]
    action = next(a for a in outcome.actions if a.kind == "arguments_replaced" and a.vault_id)
    assert action.vault_id == marker.vault_id
    assert ToolPairRepair({})(outcome.messages, ctx).actions == []


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_arguments_python_reads_but_json_does_not_go_to_the_vault(tmp_path: Path, number: str) -> None:
    """``{"limit": NaN}`` passed as valid JSON (Python's parser reads it) and was sent as it
    was: a provider parsing the history, or litellm converting it for another provider, refuses
    it. It is not JSON, and goes to the vault as other unusable arguments do."""
    from ctxrules import Engine

    arguments = '{"command": "ls", "limit": ' + number + "}"
    messages = [user(), asst("a"), tool("a"), {"role": "user", "content": "next"}]
    messages[1] = {**messages[1], "tool_calls": [{**messages[1]["tool_calls"][0]}]}
    messages[1]["tool_calls"][0]["function"] = {"name": "Bash", "arguments": arguments}
    session = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o", window=128000)
    sent = session.prepare(messages).messages[1]["tool_calls"][0]["function"]["arguments"]

    def strict(value: str) -> Any:
        raise ValueError(value)

    replaced = json.loads(sent, parse_constant=strict)
    marker = parse_marker(replaced["ctxrules_invalid_arguments"])
    assert session.vault.get_text(marker.vault_id) == arguments


def test_arguments_given_as_an_object_or_null_go_out_as_json_text(tmp_path: Path) -> None:
    """Some clients pass the parsed arguments (``{"command": "ls"}``) or null; both went through
    as they were, breaking invariant 7 (every arguments value is a JSON string: OpenAI refuses
    anything else). The object goes out as its JSON text (nothing lost), null as ``{}``; the
    caller's messages are not changed, and the stage leaves its own output alone."""
    given = {"command": "ls -la", "note": "é"}
    messages = [user(), asst("a", "b", "c"), tool("a"), tool("b"), tool("c")]
    calls = messages[1]["tool_calls"]
    messages[1] = {
        **messages[1],
        "tool_calls": [
            {**calls[0], "function": {"name": "Bash", "arguments": given}},
            {**calls[1], "function": {"name": "Bash", "arguments": None}},
            {**calls[2], "function": {"name": "Bash"}},
        ],
    }
    before = copy.deepcopy(messages)
    ctx = make_ctx(tmp_path)
    outcome = ToolPairRepair({})(messages, ctx)
    fixed = outcome.messages[1]["tool_calls"]
    assert [c["function"]["arguments"] for c in fixed] == [json.dumps(given, ensure_ascii=False), "{}", "{}"]
    assert [c["id"] for c in fixed] == ["a", "b", "c"] and messages == before
    details = [a.detail for a in outcome.actions if a.kind == "arguments_replaced"]
    assert len(details) == 3 and "an object, not a JSON string" in details[0] and "null" in details[1], details
    assert ToolPairRepair({})(outcome.messages, ctx).actions == []
    # end to end: what prepare returns holds JSON strings only
    out = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o").prepare(messages).messages
    for msg in out:
        for c in msg.get("tool_calls") or []:
            assert isinstance(c["function"]["arguments"], str)
            json.loads(c["function"]["arguments"])


@pytest.mark.parametrize("depth", [101, 1000, 100_000])
def test_arguments_nested_past_the_limit_go_to_the_vault_whatever_the_stack(tmp_path: Path, depth: int) -> None:
    """Arguments nested deeper than MAX_DEPTH are not usable JSON: json.loads raises
    RecursionError on them (not ValueError), which used to fail the whole stage and leave the
    history unrepaired. The verdict must not depend on how deep the caller's stack is."""
    deep = "[" * depth + "]" * depth
    inside = '{"path": "' + "[" * 500 + '"}'  # brackets inside a string do not nest
    messages = [user(), asst("a", "a", "b"), tool("zz", "orphan"), tool("a", "A"), user("next")]
    calls = messages[1]["tool_calls"]
    messages[1] = {
        **messages[1],
        "tool_calls": [
            {**calls[0], "function": {"name": "f", "arguments": deep}},
            calls[1],
            {**calls[2], "function": {"name": "g", "arguments": inside}},
        ],
    }
    ctx = make_ctx(tmp_path)

    def nested(levels: int) -> StageOutcome:  # the same call with more of the stack used up
        return ToolPairRepair({})(messages, ctx) if levels == 0 else nested(levels - 1)

    outcomes = [nested(0), nested(800)]
    for outcome in outcomes:
        assert_valid_pairs(outcome.messages)
        fixed = outcome.messages[1]["tool_calls"]
        marker = parse_marker(json.loads(fixed[0]["function"]["arguments"])["ctxrules_invalid_arguments"])
        assert ctx.vault.get_text(marker.vault_id) == deep
        assert fixed[2]["function"]["arguments"] == inside
    assert outcomes[0].messages == outcomes[1].messages
    assert ToolPairRepair({})(outcomes[0].messages, ctx).actions == []


def test_repaired_output_converts_to_anthropic_with_litellm() -> None:
    import warnings

    with warnings.catch_warnings():  # litellm's own import-time warnings are not ours
        warnings.simplefilter("ignore")
        from litellm.litellm_core_utils.prompt_templates.factory import anthropic_messages_pt

    messages = [user(), asst("a", "a"), tool("a", "1"), tool("a", "2"), user("again"), asst("a"), tool("a", "3")]
    messages[5] = {
        **messages[5],
        "tool_calls": [{**messages[5]["tool_calls"][0], "function": {"name": "Bash", "arguments": '{"command": "ls'}}],
    }
    # Today's input is what litellm refuses ...
    with pytest.raises(ValueError, match="Failed to parse tool call arguments"):
        anthropic_messages_pt(messages, model="claude-sonnet-4-5", llm_provider="anthropic")
    out, _ = repair_tool_pairs(messages)
    converted = anthropic_messages_pt(out, model="claude-sonnet-4-5", llm_provider="anthropic")
    uses = [b for m in converted if m["role"] == "assistant" for b in m["content"] if b.get("type") == "tool_use"]
    results = [
        b
        for m in converted
        if m["role"] == "user"
        for b in m["content"]
        if isinstance(b, dict) and b.get("type") == "tool_result"
    ]
    assert len({u["id"] for u in uses}) == len(uses) == 3
    assert [r["tool_use_id"] for r in results] == [u["id"] for u in uses]
    assert "ctxrules_invalid_arguments" in uses[2]["input"]


def test_misplaced_results_move_into_their_block_in_call_order() -> None:
    messages = [
        user(),
        asst("a", "b"),  # 1
        user("interjection"),  # 2
        tool("b", "B"),  # 3 misplaced
        asst("c"),  # 4
        tool("c", "C"),  # 5
        tool("a", "A"),  # 6 misplaced, after another step
    ]
    out, actions = repair_tool_pairs(messages)
    assert_valid_pairs(out)
    assert [m.get("content") for m in out] == ["go", "", "A", "B", "interjection", "", "C"]
    assert kinds(actions) == ["result_moved", "result_moved"]
    assert {a.index for a in actions} == {3, 6}


def test_parallel_calls_with_a_missing_and_a_misplaced_result() -> None:
    messages = [user(), asst("a", "b", "c"), tool("c"), tool("a"), user("more"), tool("b")]
    out, actions = repair_tool_pairs(messages)
    assert_valid_pairs(out)
    assert [m.get("tool_call_id") for m in out[2:5]] == ["a", "b", "c"]
    assert out[5] == user("more")
    assert kinds(actions) == ["result_moved"]


def test_orphans_and_duplicates_are_dropped_first_result_kept() -> None:
    messages = [
        tool("early"),  # orphan: no call before it
        user(),
        asst("a"),
        tool("a", "first"),
        tool("a", "again"),  # duplicate
        tool("zzz", "stray"),  # orphan
        asst(content="end"),
    ]
    out, actions = repair_tool_pairs(messages)
    assert_valid_pairs(out)
    assert [m.get("content") for m in out if m["role"] == "tool"] == ["first"]
    assert kinds(actions) == ["orphan_dropped", "duplicate_dropped", "orphan_dropped"]
    assert [a.index for a in actions] == [0, 4, 5]
    assert "first one is kept" in actions[1].detail


def test_a_result_before_its_call_is_an_orphan() -> None:
    messages = [user(), tool("a", "too early"), asst("a"), tool("a", "right")]
    out, actions = repair_tool_pairs(messages)
    assert out == [user(), asst("a"), tool("a", "right")]
    assert kinds(actions) == ["orphan_dropped"]


@pytest.mark.parametrize(
    ("result", "said"),
    [
        ({"role": "tool", "content": "r"}, "dropped a tool result without a tool_call_id: it answers no call"),
        (
            {"role": "tool", "tool_call_id": "", "content": "r"},
            "dropped a tool result with the tool_call_id '': it answers no call",
        ),
        (
            {"role": "tool", "tool_call_id": "zz", "content": "r"},
            "dropped a tool result for 'zz': no earlier call has that id",
        ),
    ],
    ids=["missing", "empty", "unknown"],
)
def test_an_orphan_without_an_id_is_named_as_such(result: dict[str, Any], said: str) -> None:
    """A result with no ``tool_call_id`` was reported as "a tool result for None: no earlier
    call has that id"."""
    _out, actions = repair_tool_pairs([user(), asst("a"), tool("a", "first"), result])
    assert kinds(actions) == ["orphan_dropped"]
    assert actions[0].detail == f"message 3: {said}"


# --- unanswered calls -----------------------------------------------------------------------


def test_unanswered_call_gets_a_marked_interrupted_result() -> None:
    messages = [user(), asst("a", "b"), tool("b"), user("next"), asst(content="ok")]
    out, actions = repair_tool_pairs(messages)
    assert_valid_pairs(out)
    synthesized = out[2]
    assert synthesized["tool_call_id"] == "a"
    assert injected_kind(synthesized) == "interrupted" and set(synthesized) == {"role", "content", "tool_call_id"}
    assert "[ctxrules:interrupted] tool call was not answered" in synthesized["content"]
    assert synthesized["content"].startswith("<ctxrules:interrupted sig=")
    assert is_injected(synthesized)
    assert out[3] is messages[2]
    assert kinds(actions) == ["result_synthesized"]


def test_remove_policy_drops_only_the_unanswered_calls() -> None:
    messages = [user(), asst("a", "b", content="two calls"), tool("b"), user("next"), asst()]
    out, actions = repair_tool_pairs(messages, unanswered="remove")
    assert_valid_pairs(out)
    assert [c["id"] for c in out[1]["tool_calls"]] == ["b"]
    assert out[1]["content"] == "two calls"
    assert kinds(actions) == ["call_removed"]
    assert messages[1]["tool_calls"][0]["id"] == "a"  # input untouched


def test_remove_policy_keeps_a_message_with_content_and_drops_an_empty_one() -> None:
    messages = [
        user(),
        asst("a", content="I'll look"),  # 1: keeps its text, loses tool_calls
        asst("b", content=None),  # 2: nothing left: dropped
        asst("c", content="  "),  # 3: whitespace only: dropped
        user("next"),
        asst(content="newest"),
    ]
    out, actions = repair_tool_pairs(messages, unanswered="remove")
    assert out[1] == {"role": "assistant", "content": "I'll look"}
    assert out == [messages[0], out[1], messages[4], messages[5]]
    assert kinds(actions) == [
        "call_removed",
        "call_removed",
        "message_dropped",
        "call_removed",
        "message_dropped",
    ]


def test_remove_policy_never_changes_a_pinned_message() -> None:
    messages = [user(), asst("a", content=None)]  # the newest step: pinned
    out, actions = repair_tool_pairs(messages, unanswered="remove")
    assert out[1] is messages[1]
    assert out[2]["tool_call_id"] == "a" and is_injected(out[2])
    assert kinds(actions) == ["result_synthesized"]
    assert "pinned" in actions[0].detail


def test_empty_tool_calls_list_is_removed() -> None:
    messages = [user(), {"role": "assistant", "content": "hi", "tool_calls": []}]
    out, actions = repair_tool_pairs(messages)
    assert out[1] == {"role": "assistant", "content": "hi"}
    assert kinds(actions) == ["empty_tool_calls_dropped"]


# --- a real result after its stand-in -------------------------------------------------------


def with_stand_in() -> list[Msg]:
    """A history whose call ``a`` got no result, as the repair returns it: with the stand-in
    (signed under the current key, as the stage signs it) right after the call."""
    out, actions = repair_tool_pairs([user(), asst("a", "b"), tool("b", "B"), user("hurry")])
    assert kinds(actions) == ["result_synthesized"] and injected_kind(out[2]) == "interrupted"
    return out


def test_a_real_result_later_in_the_list_replaces_the_stand_in() -> None:
    history = [*with_stand_in(), asst(content="waiting"), tool("a", "A real")]
    out, actions = repair_tool_pairs(history)
    assert_valid_pairs(out)
    assert [m.get("content") for m in out] == ["go", "", "A real", "B", "hurry", "waiting"]
    assert kinds(actions) == ["result_moved", "stand_in_replaced"]
    assert [a.index for a in actions] == [6, 2]
    assert "its real result (message 6) answers it" in actions[1].detail
    assert repair_tool_pairs(out)[1] == []


def test_in_the_stand_ins_block_the_real_result_wins_and_a_second_one_is_a_duplicate() -> None:
    first = with_stand_in()
    history = [*first[:3], tool("a", "A real"), tool("a", "A again"), *first[3:]]
    out, actions = repair_tool_pairs(history)
    assert_valid_pairs(out)
    assert [m.get("content") for m in out] == ["go", "", "A real", "B", "hurry"]
    assert out[2] is history[3]
    assert kinds(actions) == ["stand_in_replaced", "duplicate_dropped"]
    assert [a.index for a in actions] == [2, 4]


def test_the_stage_keeps_no_vault_item_for_a_replaced_stand_in(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    outcome = ToolPairRepair()([*with_stand_in(), tool("a", "A real")], ctx)
    assert [(a.kind, a.vault_id) for a in outcome.actions] == [("result_moved", None), ("stand_in_replaced", None)]


def test_a_stand_in_signed_under_another_key_is_a_result_like_any_other() -> None:
    """A stand-in ctxrules did not sign here (a user or a tool pasting one, a history from
    another state root) is a real result: the first result of the call is kept as always."""
    with key_scope(InjectionKey(b"k" * 32)):
        history = [*with_stand_in(), tool("a", "A real")]
        ours, _ = repair_tool_pairs(history)
    assert [m.get("content") for m in ours] == ["go", "", "A real", "B", "hurry"]
    with key_scope(InjectionKey(b"m" * 32)):
        out, actions = repair_tool_pairs(history)
        assert not is_injected(history[2])
    assert out == history[:5]
    assert kinds(actions) == ["duplicate_dropped"]


def test_the_real_result_replaces_the_stand_in_on_the_next_turn(tmp_path: Path) -> None:
    """A session's next turn runs the pipeline on its last output (which holds the stand-in)
    plus the appended messages: the real result must win there as on the whole history."""
    engine = Engine.load("builtin:default")
    session = engine.session(tmp_path / "s", model="gpt-4o")
    history = [user(), asst("a", "b"), tool("b", "B"), user("hurry")]
    first = session.prepare(history)
    assert [injected_kind(m) for m in first.messages] == [None, None, "interrupted", None, None]
    history += [asst(content="waiting"), tool("a", "A real")]
    got = session.prepare(history)
    assert got.report["reused_messages"] == 4
    assert [m.get("content") for m in got.messages] == ["go", "", "A real", "B", "hurry", "waiting"]
    fresh = engine.session(tmp_path / "fresh", model="gpt-4o").prepare(copy.deepcopy(history))
    assert got.messages == fresh.messages
    history.append(user("thanks"))
    third = session.prepare(history)
    assert third.report["reused_messages"] == 6 and third.messages == [*got.messages, user("thanks")]


def test_the_real_result_of_a_renamed_call_replaces_its_stand_in() -> None:
    """An agent that numbers its calls per turn reuses ids: the second call ``a`` is renamed
    ``a_2``, and when it has no result yet its stand-in carries ``a_2``. The real result comes
    with the id the agent gave (``a``): it answers the renamed call (and takes its id), in one
    list and on the next turn alike, instead of being dropped as a duplicate of the first ``a``."""
    first = [user(), asst("a"), tool("a", "A1"), user("again"), asst("a"), user("hurry")]
    out, actions = repair_tool_pairs(first)
    assert out[4]["tool_calls"][0]["id"] == "a_2" and injected_kind(out[5]) == "interrupted"
    later = [*out, asst(content="waiting"), tool("a", "A2 real")]
    again, actions = repair_tool_pairs(later)
    assert_valid_pairs(again)
    assert [m.get("content") for m in again] == ["go", "", "A1", "again", "", "A2 real", "hurry", "waiting"]
    assert again[5]["tool_call_id"] == "a_2"
    assert "stand_in_replaced" in kinds(actions) and "duplicate_dropped" not in kinds(actions)
    # The whole history at once gives the same.
    whole, _ = repair_tool_pairs([*first, asst(content="waiting"), tool("a", "A2 real")])
    assert whole == again


def test_the_real_result_of_a_renamed_call_replaces_its_stand_in_on_the_next_turn(tmp_path: Path) -> None:
    engine = Engine.load("builtin:default")
    session = engine.session(tmp_path / "s", model="gpt-4o")
    history = [user(), asst("a"), tool("a", "A1"), user("again"), asst("a"), user("hurry")]
    session.prepare(history)
    history += [asst(content="waiting"), tool("a", "A2 real")]
    got = session.prepare(history)
    assert got.report["reused_messages"] == 6
    assert "A2 real" in [m.get("content") for m in got.messages]
    fresh = engine.session(tmp_path / "fresh", model="gpt-4o").prepare(copy.deepcopy(history))
    assert got.messages == fresh.messages


def test_ctxrules_run_twice_on_one_session_shows_the_real_result(tmp_path: Path) -> None:
    """``ctxrules run --session DIR`` on the same input twice gives the same output (the
    second run reuses the first's); once the real result is appended, it replaces the stand-in."""
    history = [user(), asst("a"), user("hurry")]
    src = tmp_path / "in.json"

    def run() -> list[Msg]:
        done = run_default(src, "--session", str(tmp_path / "s"), "--output", str(tmp_path / "out.json"))
        assert done.returncode == 0, done.stderr
        return cast(list[Msg], json.loads((tmp_path / "out.json").read_text()))

    src.write_text(json.dumps(history))
    before = run()
    assert "[ctxrules:interrupted]" in before[2]["content"] and run() == before
    src.write_text(json.dumps([*history, tool("a", "A real")]))
    after = run()
    assert after == [user(), asst("a"), tool("a", "A real"), user("hurry")]
    assert run() == after


# --- calls without ids ----------------------------------------------------------------------


def test_calls_without_ids_get_deterministic_ids_and_positional_results() -> None:
    messages = [user(), asst(None, None), tool(None, "r0"), tool(None, "r1")]
    out, actions = repair_tool_pairs(messages)
    assert_valid_pairs(out)
    ids = [c["id"] for c in out[1]["tool_calls"]]
    assert len(set(ids)) == 2 and all(i.startswith("call_ctxrules_") for i in ids)
    assert [m["tool_call_id"] for m in out[2:]] == ids
    assert [m["content"] for m in out[2:]] == ["r0", "r1"]
    assert kinds(actions) == ["call_id_assigned", "call_id_assigned"]
    again, _ = repair_tool_pairs(copy.deepcopy(messages))
    assert again == out  # same history, same ids
    assert repair_tool_pairs(out) == (out, [])


def test_an_id_does_not_depend_on_the_message_index() -> None:
    first, _ = repair_tool_pairs([user(), asst(None)])
    later, _ = repair_tool_pairs([user(), user("x"), asst(None)])
    assert first[1]["tool_calls"][0]["id"] == later[2]["tool_calls"][0]["id"]


# --- legacy and unknown fields --------------------------------------------------------------


def test_unknown_fields_and_legacy_function_messages_pass_through() -> None:
    weird_call = {**call("a"), "x-extra": [1]}
    messages = [
        user(),
        {"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": "{}"}},
        {"role": "function", "name": "f", "content": "42"},
        {"role": "assistant", "content": "", "tool_calls": [weird_call], "meta": {"k": 1}},
        user("interrupt"),
        {**tool("a"), "name": "Bash", "x": 1},
    ]
    out, _ = repair_tool_pairs(messages)
    assert_valid_pairs(out)
    assert out[1] is messages[1] and out[2] is messages[2]
    assert out[3] is messages[3] and out[4] is messages[5]


# --- the stage: vault, options, registration -------------------------------------------------


def test_stage_keeps_dropped_contents_in_the_vault(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    parts = [{"type": "text", "text": "part"}]
    messages = [
        user(),
        asst("a"),
        tool("a"),
        tool("a", "duplicate\r\nbytes"),
        {"role": "tool", "tool_call_id": "nobody", "content": parts},
        asst("b", content=None),
        user("next"),
        asst(content="end"),
    ]
    outcome = ToolPairRepair({"unanswered": "remove"})(messages, ctx)
    assert_valid_pairs(outcome.messages)
    by_kind = {a.kind: a for a in outcome.actions}
    dup = by_kind["duplicate_dropped"].vault_id
    orphan = by_kind["orphan_dropped"].vault_id
    removed = by_kind["call_removed"].vault_id
    dropped = by_kind["message_dropped"].vault_id
    assert dup and orphan and removed and dropped
    assert ctx.vault.get(dup) == b"duplicate\r\nbytes"
    assert json.loads(ctx.vault.get(orphan)) == parts
    assert json.loads(ctx.vault.get(removed)) == messages[5]["tool_calls"]
    assert json.loads(ctx.vault.get(dropped)) == messages[5]
    assert all(a.as_dict()["kind"] for a in outcome.actions)


def test_stage_type_is_essential_integrity_with_a_strict_schema() -> None:
    assert STAGE_TYPE.name == "normalize.tool_pairs"
    assert STAGE_TYPE.phase == "integrity" and STAGE_TYPE.essential
    schema = dict(STAGE_TYPE.options_schema)
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    assert validator.is_valid({}) and validator.is_valid({"unanswered": "remove"})
    assert not validator.is_valid({"unanswered": "drop"})
    assert not validator.is_valid({"other": 1})
    for prop in schema["properties"].values():
        assert prop["title"] and prop["description"]
    assert isinstance(STAGE_TYPE.factory({}), ToolPairRepair)


def test_stage_rejects_bad_options() -> None:
    with pytest.raises(ValueError, match="unanswered"):
        ToolPairRepair({"unanswered": "drop"})
    with pytest.raises(ValueError, match="unknown option"):
        ToolPairRepair({"policy": "remove"})
    with pytest.raises(ValueError):
        repair_tool_pairs([], unanswered=cast(Any, "drop"))


# --- properties on random, broken histories -------------------------------------------------

_ids = st.sampled_from(["a", "b", "c", "d"]) | st.none()


@st.composite
def conversations(draw: Callable[..., Any]) -> list[Msg]:
    """Random roles, parallel calls, reused and missing ids, orphans, duplicates, misplaced
    and missing results, injected messages, stand-ins, arguments that are not JSON."""
    messages: list[Msg] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": "sys"})
    for n in range(draw(st.integers(0, 16))):
        kind = draw(st.sampled_from(["user", "injected", "asst", "asst", "tool", "tool", "tool", "stand-in", "plain"]))
        if kind == "user":
            messages.append(user(f"u{n}"))
        elif kind == "injected":
            messages.append(mark_injected(user(f"n{n}"), "notice"))
        elif kind == "asst":
            ids = draw(st.lists(_ids, min_size=1, max_size=3))
            content = draw(st.sampled_from(["", None, "text", "  "]))
            made = asst(*ids, content=content)
            bad = draw(st.sampled_from([None, None, None, '{"command": "ls', "ls -la", ""]))
            if bad is not None:  # a model cut off mid-call, or prose instead of JSON
                first = made["tool_calls"][0]
                made["tool_calls"][0] = {**first, "function": {**first["function"], "arguments": bad}}
            messages.append(made)
        elif kind == "tool":
            messages.append(tool(draw(_ids), f"r{n}"))
        elif kind == "stand-in":
            messages.append(mark_injected(tool(draw(_ids), f"s{n}"), "interrupted"))
        else:
            messages.append(asst(content=f"reply {n}"))
    return messages


def _pinned_must_survive(messages: list[Msg]) -> list[int]:
    """Pinned indices that the stage must return as the very same objects.

    The documented exceptions, where validity wins: id-less calls get an id, id-less results
    get the call's id, and orphan or duplicate results (and stand-ins a real result
    superseded) are dropped.
    """
    pairing = pair_tool_calls(messages)
    renamed = _renamed(messages)
    keep = []
    for i in sorted(pinned_indices(messages)):
        msg = messages[i]
        if i in pairing.orphans or i in pairing.duplicates or i in pairing.positional or i in pairing.superseded:
            continue
        if any("id" not in c for c in msg.get("tool_calls") or []):
            continue
        if msg.get("tool_calls") == []:
            continue
        if i in renamed or any(_fixed_arguments(c) is not None for c in msg.get("tool_calls") or []):
            continue
        keep.append(i)
    return keep


def _renamed(messages: list[Msg]) -> set[int]:
    """Assistant messages with a call id used before (earlier, or twice in it), and the results
    of those calls: the repair renames them (the third documented exception)."""
    pairing = pair_tool_calls(messages)
    seen: set[Any] = set()
    out: set[int] = set()
    for i, msg in enumerate(messages):
        for pos, call in enumerate(msg.get("tool_calls") or []):
            cid = call.get("id")
            if cid in seen:
                out.add(i)
                result = pairing.result_of.get((i, pos))
                if result is not None:
                    out.add(result)
            seen.add(cid)
    return out


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(conversations(), st.sampled_from(["synthesize", "remove"]))
def test_repair_properties(messages: list[Msg], policy: Any) -> None:
    snapshot = copy.deepcopy(messages)
    out, actions = repair_tool_pairs(messages, unanswered=policy)

    # invariants 1 and 7, checked independently
    assert_valid_pairs(out)
    assert id_problems(out) == []
    # input never mutated
    assert messages == snapshot
    # idempotent
    again, more = repair_tool_pairs(out, unanswered=policy)
    assert again == out and more == []
    assert all(a is b for a, b in zip(again, out, strict=True))
    # pinned messages unchanged (same objects)
    for i in _pinned_must_survive(messages):
        assert any(o is messages[i] for o in out), f"pinned message {i} changed or lost"
    # non-tool messages keep their relative order; nothing is invented except marked results
    originals = {id(m) for m in messages}
    for msg in out:
        if id(msg) not in originals:
            changed = msg["role"] == "assistant" or "tool_call_id" in msg
            assert changed
            if msg["role"] == "tool" and is_injected(msg):
                assert injected_kind(msg) == "interrupted"
    # every input tool result is either in the output or reported as dropped
    dropped = {a.index for a in actions if a.kind in ("orphan_dropped", "duplicate_dropped", "stand_in_replaced")}
    out_contents = Counter(m["content"] for m in out if m["role"] == "tool")
    for i, msg in enumerate(messages):
        if msg["role"] == "tool" and i not in dropped:
            assert out_contents[msg["content"]] >= 1
    # a call with a real result gets it, even after a stand-in (ids used by one call only)
    calls = Counter(c.get("id") for m in messages for c in m.get("tool_calls") or [])
    for i, msg in enumerate(messages):
        cid = msg.get("tool_call_id")
        if msg["role"] == "tool" and cid is not None and calls[cid] == 1 and not is_injected(msg):
            made = next(j for j, m in enumerate(messages) if any(c.get("id") == cid for c in m.get("tool_calls") or []))
            if made < i:
                answer = next(m for m in out if m["role"] == "tool" and m.get("tool_call_id") == cid)
                assert not is_injected(answer), f"call {cid!r} has a real result at {i}, yet a stand-in answers it"


@settings(max_examples=200)
@given(conversations())
def test_synthesize_never_removes_a_call(messages: list[Msg]) -> None:
    out, _ = repair_tool_pairs(messages)

    def count(ms: list[Msg]) -> int:
        return sum(len(m.get("tool_calls") or []) for m in ms)

    assert count(out) == count(messages)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(conversations(), st.sampled_from(["synthesize", "remove"]))
def test_fast_validity_check_agrees_with_the_full_repair(messages: list[Msg], policy: Any) -> None:
    """`already_valid` lets the stage skip the repair: it may only say True when the full
    repair would return the very same messages."""
    from ctxrules.stages.normalize_tool_pairs import already_valid

    out, _ = repair_tool_pairs(messages, unanswered=policy)
    if already_valid(messages):
        assert all(a is b for a, b in zip(out, messages, strict=True)) and len(out) == len(messages)
    assert already_valid(out) or out == repair_tool_pairs(out, unanswered=policy)[0]


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(conversations(), conversations())
def test_validity_from_a_known_valid_prefix_agrees_with_a_full_check(head: list[Msg], tail: list[Msg]) -> None:
    """`already_valid(messages, start)` trusts messages[:start] and must then agree with the
    full check whenever that prefix really is valid (the session's previous output)."""
    from ctxrules.stages.normalize_tool_pairs import already_valid

    prefix, _ = repair_tool_pairs(head)
    if not already_valid(prefix):
        return  # e.g. one message repeating a call id: repaired as it is, never "already valid"
    joined = [*prefix, *tail]
    assert already_valid(joined, len(prefix)) == already_valid(joined)


def test_a_list_derived_from_a_valid_one_is_checked_again_where_it_could_break(tmp_path: Path) -> None:
    """The stage remembers the last list it found valid; a list that only replaced results'
    text is valid without a scan, but one whose replaced result answers another call, or
    whose assistant message got other calls, is repaired as always."""
    stage, ctx = ToolPairRepair(), make_ctx(tmp_path)
    call = {"id": "c1", "type": "function", "function": {"name": "Bash", "arguments": "{}"}}
    valid = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "long output"},
        {"role": "user", "content": "next"},
    ]
    assert stage(valid, ctx).actions == []
    shortened = [*valid[:2], {**valid[2], "content": "[cut]"}, valid[3]]
    assert stage(shortened, ctx).messages == shortened
    orphan = [*valid[:2], {**valid[2], "tool_call_id": "c9"}, valid[3]]
    assert stage(orphan, ctx).messages != orphan  # c1 unanswered, c9 an orphan: repaired
    other_calls = [valid[0], {**valid[1], "tool_calls": [{**call, "id": "c2"}]}, *valid[2:]]
    assert stage(valid, ctx).actions == [] and stage(other_calls, ctx).messages != other_calls


_REMOVE_PACK = """\
apiVersion: ctxrules/v1
kind: RulePack
metadata: {name: remove-unanswered, version: 1.0.0}
extends: builtin:default
pipeline:
  - id: pairs
    use: normalize.tool_pairs
    with: {unanswered: remove}
"""


def _remove_engine(tmp_path: Path) -> Engine:
    pack = tmp_path / "pack.yaml"
    pack.write_text(_REMOVE_PACK, encoding="utf-8")
    return Engine.load(pack)


def _calls_and_results(messages: Sequence[Msg]) -> list[tuple[str, list[str], str | None]]:
    return [(m["role"], [c["id"] for c in m.get("tool_calls") or []], m.get("tool_call_id")) for m in messages]


def test_remove_policy_puts_a_call_back_when_its_result_comes_on_a_later_turn(tmp_path: Path) -> None:
    # The session's next turn runs on its last output, where the unanswered call is gone: the
    # result that arrives after all used to be dropped as an orphan, where a run over the whole
    # history pairs it with its call.
    engine = _remove_engine(tmp_path)
    history = [user(), asst("A", "B", "D"), tool("B"), user("continue"), asst("C"), tool("C")]
    session = engine.session(tmp_path / "warm", model="gpt-4o", window=100_000)
    first = session.prepare(history)
    assert _calls_and_results(first.messages)[1] == ("assistant", ["B"], None)
    grown = [*history, tool("A", "the late result")]
    warm = session.prepare(grown)
    assert warm.report["reused_messages"] == len(history)
    cold = engine.session(tmp_path / "cold", model="gpt-4o", window=100_000).prepare(copy.deepcopy(grown))
    assert warm.messages == cold.messages
    assert _calls_and_results(warm.messages)[1:4] == [
        ("assistant", ["A", "B"], None),
        ("tool", [], "A"),
        ("tool", [], "B"),
    ]
    kinds = [a["kind"] for stage in warm.report["stages"] for a in stage["actions"]]
    assert "call_restored" in kinds and "orphan_dropped" not in kinds


def test_remove_policy_warm_turns_equal_runs_over_the_whole_history(tmp_path: Path) -> None:
    import random

    engine = _remove_engine(tmp_path)
    rng = random.Random(11)
    for case in range(12):
        session = engine.session(tmp_path / f"warm{case}", model="gpt-4o", window=100_000)
        history: list[Msg] = [user()]
        pending: list[str] = []
        for turn in range(6):
            ids = [f"c{case}_{turn}_{k}" for k in range(rng.randint(1, 3))]
            history.append(asst(*ids, content=f"step {turn}"))
            answered = rng.sample(ids, rng.randint(1, len(ids)))
            history.extend(tool(i) for i in answered)
            pending.extend(i for i in ids if i not in answered)
            if pending and rng.random() < 0.5:  # a result that comes late, after other steps
                history.append(tool(pending.pop(rng.randrange(len(pending))), "late"))
            # A reply without calls: the step with unanswered calls is not the newest one, which
            # is pinned and gets a stand-in instead (that a warm turn keeps, by design).
            history.extend([asst(content=f"done {turn}"), user(f"go on {turn}")])
            warm = session.prepare(history)
            cold = engine.session(tmp_path / f"cold{case}_{turn}", model="gpt-4o", window=100_000)
            assert warm.messages == cold.prepare(copy.deepcopy(history)).messages, (case, turn)
            assert_valid_pairs(warm.messages)


def test_remove_policy_ignores_damaged_records_of_removed_calls(tmp_path: Path) -> None:
    engine = _remove_engine(tmp_path)
    history = [user(), asst("A", "B"), tool("B"), asst(content="done"), user("continue")]
    session = engine.session(tmp_path / "s", model="gpt-4o", window=100_000)
    session.prepare(history)
    state_file = tmp_path / "s" / "state.json"
    state = json.loads(state_file.read_text(encoding="utf-8"))
    records = state["stages"]["pairs"]["removed_calls"]
    assert set(records) == {"A"}
    # A record whose call is not a call, one that names no message, and junk.
    state["stages"]["pairs"]["removed_calls"] = {
        "A": {**records["A"], "call": {"id": "A", "function": "not a function"}},
        "X": {"kept": [], "order": ["X"], "call": call("X")},
        "Y": "junk",
    }
    state_file.write_text(json.dumps(state), encoding="utf-8")
    fresh = engine.session(tmp_path / "s", model="gpt-4o", window=100_000)
    out = fresh.prepare([*history, tool("A", "late"), tool("X", "late")])
    assert_valid_pairs(out.messages)
    assert _calls_and_results(out.messages)[1] == ("assistant", ["B"], None)
