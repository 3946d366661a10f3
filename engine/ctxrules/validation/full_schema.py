"""The rule-pack JSON Schema with the registry filled in: what ``ctxrules schema`` prints and
what ``schemas/rulepack.v1.schema.json`` holds for the built-in plugins.

The schema file is both the source and the product. Its hand-written part describes every pack
key; the *registry part* is generated: for each pipeline stage type and each compressor action,
the ``use:`` names it may take and, through ``if use == NAME then with: OPTIONS``, the options
with their titles, descriptions and defaults. Validation of a single pack file
(:func:`ctxrules.validation.schema.rulepack_schema`) removes the registry part again: stage and
action options are checked on the merged pack against the plugins installed at that moment,
which a file generated for the built-ins cannot know. Regenerating is therefore idempotent, and
a change to the hand-written part survives it::

    python -m ctxrules.cli.main schema > schemas/rulepack.v1.schema.json
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ctxrules.plugins import Registry


def _stage_node(schema: dict[str, Any]) -> dict[str, Any]:
    node: dict[str, Any] = schema["$defs"]["stage"]
    return node


def _step_node(schema: dict[str, Any]) -> dict[str, Any]:
    node: dict[str, Any] = schema["$defs"]["compressor"]["properties"]["steps"]["items"]
    return node


def strip_registry(schema: Mapping[str, Any]) -> dict[str, Any]:
    """``schema`` without its registry part. The nodes on the way to the stage and step nodes
    are copies (callers fill those nodes in again); the rest is shared with ``schema`` (a deep
    copy of the whole schema cost a few milliseconds of every ``ctxrules validate``)."""
    out = dict(schema)
    defs = out["$defs"] = dict(out["$defs"])
    defs["stage"] = _stripped(defs["stage"])
    compressor = defs["compressor"] = dict(defs["compressor"])
    props = compressor["properties"] = dict(compressor["properties"])
    steps = props["steps"] = dict(props["steps"])
    steps["items"] = _stripped(steps["items"])
    return out


def _stripped(node: Mapping[str, Any]) -> dict[str, Any]:
    """A stage or step node without ``allOf`` and without the ``enum`` of its ``use``."""
    out = {k: v for k, v in node.items() if k != "allOf"}
    props = out["properties"] = dict(out["properties"])
    props["use"] = {k: v for k, v in props["use"].items() if k != "enum"}
    return out


def _without_regex_format(node: Any) -> Any:
    """A copy without ``format: regex``. JSON Schema's ``regex`` format is ECMA-262, and pack
    patterns are Python's (``(?P<name>...)``, inline ``(?i)``): an editor would flag valid
    patterns. ``ctxrules validate`` compiles them with Python's ``re`` (CR070)."""
    if isinstance(node, Mapping):
        return {k: _without_regex_format(v) for k, v in node.items() if not (k == "format" and v == "regex")}
    if isinstance(node, list):
        return [_without_regex_format(v) for v in node]
    return node


def _options_by_name(names_and_schemas: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "if": {"properties": {"use": {"const": name}}, "required": ["use"]},
            "then": {"properties": {"with": _without_regex_format(options)}},
        }
        for name, options in sorted(names_and_schemas.items())
    ]


def full_schema(registry: Registry | None = None) -> dict[str, Any]:
    """The hand-written schema plus the registry part for ``registry`` (default: every
    installed plugin, built-ins included)."""
    from ctxrules.resources import schema_path
    from ctxrules.stages.base import options_schema_for

    if registry is None:
        from ctxrules.plugins import default_registry

        registry = default_registry()
    # the hand-written part, read here (validation.schema imports this module, not the reverse)
    with schema_path("rulepack.v1.schema.json").open(encoding="utf-8") as fh:
        schema = strip_registry(json.load(fh))
    stage, step = _stage_node(schema), _step_node(schema)
    stage["properties"]["use"]["enum"] = sorted(registry.stages)
    stage["allOf"] = _options_by_name({n: options_schema_for(st) for n, st in registry.stages.items()})
    step["properties"]["use"]["enum"] = sorted(registry.actions)
    step["allOf"] = _options_by_name({n: a.options_schema for n, a in registry.actions.items()})
    return schema


def dumps(schema: Mapping[str, Any]) -> str:
    """The file's text: two-space indents, ASCII, a final newline."""
    return json.dumps(schema, indent=2) + "\n"
