"""`session.switch(model=...)` keeps an explicit window override (capped at the new model's own
window, with a warning) unless `window=None` drops it."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctxrules import Engine
from ctxrules.errors import UsageError

HISTORY = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Fix the parser."}]


def session(tmp_path: Path, model: str, window: int | None = None):  # type: ignore[no-untyped-def]
    return Engine.load("builtin:default").session(tmp_path / "s", model=model, window=window)


def test_a_model_switch_keeps_the_window_override(tmp_path: Path) -> None:
    s = session(tmp_path, "gpt-4o")
    assert s.switch(window=32000) == []
    s.prepare(HISTORY)
    assert s.switch(model="claude-sonnet-4-5") == []
    report = s.prepare(HISTORY).report
    assert report["budget"]["window"] == 32000 and s.model.name == "claude-sonnet-4-5"
    assert "model" in report["fingerprint"]["changed"] and "window" not in report["fingerprint"]["changed"]


def test_window_none_drops_the_override(tmp_path: Path) -> None:
    s = session(tmp_path, "gpt-4o", window=32000)
    s.switch(model="claude-sonnet-4-5", window=None)
    assert s.budget.window == 200000 and s.window_override is None
    s.switch(window=50000)
    s.switch(window=None)  # without a model too
    assert s.budget.window == 200000


def test_a_kept_override_is_capped_at_the_new_models_window_with_a_warning(tmp_path: Path) -> None:
    s = session(tmp_path, "claude-sonnet-4-5", window=150000)
    notes = s.switch(model="gpt-4o")
    assert s.budget.window == 128000
    assert len(notes) == 1 and "150000 is above the model's own window 128000" in notes[0]
    assert notes[0] in s.prepare(HISTORY).report["warnings"]
    # An explicit window is what the caller asked for: not capped.
    assert s.switch(model="gpt-4o-mini", window=150000) == [] and s.budget.window == 150000


def test_a_bad_window_is_a_usage_error(tmp_path: Path) -> None:
    s = session(tmp_path, "gpt-4o")
    with pytest.raises(UsageError, match="window"):
        s.switch(window=0)
