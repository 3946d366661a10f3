"""Every verb that reads ``-`` (standard input) or a file named by the user handles one that
cannot be read one way (docs/reference/cli.md): standard input closed (``<&-``) or open only
for writing, and a device that never ends (/dev/zero), are one line on stderr and exit 2, never
an internal error, never read until the disk or the memory is full. Each case is a real
process, started with the descriptor as a shell would leave it."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_kit import ENGINE, cli


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A message file, a run report and a session archive: what the verbs below read."""
    tmp = tmp_path_factory.mktemp("stdin")
    chat = tmp / "in.json"
    chat.write_text(json.dumps([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]))
    session, report = tmp / "st" / "s1", tmp / "report.json"
    for argv in (
        ["run", "--pack", "builtin:default", "--model", "gpt-4o", "--input", str(chat), "--output",
         str(tmp / "o.json"), "--report", str(report), "--session", str(session)],
        ["sessions", "export", str(session), "--to", str(tmp / "s1.ctxs"), "--state", str(tmp / "st")],
    ):  # fmt: skip
        proc = cli(*argv)
        assert proc.returncode == 0, proc.stderr
    return {"tmp": str(tmp), "archive": str(tmp / "s1.ctxs")}


# Verb -> its argv reading standard input (``{tmp}`` from the world fixture).
READERS: dict[str, list[str]] = {
    "run": ["run", "--pack", "builtin:default", "--model", "gpt-4o", "--session", "{tmp}/s-run",
            "--output", "{tmp}/o-run.json"],
    "compress": ["compress", "--command", "git status", "--input", "-", "--session", "{tmp}/s-compress"],
    "sessions-import": ["sessions", "import", "-", "--state", "{tmp}/st-import"],
    "report": ["report", "-"],
}  # fmt: skip


def _closed() -> None:  # `<&-`
    os.close(0)


def _write_only() -> None:  # `0>FILE`: a read is EBADF
    fd = os.open(os.devnull, os.O_WRONLY)
    os.dup2(fd, 0)
    os.close(fd)


