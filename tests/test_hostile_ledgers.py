"""A damaged cost ledger line is a skipped line: it neither crashes the budget check of every
``ctxrules run`` and ``usage show``, nor silently lifts a budget (a negative or NaN sum passes
every limit), nor trips one for good (an infinite one). Through the real CLI, on ledgers a
real ``usage add`` wrote."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACK = """\
apiVersion: ctxrules/v1
kind: RulePack
metadata: {name: budgeted, version: 1.0.0}
extends: [builtin:default]
budgets:
  session: {usd: 1.00, tokens: 1000000}
"""
CALL = '{"v": 1, "type": "call", "ts": 1.0, "model": "gpt-4o", "session": "default", "root": "default"'


def cli(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ctxrules.cli.main", *argv],
        env={**os.environ, "PYTHONPATH": str(ROOT / "engine")},
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )


RUN = ("run", "--pack", "pack.yaml", "--model", "gpt-4o", "--input", "in.json", "--state", "st")


@pytest.fixture(scope="module")
def spent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A session whose ledger (written by the real CLI) holds one call that spends more than
    the whole session budget: $1.25 of $1.00."""
    folder = tmp_path_factory.mktemp("spent")
    (folder / "pack.yaml").write_text(PACK)
    (folder / "in.json").write_text(json.dumps([{"role": "user", "content": "hi"}]))
    assert cli(folder, *RUN).returncode == 0
    argv = ("usage", "add", "--state", "st", "--pack", "pack.yaml", "--model", "gpt-4o", "--prompt", "500000")
    added = cli(folder, *argv)
    assert added.returncode == 0, added.stderr
    return folder


