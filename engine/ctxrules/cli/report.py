"""``ctxrules report REPORT.json [--html OUT.html]``: a run report as a table or a page."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ctxrules.cli.io import read_json, write_text
from ctxrules.cli.tables import report_table
from ctxrules.errors import UsageError
from ctxrules.report_html import render_html
from ctxrules.resources import schema_path


def register(sub: Any) -> None:
    p = sub.add_parser("report", help="show a run report as a table, or write it as an HTML page",
                       description="Read a report written by `ctxrules run --report` and print it as a "
                                   "table, or write one self-contained HTML page (no network).")
    p.add_argument("report", metavar="REPORT.json")
    p.add_argument("--html", metavar="OUT.html", help="write the page here")
    p.set_defaults(func=run)


def load_report(path: str) -> dict[str, Any]:
    import jsonschema

    data = read_json(path)
    schema = json.loads(schema_path("report.v1.schema.json").read_text(encoding="utf-8"))
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(data), key=lambda e: list(e.path))
    if errors:
        where = "/".join(str(p) for p in errors[0].absolute_path) or "(top level)"
        raise UsageError(f"{path}: not a ctxrules run report: at {where}: {errors[0].message}")
    return data  # type: ignore[no-any-return]


def run(args: argparse.Namespace) -> int:
    report = load_report(args.report)
    if args.html:
        write_text(args.html, render_html(report))
        sys.stdout.write(f"wrote {args.html}\n")
    else:
        sys.stdout.write(report_table(report))
    return 0
