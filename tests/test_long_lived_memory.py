"""One process serving one session for thousands of turns (an agent loop, a proxy): what the
session and the stages remember per message or per text must let go of what no history can
reach any more, or memory grows with every turn. The caller's history is decoded from JSON on
each call, as a proxy does (new objects every turn); its messages are a dict subclass here so
that a weak reference tells whether anything still holds them."""

from __future__ import annotations

import gc
import json
import weakref
from pathlib import Path
from typing import Any

from ctxrules import Engine


class _Msg(dict[str, Any]):
    """A message that can be referenced weakly (a plain dict cannot)."""


def _decoded(text: str) -> list[dict[str, Any]]:
    return json.loads(text, object_hook=_Msg)  # type: ignore[no-any-return]


def _alive(refs: list[weakref.ref[_Msg]]) -> int:
    gc.collect()
    return sum(ref() is not None for ref in refs)


def test_repairs_of_messages_no_history_holds_are_not_kept_for_the_sessions_life(tmp_path: Path) -> None:
    """Each turn repairs the lone surrogate of the caller's new object again; the session kept
    that object, its repaired copy and a copy of the original for every turn until it ended
    (three copies of a large tool output per turn). Only the last turn's are kept now, and a
    caller that keeps its objects still has its repaired messages reused."""
    session = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o", window=200_000)
    text = json.dumps([{"role": "user", "content": "go"}, {"role": "assistant", "content": "bad \ud800 text"}])
    refs = []
    for turn in range(12):
        history = _decoded(text)
        refs.append(weakref.ref(history[1]))
        assert "lone surrogate" in session.prepare(history).report["warnings"][0]  # repaired again
        text = json.dumps([*history, {"role": "user", "content": f"turn {turn}"}])
    del history
    assert _alive(refs) <= 1
    # The same objects again and again: the repaired copy stands in for them, every turn reuses.
    history = _decoded(text)
    session.prepare(history)
    for turn in range(5):
        before = len(history)
        history.append({"role": "user", "content": f"kept {turn}"})
        assert session.prepare(history).report["reused_messages"] == before
