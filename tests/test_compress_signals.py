"""``ctxrules compress -- CMD`` under real signals: forwarded to CMD's process group, what CMD
wrote before it ended is still compressed, printed and vaulted, the exit status is CMD's, and
nothing CMD started outlives ctxrules."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "engine")}
# Writes its group id (its own pid: ctxrules makes it a group leader) once its output is out.
SCRIPT = "seq 1 3000; echo partial-output; echo $$ > READY.tmp; mv READY.tmp READY; sleep 30"


def start(tmp_path: Path, script: str = SCRIPT) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "ctxrules.cli.main", "compress", "--", "sh", "-c", script],
        cwd=tmp_path,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def wait_ready(tmp_path: Path, proc: subprocess.Popen[bytes]) -> int:
    deadline = time.monotonic() + 60
    while not (tmp_path / "READY").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the command never started"
        time.sleep(0.05)
    return int((tmp_path / "READY").read_text())


def group_gone(pgid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_signal_is_forwarded_and_the_partial_output_kept(tmp_path: Path, signum: int, status: int) -> None:
    proc = start(tmp_path)
    pgid = wait_ready(tmp_path, proc)
    assert pgid != os.getpgrp()  # the command runs in a group of its own
    t = time.monotonic()
    proc.send_signal(signum)  # to ctxrules alone, as `kill` or an agent's timeout does
    out, err = proc.communicate(timeout=20)
    assert time.monotonic() - t < 10  # not the 30 s of the sleep
    assert proc.returncode == status, err
    text = out.decode()
    assert "partial-output" in text and "3000" in text and "[ctxrules:elided" in text
    vault_id = re.search(r"vault://([0-9a-f]{64})", text)
    assert vault_id is not None, text
    full = subprocess.run(
        [sys.executable, "-m", "ctxrules.cli.main", "vault", "get", vault_id.group(1)],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        timeout=60,
    )
    assert full.returncode == 0, full.stderr
    assert full.stdout == "".join(f"{i}\n" for i in range(1, 3001)).encode() + b"partial-output\n"
    assert group_gone(pgid), "a process of the command outlived ctxrules"


def test_a_command_that_ignores_the_signal_is_killed_by_the_second(tmp_path: Path) -> None:
    proc = start(tmp_path, "trap '' TERM; " + SCRIPT)
    pgid = wait_ready(tmp_path, proc)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert proc.poll() is None  # the command ignores it; ctxrules waits for it
    proc.send_signal(signal.SIGTERM)
    out, _err = proc.communicate(timeout=20)
    assert proc.returncode == 128 + signal.SIGKILL
    assert b"partial-output" in out
    assert group_gone(pgid)


def test_a_command_that_ends_by_itself_is_unaffected(tmp_path: Path) -> None:
    proc = start(tmp_path, "seq 1 5; exit 3")
    out, _err = proc.communicate(timeout=60)
    assert proc.returncode == 3 and out == b"1\n2\n3\n4\n5\n"


def test_ctrl_c_typed_at_a_terminal_reaches_the_command(tmp_path: Path) -> None:
    """On a real terminal (a pty): the command's group is given the terminal, so Ctrl-C goes to
    it; ctxrules prints the compressed partial output and exits 130."""
    import pty
    import select

    pid, fd = pty.fork()
    if pid == 0:  # the child: ctxrules with the pty as its controlling terminal
        os.chdir(tmp_path)
        os.environ.update(ENV)
        os.execv(sys.executable, [sys.executable, "-m", "ctxrules.cli.main", "compress", "--", "sh", "-c", SCRIPT])
    buf = b""
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "READY").exists():
            assert time.monotonic() < deadline, "the command never started"
            if select.select([fd], [], [], 0.05)[0]:
                buf += os.read(fd, 65536)
        os.write(fd, b"\x03")  # Ctrl-C
        t = time.monotonic()
        status = None
        while status is None and time.monotonic() - t < 20:
            if select.select([fd], [], [], 0.1)[0]:
                with contextlib.suppress(OSError):  # EIO: the child closed the terminal
                    buf += os.read(fd, 65536)
            done, raw = os.waitpid(pid, os.WNOHANG)
            status = os.waitstatus_to_exitcode(raw) if done else None
        assert status == 130
        assert time.monotonic() - t < 10
    finally:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)
    text = buf.decode("utf-8", "replace")
    assert "partial-output" in text and "[ctxrules:elided" in text
    assert group_gone(int((tmp_path / "READY").read_text()))
