"""``thinking.clean`` on provider-shaped fixtures (the corpus has no thinking fields): the
Anthropic, DeepSeek/Kimi and no-op conventions, prefix-change detection through the stage state,
and the reasoning_content backfill after a switch to a thinking model."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from filtering_kit import Msg, make_ctx, text_of
from invariants import pairing_problems

from ctxrules import Engine
from ctxrules.stages.compress_common import text_id
from ctxrules.stages.thinking_clean import STAGE_TYPE, ThinkingClean, resolve_provider
from ctxrules.vault import parse_markers

CLAUDE = "claude-sonnet-4-5"


def signed(
    text: str, sig: str, calls: list[str] | None = None, content: str | None = "", reasoning: str | None = "same"
) -> Msg:
    """An Anthropic-shaped assistant message (litellm's OpenAI format)."""
    msg: Msg = {
        "role": "assistant",
        "content": content,
        "thinking_blocks": [{"type": "thinking", "thinking": text, "signature": sig}],
    }
    if reasoning is not None:
        msg["reasoning_content"] = text if reasoning == "same" else reasoning
    if calls:
        msg["tool_calls"] = [
            {"id": c, "type": "function", "function": {"name": "Bash", "arguments": '{"command": "ls"}'}} for c in calls
        ]
    return msg


def result(cid: str, text: str = "ok") -> Msg:
    return {"role": "tool", "tool_call_id": cid, "content": text}


def anthropic_convo() -> list[Msg]:
    return [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Refactor the parser."},
        signed("I should read the parser first.", "sigA", ["c1"], "Reading."),
        result("c1", "def parse(): ..." * 20),
        signed("Now I can edit it.", "sigB", ["c2"]),
        result("c2", "edited"),
        signed("Check the tests.", "sigC", ["c3"]),
        result("c3", "3 passed"),
        {"role": "user", "content": "Thanks. Now run the linter."},
        signed("Run ruff.", "sigD", ["c4"]),
        result("c4", "All checks passed!"),
    ]


def run(
    messages: list[Msg], tmp_path: Path, options: dict[str, Any] | None = None, model: str = CLAUDE, **ctx_args: Any
) -> tuple[list[Msg], Any, Any]:
    ctx = make_ctx(tmp_path, model=model, **ctx_args)
    outcome = ThinkingClean(options)(messages, ctx)
    return outcome.messages, outcome, ctx


# --- anthropic ------------------------------------------------------------------------------


def test_anthropic_drops_duplicate_reasoning_content_and_keeps_the_blocks(tmp_path: Path) -> None:
    messages = anthropic_convo()
    out, outcome, ctx = run(messages, tmp_path)
    assert [a.index for a in outcome.actions] == [2, 4, 6]
    assert {a.kind for a in outcome.actions} == {"reasoning_duplicate_dropped"}
    for i in (2, 4, 6):
        assert "reasoning_content" not in out[i]
        assert out[i]["thinking_blocks"] == messages[i]["thinking_blocks"]
        assert out[i]["content"] == messages[i]["content"]  # nothing lost: no marker needed
        assert ctx.vault.get_text(outcome.actions[[2, 4, 6].index(i)].vault_id) == messages[i]["reasoning_content"]
    assert out[9] is messages[9]  # the latest step (pinned) is never touched
    # The provider gets that text once (litellm sends the blocks), and it is counted once: the
    # drop saves nothing by the count; it only keeps the duplicate off the wire.
    assert all(a.tokens_saved == 0 for a in outcome.actions)


def test_anthropic_keeps_reasoning_content_that_is_not_a_duplicate(tmp_path: Path) -> None:
    messages = anthropic_convo()
    messages[2] = signed(
        "I should read the parser first.", "sigA", ["c1"], "Reading.", reasoning="a different summary of the reasoning"
    )
    messages[4]["thinking_blocks"].append({"type": "redacted_thinking", "data": "ENCRYPTED"})
    out, _outcome, _ = run(messages, tmp_path)
    assert out[2] is messages[2]
    assert "reasoning_content" not in out[4]  # "" joins: redacted blocks add no text


def test_anthropic_strips_thinking_of_steps_whose_prefix_changed(tmp_path: Path) -> None:
    messages = anthropic_convo()
    state: dict[str, Any] = {}
    first, _, ctx = run(messages, tmp_path, state=state)
    assert len(state["prefixes"]) == 4
    # A compaction of the previous call shortened the result of the first step.
    compacted = list(first)
    compacted[3] = {
        **first[3],
        "content": "def parse(): ...\n[ctxrules:elided kind=lines count=19 ref=vault://" + "a" * 64 + "]",
    }
    out, outcome, _ = run(compacted, tmp_path, state=state)
    stripped = {a.index for a in outcome.actions if a.kind == "thinking_stripped"}
    assert stripped == {4, 6}  # after the change; message 2's own prefix is intact
    assert out[2] is compacted[2] and out[9] is compacted[9]  # the latest step stays signed
    for i in (4, 6):
        assert "thinking_blocks" not in out[i]
        marker = parse_markers(text_of(out[i]))[0]
        assert marker.extra == {"field": "thinking", "reason": "prefix_changed"}
        stored = json.loads(ctx.vault.get_text(marker.vault_id))
        assert stored["thinking_blocks"] == messages[i]["thinking_blocks"]
    assert pairing_problems(out) == []
    # Running again on that output (same state) changes nothing: the stripped steps have no
    # signature left, the others still see the prefix they were recorded with.
    again, outcome2, _ = run(out, tmp_path, state=state)
    assert outcome2.actions == [] and all(a is b for a, b in zip(out, again, strict=True))


def test_anthropic_unchanged_prefixes_strip_nothing(tmp_path: Path) -> None:
    state: dict[str, Any] = {}
    first, _, _ = run(anthropic_convo(), tmp_path, state=state)
    out, outcome, _ = run(first, tmp_path, state=state)
    assert outcome.actions == [] and all(a is b for a, b in zip(first, out, strict=True))


def test_cache_breakpoints_and_dropped_reasoning_are_not_a_prefix_change(tmp_path: Path) -> None:
    state: dict[str, Any] = {}
    first, outcome, _ = run(anthropic_convo(), tmp_path, state=state)
    assert outcome.actions  # duplicates were dropped: not a change Anthropic can see
    marked = list(first)
    marked[3] = {
        **first[3],
        "content": [{"type": "text", "text": first[3]["content"], "cache_control": {"type": "ephemeral"}}],
    }
    _out, outcome, _ = run(marked, tmp_path, state=state)
    assert outcome.actions == []


def test_builtin_default_strips_nothing_over_calls_without_compaction(tmp_path: Path) -> None:
    session = Engine.load("builtin:default").session(tmp_path / "s", model=CLAUDE, window=200_000)
    history = anthropic_convo()
    for n, clock in enumerate((1000.0, 1100.0, 5000.0)):
        history = [*history, signed(f"Step {n}.", f"sigN{n}", [f"n{n}"]), result(f"n{n}", "done")]
        report = session.prepare(history, clock=clock).report
        thinking = next(s for s in report["stages"] if s["id"] == "thinking")
        assert not [a for a in thinking["actions"] if a["kind"] == "thinking_stripped"], n


def test_anthropic_thinking_in_content_parts_is_handled_too(tmp_path: Path) -> None:
    messages = anthropic_convo()
    block = {"type": "thinking", "thinking": "Now I can edit it.", "signature": "sigB"}
    messages[4] = {
        "role": "assistant",
        "content": [block, {"type": "text", "text": "Editing."}],
        "tool_calls": messages[4]["tool_calls"],
    }
    state: dict[str, Any] = {}
    first, _, _ = run(messages, tmp_path, state=state)
    changed = list(first)
    changed[3] = {**first[3], "content": "shortened"}
    out, outcome, ctx = run(changed, tmp_path, state=state)
    assert 4 in {a.index for a in outcome.actions}
    parts = out[4]["content"]
    assert parts[0] == {"type": "text", "text": "Editing."}
    assert parts[1]["text"].startswith("[ctxrules:elided kind=tokens")
    stored = json.loads(ctx.vault.get_text(parse_markers(parts[1]["text"])[0].vault_id))
    assert stored["content_thinking_parts"] == [block]


def test_prefix_change_is_detected_across_prepare_calls(tmp_path: Path) -> None:
    """End to end: a later stage reduces an old output; on the next call thinking.clean sees
    that the steps after it were signed over a different prefix and strips them."""
    pack = tmp_path / "pack.yaml"
    pack.write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: t, version: 1.0.0}\n"
        "pipeline:\n  - {id: thinking, use: thinking.clean}\n"
        "  - {id: outputs, use: tool_output.filter, with: {item_tokens: 500, "
        "compressors: false}}\n"
    )
    session = Engine.load(pack).session(tmp_path / "s", model=CLAUDE, window=200_000)
    big = "".join(f"build line {i}\n" for i in range(2000))
    h1 = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "build it"},
        signed("Build first.", "s1", ["b1"]),
        result("b1", big),
    ]
    h2 = [*h1, signed("Look at the error.", "s2", ["b2"]), result("b2", "error at line 3")]
    h3 = [*h2, signed("Fix it.", "s3", ["b3"]), result("b3", "fixed")]
    r1 = session.prepare(h1, clock=1000.0)
    assert r1.messages[3]["content"] == big  # pinned: the newest step
    r2 = session.prepare(h2, clock=2000.0)
    assert r2.messages[3]["content"] != big  # now reduced, after thinking ran
    assert r2.messages[4]["thinking_blocks"] == h2[4]["thinking_blocks"]
    r3 = session.prepare(h3, clock=3000.0)
    thinking = next(s for s in r3.report["stages"] if s["id"] == "thinking")
    assert [a["kind"] for a in thinking["actions"]] == ["thinking_stripped"]
    assert "thinking_blocks" not in r3.messages[4]
    assert r3.messages[2]["thinking_blocks"] == h1[2]["thinking_blocks"]  # its prefix is intact
    assert r3.messages[6]["thinking_blocks"] == h3[6]["thinking_blocks"]  # latest step
    assert pairing_problems(r3.messages) == []


