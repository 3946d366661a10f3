"""Every real transcript runs through builtin:default at 32K, 64K and 128K windows without
error, with valid pairing, every marker resolving and nothing lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_kit import run_default
from conftest import REPO, transcript_path, transcript_paths
from invariants import added_fields, id_problems, lost_contents, markers_resolve, pairing_problems

from ctxrules import Engine

WINDOWS = [32_000, 64_000, 128_000]


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.load("builtin:default")


@pytest.mark.corpus
@pytest.mark.parametrize("path", transcript_paths(), ids=lambda p: p.stem)
def test_transcript_runs_at_every_window(engine: Engine, path: Path, tmp_path: Path) -> None:
    history = json.loads(path.read_text())
    for window in WINDOWS:
        session = engine.session(tmp_path / f"s{window}", model="gpt-4o", window=window)
        result = session.prepare(history)
        assert pairing_problems(result.messages) == [], (path.name, window)
        assert id_problems(result.messages) == [], (path.name, window)
        assert added_fields(history, result.messages) == [], (path.name, window)
        assert markers_resolve(result.messages, session.vault) == []
        assert lost_contents(history, result.messages, session.vault) == []
        assert not any(s.get("error") for s in result.report["stages"]), result.report["stages"]


@pytest.mark.corpus
def test_cli_run_and_vault_get_round_trip(tmp_path: Path) -> None:
    """The real console entry point, as a user runs it, on the largest transcript."""
    src = transcript_path("claudecode-ae4a77f8.json")
    env = {**os.environ, "PYTHONPATH": str(REPO / "engine")}
    out, report = tmp_path / "out.json", tmp_path / "report.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ctxrules.cli.main",
            "run",
            "--pack",
            "builtin:default",
            "--model",
            "gpt-4o",
            "--window",
            "32000",
            "--input",
            str(src),
            "--output",
            str(out),
            "--report",
            str(report),
            "--session",
            str(tmp_path / "s"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    messages = json.loads(out.read_text())
    assert pairing_problems(messages) == []
    data = json.loads(report.read_text())
    for vid in data["vault_items"][:5]:
        got = subprocess.run(
            [sys.executable, "-m", "ctxrules.cli.main", "vault", "get", vid[:12], "--session", str(tmp_path / "s")],
            capture_output=True,
            env=env,
            timeout=60,
        )
        assert got.returncode == 0 and got.stdout, got.stderr


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["run", "--pack", "builtin:default", "--model", "gpt-4o", "--input", "missing.json"], 2, "no such file"),
        (["run", "--pack", "builtin:nope", "--model", "gpt-4o", "--input", "-"], 2, "no built-in pack named 'nope'"),
        (["run", "--pack", "builtin:default", "--model", "gpt-4oo", "--input", "BAD"], 2, "unknown model"),
        (
            ["run", "--pack", "builtin:default", "--model", "gpt-4o", "--window", "100", "--input", "BAD"],
            2,
            "leaves no usable window",
        ),
        (["vault", "get", "../../etc/passwd", "--session", "."], 2, "vault"),
        (["vault", "get", "abc", "--session", "."], 2, "12"),
    ],
)
def test_cli_errors_are_one_line_without_traceback(tmp_path: Path, argv: list[str], code: int, message: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('[{"role": "user", "content": "hi"}]')
    argv = [str(bad) if a == "BAD" else a for a in argv]
    env = {**os.environ, "PYTHONPATH": str(REPO / "engine"), "CTXRULES_STATE": str(tmp_path / "state")}
    proc = subprocess.run(
        [sys.executable, "-m", "ctxrules.cli.main", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
        input="[]",
    )
    assert proc.returncode == code, proc.stderr
    assert message.lower() in proc.stderr.lower()
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ("{not json", "invalid JSON"),
        ('{"messages": 3}', "messages"),
        ('[{"role": "user", "content": 5}]', "message 0"),
        ('[{"role": "robot", "content": "x"}]', "message 0"),
        ('{"messages": [{"role": "user", "content": [{"type": ["text"]}]}]}', "message 0 (user), content part 0"),
        ('[{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [{"id": 7}]}]', "message 1"),
        # JSON leaves open which of two equal keys counts: Python's reader keeps the last, so
        # these ran on no messages, or sent "bye" and dropped "hello" without a word.
        ('{"messages": [{"role": "user", "content": "x"}], "messages": []}', '/: the key "messages" appears twice'),
        ('[{"role": "user", "content": "hello", "content": "bye"}]', '/0: the key "content" appears twice'),
        (
            '[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b", "text": ""}]}]',
            '/0/content/1: the key "text" appears twice',
        ),
        # Past the duplicate the file nests too deep for the parser that looks for it.
        pytest.param(
            '[{"a": 1, "a": 2}, ' + "[" * 5_000 + "]" * 5_000 + "]",
            "a key appears twice in one object",
            id="duplicate-then-too-deep",  # not the payload: the test's id travels in the environment
        ),
    ],
)
def test_malformed_message_files_exit_2_with_a_clear_message(tmp_path: Path, payload: str, message: str) -> None:
    bad = tmp_path / "in.json"
    bad.write_text(payload)
    proc = run_default(bad, "--session", str(tmp_path / "s"), timeout=120)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
    # Named like every other fault of the file, found before a session is opened (or made).
    assert f"error: {bad}:" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert not (tmp_path / "s").exists()
