"""A marker whose vault item is missing heals: re-derived from the history when the original is
still there, else replaced with a lost marker; ``vault get`` says "missing" (exit 2)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ctxrules import Engine
from ctxrules.dangling import LOST_PREFIX, marker_ids

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "engine")}
BIG = "\n".join(f"line {i}: compiling module_{i % 97}.c with the usual flags" for i in range(20_000))
HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "Build it."},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "make"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": BIG},
    {"role": "assistant", "content": "Built."},
]
GROWN = [*HISTORY, {"role": "user", "content": "Thanks."}]


def cli(tmp_path: Path, *argv: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "ctxrules.cli.main", *argv],
        cwd=tmp_path,
        env=ENV,
        input=stdin,
        capture_output=True,
        timeout=300,
    )


def run(tmp_path: Path, messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    proc = cli(
        tmp_path,
        "run",
        "--pack",
        "builtin:default",
        "--model",
        "gpt-4o",
        "--state",
        "state",
        "--report",
        "report.json",
        stdin=json.dumps(messages).encode(),
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), json.loads((tmp_path / "report.json").read_text())


def vault_get(tmp_path: Path, vault_id: str) -> subprocess.CompletedProcess[bytes]:
    return cli(tmp_path, "vault", "get", vault_id, "--state", "state")


def test_a_deleted_vault_is_re_derived_from_the_history_by_the_next_run(tmp_path: Path) -> None:
    first, _ = run(tmp_path, HISTORY)
    ids = marker_ids(first)
    assert ids, "the big output should have been elided"
    shutil.rmtree(tmp_path / "state" / "default" / "vault")
    for vault_id in ids:
        gone = vault_get(tmp_path, vault_id)
        assert gone.returncode == 2 and b"missing" in gone.stderr and b"Traceback" not in gone.stderr
    out, report = run(tmp_path, GROWN)
    assert report["reused_messages"] == 0  # the output with the dangling marker was not reused
    for vault_id in marker_ids(out):
        back = vault_get(tmp_path, vault_id)
        assert back.returncode == 0 and back.stdout == BIG.encode()
    assert LOST_PREFIX not in json.dumps(out)


@pytest.mark.parametrize("planted", ["symlink", "fifo", "directory"])
def test_a_vault_item_replaced_by_something_else_is_written_again(tmp_path: Path, planted: str) -> None:
    """A link, a FIFO or a directory where a vault item was: the last output is not reused
    (its markers would not resolve) and nothing is read or written through what was planted.
    A link or a FIFO is replaced by the item at once; a directory that holds files, which a
    rename cannot replace, is named in the run's warnings, and once removed the next run writes the item."""
    first, _ = run(tmp_path, HISTORY)
    ids = marker_ids(first)
    assert ids, "the big output should have been elided"
    outside = tmp_path / "outside.txt"
    outside.write_text("not the session's\n")
    items = [tmp_path / "state" / "default" / "vault" / vault_id[:2] / vault_id for vault_id in ids]
    for item in items:
        item.unlink()
        if planted == "symlink":
            item.symlink_to(outside)
        elif planted == "fifo":
            os.mkfifo(item)
        else:
            item.mkdir()  # holding a file: an empty one is replaced (test_hostile_sessions)
            (item / "kept").write_text("x")
    out, report = run(tmp_path, GROWN)
    assert report["reused_messages"] == 0
    assert "not the session's" not in json.dumps(out) and outside.read_text() == "not the session's\n"
    if planted == "directory":
        assert any(items[0].name in w for w in report["warnings"]), report["warnings"]
        for item in items:
            (item / "kept").unlink()
            item.rmdir()
        out, report = run(tmp_path, GROWN)
    assert marker_ids(out) and LOST_PREFIX not in json.dumps(out)
    backs = [vault_get(tmp_path, vault_id) for vault_id in marker_ids(out)]
    assert all(back.returncode == 0 for back in backs), [back.stderr for back in backs]
    # The output is back whole (as the item, or inside the step a failed stage stored whole).
    assert any(back.stdout in (BIG.encode(), json.dumps(HISTORY[1:3]).encode()) for back in backs)


