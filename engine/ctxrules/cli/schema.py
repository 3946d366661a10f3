"""``ctxrules schema``: the rule-pack schema with every installed stage's option schema."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ctxrules.plugins import default_registry
from ctxrules.stages.base import options_schema_for
from ctxrules.validation.schema import rulepack_schema


def register(sub: Any) -> None:
    p = sub.add_parser("schema", help="print the full rule-pack JSON Schema, including plugins",
                       description="Print the rule-pack JSON Schema (draft 2020-12) with the with: "
                                   "options of every registered stage type filled in.")
    p.set_defaults(func=run)


def full_schema() -> dict[str, Any]:
    import copy

    schema = copy.deepcopy(rulepack_schema())
    reg = default_registry()
    stage = schema["$defs"]["stage"]
    stage["properties"]["use"]["enum"] = sorted(reg.stages)
    stage["allOf"] = [
        {"if": {"properties": {"use": {"const": name}}, "required": ["use"]},
         "then": {"properties": {"with": options_schema_for(st)}}}
        for name, st in sorted(reg.stages.items())
    ]
    return schema


def run(args: argparse.Namespace) -> int:
    sys.stdout.write(json.dumps(full_schema(), indent=2) + "\n")
    return 0
