"""`session.switch(model=...)` keeps an explicit window override (capped at the new model's own
window, with a warning) unless `window=None` drops it; a window given for a model above its own
window is taken, with a warning in the report."""

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
    # An explicit window is what the caller asked for: not capped, but the report warns.
    notes = s.switch(model="gpt-4o-mini", window=150000)
    assert s.budget.window == 150000
    assert len(notes) == 1 and "150000 is above gpt-4o-mini's own window 128000" in notes[0]
    assert notes[0] in s.prepare(HISTORY).report["warnings"]


def test_a_window_above_the_models_own_at_open_is_taken_with_a_warning(tmp_path: Path) -> None:
    s = session(tmp_path, "gpt-4o", window=1_000_000)
    report = s.prepare(HISTORY).report
    assert report["budget"]["window"] == 1_000_000
    assert [w for w in report["warnings"] if "1000000 is above gpt-4o's own window 128000" in w]
    assert not [w for w in s.prepare(HISTORY).report["warnings"] if "own window" in w]  # said once
    # At or under the model's window, and for a model the registry does not know: nothing to say.
    for model, window in (("gpt-4o", 128000), ("gpt-4o", 32000), ("acme/house-model", 1_000_000)):
        warnings = session(tmp_path / model.replace("/", "_"), model, window).prepare(HISTORY).report["warnings"]
        assert not [w for w in warnings if "own window" in w], (model, window)


def test_the_cli_reports_a_window_above_the_models_own(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    (tmp_path / "in.json").write_text(json.dumps(HISTORY))
    done = subprocess.run(
        [
            *(sys.executable, "-m", "ctxrules", "run", "--pack", "builtin:default", "--model", "gpt-4o"),
            *("--window", "1000000", "--input", "in.json", "--output", "out.json", "--report", "report.json"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert [w for w in report["warnings"] if "above gpt-4o's own window 128000" in w]


def test_a_bad_window_is_a_usage_error(tmp_path: Path) -> None:
    s = session(tmp_path, "gpt-4o")
    with pytest.raises(UsageError, match="window"):
        s.switch(window=0)
