"""``ctxrules compress -- CMD`` under real signals: forwarded to CMD's process group, what CMD
wrote before it ended is still compressed, printed and vaulted, the exit status is CMD's, and
nothing CMD started outlives ctxrules."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
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
    """The command's group id, once its output is out and its ``sleep`` runs. Signalled any
    earlier, the signal can land in the shell's copy of itself between fork and exec of
    ``sleep`` (its SIGINT handler still the shell's): the shell then holds the SIGINT until the
    job ends and ``sleep`` never gets it, so ``sh -c`` waits out the 30 s with or without
    ctxrules in front (that race is the shell's; the test is about forwarding)."""
    deadline = time.monotonic() + 60
    while not (tmp_path / "READY").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the command never started"
        time.sleep(0.05)
    pgid = int((tmp_path / "READY").read_text())
    while not _runs_sleep(pgid):
        assert proc.poll() is None and time.monotonic() < deadline, "the command's sleep never started"
        time.sleep(0.02)
    return pgid


def _runs_sleep(pgid: int) -> bool:
    """Whether a process of group ``pgid`` has become ``sleep`` (exec'd); where there is no
    /proc to tell, after a pause that is long enough on any machine but a stalled one."""
    proc = Path("/proc")
    if not proc.is_dir():
        time.sleep(0.5)
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            # pid (comm) state ppid pgrp ...: comm may hold spaces, so split after its ")"
            comm = stat[stat.index("(") + 1 : stat.rindex(")")]
            if comm == "sleep" and int(stat[stat.rindex(")") + 2 :].split()[2]) == pgid:
                return True
    return False


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


def test_a_command_that_ignores_the_signal_and_exits_0_still_exits_as_signalled(tmp_path: Path) -> None:
    """The caller that sent SIGTERM learns the run was interrupted (128 + 15), though the
    command let the signal pass and ended well; what it wrote after the signal is printed."""
    script = "trap '' TERM; " + SCRIPT.replace("sleep 30", "sleep 2; echo finished; exit 0")
    proc = start(tmp_path, script)
    wait_ready(tmp_path, proc)
    proc.send_signal(signal.SIGTERM)
    out, _err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM
    assert b"partial-output" in out and b"finished" in out


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
        # What ctxrules printed just before it ended may still sit in the terminal's buffer.
        while select.select([fd], [], [], 0.5)[0]:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: every writer has closed the terminal
                break
            if not chunk:
                break
            buf += chunk
    finally:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)
    text = buf.decode("utf-8", "replace")
    assert "partial-output" in text and "[ctxrules:elided" in text
    assert group_gone(int((tmp_path / "READY").read_text()))


# A command that ends by itself leaving a background job: the job inherits the output pipe and
# holds it open, but CMD's end is the end of the wait. GROUP is CMD's group id (its pid), which
# its background jobs share: the cleanup kills them whatever the test's outcome.
def cleanup(tmp_path: Path, proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.communicate()
    with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError, PermissionError):
        os.killpg(int((tmp_path / "GROUP").read_text()), signal.SIGKILL)


def full_output(tmp_path: Path, out: bytes) -> bytes:
    """What the command wrote: the vault's copy when the output was compressed, else ``out``."""
    vault_id = re.search(rb"vault://([0-9a-f]{64})", out)
    if vault_id is None:
        return out
    got = subprocess.run(
        [sys.executable, "-m", "ctxrules.cli.main", "vault", "get", vault_id.group(1).decode()],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        timeout=60,
    )
    assert got.returncode == 0, got.stderr
    return got.stdout


def test_a_background_job_is_not_waited_for_and_keeps_running(tmp_path: Path) -> None:
    proc = start(tmp_path, "echo $$ > GROUP; sleep 30 & echo $! > JOB; seq 1 5; printf 'last, no newline'; exit 3")
    try:
        out, err = proc.communicate(timeout=20)  # well before the job's 30 s sleep ends
        assert proc.returncode == 3, err
        assert out == b"1\n2\n3\n4\n5\nlast, no newline"
        os.kill(int((tmp_path / "JOB").read_text()), 0)  # the job is still running
    finally:
        cleanup(tmp_path, proc)


def test_everything_written_just_before_the_end_is_kept_with_a_job_left(tmp_path: Path) -> None:
    # 200,001 lines: a large output, streamed into the vault; its last bytes are still in the
    # pipe when the command exits.
    proc = start(tmp_path, "echo $$ > GROUP; sleep 30 & seq 1 200000; printf 'the end'")
    try:
        out, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err
        assert full_output(tmp_path, out) == "".join(f"{i}\n" for i in range(1, 200001)).encode() + b"the end"
    finally:
        cleanup(tmp_path, proc)


def test_a_job_that_keeps_writing_does_not_hold_ctxrules_and_the_command_output_is_whole(tmp_path: Path) -> None:
    # One write per line from both (atomic in a pipe), so their lines interleave but stay whole.
    own = "import os\nfor i in range(1, 20001):\n    os.write(1, b'%d\\n' % i)\nos.write(1, b'own-last\\n')\n"
    (tmp_path / "own.py").write_text(own, encoding="utf-8")
    script = f"echo $$ > GROUP; while :; do echo bg-noise; done & {shlex.quote(sys.executable)} own.py; exit 4"
    proc = start(tmp_path, script)
    try:
        out, err = proc.communicate(timeout=20)
        assert proc.returncode == 4, err
        lines = [line for line in full_output(tmp_path, out).decode().splitlines() if line != "bg-noise"]
        assert lines == [str(i) for i in range(1, 20001)] + ["own-last"]
    finally:
        cleanup(tmp_path, proc)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a pipe's size is set on Linux only")
def test_a_fast_command_is_read_in_pieces_larger_than_a_default_pipe(tmp_path: Path) -> None:
    # The pipe is widened and a read takes what is there: a `cat` of a big file is not read
    # 64 KiB at a time (thousands of reads for a big log), and every byte still arrives.
    from ctxrules.cli.child import Child

    data = os.urandom(8 << 20)
    (tmp_path / "blob").write_bytes(data)
    pieces: list[bytes] = []
    code = Child(["cat", str(tmp_path / "blob")], capture=True).run_into(pieces.append)
    assert code == 0
    assert b"".join(pieces) == data
    assert max(len(p) for p in pieces) > 65536


def test_a_command_that_has_ended_is_seen_when_its_pipe_empties(monkeypatch: pytest.MonkeyPatch) -> None:
    # The command has ended by the time its pipe is empty: ctxrules reads what is there (and
    # QUIET_S more), not what a job it left starts writing later, however long the wait
    # between the checks it makes while the output flows.
    import ctxrules.cli.child as child_mod
    from ctxrules.cli.child import Child

    monkeypatch.setattr(child_mod, "_CHECK_S", 10.0)
    child = Child(["sh", "-c", "(sleep 5; exec yes) & head -c 50000 /dev/zero"], capture=True)
    try:
        assert child.proc is not None
        deadline = time.monotonic() + 4
        while child.proc.poll() is None:  # `head` and the shell end; the job sleeps, holding the pipe
            assert time.monotonic() < deadline, "the command did not end"
            time.sleep(0.01)
        pieces: list[bytes] = []
        started = time.monotonic()
        assert child.run_into(pieces.append) == 0
        assert time.monotonic() - started < 3
        assert sum(len(p) for p in pieces) == 50000
    finally:
        assert child.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.proc.pid, signal.SIGKILL)


