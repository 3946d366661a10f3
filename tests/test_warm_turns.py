"""A warm turn in a long-lived session equals the same turn run from what the session saved.

A session that stays in memory takes shortcuts on a warm turn: its copy of the last history and
output, the counts it keeps, the locks and files it keeps open, and the memos its engine's stage
instances keep between calls (settled tool outputs, matched patterns, ...). None of them may
change what the model is sent. The reference is the same sequence of turns where every turn is
prepared by a *new* engine and a *new* session object over the session directory, as a new
process would: it reuses the last output through the chained digest and the files on disk, with
no memo of any earlier call. Real transcripts are replayed a few messages at a time (the agent
loop's shape: the model is called once every call of its last step is answered), at windows
where the session compacts and reuses the compaction and at one where it never compacts.

Not compared with a cold run of the same history: a warm turn keeps what earlier turns decided
(a result compressed before the ask named its file stays compressed, an unanswered call's
synthesized result stays when the real one arrives), so that the prefix the provider caches
stays byte-identical; a cold run decides everything afresh.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import load_transcript
from session_kit import keyed_state_root

from ctxrules import Engine

pytestmark = pytest.mark.corpus

MODEL = "gpt-4o"
CLOCK = 1_750_000_000.0
# (transcript, window, first prepared length): the longest session of the corpus compacting at
# 32K and never at 400K, a mid-sized Claude Code session and a small SWE-agent one.
CASES = [
    ("claudecode-ae4a77f8", 32_000, 330),
    ("claudecode-ae4a77f8", 400_000, 400),
    ("claudecode-258c7280", 64_000, 40),
    ("minisweagent-django__django-11815", 32_000, 10),
]
STEPS = (1, 2, 3, 2)  # messages appended per turn, in turn


def _boundary(history: list[dict[str, Any]], upto: int) -> int:
    """The first cut at or after ``upto`` where an agent loop calls the model: every tool call
    answered (the model wrote the last assistant message; its calls' results come next)."""
    while upto < len(history) and (
        history[upto].get("role") == "tool"
        or (history[upto - 1].get("role") == "assistant" and history[upto - 1].get("tool_calls"))
    ):
        upto += 1
    return min(upto, len(history))


def _state_root(tmp_path: Path) -> Path:
    return keyed_state_root(tmp_path, "test_warm_turns")


def _open(root: Path, folder: str, window: int) -> Any:
    # One session id for all (it is the prompt-cache key the output carries).
    return Engine.load("builtin:default").session(
        root / folder, model=MODEL, window=window, state_root=root, session_id="s"
    )


def _sent(result: Any) -> tuple[Any, Any, Any]:
    return result.messages, result.tools, result.request


@pytest.mark.parametrize(("name", "window", "start"), CASES, ids=lambda v: str(v))
def test_every_warm_turn_equals_the_turn_prepared_from_the_saved_session(
    tmp_path: Path, name: str, window: int, start: int
) -> None:
    history = load_transcript(name)
    root = _state_root(tmp_path)
    warm = _open(root, "warm", window)
    cuts = [_boundary(history, start)]
    while cuts[-1] < len(history):
        cuts.append(_boundary(history, cuts[-1] + STEPS[len(cuts) % len(STEPS)]))
    reused_turns = compacted_turns = 0
    for turn, upto in enumerate(cuts):
        given = history[:upto]
        clock = CLOCK + 30 * turn
        got = warm.prepare(given, clock=clock)
        # The reference: a new engine (new stage instances, no memo of any earlier call) and a
        # new session object over its own directory, continued from what it saved last turn.
        want = _open(root, "reference", window).prepare(given, clock=clock)
        assert _sent(got) == _sent(want), f"turn {turn} ({upto} messages) differs from the reference"
        assert got.report["reused_messages"] == want.report["reused_messages"]
        if turn:
            reused_turns += got.report["reused_messages"] > 0
        compacted_turns += got.report["after"]["tokens"] < got.report["before"]["tokens"]
    # The replay exercised what it is about: warm turns that reused the last output, and (at
    # the small windows) a compaction that the later turns carried.
    assert reused_turns >= len(cuts) - 2
    if window < 100_000:
        assert compacted_turns >= 1
