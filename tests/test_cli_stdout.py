"""Every verb that prints handles a standard output that cannot take it one way
(docs/reference/cli.md): closed (``>&-``) or a failed write (``>/dev/full``, a descriptor open
only for reading) is one line on stderr and exit 2, never an internal error; a reader that went
away (``| head -c1``) is exit 0 with nothing on stderr. Each case is a real process, started
with the descriptor as a shell would leave it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_kit import ENGINE

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A state root with one session (a turn, a vault item, a recorded call), a run report, a
    message file, a session archive and a transcript: what the verbs below read."""
    from ctxrules.stores.filesystem import FilesystemStore
    from ctxrules.vault import Vault

    tmp = tmp_path_factory.mktemp("stdout")
    state, session = tmp / "st", tmp / "st" / "s1"
    chat = tmp / "in.json"
    chat.write_text(json.dumps([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]))
    report = tmp / "report.json"
    for argv in (
        ["run", "--pack", "builtin:default", "--model", "gpt-4o", "--input", str(chat), "--output", str(tmp / "o.json"),
         "--report", str(report), "--session", str(session), "--state", str(state)],
        ["usage", "add", "--session", str(session), "--model", "gpt-4o", "--prompt", "10"],
        ["sessions", "export", str(session), "--to", str(tmp / "s1.ctxs"), "--state", str(state)],
    ):  # fmt: skip
        proc = _ctxrules(argv, None)
        assert proc.returncode == 0, proc.stderr
    vault_id = Vault.of(FilesystemStore(state), str(session)).put_text("a stored tool output\n")
    return {
        "tmp": str(tmp), "state": str(state), "session": str(session), "chat": str(chat),
        "report": str(report), "vault_id": vault_id,
    }  # fmt: skip


# Verb family -> its argv (``{name}`` fields come from the world fixture).
VERBS: dict[str, list[str]] = {
    "validate": ["validate", str(REPO / "rules" / "default.yaml")],
    "explain": ["explain", "builtin:default"],
    "schema": ["schema"],
    "plugins": ["plugins", "--all"],
    "assemble": ["assemble", "--pack", "builtin:default", "--matrix"],
    "test": ["test", "builtin:default"],
    "run": ["run", "--pack", "builtin:default", "--model", "gpt-4o", "--input", "{chat}", "--state", "{state}",
            "--session", "{tmp}/s-run"],
    "run-explain": ["run", "--pack", "builtin:default", "--model", "gpt-4o", "--input", "{chat}", "--state",
                    "{state}", "--session", "{tmp}/s-run", "--output", "{tmp}/o2.json", "--explain"],
    "report": ["report", "{report}"],
    "usage-show": ["usage", "show", "--session", "{session}"],
    "usage-report": ["usage", "report", "--state", "{state}"],
    "sessions-scan": ["sessions", "scan", "--state", "{state}"],
    "sessions-export": ["sessions", "export", "{session}", "--to", "-", "--state", "{state}"],
    "sessions-import": ["sessions", "import", "{tmp}/s1.ctxs", "--session", "{fresh}", "--state", "{state}"],
    "vault": ["vault", "get", "{vault_id}", "--session", "{session}"],
    "eval": ["eval", "--baseline", "trim", "--model", "gpt-4o", "--quiet", "{chat}"],
}  # fmt: skip


def _ctxrules(argv: list[str], stdout: Callable[[], None] | None) -> subprocess.CompletedProcess[str]:
    """``ctxrules ARGV`` with ``stdout`` run in the child before it starts (to close or replace
    its descriptor 1); its stdout is not captured."""
    return subprocess.run(
        [sys.executable, "-m", "ctxrules.cli.main", *argv],
        env={**os.environ, "PYTHONPATH": ENGINE},
        stdin=subprocess.DEVNULL,
        stdout=None if stdout is None else subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
        preexec_fn=stdout,
    )


def _closed() -> None:  # `>&-`
    os.close(1)


def _full() -> None:  # `>/dev/full`: every write fails with ENOSPC
    fd = os.open("/dev/full", os.O_WRONLY)
    os.dup2(fd, 1)
    os.close(fd)


def _read_only() -> None:  # `1</dev/null`: a write is EBADF
    fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(fd, 1)
    os.close(fd)


def _argv(verb: str, world: dict[str, str]) -> list[str]:
    fresh = str(Path(world["tmp"]) / f"new-{uuid.uuid4().hex}")  # a session not there yet
    return [a.format(fresh=fresh, **world) for a in VERBS[verb]]


def _one_error_line(proc: subprocess.CompletedProcess[str], words: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("ctxrules:")]
    assert lines and lines[-1].startswith("ctxrules: error: ") and words in lines[-1], proc.stderr


needs_dev_full = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")


