"""The defaults of ``context:``, read from the one place they are written: the pack JSON Schema
(``default:`` of each key in ``schemas/rulepack.v1.schema.json``).

A leaf module (it reads the schema file, nothing of the validator): the budget code imports it
without pulling in validation.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from ctxrules.resources import schema_path


@cache
def context_defaults() -> dict[str, Any]:
    """The default of every ``context:`` key, as the pack schema declares it. ``thresholds``
    maps each tier to its default; a key without a declared default (``safety_margin``: the
    tokenizer's) is absent."""
    with schema_path("rulepack.v1.schema.json").open(encoding="utf-8") as fh:
        schema: dict[str, Any] = json.load(fh)
    props = schema["properties"]["context"]["properties"]
    out: dict[str, Any] = {k: v["default"] for k, v in props.items() if "default" in v}
    out["thresholds"] = {k: v["default"] for k, v in props["thresholds"]["properties"].items()}
    return out
