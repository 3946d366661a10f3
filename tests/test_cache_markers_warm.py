"""``cache.markers`` on a warm turn: what it remembers from the last call (normalized tools,
digests of plain messages written without a copy, the prefix layers read off the list's facts)
must give what a fresh stage gives on the same input, after edits in place too."""

from __future__ import annotations

import copy
import datetime
import json
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from test_cache_markers import LONG, TOOLS, conversation, make_ctx, tool

from ctxrules import structure
from ctxrules.messages import mark_injected
from ctxrules.stages import cache_markers
from ctxrules.stages.cache_markers import (
    CacheMarkers,
    _digest,
    _layers_of,
    _message_digest,
    canonical_message,
    count_markers,
    prefix_layers,
)

MARK = {"type": "ephemeral"}


def _call(cid: str, **extra: Any) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": "Bash", "arguments": '{"command": "ls"}'}, **extra}


MESSAGES: list[Any] = [
    {"role": "user", "content": "plain"},
    {"role": "user", "content": 'a text that quotes "cache_control": {"type": "ephemeral"}'},
    {"role": "assistant", "content": None, "tool_calls": [_call("c1")]},
    {"role": "assistant", "content": None, "tool_calls": [_call("c2", cache_control=MARK)]},
    {"role": "tool", "tool_call_id": "c1", "content": "out\n" * 5},
    {"role": "user", "content": "marked", "cache_control": MARK},
    {"role": "user", "content": [{"type": "text", "text": "one part"}]},
    {"role": "user", "content": [{"type": "text", "text": "one marked part", "cache_control": MARK}]},
    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:x"}}]},
    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b", "cache_control": MARK}]},
    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    # A Mapping that is not a dict: canonical_message writes it as an object (a copy).
    {"role": "user", "content": [{"type": "text", "text": "x"}, MappingProxyType({"type": "text", "text": "y"})]},
    {"role": "user", "content": "when", "meta": datetime.date(2026, 1, 2)},  # not JSON: written with str()
    {"role": "user", "content": "tuple", "meta": ({"cache_control": MARK},)},
    {"role": "assistant", "content": "ünïcödé ✓", "tool_calls": [_call("c3")]},
]


@pytest.mark.parametrize("msg", MESSAGES)
def test_a_message_digest_is_the_digest_of_its_canonical_form(msg: dict[str, Any]) -> None:
    assert _message_digest(msg) == _digest(canonical_message(msg))


