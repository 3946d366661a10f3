"""Headless Chromium for the tests of self-contained HTML pages (run report, eval, usage
dashboard): one screenshot, its pixels, and what the browser complained about."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from test_report_html import decode_png

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def require_chromium() -> str:
    """The browser, or a skip (a failure when CI requires it: CTXRULES_REQUIRE_CHROMIUM)."""
    if not CHROMIUM:
        if os.environ.get("CTXRULES_REQUIRE_CHROMIUM"):
            pytest.fail("CTXRULES_REQUIRE_CHROMIUM is set but chromium is missing")
        pytest.skip("Debian's chromium is not installed (CI installs it)")
    return CHROMIUM


def screenshot_pixels(page: Path, tmp_path: Path, *, width: int, height: int, every: int = 3) -> set[bytes]:
    """The RGB colours of a screenshot of ``page`` (sampled every ``every`` pixels), after
    asserting the browser rendered it without an error or a network request."""
    browser = require_chromium()
    shot = tmp_path / "shot.png"
    # The flags keep Chromium off the network it would otherwise reach for at start-up.
    proc = subprocess.run(
        [
            browser,
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
            f"--window-size={width},{height}",
            f"--screenshot={shot}",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not [ln for ln in proc.stderr.splitlines() if "Uncaught" in ln or "net::ERR" in ln]
    _, _, bpp, rows = decode_png(shot.read_bytes())
    return {row[i : i + 3] for row in rows[::every] for i in range(0, len(row), bpp * every)}
