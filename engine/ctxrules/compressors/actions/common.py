"""Option schemas and helpers shared by the built-in actions."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeAlias

from ctxrules.compressors.lines import Line, Lines
from ctxrules.patterns import Match, Pattern, candidate_lines, timed_out_before
from ctxrules.patterns import compile as patterns_compile

ActionSpec: TypeAlias = tuple[str, Callable[[Mapping[str, Any]], Callable[[Lines], list[str]]], dict[str, Any], str]
"""What a built-in action module lists: name, factory, options schema, description."""

# What a failure looks like in any tool's output; the default `unless` of short_circuit and
# the default `protect` of max_lines.
FAILURE_PATTERN = (
    r"(?i)\b(?:error|errors|fatal|fail|failed|failures?|panic|panicked|exception"
    r"|traceback|segmentation fault|abort(?:ed)?|denied|not found|cannot|can't|unable)\b"
)


def regex(title: str, description: str) -> dict[str, Any]:
    """Schema of one regular expression option (``format: regex`` is checked by validate)."""
    return {
        "type": "string",
        "format": "regex",
        "minLength": 1,
        "title": title,
        "description": description,
    }


def regex_list(title: str, description: str) -> dict[str, Any]:
    return {
        "type": "array",
        "items": {"type": "string", "format": "regex", "minLength": 1},
        "minItems": 1,
        "title": title,
        "description": description,
    }


def count(title: str, description: str, minimum: int = 0, default: int | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer", "minimum": minimum, "title": title, "description": description}
    if default is not None:
        schema["default"] = default  # filled in before the action is built (ActionType.configure)
    return schema


def object_schema(
    properties: Mapping[str, Any], required: Sequence[str] = (), defaults: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """An action's options schema; ``defaults`` are the values the factory uses for options left
    out, written into the schema (editors show them; the published schema file carries them)."""
    props = {k: dict(v) for k, v in properties.items()}
    for key, value in (defaults or {}).items():
        props[key]["default"] = value
    schema: dict[str, Any] = {
        "type": "object",
        "additionalProperties": False,
        "properties": props,
    }
    if required:
        schema["required"] = list(required)
    return schema


class Matcher(Protocol):
    """Anything with ``search`` like a compiled pattern."""

    def search(self, text: str) -> Match | None: ...


def compile_all(patterns: Sequence[str]) -> Matcher | None:
    """One pattern that matches where any of ``patterns`` does (None for none)."""
    if not patterns:
        return None
    if len(patterns) == 1:
        return patterns_compile(patterns[0])
    return _Alternation([patterns_compile(p) for p in patterns])


_GLOBAL_FLAGS = re.compile(r"^\(\?([aiLmsux]+)\)")


def _scoped(pattern: str) -> str:
    found = _GLOBAL_FLAGS.match(pattern)
    if found is None:
        return f"(?:{pattern})"
    flags = found.group(1)
    if "a" in flags or "L" in flags or "u" in flags:
        raise re.error("flag cannot be scoped")  # only in the global form: keep separate
    return f"(?{flags}:{pattern[found.end() :]})"


class _Alternation:
    """Quacks like a compiled pattern for ``search``: one alternation of its members, built on
    the first search. One alternation is much faster than trying each pattern in turn, but
    building it costs as much as judging its members again, and an action built only to check
    its options (``ctxrules validate`` builds every step of a pack) never searches."""

    def __init__(self, patterns: list[Pattern]) -> None:
        self.patterns = patterns
        self._matcher: Matcher | None = None

    def search(self, text: str) -> Match | None:
        if self._matcher is None:
            self._matcher = _combine(self.patterns)
        return self._matcher.search(text)


def _combine(compiled: list[Pattern]) -> Matcher:
    # A leading global flag group ("(?i)...") is an error in the middle of an alternation, so
    # it becomes a scoped one ("(?i:...)"); patterns that still do not combine are tried one
    # by one.
    try:
        return patterns_compile("|".join(_scoped(p.pattern) for p in compiled))
    except re.error:
        return _AnyOf(compiled)


class _AnyOf:
    """Quacks like a compiled pattern for ``search``: matches when any member does."""

    def __init__(self, patterns: list[Pattern]) -> None:
        self.patterns = patterns

    def search(self, text: str) -> Match | None:
        for pattern in self.patterns:
            found = pattern.search(text)
            if found is not None:
                return found
        return None


def matching(matcher: Matcher, lines: Sequence[str]) -> Iterator[int]:
    """The indexes, ascending, of the ``lines`` that ``matcher`` finds something in: what
    searching each line gives, with the lines none of its patterns can match left out first
    (:func:`ctxrules.patterns.candidate_lines`: one search of all lines per pattern). Lazy: a
    caller that has seen enough stops the searches of the lines after."""
    members = _members(matcher)
    found = candidate_lines(members, lines) if members and not _timed_out_before(matcher) else None
    search = matcher.search
    for i in range(len(lines)) if found is None else found:
        if search(lines[i]) is not None:
            yield i


def _members(matcher: Matcher) -> list[Pattern] | None:
    """The pack patterns a matcher of :func:`compile_all` searches for (None: unknown)."""
    if isinstance(matcher, Pattern):
        return [matcher]
    if isinstance(matcher, (_Alternation, _AnyOf)):
        return matcher.patterns
    return None


def _timed_out_before(matcher: Matcher) -> bool:
    """Whether the pattern a search of ``matcher`` runs is remembered as timed out: it is then
    searched line by line, so that its first search reports it as it always did."""
    if isinstance(matcher, _Alternation):
        if matcher._matcher is None:
            matcher._matcher = _combine(matcher.patterns)
        return _timed_out_before(matcher._matcher)
    if isinstance(matcher, _AnyOf):
        return any(_timed_out_before(p) for p in matcher.patterns)
    return isinstance(matcher, Pattern) and timed_out_before(matcher)


def is_blank(line: str) -> bool:
    return not line.strip()


def fold(lines: Sequence[str], text: str) -> str:
    """One line that stands for all of ``lines`` when they are contiguous originals.

    When they are not (an earlier step dropped lines between them) the result stands only for
    the first, so the engine still marks the others as elided: a range must never claim lines
    it does not show.
    """
    first = lines[0]
    if not isinstance(first, Line):
        return text
    start, end = first.src
    for line in lines[1:]:
        if not isinstance(line, Line) or line.src[0] != end + 1:
            return Line(text, first.src)
        end = line.src[1]
    return Line(text, (start, end))
