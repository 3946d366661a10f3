"""JSON Schema checks of one pack file, turned into positioned diagnostics.

Each file is checked on its own (a child may hold partial items: only ``id`` is required there;
completeness is checked after merging). Stage options are checked later, on the resolved pack,
against the schema each stage type's plugin provides.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import cache
from typing import Any

from ctxrules.diagnostics import Diagnostic, did_you_mean
from ctxrules.packs.merge import ID_LISTS
from ctxrules.packs.semver import RangeError, check_requires, is_semver, parse_range
from ctxrules.packs.source import SourceDoc, escape_token
from ctxrules.resources import schema_path
from ctxrules.validation.quick import Check, compile_schema

_TYPE_NAMES = {
    "object": "a mapping",
    "array": "a list",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "null": "null",
}


@cache
def rulepack_schema() -> dict[str, Any]:
    """The schema one pack file is checked against: the shipped file without its registry part
    (stage and action options are checked after merging, against the installed plugins;
    see :mod:`ctxrules.validation.full_schema`)."""
    from ctxrules.validation.full_schema import strip_registry

    with schema_path("rulepack.v1.schema.json").open(encoding="utf-8") as fh:
        data: dict[str, Any] = json.load(fh)
    return strip_registry(data)


@cache
def _validator() -> Any:
    import jsonschema

    return jsonschema.Draft202012Validator(rulepack_schema())


@cache
def _quick() -> Check:
    return compile_schema(rulepack_schema())


def pointer_of(path: Iterable[Any]) -> str:
    return "".join(f"/{escape_token(str(p))}" for p in path)


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def _expected(types: Any) -> str:
    names = [types] if isinstance(types, str) else list(types)
    return " or ".join(_TYPE_NAMES.get(t, t) for t in names)


def schema_errors(doc: SourceDoc, data: Any, validator: Any, base_pointer: str = "") -> list[Diagnostic]:
    """Diagnostics for every schema violation in ``data`` (found at ``base_pointer`` in ``doc``)."""
    out: list[Diagnostic] = []
    for err in sorted(validator.iter_errors(data), key=lambda e: list(map(str, e.absolute_path))):
        out.extend(_convert(doc, err, base_pointer))
    return out


def _convert(doc: SourceDoc, err: Any, base: str) -> list[Diagnostic]:
    pointer = base + pointer_of(err.absolute_path)
    o = doc.origin(pointer)

    def diag(code: str, message: str, hint: str | None = None, at: str | None = None) -> Diagnostic:
        where = doc.key_origin(at) if at is not None else o
        return Diagnostic(code, "error", message, doc.path, where.line, where.col, at or pointer, hint)

    where = pointer or "the pack"
    v = err.validator
    if v == "additionalProperties":
        known = list(err.schema.get("properties", {}))
        extra = [k for k in err.instance if k not in known] if isinstance(err.instance, dict) else []
        return [
            diag(
                "CR010",
                f"unknown key '{k}' in {where}",
                did_you_mean(k, known) or ("allowed keys: " + ", ".join(known) if known else None),
                at=f"{pointer}/{escape_token(k)}",
            )
            for k in extra
        ]
    if v == "type":
        return [diag("CR011", f"{where} must be {_expected(err.validator_value)}, not {_type_name(err.instance)}")]
    if v == "const":
        if pointer in ("/apiVersion", "/kind"):
            return [diag("CR015", f"{pointer[1:]} must be '{err.validator_value}', not {err.instance!r}")]
        return [diag("CR012", f"{where} must be {err.validator_value!r}, not {err.instance!r}")]
    if v == "enum":
        allowed = ", ".join(str(a) for a in err.validator_value)
        hint = did_you_mean(str(err.instance), [str(a) for a in err.validator_value])
        return [diag("CR012", f"{where} is {err.instance!r}; allowed values: {allowed}", hint)]
    if v == "required":
        missing = err.message.split("'")[1] if "'" in err.message else err.message
        if pointer == "" and missing in ("apiVersion", "kind"):
            return [
                diag(
                    "CR015",
                    f"not a rule pack: '{missing}' is missing",
                    "a pack starts with `apiVersion: ctxrules/v1` and `kind: RulePack`",
                )
            ]
        if pointer in ("", "/metadata") and missing in ("metadata", "name", "version"):
            # Every pack names itself and carries a semantic version: reports, extends ranges
            # and snapshot names depend on them. Point at the metadata key when there is one.
            field = "metadata" if missing == "metadata" else f"metadata.{missing}"
            return [
                diag(
                    "CR013",
                    f"{field} is required: a pack declares metadata.name and metadata.version",
                    "e.g. metadata: {name: my-pack, version: 1.0.0}",
                    at="/metadata" if pointer else None,
                )
            ]
        return [diag("CR013", f"{where} needs '{missing}'")]
    if v == "oneOf" and isinstance(err.instance, dict) and {"template", "file"} & set(err.schema.get("properties", {})):
        has = [k for k in ("template", "file") if k in err.instance]
        what = "both" if len(has) == 2 else "neither"
        return [diag("CR013", f"{where} must have exactly one of 'template' or 'file' (it has {what})")]
    if v == "not":  # a value the schema reserves; its $comment says for what
        why = err.schema.get("$comment")
        return [diag("CR014", f"{where} may not be {err.instance!r}" + (f": {why}" if why else ""))]
    if v in ("oneOf", "anyOf") and err.context:
        return _alternatives(doc, err, base, diag, where)
    return [diag("CR014", f"{where}: {err.message}")]


def _alternatives(doc: SourceDoc, err: Any, base: str, diag: Any, where: str) -> list[Diagnostic]:
    """A value that fits none of a oneOf/anyOf: the problem inside the alternative of its type
    (``window: 0`` is an integer below the minimum), else the alternatives it could have been."""
    branches: dict[Any, list[Any]] = {}
    for sub in err.context:
        branches.setdefault(sub.relative_schema_path[0], []).append(sub)

    def at_value(sub: Any, *validators: str) -> bool:
        return sub.validator in validators and not sub.relative_path

    fitting = [subs for subs in branches.values() if not any(at_value(s, "type") for s in subs)]
    deeper = [subs for subs in fitting if not all(at_value(s, "const", "enum") for s in subs)]
    if deeper:
        return [d for sub in deeper[0] for d in _convert(doc, sub, base)]
    allowed: list[str] = []
    for subs in branches.values():
        for sub in subs:
            if at_value(sub, "type"):
                allowed.append(_expected(sub.validator_value))
            elif at_value(sub, "const"):
                allowed.append(repr(sub.validator_value))
            elif at_value(sub, "enum"):
                allowed.extend(repr(a) for a in sub.validator_value)
    allowed = list(dict.fromkeys(allowed))
    if fitting:  # right type, but not one of the listed values
        return [diag("CR012", f"{where} must be {' or '.join(allowed)}, not {err.instance!r}")]
    found = _type_name(err.instance)
    return [diag("CR011", f"{where} must be {' or '.join(allowed)}, not {found}")]


def check_document(doc: SourceDoc) -> list[Diagnostic]:
    """All per-file checks: shape, schema, duplicate ids, version fields."""
    if not isinstance(doc.data, dict):
        o = doc.origin("")
        what = f", not {_type_name(doc.data)}" if doc.data is not None else " (the file is empty)"
        return [Diagnostic("CR002", "error", "a rule pack must be a YAML mapping" + what, doc.path, o.line, o.col)]
    # jsonschema (imported only then) when the quick check is not sure the file is valid
    out = [] if _quick()(doc.data) is True else schema_errors(doc, doc.data, _validator())
    out.extend(_duplicate_ids(doc))
    meta = doc.data.get("metadata")
    if isinstance(meta, dict):
        version = meta.get("version")
        if isinstance(version, str) and not is_semver(version):
            o = doc.origin("/metadata/version")
            out.append(
                Diagnostic(
                    "CR020",
                    "error",
                    f"metadata.version '{version}' is not a semantic version",
                    doc.path,
                    o.line,
                    o.col,
                    "/metadata/version",
                    "write MAJOR.MINOR.PATCH, e.g. 1.0.0",
                )
            )
        requires = meta.get("requires")
        if isinstance(requires, str):
            o = doc.origin("/metadata/requires")
            try:
                parse_range(requires)
            except RangeError as exc:
                out.append(
                    Diagnostic(
                        "CR022",
                        "error",
                        f"metadata.requires does not parse: {exc}",
                        doc.path,
                        o.line,
                        o.col,
                        "/metadata/requires",
                    )
                )
            else:
                problem = check_requires(requires)
                if problem:
                    out.append(Diagnostic("CR021", "error", problem, doc.path, o.line, o.col, "/metadata/requires"))
    return out


def _duplicate_ids(doc: SourceDoc) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    for key in ID_LISTS:
        items = doc.data.get(key)
        if not isinstance(items, list):
            continue
        seen: dict[str, int] = {}
        for i, item in enumerate(items):
            ident = item.get("id") if isinstance(item, dict) else None
            if not isinstance(ident, str):
                continue
            if ident in seen:
                o = doc.origin(f"/{key}/{i}/id")
                first = doc.origin(f"/{key}/{seen[ident]}/id")
                out.append(
                    Diagnostic(
                        "CR040",
                        "error",
                        f"duplicate {key} id '{ident}' (first at line {first.line})",
                        doc.path,
                        o.line,
                        o.col,
                        f"/{key}/{i}/id",
                        "ids must be unique within a list; to change an inherited item, "
                        "write it once with the fields to override",
                    )
                )
            else:
                seen[ident] = i
    return out
