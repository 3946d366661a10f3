"""``ctxrules report REPORT.json [--html OUT.html]``: a run report as a table or a page."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ctxrules.cli.io import outputs_apart_from, read_json, write_text
from ctxrules.cli.output import require_stdout, write_stdout
from ctxrules.cli.tables import report_table
from ctxrules.errors import UsageError
from ctxrules.printable import printable
from ctxrules.report_html import render_html
from ctxrules.resources import schema_path


def register(sub: Any) -> None:
    p = sub.add_parser(
        "report",
        help="show a run report as a table, or write it as an HTML page",
        description="Read a report written by `ctxrules run --report` and print it as a "
        "table, or write one self-contained HTML page (no network).",
    )
    p.add_argument("report", metavar="REPORT.json")
    p.add_argument("--html", metavar="OUT.html", help="write the page here")
    p.set_defaults(func=run)


def load_report(path: str) -> dict[str, Any]:
    """The report in ``path``, checked against its schema; a file that is not one is a
    one-line ``UsageError`` that says what was expected (never an echo of the file)."""
    import jsonschema

    data = read_json(path)
    schema = json.loads(schema_path("report.v1.schema.json").read_text(encoding="utf-8"))
    expected = "expected the JSON object `ctxrules run --report FILE` writes"
    if not isinstance(data, dict):
        raise UsageError(f"{path}: not a ctxrules run report ({expected}; this file holds {_kind(data)})")
    missing = [k for k in schema.get("required", []) if k not in data]
    if missing:
        hint = "; it looks like a conversation: give it to `ctxrules run --input`" if "messages" in data else ""
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise UsageError(f"{path}: not a ctxrules run report ({expected}; missing keys: {shown}){hint}")
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(data), key=lambda e: list(e.path))
    if errors:
        first = errors[0]
        where = "/".join(str(p) for p in first.absolute_path) or "(top level)"
        if first.validator == "type":
            what = f"expected {first.validator_value}, found {_kind(first.instance)}"
        else:
            what = first.message if len(first.message) <= 160 else first.message[:157] + "..."
        raise UsageError(f"{path}: not a valid ctxrules run report: at {where}: {what}")
    huge = _huge_number(data)
    if huge is not None:
        where = "/".join(str(p) for p in huge) or "(top level)"
        raise UsageError(f"{path}: not a valid ctxrules run report: at {where}: a number too large to show")
    return data


def _huge_number(data: Any) -> tuple[str | int, ...] | None:
    """The path of the first number past a float's range (an integer of hundreds of digits is
    valid JSON and within the schema), which the table and the page cannot format; None."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(data, ())]
    while stack:  # no recursion: read_json bounds the depth, the walk does not rely on it
        value, at = stack.pop()
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                float(value)
            except OverflowError:
                return at
        elif isinstance(value, dict):
            stack.extend((v, (*at, k)) for k, v in reversed(list(value.items())))
        elif isinstance(value, list):
            stack.extend((v, (*at, i)) for i, v in reversed(list(enumerate(value))))
    return None


def _kind(value: Any) -> str:
    return {
        dict: "an object",
        list: "an array",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def run(args: argparse.Namespace) -> int:
    require_stdout()  # before the page is written: exit 2 then means nothing was
    outputs_apart_from([args.report], "the report", html=args.html)
    report = load_report(args.report)
    if args.html:
        write_text(args.html, render_html(report))
        if args.html != "-":  # on stdout, the page is all there is
            write_stdout(f"wrote {args.html}\n")
    else:
        write_stdout(printable(report_table(report), one_line=False))
    return 0