def test_a_job_that_ignores_the_forwarded_signal_and_keeps_writing_is_ended(tmp_path: Path) -> None:
    # A background job of `sh -c` ignores SIGINT. After the command ended by the forwarded
    # signal, such a job kept the pipe busy and ctxrules reading until a second signal.
    script = "echo $$ > GROUP; while :; do echo bg-noise; done & echo $$ > READY.tmp; mv READY.tmp READY; sleep 30"
    proc = start(tmp_path, script)
    try:
        wait_ready(tmp_path, proc)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)  # one signal is enough
        assert proc.returncode == 130, err
        assert group_gone(int((tmp_path / "GROUP").read_text()))
    finally:
        cleanup(tmp_path, proc)


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_while_a_spilled_output_is_compressed_leaves_no_entry(
    tmp_path: Path, signum: int, status: int
) -> None:
    """After CMD has ended, while its output (spilled to the vault: 60 MB) is compressed: the
    entry being written stayed in the vault as a temporary file as large as the output, and
    SIGTERM, no longer forwarded, killed ctxrules outright (-15, not 143)."""
    proc = start(tmp_path, "seq 1 8000000; touch DONE")
    deadline = time.monotonic() + 60
    while not (tmp_path / "DONE").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the command never ended"
        time.sleep(0.01)
    time.sleep(0.3)  # the output is read (CMD's pipe idle 0.1 s) and being compressed: some 1 s
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == status, err
    assert b"Traceback" not in err and b"terminate called" not in err, err
    assert not list(tmp_path.glob(".ctxrules/**/.tmp-*")), "the spilled entry was left in the vault"