# --- deepseek / kimi ------------------------------------------------------------------------


def reasoning_convo() -> list[Msg]:
    def a(reasoning: str, content: str | None, calls: list[str] | None = None) -> Msg:
        msg: Msg = {"role": "assistant", "content": content, "reasoning_content": reasoning}
        if calls:
            msg["tool_calls"] = [
                {"id": c, "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
                for c in calls
            ]
        return msg

    return [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "What is 2+2?"},
        a("Simple arithmetic: two plus two is four. " * 30, "4"),
        {"role": "user", "content": "List the files."},
        a("I need to call ls to see the files. " * 10, None, ["l1"]),
        result("l1", "a.py b.py"),
        a("The listing shows two files, so I report them. " * 30, "a.py and b.py"),
        {"role": "user", "content": "Count the lines."},
        a("Use wc -l on both files. " * 10, None, ["w1"]),
        result("w1", "10 a.py\n20 b.py"),
    ]


def test_deepseek_drops_earlier_reasoning_except_on_tool_call_messages(tmp_path: Path) -> None:
    messages = reasoning_convo()
    out, outcome, ctx = run(messages, tmp_path, model="deepseek-reasoner")
    assert [(a.kind, a.index) for a in outcome.actions] == [("reasoning_dropped", 2), ("reasoning_dropped", 6)]
    assert out[4] is messages[4]  # tool calls: the API wants its reasoning back
    assert out[8] is messages[8]  # the current exchange is always kept
    for i in (2, 6):
        assert "reasoning_content" not in out[i]
        expected = messages[i]["content"] + "\n[ctxrules:elided kind=tokens"
        assert out[i]["content"].startswith(expected)
        marker = parse_markers(out[i]["content"])[0]
        assert marker.extra["field"] == "reasoning_content"
        assert ctx.vault.get_text(marker.vault_id) == messages[i]["reasoning_content"]
    assert sum(a.tokens_saved for a in outcome.actions) > 100


