"""A shape derived from an earlier list (appended or replaced messages) equals a fresh one."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from conftest import TRANSCRIPTS
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxrules import structure
from ctxrules.messages import mark_injected
from ctxrules.structure import exchanges, facts_of, pair_tool_calls, pinned_indices, shape, steps

Msg = dict[str, Any]

TRANSCRIPT = TRANSCRIPTS / "claudecode-ae4a77f8.json"

_ids = st.sampled_from(["a", "b", "c", None])


def _call(cid: str | None) -> Msg:
    out: Msg = {"type": "function", "function": {"name": "Bash", "arguments": "{}"}}
    if cid is not None:
        out["id"] = cid
    return out


@st.composite
def message(draw: Callable[..., Any]) -> Msg:
    kind = draw(st.sampled_from(["user", "injected", "asst", "tool", "function", "image", "system"]))
    if kind == "user":
        return {"role": "user", "content": draw(st.sampled_from(["u", "x" * 40]))}
    if kind == "injected":
        return mark_injected({"role": "user", "content": "n"}, "notice")
    if kind == "asst":
        ids = draw(st.lists(_ids, max_size=3))
        return {"role": "assistant", "content": "", **({"tool_calls": [_call(c) for c in ids]} if ids else {})}
    if kind == "tool":
        cid = draw(_ids)
        return {"role": "tool", "content": "ok", **({"tool_call_id": cid} if cid else {})}
    if kind == "image":
        return {
            "role": "user",
            "content": [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": "data:,"}}],
        }
    if kind == "function":
        return {"role": "function", "name": "f", "content": "r"}
    return {"role": "system", "content": "s"}


def _view(messages: list[Msg]) -> tuple[Any, ...]:
    made = shape(messages)
    pairing = pair_tool_calls(messages)
    return (
        made.facts,
        dict(pairing.result_of),
        dict(pairing.call_of),
        pairing.orphans,
        dict(pairing.duplicates),
        pairing.unanswered,
        pairing.positional,
        pinned_indices(messages),
        steps(messages),
        exchanges(messages),
    )


def _fresh(messages: list[Msg]) -> tuple[Any, ...]:
    structure.forget()
    return _view(copy.deepcopy(messages))


@settings(max_examples=300)
@given(
    st.lists(message(), max_size=12),
    st.lists(message(), max_size=6),
    st.booleans(),
    st.lists(st.tuples(st.integers(0, 17), st.booleans(), message()), max_size=4),
)
def test_derived_shapes_equal_fresh_ones(
    first: list[Msg], tail: list[Msg], paired: bool, replace: list[tuple[int, bool, Msg]]
) -> None:
    structure.forget()
    base = list(first)
    if paired:
        pair_tool_calls(base)  # a finished scan the next list may resume
    else:
        shape(base)
    grown = [*base, *tail]
    assert _view(grown) == _fresh(grown)
    # Replace some messages: a copy with other text (same structure) or another message.
    structure.forget()
    pair_tool_calls(grown)
    edited = list(grown)
    for at, keep_structure, other in replace:
        if at < len(edited):
            edited[at] = {**edited[at], "content": "changed"} if keep_structure else other
    derived = _view(edited)
    assert derived == _fresh(edited)


@pytest.mark.corpus
def test_a_warm_turn_resumes_instead_of_rescanning() -> None:
    history: list[Msg] = json.loads(TRANSCRIPT.read_text())
    structure.forget()
    first = pair_tool_calls(history)
    turn = [
        {"role": "assistant", "content": "", "tool_calls": [_call("warm")]},
        {"role": "tool", "tool_call_id": "warm", "content": "done"},
    ]
    grown = [*history, *turn]
    made = shape(grown)
    assert made._resume is not None  # derived from the scan of `history`
    assert pair_tool_calls(grown).call_of[len(history) + 1] == (len(history), 0)
    assert {k: v for k, v in pair_tool_calls(grown).call_of.items() if k < len(history)} == first.call_of
    # A stage that shortens one output keeps the structure: pairing and pins are shared.
    shortened = list(grown)
    shortened[5] = {**grown[5], "content": "short"}
    assert shape(shortened)._same_as is made
    assert pinned_indices(shortened) == pinned_indices(grown)
    assert _view(shortened) == _fresh(shortened)


def test_facts_notice_a_new_content_object() -> None:
    msg: Msg = {"role": "user", "content": "hello"}
    assert facts_of(msg).real_user and facts_of(msg).longest == 5
    msg["content"] = mark_injected({"role": "user", "content": "x"}, "summary")["content"]
    assert facts_of(msg).injected and not facts_of(msg).real_user
    structure.forget()
    assert facts_of(msg).injected
