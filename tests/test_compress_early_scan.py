"""The middle of a large output searched while it is still being written
(ctxrules.compressors.large.EarlyScan): what the scan that follows the writer finds must be what
a scan of the finished entry finds, whatever the pieces the output arrives in; a scan for the
patterns of a rule that is not chosen in the end is stopped and done again for the right one."""

from __future__ import annotations

import hashlib
import random
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

import ctxrules.compressors.large as large_mod
from ctxrules.compressors.api import compress_large, early_scan
from ctxrules.compressors.failures import FailurePattern, compile_failures
from ctxrules.compressors.large import Capture, EarlyScan, Growing, Large, newlines, scan_middle
from ctxrules.patterns import Pattern
from ctxrules.patterns import compile as pattern
from ctxrules.plugins import default_registry
from ctxrules.vault import Vault, VaultError


def _output(rnd: random.Random) -> bytes:
    """Log lines with failures here and there (near the windows' edges too), some non-ASCII
    lines, characters RE2 reads differently, empty lines and a few lines longer than blocks."""
    lines = []
    count = rnd.randrange(3000, 9000)
    for i in range(count):
        roll = rnd.random()
        # Failures denser near the end: where the middle meets the tail window.
        if roll < (0.004 if i < count - 400 else 0.05):
            lines.append(f"src/m{i}.py:3: error: failed {i}")
        elif roll < 0.005:
            lines.append(f"Exit code {i % 7}")
        elif roll < 0.007:
            lines.append("")
        elif roll < 0.008:
            lines.append(f"{i} caf\u00e9 ok")
        elif roll < 0.009:
            lines.append(f"{i} tab\x0bvertical ok")
        elif roll < 0.0095:
            lines.append("x" * rnd.randrange(2000, 30_000) + (" error inside" if rnd.random() < 0.5 else ""))
        else:
            lines.append(f"{i} ok " + "z" * rnd.randrange(0, 120))
    return ("\n".join(lines) + ("\n" if rnd.random() < 0.5 else "")).encode()


def _started(
    found: list[EarlyScan], failures: Sequence[FailurePattern], keep: Sequence[Pattern], block: int
) -> Callable[[Path, int, int, Growing], EarlyScan]:
    def start(path: Path, begin: int, first_line: int, growing: Growing) -> EarlyScan:
        scan = EarlyScan(path, begin, first_line, failures, keep, growing, block=block)
        found.append(scan)
        return scan

    return start