def test_deepseek_keeps_reasoning_shorter_than_its_marker(tmp_path: Path) -> None:
    """Moving a few words of reasoning to the vault would leave a marker longer than them: the
    message would grow, so it is kept (and nothing is written to the vault)."""
    messages = reasoning_convo()
    messages[2] = {**messages[2], "reasoning_content": "Add."}
    out, outcome, ctx = run(messages, tmp_path, model="deepseek-reasoner")
    assert [(a.kind, a.index) for a in outcome.actions] == [("reasoning_dropped", 6)]
    assert out[2] is messages[2]
    assert not ctx.vault.exists(text_id("Add."))
    assert all(ctx.counter.count_message(o) <= ctx.counter.count_message(m) for o, m in zip(out, messages, strict=True))


def test_kimi_follows_the_same_convention(tmp_path: Path) -> None:
    messages = reasoning_convo()
    deepseek, _, _ = run(messages, tmp_path / "d", model="deepseek-reasoner")
    kimi, _, _ = run(messages, tmp_path / "k", {"provider": "kimi"}, model="gpt-4o")
    assert kimi == deepseek


def test_behaviour_differs_by_provider(tmp_path: Path) -> None:
    """The same history (reasoning_content mirrored in thinking_blocks) under each convention."""
    messages = reasoning_convo()
    for i, msg in enumerate(messages):
        if msg.get("reasoning_content"):
            messages[i] = {
                **msg,
                "thinking_blocks": [{"type": "thinking", "thinking": msg["reasoning_content"], "signature": f"s{i}"}],
            }
    outs = {}
    for provider in ("anthropic", "deepseek", "none"):
        out, outcome, _ = run(messages, tmp_path / provider, {"provider": provider}, model="gpt-4o")
        outs[provider] = (out, [(a.kind, a.index) for a in outcome.actions])
    assert outs["anthropic"][1] == [("reasoning_duplicate_dropped", i) for i in (2, 4, 6)]
    # DeepSeek keeps the blocks, so the text is sent (and counted) once either way: moving the
    # copy in reasoning_content out would only add a marker. Without the blocks it moves.
    assert outs["deepseek"][1] == []
    plain, outcome, _ = run(reasoning_convo(), tmp_path / "plain", {"provider": "deepseek"}, model="gpt-4o")
    assert [(a.kind, a.index) for a in outcome.actions] == [("reasoning_dropped", 2), ("reasoning_dropped", 6)]
    assert outs["none"][1] == []
    assert all(a is b for a, b in zip(outs["none"][0], messages, strict=True))
    # Anthropic leaves no marker (the blocks hold the text); DeepSeek does.
    assert outs["anthropic"][0][2]["content"] == "4"
    assert "[ctxrules:elided" in plain[2]["content"]


