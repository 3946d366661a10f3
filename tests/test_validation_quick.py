"""The quick schema check (``ctxrules.validation.quick``) against ``jsonschema`` itself.

``ctxrules validate`` trusts the quick check when it says "valid" and runs ``jsonschema`` on
anything else, so its one duty is never to say "valid" where ``jsonschema`` finds an error
(and, because ``oneOf``/``anyOf``/``if`` decide from it, never "invalid" where ``jsonschema``
finds none). Compared here on every pack file of the repository (fixtures, built-in rules,
examples), every stage and compressor step in them, and thousands of mutations of those:
wrong types, integral floats, booleans for numbers, extra keys, missing required keys,
numbers at and beyond their limits, strings around their lengths, enum near-misses, patterns
that do not compile.
"""

from __future__ import annotations

import copy
import datetime
import random
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from ctxrules.packs.source import YamlProblem, parse_yaml
from ctxrules.plugins import default_registry
from ctxrules.stages.base import options_schema_for
from ctxrules.validation import quick
from ctxrules.validation.regexes import format_checker
from ctxrules.validation.schema import rulepack_schema

REPO = Path(__file__).resolve().parents[1]
PACK_FOLDERS = (REPO / "tests", REPO / "rules", REPO / "examples", REPO / "docs")

# Strings that stand for patterns: fine, not compiling, compiling only in `re`'s parser
# (a variable-width look-behind fails in its compiler), nested quantifiers, huge counts.
_PATTERNS = ["ok", "(", "[a-", "a{2,1}", "(?<=a+)b", "(a+)+$", "x{4294967294}", r"\d+", "(?P<n>x)"]
_ODD_VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    1,
    -1,
    2,
    1.0,
    2.5,
    -0.5,
    float("inf"),
    float("nan"),
    10**30,
    "",
    "x",
    "1",
    "true",
    [],
    [1],
    ["a", "a"],
    ["a", "b"],
    [True, 1],
    [1, 1.0],
    {},
    {"a": 1},
    {1: "a"},
    datetime.date(2024, 1, 1),
    *_PATTERNS,
]


def _documents() -> list[tuple[str, Any]]:
    out = []
    for folder in PACK_FOLDERS:
        for path in sorted(folder.rglob("*.y*ml")):
            if path.suffix not in (".yaml", ".yml") or "__snapshots__" in path.parts:
                continue
            try:
                doc = parse_yaml(path.read_text(encoding="utf-8"), str(path))
            except (YamlProblem, UnicodeDecodeError):
                continue
            out.append((str(path.relative_to(REPO)), doc.data))
    return out


DOCUMENTS = _documents()


def _option_cases(registry: Any) -> list[tuple[str, dict[str, Any], Any]]:
    """(what, options schema, ``with:`` value) for every stage and step the documents hold,
    plus ``{}`` and the schema's defaults for every stage type and action."""
    stages = {name: options_schema_for(st) for name, st in registry.stages.items()}
    actions = {name: dict(a.options_schema) for name, a in registry.actions.items()}
    out: list[tuple[str, dict[str, Any], Any]] = []
    for kind, schemas in (("stage", stages), ("action", actions)):
        for name, schema in sorted(schemas.items()):
            out.append((f"{kind} {name}", schema, {}))
            defaults = {k: p["default"] for k, p in schema.get("properties", {}).items() if "default" in p}
            out.append((f"{kind} {name} defaults", schema, defaults))
    for where, data in DOCUMENTS:
        if not isinstance(data, dict):
            continue
        for item in data.get("pipeline") or []:
            if isinstance(item, dict) and item.get("use") in stages and "with" in item:
                out.append((f"{where} {item['use']}", stages[item["use"]], item["with"]))
        for rule in data.get("compressors") or []:
            for step in (rule.get("steps") or []) if isinstance(rule, dict) else []:
                if isinstance(step, dict) and step.get("use") in actions and "with" in step:
                    out.append((f"{where} {step['use']}", actions[step["use"]], step["with"]))
    return out


