"""``ctxrules compress --max-output``: an endless command (``yes``, a test stuck in a loop) or an
endless input filled the session's vault on disk without limit (memory stayed bounded). The
first SIZE bytes are kept; the printed result says the output was cut; filter mode stops
reading there (exit 0) and proxy mode lets CMD run to its end and exits with its status."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO

from ctxrules.compressors.large import MAX_BYTES, Capture
from ctxrules.stores.filesystem import FilesystemStore
from ctxrules.vault import Vault

ENV = {**os.environ, "PYTHONPATH": str(REPO / "engine")}
CLI = [sys.executable, "-m", "ctxrules.cli.main", "compress"]
MIB = 1 << 20


def _vault_files(state: Path) -> list[Path]:
    return [p for p in (state / "default" / "vault").rglob("*") if p.is_file()]


def test_an_endless_input_is_read_up_to_the_cap_and_the_writer_is_let_go(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with subprocess.Popen(["yes"], stdout=subprocess.PIPE) as yes:
        assert yes.stdout is not None
        done = subprocess.run(
            [*CLI, "--state", str(state), "--command", "yes", "--input", "-", "--max-output", "3M"],
            stdin=yes.stdout,
            capture_output=True,
            env=ENV,
            timeout=120,
        )
        yes.stdout.close()
        assert yes.wait(timeout=30) == -signal.SIGPIPE  # its reader went away: it ends
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith(b"\n[ctxrules: output cut at 3,145,728 bytes (--max-output); the rest was not read]\n")
    assert b"warning: output cut at 3,145,728 bytes" in done.stderr
    [entry] = _vault_files(state)
    assert entry.read_bytes() == b"y\n" * (3 * MIB // 2)  # the first 3 MiB, exactly
    assert f"vault://{entry.name}".encode() in done.stdout


def test_a_command_past_the_cap_runs_to_its_end_and_its_status_passes_through(tmp_path: Path) -> None:
    state = tmp_path / "state"
    script = "yes 'a line of output' | head -c 10000000; exit 3"
    done = subprocess.run(
        [*CLI, "--state", str(state), "--max-output", "2M", "--", "sh", "-c", script],
        capture_output=True,
        env=ENV,
        timeout=120,
    )
    assert done.returncode == 3, done.stderr
    dropped = 10_000_000 - 2 * MIB
    assert done.stdout.endswith(
        f"\n[ctxrules: output cut at 2,097,152 bytes (--max-output); {dropped:,} more bytes were not kept]\n".encode()
    )
    [entry] = _vault_files(state)
    assert entry.stat().st_size == 2 * MIB


def test_an_endless_command_keeps_the_disk_bounded_until_it_is_stopped(tmp_path: Path) -> None:
    """``compress -- yes`` ends when the agent's timeout stops it (SIGTERM, forwarded to yes):
    meanwhile the vault holds no more than the cap, and the result is printed with the note."""
    state = tmp_path / "state"
    with subprocess.Popen(
        [*CLI, "--state", str(state), "--max-output", "1M", "--", "yes"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
    ) as proc:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and sum(p.stat().st_size for p in _vault_files(state)) < MIB:
            time.sleep(0.05)
        time.sleep(0.5)  # yes prints on: gigabytes a second
        assert sum(p.stat().st_size for p in _vault_files(state)) == MIB
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert b"[ctxrules: output cut at 1,048,576 bytes (--max-output); " in out
    [entry] = _vault_files(state)
    assert entry.stat().st_size == MIB


@pytest.mark.parametrize("size", ["0", "-1", "1.5G", "lots"])
@pytest.mark.parametrize(
    ("mode", "code"),
    [(["--", "true"], 125), (["--command", "make", "--input", "-"], 2)],  # 125: 2 could be CMD's own
    ids=["proxy", "filter"],
)
def test_a_bad_size_is_a_usage_error(tmp_path: Path, size: str, mode: list[str], code: int) -> None:
    done = subprocess.run(
        [*CLI, "--max-output", size, *mode],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=tmp_path,
        timeout=120,
        input="",
    )
    assert done.returncode == code
    assert "--max-output: expected a size of at least 1 byte" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_cap_cuts_held_output_too_and_leaves_room_for_the_benchmarks(tmp_path: Path) -> None:
    vault = Vault.of(FilesystemStore(tmp_path), str(tmp_path / "s"))
    capture = Capture(vault.open_writer, max_bytes=10)
    for chunk in (b"12345", b"678", b"90abc", b"", b"def"):
        capture.write(chunk)
    assert capture.finish() == b"1234567890"
    assert capture.dropped == 6
    assert MAX_BYTES >= 1 << 30  # bench_memory streams 200 MB through compress


# --- a vault that fills up mid-spill -------------------------------------------------------------

# Runs argv with the file size limit (RLIMIT_FSIZE, as a full disk: writes past it fail) and
# prints the peak memory (kB) of the process it ran, whatever it spawned in turn.
_LIMITED = (
    "import resource, signal, subprocess, sys\n"
    "def limit():\n    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
    "    resource.setrlimit(resource.RLIMIT_FSIZE, (4 << 20, 4 << 20))\n"
    "code = subprocess.run(sys.argv[1:], preexec_fn=limit).returncode\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, code, file=sys.stderr)\n"
)


@pytest.mark.parametrize("mode", ["filter", "proxy"])
def test_a_vault_that_fills_up_mid_spill_prints_the_output_unchanged_in_bounded_memory(
    tmp_path: Path, mode: str
) -> None:
    """The vault entry of a 40 MB output stops growing at 4 MB (a full disk). The output was
    then held whole and compressed in memory (1.3 GB here) and, in filter mode, not printed at
    all (exit 2): read from stdin, it was lost. Now what reached the entry and everything after
    it is printed as it comes, unchanged, with a warning; nothing is left in the vault."""
    data = b"".join(b"some line of build output %d\n" % i for i in range(1_400_000))
    source = tmp_path / "out.txt"
    source.write_bytes(data)
    state = tmp_path / "state"
    if mode == "filter":
        argv = [*CLI, "--state", str(state), "--command", "x", "--input", "-"]
    else:
        argv = [*CLI, "--state", str(state), "--", "cat", str(source)]
    with source.open("rb") as stdin:
        done = subprocess.run(
            [sys.executable, "-c", _LIMITED, *argv], stdin=stdin, capture_output=True, env=ENV, timeout=300
        )
    *notes, usage = done.stderr.decode().strip().splitlines()
    peak_kb, code = map(int, usage.split())
    assert code == 0, notes
    assert done.stdout == data
    assert any("warning: output not compressed: cannot write to the vault" in n for n in notes), notes
    assert peak_kb < 300_000, peak_kb
    assert _vault_files(state) == []


def test_a_capture_whose_vault_fails_passes_everything_on_in_order(tmp_path: Path) -> None:
    from ctxrules.errors import CtxrulesError

    class _Full:
        """A vault entry that takes 5 bytes, then fails like a full disk."""

        def __init__(self) -> None:
            self.path = str(tmp_path / "entry")
            self.size = 0
            self.discarded = False
            Path(self.path).write_bytes(b"")

        def write(self, data: bytes) -> None:
            taken = data[: max(0, 5 - self.size)]
            with open(self.path, "ab") as handle:
                handle.write(taken)
            self.size += len(taken)
            if len(taken) < len(data):
                raise CtxrulesError("No space left on device")

        def discard(self) -> None:
            self.discarded = True

    entry = _Full()
    passed: list[bytes] = []
    capture = Capture(
        lambda: entry,  # type: ignore[arg-type,return-value]
        limit=4,
        window=2,
        limit_lines=4,
        window_lines=2,
        overflow=passed.append,
    )
    for chunk in (b"abc", b"defgh", b"ij", b"k"):
        capture.write(chunk)
    assert capture.overflowed and b"".join(passed) == b"abcdefghijk"
    assert capture.finish() == b"" and entry.discarded
    assert str(capture.error) == "No space left on device"
