"""``ctxrules usage report``: the dashboard from ledgers written for several sessions, models and
days, checked as a page and in headless Chromium."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from browser_kit import screenshot_pixels

from ctxrules import Engine
from ctxrules.budget.usage import TokenUsage
from ctxrules.cli.main import run as cli_run

UNTIL = "2026-03-10"


def at(day: int, hour: int) -> float:
    return datetime(2026, 3, day, hour, 15, tzinfo=UTC).timestamp()


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """Three root sessions (two models), one with a sub-agent, over five days."""
    root = tmp_path / "state"
    engine = Engine.load("builtin:default")
    alpha = engine.session(root / "alpha", model="gpt-4o", state_root=root)
    beta = engine.session(root / "beta", model="claude-sonnet-4-5", state_root=root)
    for day, hour in ((6, 9), (7, 10), (7, 14), (9, 9)):
        alpha.record_usage(
            TokenUsage.of(prompt=20_000, completion=800, cached=12_000), at=at(day, hour), tier="standard"
        )
    for day, hour in ((8, 22), (10, 3)):
        beta.record_usage(
            TokenUsage.of(prompt=50_000, completion=2_000, cache_write=30_000), at=at(day, hour), tier="reasoning"
        )
    worker = alpha.child("worker")
    worker.record_usage(TokenUsage.of(prompt=8_000, completion=400), at=at(9, 11), tier="simple")
    code = cli_run(
        [
            "usage",
            "add",
            "--session",
            str(root / "gamma"),
            "--state",
            str(root),
            "--model",
            "gpt-4o-mini",
            "--prompt",
            "1000",
            "--completion",
            "100",
            "--at",
            str(at(10, 8)),
        ]
    )
    assert code == 0
    # An older call outside a 7-day window.
    alpha.record_usage(TokenUsage.of(prompt=1_000, completion=10), at=at(1, 12))
    return root


def test_the_page_holds_every_section_and_the_totals(
    state: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "usage.html"
    assert (
        cli_run(["usage", "report", "--state", str(state), "--days", "7", "--until", UNTIL, "--html", str(page)]) == 0
    )
    assert "8 call(s) over 7 day(s)" in capsys.readouterr().out
    text = page.read_text()
    for needle in ("http://", "https://", "src=", "@import", "url(", "<script"):
        assert needle not in text, needle
    # Daily spend, per-model bars, heatmap, routing: four charts; one sparkline per root agent.
    assert text.count("<figure>") == 4 and text.count('class="spark"') == 3
    assert text.count('class="cell"') == 7 * 24
    for model in ("gpt-4o", "claude-sonnet-4-5", "gpt-4o-mini"):
        assert f"<td>{model}</td>" in text
    # Drill-down per session, the sub-agent named under its root.
    assert text.count("<details>") == 4 and "sub-agent of alpha" in text
    assert re.search(r"<h3>alpha</h3><p>5 call\(s\), \$[\d.]+, 1 sub-agent\(s\)", text)
    # Routing tiers: requests per tier.
    for tier, n in (("standard", 4), ("reasoning", 2), ("simple", 1), ("unrouted", 1)):
        assert f"<title>{tier}: {n}</title>" in text, tier
    # A Monday-09:00 call shows in its heatmap cell (2026-03-09 is a Monday).
    assert "Mon 09:00 UTC: 1 call(s)" in text


def test_text_summary_and_bad_arguments(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_run(["usage", "report", "--state", str(state), "--days", "30", "--until", UNTIL]) == 0
    out = capsys.readouterr().out
    assert out.startswith("30 day(s) to 2026-03-10 (UTC): 9 call(s)")
    assert "2026-03-01" in out and "model claude-sonnet-4-5" in out
    assert cli_run(["usage", "report", "--state", str(state / "nope")]) == 2
    assert cli_run(["usage", "report", "--state", str(state), "--until", "March"]) == 2


def test_the_dashboard_renders_in_headless_chromium(state: Path, tmp_path: Path) -> None:
    page = tmp_path / "usage.html"
    assert (
        cli_run(["usage", "report", "--state", str(state), "--days", "7", "--until", UNTIL, "--html", str(page)]) == 0
    )
    pixels = screenshot_pixels(page, tmp_path, width=1200, height=2400)
    # The daily bars (#2563eb), the model bars (#9333ea) and the routing bars (#16a34a) are drawn.
    for colour in ("2563eb", "9333ea", "16a34a"):
        assert bytes.fromhex(colour) in pixels, colour


def test_ledger_text_is_shown_as_escapes_and_a_lone_surrogate_still_writes_the_page(
    state: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A day ledger is a JSON-lines file anything may append to. A lone surrogate in a model
    # name ("\ud800") made the page unwritable (internal error: UnicodeEncodeError, an empty
    # file left behind), and a bidi override or a control went onto the page as it was.
    import json

    (day,) = [p for p in (state / "ledger" / "days").glob("2026-03-09.jsonl")]
    line = json.loads(day.read_text().splitlines()[0])
    evil = '<img src=x onerror=alert(1)>\u202egpt\x07\ud800"'
    line.update(id="hostile", model=evil, session=evil, root=evil, tier=evil)
    with day.open("a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
    page = tmp_path / "usage.html"
    args = ["usage", "report", "--state", str(state), "--days", "7", "--until", UNTIL, "--html", str(page)]
    assert cli_run(args) == 0, capsys.readouterr().err
    text = page.read_text(encoding="utf-8")
    assert "&lt;img src=x onerror=alert(1)&gt;\\u202egpt\\x07\\ud800&quot;" in text
    assert "<img" not in text and "\u202e" not in text and "\x07" not in text
