"""The Python API given the wrong types by a buggy caller: every refusal is a ``CtxrulesError``
naming what is wrong, never an AttributeError or TypeError from deep inside, and a refused call
leaves the session as it was."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ctxrules import Engine
from ctxrules.errors import MessagesError, UsageError
from ctxrules.stores.base import StoreUsageError

HISTORY: list[dict[str, Any]] = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.load("builtin:default")


@pytest.mark.parametrize("model", [None, 5, "", "gpt\x00"])
def test_a_model_that_is_not_a_name_is_a_usage_error(engine: Engine, tmp_path: Path, model: Any) -> None:
    """``None`` reached the pack's ``models:`` matching first: AttributeError ``rsplit``."""
    with pytest.raises(UsageError, match="model name"):
        engine.session(tmp_path / "s", model=model)
    session = engine.session(tmp_path / "s", model="gpt-4o", window=64_000)
    with pytest.raises(UsageError, match="model name"):
        session.switch(model=model or 5)  # a kept window override matched the name first too


def test_a_refused_switch_leaves_the_session_as_it_was(engine: Engine, tmp_path: Path) -> None:
    """A window too small for the output reserve was refused after the model and the override
    were set: the session kept the old budget under the new model facts, and every later
    ``switch(model=...)`` kept the bad override and failed again."""
    session = engine.session(tmp_path / "s", model="gpt-4o")
    with pytest.raises(UsageError, match="no usable window of 1 tokens"):
        session.switch(window=1)
    assert (session.model.window, session.window_override, session.budget.window) == (128_000, None, 128_000)
    session.switch(model="claude-sonnet-4-5")
    assert (session.model.name, session.window_override, session.budget.window) == ("claude-sonnet-4-5", None, 200_000)
    with pytest.raises(UsageError):
        session.switch(model="gpt-4o", window=1)
    assert (session.model.name, session.budget.window) == ("claude-sonnet-4-5", 200_000)


@pytest.mark.parametrize(
    ("path", "message"),
    [
        (5, "the session path must be a string or a path, not int"),
        (b"/tmp/s", "the session path must be a string or a path, not bytes"),
        ("a\x00b", "the session path must not contain NUL bytes"),
        ("", "the session path must not be empty"),
    ],
)
def test_a_session_path_that_is_no_path_is_a_usage_error(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: Any, message: str
) -> None:
    """An empty path was the current directory, which became a session directory."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match=message):
        engine.session(path, model="gpt-4o").prepare(HISTORY)
    assert list(tmp_path.iterdir()) == []


def test_a_store_or_state_root_of_the_wrong_type_is_a_usage_error(engine: Engine, tmp_path: Path) -> None:
    with pytest.raises(StoreUsageError, match=r"\[CR145\] store= takes a Store, a store URL or a directory, not int"):
        engine.session("s", store=5, model="gpt-4o")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="state_root must be a string or a path, not int"):
        engine.session(tmp_path / "s", state_root=5, model="gpt-4o")  # type: ignore[arg-type]


@pytest.mark.parametrize("clock", ["now", float("nan"), float("inf"), True])
def test_a_clock_that_is_not_a_finite_number_is_a_usage_error(engine: Engine, tmp_path: Path, clock: Any) -> None:
    """A string failed deep in the turn (TypeError); a NaN went into state.json, as no JSON."""
    session = engine.session(tmp_path / "s", model="gpt-4o")
    with pytest.raises(UsageError, match="clock must be a finite number"):
        session.prepare(HISTORY, clock=clock)
    with pytest.raises(UsageError, match="clock must be a finite number"):
        session.prepare({"messages": HISTORY, "system": "x"}, clock=clock, format="anthropic")
    assert not (tmp_path / "s" / "state.json").exists()
    session.prepare(HISTORY, clock=1_700_000_000)
    assert json.loads((tmp_path / "s" / "state.json").read_text())["last_clock"] == 1_700_000_000


@pytest.mark.parametrize(
    ("state", "kind", "message"),
    [
        (None, UsageError, "takes the loop's state as a dict, not NoneType"),
        ({"messages": 5}, MessagesError, r"state\['messages'\] must be a list of messages, not int"),
        ({"messages": "abc"}, MessagesError, r"state\['messages'\] must be a list of messages, not str"),
        ({"messages": [HISTORY[0], 5]}, MessagesError, r"state\['messages'\]\[1\]: expected a message object"),
    ],
)
def test_should_continue_on_a_state_of_the_wrong_shape(
    engine: Engine, tmp_path: Path, state: Any, kind: type[Exception], message: str
) -> None:
    session = engine.session(tmp_path / "s", model="gpt-4o")
    with pytest.raises(kind, match=message):
        session.should_continue(state)
    assert session.should_continue({"messages": HISTORY}).proceed


def test_an_unknown_recall_tool_format_is_a_usage_error(engine: Engine, tmp_path: Path) -> None:
    session = engine.session(tmp_path / "s", model="gpt-4o")
    with pytest.raises(UsageError, match="unknown tool format 'xml'"):
        session.recall_tool(format="xml")


@pytest.mark.parametrize("blocks", [5, "think", {"type": "thinking"}])
def test_thinking_blocks_that_are_not_a_list_are_refused_naming_the_message(
    engine: Engine, tmp_path: Path, blocks: Any
) -> None:
    """Every stage that reads thinking walks ``thinking_blocks`` as a list: a number failed five
    stages with a TypeError (and ``format="anthropic"`` with a traceback), a string or an object
    went by character or by key."""
    session = engine.session(tmp_path / "s", model="gpt-4o")
    history = [*HISTORY, {"role": "assistant", "content": "hi", "thinking_blocks": blocks}]
    with pytest.raises(MessagesError, match=r"message 1 \(assistant\): 'thinking_blocks' must be a list"):
        session.prepare(history)