def _containers(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    yield path, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _containers(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _containers(v, (*path, i))


def _near(schema: Any) -> list[Any]:
    """Values at and around what ``schema`` allows: limits, lengths, enum members and misses."""
    if not isinstance(schema, Mapping):
        return []
    out: list[Any] = []
    for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        limit = schema.get(key)
        if isinstance(limit, int | float) and not isinstance(limit, bool):
            out += [limit, limit - 1, limit + 1, limit - 0.5, limit + 0.5, float(limit)]
    for key in ("minLength", "maxLength", "minItems"):
        n = schema.get(key)
        if isinstance(n, int):
            out += ["x" * max(n - 1, 0), "x" * n, "x" * (n + 1), ["x"] * max(n - 1, 0), ["x"] * n]
    for e in schema.get("enum") or []:
        out += [e, f"{e}x", str(e).upper()]
    if "const" in schema:
        out += [schema["const"], f"{schema['const']}!"]
    if "default" in schema:
        out.append(copy.deepcopy(schema["default"]))
    for key in ("items", "additionalProperties"):
        out += _near(schema.get(key))
    for sub in (schema.get("properties") or {}).values():
        out += _near(sub)
    for key in ("oneOf", "anyOf", "allOf"):
        for sub in schema.get(key) or []:
            out += _near(sub)
    return out


def _mutate(rng: random.Random, value: Any, pool: list[Any]) -> Any:
    """A deep copy of ``value`` with one random change somewhere inside."""
    value = copy.deepcopy(value)
    spots = list(_containers(value))
    path, target = rng.choice(spots)
    parent = value
    for step in path[:-1]:
        parent = parent[step]
    op = rng.randrange(6)
    if op == 0 and isinstance(target, dict) and target:  # drop a key
        del target[rng.choice(list(target))]
    elif op == 1 and isinstance(target, dict):  # add a key, known elsewhere or not
        target[rng.choice(["zzz", "id", "use", "with", "match", "steps", "max", "pattern", 1])] = rng.choice(pool)
    elif op == 2 and isinstance(target, list) and target:  # duplicate or drop an item
        if rng.random() < 0.5:
            target.append(copy.deepcopy(rng.choice(target)))
        else:
            target.pop(rng.randrange(len(target)))
    elif path:  # replace the value
        parent[path[-1]] = copy.deepcopy(rng.choice(pool))
    else:
        value = copy.deepcopy(rng.choice(pool))
    return value


def _compare(check: quick.Check, validator: Any, instance: Any, what: str, tally: dict[str, int]) -> None:
    verdict = check(instance)
    valid = validator.is_valid(instance)
    tally[f"{verdict}-{valid}"] = tally.get(f"{verdict}-{valid}", 0) + 1
    assert not (verdict is True and not valid), f"{what}: quick says valid, jsonschema finds {instance!r} invalid"
    assert not (verdict is False and valid), f"{what}: quick says invalid, jsonschema finds {instance!r} valid"


def test_the_built_in_rules_are_certainly_valid_at_once() -> None:
    """What makes ``ctxrules validate rules/`` skip jsonschema: every built-in file, stage
    and step is judged valid without it."""
    check = quick.compile_schema(rulepack_schema())
    rules = [(w, d) for w, d in DOCUMENTS if w.startswith("rules/")]
    assert len(rules) >= 18
    assert [w for w, d in rules if check(d) is not True] == []
    registry = default_registry()
    options = [c for c in _option_cases(registry) if c[0].startswith("rules/")]
    assert options
    unsure = [w for w, schema, v in options if quick.compile_schema(schema, regex_format=True)(v) is not True]
    assert unsure == []


def test_pack_files_and_their_mutations_agree_with_jsonschema() -> None:
    schema = rulepack_schema()
    check = quick.compile_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    rng = random.Random(20261201)
    tally: dict[str, int] = {}
    pool = _ODD_VALUES + _near(schema) + [d for _, d in DOCUMENTS[:3]]
    for where, data in DOCUMENTS:
        _compare(check, validator, data, where, tally)
    docs = [d for _, d in DOCUMENTS if isinstance(d, dict)]
    small = sorted(docs, key=lambda d: len(repr(d)))[: max(len(docs) * 3 // 4, 1)]
    for n in range(1500):
        base = rng.choice(small)
        mutated = _mutate(rng, base, pool)
        if rng.random() < 0.3:
            mutated = _mutate(rng, mutated, pool)
        _compare(check, validator, mutated, f"mutation {n}", tally)
    # Sound is not enough: the check must also decide, or validate gains nothing.
    assert tally.get("True-True", 0) > 0.3 * (tally.get("True-True", 0) + tally.get("None-True", 0)), tally
    assert tally.get("True-False", 0) == tally.get("False-True", 0) == 0


@pytest.mark.parametrize("regex_format", [True, False])
def test_stage_and_step_options_and_their_mutations_agree_with_jsonschema(regex_format: bool) -> None:
    registry = default_registry()
    rng = random.Random(1201 + regex_format)
    tally: dict[str, int] = {}
    cases = _option_cases(registry)
    assert len(cases) > 100
    checker = format_checker() if regex_format else None
    compiled: dict[int, tuple[quick.Check, Any]] = {}
    for what, schema, value in cases:
        if id(schema) not in compiled:
            compiled[id(schema)] = (
                quick.compile_schema(schema, regex_format=regex_format),
                jsonschema.Draft202012Validator(schema, format_checker=checker),
            )
        check, validator = compiled[id(schema)]
        _compare(check, validator, value, what, tally)
        pool = _ODD_VALUES + _near(schema)
        for n in range(12):
            mutated = _mutate(rng, value, pool)
            _compare(check, validator, mutated, f"{what} mutation {n}", tally)
    decided = tally.get("True-True", 0) + tally.get("False-False", 0)
    assert decided > 0.5 * sum(tally.values()), tally


# -- corners, one by one -------------------------------------------------------------------


class _Text(str):
    pass


@pytest.mark.parametrize(
    ("schema", "instance", "expected"),
    [
        ({"type": "integer"}, 3, True),
        ({"type": "integer"}, True, False),  # a boolean is not an integer
        ({"type": "integer"}, 3.0, None),  # integral floats are integers to 2020-12: not modelled
        ({"type": "integer"}, 3.5, None),
        ({"type": "number"}, 3.5, True),
        ({"type": "number"}, False, False),
        ({"type": ["string", "null"]}, None, True),
        ({"type": "string"}, _Text("x"), None),  # a str subclass
        ({"type": "string"}, datetime.date(2024, 1, 1), None),
        ({"enum": [1, 2]}, True, False),  # True is not 1
        ({"enum": [1, 2]}, 1.0, True),  # but 1.0 is
        ({"enum": [[1]]}, [1], None),  # containers in an enum: not modelled
        ({"const": None}, None, True),
        ({"minimum": 1}, "text", True),  # number keywords skip other types
        ({"minimum": 1}, True, True),  # ... booleans included
        ({"exclusiveMinimum": 0}, 0, False),
        ({"maximum": 1}, float("nan"), True),  # as jsonschema compares
        ({"minLength": 2}, "ab", True),
        ({"maxLength": 1}, "ab", False),
        ({"uniqueItems": True}, [1, 1.0], False),
        ({"uniqueItems": True}, [1, True], True),
        ({"uniqueItems": True}, [[1], [1]], None),
        ({"pattern": "^a"}, "ba", False),
        ({"required": ["a"]}, {"b": 1}, False),
        ({"properties": {"a": {"type": "string"}}, "additionalProperties": False}, {1: "x"}, False),
        ({"additionalProperties": {"type": "integer"}}, {"a": 1}, True),
        ({"oneOf": [{"type": "integer"}, {"minimum": 0}]}, 3, False),  # valid under both
        ({"oneOf": [{"type": "integer"}, {"type": "string"}]}, 3, True),
        ({"oneOf": [{"type": "integer"}, {"type": "string"}]}, 3.0, None),
        ({"anyOf": [{"type": "integer"}, {"type": "string"}]}, None, False),
        ({"if": {"required": ["a"]}, "then": {"required": ["b"]}}, {"a": 1}, False),
        ({"if": {"required": ["a"]}, "then": {"required": ["b"]}}, {"c": 1}, True),
        ({"then": {"required": ["b"]}}, {}, True),  # then without if does nothing
        ({"patternProperties": {"^x": {}}}, {}, None),  # keywords not modelled
        ({"not": {}}, 1, False),  # the empty schema admits everything: its negation nothing
        ({"not": {"const": "no-entry"}}, "no-entry", False),
        ({"not": {"const": "no-entry"}}, "mine", True),
        ({"not": {"type": "integer"}}, 1.0, None),  # an integral float: not modelled, not negated
        ({"not": {"contains": {}}}, [1], None),
        ({"x-custom": 1}, 1, None),
        ({"$ref": "#/$defs/n", "$defs": {"n": {"type": "integer"}}}, "x", False),
        ({"$ref": "https://example.com/s.json"}, 1, None),
        ({"format": "regex"}, "(", True),  # without the format checker, format is an annotation
    ],
)
def test_corners(schema: dict[str, Any], instance: Any, expected: bool | None) -> None:
    assert quick.compile_schema(schema)(instance) is expected
    if expected is not None:
        assert jsonschema.Draft202012Validator(schema).is_valid(instance) is expected


def test_regex_format_is_the_pattern_module_verdict() -> None:
    schema = {"type": "object", "properties": {"p": {"type": "string", "format": "regex"}}}
    check = quick.compile_schema(schema, regex_format=True)
    validator = jsonschema.Draft202012Validator(schema, format_checker=format_checker())
    for pattern in _PATTERNS:
        verdict = check({"p": pattern})
        assert verdict is validator.is_valid({"p": pattern}), pattern
    assert quick.compile_schema({"format": "date"}, regex_format=True)("x") is None


def test_a_schema_that_refers_to_itself_is_compiled_once() -> None:
    schema = {
        "$defs": {
            "tree": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/tree"}}}}
        },
        "$ref": "#/$defs/tree",
    }
    check = quick.compile_schema(schema)
    deep: dict[str, Any] = {"kids": []}
    node = deep
    for _ in range(50):
        child: dict[str, Any] = {"kids": []}
        node["kids"].append(child)
        node = child
    assert check(deep) is True
    node["kids"].append(1)
    assert check(deep) is False
