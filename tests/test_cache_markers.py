"""``cache.markers``: stable prefix, breakpoints, prompt_cache_key, tool narrowing, and the
report of which layer broke the prefix cache; plus a replay of a real transcript."""

from __future__ import annotations

import copy
import dataclasses
import json
import random
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import TRANSCRIPTS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxrules import Engine
from ctxrules.logs import get_logger
from ctxrules.messages import mark_injected, message_text
from ctxrules.models import lookup_model
from ctxrules.pipeline.budget import make_budget
from ctxrules.pipeline.context import StageContext
from ctxrules.stages.cache_markers import (
    CacheMarkers,
    canonical_message,
    count_markers,
    normalize_tools,
    prefix_layers,
    stable_prefix_bytes,
)
from ctxrules.tokens import TokenCounter
from ctxrules.vault import Vault

LONG = "Follow the project's conventions. " * 400  # ~2,800 tokens: worth a breakpoint


def tool(name: str, desc: str = "Does a thing.", **props: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": desc,
            "parameters": {
                "type": "object",
                "properties": {k: {"type": v} for k, v in props.items()},
                "required": list(props),
            },
        },
    }


TOOLS = [
    tool("Bash", command="string", timeout="integer"),
    tool("Read", file_path="string"),
    tool("Edit", file_path="string", old="string", new="string"),
    tool("Grep", pattern="string"),
]


def conversation(n_steps: int, *, system: str = LONG, first: str = "Fix the failing test.") -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": first},
    ]
    for i in range(n_steps):
        msgs.append(
            {
                "role": "assistant",
                "content": f"Step {i}.",
                "tool_calls": [
                    {
                        "id": f"c{i}",
                        "type": "function",
                        "function": {
                            "name": "Bash",
                            "arguments": json.dumps({"command": f"ls {i}"}),
                        },
                    }
                ],
            }
        )
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"output {i}\n" * 40})
    return msgs


def make_ctx(
    tmp_path: Path,
    model: str,
    tools: list[dict[str, Any]],
    state: dict[str, Any],
    clock: float = 1000.0,
    window: int | None = None,
) -> StageContext:
    info = lookup_model(model, window=window)
    counter = TokenCounter.for_model(info)
    budget = make_budget(
        {},
        registry_window=info.window,
        override=window,
        safety_margin=counter.safety_margin,
        model=model,
    )
    return StageContext(
        stage_id="cache",
        model=info,
        counter=counter,
        budget=budget,
        vault=Vault(tmp_path / "v"),
        tools=tools,
        pack={},
        log=get_logger("test"),
        state=state,
        session_id="sess-1",
        clock=clock,
    )


def actions(outcome: Any, kind: str) -> list[str]:
    return [a.detail for a in outcome.actions if a.kind == kind]


# -- tool schemas --------------------------------------------------------------------------------


def test_normalized_tools_are_byte_identical_whatever_the_order() -> None:
    rng = random.Random(7)
    base = normalize_tools(TOOLS)
    for _ in range(20):
        shuffled = copy.deepcopy(TOOLS)
        rng.shuffle(shuffled)
        for t in shuffled:
            params = t["function"]["parameters"]
            params["required"] = list(reversed(params["required"]))
            params["properties"] = dict(reversed(list(params["properties"].items())))
            t["function"] = dict(reversed(list(t["function"].items())))
            t["function"]["description"] += "  \n"
        assert json.dumps(normalize_tools(shuffled)) == json.dumps(base)
    assert [t["function"]["name"] for t in base] == ["Bash", "Edit", "Grep", "Read"]
    assert base[1]["function"]["parameters"]["required"] == ["file_path", "new", "old"]
    assert TOOLS[0]["function"]["parameters"]["required"] == [
        "command",
        "timeout",
    ]  # input untouched


