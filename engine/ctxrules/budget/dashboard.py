"""The usage dashboard (``ctxrules usage report --html``): one self-contained page from the day
ledgers of a state root — daily spend, a drill-down per session, a per-model breakdown, an hour x
weekday heatmap, per-agent cards with sparklines, and requests per routing tier.

Everything is read from ``<state>/ledger/days/*.jsonl`` (every call of every session, sub-agents
included) and drawn as inline SVG and HTML tables: no script, no network. Days and hours are UTC.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from ctxrules.budget.ledger import CallEntry, Totals, ledger_of
from ctxrules.printable import printable_html
from ctxrules.stores.base import Log
from ctxrules.stores.filesystem import FilesystemStore

if TYPE_CHECKING:
    from ctxrules.stores.base import Store
from ctxrules.budget.usage import TOKEN_KINDS

__all__ = ["Period", "load_calls", "render_dashboard", "summary_text"]

_WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_COLORS = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563")


@dataclass(frozen=True)
class Period:
    """The ``days`` UTC dates ending with ``last`` (inclusive)."""

    last: date
    days: int

    @property
    def dates(self) -> list[date]:
        return [self.last - timedelta(days=self.days - 1 - i) for i in range(self.days)]

    @property
    def start(self) -> float:
        return datetime.combine(self.dates[0], datetime.min.time(), UTC).timestamp()

    @property
    def end(self) -> float:
        return datetime.combine(self.last + timedelta(days=1), datetime.min.time(), UTC).timestamp()


def load_calls(state_root: Path | Store, period: Period) -> tuple[list[CallEntry], int]:
    """Every call recorded in ``period`` (resets do not hide history here), and how many ledger
    lines could not be read. ``state_root``: a state directory, or any store."""
    store = FilesystemStore(state_root) if isinstance(state_root, str | os.PathLike) else state_root
    calls: list[CallEntry] = []
    bad = 0
    held = {log.name for log in store.logs("day")}
    for day in period.dates:
        if day.isoformat() not in held:
            continue
        file = ledger_of(store, Log("day", day.isoformat()))
        calls.extend(e for e in file.entries(period.start, period.end, honor_resets=False))
        bad += file.bad_lines
    calls.sort(key=lambda e: (e.ts, e.call_id))
    return calls, bad


def _day(ts: float) -> date:
    return datetime.fromtimestamp(ts, UTC).date()


def _usd(e: CallEntry) -> float:
    return e.cost.total if e.cost is not None else 0.0


def _esc(value: object) -> str:
    """``value`` for the page as every ctxrules page shows text (:func:`printable_html`): a
    ledger line anyone can append to may hold a lone surrogate, which UTF-8 cannot encode (the
    page was not written), or a bidirectional override that reorders the rest of its line."""
    return printable_html(str(value))


def _money(value: float) -> str:
    sign = "-" if value < 0 else ""
    value = abs(value)
    return f"{sign}${value:,.4f}" if value < 100 else f"{sign}${value:,.2f}"


def _bars(title: str, labels: Sequence[str], values: Sequence[float], *, unit: str, color: str = _COLORS[0]) -> str:
    width, height, pad = 720, 220, 40
    top = max(values, default=0.0) or 1.0
    slot = (width - pad - 8) / max(1, len(values))
    parts = [
        f'<figure><figcaption>{_esc(title)}</figcaption><svg viewBox="0 0 {width} {height}" '
        f'role="img" aria-label="{_esc(title)}">',
        f'<line x1="{pad}" y1="{height - 30}" x2="{width - 4}" y2="{height - 30}" stroke="#999"/>',
        f'<text x="{pad - 4}" y="14" text-anchor="end" font-size="10">{_esc(unit)}{top:,.4g}</text>',
    ]
    every = max(1, len(labels) // 12)
    for i, (label, value) in enumerate(zip(labels, values, strict=True)):
        h = value / top * (height - 50)
        x = pad + i * slot
        parts.append(
            f'<rect x="{x:.1f}" y="{height - 30 - h:.1f}" width="{max(1.0, slot * 0.8):.1f}" '
            f'height="{h:.1f}" fill="{color}"><title>{_esc(label)}: {_esc(unit)}{value:,.6g}'
            f"</title></rect>"
        )
        if i % every == 0:
            parts.append(
                f'<text x="{x + slot * 0.4:.1f}" y="{height - 16}" text-anchor="middle" '
                f'font-size="9">{_esc(label)}</text>'
            )
    parts.append("</svg></figure>")
    return "".join(parts)


def _sparkline(values: Sequence[float], color: str) -> str:
    width, height = 160, 32
    top = max(values, default=0.0) or 1.0
    step = width / max(1, len(values) - 1)
    points = " ".join(f"{i * step:.1f},{height - 2 - v / top * (height - 4):.1f}" for i, v in enumerate(values))
    return (
        f'<svg class="spark" viewBox="0 0 {width} {height}" role="img" aria-label="daily spend">'
        f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{points}"/></svg>'
    )


def _heatmap(calls: Iterable[CallEntry]) -> str:
    grid = [[0.0] * 24 for _ in range(7)]
    counts = [[0] * 24 for _ in range(7)]
    for e in calls:
        moment = datetime.fromtimestamp(e.ts, UTC)
        grid[moment.weekday()][moment.hour] += _usd(e)
        counts[moment.weekday()][moment.hour] += 1
    top = max((max(row) for row in grid), default=0.0) or 1.0
    cell, left, topm = 26, 40, 20
    parts = [
        "<figure><figcaption>Spend by hour and weekday (UTC)</figcaption>"
        f'<svg viewBox="0 0 {left + 24 * cell + 4} {topm + 7 * cell + 4}" role="img" '
        'aria-label="hour by weekday heatmap">'
    ]
    for h in range(0, 24, 3):
        parts.append(
            f'<text x="{left + h * cell + cell / 2}" y="14" text-anchor="middle" font-size="10">{h:02d}</text>'
        )
    for d in range(7):
        parts.append(
            f'<text x="{left - 6}" y="{topm + d * cell + cell * 0.65}" text-anchor="end" '
            f'font-size="10">{_WEEKDAYS[d]}</text>'
        )
        for h in range(24):
            share = grid[d][h] / top
            # White to the first series colour (#2563eb), by spend.
            r, g, b = (int(255 + (c - 255) * share) for c in (0x25, 0x63, 0xEB))
            parts.append(
                f'<rect class="cell" x="{left + h * cell}" y="{topm + d * cell}" '
                f'width="{cell - 2}" height="{cell - 2}" fill="#{r:02x}{g:02x}{b:02x}">'
                f"<title>{_WEEKDAYS[d]} {h:02d}:00 UTC: {counts[d][h]} call(s), "
                f"{_money(grid[d][h])}</title></rect>"
            )
    parts.append("</svg></figure>")
    return "".join(parts)


def _kinds_table(totals: Totals) -> str:
    tokens = totals.tokens.as_dict()
    cost = totals.cost.as_dict()
    head = "".join(f"<th>{_esc(k)}</th>" for k in TOKEN_KINDS)
    cells = "".join(f"<td>{tokens.get(k, 0):,}</td>" for k in TOKEN_KINDS)
    usd = "".join(f"<td>{_money(v)}</td>" for v in cost.values())
    usd_head = "".join(f"<th>{_esc(k)}</th>" for k in cost)
    return (
        f"<table><thead><tr><th></th>{head}</tr></thead><tbody><tr><th>tokens</th>{cells}"
        f"</tr></tbody></table><table><thead><tr><th></th>{usd_head}</tr></thead><tbody><tr>"
        f"<th>USD</th>{usd}</tr></tbody></table>"
    )


def render_dashboard(calls: Sequence[CallEntry], period: Period, *, state_root: str, bad_lines: int = 0) -> str:
    """The page (see the module docstring)."""
    total = Totals.of(calls)
    by_day: dict[date, float] = defaultdict(float)
    for e in calls:
        by_day[_day(e.ts)] += _usd(e)
    dates = period.dates
    daily = _bars(
        "Daily spend (USD)", [d.isoformat()[5:] for d in dates], [by_day.get(d, 0.0) for d in dates], unit="$"
    )
    # Per model.
    models = sorted(total.by_model.items(), key=lambda kv: -kv[1]["usd"])
    model_rows = "".join(
        f"<tr><td>{_esc(name)}</td><td>{int(v['calls'])}</td><td>{int(v['tokens']):,}</td>"
        f"<td>{_money(v['usd'])}</td></tr>"
        for name, v in models
    )
    model_bars = _bars(
        "Spend per model (USD)", [m for m, _ in models], [v["usd"] for _, v in models], unit="$", color=_COLORS[3]
    )
    # Agents: one card per root session, with its sub-agents.
    sessions: dict[str, list[CallEntry]] = defaultdict(list)
    roots: dict[str, set[str]] = defaultdict(set)
    for e in calls:
        sessions[e.session].append(e)
        roots[e.root or e.session].add(e.session)
    cards = []
    for n, (root, members) in enumerate(sorted(roots.items(), key=lambda kv: kv[0])):
        member_calls = [e for s in members for e in sessions[s]]
        spend: dict[date, float] = defaultdict(float)
        for e in member_calls:
            spend[_day(e.ts)] += _usd(e)
        subs = sorted(members - {root})
        t = Totals.of(member_calls)
        cards.append(
            f'<div class="card"><h3>{_esc(root)}</h3><p>{t.calls} call(s), {_money(t.usd)}'
            f"{f', {len(subs)} sub-agent(s)' if subs else ''}</p>"
            + _sparkline([spend.get(d, 0.0) for d in dates], _COLORS[n % len(_COLORS)])
            + (
                "<ul>" + "".join(f"<li>{_esc(s)}: {_money(Totals.of(sessions[s]).usd)}</li>" for s in subs) + "</ul>"
                if subs
                else ""
            )
            + "</div>"
        )
    # Sessions, drill-down.
    details = []
    for name in sorted(sessions, key=lambda s: -Totals.of(sessions[s]).usd):
        t = Totals.of(sessions[name])
        used = ", ".join(sorted(t.by_model))
        root = sessions[name][0].root
        details.append(
            f"<details><summary><b>{_esc(name)}</b> — {t.calls} call(s), {_money(t.usd)}, cache "
            f"savings {_money(t.cost.cache_savings)}{'' if root in ('', name) else f' (sub-agent of {_esc(root)})'}"
            f"</summary><p>models: {_esc(used)}</p>{_kinds_table(t)}</details>"
        )
    # Routing tiers.
    tiers: dict[str, int] = defaultdict(int)
    for e in calls:
        tiers[e.tier or "unrouted"] += 1
    tier_names = sorted(tiers, key=lambda t: (t == "unrouted", t))
    tier_bars = _bars(
        "Requests per routing tier", tier_names, [float(tiers[t]) for t in tier_names], unit="", color=_COLORS[2]
    )
    warn = f'<p class="warn">{bad_lines} ledger line(s) could not be read and were skipped.</p>' if bad_lines else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>ctxrules usage</title>'
        "<style>body{font:14px system-ui,sans-serif;margin:24px;color:#111}table{border-collapse:"
        "collapse;margin:6px 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}"
        "td:first-child{text-align:left}figure{display:inline-block;margin:8px 16px 8px 0}"
        "figcaption{font-weight:600}svg{background:#fafafa;max-width:100%}figure svg{width:720px;"
        "height:auto}.cards{display:flex;"
        "flex-wrap:wrap;gap:12px}.card{border:1px solid #ddd;border-radius:6px;padding:8px 12px;"
        "min-width:200px}.card h3{margin:0 0 4px;font-size:14px}.spark{width:160px;height:32px}"
        "details{margin:4px 0}.warn{color:#b45309}</style></head><body>"
        f"<h1>ctxrules usage</h1><p>{_esc(state_root)} — {period.days} day(s) to "
        f"{period.last.isoformat()} (UTC): <b>{total.calls}</b> call(s), <b>{_money(total.usd)}</b>, "
        f"{total.tokens.total:,} tokens, cache savings {_money(total.cost.cache_savings)}"
        f" ({total.cost.savings_share:.1%}).</p>{warn}"
        + daily
        + "<h2>Models</h2><table><thead><tr><th>model</th><th>calls</th><th>tokens</th><th>USD</th>"
        f"</tr></thead><tbody>{model_rows}</tbody></table>"
        + model_bars
        + "<h2>When</h2>"
        + _heatmap(calls)
        + '<h2>Agents</h2><div class="cards">'
        + "".join(cards)
        + "</div>"
        + "<h2>Sessions</h2>"
        + "".join(details)
        + "<h2>Routing</h2>"
        + tier_bars
        + "</body></html>\n"
    )


def summary_text(calls: Sequence[CallEntry], period: Period) -> str:
    """The same figures in a few lines of text (``usage report`` without ``--html``)."""
    total = Totals.of(calls)
    lines = [
        f"{period.days} day(s) to {period.last.isoformat()} (UTC): {total.calls} call(s), "
        f"{_money(total.usd)}, {total.tokens.total:,} tokens"
    ]
    by_day: dict[date, float] = defaultdict(float)
    for e in calls:
        by_day[_day(e.ts)] += _usd(e)
    lines += [f"  {d.isoformat()}  {_money(by_day[d])}" for d in period.dates if d in by_day]
    for name, v in sorted(total.by_model.items(), key=lambda kv: -kv[1]["usd"]):
        lines.append(f"  model {name}: {int(v['calls'])} call(s), {_money(v['usd'])}")
    return "\n".join(lines) + "\n"
