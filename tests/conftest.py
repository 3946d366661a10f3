"""Shared fixtures. Tests run against the source tree (``engine/``), not a stale install; the
installed wheel is tested on its own in ``test_wheel.py``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "engine"))

# The real test data (agent transcripts, command outputs); never copied into the repository.
CORPUS = Path(os.environ.get("CTXRULES_CORPUS") or REPO.parent / "shared" / "corpus")
TRANSCRIPTS = CORPUS / "transcripts"
COMMAND_OUTPUTS = CORPUS / "command-outputs"
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def transcript_paths() -> list[Path]:
    return sorted(p for p in TRANSCRIPTS.glob("*.json") if p.name != "stats.json")


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    """Run the CLI in-process: ``code, out, err = cli("validate", "rules/")``."""
    from ctxrules.cli.main import run

    def invoke(*argv: str) -> tuple[int, str, str]:
        try:
            code = run(list(argv))
        except SystemExit as exc:  # argparse usage errors
            code = int(exc.code or 0)
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return invoke
