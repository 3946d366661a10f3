"""The structured summary: its 14 fields, validation against ``summary.v1.schema.json``, and a
stable id.

The schema file is the single source of the field list, the limits (``blocked_items`` ≤ 3,
``next_steps`` ≤ 5) and the field descriptions the summarizer prompt quotes, so the prompt, the
validator and the docs can never disagree.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from functools import cache
from typing import Any

from ctxrules.resources import schema_path

__all__ = [
    "FIELDS",
    "LIST_FIELDS",
    "SCHEMA_NAME",
    "Summary",
    "coerce_summary",
    "field_descriptions",
    "field_problems",
    "list_limit",
    "summary_schema",
    "validate_summary",
]

SCHEMA_NAME = "summary.v1.schema.json"


@cache
def summary_schema() -> dict[str, Any]:
    """The parsed ``schemas/summary.v1.schema.json``."""
    with schema_path(SCHEMA_NAME).open(encoding="utf-8") as fh:
        data: dict[str, Any] = json.load(fh)
    return data


@cache
def _validator() -> Any:
    import jsonschema

    return jsonschema.Draft202012Validator(summary_schema())


@dataclass(frozen=True)
class Summary:
    """A summary as ctxrules keeps it. Lists are tuples; field order is the rendering order."""

    user_goal: str
    constraints: tuple[str, ...] = ()
    active_tasks: tuple[str, ...] = ()
    completed_actions: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    decisions: tuple[str, ...] = ()
    open_questions: tuple[str, ...] = ()
    relevant_files: tuple[str, ...] = ()
    key_facts: tuple[str, ...] = ()
    tool_state: tuple[str, ...] = ()
    pending_user_asks: tuple[str, ...] = ()
    risks: tuple[str, ...] = ()
    blocked_items: tuple[str, ...] = ()
    next_steps: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Summary:
        """Build from a mapping that :func:`validate_summary` accepted."""
        values: dict[str, Any] = {"user_goal": str(data.get("user_goal", ""))}
        for name in LIST_FIELDS:
            raw = data.get(name) or ()
            values[name] = tuple(str(item) for item in raw)
        return cls(**values)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"user_goal": self.user_goal}
        for name in LIST_FIELDS:
            out[name] = list(getattr(self, name))
        return out

    @property
    def id(self) -> str:
        """A stable short id: sha256 of the canonical JSON, 16 hex digits."""
        canonical = json.dumps(self.as_dict(), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]

    def items(self) -> int:
        """How many list entries the summary holds."""
        return sum(len(getattr(self, name)) for name in LIST_FIELDS)


FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Summary))
LIST_FIELDS: tuple[str, ...] = FIELDS[1:]


def _check_schema_matches() -> None:
    # The dataclass and the schema file must name the same fields in the same order.
    schema_fields = tuple(summary_schema()["properties"])
    if schema_fields != FIELDS:  # pragma: no cover - guards a packaging mistake
        raise RuntimeError(f"{SCHEMA_NAME} fields {schema_fields} differ from Summary {FIELDS}")


def validate_summary(data: object) -> list[str]:
    """Every schema violation of ``data``, as ``"<field>: <message>"`` (empty when valid)."""
    _check_schema_matches()
    if not isinstance(data, Mapping):
        return [f"expected a JSON object, got {type(data).__name__}"]
    errors = []
    for err in sorted(_validator().iter_errors(dict(data)), key=lambda e: list(map(str, e.absolute_path))):
        where = "/".join(str(p) for p in err.absolute_path) or "summary"
        message = err.message
        if len(message) > 200:
            message = message[:200] + "…"
        errors.append(f"{where}: {message}")
    return errors


_BULLET = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+")


def coerce_summary(data: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``data`` with the simple type slips a model makes put right, and what was put right.

    A string where a list of strings is expected becomes a list (one entry per bullet line when
    it is a bulleted list, else one entry); numbers and booleans become strings; a missing or
    null list is empty; blank entries are dropped; a list over its ``maxItems`` keeps its first
    entries; an unknown key is dropped. Anything else (an object where a string is expected,
    say) is left for :func:`field_problems` to report.
    """
    notes: list[str] = []
    out: dict[str, Any] = {}
    for key in data:
        if key not in FIELDS:
            notes.append(f"dropped the unknown field {str(key)[:60]!r}")
    goal = data.get("user_goal")
    if isinstance(goal, int | float) and not isinstance(goal, bool):
        goal = str(goal)
        notes.append("user_goal: a number, read as text")
    elif isinstance(goal, list) and goal and all(isinstance(g, str) for g in goal):
        goal = "; ".join(g.strip() for g in goal if g.strip())
        notes.append("user_goal: a list, joined into one text")
    out["user_goal"] = goal
    for name in LIST_FIELDS:
        value = data.get(name)
        if value is None:
            if name in data:
                notes.append(f"{name}: null, read as an empty list")
            else:
                notes.append(f"{name}: missing, read as an empty list")
            value = []
        elif isinstance(value, str):
            lines = [ln for ln in value.splitlines() if ln.strip()]
            if len(lines) > 1 and all(_BULLET.match(ln) for ln in lines):
                value = [_BULLET.sub("", ln).strip() for ln in lines]
            else:
                value = [value]
            notes.append(f"{name}: a string, read as a list of {len(value)}")
        elif isinstance(value, int | float | bool):
            notes.append(f"{name}: a {type(value).__name__}, read as a list of one")
            value = [str(value).lower() if isinstance(value, bool) else str(value)]
        if isinstance(value, list):
            items = []
            for item in value:
                if isinstance(item, bool):
                    item = str(item).lower()
                elif isinstance(item, int | float):
                    item = str(item)
                if isinstance(item, str) and not item.strip():
                    continue
                items.append(item)
            if len(items) != len(value):
                notes.append(f"{name}: entries that were not text were read as text or dropped")
            limit = list_limit(name)
            if limit is not None and len(items) > limit:
                notes.append(f"{name}: kept the first {limit} of {len(items)} entries")
                items = items[:limit]
            value = items
        out[name] = value
    return out, notes


@cache
def _field_validators() -> dict[str, Any]:
    import jsonschema

    schema = summary_schema()
    return {
        name: jsonschema.Draft202012Validator({**prop, "$defs": schema.get("$defs", {})})
        for name, prop in schema["properties"].items()
    }


def field_problems(data: Mapping[str, Any]) -> dict[str, str]:
    """For each field of ``data`` that does not validate on its own, the first problem."""
    problems: dict[str, str] = {}
    for name, validator in _field_validators().items():
        if name not in data:
            problems[name] = "missing"
            continue
        error = next(iter(validator.iter_errors(data[name])), None)
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path)
            message = error.message if len(error.message) <= 200 else error.message[:200] + "…"
            problems[name] = f"{where + ': ' if where else ''}{message}"
    return problems


def list_limit(name: str) -> int | None:
    """The schema's ``maxItems`` of a list field."""
    value = summary_schema()["properties"][name].get("maxItems")
    return int(value) if isinstance(value, int) else None


def field_descriptions() -> dict[str, str]:
    """Each field's description from the schema, in field order."""
    props = summary_schema()["properties"]
    return {name: str(props[name].get("description", "")) for name in FIELDS}
