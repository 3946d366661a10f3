"""Readable tables of a run report (``run --explain``, ``ctxrules report``)."""

from __future__ import annotations

from typing import Any


def _table(rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for n, row in enumerate(rows):
        cells = [c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(row)]
        out.append("  ".join(cells).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return out


def read_back_command(report: dict[str, Any], vault_id: str) -> str:
    """The command that prints a vault item of this run, from any directory: it names the
    session, whose vault holds the item (a bare id only works from the run's directory)."""
    import shlex

    info = report.get("session") or {}
    session = info.get("path")
    if info.get("store") and info.get("key"):  # a session in a URL store, by its key
        where = f" --store {shlex.quote(str(info['store']))} --session {shlex.quote(str(info['key']))}"
    else:
        where = f" --session {shlex.quote(str(session))}" if session else ""
    return f"ctxrules vault get {vault_id[:12]}{where}"


def report_table(report: dict[str, Any]) -> str:
    b, a, m, bud = report["before"], report["after"], report["model"], report["budget"]
    est = " (estimate)" if m["tokens_are_estimates"] else ""
    lines = [
        f"model {m['name']} ({m['tokenizer']}{est}); window {bud['window']} ({bud.get('window_source', '')}), "
        f"usable {bud['usable_window']}",
        f"before: {b['messages']} messages, {b['tokens']} tokens, {b['utilization']:.1%} ({b['tier']})",
        f"after:  {a['messages']} messages, {a['tokens']} tokens, {a['utilization']:.1%} ({a['tier']})"
        + ("" if a.get("fits", True) else "  DOES NOT FIT"),
    ]
    if report.get("reused_messages"):
        lines.append(f"reused the previous compaction of {report['reused_messages']} messages")
    rows = [["stage", "type", "ran", "tokens before", "after", "saved", "ms", "actions / why not"]]
    for s in report["stages"]:
        why = s.get("error") or s.get("skipped") or ", ".join(sorted({a["kind"] for a in s["actions"]})) or "-"
        rows.append(
            [
                s["id"],
                s["type"],
                "yes" if s["ran"] else "no",
                str(s["tokens_before"]),
                str(s["tokens_after"]),
                str(s["tokens_before"] - s["tokens_after"]),
                f"{s['ms']:.1f}",
                why,
            ]
        )
    lines.append("")
    lines.extend(_table(rows, {3, 4, 5, 6}))
    if report["vault_items"]:
        lines.append(f"\nvault items: {len(report['vault_items'])} (read back with the command beside each)")
        lines.extend(f"  {vid[:12]}  {read_back_command(report, vid)}" for vid in report["vault_items"])
    for w in report["warnings"]:
        lines.append(f"warning: {w}")
    return "\n".join(lines) + "\n"