def _bounded() -> None:
    """What a run that reads a device without end may take before it fails: 64 MiB of any
    file, 2 GiB of memory (instead of the disk and the machine's memory)."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 20, 64 << 20))
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def _run(argv: list[str], world: dict[str, str], preexec: Callable[[], None]) -> subprocess.CompletedProcess[str]:
    args = [a.format(**world) for a in argv]
    return subprocess.run(
        [sys.executable, "-m", "ctxrules.cli.main", *args],
        env={**os.environ, "PYTHONPATH": ENGINE},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        preexec_fn=preexec,
    )


def _one_error_line(proc: subprocess.CompletedProcess[str], words: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("ctxrules:")]
    assert lines and lines[-1].startswith("ctxrules: error: ") and words in lines[-1], proc.stderr


@pytest.mark.parametrize("verb", list(READERS))
def test_a_closed_standard_input_is_exit_2_in_one_line(world: dict[str, str], verb: str) -> None:
    """Started with `<&-`, Python's sys.stdin is None: reading it was `internal error:
    AttributeError: 'NoneType' object has no attribute 'buffer'`."""
    _one_error_line(_run(READERS[verb], world, _closed), "standard input is closed")


@pytest.mark.parametrize("verb", list(READERS))
def test_a_write_only_standard_input_is_exit_2_in_one_line(world: dict[str, str], verb: str) -> None:
    """`0>FILE`: the read fails with EBADF (compress and sessions import let it out as an
    internal error)."""
    _one_error_line(_run(READERS[verb], world, _write_only), "<stdin>: cannot read: ")


@pytest.mark.parametrize(
    "argv",
    [
        ["compress", "--command", "cat", "--input", "/dev/zero", "--session", "{tmp}/s-zero"],
        ["sessions", "import", "/dev/zero", "--state", "{tmp}/st-zero"],
    ],
    ids=["compress", "sessions-import"],
)
def test_a_device_as_the_input_is_refused_before_it_is_read(world: dict[str, str], argv: list[str]) -> None:
    """/dev/zero never ends: compress filled the session's vault with it (gigabytes a minute),
    sessions import read it until memory ran out; `run --input /dev/zero` was refused already."""
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    _one_error_line(_run(argv, world, _bounded), "/dev/zero: not a regular file")
    assert not any(Path(world["tmp"]).glob("s-zero/vault/.tmp-*"))


def _spilling_filter(session: Path) -> subprocess.Popen[bytes]:
    """`compress --input -` fed an output past the 8 MiB held in memory, once it has started to
    spill to the vault; the pipe stays open (the producer is still running)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ctxrules.cli.main", "compress", "--command", "make", "--input", "-",
         "--session", str(session)],
        env={**os.environ, "PYTHONPATH": ENGINE},
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdin is not None
    line = b"cc -c -o build/object.o src/object.c -Wall -Wextra -O2\n"
    proc.stdin.write(line * ((12 << 20) // len(line)))
    proc.stdin.flush()
    deadline = time.monotonic() + 60
    while not any(session.glob("vault/.tmp-*")):
        assert time.monotonic() < deadline and proc.poll() is None, "the output never spilled to the vault"
        time.sleep(0.05)
    time.sleep(0.3)  # the middle scan's thread is running by now
    return proc


def test_an_interrupted_filter_leaves_no_partial_vault_entry(tmp_path: Path) -> None:
    """Ctrl-C while `compress --input -` reads an output large enough to spill to the vault:
    the temporary entry (as large as what was read) stayed in the vault for good."""
    session = tmp_path / "s"
    proc = _spilling_filter(session)
    assert proc.stdin is not None and proc.stderr is not None
    proc.send_signal(signal.SIGINT)  # while it waits for more input
    proc.stdin.close()  # as Ctrl-C ends the producer of a pipeline too
    code = proc.wait(timeout=60)
    stderr = proc.stderr.read().decode()
    proc.stderr.close()
    assert code == 130, stderr
    assert not list(session.glob("vault/.tmp-*")), "a partial vault entry was left behind"


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stopped_filter_ends_at_once_and_leaves_no_partial_vault_entry(
    tmp_path: Path, signum: int, code: int
) -> None:
    """SIGTERM (`timeout`, a process manager) killed the filter mid-write, leaving a temporary
    vault entry as large as what was read; Ctrl-C that the kernel gave to the middle scan's
    thread went unnoticed while the main thread waited for input that the producer, still
    running, did not send."""
    session = tmp_path / "s"
    proc = _spilling_filter(session)
    proc.send_signal(signum)
    try:
        returned = proc.wait(timeout=30)  # the pipe is still open: the signal alone must end it
    finally:
        proc.kill()
        assert proc.stdin is not None and proc.stderr is not None
        proc.stdin.close()
        stderr = proc.stderr.read().decode()
        proc.stderr.close()
    assert returned == code, stderr
    assert not list(session.glob("vault/.tmp-*")), "a partial vault entry was left behind"


def test_helper_threads_leave_the_stop_signals_to_the_main_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    from ctxrules.compressors import large
    from ctxrules.threads import STOP_SIGNALS

    if not hasattr(signal, "pthread_sigmask"):
        pytest.skip("no per-thread signal masks on this platform")
    masks: list[set[int]] = []

    def scan(*args: object, **kwargs: object) -> None:
        masks.append(set(signal.pthread_sigmask(signal.SIG_BLOCK, [])))

    monkeypatch.setattr(large, "scan_middle", scan)
    large.scan_middle_soon(Path("unused"), (0, 0), 1, [], [])()
    assert masks and masks[0] >= STOP_SIGNALS
    assert not STOP_SIGNALS & set(signal.pthread_sigmask(signal.SIG_BLOCK, []))  # this thread: untouched


def test_ctrl_c_while_the_verb_is_imported_is_130_not_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    """main() imports the verb's modules before run() (to freeze them out of the collector's
    passes); a Ctrl-C landing there printed a traceback and exited -2."""
    import importlib

    from ctxrules.cli import main as cli_main

    def interrupted(name: str, package: str | None = None) -> object:
        raise KeyboardInterrupt

    monkeypatch.setattr(importlib, "import_module", interrupted)
    with pytest.raises(SystemExit) as ended:
        cli_main.main(["compress", "--", "true"])
    assert ended.value.code == 130
