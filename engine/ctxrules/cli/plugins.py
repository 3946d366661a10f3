"""``ctxrules plugins [--all]``: installed plugins and what they register, as JSON."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ctxrules.cli.output import write_stdout
from ctxrules.plugins import default_registry


def register(sub: Any) -> None:
    p = sub.add_parser("plugins", help="list plugins and the stages they register (JSON)")
    p.add_argument("--all", action="store_true", help="include the built-in plugins")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    reg = default_registry()
    out = [
        {
            "name": p.name,
            "version": p.version,
            "builtin": p.builtin,
            "stages": p.stages,
            "actions": p.actions,
            "filters": p.filters,
        }
        for p in reg.plugins
        if args.all or not p.builtin
    ]
    write_stdout(json.dumps(out, indent=2) + "\n")
    return 0
