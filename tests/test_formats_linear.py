"""The request codecs do work in proportion to the request on huge turns (50,000 parallel tool
calls, 100,000 messages): shown by counting what they do, not by timing them (timings are in
tests/bench_formats.py). Each count here grew with the square of the size before."""

from __future__ import annotations

from typing import Any

import pytest

from ctxrules.formats import anthropic as A
from ctxrules.formats import openai as O

N = 2_000  # large enough that a quadratic count is a thousand times the linear one


class CountedId(str):
    """A tool call id that counts how often it is compared for equality: a scan of a list for
    each id compares it with every id before it."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        CountedId.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


@pytest.fixture
def compared() -> Any:
    CountedId.compared = 0
    yield lambda: CountedId.compared


def _ids(n: int) -> list[CountedId]:
    return [CountedId(f"toolu_{i}") for i in range(n)]


def test_anthropic_validation_of_parallel_calls_compares_each_id_a_few_times(compared: Any) -> None:
    """Each tool_use id was looked for in the list of results and each result in the list of
    calls: 50,000 parallel calls took 2.5 billion comparisons."""
    ids = _ids(N)
    request = {
        "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": i, "name": "f", "input": {}} for i in ids]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": i} for i in ids[::-1]][1:]},
        ]
    }
    problems = A.validate(request)
    assert [p.message for p in problems] == [f"tool_use {ids[-1]} is not answered in this turn"]
    assert compared() < 4 * N


def test_openai_validation_of_parallel_calls_compares_each_id_a_few_times(compared: Any) -> None:
    """Each result was looked for in the list of open calls and removed from it: results in
    the reverse order of their calls compared each with every open call."""
    ids = _ids(N)
    calls = [{"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in ids]
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": calls},
        *({"role": "tool", "tool_call_id": i, "content": "ok"} for i in ids[:0:-1]),
        {"role": "user", "content": "and?"},
    ]
    problems = O.validate(messages)
    assert [str(p) for p in problems] == [f"messages[{N + 1}]: tool calls {ids[0]} are not answered"]
    assert compared() < 4 * N


def test_openai_validation_names_the_calls_left_as_before() -> None:
    """A result answers the first open call of its id (ids can repeat): the ones named as not
    answered are the later calls of the id, in their order among the others."""
    calls = [{"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in "abacab"]
    messages = [
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "a", "content": "ok"},
        {"role": "tool", "tool_call_id": "b", "content": "ok"},
        {"role": "tool", "tool_call_id": "d", "content": "ok"},
        {"role": "user", "content": "and?"},
    ]
    assert [str(p) for p in O.validate(messages)] == [
        "messages[3]: tool result d answers no open tool call",
        "messages[4]: tool calls a, c, a, b are not answered",
    ]


def _user_run(n: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"m{i}"} for i in range(n)]


def _results_and_texts(n: int) -> list[dict[str, Any]]:
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in range(n)]
    out: list[dict[str, Any]] = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": calls},
    ]
    for i in range(n):
        out += [{"role": "tool", "tool_call_id": f"c{i}", "content": "ok"}, {"role": "user", "content": f"m{i}"}]
    return out


def _empty_replies_between(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(n):
        out += [{"role": "user", "content": f"m{i}"}, {"role": "assistant", "content": []}]
    return out


@pytest.mark.parametrize(
    ("messages", "last_turn"),
    [
        # 100,000 user messages in a row (a harness that never answered) are one turn.
        (_user_run(N), [{"type": "text", "text": f"m{i}"} for i in range(N)]),
        # Results first in the turn, in order, then the texts.
        (
            _results_and_texts(N),
            [{"type": "tool_result", "tool_use_id": f"c{i}", "content": "ok"} for i in range(N)]
            + [{"type": "text", "text": f"m{i}"} for i in range(N)],
        ),
        # Empty assistant turns are left out and the user turns around them joined.
        (_empty_replies_between(N), [{"type": "text", "text": f"m{i}"} for i in range(N)]),
    ],
    ids=["user-run", "results-and-texts", "empty-replies-between"],
)
def test_joining_messages_into_a_turn_copies_each_block_once(
    monkeypatch: pytest.MonkeyPatch, messages: list[dict[str, Any]], last_turn: list[dict[str, Any]]
) -> None:
    """Messages joined into one turn: the turn's blocks were copied (by ``_as_list``) for
    each message joined, the square of the run's length in all."""
    copied = 0
    as_list = A._as_list

    def counting(content: Any) -> list[dict[str, Any]]:
        nonlocal copied
        out = as_list(content)
        copied += len(out)
        return out

    monkeypatch.setattr(A, "_as_list", counting)
    body = A.encode(messages)
    assert body["messages"][-1] == {"role": "user", "content": last_turn}
    assert copied <= 3 * len(messages)


def test_signed_thinking_of_a_long_conversation_writes_each_message_out_a_few_times(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With preserved thinking every thinking block's prefix was written out to be compared
    with the original's: the messages before it, for each of hundreds of turns."""
    turns = 300
    messages: list[dict[str, Any]] = []
    for k in range(turns):
        messages.append({"role": "user", "content": f"q{k}"})
        thinking = {"type": "thinking", "thinking": "hm", "signature": f"sig{k}"}
        messages.append({"role": "assistant", "content": [thinking, {"type": "text", "text": f"a{k}"}]})
    messages.append({"role": "user", "content": "last"})
    original = {"messages": messages}
    edited = {"messages": [*messages[:201], {"role": "assistant", "content": "changed"}, *messages[202:]]}
    written = 0
    uncached = A._uncached

    def counting(value: Any) -> Any:
        nonlocal written
        written += isinstance(value, dict) and "role" in value
        return uncached(value)

    monkeypatch.setattr(A, "_uncached", counting)
    problems = A.validate(edited, original=original, preserved_thinking=True)
    kept = [p.path for p in problems if p.message == "signed thinking kept after its prefix changed"]
    assert kept == [f"messages[{i}]" for i in range(203, 2 * turns, 2)]
    assert written <= 4 * len(messages)
