"""``ctxrules validate PATH... [--format text|json|github|sarif] [--strict]``."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from ctxrules.cli.io import add_search_path
from ctxrules.cli.output import write_stdout
from ctxrules.plugins import default_registry
from ctxrules.validation import formats
from ctxrules.validation.validate import validate_paths


def register(sub: Any) -> None:
    p = sub.add_parser(
        "validate",
        help="check rule packs (schema and semantic checks)",
        description="Check rule packs: files, or folders searched for pack files. "
        "Exit 0 when valid, 1 when any error (or warning with --strict), "
        "2 when a path does not exist.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.add_argument("--format", choices=formats.FORMATS, default="text")
    p.add_argument("--strict", action="store_true", help="treat warnings as errors")
    p.add_argument(
        "--skip-non-packs",
        action="store_true",
        help="skip named YAML files that do not declare apiVersion: ctxrules/... or kind: RulePack",
    )
    add_search_path(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    diags, count, real, skipped = validate_paths(
        args.paths, default_registry(), skip_non_packs=args.skip_non_packs, search_path=args.search_path
    )
    render: Callable[[], str] = {
        "text": lambda: formats.format_text(diags, count, real, skipped),
        "json": lambda: formats.format_json(diags, count, skipped),
        "github": lambda: formats.format_github(diags, count),
        "sarif": lambda: formats.format_sarif(diags, count),
    }[args.format]
    write_stdout(render())
    failing = {"error", "warning"} if args.strict else {"error"}
    return 1 if any(d.severity in failing for d in diags) else 0
