"""A new process continuing a session reuses the counts the session saved: the same history
again needs no tokenizer at all, and the counts it reports are the ones a cold count makes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import REPO

EXAMPLE = REPO / "rules" / "examples" / "agent-session.json"

_CHILD = """
import json, sys
from ctxrules import Engine
history = json.loads(open(sys.argv[1], encoding="utf-8").read())
if len(sys.argv) > 3:
    history = history + json.loads(sys.argv[3])
session = Engine.load("builtin:default").session(sys.argv[2], model="gpt-4o", window=32000)
result = session.prepare(history)
print(json.dumps({
    "messages": result.messages,
    "before": result.report["before"]["tokens"],
    "after": result.report["after"]["tokens"],
    "reused": result.report["reused_messages"],
    "tokenizer_loaded": "tiktoken" in sys.modules,
}))
"""


def _run(session: Path, *extra: str) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(EXAMPLE), str(session), *extra],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(REPO / "engine"), "PATH": "/usr/bin:/bin"},
    )
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def test_the_same_history_in_a_new_process_needs_no_tokenizer(tmp_path: Path) -> None:
    first = _run(tmp_path / "s")
    assert first["tokenizer_loaded"] is True and first["reused"] == 0
    again = _run(tmp_path / "s")
    assert again["reused"] == len(json.loads(EXAMPLE.read_text(encoding="utf-8")))
    assert again["tokenizer_loaded"] is False  # every count came from the session's saved counts
    assert again["messages"] == first["messages"]
    assert (again["before"], again["after"]) == (first["before"], first["after"])


def test_saved_counts_agree_with_a_cold_count(tmp_path: Path) -> None:
    # One appended message: the new process counts it (and only it) and reports the totals a
    # session that never saw the history reports.
    step = json.dumps([{"role": "user", "content": "Now also update the changelog, please."}])
    _run(tmp_path / "warm")
    warm = _run(tmp_path / "warm", step)
    cold = _run(tmp_path / "cold", step)
    assert warm["tokenizer_loaded"] is True and warm["reused"] > 0
    assert warm["before"] == cold["before"]