def test_a_tool_breakpoint_stays_at_its_place_in_the_sorted_list() -> None:
    """A ``cache_control`` on a tool caches the tools up to it: the usual one, on the last
    tool, must still be on the last tool after sorting. It moved with its tool (Read, to the
    front of a list sorted by name), and the provider then cached only that one tool."""
    marker = {"type": "ephemeral", "ttl": "1h"}
    marked = [*copy.deepcopy(TOOLS), {**tool("Agent", prompt="string"), "cache_control": marker}]
    out = normalize_tools(marked)
    assert [t["function"]["name"] for t in out] == ["Agent", "Bash", "Edit", "Grep", "Read"]
    assert [t.get("cache_control") for t in out] == [None, None, None, None, marker]
    # Still one form whatever the order the caller gave: the marker goes with the place.
    shuffled = [marked[-1], *marked[:-1]]
    shuffled[-1] = {**shuffled[-1], "cache_control": marker}
    del shuffled[0]["cache_control"]
    assert json.dumps(normalize_tools(shuffled)) == json.dumps(out)


# -- layers --------------------------------------------------------------------------------------


def test_prefix_layers() -> None:
    msgs = [
        {"role": "system", "content": "s"},
        {"role": "system", "content": "AGENTS.md"},
        mark_injected({"role": "user", "content": "old notes"}, "notes"),
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "ok"},
    ]
    layers = prefix_layers(msgs)
    assert (layers.system_stop, layers.workspace_stop, layers.anchor, layers.history_start) == (
        1,
        3,
        3,
        4,
    )
    assert prefix_layers([{"role": "user", "content": "hi"}]).system_stop == 0
    no_user = prefix_layers(msgs[:2])
    assert (no_user.anchor, no_user.prefix_stop) == (None, 2)


# -- breakpoints ---------------------------------------------------------------------------------


def test_anthropic_breakpoints_where_they_pay(tmp_path: Path) -> None:
    msgs = conversation(3)
    state: dict[str, Any] = {}
    stage = CacheMarkers({})
    out = stage(msgs, make_ctx(tmp_path, "claude-sonnet-4-5", TOOLS, state))
    marked = [i for i, m in enumerate(out.messages) if count_markers([m])]
    # system block (reused across sessions) and the conversation tail; the first user message
    # adds too few tokens over the system block to pay for a breakpoint of its own.
    assert marked == [0, len(msgs) - 1]
    assert [message_text(a) for a in out.messages] == [message_text(b) for b in msgs]
    assert msgs[0]["content"] == LONG  # the caller's message is not mutated
    tiny = stage(conversation(1, system="Be brief."), make_ctx(tmp_path, "claude-sonnet-4-5", [], {}))
    assert count_markers(tiny.messages) == 0  # nothing reaches 1024 tokens: no marker pays


def test_a_long_first_user_message_gets_its_own_breakpoint(tmp_path: Path) -> None:
    msgs = conversation(2, first="Here is the issue:\n" + "The parser fails on nested lists. " * 200)
    out = CacheMarkers({})(msgs, make_ctx(tmp_path, "claude-sonnet-4-5", TOOLS, {}))
    assert [i for i, m in enumerate(out.messages) if count_markers([m])] == [0, 1, len(msgs) - 1]


def test_markers_move_with_the_tail_and_restore_the_callers_form(tmp_path: Path) -> None:
    stage = CacheMarkers({})
    state: dict[str, Any] = {}
    first = stage(conversation(2), make_ctx(tmp_path, "claude-sonnet-4-5", TOOLS, state))
    tail = len(first.messages) - 1
    assert isinstance(first.messages[tail]["content"], list)
    # Next call: the session feeds the previous output back with new messages appended.
    grown = first.messages + conversation(4)[len(first.messages) :]
    second = stage(grown, make_ctx(tmp_path, "claude-sonnet-4-5", TOOLS, state, clock=1010))
    assert second.messages[tail]["content"] == conversation(2)[tail]["content"]  # a string again
    assert count_markers([second.messages[-1]]) == 1
    assert second.messages[0] is grown[0]  # the stable breakpoint stays: same object


def test_running_on_its_own_output_changes_nothing(tmp_path: Path) -> None:
    stage = CacheMarkers({})
    state: dict[str, Any] = {}
    once = stage(conversation(3), make_ctx(tmp_path, "claude-sonnet-4-5", TOOLS, state))
    again = stage(once.messages, make_ctx(tmp_path, "claude-sonnet-4-5", once.tools or TOOLS, state))
    assert again.messages == once.messages
    assert all(a is b for a, b in zip(again.messages, once.messages, strict=True))


