"""The benchmark scripts the README tells developers to run (``python tests/bench_NAME.py``)
refuse a wrong setup at once, in one line, as the other corpus benchmarks do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _bench(name: str, *argv: str, corpus: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CTXRULES_CORPUS": str(corpus), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    return subprocess.run(
        [sys.executable, str(HERE / f"{name}.py"), *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_bench_prepare_without_the_corpus_says_so(tmp_path: Path) -> None:
    """It opened the corpus transcript unchecked: a FileNotFoundError traceback."""
    run = _bench("bench_prepare", corpus=tmp_path / "no-corpus")
    assert run.returncode == 0, run.stderr
    assert "skipped: the corpus transcript" in run.stdout and "set CTXRULES_CORPUS" in run.stdout
    assert "Traceback" not in run.stderr, run.stderr


def test_bench_outputs_compare_with_a_folder_holding_no_outputs_stops_before_the_replay(tmp_path: Path) -> None:
    """It replayed the whole corpus (minutes) and then raised FileNotFoundError on index.json."""
    run = _bench("bench_outputs", "--compare", str(tmp_path / "nothing-saved"), corpus=tmp_path / "no-corpus")
    assert run.returncode == 2, run.stdout + run.stderr
    assert "no index.json there (make one with --save DIR)" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
