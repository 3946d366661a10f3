"""Totals of an eval run, and the three ways to read them: a table, JSON, one HTML page."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxrules.eval.probes import CATEGORIES, Retention
from ctxrules.eval.replay import TaskResult
from ctxrules.printable import printable, printable_html

__all__ = ["Totals", "eval_html", "eval_json", "eval_table", "totals_of"]

VERSION = 1
_NUMBER = re.compile(r"\d+")


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


@dataclass
class Totals:
    """The figures of one plan over some transcripts (see docs/eval.md for each column)."""

    plan: str
    baseline: bool
    calls: int = 0
    sent: int = 0
    read: int = 0
    write: int = 0
    usd: float = 0.0
    overflows: int = 0
    compactions: int = 0
    breaks: Counter[str] = field(default_factory=Counter)
    ms: list[float] = field(default_factory=list)
    retention: Retention = field(default_factory=Retention.empty)
    violations: int = 0
    errors: list[str] = field(default_factory=list)
    failed: int = 0  # transcripts whose replay failed (not the judge: its failures are only reported)
    judged: dict[str, dict[str, int]] | None = None

    def add(self, result: TaskResult) -> None:
        for call in result.calls:
            self.calls += 1
            if call.fits:
                self.sent += call.prompt
                self.read += call.read
                self.write += call.write
            else:
                self.overflows += 1
            self.usd += call.usd
            self.compactions += int(call.compacted)
            if call.cache_break:
                self.breaks[_NUMBER.sub("N", call.cache_break)] += 1
            if not result.baseline:
                self.ms.append(call.ms)
            self.retention.add(
                Retention(
                    {c: call.retention[c]["kept"] for c in CATEGORIES},
                    {c: call.retention[c]["recoverable"] for c in CATEGORIES},
                    {c: call.retention[c]["lost"] for c in CATEGORIES},
                )
            )
            self.violations += len(call.violations)
        if result.error:
            self.errors.append(f"{result.transcript}: {result.error}")
            self.failed += 1
        if result.judge_error:
            self.errors.append(f"{result.transcript}: the judge failed: {result.judge_error}")
        if result.judge is not None:
            if self.judged is None:
                self.judged = {c: {"passed": 0, "failed": 0} for c in CATEGORIES}
            for c in CATEGORIES:
                for k in ("passed", "failed"):
                    self.judged[c][k] += result.judge[c][k]

    @property
    def cached_share(self) -> float:
        return self.read / self.sent if self.sent else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "plan": self.plan,
            "baseline": self.baseline,
            "calls": self.calls,
            "tokens_sent": self.sent,
            "cache_read": self.read,
            "cache_write": self.write,
            "cached_share": round(self.cached_share, 6),
            "usd": round(self.usd, 6),
            "overflows": self.overflows,
            "compactions": self.compactions,
            "cache_breaks": sum(self.breaks.values()),
            "cache_break_reasons": dict(self.breaks.most_common()),
            "prepare_ms_p50": round(_percentile(self.ms, 0.5), 3),
            "prepare_ms_p95": round(_percentile(self.ms, 0.95), 3),
            "retention": round(self.retention.score() or 0.0, 6),
            "retention_with_vault": round(self.retention.score(recoverable=True) or 0.0, 6),
            "retention_by_category": {
                c: {"score": self.retention.score(c), **self.retention.as_dict()[c]} for c in CATEGORIES
            },
            "invariant_violations": self.violations,
            "errors": self.errors,
            "judge": self.judged,
        }


def totals_of(
    results: Sequence[TaskResult], plans: Sequence[str], baselines: Mapping[str, bool]
) -> tuple[dict[str, Totals], dict[tuple[str, str], Totals]]:
    """Totals per plan, and per (transcript, plan)."""
    overall = {p: Totals(p, baselines[p]) for p in plans}
    each: dict[tuple[str, str], Totals] = {}
    for result in results:
        overall[result.plan].add(result)
        one = Totals(result.plan, result.baseline)
        one.add(result)
        each[(result.transcript, result.plan)] = one
    return overall, each


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _row(name: str, t: Totals) -> list[str]:
    return [
        name,
        str(t.calls),
        f"{t.sent:,}",
        _pct(t.cached_share if t.sent else None),
        f"{t.usd:.4f}",
        str(t.overflows),
        str(t.compactions),
        str(sum(t.breaks.values())),
        "-" if t.baseline else f"{_percentile(t.ms, 0.5):.1f}",
        "-" if t.baseline else f"{_percentile(t.ms, 0.95):.1f}",
        _pct(t.retention.score()),
        _pct(t.retention.score(recoverable=True)),
        str(t.violations) if not t.baseline else f"({t.violations})",
    ]


_HEADER = [
    "transcript",
    "calls",
    "tokens sent",
    "cached",
    "USD",
    "over",
    "compact",
    "breaks",
    "p50 ms",
    "p95 ms",
    "kept",
    "+vault",
    "invariants",
]


def _table(rows: list[list[str]]) -> list[str]:
    # Cells as they will print (a name's controls as escapes): measured after, not before.
    rows = [[printable(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for n, row in enumerate(rows):
        out.append("  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(row)).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return out


def eval_table(
    overall: Mapping[str, Totals],
    each: Mapping[tuple[str, str], Totals],
    transcripts: Sequence[str],
    *,
    model: str,
    window: int | None,
) -> str:
    """One table per plan (a row per transcript, then the total), and a summary table."""
    lines: list[str] = [f"model {model}, window {window or 'from the registry'}; {len(transcripts)} transcript(s)"]
    for plan, total in overall.items():
        lines += ["", f"{'baseline' if total.baseline else 'pack'} {plan}"]
        rows = [_HEADER]
        rows += [_row(name, each[(name, plan)]) for name in transcripts if (name, plan) in each]
        rows.append(_row("total", total))
        lines += _table(rows)
        for reason, count in total.breaks.most_common(3):
            lines.append(f"  cache break x{count}: {reason}")
        for error in total.errors:
            lines.append(f"  error: {error}")
    lines += ["", "retention by category (kept / kept or recoverable through the vault)"]
    rows = [["plan", *CATEGORIES]]
    for plan, total in overall.items():
        rows.append(
            [
                plan,
                *(
                    f"{_pct(total.retention.score(c))} / {_pct(total.retention.score(c, recoverable=True))}"
                    for c in CATEGORIES
                ),
            ]
        )
    lines += _table(rows)
    judged = {p: t.judged for p, t in overall.items() if t.judged is not None}
    if judged:
        lines += ["", "judge: probes the model answered from the prepared context (last call)"]
        rows = [["plan", *CATEGORIES]]
        for plan, counts in judged.items():
            rows.append(
                [plan, *(f"{counts[c]['passed']}/{counts[c]['passed'] + counts[c]['failed']}" for c in CATEGORIES)]
            )
        lines += _table(rows)
    return "\n".join(lines) + "\n"


def eval_json(
    results: Sequence[TaskResult],
    overall: Mapping[str, Totals],
    each: Mapping[tuple[str, str], Totals],
    *,
    model: str,
    window: int | None,
    seconds: float,
) -> dict[str, Any]:
    return {
        "version": VERSION,
        "model": model,
        "window": window,
        "seconds": round(seconds, 3),
        "totals": [t.as_dict() for t in overall.values()],
        "transcripts": [{"transcript": name, **t.as_dict()} for (name, _), t in each.items()],
        "calls": [{"transcript": r.transcript, "plan": r.plan, **c.as_dict()} for r in results for c in r.calls],
    }


# --- HTML -------------------------------------------------------------------------------------

_COLORS = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563")


def _polyline_chart(title: str, series: Mapping[str, Sequence[float]], *, unit: str) -> str:
    width, height, pad = 640, 260, 44
    longest = max((len(v) for v in series.values()), default=0)
    top = max((max(v) for v in series.values() if v), default=0.0) or 1.0
    parts = [
        f"<figure><figcaption>{printable_html(title)}</figcaption>"
        f'<svg viewBox="0 0 {width} {height}" role="img" aria-label="{printable_html(title)}">',
        f'<line x1="{pad}" y1="{height - pad}" x2="{width - 8}" y2="{height - pad}" stroke="#999"/>',
        f'<line x1="{pad}" y1="8" x2="{pad}" y2="{height - pad}" stroke="#999"/>',
        f'<text x="{pad - 4}" y="14" text-anchor="end" font-size="10">{top:,.4g}</text>',
        f'<text x="{pad - 4}" y="{height - pad}" text-anchor="end" font-size="10">0</text>',
        f'<text x="{width // 2}" y="{height - 10}" text-anchor="middle" font-size="11">'
        f"call (turn), all transcripts in order</text>",
        f'<text x="12" y="{height // 2}" font-size="11" transform="rotate(-90 12 {height // 2})" '
        f'text-anchor="middle">{printable_html(unit)}</text>',
    ]
    for n, (name, values) in enumerate(series.items()):
        if not values:
            continue
        step = (width - pad - 12) / max(1, longest - 1)
        points = " ".join(
            f"{pad + i * step:.1f},{height - pad - v / top * (height - pad - 12):.1f}" for i, v in enumerate(values)
        )
        color = _COLORS[n % len(_COLORS)]
        parts.append(
            f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{points}">'
            f"<title>{printable_html(name)}</title></polyline>"
        )
        parts.append(
            f'<text x="{width - 12}" y="{20 + 14 * n}" text-anchor="end" font-size="11" '
            f'fill="{color}">{printable_html(name)}</text>'
        )
    parts.append("</svg></figure>")
    return "".join(parts)


def _bar_chart(title: str, groups: Mapping[str, Mapping[str, float]]) -> str:
    cats = list(CATEGORIES)
    plans = list(groups)
    width, height, pad = 640, 260, 44
    slot = (width - pad - 12) / len(cats)
    bar = slot / (len(plans) + 1)
    parts = [
        f"<figure><figcaption>{printable_html(title)}</figcaption>"
        f'<svg viewBox="0 0 {width} {height}" role="img" aria-label="{printable_html(title)}">',
        f'<line x1="{pad}" y1="{height - pad}" x2="{width - 8}" y2="{height - pad}" stroke="#999"/>',
        f'<text x="{pad - 4}" y="16" text-anchor="end" font-size="10">100%</text>',
    ]
    for c, cat in enumerate(cats):
        parts.append(
            f'<text x="{pad + c * slot + slot / 2:.1f}" y="{height - pad + 14}" '
            f'text-anchor="middle" font-size="10">{cat}</text>'
        )
        for p, plan in enumerate(plans):
            value = groups[plan].get(cat, 0.0)
            h = value * (height - pad - 16)
            x = pad + c * slot + p * bar + bar / 2
            parts.append(
                f'<rect x="{x:.1f}" y="{height - pad - h:.1f}" width="{bar * 0.9:.1f}" '
                f'height="{h:.1f}" fill="{_COLORS[p % len(_COLORS)]}"><title>'
                f"{printable_html(plan)} {cat}: {value:.1%}</title></rect>"
            )
    for p, plan in enumerate(plans):
        parts.append(
            f'<text x="{width - 12}" y="{20 + 14 * p}" text-anchor="end" font-size="11" '
            f'fill="{_COLORS[p % len(_COLORS)]}">{printable_html(plan)}</text>'
        )
    parts.append("</svg></figure>")
    return "".join(parts)


def eval_html(
    results: Sequence[TaskResult],
    overall: Mapping[str, Totals],
    each: Mapping[tuple[str, str], Totals],
    transcripts: Sequence[str],
    *,
    model: str,
    window: int | None,
) -> str:
    """One self-contained page: totals, per-transcript tables, and three inline SVG charts."""
    usd: dict[str, list[float]] = {}
    tokens: dict[str, list[float]] = {}
    by_plan: dict[str, list[TaskResult]] = {}
    for r in results:
        by_plan.setdefault(r.plan, []).append(r)
    for plan, rs in by_plan.items():
        order = {name: i for i, name in enumerate(transcripts)}
        running = 0.0
        usd[plan], tokens[plan] = [], []
        for r in sorted(rs, key=lambda r: order.get(r.transcript, 0)):
            for c in r.calls:
                running += c.usd
                usd[plan].append(running)
                tokens[plan].append(float(c.prompt))
    retention = {plan: {c: t.retention.score(c) or 0.0 for c in CATEGORIES} for plan, t in overall.items()}
    rows = "".join(
        "<tr>" + "".join(f"<td>{printable_html(cell)}</td>" for cell in _row(plan, t)) + "</tr>"
        for plan, t in overall.items()
    )
    detail = []
    for plan in overall:
        body = "".join(
            "<tr>" + "".join(f"<td>{printable_html(cell)}</td>" for cell in _row(name, each[(name, plan)])) + "</tr>"
            for name in transcripts
            if (name, plan) in each
        )
        detail.append(
            f"<h3>{printable_html(plan)}</h3><table><thead><tr>"
            + "".join(f"<th>{h}</th>" for h in _HEADER)
            + f"</tr></thead><tbody>{body}"
            "</tbody></table>"
        )
    head = "".join(f"<th>{h}</th>" for h in ["plan", *_HEADER[1:]])
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        "<title>ctxrules eval</title><style>body{font:14px system-ui,sans-serif;margin:24px;"
        "color:#111}table{border-collapse:collapse;margin:8px 0 20px}td,th{border:1px solid #ddd;"
        "padding:3px 8px;text-align:right}td:first-child,th:first-child{text-align:left}"
        "figure{display:inline-block;margin:8px 16px 8px 0}svg{width:640px;height:260px;"
        "background:#fafafa}figcaption{font-weight:600;margin-bottom:4px}</style></head><body>"
        f"<h1>ctxrules eval</h1><p>model {printable_html(model)}, window "
        f"{printable_html(str(window or 'from the registry'))}, {len(transcripts)} transcript(s). "
        "Costs follow the providers' documented caching rules, not measured bills.</p>"
        f"<h2>Totals</h2><table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"
        + _polyline_chart("Cumulative USD over calls", usd, unit="USD")
        + _polyline_chart("Prompt tokens per call", tokens, unit="tokens")
        + _bar_chart("Retention per category (kept)", retention)
        + "<h2>Per transcript</h2>"
        + "".join(detail)
        + "</body></html>\n"
    )


def dumps(data: Mapping[str, Any]) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