def without_reasoning(messages: list[Msg]) -> list[Msg]:
    return [{k: v for k, v in m.items() if k != "reasoning_content"} for m in messages]


def test_backfill_after_a_switch_to_a_thinking_model(tmp_path: Path) -> None:
    plain = without_reasoning(reasoning_convo())
    state: dict[str, Any] = {}
    # The session ran on deepseek-chat (no thinking): nothing is added.
    out, outcome, _ = run(plain, tmp_path, model="deepseek-chat", state=state)
    assert outcome.actions == [] and state["model"] == "deepseek-chat"
    # Switched to the reasoner: every tool-call message gets an empty reasoning_content,
    # the pinned newest step too (the API rejects the request otherwise).
    out, outcome, _ = run(plain, tmp_path, model="deepseek-reasoner", state=state)
    assert [a.kind for a in outcome.actions] == ["reasoning_backfilled"]
    assert "switched from deepseek-chat to deepseek-reasoner" in outcome.actions[0].detail
    assert [i for i, m in enumerate(out) if "reasoning_content" in m] == [4, 8]
    assert out[4]["reasoning_content"] == "" and out[8]["reasoning_content"] == ""
    assert out[2] is plain[2]  # no tool calls: nothing demanded
    again, outcome2, _ = run(out, tmp_path, model="deepseek-reasoner", state=state)
    assert outcome2.actions == [] and again == out


