"""``ctxrules schema``: the rule-pack schema with every installed stage's and action's options."""

from __future__ import annotations

import argparse
from typing import Any

from ctxrules.cli.output import write_stdout
from ctxrules.plugins import default_registry
from ctxrules.resources import schema_path
from ctxrules.validation import full_schema as gen


def register(sub: Any) -> None:
    p = sub.add_parser(
        "schema",
        help="print the full rule-pack JSON Schema, including plugins",
        description="Print the rule-pack JSON Schema (draft 2020-12) with the with: "
        "options (and their defaults) of every registered stage type and "
        "compressor action filled in. With only the built-in plugins "
        "installed it is schemas/rulepack.v1.schema.json.",
    )
    p.add_argument(
        "--path",
        action="store_true",
        help="print where the installed copy of schemas/rulepack.v1.schema.json is "
        "(for an editor's schema setting) instead of the schema",
    )
    p.set_defaults(func=run)


def full_schema() -> dict[str, Any]:
    return gen.full_schema(default_registry())


def run(args: argparse.Namespace) -> int:
    if args.path:
        write_stdout(str(schema_path("rulepack.v1.schema.json").resolve()) + "\n")
        return 0
    write_stdout(gen.dumps(full_schema()))
    return 0