def test_qwen_gets_prefix_markers_only(tmp_path: Path) -> None:
    msgs = conversation(5, first="Task: " + "refactor the module. " * 300)
    out = CacheMarkers({})(msgs, make_ctx(tmp_path, "qwen-max", TOOLS, {}, window=32000))
    assert [i for i, m in enumerate(out.messages) if count_markers([m])] == [0, 1]


def test_gpt_gets_no_markers_but_a_prompt_cache_key(tmp_path: Path) -> None:
    out = CacheMarkers({})(conversation(3), make_ctx(tmp_path, "gpt-4o", TOOLS, {}))
    assert count_markers(out.messages) == 0
    assert out.request["prompt_cache_key"] == "sess-1"


_role = st.sampled_from(["user", "assistant", "tool", "system"])
_content = st.one_of(
    st.text(min_size=0, max_size=30),
    st.just(LONG[:3000]),
    st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=20)}), max_size=3),
)


@st.composite
def requests(draw: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    msgs = []
    for _ in range(draw(st.integers(0, 14))):
        msg: dict[str, Any] = {"role": draw(_role), "content": draw(_content)}
        if isinstance(msg["content"], list) and msg["content"] and draw(st.booleans()):
            msg["content"][-1]["cache_control"] = {"type": "ephemeral"}
        msgs.append(msg)
    tools = [dict(t) for t in TOOLS[: draw(st.integers(0, 4))]]
    for t in tools:
        if draw(st.booleans()):
            t["cache_control"] = {"type": "ephemeral"}
    return msgs, tools


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(req=requests(), max_bp=st.integers(0, 4), calls=st.integers(1, 3))
def test_never_more_than_four_breakpoints(tmp_path: Path, req: Any, max_bp: int, calls: int) -> None:
    msgs, tools = req
    before = count_markers(msgs, tools)
    stage = CacheMarkers({"max_breakpoints": max_bp, "min_prefix_tokens": 0, "min_gain_tokens": 0})
    state: dict[str, Any] = {}
    snapshot = copy.deepcopy(msgs)
    current = msgs
    for k in range(calls):
        out = stage(current, make_ctx(tmp_path, "claude-sonnet-4-5", tools, state, clock=1000 + k))
        sent_tools = out.tools if out.tools is not None else tools
        total = count_markers(out.messages, sent_tools)
        assert total <= max(max_bp, before), (total, before, max_bp)
        assert total <= 4 or total == before  # only a caller's own excess can exceed 4
        assert [message_text(m) for m in out.messages] == [message_text(m) for m in msgs]
        current = out.messages
    assert msgs == snapshot


# -- prompt_cache_key ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "options", "expected"),
    [
        ("gpt-4o", {}, "sess-1"),
        ("openai/gpt-4.1", {"api_base": "https://api.openai.com/v1"}, "sess-1"),
        ("gpt-4o", {"api_base": "http://localhost:4000"}, None),
        ("azure/gpt-4o", {}, None),
        ("claude-sonnet-4-5", {}, None),
        ("claude-sonnet-4-5", {"prompt_cache_key": "always"}, "sess-1"),
        ("gpt-4o", {"prompt_cache_key": "never"}, None),
    ],
)
def test_prompt_cache_key_only_for_native_openai(
    tmp_path: Path, model: str, options: dict[str, Any], expected: str | None
) -> None:
    out = CacheMarkers(options)(conversation(1), make_ctx(tmp_path, model, [], {}))
    assert out.request.get("prompt_cache_key") == expected


def test_sub_agent_sessions_inherit_the_cache_key(tmp_path: Path) -> None:
    engine = Engine.load("builtin:default")
    parent = engine.session(tmp_path / "parent", model="gpt-4o")
    child = engine.session(tmp_path / "child", model="gpt-4o-mini", cache_key=parent.cache_key)
    msgs = [{"role": "user", "content": "hello"}]
    assert parent.prepare(msgs).request["prompt_cache_key"] == "parent"
    assert child.prepare(msgs).request["prompt_cache_key"] == "parent"
    assert engine.session(tmp_path / "other", model="gpt-4o").prepare(msgs).request["prompt_cache_key"] == "other"
    # The key reaches the stage through its context; without one, the session id is used.
    ctx = dataclasses.replace(make_ctx(tmp_path, "gpt-4o", [], {}), cache_key="scoped")
    assert CacheMarkers({})(conversation(1), ctx).request["prompt_cache_key"] == "scoped"
    out = CacheMarkers({})(conversation(1), make_ctx(tmp_path, "gpt-4o", [], {}))
    assert out.request["prompt_cache_key"] == "sess-1"


