"""A stop signal at either end of a verb (docs/reference/cli.md): SIGTERM while ``run``,
``compress`` or ``eval`` still imports its modules is exit 143 like one during the work, and a
signal that comes once the work is done, while Python tears itself down, leaves the verb's exit
code as it is. Each case is a real process that signals itself at that moment, so the moment
is certain rather than a matter of timing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cli_kit import ENGINE

# The entry point, with the verb's modules imported through a hook that sends SIGTERM first.
WHILE_IMPORTING = """
import importlib, os, signal, sys
from ctxrules.cli import main as cli
real = importlib.import_module
def importing(name, *rest):
    if name == cli.VERBS[sys.argv[1]]:
        os.kill(os.getpid(), signal.SIGTERM)
    return real(name, *rest)
importlib.import_module = importing
cli.main(sys.argv[1:])
"""

# The entry point, with an exit handler (registered before it, so run after its own) that
# sends the signal once everything is done.
AT_EXIT = """
import atexit, os, sys
from ctxrules.cli import main as cli
atexit.register(lambda: os.kill(os.getpid(), int(sys.argv[1])))
cli.main(sys.argv[2:])
"""


def _python(code: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env={**os.environ, "PYTHONPATH": ENGINE},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["compress", "--command", "ls", "--input", "out.txt"],
        ["run", "--pack", "builtin:default", "--model", "gpt-4o", "--input", "in.json", "--session", "s"],
        ["eval", "--pack", "builtin:default", "--model", "gpt-4o", "in.json"],
    ],
    ids=lambda argv: argv[0],
)
def test_sigterm_while_the_verb_starts_is_143(tmp_path: Path, argv: list[str]) -> None:
    """The handler used to be installed by the verb itself, after the imports that take most
    of a second of a `run`: SIGTERM then killed the process (-15), not exit 143."""
    (tmp_path / "out.txt").write_text("hello\n")
    (tmp_path / "in.json").write_text('[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]')
    proc = _python(WHILE_IMPORTING, *argv, cwd=tmp_path)
    assert proc.returncode == 143, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "s").exists()  # nothing was begun


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=lambda s: signal.Signals(s).name)
def test_a_signal_once_the_work_is_done_keeps_the_exit_code(tmp_path: Path, signum: int) -> None:
    """Python puts back the default actions as it exits: a signal then ended a process whose
    output was complete by the signal (-15), or printed a KeyboardInterrupt traceback."""
    proc = _python(AT_EXIT, str(int(signum)), "schema", "--path", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith(".json")
    assert proc.stderr == ""
