"""An output file the user names (`run --output/--report`, `sessions export --to`, `sessions
resume --output`, `usage report --html`) is never written over what ctxrules keeps for a
session: the session directory's files (state, signing key, vault items) and the state root's
signing key and ledgers. Each such output is exit 2 before anything is written, the file intact."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cli_kit import cli


@pytest.fixture
def world(tmp_path: Path) -> Path:
    """A state root ``st`` with a session ``st/s`` that ran one turn and recorded one call."""
    chat = tmp_path / "in.json"
    chat.write_text(json.dumps([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]))
    for argv in (
        ["run", "--pack", "builtin:default", "--model", "gpt-4o", "--input", "in.json", "--output", "o.json",
         "--state", "st", "--session", "st/s"],
        ["usage", "add", "--state", "st", "--session", "st/s", "--model", "gpt-4o", "--prompt", "10"],
    ):  # fmt: skip
        proc = cli(*argv, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
    (tmp_path / "link").symlink_to("st/s")
    return tmp_path


RUN = ["run", "--pack", "builtin:default", "--model", "gpt-4o", "--input", "in.json"]


@pytest.mark.parametrize(
    ("argv", "kept"),
    [
        ([*RUN, "--state", "st", "--session", "st/s", "--output", "st/s/state.json"], "st/s/state.json"),
        ([*RUN, "--state", "st", "--session", "st/s", "--output", "o.json", "--report", "st/injection.key"],
         "st/injection.key"),
        ([*RUN, "--state", "st", "--session", "st/s", "--output", "link/state.json"], "st/s/state.json"),
        ([*RUN, "--session", "st/s", "--output", "st/s/state.json"], "st/s/state.json"),  # no --state
        ([*RUN, "--state", "st", "--output", "st/default/state.json"], "st/default/state.json"),  # default session
        (["sessions", "export", "st/s", "--state", "st", "--to", "st/s/state.json"], "st/s/state.json"),
        (["sessions", "export", "st/s", "--state", "st", "--to", "st/s/last_output.jsonl"], "st/s/last_output.jsonl"),
        (["sessions", "resume", "st/s", "--state", "st", "--output", "st/s/state.json"], "st/s/state.json"),
        (["usage", "report", "--state", "st", "--html", "st/ledger/days/{day}.jsonl"], "st/ledger/days/{day}.jsonl"),
    ],
    ids=["run-output", "run-report-key", "run-through-link", "run-no-state", "run-default-session", "export-state",
         "export-output", "resume", "usage-html-ledger"],
)  # fmt: skip
def test_an_output_over_a_kept_file_is_refused(world: Path, argv: list[str], kept: str) -> None:
    """Each of these wrote over the file: the next turn found `state.json was damaged`, or
    `injection.key: not an injection key`, or a ledger that was an HTML page."""
    days = sorted((world / "st" / "ledger" / "days").glob("*.jsonl"))
    assert days, "the call was not recorded"
    day = days[0].stem
    target = world / kept.format(day=day)
    if not target.exists():  # the default session is made by its first run
        assert cli(*RUN, "--state", "st", "--output", "o.json", cwd=world).returncode == 0
    before = target.read_bytes()
    proc = cli(*[a.format(day=day) for a in argv], cwd=world)
    assert proc.returncode == 2, proc.stderr
    assert "internal error" not in proc.stderr and "ctxrules keeps" in proc.stderr, proc.stderr
    assert target.read_bytes() == before


@pytest.fixture
def siblings(world: Path) -> Path:
    """Beside ``st/s``: ``st/t``, a session that ran a turn, and ``st/u``, one that only recorded
    usage; and ``other``, a second state root with a session of its own."""
    for argv in (
        [*RUN, "--output", "o.json", "--state", "st", "--session", "st/t"],
        ["usage", "add", "--state", "st", "--session", "st/u", "--model", "gpt-4o", "--prompt", "10"],
        [*RUN, "--output", "o.json", "--state", "other", "--session", "other/x"],
    ):
        proc = cli(*argv, cwd=world)
        assert proc.returncode == 0, proc.stderr
    return world


@pytest.mark.parametrize(
    ("argv", "kept"),
    [
        ([*RUN, "--state", "st", "--session", "st/s", "--output", "st/t/last_output.jsonl", "--report",
          "st/t/state.json"], "st/t/state.json"),
        ([*RUN, "--state", "st", "--session", "st/s", "--output", "st/t/new.json"], None),
        (["sessions", "export", "st/s", "--state", "st", "--to", "other/injection.key"], "other/injection.key"),
        (["sessions", "resume", "st/s", "--state", "st", "--output", "other/x/state.json"], "other/x/state.json"),
        (["usage", "report", "--state", "st", "--html", "st/u/ledger.jsonl"], "st/u/ledger.jsonl"),
        ([*RUN, "--state", "st", "--session", "st/s", "--output", "st/t/vault/x.json"], None),
    ],
    ids=["run-over-another-session", "run-into-another-session", "export-over-another-roots-key",
         "resume-over-another-roots-session", "usage-html-over-a-usage-only-session", "run-into-another-vault"],
)  # fmt: skip
def test_an_output_over_another_sessions_files_is_refused(siblings: Path, argv: list[str], kept: str | None) -> None:
    """Only the command's own session was protected: another session of the same state root (or
    of another one) lost its state, last output, ledger or signing key, exit 0."""
    target = siblings / kept if kept else None
    before = target.read_bytes() if target else None
    proc = cli(*argv, cwd=siblings)
    assert proc.returncode == 2 and "give the output a file elsewhere" in proc.stderr, proc.stderr
    assert "internal error" not in proc.stderr
    if target is not None:
        assert target.read_bytes() == before
    assert (
        not (siblings / "st" / "t" / "new.json").exists() and not (siblings / "st" / "t" / "vault" / "x.json").exists()
    )


def test_an_output_beside_the_session_is_written(world: Path) -> None:
    """The refusal is for what ctxrules keeps, not for the state root or the current folder."""
    proc = cli(*RUN, "--state", "st", "--session", "st/s", "--output", "st/out.json", "--report", "r.json", cwd=world)
    assert proc.returncode == 0, proc.stderr
    proc = cli("sessions", "export", "st/s", "--state", "st", "--to", "st/s.ctxs", cwd=world)
    assert proc.returncode == 0, proc.stderr
    assert os.path.getsize(world / "st" / "out.json") and os.path.getsize(world / "st" / "s.ctxs")