@pytest.mark.parametrize(
    ("model", "option", "backfilled"),
    [
        ("moonshot/kimi-k2-thinking", "auto", True),
        ("deepseek-chat", "always", True),
        ("deepseek-reasoner", "never", False),
        (CLAUDE, "always", False),  # Anthropic signatures cannot be fabricated
        ("gpt-4o", "always", False),
    ],
)
def test_backfill_options(tmp_path: Path, model: str, option: str, backfilled: bool) -> None:
    plain = without_reasoning(reasoning_convo())
    out, _, _ = run(plain, tmp_path, {"backfill_reasoning": option}, model=model)
    assert ("reasoning_content" in out[4]) is backfilled


def test_backfill_when_the_latest_turn_already_thinks(tmp_path: Path) -> None:
    messages = reasoning_convo()
    del messages[4]["reasoning_content"]  # produced before the switch
    out, _outcome, _ = run(messages, tmp_path, model="deepseek-chat")
    assert out[4]["reasoning_content"] == ""


# --- invariants -----------------------------------------------------------------------------


@pytest.mark.parametrize(("provider", "model"), [("auto", CLAUDE), ("auto", "deepseek-reasoner"), ("none", "gpt-4o")])
def test_input_is_not_mutated_and_rerun_changes_nothing(tmp_path: Path, provider: str, model: str) -> None:
    messages = anthropic_convo() + reasoning_convo()[1:]
    frozen = copy.deepcopy(messages)
    state: dict[str, Any] = {}
    out, _, _ = run(messages, tmp_path, {"provider": provider}, model=model, state=state)
    assert messages == frozen
    again, outcome, _ = run(out, tmp_path, {"provider": provider}, model=model, state=state)
    assert outcome.actions == [] and all(a is b for a, b in zip(out, again, strict=True))


def test_protection_does_not_keep_a_signature_whose_prefix_changed(tmp_path: Path) -> None:
    messages = anthropic_convo()
    state: dict[str, Any] = {}
    first, _, _ = run(messages, tmp_path, state=state)
    compacted = list(first)
    compacted[3] = {
        **first[3],
        "content": "def parse(): ...\n[ctxrules:elided kind=lines count=19 ref=vault://" + "a" * 64 + "]",
    }
    # compress.intent protected step 4 (say, it mentions the focus file): its thinking still goes.
    out, outcome, _ = run(compacted, tmp_path, state=state, protected=[id(compacted[4])])
    stripped = {a.index: a.detail for a in outcome.actions if a.kind == "thinking_stripped"}
    assert set(stripped) == {4, 6} and "protected" in stripped[4] and "protected" not in stripped[6]
    assert "thinking_blocks" not in out[4] and out[4]["tool_calls"] == compacted[4]["tool_calls"]
    # Protection still keeps everything else: the duplicate reasoning of a protected message stays.
    plain = anthropic_convo()
    kept, again, _ = run(plain, tmp_path / "b", protected=[id(plain[2])])
    assert kept[2] is plain[2] and {a.index for a in again.actions} == {4, 6}


def test_protected_messages_are_not_cleaned(tmp_path: Path) -> None:
    messages = reasoning_convo()
    out, outcome, _ = run(messages, tmp_path, model="deepseek-reasoner", protected=[id(messages[2])])
    assert out[2] is messages[2] and [a.index for a in outcome.actions] == [6]


