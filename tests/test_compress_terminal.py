"""What ``strip_ansi`` leaves of terminal output (docs/compressors.md, "Terminal control
sequences"): control strings go with their bodies, 8-bit controls count, a string never closed
costs at most the rest of its line, and a carriage-return redraw never loses a line's text."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO

from ctxrules.compressors.failures import compile_failures, failure_lines
from ctxrules.compressors.lines import Line, Lines, RunInfo, source_range, without_escapes
from ctxrules.plugins import default_registry

ENGINE = str(REPO / "engine")
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk" * 2000  # 120 KB of base64


def lines_of(*texts: str) -> Lines:
    return Lines([Line(t, (i, i)) for i, t in enumerate(texts, 1)], RunInfo("cat", ("cat",), 0, False, len(texts)))


def act(name: str, given: Lines, **options: Any) -> list[str]:
    return list(default_registry().actions[name].configure(options)(given))


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("img \x1bPq#0;2;0;0;0#0~~@@vv-#0~~\x1b\\ ok", "img  ok"),  # sixel image (DCS)
        (f"\x1b_Ga=T,f=100;{PNG}\x1b\\done", "done"),  # kitty graphics (APC)
        ("a\x1bXstart of string\x1b\\b", "ab"),  # SOS
        ("a\x1b^privacy message\x1b\\b", "ab"),  # PM
        ("\x1bPtmux;\x1b\x1b]52;c;aGVsbG8=\x07\x1b\\copied", "copied"),  # tmux passthrough
        ("\x1b]0;title\x07a", "a"),  # OSC closed by BEL
        ("\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\", "link"),  # OSC closed by ST
        ("\x9b1;31mred\x9b0m", "red"),  # 8-bit CSI
        ("\x9d8;;http://x\x9clink\x9d8;;\x9c", "link"),  # 8-bit OSC and ST
        (f"\x90q#0~~\x9cok \x9fGa=T;{PNG}\x9cyes", "ok yes"),  # 8-bit DCS, APC
        ("\x1b[1mbold\x1b(B\x1b[m plain", "bold plain"),  # tput sgr0's charset reset
        ("\x1b7\x1b[1;1Hx\x1b8\x1b=", "x"),  # save/restore cursor, keypad mode
        ("cut short\x1b[12", "cut short"),  # a CSI without its final byte
    ],
)
def test_control_sequences_go_with_their_bodies(raw: str, shown: str) -> None:
    assert act("strip_ansi", lines_of(raw)) == [shown]
    assert without_escapes(raw) == shown  # what put-back failure lines and failure patterns see


def test_a_string_across_lines_leaves_one_line_standing_for_them() -> None:
    """A terminal prints nothing of a DCS body, newlines included: the text before and after
    it make one line, which stands for every line the string covered (no marker needed)."""
    given = lines_of("image:\x1bPq#0;2;0;0;0", "#0~~~~-", "#0~~~~\x1b\\ shown", "next")
    out = act("strip_ansi", given)
    assert out == ["image: shown", "next"]
    assert [source_range(line) for line in out] == [(1, 3), (4, 4)]
    kept = Lines([given[0], given[2], given[3]], given.run)  # an earlier step dropped line 2
    [joined, _] = act("strip_ansi", kept)
    assert isinstance(joined, Line) and joined.ranges() == ((1, 1), (3, 3))


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        (["a\x1bPno end", "kept 1", "kept 2"], ["a", "kept 1", "kept 2"]),  # to the end of its line
        (["x\x1bPjunk\x1b[31mred\x1b[0m"], ["xred"]),  # abandoned for another escape
        (["x\x1b_junk\x18y", "z\x90junk\x1az"], ["xy", "zz"]),  # cancelled by CAN, SUB
        (["a\x1bPno end", "line\x1b[1m 2"], ["a", "line 2"]),  # an escape lines later: not it
        (["a\x1b]0;no end", "b"], ["a", "b"]),
    ],
)
def test_a_string_never_closed_costs_at_most_the_rest_of_its_line(raw: list[str], shown: list[str]) -> None:
    out = act("strip_ansi", lines_of(*raw))
    assert out == shown
    assert [source_range(line) for line in out] == [(i, i) for i in range(1, len(raw) + 1)]


def test_twenty_megabytes_after_a_lone_dcs_are_quick_and_kept() -> None:
    body = [
        f"line {i} of the build log, padded with text to be a hundred characters long ......." for i in range(200_000)
    ]
    start = time.perf_counter()
    out = act("strip_ansi", lines_of("start \x1bPq" + "A" * 1000, *body))
    assert time.perf_counter() - start < 10  # about 0.5 s; a quadratic scan takes hours
    assert out[0] == "start " and out[1:] == body


def test_many_strings_never_closed_are_linear() -> None:
    """Each 8-bit DCS below looks for its end; were each to look to the end of the output,
    20 MB would take hours."""
    start = time.perf_counter()
    out = act("strip_ansi", lines_of(*(["\x90" + "q" * 99] * 200_000)))
    assert time.perf_counter() - start < 10
    assert set(out) == {""}


def test_a_failure_line_in_8_bit_colours_is_still_a_failure_line() -> None:
    patterns = compile_failures(["^FAILED "])
    assert failure_lines(patterns, ["ok", "\x9b31mFAILED\x9b0m test_x"]) == [2]


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("abc\r", "abc\r"),  # CRLF: left as it is
        ("abc\r\r", "abc\r\r"),  # \r\r\n from a pseudo-terminal
        ("Compiling foo\r          \r", "Compiling foo"),  # cleared with spaces at the end
        ("a 50%\ra 100%, done.\r\r", "a 100%, done."),
        ("10%\r50%\r100% done", "100% done"),  # the last state of a progress bar
        ("downloading 10%\rdone", "done"),  # not the terminal's "donenloading 10%"
        ("\x1b[2K\rCompiling foo\r\x1b[K", "Compiling foo"),
    ],
)
def test_a_redraw_keeps_its_last_state_and_never_loses_the_text(raw: str, shown: str) -> None:
    assert act("strip_ansi", lines_of(raw)) == [shown]
    assert act("strip_ansi", lines_of(raw), carriage_returns=False) == [without_escapes(raw)]


def test_collapse_progress_keeps_a_bar_ended_by_two_carriage_returns() -> None:
    out = act("collapse_progress", lines_of("x", "Downloading 10%\rDownloading 100%\r\r", "y"))
    assert out == ["x", "Downloading 100%", "y"]


# --- through the CLI ---------------------------------------------------------------------------

SCREEN = (
    "building\n"
    f"\x1b_Ga=T,f=100;{PNG}\x1b\\\n"
    "chart:\x1bPq#0;2;0;0;0\n#0~~~~-\n#0~~~~\x1b\\ (sixel)\n"
    "\x9b32mgreen\x9b0m\n"
    "Downloading 10%\rDownloading 100%\r\r\n"
    "windows line\r\n"
    "stray \x1bPjunk\n"
    "done\n"
)
# The image's line is blank, the sixel's three lines are one; generic's squeeze_blank then trims
# trailing whitespace (the \r of CRLF too).
SHOWN = ["building", "", "chart: (sixel)", "green", "Downloading 100%", "windows line", "stray", "done"]


def ctxrules(*argv: str, tmp: Path) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONPATH": ENGINE, "CTXRULES_STATE": str(tmp / "state")}
    base = [sys.executable, "-m", "ctxrules.cli.main", *argv]
    return subprocess.run(base, capture_output=True, env=env, cwd=tmp, timeout=120, check=False)


def test_filter_mode_shows_what_a_terminal_shows(tmp_path: Path) -> None:
    (tmp_path / "screen.log").write_bytes(SCREEN.encode())
    proc = ctxrules("compress", "--command", "cat screen.log", "--input", "screen.log", tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode().split("\n") == [*SHOWN, ""]


def test_proxy_mode_shows_what_a_terminal_shows(tmp_path: Path) -> None:
    (tmp_path / "screen.log").write_bytes(SCREEN.encode())
    proc = ctxrules("compress", "--", "sh", "-c", "cat screen.log; exit 3", tmp=tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout.decode().split("\n") == [*SHOWN, ""]


def test_filter_mode_on_twenty_megabytes_after_a_lone_dcs(tmp_path: Path) -> None:
    line = "line {} of the build log, padded with text to be a hundred characters long .........\n"
    data = "start \x1bPq" + "A" * 1000 + "\n" + "".join(line.format(i) for i in range(200_000)) + "error: the end\n"
    (tmp_path / "big.log").write_text(data, encoding="utf-8")
    start = time.perf_counter()
    proc = ctxrules("compress", "--command", "cat big.log", "--input", "big.log", tmp=tmp_path)
    assert time.perf_counter() - start < 60, "about 2 s"
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.decode()
    assert out.startswith("start\n" + line.format(0)) and out.endswith("error: the end\n")
    assert "AAAA" not in out and "[ctxrules:elided" in out