@pytest.mark.parametrize("seed", range(16))
def test_a_scan_following_the_writer_finds_what_a_scan_of_the_finished_entry_finds(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Blocks read before the end was known: the test must see the scan follow the writer.
    early_reads: list[int] = []
    next_read = Growing.next_read

    def recording(self: Growing, pos: int, block: int) -> tuple[int, bool]:
        answer = next_read(self, pos, block)
        if self.end is None:
            early_reads.append(pos)
        return answer

    monkeypatch.setattr(Growing, "next_read", recording)
    rnd = random.Random(seed)
    data = _output(rnd)
    failures = compile_failures(
        [{"pattern": r"\berror\b", "before": rnd.randrange(0, 4), "after": rnd.randrange(0, 3)}]
    )
    keep = (pattern(r"Exit code (\d+)"),)
    block = rnd.choice([512, 1024, 4096])
    window = rnd.choice([2000, 8000, 20_000])
    scans: list[EarlyScan] = []
    capture = Capture(
        Vault(tmp_path / "vault").open_writer,
        limit=2 * window + rnd.randrange(0, 30_000),
        window=window,
        early=_started(scans, failures, keep, block),
    )
    at, waited = 0, False
    while at < len(data):  # pieces of every size, as a pipe hands them over
        piece = rnd.choice([1, 7, 300, 4096, 65536, 200_000])  # a pipe read takes up to 1 MiB
        capture.write(data[at : at + piece])
        at += piece
        if rnd.random() < 0.05 or at > len(data) - 4 * window:
            time.sleep(0.0005)  # let the scan catch up now and then, and near the end
        if not waited and at > len(data) - 2 * window:
            # Once, before the end: the scan thread gets its turn however loaded the machine
            # (a CI machine busy with other tests left it none, and the scan never ran ahead).
            waited, until = True, time.monotonic() + 10
            while not early_reads and time.monotonic() < until:
                time.sleep(0.001)
    large = capture.finish()
    assert isinstance(large, Large) and large.early is scans[0]
    result = large.early.take(failures, keep)
    assert result is not None
    expected = scan_middle(Path(large.writer.path), large.middle, large.head_lines + 1, failures, keep, block=block)
    assert result() == expected
    assert early_reads, "the scan never ran ahead of the end"
    assert large.writer.commit() == hashlib.sha256(data).hexdigest()


def _thread_ends(name: str = "ctxrules-middle", within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(t.name == name and t.is_alive() for t in threading.enumerate()):
            return True
        time.sleep(0.01)
    return False


def test_a_scan_for_other_patterns_is_stopped_and_the_right_ones_are_searched(tmp_path: Path) -> None:
    # The rule expected while the command ran (exit 0) looks for "error"; it failed, and the
    # rule for a failure looks for "FATAL" instead: the early result is not used.
    pack = {
        "compressors": [
            {
                "id": "ok",
                "match": {"argv": ["job"], "exit_code": 0},
                "failures": [r"\berror\b"],
                "steps": [{"use": "head", "with": {"lines": 5}}],
            },
            {
                "id": "failed",
                "match": {"argv": ["job"], "exit_code": "nonzero"},
                "failures": [r"\bFATAL\b"],
                "steps": [{"use": "head", "with": {"lines": 5}}],
            },
        ]
    }
    lines = [f"2026-12-01 INFO step {i} done" for i in range(60_000)]
    lines[30_000] = "src/a.py:1: error: not this one"
    lines[31_000] = "FATAL the disk is gone"
    data = ("\n".join(lines) + "\n").encode()
    registry = default_registry()
    for code, wanted, unwanted in (
        (1, "FATAL the disk is gone", "error: not this one"),
        (0, "error: not this one", "FATAL"),
    ):
        vault = Vault(tmp_path / f"vault{code}")
        capture = Capture(
            vault.open_writer, limit=200_000, window=50_000, early=early_scan(pack, "job", registry=registry)
        )
        for at in range(0, len(data), 65536):
            capture.write(data[at : at + 65536])
        large = capture.finish()
        assert isinstance(large, Large) and large.early is not None
        result = compress_large(pack, "job", large, code, registry=registry)
        assert result is not None, code
        assert wanted in result.text and unwanted not in result.text
        large.writer.discard()
        assert _thread_ends()


def test_an_early_scan_that_failed_is_done_again_by_whoever_takes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        def result() -> large_mod.Middle:
            raise RuntimeError("the scan thread died")

        return result

    failures = compile_failures([r"\berror\b"])
    monkeypatch.setattr(large_mod, "scan_middle_soon", broken)
    lines = [f"line {i} ok" for i in range(20_000)]
    lines[10_000] = "x.c:1: error: here"
    data = ("\n".join(lines) + "\n").encode()
    scans: list[EarlyScan] = []
    capture = Capture(
        Vault(tmp_path / "v").open_writer, limit=50_000, window=10_000, early=_started(scans, failures, (), 1024)
    )
    capture.write(data)
    large = capture.finish()
    assert isinstance(large, Large) and large.early is not None
    result = large.early.take(failures, ())
    assert result is not None
    kept, lost = result()
    large.writer.discard()
    assert kept == {10_001: "x.c:1: error: here"} and lost == []


def test_a_discarded_or_failed_capture_stops_its_scan(tmp_path: Path) -> None:
    failures = compile_failures([r"\berror\b"])
    data = ("\n".join(f"line {i} ok" for i in range(50_000)) + "\n").encode()
    scans: list[EarlyScan] = []
    capture = Capture(
        Vault(tmp_path / "v").open_writer, limit=50_000, window=10_000, early=_started(scans, failures, (), 1024)
    )
    capture.write(data[:100_000])  # spilled: the scan waits for more
    assert scans
    capture.discard()
    assert _thread_ends()

    scans.clear()
    capture = Capture(
        Vault(tmp_path / "w").open_writer, limit=50_000, window=10_000, early=_started(scans, failures, (), 1024)
    )
    capture.write(data[:100_000])
    writer = capture._writer
    assert writer is not None

    def full(_data: bytes) -> None:
        raise VaultError("no space left on device")

    writer.write = full  # type: ignore[method-assign, assignment]
    capture.write(data[100_000:])
    assert capture.finish() == data  # held in memory, whole
    assert _thread_ends()


def test_a_blob_being_synced_early_still_commits_and_discards(tmp_path: Path) -> None:
    vault = Vault(tmp_path / "v")
    data = ("\n".join(f"line {i}" for i in range(100_000)) + "\n").encode()
    for finish in ("commit", "discard"):
        capture = Capture(vault.open_writer, limit=100_000, window=20_000)
        capture.write(data)
        large = capture.finish()  # starts the sync on a thread
        assert isinstance(large, Large)
        if finish == "commit":
            assert large.writer.commit() == hashlib.sha256(data).hexdigest()
            assert vault.get(large.vault_id) == data
        else:
            capture.discard()
        assert _thread_ends("ctxrules-blob-sync")
    assert not [p for p in vault.root.rglob(".tmp-*")]


def test_an_early_scan_that_cannot_start_leaves_the_capture_as_it_was(tmp_path: Path) -> None:
    def cannot(path: Path, begin: int, first_line: int, growing: Growing) -> EarlyScan:
        raise RuntimeError("can't start new thread")

    vault = Vault(tmp_path / "v")
    data = ("\n".join(f"line {i}" for i in range(50_000)) + "\n").encode()
    capture = Capture(vault.open_writer, limit=50_000, window=10_000, early=cannot)
    for at in range(0, len(data), 4096):
        capture.write(data[at : at + 4096])
    large = capture.finish()
    assert isinstance(large, Large) and large.early is None and capture.error is None
    assert large.writer.commit() == hashlib.sha256(data).hexdigest()


def test_a_write_back_error_met_by_the_early_sync_fails_the_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The kernel reports a write-back error once per open file, to the first fsync: the early
    # sync's. The commit must still refuse to make the blob visible.
    import errno
    import os

    real_fsync = os.fsync
    calls: list[int] = []

    def failing_once(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 1:
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing_once)
    vault = Vault(tmp_path / "v")
    data = ("\n".join(f"line {i}" for i in range(100_000)) + "\n").encode()
    capture = Capture(vault.open_writer, limit=100_000, window=20_000)
    capture.write(data)
    large = capture.finish()
    assert isinstance(large, Large)
    with pytest.raises(VaultError, match="Input/output error"):
        large.writer.commit()
    assert calls and not vault.exists(hashlib.sha256(data).hexdigest())
    capture.discard()


@pytest.mark.parametrize("line", [0, 1, 2, 31, 47, 48, 49, 120, 5000])
def test_newlines_counts_what_bytes_count_counts_whatever_the_line_length(line: int) -> None:
    rnd = random.Random(line)
    for size in (0, 1, 4095, 16_383, 16_384, 100_000, 1 << 20):
        if line == 0:  # lines of every length, newlines bunched and sparse
            data = bytes(rnd.choice(b"ab\n") if rnd.random() < 0.5 else 97 for _ in range(size))
        else:
            data = ((b"x" * (line - 1) + b"\n") * (size // line + 1))[:size]
        assert newlines(data) == data.count(b"\n"), (line, size)


def test_a_followed_capture_counts_a_block_from_the_marks_of_the_pieces_inside(tmp_path: Path) -> None:
    # Pieces larger than the scan's blocks (a pipe read takes up to 1 MiB): every block's count
    # is still exact, however the block falls across the capture's pieces and marks.
    rnd = random.Random(7)
    data = b"".join(b"y" * rnd.randrange(0, 300) + b"\n" for _ in range(40_000))
    growing = Growing(0)
    sizes: list[int] = []
    counts: list[int] = []
    at = total = 0
    while at < len(data):
        piece = data[at : at + rnd.choice([1000, 70_000, 300_000, 1 << 20])]
        mark = 0
        while mark < len(piece):  # as Capture._stream marks them
            part = piece[mark : mark + 65536]
            total += part.count(b"\n")
            mark += len(part)
            sizes.append(at + mark)
            counts.append(total)
        at += len(piece)
    growing.grew(sizes, counts)
    offset = 0
    while offset < len(data):  # ascending, as a scan asks
        end = min(len(data), offset + rnd.choice([10, 5000, 65536, 100_000, 1 << 20]))
        assert growing.count_newlines(data[offset:end], offset) == data[offset:end].count(b"\n")
        offset = end