# -- tool narrowing ------------------------------------------------------------------------------


def test_allowed_tools_option_narrows_without_editing_the_list(tmp_path: Path) -> None:
    out = CacheMarkers({"allowed_tools": ["Read", "Gr*"]})(conversation(1), make_ctx(tmp_path, "gpt-4o", TOOLS, {}))
    assert [t["function"]["name"] for t in out.tools or TOOLS] == ["Bash", "Edit", "Grep", "Read"]
    choice = out.request["tool_choice"]
    assert choice["type"] == "allowed_tools" and choice["allowed_tools"]["mode"] == "auto"
    assert [t["function"]["name"] for t in choice["allowed_tools"]["tools"]] == ["Grep", "Read"]


def test_a_caller_narrowing_keeps_the_openai_prefix(tmp_path: Path) -> None:
    stage = CacheMarkers({})
    state: dict[str, Any] = {}
    full = stage(conversation(1), make_ctx(tmp_path, "gpt-4o", TOOLS, state))
    narrowed = stage(conversation(2), make_ctx(tmp_path, "gpt-4o", TOOLS[1:2], state, clock=1001))
    assert narrowed.tools == (full.tools or normalize_tools(TOOLS))
    names = [t["function"]["name"] for t in narrowed.request["tool_choice"]["allowed_tools"]["tools"]]
    assert names == ["Read"]
    assert not actions(narrowed, "cache_break") and not narrowed.warnings
    none = stage(conversation(3), make_ctx(tmp_path, "gpt-4o", [], state, clock=1002))
    assert none.request["tool_choice"] == "none" and none.tools == narrowed.tools


def test_stable_tools_always_where_narrowing_cannot_be_said_warns(tmp_path: Path) -> None:
    """`stable_tools: always` on Anthropic kept the tools the caller dropped and asked for a
    tool_choice the provider drops: the model could call them, and nothing said so."""
    stage = CacheMarkers({"stable_tools": "always"})
    state: dict[str, Any] = {}
    stage(conversation(1), make_ctx(tmp_path, "claude-sonnet-4-5", TOOLS, state))
    narrowed = stage(conversation(2), make_ctx(tmp_path, "claude-sonnet-4-5", TOOLS[1:2], state, clock=1001))
    assert len(narrowed.tools or []) == len(TOOLS)  # what the pack asked for
    dropped = sorted(t["function"]["name"] for t in TOOLS if t is not TOOLS[1])
    assert any(
        "stable_tools: always kept 3 tool(s) the caller dropped" in w and ", ".join(dropped) in w
        for w in narrowed.warnings
    ), narrowed.warnings
    # Where tool_choice narrows (OpenAI), nothing to warn about.
    openai_state: dict[str, Any] = {}
    stage(conversation(1), make_ctx(tmp_path, "gpt-4o", TOOLS, openai_state))
    quiet = stage(conversation(2), make_ctx(tmp_path, "gpt-4o", TOOLS[1:2], openai_state, clock=1001))
    assert not any("stable_tools" in w for w in quiet.warnings)


def test_narrowing_on_anthropic_is_reported_as_a_tools_break(tmp_path: Path) -> None:
    stage = CacheMarkers({})
    state: dict[str, Any] = {}
    stage(conversation(1), make_ctx(tmp_path, "claude-sonnet-4-5", TOOLS, state))
    out = stage(conversation(2), make_ctx(tmp_path, "claude-sonnet-4-5", TOOLS[:2], state, clock=1001))
    assert out.warnings == ["prefix cache broke: tools changed (removed: Edit, Grep)"]


# -- why the cache broke -------------------------------------------------------------------------


def _with(msgs: list[dict[str, Any]], i: int, content: str) -> list[dict[str, Any]]:
    out = [dict(m) for m in msgs]
    out[i] = {**out[i], "content": content}
    return out


