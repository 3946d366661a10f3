"""Wrapped commands pick the rule of the command they wrap (docs/compressors.md "Matching").

Each wrapper is tried twice through the real CLI: in filter mode (``ctxrules compress
--command LINE --input captured.txt``) and in proxy mode (``ctxrules compress -- sh -c LINE``),
where the line really runs. In proxy mode, ``pytest`` and the wrappers that are not installed
here (``sudo``, ``uv``, ``poetry``, ``pipx``, ``npx``, ``pnpm``) are small executables on
``PATH`` that run what they wrap: the process tree is real, the tools are stand-ins.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO

FIXTURE = REPO / "rules" / "compressors" / "fixtures" / "pytest" / "failures_v.txt"
ENGINE = str(REPO / "engine")

# (wrapped line, what it wraps); `{pytest}` is the pytest on PATH.
WRAPPED = [
    ("sh -c 'pytest -v 2>&1'", "sh -c"),
    ("bash -c 'pytest -v'", "bash -c"),
    ("bash -lc 'cd {tmp} && {pytest} -v'", "bash -lc, cd DIR &&"),
    ("bash -o pipefail -c 'pytest -v | tail -n 400'", "bash -o opt -c"),
    ("cd {tmp} && pytest -v", "cd DIR &&"),
    ("pytest -v 2>&1 | tail -n 400", "| tail -n N"),
    ("pytest -v | head -400", "| head"),
    ("env PYTHONDONTWRITEBYTECODE=1 pytest -v", "env VAR=v"),
    ("time pytest -v", "time"),
    ("timeout 60 pytest -v", "timeout N"),
    ("nice -n 5 pytest -v", "nice"),
    ("sudo pytest -v", "sudo"),
    ("uv run pytest -v", "uv run"),
    ("poetry run pytest -v", "poetry run"),
    ("pipx run pytest -v", "pipx run"),
    ("npx pytest -v", "npx"),
    ("pnpm exec pytest -v", "pnpm exec"),
    ("python -m pytest -v", "python -m MOD"),
    ("sh -c \"sh -c 'pytest -v'\"", "nested sh -c"),
]
IDS = [label for _, label in WRAPPED]


@pytest.fixture
def tools(tmp_path: Path) -> Path:
    """A bin folder with a stand-in ``pytest`` (prints the captured run, exits 1), the
    wrappers that are not installed, and a ``pytest`` module for ``python -m pytest``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {
        "pytest": f"cat '{FIXTURE}'\nexit 1",
        "sudo": 'exec "$@"',
        "npx": 'exec "$@"',
        "uv": 'shift; exec "$@"',
        "poetry": 'shift; exec "$@"',
        "pipx": 'shift; exec "$@"',
        "pnpm": 'shift; exec "$@"',
        "python": f'exec {sys.executable} "$@"',
    }
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{body}\n", encoding="utf-8")
        path.chmod(0o755)
    module = tmp_path / "mods" / "pytest"
    module.mkdir(parents=True)
    (module / "__init__.py").write_text("", encoding="utf-8")
    (module / "__main__.py").write_text(
        f"import sys\nsys.stdout.write(open({str(FIXTURE)!r}, encoding='utf-8').read())\nsys.exit(1)\n",
        encoding="utf-8",
    )
    return bin_dir


def _run(tmp: Path, tools: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PATH": f"{tools}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": f"{ENGINE}{os.pathsep}{tmp / 'mods'}",
        "CTXRULES_STATE": str(tmp / "state"),
    }
    env.pop("CTXRULES_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "ctxrules.cli.main", "compress", "--stats", *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp,
        timeout=120,
        check=False,
    )


def _line(template: str, tmp: Path, tools: Path) -> str:
    return template.format(tmp=tmp, pytest=tools / "pytest")


def _assert_pytest_rule(proc: subprocess.CompletedProcess[str]) -> None:
    assert "compressor 'pytest'" in proc.stderr, proc.stderr
    assert "tests/test_calc.py::test_div_by_zero FAILED" in proc.stdout
    assert "tests/test_bulk_1.py::test_add_many_1[3] PASSED" not in proc.stdout


@pytest.mark.parametrize(("template", "label"), WRAPPED, ids=IDS)
def test_filter_mode_sees_through_the_wrapper(tmp_path: Path, tools: Path, cli: Any, template: str, label: str) -> None:
    line = _line(template, tmp_path, tools)
    code, out, err = cli(
        "compress", "--stats", "--state", str(tmp_path / "state"),
        "--command", line, "--exit-code", "1", "--input", str(FIXTURE),
    )  # fmt: skip
    assert code == 0, err
    _assert_pytest_rule(subprocess.CompletedProcess([], code, out, err))


@pytest.mark.parametrize(("template", "label"), WRAPPED, ids=IDS)
def test_proxy_mode_runs_the_wrapper_and_sees_through_it(
    tmp_path: Path, tools: Path, template: str, label: str
) -> None:
    line = _line(template, tmp_path, tools)
    proc = _run(tmp_path, tools, "--always", "--", "sh", "-c", line)
    # The exit code is the command's: pytest's 1 unless a trimming pipe stage ends the line.
    assert proc.returncode == (0 if "| " in template and "pipefail" not in template else 1), proc.stderr
    _assert_pytest_rule(proc)


def test_a_trailing_trim_decides_nothing_in_proxy_mode(tmp_path: Path, tools: Path) -> None:
    # `find ... | head -N` is find's output: the find rule applies, not generic's.
    proc = _run(tmp_path, tools, "--always", "--", "sh", "-c", f"find {REPO / 'engine'} | head -400")
    assert proc.returncode == 0, proc.stderr
    assert "compressor 'find'" in proc.stderr, proc.stderr


def test_a_shell_running_a_script_file_is_that_shell(tmp_path: Path, cli: Any) -> None:
    code, _out, err = cli(
        "compress", "--stats", "--state", str(tmp_path / "state"),
        "--command", "bash run_tests.sh", "--input", str(FIXTURE),
    )  # fmt: skip
    assert code == 0 and "compressor 'pytest'" not in err, err
