"""Checks of the regular expressions a pack writes (CR070 errors, CR102 warnings).

Every pattern is judged by :mod:`ctxrules.patterns`, the module that will run it: it must
compile under Python's ``re`` and be small enough to run in bounded time (CR070); one that
repeats a repetition (``(a+)+``) and runs on the backtracking engine gets a CR102 warning,
since such patterns can take exponential time on an unlucky input (they are cut off by the
per-match time limit, and the stage that uses them loses them for the session).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from functools import cache
from typing import Any, Protocol

from ctxrules import patterns
from ctxrules.diagnostics import Severity

__all__ = ["Findings", "check_pattern", "format_checker", "pattern_problem", "regex_values"]


class Findings(Protocol):
    """Where a check adds what it finds: a :class:`~ctxrules.diagnostics.Reporter`, or a
    recorder whose findings are replayed for each place the same value is checked."""

    def add(
        self,
        code: str,
        message: str,
        pointer: str,
        hint: str | None = None,
        severity: Severity = "error",
        *,
        at_key: bool = False,
    ) -> None: ...


def pattern_problem(pattern: object, flags: int = 0) -> str | None:
    """Why ``pattern`` cannot be used (None: it can, or it is not a string)."""
    if not isinstance(pattern, str):
        return None
    try:
        patterns.compile(pattern, flags)
    except re.error as exc:
        return str(exc)
    return None


@cache
def format_checker() -> Any:
    """A JSON-schema format checker whose ``regex`` format is :func:`pattern_problem`'s (one
    per process: it holds no state, and its verdicts come from the pattern memo)."""
    import jsonschema

    checker = jsonschema.FormatChecker([])

    @checker.checks("regex", raises=re.error)
    def _regex(instance: object) -> bool:
        if isinstance(instance, str):
            patterns.compile(instance)
        return True

    return checker


def check_pattern(rep: Findings, pattern: object, pointer: str, *, flags: int = 0, report_errors: bool = True) -> bool:
    """Report a pattern that does not compile (CR070, unless ``report_errors`` is off because
    a schema check reports it already) or has nested quantifiers (CR102). True when usable."""
    problem = pattern_problem(pattern, flags)
    if problem is not None:
        if report_errors:
            rep.add("CR070", f"regular expression {pattern!r} does not compile: {problem}", pointer)
        return False
    if isinstance(pattern, str) and patterns.nested_quantifier(pattern, flags):
        shown = pattern if len(pattern) <= 60 else pattern[:57] + "..."
        rep.add(
            "CR102",
            f"regular expression {shown!r} repeats a repetition (nested quantifiers) "
            "and runs on the backtracking engine: some inputs make it exponentially slow",
            pointer,
            "rewrite it without the outer repetition (e.g. (a+)+ is a+), or avoid "
            r"\d \w \s \b, lookarounds and backreferences so that it runs on RE2 (linear time)",
            severity="warning",
        )
    return True


def regex_values(schema: Mapping[str, Any], value: Any, pointer: str) -> Iterator[tuple[str, str]]:
    """(pointer, pattern) of every string in ``value`` that ``schema`` declares ``format: regex``."""
    if schema.get("format") == "regex" and isinstance(value, str):
        yield pointer, value
        return
    if isinstance(value, Mapping):
        props = schema.get("properties")
        if isinstance(props, Mapping):
            for key, sub in props.items():
                if key in value and isinstance(sub, Mapping):
                    yield from regex_values(sub, value[key], f"{pointer}/{key}")
    elif isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, Mapping):
            for i, item in enumerate(value):
                yield from regex_values(items, item, f"{pointer}/{i}")
    for combinator in ("anyOf", "oneOf", "allOf"):
        for sub in schema.get(combinator) or []:
            if isinstance(sub, Mapping):
                yield from regex_values(sub, value, pointer)
