"""Structure-aware actions: group (lines by file or prefix) and json (compaction)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from itertools import pairwise
from typing import Any

from ctxrules.compressors.actions.common import ActionSpec, count, object_schema, regex
from ctxrules.compressors.lines import Line, Lines
from ctxrules.hookspecs import hookimpl


class Group:
    """Gather the lines whose ``pattern`` captures the same ``key`` under one header line.

    ``src/a.py:3: error: x`` and ``src/a.py:9: error: y`` become ``src/a.py`` followed by the
    indented ``3: error: x`` and ``9: error: y``: the file name is written once. Each group
    sits where its first line was; lines that do not match stay in place. A group smaller than
    ``min_size`` is left as it was.
    """

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.pattern = re.compile(options["pattern"])
        if "key" not in self.pattern.groupindex:
            raise ValueError(
                "the pattern needs a named group 'key', e.g. (?P<key>[^:]+):(?P<rest>.*)"
            )
        self.header = str(options["header"])
        self.header.format(key="")
        self.indent = str(options["indent"])
        self.min_size = int(options["min_size"])

    def _rest(self, line: str, found: re.Match[str]) -> str:
        if "rest" in self.pattern.groupindex and found.group("rest") is not None:
            return found.group("rest")
        return line[: found.start("key")] + line[found.end("key") :]

    def __call__(self, lines: Lines) -> list[str]:
        groups: dict[str, list[tuple[str, re.Match[str]]]] = {}
        order: list[tuple[str, str | None]] = []  # (line, key of the group that starts here)
        for line in lines:
            found = self.pattern.search(line)
            key = found.group("key") if found is not None else None
            if found is None or key is None:
                order.append((line, None))
                continue
            if key not in groups:
                groups[key] = []
                order.append((line, key))
            groups[key].append((line, found))
        out: list[str] = []
        for line, key in order:
            if key is None:
                out.append(line)
                continue
            members = groups[key]
            if len(members) < self.min_size:
                out.extend(member for member, _ in members)
                continue
            out.append(self.header.format(key=key))
            for member, found in members:
                text = self.indent + self._rest(member, found).lstrip()
                out.append(member.derive(text) if isinstance(member, Line) else text)
        return out


# Strings (with escapes) are kept whole; whitespace between tokens goes.
_JSON_TOKEN = re.compile(r'("(?:[^"\\]|\\.)*")|\s+')


def _compact(text: str) -> str:
    return _JSON_TOKEN.sub(lambda m: m.group(1) or "", text)


class JsonCompact:
    """Re-write JSON (or NDJSON) without insignificant whitespace.

    Every value stays exactly as written (numbers are not re-formatted, nothing is replaced by
    a type description) and the result parses to the same data. Output that is not JSON
    passes unchanged.
    """

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.ndjson = bool(options["ndjson"])
        self.min_lines = int(options["min_lines"])

    def __call__(self, lines: Lines) -> list[str]:
        if len(lines) >= self.min_lines and all(isinstance(line, Line) for line in lines):
            text = "\n".join(lines)
            stripped = text.strip()
            if stripped[:1] in ("{", "[") and _parses(stripped):
                first, last = lines[0], lines[-1]
                assert isinstance(first, Line) and isinstance(last, Line)
                contiguous = all(
                    isinstance(b, Line) and isinstance(a, Line) and b.src[0] == a.src[1] + 1
                    for a, b in pairwise(lines)
                )
                if contiguous:
                    return [Line(_compact(stripped), (first.src[0], last.src[1]))]
        if not self.ndjson:
            return list(lines)
        out: list[str] = []
        changed = False
        for line in lines:
            stripped = line.strip()
            if stripped[:1] in ("{", "[") and stripped != _compact(stripped) and _parses(stripped):
                text = _compact(stripped)
                out.append(line.derive(text) if isinstance(line, Line) else text)
                changed = True
            else:
                out.append(line)
        return out if changed else list(lines)


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


ACTIONS: list[ActionSpec] = [
    (
        "group",
        Group,
        object_schema(
            {
                "pattern": regex(
                    "Pattern",
                    "Regular expression with a named group 'key' (the file or "
                    "prefix) and optionally 'rest' (what is shown under it).",
                ),
                "header": {
                    "type": "string",
                    "title": "Header",
                    "description": "The header line of a group; {key} inserts the key "
                    "(default '{key}').",
                    "default": "{key}",
                },
                "indent": {
                    "type": "string",
                    "title": "Indent",
                    "description": "Written before each grouped line (default two spaces).",
                    "default": "  ",
                },
                "min_size": count(
                    "Smallest group",
                    "Groups with fewer lines are left as they were (default 2).",
                    1,
                    2,
                ),
            },
            ["pattern"],
        ),
        "Group lines by file or prefix under one header.",
    ),
    (
        "json",
        JsonCompact,
        object_schema(
            {
                "ndjson": {
                    "type": "boolean",
                    "title": "NDJSON",
                    "description": "Also compact each line that is a JSON document on its own "
                    "(default true).",
                    "default": True,
                },
                "min_lines": count(
                    "Fewest lines",
                    "Compact a whole JSON document only when it spans at "
                    "least this many lines (default 2).",
                    1,
                    2,
                ),
            }
        ),
        "Compact JSON and NDJSON: same values, valid JSON, no whitespace.",
    ),
]


@hookimpl
def ctxrules_register_actions(register: Callable[..., None]) -> None:
    for name, factory, schema, description in ACTIONS:
        register(name, factory, schema, description)
