"""The CLI as a user's shell runs it, for tests: a fresh ``python -m ctxrules.cli.main`` process
on this tree's code (``PYTHONPATH`` names its ``engine`` folder, whatever is installed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ENGINE = str(Path(__file__).resolve().parents[1] / "engine")


def cli(*args: str, text: bool = True, timeout: float = 300, **kwargs: Any) -> subprocess.CompletedProcess[Any]:
    """``ctxrules ARGS`` in a new process, its output captured; ``kwargs`` go to
    :func:`subprocess.run` (``cwd``, ``preexec_fn``, ...)."""
    return subprocess.run(
        [sys.executable, "-m", "ctxrules.cli.main", *args],
        env={**os.environ, "PYTHONPATH": ENGINE},
        capture_output=True,
        text=text,
        timeout=timeout,
        **kwargs,
    )


def run_default(source: Path, *args: str, model: str = "gpt-4o", **kwargs: Any) -> subprocess.CompletedProcess[Any]:
    """``ctxrules run --pack builtin:default --model MODEL --input SOURCE ARGS`` (see :func:`cli`)."""
    return cli("run", "--pack", "builtin:default", "--model", model, "--input", str(source), *args, **kwargs)
