"""A caller that keeps what ``prepare`` returned as its history still gets warm turns.

The documented loop passes the caller's own full history on every call. A simpler loop keeps
``result.messages`` (or, in the Anthropic format, ``result.body``) and appends the model's reply
and the tool results to it. On a model with prompt-cache breakpoints those move on every call,
so that history never extends the last one the session saw: every turn used to run cold. The
session now also recognizes a history that extends its last *output*, and runs the pipeline on
that output and the new messages, which is what a cold run over the same history starts from.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from session_kit import keyed_state_root
from test_cache_markers import LONG, TOOLS, conversation

from ctxrules import Engine

MODEL = "claude-sonnet-4-5"
CLOCK = 1_750_000_000.0


def _step(i: int) -> list[dict[str, Any]]:
    return [
        {
            "role": "assistant",
            "content": f"Reading part {i}.",
            "tool_calls": [
                {
                    "id": f"late{i}",
                    "type": "function",
                    "function": {"name": "Read", "arguments": json.dumps({"file_path": f"src/part{i}.py"})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": f"late{i}", "content": f"def part_{i}():\n    return {i}\n" + LONG[:400]},
    ]


def _state_root(tmp_path: Path) -> Path:
    return keyed_state_root(tmp_path, "test_warm_adopted")


def _open(root: Path, folder: str, window: int) -> Any:
    # One session id for all (it is the prompt-cache key the output carries).
    return Engine.load("builtin:default").session(
        root / folder, model=MODEL, window=window, state_root=root, session_id="s"
    )


@pytest.mark.parametrize("window", [400_000, 12_000])
def test_keeping_the_output_sends_what_passing_the_own_history_sends(tmp_path: Path, window: int) -> None:
    # The documented loop (its own history, extended) is the reference: a warm turn runs on
    # the last output and the new messages there too, so both loops send the same requests.
    root = _state_root(tmp_path)
    own_session, kept_session = _open(root, "own", window), _open(root, "kept", window)
    own = conversation(12)
    reference = own_session.prepare(own, TOOLS, clock=CLOCK)
    kept = kept_session.prepare(copy.deepcopy(own), TOOLS, clock=CLOCK).messages
    compacted = False
    for i in range(4):
        step = _step(i)
        own = [*own, *step]
        kept = [*kept, *copy.deepcopy(step)]
        reference = own_session.prepare(own, TOOLS, clock=CLOCK + i + 1)
        result = kept_session.prepare(kept, TOOLS, clock=CLOCK + i + 1)
        assert result.report["reused_messages"] == len(kept) - 2, "the kept output was not reused"
        assert (result.messages, result.body) == (reference.messages, reference.body), f"turn {i + 1}"
        compacted = compacted or result.report["after"]["tokens"] < result.report["before"]["tokens"]
        kept = result.messages
    if window < 100_000:
        assert compacted, "the small window did not compact: the case tests less than it says"


def test_the_anthropic_body_kept_and_extended_is_reused(tmp_path: Path) -> None:
    from ctxrules.formats import anthropic

    engine = Engine.load("builtin:default")
    session = engine.session(tmp_path / "s", model=MODEL, window=400_000)
    body = anthropic.encode(conversation(12), TOOLS, {"model": MODEL, "max_tokens": 1024})
    body = session.prepare(body, format="anthropic", clock=CLOCK).body
    for i in range(3):
        # The model's reply and the tool's result, as the client appends them.
        reply = [
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": f"Reading part {i}."},
                    {"type": "tool_use", "id": f"late{i}", "name": "Read", "input": {"file_path": f"src/p{i}.py"}},
                ],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"late{i}", "content": f"part {i}"}]},
        ]
        body = {**body, "messages": [*body["messages"], *reply]}
        result = session.prepare(body, format="anthropic", clock=CLOCK + i + 1)
        assert result.report["reused_messages"] == len(result.messages) - 2, f"turn {i + 1}"
        body = result.body


def test_an_edit_of_the_kept_output_is_not_reused(tmp_path: Path) -> None:
    engine = Engine.load("builtin:default")
    session = engine.session(tmp_path / "s", model=MODEL, window=400_000)
    kept = session.prepare(conversation(12), TOOLS, clock=CLOCK).messages
    kept[3]["content"] = "EDITED IN PLACE"
    result = session.prepare([*kept, *_step(0)], TOOLS, clock=CLOCK + 1)
    assert result.report["reused_messages"] == 0
    assert any(m.get("content") == "EDITED IN PLACE" for m in result.messages)


def test_an_edit_of_an_output_object_is_not_reused_when_equal_copies_come_back(tmp_path: Path) -> None:
    # A proxy-like caller sends the kept output back as new objects (JSON decoded) while it
    # edits, in place, one of its own objects that the session's output still holds.
    engine = Engine.load("builtin:default")
    session = engine.session(tmp_path / "s", model=MODEL, window=400_000)
    mine = conversation(12)
    kept = session.prepare(mine, TOOLS, clock=CLOCK).messages
    sent = json.loads(json.dumps(kept))
    mine[4]["content"] = "EDITED AFTER THE CALL"
    result = session.prepare([*sent, *_step(0)], TOOLS, clock=CLOCK + 1)
    assert not any(m.get("content") == "EDITED AFTER THE CALL" for m in result.messages)
    assert result.report["reused_messages"] == 0


def test_a_turn_that_fails_after_adopting_leaves_no_count_of_the_output_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Adopting the last output takes its token counts; when the turn then fails, the next
    # turn (a history extending the last *history*) must count that history, not the output.
    import ctxrules.engine as engine_module

    root = _state_root(tmp_path)
    session = _open(root, "s", 12_000)  # compacts: the output counts fewer tokens
    own = conversation(12)
    kept = session.prepare(own, TOOLS, clock=CLOCK).messages
    assert len(kept) < len(own)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a stage failed")

    with monkeypatch.context() as patch:
        patch.setattr(engine_module, "run_pipeline", broken)
        with pytest.raises(RuntimeError):
            session.prepare([*kept, *_step(0)], TOOLS, clock=CLOCK + 1)
    grown = [*own, *_step(0)]
    got = session.prepare(grown, TOOLS, clock=CLOCK + 2)
    # The reference: the same two turns without the failure in between.
    reference = _open(root, "reference", 12_000)
    reference.prepare(copy.deepcopy(own), TOOLS, clock=CLOCK)
    want = reference.prepare(copy.deepcopy(grown), TOOLS, clock=CLOCK + 2)
    assert got.report["before"] == want.report["before"]
    assert got.report["reused_messages"] == want.report["reused_messages"] > 0
    assert got.messages == want.messages


def test_a_failed_call_does_not_cost_the_kept_output_its_reuse(tmp_path: Path) -> None:
    # Any exception used to clear the session's memory of its last output: a caller that keeps
    # the output as its history (only recognized in memory) then ran its next turn cold.
    from ctxrules.errors import MessagesError

    root = _state_root(tmp_path)
    session = _open(root, "s", 400_000)
    kept = session.prepare(conversation(12), TOOLS, clock=CLOCK).messages
    with pytest.raises(MessagesError):
        session.prepare([*kept, {"role": "user", "content": 5}], TOOLS, clock=CLOCK + 1)
    result = session.prepare([*kept, *_step(0)], TOOLS, clock=CLOCK + 2)
    assert result.report["reused_messages"] == len(kept)