WORKSPACE = {"role": "system", "content": "# AGENTS.md\nUse tabs."}


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda m, t: (_with(m, 0, LONG + "Today is Monday."), t), "system prompt changed ("),
        (lambda m, t: (m, [*t, tool("WebFetch", url="string")]), "tools changed (added: WebFetch)"),
        (lambda m, t: (m, t[1:]), "tools changed (removed: Bash)"),
        (
            lambda m, t: (m, [tool("Bash", "Runs a command.", command="string"), *t[1:]]),
            "tools changed (schema changed: Bash)",
        ),
        (
            lambda m, t: (_with(m, 1, "# AGENTS.md\nUse spaces."), t),
            "workspace rules changed (1 -> 1 message(s)",
        ),
        (lambda m, t: ([m[0], *m[2:]], t), "workspace rules changed (1 -> 0 message(s)"),
        (lambda m, t: (_with(m, 2, "Fix the other test."), t), "first user message changed"),
    ],
)
def test_the_report_names_the_layer_that_broke_the_prefix(tmp_path: Path, change: Any, expected: str) -> None:
    base = conversation(3)
    msgs = [base[0], WORKSPACE, *base[1:]]
    stage = CacheMarkers({})
    state: dict[str, Any] = {}
    first = stage(msgs, make_ctx(tmp_path, "claude-sonnet-4-5", TOOLS, state))
    assert not first.warnings
    changed_msgs, changed_tools = change(msgs, TOOLS)
    out = stage(changed_msgs, make_ctx(tmp_path, "claude-sonnet-4-5", changed_tools, state, clock=1030))
    assert len(out.warnings) == 1 and out.warnings[0].startswith("prefix cache broke: ")
    assert expected in out.warnings[0], out.warnings
    assert actions(out, "cache_break") == out.warnings


def test_model_change_history_rewrite_and_expiry_are_reported(tmp_path: Path) -> None:
    stage = CacheMarkers({})
    state: dict[str, Any] = {}
    msgs = conversation(4)
    stage(msgs, make_ctx(tmp_path, "claude-sonnet-4-5", TOOLS, state))
    model = stage(msgs, make_ctx(tmp_path, "claude-opus-4-5", TOOLS, state, clock=1001))
    assert "model changed (claude-sonnet-4-5 -> claude-opus-4-5)" in model.warnings[0]
    compacted = _with(msgs, 5, "[ctxrules:elided kind=lines count=40 ref=vault://" + "a" * 64 + "]")
    rewritten = stage(compacted, make_ctx(tmp_path, "claude-opus-4-5", TOOLS, state, clock=1002))
    assert not rewritten.warnings
    assert actions(rewritten, "cache_break") == [
        "history rewritten from message 5 (compaction or an edit): the cached prefix ends before it"
    ]
    idle = stage(compacted, make_ctx(tmp_path, "claude-opus-4-5", TOOLS, state, clock=1002 + 301))
    assert actions(idle, "cache_expired")[0].startswith("idle 301 s since the previous call")
    assert actions(idle, "cache_prefix")


def test_appended_and_shortened_histories_are_counted_in_messages(tmp_path: Path) -> None:
    stage = CacheMarkers({})
    state: dict[str, Any] = {}
    msgs = conversation(4)
    stage(msgs[:-2], make_ctx(tmp_path, "claude-sonnet-4-5", TOOLS, state))
    grown = stage(msgs, make_ctx(tmp_path, "claude-sonnet-4-5", TOOLS, state, clock=1001))
    assert actions(grown, "cache_prefix")[0].endswith("; 2 message(s) appended")
    assert isinstance(state["prefix"]["history"], str)  # one string, not a list per message
    shorter = stage(msgs[:-3], make_ctx(tmp_path, "claude-sonnet-4-5", TOOLS, state, clock=1002))
    n = len(msgs) - state["prefix"]["history_start"]
    assert actions(shorter, "cache_break") == [
        f"history shortened from {n} to {n - 3} messages after the first user message: the cached prefix ends there"
    ]
    # A state written with the older list form is still understood.
    state["prefix"]["history"] = [
        state["prefix"]["history"][k : k + 16] for k in range(0, len(state["prefix"]["history"]), 16)
    ]
    again = stage(msgs, make_ctx(tmp_path, "claude-sonnet-4-5", TOOLS, state, clock=1003))
    assert actions(again, "cache_prefix")[0].endswith("; 3 message(s) appended")


