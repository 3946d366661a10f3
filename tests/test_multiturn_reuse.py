"""Many turns of one session: a history edited in place between calls, then the session picked
up by another process, must never be answered with the output of the history before the edit."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from ctxrules import Engine


def _history() -> list[dict[str, Any]]:
    call = {"id": "c1", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "OLD"}'}}
    return [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "Fix the bug."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        {"role": "assistant", "content": "Done: OLD"},
    ]


def _edit_arguments(history: list[dict[str, Any]]) -> None:
    history[2]["tool_calls"][0]["function"]["arguments"] = '{"command": "NEW"}'


def _edit_content(history: list[dict[str, Any]]) -> None:
    history[4]["content"] = "Done: NEW"


@pytest.mark.parametrize("edit", [_edit_arguments, _edit_content])
def test_an_edit_in_place_is_what_the_next_process_reuses(tmp_path: Path, edit: Any) -> None:
    # The output shares unchanged messages with the caller; the store appended to
    # last_output.jsonl when the new output held the same objects as the one it wrote, so an
    # object edited in place kept its old line, and the next process reused the stale output.
    engine = Engine.load("builtin:default")
    session = engine.session(tmp_path / "s", model="gpt-4o", window=16000)
    history = _history()
    session.prepare(history)
    edit(history)
    expected = copy.deepcopy(history)
    assert session.prepare(history).messages == expected
    again = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o", window=16000)
    result = again.prepare(history)
    assert result.messages == expected
    assert result.report["reused_messages"] == len(history)
