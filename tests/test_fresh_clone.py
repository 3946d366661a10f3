"""A fresh clone, without the corpus or anything else next to it, collects the whole suite
without an error (the tests that need the corpus skip when they run, with the reason)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from checkout_kit import snapshot

if shutil.which("git") is None:
    pytest.skip("needs git", allow_module_level=True)


def test_a_clone_without_the_corpus_collects_every_test(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    clone.mkdir()
    snapshot(clone)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CTXRULES_CORPUS")}
    env["PYTHONPATH"] = str(clone / "engine")
    env["CTXRULES_CORPUS"] = str(tmp_path / "no-corpus-here")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:randomly",
            # nothing runs, so syrupy finds every snapshot unused: a warning here
            "--snapshot-warn-unused",
        ],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    # e.g. "1659 tests collected in 12.69s", or "..., 1 error in ..." when a module breaks
    summary = re.search(r"^(\d+) tests? collected.*$", out, re.M)
    assert summary and "error" not in summary[0], out[-4000:]
    assert int(summary[1]) > 1000, out[-2000:]