@pytest.mark.parametrize("verb", list(VERBS))
def test_a_closed_standard_output_is_exit_2_in_one_line(world: dict[str, str], verb: str) -> None:
    _one_error_line(_ctxrules(_argv(verb, world), _closed), "standard output is closed")


@needs_dev_full
@pytest.mark.parametrize("verb", list(VERBS))
def test_a_standard_output_that_refuses_the_write_is_exit_2_in_one_line(world: dict[str, str], verb: str) -> None:
    _one_error_line(_ctxrules(_argv(verb, world), _full), "cannot write to standard output: No space left on device")


@needs_dev_full
@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["run", "--help"], ["sessions", "export", "--help"]])
def test_help_and_version_that_cannot_be_printed_are_exit_2(argv: list[str]) -> None:
    """argparse drops a failed write of ``--help`` or ``--version`` and exits 0: a CI step or a
    script saw success with nothing printed."""
    _one_error_line(_ctxrules(argv, _full), "cannot write to standard output: No space left on device")
    _one_error_line(_ctxrules(argv, _closed), "standard output is closed")
    assert _ctxrules(argv, None).returncode == 0


@pytest.mark.parametrize("verb", ["validate", "schema", "vault", "sessions-export"])
def test_standard_output_open_only_for_reading_is_closed_for_writing(world: dict[str, str], verb: str) -> None:
    _one_error_line(_ctxrules(_argv(verb, world), _read_only), "standard output is closed")


@pytest.mark.parametrize("verb", ["validate", "schema", "explain", "sessions-export", "help"])
def test_a_reader_that_went_away_is_exit_0_and_silent(world: dict[str, str], verb: str) -> None:
    """``ctxrules schema | head -c1``: the reader has what it wanted."""
    import shlex

    argv = [sys.executable, "-m", "ctxrules.cli.main", *(["run", "--help"] if verb == "help" else _argv(verb, world))]
    proc = subprocess.run(  # PIPESTATUS: ctxrules' own exit code, not head's
        f"{shlex.join(argv)} | head -c1; exit ${{PIPESTATUS[0]}}",
        shell=True,
        env={**os.environ, "PYTHONPATH": ENGINE},
        capture_output=True,
        text=True,
        timeout=300,
        executable="/bin/bash",
    )
    assert proc.returncode == 0 and len(proc.stdout) == 1, proc.stderr
    assert "error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_usage_add_with_a_closed_standard_output_records_nothing(world: dict[str, str], tmp_path: Path) -> None:
    """Exit 2 must mean "not recorded": the retry after it then counts the call once. (So for
    `sessions import`: a retry would find the session there already.)"""
    state = tmp_path / "st"
    add = ["usage", "add", "--state", str(state), "--model", "gpt-4o", "--prompt", "10"]
    for redirect in (_closed, _read_only):
        _one_error_line(_ctxrules(add, redirect), "standard output is closed")
        assert not state.exists()
    assert _ctxrules(add, None).returncode == 0
    assert len((state / "default" / "ledger.jsonl").read_text().splitlines()) == 1
    target = Path(world["tmp"]) / "s-not-imported"
    archive = str(Path(world["tmp"]) / "s1.ctxs")
    imported = ["sessions", "import", archive, "--session", str(target), "--state", world["state"]]
    _one_error_line(_ctxrules(imported, _closed), "standard output is closed")
    assert not target.exists()
    assert _ctxrules(imported, None).returncode == 0 and target.is_dir()


def test_mcp_with_a_closed_standard_output_does_not_serve(world: dict[str, str]) -> None:
    _one_error_line(_ctxrules(["mcp", "--session", world["session"]], _closed), "standard output is closed")


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["run", "--bogus"], 2),  # argparse's usage message
        (["compress", "--max-output", "0", "--", "echo", "hi"], 125),  # compress -- CMD: its own usage error
        (["validate", "/nonexistent/pack.yaml"], 2),  # a handled error's message
        (["validate", "{pack}"], 0),  # no message at all
    ],
)
def test_a_stderr_nobody_reads_any_more_keeps_the_exit_code(tmp_path: Path, argv: list[str], code: int) -> None:
    """Standard error a pipe whose reader is gone (`2>&1 | head -1`, a harness that went away):
    argparse's usage message raised BrokenPipeError, taken for standard output's reader leaving
    (exit 0 instead of 2), and every other message raised again while it was reported (exit 1).
    The messages now go nowhere and the codes stay."""
    pack = tmp_path / "p.yaml"
    pack.write_text("apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: p, version: 1.0.0}\n")
    read, write = os.pipe()
    os.close(read)  # nobody will read what is written to `write`
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "ctxrules.cli.main", *(a.format(pack=pack) for a in argv)],
            env={**os.environ, "PYTHONPATH": ENGINE},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=write,
            timeout=120,
        )
    finally:
        os.close(write)
    assert proc.returncode == code, argv
