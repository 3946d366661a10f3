"""A run report as one self-contained HTML page: inline CSS and SVG, no script, no network.

Shows a utilization ring (before and after, with the tier), tokens per stage as a waterfall,
cache information, vault items and warnings. Every value from the report is escaped, control
characters and bidirectional marks shown as their escapes.
"""

from __future__ import annotations

import math
from typing import Any

from ctxrules.cli.tables import read_back_command
from ctxrules.printable import printable_html as escape

TIER_COLORS = {"below": "#2e7d32", "monitor": "#558b2f", "light": "#f9a825", "full": "#ef6c00", "emergency": "#c62828"}


def _ring(utilization: float, tier: str, label: str) -> str:
    r, c = 52, 2 * math.pi * 52
    shown = max(0.0, min(utilization, 1.0))
    color = TIER_COLORS.get(tier, "#555")
    return (
        f'<svg class="ring" viewBox="0 0 140 150" role="img" aria-label="{escape(label)} utilization '
        f'{utilization:.1%} ({escape(tier)})">'
        f'<circle cx="70" cy="70" r="{r}" fill="none" stroke="#e0e0e0" stroke-width="14"/>'
        f'<circle cx="70" cy="70" r="{r}" fill="none" stroke="{color}" stroke-width="14" '
        f'stroke-dasharray="{c * shown:.2f} {c:.2f}" transform="rotate(-90 70 70)" stroke-linecap="butt"/>'
        f'<text x="70" y="66" text-anchor="middle" class="big">{utilization:.0%}</text>'
        f'<text x="70" y="86" text-anchor="middle" class="small">{escape(tier)}</text>'
        f'<text x="70" y="146" text-anchor="middle" class="small">{escape(label)}</text></svg>'
    )


def _waterfall(report: dict[str, Any]) -> str:
    stages = [s for s in report["stages"] if s["ran"]]
    start = report["before"]["tokens"]
    usable = report["budget"]["usable_window"]
    top = max([start, usable, *(s["tokens_before"] for s in stages)])
    width, bar_h, gap, left = 640, 22, 8, 190
    rows = [("input", 0, start, "#546e7a")]
    for s in stages:
        a, b = s["tokens_before"], s["tokens_after"]
        rows.append(
            (
                f"{s['id']} ({s['type']})",
                min(a, b),
                max(a, b),
                "#2e7d32" if b < a else ("#c62828" if b > a else "#90a4ae"),
            )
        )
    rows.append(("output", 0, report["after"]["tokens"], "#1565c0"))
    height = len(rows) * (bar_h + gap) + 30
    scale = (width - left - 80) / top
    parts = [f'<svg class="waterfall" viewBox="0 0 {width} {height}" role="img" aria-label="tokens per stage">']
    x_usable = left + usable * scale
    parts.append(
        f'<line x1="{x_usable:.1f}" y1="0" x2="{x_usable:.1f}" y2="{height - 20}" '
        f'stroke="#c62828" stroke-dasharray="4 3"/>'
        f'<text x="{x_usable:.1f}" y="{height - 6}" text-anchor="middle" class="small">usable window</text>'
    )
    for i, (name, lo, hi, color) in enumerate(rows):
        y = i * (bar_h + gap) + 4
        w = max((hi - lo) * scale, 1.5)
        delta = hi - lo if name not in ("input", "output") else hi
        parts.append(
            f'<text x="{left - 8}" y="{y + 15}" text-anchor="end" class="small">{escape(name)}</text>'
            f'<rect x="{left + lo * scale:.1f}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{color}"/>'
            f'<text x="{left + hi * scale + 6:.1f}" y="{y + 15}" class="small">{delta:,}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_html(report: dict[str, Any]) -> str:
    b, a, m = report["before"], report["after"], report["model"]
    stage_rows = [
        [
            s["id"],
            s["type"],
            s["phase"],
            "yes" if s["ran"] else "no",
            f"{s['tokens_before']:,}",
            f"{s['tokens_after']:,}",
            f"{s['tokens_before'] - s['tokens_after']:,}",
            f"{s['ms']:.1f}",
            s.get("error") or s.get("skipped") or ", ".join(sorted({x["kind"] for x in s["actions"]})),
        ]
        for s in report["stages"]
    ]
    cache_actions = [x for s in report["stages"] if s["type"].startswith("cache.") for x in s["actions"]]
    cache_html = (
        _table(["kind", "detail"], [[x["kind"], x["detail"]] for x in cache_actions])
        if cache_actions
        else "<p>No cache stage ran.</p>"
    )
    request = report.get("request") or {}
    if request:
        cache_html += _table(["request option", "value"], [[k, str(v)] for k, v in sorted(request.items())])
    vault = report["vault_items"]
    vault_html = (
        _table(["vault id", "read back with"], [[v, read_back_command(report, v)] for v in vault])
        if vault
        else "<p>Nothing was moved to the vault.</p>"
    )
    warnings = report["warnings"]
    warn_html = (
        ("<ul>" + "".join(f"<li>{escape(w)}</li>" for w in warnings) + "</ul>") if warnings else "<p>No warnings.</p>"
    )
    est = " (estimates)" if m["tokens_are_estimates"] else ""
    title = f"ctxrules report: {report['pack']['name']} on {m['name']}"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title>
<style>
body {{ font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; \
margin: 24px; color: #212121; background: #fafafa; }}
h1 {{ font-size: 20px; margin: 0 0 4px; }} h2 {{ font-size: 16px; margin: 28px 0 8px; }}
.meta {{ color: #616161; }} .rings {{ display: flex; gap: 32px; align-items: center; flex-wrap: wrap; }}
.ring {{ width: 160px; height: 160px; }} .big {{ font-size: 24px; font-weight: 600; }} \
.small {{ font-size: 11px; fill: #424242; }}
.waterfall {{ width: 100%; max-width: 760px; background: #fff; border: 1px solid #e0e0e0; }}
table {{ border-collapse: collapse; background: #fff; }} \
th, td {{ border: 1px solid #e0e0e0; padding: 4px 8px; text-align: left; font-size: 13px; }}
th {{ background: #eeeeee; }} td:nth-child(n+5):nth-child(-n+8) {{ text-align: right; }}
.stat {{ font-size: 13px; color: #424242; }}
</style></head>
<body>
<h1>{escape(title)}</h1>
<p class="meta">session {escape(report["session"]["id"])} · ctxrules {escape(report["ctxrules"])} ·
window {report["budget"]["window"]:,} ({escape(str(report["budget"].get("window_source", "")))}),
usable {report["budget"]["usable_window"]:,} · tokenizer {escape(m["tokenizer"])}{escape(est)}</p>
<div class="rings">{_ring(b["utilization"], b["tier"], "before")}{_ring(a["utilization"], a["tier"], "after")}
<div class="stat">before: {b["messages"]} messages, {b["tokens"]:,} tokens<br>
after: {a["messages"]} messages, {a["tokens"]:,} tokens<br>
saved: {b["tokens"] - a["tokens"]:,} tokens · fits: {"yes" if a.get("fits", True) else "NO"}<br>
reused messages: {report.get("reused_messages", 0)}</div></div>
<h2>Tokens per stage</h2>
{_waterfall(report)}
{_table(["stage", "type", "phase", "ran", "tokens before", "after", "saved", "ms", "actions / why not"], stage_rows)}
<h2>Prompt cache</h2>
{cache_html}
<h2>Vault items ({len(vault)})</h2>
{vault_html}
<h2>Warnings ({len(warnings)})</h2>
{warn_html}
</body></html>
"""