@pytest.mark.parametrize(
    ("family", "provider", "name", "expected"),
    [
        ("anthropic", "anthropic", "claude-opus-4-1", "anthropic"),
        ("anthropic", "bedrock", "bedrock/anthropic.claude-3-7-sonnet", "anthropic"),
        ("deepseek", "deepseek", "deepseek-reasoner", "deepseek"),
        ("deepseek", None, "kimi-k2-0905-preview", "deepseek"),
        ("qwen", "dashscope", "qwen3-max", "deepseek"),
        ("other", "novita", "xiaomi/mimo-v2-flash", "deepseek"),
        ("other", "moonshot", "moonshot-v1-8k", "deepseek"),
        ("openai", "openai", "gpt-4o", "none"),
        ("gemini", "vertex_ai", "gemini-2.5-pro", "none"),
    ],
)
def test_auto_provider_resolution(family: str, provider: str | None, name: str, expected: str) -> None:
    assert resolve_provider("auto", family, provider, name) == expected


def test_explicit_provider_overrides_the_model(tmp_path: Path) -> None:
    messages = reasoning_convo()
    out, outcome, _ = run(messages, tmp_path, {"provider": "none"}, model="deepseek-reasoner")
    assert outcome.actions == [] and out == messages


def test_options_are_checked_and_documented(tmp_path: Path, cli: Any) -> None:
    with pytest.raises(ValueError, match="provider"):
        ThinkingClean({"provider": "openai"})
    for name, prop in STAGE_TYPE.options_schema["properties"].items():
        assert prop.get("title") and prop.get("description"), name
    pack = tmp_path / "pack.yaml"
    pack.write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: t, version: 1.0.0}\n"
        "pipeline:\n  - {id: thinking, use: thinking.clean, "
        "with: {provider: openai}}\n"
    )
    code, out, err = cli("validate", str(pack))
    assert code == 1 and "CR061" in out + err


def test_default_pack_strips_a_changed_prefix_signature_from_a_protected_step(tmp_path: Path) -> None:
    """builtin:default end to end: compress.intent protects the step that touched the file the
    latest ask names; after a reduction changed the prefix before it, its signed thinking goes
    anyway (the provider would reject it), while its content and calls stay."""
    session = Engine.load("builtin:default").session(tmp_path / "s", model=CLAUDE, window=200_000)
    big = "".join(f"build line {i}: compiling module_{i % 40}.c\n" for i in range(2500))
    edit = signed("Open the parser.", "s2", ["b2"])
    edit["tool_calls"][0]["function"]["arguments"] = '{"command": "sed -n 1,40p src/parser.py"}'
    h1 = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "build it"},
        signed("Build first.", "s1", ["b1"]),
        result("b1", big),
    ]
    h2 = [*h1, edit, result("b2", "def parse(tokens):\n    return tokens\n")]
    h3 = [
        *h2,
        {"role": "user", "content": "Now fix src/parser.py so parse() handles empty input."},
        signed("Edit it.", "s3", ["b3"]),
        result("b3", "edited"),
    ]
    session.prepare(h1, clock=1000.0)
    r2 = session.prepare(h2, clock=2000.0)
    assert r2.messages[3]["content"] != big  # the first output was reduced: later prefixes changed
    r3 = session.prepare(h3, clock=3000.0)
    intent = next(s for s in r3.report["stages"] if s["id"] == "intent")
    assert intent["actions"] and "protected" in intent["actions"][0]["detail"]
    thinking = next(s for s in r3.report["stages"] if s["id"] == "thinking")
    details = [a["detail"] for a in thinking["actions"] if a["kind"] == "thinking_stripped"]
    assert len(details) == 1 and "protected message" in details[0], thinking["actions"]
    out = r3.messages[4]
    assert "thinking_blocks" not in out and out["tool_calls"] == edit["tool_calls"]
    assert r3.messages[-2]["thinking_blocks"] == h3[-2]["thinking_blocks"]  # the newest step