# -- replay of a real transcript -----------------------------------------------------------------


def transcript_tools(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    names = sorted({c["function"]["name"] for m in messages for c in m.get("tool_calls") or []})
    return [tool(n, f"The {n} tool.", input="string") for n in names]


@pytest.mark.corpus
@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("claudecode-ae4a77f8.json", "claude-sonnet-4-5"),
        ("claudecode-ae4a77f8.json", "gpt-4o"),
        ("minisweagent-mwaskom__seaborn-3069.json", "gpt-4o"),
    ],
)
def test_replay_keeps_the_stable_prefix_byte_identical(tmp_path: Path, name: str, model: str) -> None:
    path = TRANSCRIPTS / name
    if not path.is_file():
        pytest.fail(f"the corpus has no transcript {name}", pytrace=False)
    history = json.loads(path.read_text(encoding="utf-8"))
    engine = Engine.load("builtin:default")
    system = {"role": "system", "content": engine.assemble("full", model)}
    if history and history[0].get("role") == "system":
        history = history[1:]
    history = [system, *history]
    tools = transcript_tools(history)
    session = engine.session(tmp_path / "s", model=model, window=400_000)
    rng = random.Random(3)
    # Each call as the agent made it: the history up to each assistant message (what the model
    # answered with it). Not through the assistant message: a history ending in a tool call
    # has no results yet, gets stand-ins, and the next call replaces them with the real ones.
    ends = [i for i, m in enumerate(history) if m["role"] == "assistant" and i > 1]
    previous: bytes | None = None
    same = compared = breaks = 0
    started = time.perf_counter()
    for k, end in enumerate(ends):
        shuffled = list(tools)
        rng.shuffle(shuffled)  # the agent's tool order varies: normalization must absorb it
        result = session.prepare(history[:end], shuffled, clock=1_000_000 + k * 20)
        stages = {s["id"]: s for s in result.report["stages"]}
        compacted = any(s["tokens_saved"] for s in stages.values() if s["phase"] == "content")
        current = stable_prefix_bytes(result.messages, result.tools)
        # The first call is the system prompt and the first ask alone: the ask is its last
        # message, whose rolling breakpoint moves on with the next call (a marker, not content).
        if previous is not None and not compacted and k >= 2:
            compared += 1
            same += current == previous
        breaks += sum(a["kind"] == "cache_break" for a in stages["cache"]["actions"])
        assert count_markers(result.messages, result.tools) <= 4
        previous = current
    share = same / compared
    print(
        f"\nreplay {name} with {model}: {len(ends)} calls, "
        f"stable prefix identical on {same}/{compared} "
        f"calls without compaction ({share:.1%}), cache breaks reported: {breaks}, "
        f"{(time.perf_counter() - started) / len(ends) * 1000:.1f} ms per prepare"
    )
    assert compared >= 5 and share == 1.0
    assert breaks == 0
    assert canonical_message(result.messages[0]) == system


def test_allowed_tools_on_a_provider_without_the_tool_choice_narrows_the_list(tmp_path: Path) -> None:
    # Anthropic has no tool_choice=allowed_tools: the narrowing was dropped on the way to the
    # provider, and every tool the pack meant to forbid stayed callable.
    stage = CacheMarkers({"allowed_tools": ["Read", "Gr*"]})
    out = stage(conversation(1), make_ctx(tmp_path, "claude-sonnet-4-5", TOOLS, {}))
    assert [t["function"]["name"] for t in out.tools or TOOLS] == ["Grep", "Read"]
    assert "tool_choice" not in out.request
    assert any("2 of 4 tools sent" in d for d in actions(out, "allowed_tools"))
    # Nothing left to call: the schemas stay (a history with tool calls must define tools).
    none = CacheMarkers({"allowed_tools": ["Nothing*"]})(
        conversation(1), make_ctx(tmp_path, "claude-sonnet-4-5", TOOLS, {})
    )
    assert none.request["tool_choice"] == "none" and len(none.tools or TOOLS) == 4
