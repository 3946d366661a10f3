"""A scripted 200-call replay of a real transcript through one session, with a model switch
halfway (gpt-4o, 128K → claude-sonnet-4-5, 200K): no restart, thresholds follow the new window,
and no invariant of docs/reference/concepts.md is broken at any call."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import transcript_path
from invariants import lost_contents, markers_resolve, pairing_problems, pinned_of, survives

from ctxrules import Engine

CALLS = 200
SWITCH_AT = 100


def call_points(history: list[dict[str, Any]]) -> list[int]:
    """Where an agent calls the model: right before each assistant message."""
    return [i for i, m in enumerate(history) if m.get("role") == "assistant" and i > 0]


@pytest.mark.corpus
@pytest.mark.parametrize("name", ["claudecode-ae4a77f8.json"])
def test_replay_with_a_model_switch_halfway(tmp_path: Path, name: str) -> None:
    history = json.loads(transcript_path(name).read_text())
    points = call_points(history)[:CALLS]
    assert len(points) == CALLS
    session = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o")
    engine_id = id(session.engine)
    windows = []
    for n, end in enumerate(points):
        if n == SWITCH_AT:
            session.switch(model="claude-sonnet-4-5")
        prefix = history[:end]
        frozen = copy.deepcopy(prefix)
        result = session.prepare(prefix)
        out, report = result.messages, result.report
        assert prefix == frozen, f"call {n}: the caller's messages were mutated"
        assert pairing_problems(out) == [], f"call {n}"
        for m in pinned_of(frozen):
            text = m.get("content") if isinstance(m.get("content"), str) else ""
            if len(text) <= 100_000:
                assert survives(m, out), f"call {n}: a pinned message was lost or changed"
        assert markers_resolve(out, session.vault) == [], f"call {n}"
        if n % 50 == 49:
            assert lost_contents(frozen, out, session.vault) == [], f"call {n}"
        assert report["after"]["fits"], f"call {n}: {report['after']}"
        windows.append((report["budget"]["window"], report["budget"]["thresholds"], report["fingerprint"]["changed"]))
    assert id(session.engine) == engine_id  # no restart: the same engine and session throughout
    before, after = windows[SWITCH_AT - 1], windows[SWITCH_AT]
    assert before[0] == 128_000 and after[0] == 200_000
    assert before[1] == after[1]  # same fractions: every threshold moves with the window
    assert "model" in after[2] and "window" in after[2]
    assert all(w[0] == 200_000 and "model" not in w[2] for w in windows[SWITCH_AT + 1 :])