@pytest.mark.parametrize(
    "line",
    [
        CALL + ', "tokens": {"prompt": 1e400, "completion": 1}}',  # json reads it as inf
        CALL + ', "tokens": {"prompt": Infinity}}',
        CALL + ', "tokens": {"prompt": NaN}}',
        CALL + ', "tokens": {"prompt": -100000000}}',  # would hide the token budget
        CALL + ', "tokens": {"prompt": 10}, "usd": {"input": NaN}}',  # NaN passes every limit
        CALL + ', "tokens": {"prompt": 10}, "usd": {"input": -1000.0}}',
        CALL + ', "tokens": {"prompt": 10}, "usd": {"input": Infinity}}',  # exceeded forever
        CALL + ', "tokens": {"prompt": 10}, "usd": {"input": ' + "9" * 400 + "}}",  # no float holds it
        '{"v": 1, "type": "call", "ts": NaN, "model": "gpt-4o", "tokens": {"prompt": 10}}',
        '{"v": 1, "type": "reset", "ts": -Infinity}',
        CALL + ', "tokens": {"prompt": 100000000000000000000}}',  # more than any call has
        CALL.replace('"ts": 1.0', '"ts": 1e20') + ', "tokens": {"prompt": 10}}',  # after year 9999
        '{"v": 1, "type": "reset", "ts": 99999999999999999}',
        CALL + ', "tokens": {"prompt": 10}, "usd": {"input": 1e300}}',  # two of them sum to inf
        CALL + ', "tokens": {"prompt": 10}, "usd": {"cache_savings": -1e308}}',
    ],
    ids=[
        "tokens-1e400",
        "tokens-inf",
        "tokens-nan",
        "tokens-negative",
        "usd-nan",
        "usd-negative",
        "usd-inf",
        "usd-400-digits",
        "ts-nan",
        "reset-ts-inf",
        "tokens-over-max",
        "ts-after-9999",
        "reset-ts-after-9999",
        "usd-over-max",
        "savings-under-minus-max",
    ],
)
def test_a_damaged_ledger_line_is_skipped_and_the_budget_still_counts(spent: Path, tmp_path: Path, line: str) -> None:
    shutil.copytree(spent, tmp_path, dirs_exist_ok=True)
    days = sorted((tmp_path / "st" / "ledger" / "days").glob("*.jsonl"))
    for ledger in [tmp_path / "st" / "default" / "ledger.jsonl", *days]:
        with open(ledger, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")

    proc = cli(tmp_path, *RUN)
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr
    # The real call still exceeds the budget: the damaged line neither lifted nor replaced it.
    assert proc.returncode == 1, proc.stderr
    assert "budget exceeded" in proc.stderr and "$1.2500 of $1.0000" in proc.stderr
    shown = cli(tmp_path, "usage", "show", "--state", "st", "--pack", "pack.yaml", "--format", "json")
    assert shown.returncode == 0, shown.stderr
    session = json.loads(shown.stdout)["session"]
    assert session["calls"] == 1 and session["tokens"]["prompt"] == 500000
    assert session["usd"] == pytest.approx(1.25)
    # The dashboard reads the day ledger, damaged line included: the real call, nothing else.
    until = days[-1].stem
    report = cli(tmp_path, "usage", "report", "--state", "st", "--until", until, "--days", "1", "--html", "u.html")
    assert report.returncode == 0 and "1 call(s)" in report.stdout, report.stderr


def test_a_ledger_claiming_gigabytes_is_read_a_block_at_a_time(spent: Path, tmp_path: Path) -> None:
    """A ledger whose end claims 1 GiB without a newline (sparse: a crashed or hostile writer)
    is read in bounded memory: that "line" is skipped as damage, the calls before it and the one
    recorded after it still count."""
    shutil.copytree(spent, tmp_path, dirs_exist_ok=True)
    days = sorted((tmp_path / "st" / "ledger" / "days").glob("*.jsonl"))
    for ledger in [tmp_path / "st" / "default" / "ledger.jsonl", *days]:
        os.truncate(ledger, ledger.stat().st_size + (1 << 30))

    def capped(*argv: str) -> subprocess.CompletedProcess[str]:
        limit = 768 << 20  # less than the claimed size: a whole read of it fails
        return subprocess.run(
            [sys.executable, "-m", "ctxrules.cli.main", *argv],
            env={**os.environ, "PYTHONPATH": str(ROOT / "engine")},
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)),
        )

    added = capped("usage", "add", "--state", "st", "--pack", "pack.yaml", "--model", "gpt-4o", "--prompt", "1000")
    assert added.returncode == 0, added.stderr
    shown = capped("usage", "show", "--state", "st", "--pack", "pack.yaml", "--format", "json")
    assert shown.returncode == 0, shown.stderr
    session = json.loads(shown.stdout)["session"]
    assert session["calls"] == 2 and session["tokens"]["prompt"] == 501000
    assert json.loads(shown.stdout)["budget"]["bad_ledger_lines"] == 1  # skipped, counted as damage
    proc = capped(*RUN)
    assert proc.returncode == 1 and "budget exceeded" in proc.stderr, proc.stderr


@pytest.mark.parametrize("how", ["--state", "CTXRULES_STATE"])
def test_a_state_root_that_is_a_file_is_refused_not_read_as_empty(tmp_path: Path, how: str) -> None:
    """`CTXRULES_STATE=/etc/passwd ctxrules usage show` printed zero totals, as if the root
    were a real one where nothing was spent yet."""
    (tmp_path / "not-a-root").write_text("x\n")
    argv = ["usage", "show", *(["--state", "not-a-root"] if how == "--state" else [])]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "engine")}
    if how == "CTXRULES_STATE":
        env["CTXRULES_STATE"] = "not-a-root"
    proc = subprocess.run(
        [sys.executable, "-m", "ctxrules.cli.main", *argv], env=env, capture_output=True, text=True, cwd=tmp_path
    )
    assert proc.returncode == 2, proc.stdout
    assert "not-a-root: the state root is not a directory" in proc.stderr
    assert "Traceback" not in proc.stderr and not proc.stdout