def test_a_plain_new_message_is_digested_without_a_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a warm turn only the appended messages are digested; a plain one is written as it
    is (canonical_message's copy would be the message itself)."""
    stage, state = CacheMarkers({}), {}
    history = conversation(3)
    stage(history, make_ctx(tmp_path, "gpt-4o", TOOLS, state))
    copies: list[Any] = []
    real = cache_markers.canonical_message

    def counting(msg: Any) -> Any:
        copies.append(msg)
        return real(msg)

    monkeypatch.setattr(cache_markers, "canonical_message", counting)
    stage([*history, *conversation(4)[-2:]], make_ctx(tmp_path, "gpt-4o", TOOLS, state))
    assert copies == []


def _signed(text: str) -> dict[str, Any]:
    return mark_injected({"role": "user", "content": text}, "notes")


@pytest.mark.parametrize(
    "messages",
    [
        [],
        [{"role": "system", "content": "s"}],
        [
            {"role": "system", "content": "s"},
            {"role": "developer", "content": "d"},
            {"role": "assistant", "content": "a"},
        ],
        [{"role": "system", "content": "s"}, {"role": "developer", "content": "d"}, {"role": "user", "content": "u"}],
        [{"role": "developer", "content": "d"}, _signed("notes"), {"role": "user", "content": "u"}],
        [_signed("notes"), {"role": "assistant", "content": "a"}],
        [{"role": "user", "content": "u"}, {"role": "user", "content": "v"}],
    ],
)
def test_prefix_layers_from_the_facts_are_those_from_the_messages(messages: list[dict[str, Any]]) -> None:
    assert _layers_of(structure.shape(messages)) == prefix_layers(messages)


def test_equal_tools_are_normalized_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stage, state = CacheMarkers({}), {}
    shuffled = [TOOLS[2], TOOLS[0], TOOLS[3], TOOLS[1]]
    first = stage(conversation(2), make_ctx(tmp_path, "gpt-4o", copy.deepcopy(shuffled), state))
    calls: list[Any] = []
    real = cache_markers.normalize_tools
    monkeypatch.setattr(cache_markers, "normalize_tools", lambda tools: calls.append(tools) or real(tools))
    again = stage(conversation(3), make_ctx(tmp_path, "gpt-4o", copy.deepcopy(shuffled), state))
    assert calls == []
    assert again.tools == first.tools
    assert [a.kind for a in again.actions if a.kind == "tools_normalized"] == ["tools_normalized"]


@pytest.mark.parametrize("model", ["gpt-4o", "claude-sonnet-4-5"])
@pytest.mark.parametrize(
    "edit",
    [
        lambda tools: tools[0].update(cache_control=MARK),
        lambda tools: tools[0]["function"].update(description="  Runs a command.  \n"),
        lambda tools: tools[1]["function"]["parameters"]["properties"].update(limit={"type": "integer"}),
        lambda tools: tools[1]["function"]["parameters"].update(minimum=1.0),  # == 1, another text
        lambda tools: tools.reverse(),
        lambda tools: tools.append(tool("Write", path="string")),
    ],
)
@pytest.mark.parametrize("options", [{}, {"normalize_tools": False}])
def test_tools_edited_in_place_give_what_a_fresh_stage_gives(
    tmp_path: Path, edit: Any, model: str, options: dict[str, Any]
) -> None:
    """The caller's tool dicts may change in place between calls: the remembered
    normalization must not hide it (the tools sent and the break reported are a cold run's),
    nor what is counted per tool object (with ``normalize_tools: false`` the stage sent the
    caller's own dicts, and a marker added to one in place went uncounted: five breakpoints)."""
    tools = copy.deepcopy(TOOLS)
    tools[1]["function"]["parameters"]["minimum"] = 1
    warm, warm_state = CacheMarkers(options), {}
    history = conversation(2)
    # The caller's own breakpoints on the system and first user messages.
    history[0], history[1] = {**history[0], "cache_control": MARK}, {**history[1], "cache_control": MARK}
    warm(history, make_ctx(tmp_path, model, tools, warm_state))
    cold_state = copy.deepcopy(warm_state)
    edit(tools)
    extended = [*history, *conversation(3)[-2:]]
    got = warm(extended, make_ctx(tmp_path, model, tools, warm_state))
    want = CacheMarkers(options)(extended, make_ctx(tmp_path, model, copy.deepcopy(tools), cold_state))
    assert json.dumps(got.tools) == json.dumps(want.tools)
    assert count_markers(got.messages, got.tools or tools) <= 4
    assert [(a.kind, a.detail) for a in got.actions] == [(a.kind, a.detail) for a in want.actions]
    assert got.messages == want.messages
    assert warm_state == cold_state


@pytest.mark.parametrize("feed_back", [True, False])
@pytest.mark.parametrize("model", ["gpt-4o", "claude-sonnet-4-5"])
def test_a_warm_turn_gives_what_a_fresh_stage_gives(tmp_path: Path, model: str, feed_back: bool) -> None:
    """Turn after turn, on the last output (``feed_back``: its markers come back and are
    taken off) or on the caller's own list, with messages appended, some carrying markers of
    the caller's (up to more than the budget), and one message edited in place: the same
    messages, tools, actions and state as a stage that sees the list for the first time with
    the last turn's state."""
    warm, warm_state = CacheMarkers({}), {}
    messages = conversation(2)
    for n in range(3, 11):
        cold_state = copy.deepcopy(warm_state)
        got = warm(messages, make_ctx(tmp_path, model, TOOLS, warm_state, clock=1000.0 + n))
        want = CacheMarkers({})(
            copy.deepcopy(messages), make_ctx(tmp_path, model, copy.deepcopy(TOOLS), cold_state, clock=1000.0 + n)
        )
        assert got.messages == want.messages
        assert json.dumps(got.tools) == json.dumps(want.tools)
        assert [(a.kind, a.detail) for a in got.actions] == [(a.kind, a.detail) for a in want.actions]
        assert warm_state == cold_state
        new = conversation(n)[-2:]
        if n == 6:  # the caller's own breakpoints: four in all, none left to add
            new += [
                {"role": "user", "content": [{"type": "text", "text": f"{k}", "cache_control": MARK}]} for k in "abc"
            ]
        messages = [*(got.messages if feed_back else messages), *new]
        if n == 4:  # an earlier result replaced by a longer one with a breakpoint of the caller's
            messages[3] = {**messages[3], "content": [{"type": "text", "text": LONG, "cache_control": MARK}]}
        if n == 8:  # an edit in place, which the session answers with structure.forget()
            messages[5]["content"] = [{"type": "text", "text": LONG + "edited", "cache_control": MARK}]
            structure.forget()


def test_a_warm_turn_counts_markers_and_tokens_of_the_new_messages_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Breakpoints need the markers already in the request and the prompt's running token
    total: a warm turn walks the appended messages (and those the last call's markers were
    taken off), not the whole history."""
    stage, state = CacheMarkers({}), {}
    history = conversation(40)
    first = stage(history, make_ctx(tmp_path, "claude-sonnet-4-5", TOOLS, state))
    walked: list[int] = []
    tools_walked: list[int] = []
    real = cache_markers.count_markers

    def counting(ms: Any, tools: Any = ()) -> int:
        walked.append(len(ms))
        tools_walked.append(len(tools))
        return real(ms, tools)

    monkeypatch.setattr(cache_markers, "count_markers", counting)
    stage([*first.messages, *conversation(41)[-2:]], make_ctx(tmp_path, "claude-sonnet-4-5", TOOLS, state))
    assert 0 < sum(walked) <= 8
    assert sum(tools_walked) == 0  # the same tools as last time: their markers were counted then
