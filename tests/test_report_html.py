"""`ctxrules report`: the table, and the HTML page rendered in a real headless Chromium."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO

from ctxrules import Engine

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _report(tmp_path: Path) -> Path:
    history = json.loads((REPO / "rules" / "examples" / "agent-session.json").read_text())
    engine = Engine.load("builtin:default")
    result = engine.session(tmp_path / "s", model="gpt-4o", window=24000).prepare(history)
    path = tmp_path / "report.json"
    # A hostile string must come out escaped, not as markup.
    result.report["warnings"].append("<script>alert(1)</script> & <b>bold</b>")
    path.write_text(json.dumps(result.report))
    return path


def decode_png(data: bytes) -> tuple[int, int, int, list[bytes]]:
    """Rows of an 8-bit RGB/RGBA non-interlaced PNG (what Chromium writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and color in (2, 6)
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, bpp, rows


def test_report_table(tmp_path: Path, cli: Any) -> None:
    code, out, _ = cli("report", str(_report(tmp_path)))
    assert code == 0 and "before:" in out and "normalize.tool_pairs" in out


def test_report_rejects_a_file_that_is_not_a_report(tmp_path: Path, cli: Any) -> None:
    bad = tmp_path / "x.json"
    bad.write_text('{"hello": 1}')
    code, _, err = cli("report", str(bad))
    assert code == 2 and "not a ctxrules run report" in err


def test_html_is_self_contained_and_escaped(tmp_path: Path, cli: Any) -> None:
    out = tmp_path / "r.html"
    code, _, _ = cli("report", str(_report(tmp_path)), "--html", str(out))
    page = out.read_text()
    assert code == 0
    assert "<script" not in page and "&lt;script&gt;" in page
    for needle in ("http://", "https://", "src=", "@import", "url("):
        assert needle not in page, needle
    assert page.count("<svg") == 3  # two rings and the waterfall


@pytest.mark.skipif(
    not CHROMIUM and not os.environ.get("CTXRULES_REQUIRE_CHROMIUM"),
    reason="Debian's chromium is not installed (CI installs it)",
)
def test_html_renders_in_headless_chromium(tmp_path: Path, cli: Any) -> None:
    assert CHROMIUM, "CTXRULES_REQUIRE_CHROMIUM is set but chromium is missing"
    page = tmp_path / "r.html"
    cli("report", str(_report(tmp_path)), "--html", str(page))
    shot = tmp_path / "shot.png"
    proc = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--enable-logging=stderr",
            "--v=0",
            "--window-size=1000,1400",
            f"--screenshot={shot}",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = [ln for ln in proc.stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln or "net::ERR" in ln]
    assert console == []
    width, height, bpp, rows = decode_png(shot.read_bytes())
    assert (width, height) == (1000, 1400)
    pixels = [row[i : i + 3] for row in rows[::5] for i in range(0, len(row), bpp * 5)]
    assert len(set(pixels)) > 20, "the screenshot is (nearly) blank"
    # The emergency-tier colour of the 'before' ring is on the page.
    assert bytes.fromhex("c62828") in pixels


@pytest.mark.parametrize(
    ("where", "value"),
    [
        (("before", "utilization"), 10**400),
        (("before", "tokens"), 10**400),
        (("budget", "usable_window"), 10**400),
        (("stages", 0, "ms"), 10**400),
        (("stages", 0, "tokens_before"), -(10**400)),
    ],
    ids=["utilization", "tokens", "usable-window", "ms", "stage-tokens"],
)
def test_a_number_no_float_holds_is_exit_2_naming_where(
    tmp_path: Path, cli: Any, where: tuple[str | int, ...], value: int
) -> None:
    """A report whose number is past a float's range (an integer of 400 digits: valid JSON,
    within the schema) ended in `internal error: OverflowError` in the table or the page."""
    path = _report(tmp_path)
    data = json.loads(path.read_text())
    node = data
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    path.write_text(json.dumps(data))
    pointer = "/".join(map(str, where))
    for extra in ((), ("--html", str(tmp_path / "r.html"))):
        code, _, err = cli("report", str(path), *extra)
        assert code == 2, err
        assert f"at {pointer}: a number too large" in err and "internal error" not in err, err
    assert not (tmp_path / "r.html").exists()


def test_bidi_controls_in_report_strings_are_shown_as_escapes_on_the_page(tmp_path: Path, cli: Any) -> None:
    """An override (U+202E) in a session id reordered the rest of the page's line ("window
    ... usable ...") and an isolate in a warning reordered what followed it: the page now shows
    such a character as its escape, as the table does, and no raw control is left."""
    path = _report(tmp_path)
    data = json.loads(path.read_text())
    data["session"]["id"] = "run\u202e42"
    data["warnings"].append("step \u2067evil\x1b[2J")
    path.write_text(json.dumps(data))
    page = tmp_path / "r.html"
    code, _, err = cli("report", str(path), "--html", str(page))
    assert code == 0, err
    text = page.read_text(encoding="utf-8")
    assert "run\\u202e42" in text and "step \\u2067evil\\x1b[2J" in text
    assert not any(c in text for c in "\u202e\u2067\x1b")


def test_the_page_on_stdout_is_the_page_alone(tmp_path: Path, cli: Any) -> None:
    """`report R --html -` printed "wrote -" after the page, on the same stdout."""
    code, out, _ = cli("report", str(_report(tmp_path)), "--html", "-")
    assert code == 0 and out.endswith("</html>\n"), out[-80:]


def test_a_page_written_over_the_report_it_reads_is_refused(tmp_path: Path, cli: Any) -> None:
    """`report R.json --html R.json` (or a link to it) replaced the report with its page."""
    path = _report(tmp_path)
    before = path.read_text()
    (tmp_path / "link.json").symlink_to(path)
    for out in (path, tmp_path / "link.json"):
        code, _, err = cli("report", str(path), "--html", str(out))
        assert code == 2 and f"--html {out} is the report this run reads" in err, err
    assert path.read_text() == before


def test_report_with_stdout_closed_is_a_usage_error(tmp_path: Path) -> None:
    """`ctxrules report R >&-` was `internal error: AttributeError` (the table written to None);
    with `--html F` the page must not be written either when the command fails."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO / "engine") + os.pathsep + env.get("PYTHONPATH", "")
    path = _report(tmp_path)
    for extra in ((), ("--html", str(tmp_path / "r.html"))):
        proc = subprocess.run(
            [sys.executable, "-m", "ctxrules.cli.main", "report", str(path), *extra],
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            preexec_fn=lambda: os.close(1),
            timeout=60,
        )
        assert proc.returncode == 2 and "standard output is closed" in proc.stderr, proc.stderr
        assert "internal error" not in proc.stderr
    assert not (tmp_path / "r.html").exists()
