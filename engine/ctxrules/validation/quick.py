"""A quick JSON-schema check that answers "valid", "invalid" or "not sure", never wrongly.

``ctxrules validate`` checks every pack file against the pack schema and every stage and
compressor step against its options schema. Nearly always everything is valid, and finding
that out with ``jsonschema`` cost a third of the run: importing it, then building an error
iterator for every value of every file. :func:`compile_schema` turns a schema into a plain
function for the keywords our schemas use (Draft 2020-12 semantics, as
``jsonschema.Draft202012Validator`` applies them). Its answer is one of

- ``True``: the instance is valid (``jsonschema`` would yield no error);
- ``False``: it is invalid (``jsonschema`` would yield at least one error);
- ``None``: not sure.

Callers trust only ``True``; on anything else they run ``jsonschema`` as before, which makes
the diagnostics (and their wording) exactly what they were. ``False`` exists so that
``oneOf``/``anyOf``/``if`` can decide from their branches. Wherever the semantics have a
corner we do not model -- a keyword we do not implement, a float where an integer is asked
for, an instance of an unusual Python type, containers in ``enum`` -- the answer is ``None``.
``tests/test_validation_quick.py`` compares it with ``jsonschema`` on every fixture and on
thousands of mutated documents.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ctxrules import patterns

__all__ = ["Check", "Verdict", "compile_schema", "for_schema", "remembered"]

Verdict = bool | None
"""True: valid; False: invalid; None: not sure."""

Check = Callable[[Any], Verdict]


def _every(verdicts: Iterable[Verdict]) -> Verdict:
    """All of ``verdicts`` together: False at the first False (the rest is not looked at), else
    None when one was not sure, else True."""
    verdict: Verdict = True
    for found in verdicts:
        if found is False:
            return False
        if found is None:
            verdict = None
    return verdict


# Keywords that never make an instance invalid (annotations, and places other keywords read).
_IGNORED = frozenset(
    {
        "title",
        "description",
        "default",
        "deprecated",
        "examples",
        "readOnly",
        "writeOnly",
        "$comment",
        "$defs",
        "$schema",
        "then",  # read by "if"; without an "if" it does nothing
        "else",
    }
)
_TYPES = frozenset({"object", "array", "string", "integer", "number", "boolean", "null"})
_SCALARS = (str, int, float, bool, type(None))


def _kind(value: Any) -> str | None:
    """The JSON type of ``value`` ("float" for a float), or None for a Python type we do not
    model (a str subclass, a date from YAML, a Decimal, a tuple, ...)."""
    t = type(value)
    if t is str:
        return "string"
    if t is bool:
        return "boolean"
    if t is int:
        return "integer"
    if t is float:
        return "float"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    return None


def _never_sure(_value: Any) -> Verdict:
    return None


def _always(_value: Any) -> Verdict:
    return True


def _never(_value: Any) -> Verdict:
    return False


def _is_limit(value: Any) -> bool:
    return type(value) in (int, float)


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _scalar_equal(a: Any, b: Any) -> bool:
    """``jsonschema._utils.equal`` for two scalars of the modelled types (no NaN): a boolean
    equals only itself (``True`` is not ``1``), numbers compare by value (``1 == 1.0``)."""
    if type(a) is bool or type(b) is bool:
        return a is b
    return bool(a == b)


class _Compiler:
    """Compiles the nodes of one schema document; ``$ref`` targets are compiled once each."""

    def __init__(self, root: Any, regex_format: bool) -> None:
        self.root = root
        self.regex_format = regex_format
        self.refs: dict[str, Check] = {}

    # -- nodes ---------------------------------------------------------------------------
    def node(self, schema: Any, *, at_root: bool = False) -> Check:
        if schema is True:
            return _always
        if schema is False:
            return _never
        if not isinstance(schema, Mapping):
            return _never_sure  # jsonschema would refuse the schema
        checks: list[Check] = []
        for key, value in schema.items():
            if key in _IGNORED or (key == "$id" and at_root):
                continue
            build = _KEYWORDS.get(key)
            check = build(self, value, schema) if build is not None else None
            if check is None:  # a keyword we do not model, or one with an odd value
                return _never_sure
            checks.append(check)
        return _combine(tuple(checks))

    def ref(self, target: Any) -> Check | None:
        if not isinstance(target, str) or not target.startswith("#"):
            return None  # only references within the document
        if target not in self.refs:
            # The node may refer to itself (directly or not): a forwarding slot breaks the loop.
            slot: list[Check] = []
            self.refs[target] = lambda value: slot[0](value)
            resolved = _resolve_pointer(self.root, target[1:])
            slot.append(self.node(resolved) if resolved is not _MISSING else _never_sure)
        return self.refs[target]


_MISSING = object()


def _resolve_pointer(root: Any, pointer: str) -> Any:
    if pointer == "":
        return root
    if not pointer.startswith("/"):
        return _MISSING  # an anchor, not a pointer
    node = root
    for raw in pointer[1:].split("/"):
        token = raw.replace("~1", "/").replace("~0", "~")
        if "%" in token:
            return _MISSING  # percent-encoding: not modelled
        if isinstance(node, Mapping) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return _MISSING
    return node


def _combine(checks: tuple[Check, ...]) -> Check:
    """All keywords of one node: invalid when any is, valid when all are."""
    if not checks:

        def anything(value: Any) -> Verdict:
            return True if _kind(value) is not None else None

        return anything
    if len(checks) == 1:
        only = checks[0]

        def one(value: Any) -> Verdict:
            if _kind(value) is None:
                return None
            return only(value)

        return one

    def every(value: Any) -> Verdict:
        if _kind(value) is None:
            return None
        return _every(check(value) for check in checks)

    return every


# -- keywords ----------------------------------------------------------------------------
# Each builder returns the check of one keyword (which may assume the instance is of a modelled
# type: the node checked that), or None when it cannot model the keyword's value.


def _type(c: _Compiler, value: Any, schema: Mapping[str, Any]) -> Check | None:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n in _TYPES for n in names):
        return None
    allowed = frozenset(names)
    numbers = "number" in allowed
    integers = numbers or "integer" in allowed

    def check(instance: Any) -> Verdict:
        kind = _kind(instance)
        if kind == "float":
            # A float with an integral value is an integer to Draft 2020-12: not modelled.
            return True if numbers else (None if integers else False)
        if kind == "integer":
            return integers
        return kind in allowed

    return check


def _enum(c: _Compiler, value: Any, schema: Mapping[str, Any]) -> Check | None:
    if not isinstance(value, list) or not all(type(e) in _SCALARS for e in value):
        return None
    if any(isinstance(e, float) and math.isnan(e) for e in value):
        return None
    options = tuple(value)

    def check(instance: Any) -> Verdict:
        if type(instance) not in _SCALARS or (isinstance(instance, float) and math.isnan(instance)):
            return None  # containers (and NaN) compare in ways not modelled here
        return any(_scalar_equal(instance, e) for e in options)

    return check


def _const(c: _Compiler, value: Any, schema: Mapping[str, Any]) -> Check | None:
    return _enum(c, [value], schema)


def _number_keyword(compare: Callable[[Any, Any], bool]) -> Callable[[_Compiler, Any, Mapping[str, Any]], Check | None]:
    def build(c: _Compiler, limit: Any, schema: Mapping[str, Any]) -> Check | None:
        if not _is_limit(limit):
            return None

        def check(instance: Any) -> Verdict:
            t = type(instance)
            if t is int or t is float:
                return compare(instance, limit)
            return True  # the keyword applies to numbers only (a boolean is not one)

        return check

    return build


def _length(longest: bool) -> Callable[[_Compiler, Any, Mapping[str, Any]], Check | None]:
    def build(c: _Compiler, limit: Any, schema: Mapping[str, Any]) -> Check | None:
        if not _is_count(limit):
            return None

        def check(instance: Any) -> Verdict:
            if type(instance) is not str:
                return True
            return bool(len(instance) <= limit if longest else len(instance) >= limit)

        return check

    return build


def _pattern(c: _Compiler, value: Any, schema: Mapping[str, Any]) -> Check | None:
    if not isinstance(value, str):
        return None
    try:
        compiled = re.compile(value)  # jsonschema runs `re.search(pattern, instance)`
    except re.error:
        return None

    def check(instance: Any) -> Verdict:
        if type(instance) is not str:
            return True
        return compiled.search(instance) is not None

    return check


def _format(c: _Compiler, value: Any, schema: Mapping[str, Any]) -> Check | None:
    if not c.regex_format:
        return _always  # a validator without a format checker treats format as an annotation
    if value != "regex":
        return None  # no other format is checked by ours; not modelled anyway

    def check(instance: Any) -> Verdict:
        if type(instance) is not str:
            return True
        try:
            patterns.compile(instance)  # what the format checker of validation.regexes runs
        except re.error:
            return False
        except Exception:  # jsonschema would let it through: not ours to decide
            return None
        return True

    return check


def _items(c: _Compiler, value: Any, schema: Mapping[str, Any]) -> Check | None:
    item = c.node(value)

    def check(instance: Any) -> Verdict:
        if not isinstance(instance, list):
            return True
        return _every(item(element) for element in instance)

    return check


def _min_items(c: _Compiler, value: Any, schema: Mapping[str, Any]) -> Check | None:
    if not _is_count(value):
        return None

    def check(instance: Any) -> Verdict:
        return not isinstance(instance, list) or len(instance) >= value

    return check


def _unique_items(c: _Compiler, value: Any, schema: Mapping[str, Any]) -> Check | None:
    if type(value) is not bool:
        return None
    if not value:
        return _always

    def check(instance: Any) -> Verdict:
        if not isinstance(instance, list):
            return True
        seen: set[tuple[str, Any]] = set()
        for element in instance:
            t = type(element)
            if t is bool:
                key: tuple[str, Any] = ("bool", element)
            elif t is int or (t is float and not math.isnan(element)):
                key = ("number", element)  # 1 and 1.0 are one value, as in jsonschema
            elif t is str:
                key = ("str", element)
            elif element is None:
                key = ("null", None)
            else:
                return None  # containers: not modelled
            if key in seen:
                return False
            seen.add(key)
        return True

    return check


def _required(c: _Compiler, value: Any, schema: Mapping[str, Any]) -> Check | None:
    if not isinstance(value, list) or not all(isinstance(k, str) for k in value):
        return None
    names = tuple(value)

    def check(instance: Any) -> Verdict:
        return not isinstance(instance, dict) or all(k in instance for k in names)

    return check


def _properties(c: _Compiler, value: Any, schema: Mapping[str, Any]) -> Check | None:
    if not isinstance(value, Mapping):
        return None
    subs = tuple((k, c.node(v)) for k, v in value.items())

    def check(instance: Any) -> Verdict:
        if not isinstance(instance, dict):
            return True
        return _every(sub(instance[key]) for key, sub in subs if key in instance)

    return check


def _additional_properties(c: _Compiler, value: Any, schema: Mapping[str, Any]) -> Check | None:
    if "patternProperties" in schema:
        return None
    known = schema.get("properties", {})
    if not isinstance(known, Mapping):
        return None
    if value is True:
        return _always
    extra = c.node(value)
    closed = value is False

    def check(instance: Any) -> Verdict:
        if not isinstance(instance, dict):
            return True
        return _every(False if closed else extra(instance[key]) for key in instance if key not in known)

    return check


def _ref(c: _Compiler, value: Any, schema: Mapping[str, Any]) -> Check | None:
    return c.ref(value)


def _branches(c: _Compiler, value: Any) -> tuple[Check, ...] | None:
    if not isinstance(value, list) or not value:
        return None
    return tuple(c.node(v) for v in value)


def _all_of(c: _Compiler, value: Any, schema: Mapping[str, Any]) -> Check | None:
    subs = _branches(c, value)
    return _combine(subs) if subs is not None else None


def _any_of(c: _Compiler, value: Any, schema: Mapping[str, Any]) -> Check | None:
    subs = _branches(c, value)
    if subs is None:
        return None

    def check(instance: Any) -> Verdict:
        verdict: Verdict = False
        for sub in subs:
            found = sub(instance)
            if found is True:
                return True
            if found is None:
                verdict = None
        return verdict

    return check


def _one_of(c: _Compiler, value: Any, schema: Mapping[str, Any]) -> Check | None:
    subs = _branches(c, value)
    if subs is None:
        return None

    def check(instance: Any) -> Verdict:
        valid = unsure = 0
        for sub in subs:
            found = sub(instance)
            if found is True:
                valid += 1
            elif found is None:
                unsure += 1
        if valid >= 2:
            return False
        if unsure:
            return None
        return valid == 1

    return check


def _if(c: _Compiler, value: Any, schema: Mapping[str, Any]) -> Check | None:
    condition = c.node(value)
    then = c.node(schema["then"]) if "then" in schema else _always
    otherwise = c.node(schema["else"]) if "else" in schema else _always

    def check(instance: Any) -> Verdict:
        holds = condition(instance)
        if holds is True:
            return then(instance)
        if holds is False:
            return otherwise(instance)
        a, b = then(instance), otherwise(instance)
        return a if a == b and a is not None else None

    return check


def _not(c: _Compiler, value: Any, schema: Mapping[str, Any]) -> Check | None:
    inner = c.node(value)

    def check(instance: Any) -> Verdict:
        holds = inner(instance)
        return None if holds is None else not holds

    return check


_KEYWORDS: dict[str, Callable[[_Compiler, Any, Mapping[str, Any]], Check | None]] = {
    "type": _type,
    "enum": _enum,
    "const": _const,
    "minimum": _number_keyword(lambda v, limit: not v < limit),
    "maximum": _number_keyword(lambda v, limit: not v > limit),
    "exclusiveMinimum": _number_keyword(lambda v, limit: not v <= limit),
    "exclusiveMaximum": _number_keyword(lambda v, limit: not v >= limit),
    "minLength": _length(longest=False),
    "maxLength": _length(longest=True),
    "pattern": _pattern,
    "format": _format,
    "items": _items,
    "minItems": _min_items,
    "uniqueItems": _unique_items,
    "required": _required,
    "properties": _properties,
    "additionalProperties": _additional_properties,
    "$ref": _ref,
    "allOf": _all_of,
    "anyOf": _any_of,
    "oneOf": _one_of,
    "if": _if,
    "not": _not,
}


def compile_schema(schema: Mapping[str, Any], *, regex_format: bool = False) -> Check:
    """The quick check of ``schema`` (a Draft 2020-12 schema whose references stay inside it).
    ``regex_format``: the validator it stands for has the format checker of
    :func:`ctxrules.validation.regexes.format_checker` (``format: regex`` compiles the string
    with :func:`ctxrules.patterns.compile`); without it, ``format`` is an annotation."""
    return _Compiler(schema, regex_format).node(schema, at_root=True)


def remembered(memo: dict[Any, Any], key: Any, schema: Mapping[str, Any], *, regex_format: bool = False) -> Check:
    """:func:`compile_schema` of ``schema``, kept in ``memo`` under ``key`` (a registry's
    ``checked``: each plugin's options schema is compiled once per registry)."""
    full = ("quick check", key, regex_format)
    check: Check | None = memo.get(full)
    if check is None:
        check = memo[full] = compile_schema(schema, regex_format=regex_format)
    return check


_BY_IDENTITY: dict[tuple[int, bool], tuple[Mapping[str, Any], Check]] = {}


def for_schema(schema: Mapping[str, Any], *, regex_format: bool = False) -> Check:
    """:func:`compile_schema` of ``schema``, once per schema object in the process (for
    module-level schemas such as a stage's ``OPTIONS_SCHEMA``, checked every time the stage
    is built). The entry keeps the schema alive, so its id cannot be reused by another."""
    key = (id(schema), regex_format)
    entry = _BY_IDENTITY.get(key)
    if entry is None or entry[0] is not schema:
        if len(_BY_IDENTITY) >= 1024:  # schemas made on the fly (tests, embedding code)
            _BY_IDENTITY.clear()
        entry = _BY_IDENTITY[key] = (schema, compile_schema(schema, regex_format=regex_format))
    return entry[1]
