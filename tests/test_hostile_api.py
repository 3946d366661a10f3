"""The Python API given the wrong types by a buggy caller: every refusal is a ``CtxrulesError``
naming what is wrong, never an AttributeError or TypeError from deep inside, and a refused call
leaves the session as it was."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ctxrules import Engine
from ctxrules.errors import UsageError

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