def test_the_same_session_object_notices_a_deleted_vault(tmp_path: Path) -> None:
    session = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o")
    first = session.prepare(HISTORY)
    (ids,) = [marker_ids(first.messages)]
    shutil.rmtree(tmp_path / "s" / "vault")
    second = session.prepare(GROWN)
    assert second.report["reused_messages"] == 0
    assert marker_ids(second.messages) == ids
    assert all(session.vault.get(i) == BIG.encode() for i in ids)
    third = session.prepare([*GROWN, {"role": "assistant", "content": "You are welcome."}])
    assert third.report["reused_messages"] == len(GROWN)  # healed: reused again


def test_a_marker_from_the_history_whose_item_is_gone_becomes_a_lost_marker(tmp_path: Path) -> None:
    gone = "ab" * 32
    marker = f"[ctxrules:elided kind=lines count=40 ref=vault://{gone}]"
    history = [
        {"role": "user", "content": "What did the test print?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "pytest"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": f"FAILED test_x\n{marker}\n1 failed"},
    ]
    out, report = run(tmp_path, history)
    text = json.dumps(out)
    assert gone not in marker_ids(out) and "[ctxrules:elided" not in text
    assert f"{LOST_PREFIX} kind=lines count=40 was=vault://{gone} reason=vault-item-missing]" in text
    assert any("marked as lost" in w for w in report["warnings"])
    again, _ = run(tmp_path, history)  # deterministic: the same bytes on a rerun
    assert again == out
    missing = vault_get(tmp_path, gone)
    assert missing.returncode == 2 and b"missing" in missing.stderr


def test_a_marker_in_signed_thinking_is_left_as_the_provider_signed_it(tmp_path: Path) -> None:
    # A model that quotes a marker in its reasoning (an id copied with a wrong digit): its signed
    # thinking must reach Anthropic byte for byte, or the tool-use turn is rejected (HTTP 400).
    gone = "cd" * 32
    marker = f"[ctxrules:elided kind=lines count=12 ref=vault://{gone}#L1-L12]"
    thinking = {"type": "thinking", "thinking": f"The log was elided: {marker}. Recall it.", "signature": "EqQBsig=="}
    body = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 1000,
        "messages": [
            {"role": "user", "content": "Look at the log."},
            {
                "role": "assistant",
                "content": [thinking, {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": marker}]},
        ],
    }
    session = Engine.load("builtin:default").session(tmp_path / "s", model="claude-sonnet-4-5")
    first = session.prepare(body, format="anthropic")
    sent = first.body["messages"]
    assert sent[1]["content"][0] == thinking
    assert LOST_PREFIX in json.dumps(sent[2])  # the tool's text is healed as before
    # The model's words are no marker of the session: the next turn reuses the output.
    grown = {**body, "messages": [*body["messages"], {"role": "assistant", "content": "Done."}]}
    assert session.prepare(grown, format="anthropic").report["reused_messages"] == len(body["messages"])


def test_a_marker_like_text_with_a_number_of_thousands_of_digits_is_text(tmp_path: Path) -> None:
    # Anyone can write a marker: a count or a line number that int() refuses (over 4,300 digits)
    # stopped the turn with an internal error; it is no marker, and the text goes through.
    huge = "9" * 5000
    text = f"[ctxrules:elided kind=lines count={huge} ref=vault://{'ab' * 32}#L1-L{huge}]"
    history = [{"role": "user", "content": f"What is this? {text}"}]
    out, _ = run(tmp_path, history)
    assert out == history
    got = vault_get(tmp_path, f"vault://{'ab' * 32}#L1-L{huge}")
    assert got.returncode == 2 and b"invalid vault pointer" in got.stderr and b"internal error" not in got.stderr
    lines = cli(tmp_path, "vault", "get", "ab" * 32, "--lines", f"1:{huge}", "--state", "state")
    assert lines.returncode == 2 and b"--lines takes A:B" in lines.stderr
