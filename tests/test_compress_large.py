"""Outputs too large to hold: ``ctxrules compress`` streams them into the vault and compresses
them from their head and tail windows (ctxrules.compressors.large), and every line the engine
must keep (failure lines, the exit-code line) is still found in the middle."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from ctxrules.compressors.api import compress_large, compress_text
from ctxrules.compressors.apply import split_output
from ctxrules.compressors.failures import compile_failures
from ctxrules.compressors.large import SPILL_BYTES, Capture, Large, scan_middle
from ctxrules.compressors.testing import check_invariants
from ctxrules.errors import CtxrulesError
from ctxrules.packs.validated import load_pack
from ctxrules.patterns import compile as pattern
from ctxrules.plugins import default_registry
from ctxrules.vault import Vault, VaultError, parse_markers

ENGINE = str(REPO / "engine")


def _log(lines: int, failures: dict[int, str], *, trailing: bool = True) -> bytes:
    out = []
    for i in range(1, lines + 1):
        out.append(failures.get(i, f"2026-12-01T10:00:00Z INFO worker[{i % 8}] processed item {i} status=ok"))
    text = "\n".join(out) + ("\n" if trailing else "")
    return text.encode("utf-8")


def _captured(vault: Vault, data: bytes, *, limit: int, window: int, piece: int = 4096) -> bytes | Large:
    capture = Capture(vault.open_writer, limit=limit, window=window)
    for start in range(0, len(data), piece):
        capture.write(data[start : start + piece])
    return capture.finish()


# --- the capture ------------------------------------------------------------------------------


def test_output_under_the_limit_stays_in_memory_and_writes_nothing(tmp_path: Path) -> None:
    vault = Vault(tmp_path / "vault")
    data = _log(100, {})
    assert _captured(vault, data, limit=len(data), window=len(data) // 2) == data
    assert not (tmp_path / "vault").exists()


@pytest.mark.parametrize("trailing", [True, False])
def test_large_output_is_in_the_vault_byte_for_byte_with_whole_line_windows(tmp_path: Path, trailing: bool) -> None:
    vault = Vault(tmp_path / "vault")
    data = _log(5000, {}, trailing=trailing)
    large = _captured(vault, data, limit=40_000, window=10_000)
    assert isinstance(large, Large)
    lines = data.split(b"\n")
    if trailing:
        lines.pop()
    assert large.total_lines == len(lines)
    assert large.trailing is trailing
    assert large.head == b"".join(line + b"\n" for line in lines[: large.head_lines])
    tail_lines = lines[large.tail_first - 1 :]
    assert large.tail == b"\n".join(tail_lines) + (b"\n" if trailing else b"")
    assert 0 < len(large.head) <= 10_000 and 0 < len(large.tail) <= 10_000
    assert data[large.middle[0] : large.middle[1]].count(b"\n") == large.tail_first - 1 - large.head_lines
    assert large.writer.commit() == hashlib.sha256(data).hexdigest()
    assert vault.get(large.vault_id) == data
    assert not [p for p in vault.root.iterdir() if p.name.startswith(".tmp-")]


@pytest.mark.parametrize("trailing", [True, False])
def test_short_lines_spill_by_lines_and_windows_hold_at_most_window_lines(tmp_path: Path, trailing: bool) -> None:
    """Far under the byte limit, an output of many short lines spills by its line count (each
    line held costs far more than its bytes), and each window keeps at most ``window_lines``
    whole lines, numbered as in the whole output."""
    vault = Vault(tmp_path / "vault")
    data = b"".join(b"x\n" if i % 7 else b"\n" for i in range(5000)) + (b"" if trailing else b"last")
    capture = Capture(vault.open_writer, limit=1_000_000, window=100_000, limit_lines=1000, window_lines=300)
    for start in range(0, len(data), 777):
        capture.write(data[start : start + 777])
    large = capture.finish()
    assert isinstance(large, Large)
    lines = data.split(b"\n")
    if trailing:
        lines.pop()
    assert large.total_lines == len(lines) and large.trailing is trailing
    assert large.head_lines == 300 and large.head == b"".join(line + b"\n" for line in lines[:300])
    assert large.tail_first == len(lines) - 300 + 1
    assert large.tail == b"\n".join(lines[-300:]) + (b"\n" if trailing else b"")
    assert data[large.middle[0] : large.middle[1]].count(b"\n") == large.tail_first - 1 - large.head_lines
    assert large.writer.commit() == hashlib.sha256(data).hexdigest() and vault.get(large.vault_id) == data


def test_compress_of_millions_of_empty_lines_keeps_a_failure_in_the_middle(tmp_path: Path) -> None:
    """3 MB of empty lines around one failure line: compressed from the windows (not held as
    three million lines), the failure line kept with its number, the vault holding the rest."""
    half = b"\n" * 1_500_000
    data = half + b"src/main.c:12:5: error: the one failure\n" + half
    (tmp_path / "out.txt").write_bytes(data)
    done = _cli("compress", "--command", "make", "--input", "out.txt", tmp=tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout.decode()
    assert "src/main.c:12:5: error: the one failure" in out.splitlines() and len(out) < 200_000
    markers = parse_markers(out)
    assert markers and markers[0].vault_id == hashlib.sha256(data).hexdigest()
    back = _cli("vault", "get", markers[0].vault_id, tmp=tmp_path)
    assert back.returncode == 0 and back.stdout == data


def test_a_vault_that_cannot_be_written_keeps_the_output_in_memory(tmp_path: Path) -> None:
    def refuse() -> object:
        raise VaultError("read-only session")

    capture = Capture(refuse, limit=1000, window=100)  # type: ignore[arg-type]
    data = _log(500, {})
    for start in range(0, len(data), 300):
        capture.write(data[start : start + 300])
    assert capture.finish() == data
    assert isinstance(capture.error, CtxrulesError)


def test_a_write_failure_midway_takes_back_what_reached_the_file(tmp_path: Path) -> None:
    vault = Vault(tmp_path / "vault")
    capture = Capture(vault.open_writer, limit=1000, window=100)
    data = _log(500, {})
    capture.write(data[:2000])  # spilled now
    writer = capture._writer
    assert writer is not None

    def full(_data: bytes) -> None:
        raise VaultError("no space left on device")

    writer.write = full  # type: ignore[method-assign]
    capture.write(data[2000:])
    assert capture.finish() == data
    assert not [p for p in vault.root.iterdir() if p.name.startswith(".tmp-")]


# --- the middle -------------------------------------------------------------------------------


@pytest.mark.parametrize("ascii_only", [True, False])
def test_middle_scan_finds_every_failure_line_and_its_context_across_blocks(tmp_path: Path, ascii_only: bool) -> None:
    failures = {
        500: "src/app.py:12: error: bad thing",
        1001: "Traceback (most recent call last):",
        1002: '  File "x.py", line 3, in <module>',
        1003: "ValueError: no",
        2999: "FATAL disk gone",
    }
    lines = [f"line {i} {'é' if not ascii_only and i % 7 == 0 else ''}ok" for i in range(1, 3001)]
    for number, text in failures.items():
        lines[number - 1] = text
    path = tmp_path / "out"
    data = ("\n".join(lines) + "\n").encode()
    path.write_bytes(data)
    patterns = compile_failures(
        [{"pattern": r"^\w*Error: ", "before": 2, "after": 0}, r"\berror\b", r"\bFATAL\b", r"^Traceback"]
    )
    kept, lost = scan_middle(path, (0, len(data)), 1, patterns, (), block=4096)
    assert lost == []
    for number, text in failures.items():
        assert kept[number] == text
    # the two lines before the exception are held (the widest context of any pattern is held
    # around every match: the engine then picks by pattern)
    assert {1001, 1002} <= set(kept) <= {n - k for n in failures for k in (0, 1, 2)}
    # a cap: the numbers of matches beyond it are still reported
    kept, lost = scan_middle(path, (0, len(data)), 1, patterns, (), max_kept=2, block=4096)
    matching = sorted(set(failures) - {1002})
    assert [n for n in kept if n in matching] == matching[:2] and lost == matching[2:]


def test_middle_scan_finds_exit_code_lines_and_a_match_in_a_line_too_long_to_hold(tmp_path: Path) -> None:
    huge = "x" * 50_000 + " ERROR in the middle of a huge line " + "y" * 50_000
    lines = ["ok"] * 10 + [huge] + ["ok"] * 10 + ["Process exited with code 3"] + ["ok"] * 5
    data = ("\n".join(lines) + "\n").encode()
    path = tmp_path / "out"
    path.write_bytes(data)
    kept, lost = scan_middle(
        path,
        (0, len(data)),
        1,
        compile_failures([r"\bERROR\b"]),
        (pattern(r"exited with code \d+"),),
        block=4096,
    )
    assert lost == [11]  # the huge line: found, counted, its text not held
    assert kept == {22: "Process exited with code 3"}


@pytest.mark.parametrize("seed", range(12))
def test_middle_scan_skipping_blocks_without_a_match_finds_what_a_line_by_line_scan_finds(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Blocks the RE2 pre-filter finds nothing in are counted and skimmed, not split: the
    # result must be the one of trying every line (no pre-filter), context lines and line
    # numbers across block edges included.
    import random

    import ctxrules.compressors.large as large

    rnd = random.Random(seed)
    lines = []
    for i in range(rnd.randrange(200, 3000)):
        roll = rnd.random()
        if roll < 0.004:
            lines.append(f"src/m{i}.py:3: error: failed {i}")
        elif roll < 0.006:
            lines.append("")
        else:
            lines.append(f"{i} ok " + "z" * rnd.randrange(0, 120))
    data = ("\n".join(lines) + ("\n" if seed % 2 else "")).encode()
    path = tmp_path / "out"
    path.write_bytes(data)
    context = {"before": rnd.randrange(0, 4), "after": rnd.randrange(0, 3)}
    patterns = compile_failures([{"pattern": r"\berror\b", **context}])
    block = rnd.choice([512, 1024, 4096])
    skimmed = scan_middle(path, (0, len(data)), 7, patterns, (), block=block)
    monkeypatch.setattr(large, "_prefilter", lambda patterns: None)
    assert scan_middle(path, (0, len(data)), 7, patterns, (), block=block) == skimmed
    assert sorted(n for n, t in skimmed[0].items() if "error" in t) == [
        7 + i for i, t in enumerate(lines) if "error" in t
    ]


@pytest.mark.parametrize("seed", range(8))
def test_the_middle_is_read_in_whole_lines_each_byte_once(tmp_path: Path, seed: int) -> None:
    # Blocks end at a line end and the partial line after it is read again with the next one
    # (not copied along): the pieces are the span's bytes, in order, at their offsets.
    import random

    from ctxrules.compressors.large import _blocks

    rnd = random.Random(seed)
    block = rnd.choice([64, 512, 4096])
    lines = [
        b"x" * rnd.choice([0, 1, 10, block // 2, block - 1, block, 2 * block]) for _ in range(rnd.randrange(50, 400))
    ]
    data = b"\n".join(lines) + (b"\n" if seed % 2 else b"")
    path = tmp_path / "out"
    path.write_bytes(data)
    start, end = rnd.randrange(0, 50), len(data) - rnd.randrange(0, 50)
    pieces = list(_blocks(path, (start, end), block))
    assert [kind for kind, _, _ in pieces] == ["lines"] * len(pieces)  # no line is over 4 blocks
    assert b"".join(bytes(piece) for _, piece, _ in pieces) == data[start:end]
    for _, piece, at in pieces[:-1]:
        assert data[at : at + len(piece)] == piece and piece.endswith(b"\n")


# --- compress_large against compress_text ------------------------------------------------------


def test_compressed_from_windows_keeps_the_engine_rules_on_the_whole_output(tmp_path: Path) -> None:
    pack = load_pack("builtin:default").data
    failures = {20_000 + 997 * k: f"src/module_{k}.py:{k}: error: failure number {k}" for k in range(5)}
    data = _log(60_000, failures)
    vault = Vault(tmp_path / "vault")
    large = _captured(vault, data, limit=1_000_000, window=200_000, piece=65536)
    assert isinstance(large, Large)
    result = compress_large(pack, "./build.sh", large, 1, registry=default_registry())
    assert result is not None and result.vault_id == hashlib.sha256(data).hexdigest()
    text = data.decode()
    assert check_invariants(text, result.text, 1, result.vault_id, 10) == []
    for line in failures.values():
        assert line in result.text.splitlines()
    originals = split_output(text)[0]
    large.writer.commit()
    for marker in parse_markers(result.text):
        assert marker.lines is not None
        first, last = marker.lines
        assert vault.get_lines(result.vault_id, first, last) == (
            "".join(line + "\n" for line in originals[first - 1 : last]).encode()
        )
    # lines that are not markers are original lines (the generic rule rewrites none here)
    shown = [line for line in result.text.splitlines() if not line.startswith("[ctxrules:elided")]
    assert set(shown) <= set(originals)
    # the same rule on the whole output, held in memory, keeps the same failure lines
    whole = compress_text(pack, "./build.sh", text, 1, registry=default_registry())
    assert whole is not None
    assert [x for x in whole.text.splitlines() if "error" in x] == [x for x in result.text.splitlines() if "error" in x]


# --- the real CLI ------------------------------------------------------------------------------


def _cli(*argv: str, tmp: Path) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONPATH": ENGINE, "CTXRULES_STATE": str(tmp / "state")}
    return subprocess.run(
        [sys.executable, "-m", "ctxrules.cli.main", *argv], capture_output=True, env=env, cwd=tmp, timeout=300
    )


def test_proxy_mode_streams_a_large_output_to_the_vault_and_its_markers_resolve(tmp_path: Path) -> None:
    lines = SPILL_BYTES // 60 + 20_000  # beyond the spill limit
    script = tmp_path / "big.py"
    script.write_text(
        "import sys\n"
        f"for i in range(1, {lines} + 1):\n"
        f"    if i == {lines // 2}:\n"
        "        sys.stdout.flush()\n"
        "        print(f'RuntimeError: the one failure in the middle, line {i}', file=sys.stderr, flush=True)\n"
        "    else:\n"
        "        print(f'2026-12-01T10:00:00Z INFO step {i} copied asset {i:08d}')\n"
        "sys.exit(3)\n",
        encoding="utf-8",
    )
    expected = "".join(
        f"RuntimeError: the one failure in the middle, line {i}\n"
        if i == lines // 2
        else f"2026-12-01T10:00:00Z INFO step {i} copied asset {i:08d}\n"
        for i in range(1, lines + 1)
    ).encode()
    done = _cli("compress", "--always", "--", sys.executable, str(script), tmp=tmp_path)
    assert done.returncode == 3, done.stderr
    out = done.stdout.decode()
    markers = parse_markers(out)
    assert markers and len(out) < 100_000
    vault_id = markers[0].vault_id
    # stderr merges into stdout in proxy mode: the vault holds both, in order, byte for byte
    assert vault_id == hashlib.sha256(expected).hexdigest()
    full = _cli("vault", "get", vault_id, tmp=tmp_path)
    assert full.returncode == 0, full.stderr
    assert full.stdout == expected
    assert f"RuntimeError: the one failure in the middle, line {lines // 2}" in out.splitlines()
    first, last = markers[0].lines or (0, 0)
    part = _cli("vault", "get", f"{vault_id}", "--lines", f"{first}:{last}", tmp=tmp_path)
    assert part.returncode == 0, part.stderr
    originals = expected.split(b"\n")
    assert part.stdout == b"".join(line + b"\n" for line in originals[first - 1 : last])
    leftovers = list((tmp_path / "state").rglob(".tmp-*"))
    assert leftovers == []


def test_filter_mode_on_a_large_output_that_no_rule_shrinks_prints_it_whole(tmp_path: Path) -> None:
    data = os.urandom(SPILL_BYTES // 2).hex().encode() + b"\n"  # one long line: nothing to drop
    source = tmp_path / "captured.txt"
    source.write_bytes(data)
    done = _cli("compress", "--command", "cat blob", "--input", str(source), tmp=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == data
    vault_dir = tmp_path / "state" / "default" / "vault"
    assert not vault_dir.exists() or not [p for p in vault_dir.rglob("*") if p.is_file()]
