"""Which lines survive: context, head, tail, max_lines, limit_blocks, short_circuit."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from ctxrules.compressors.actions.common import (
    FAILURE_PATTERN,
    ActionSpec,
    compile_all,
    count,
    matching,
    object_schema,
    regex,
    regex_list,
)
from ctxrules.compressors.actions.templates import FormatTemplate, OutputBudget
from ctxrules.compressors.lines import Lines
from ctxrules.hookspecs import hookimpl
from ctxrules.patterns import compile as patterns_compile


def _pick(lines: Lines, keep: list[bool]) -> list[str]:
    return [line for line, wanted in zip(lines, keep, strict=True) if wanted]


class Context:
    """Keep the lines that match, with ``before``/``after`` lines of context around each, plus
    the first ``head`` and last ``tail`` lines. What lies between is elided (and marked)."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.matcher = compile_all(options["patterns"])
        self.before = int(options["before"])
        self.after = int(options["after"])
        self.head = int(options["head"])
        self.tail = int(options["tail"])
        self.max_matches: int | None = options.get("max_matches")  # no default: all matches
        self.if_none = str(options["if_none"])

    def __call__(self, lines: Lines) -> list[str]:
        matcher = self.matcher
        assert matcher is not None
        n = len(lines)
        hits = list(matching(matcher, lines))
        if not hits and self.if_none == "keep":
            return list(lines)
        if self.max_matches is not None:
            hits = hits[: self.max_matches]
        keep = [False] * n
        for i in range(min(self.head, n)):
            keep[i] = True
        for i in range(max(0, n - self.tail), n):
            keep[i] = True
        for hit in hits:
            for i in range(max(0, hit - self.before), min(n, hit + self.after + 1)):
                keep[i] = True
        return _pick(lines, keep)


class Head:
    """Keep the first ``lines`` lines."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.lines = int(options["lines"])

    def __call__(self, lines: Lines) -> list[str]:
        return list(lines[: self.lines])


class Tail:
    """Keep the last ``lines`` lines."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.lines = int(options["lines"])

    def __call__(self, lines: Lines) -> list[str]:
        return list(lines[len(lines) - self.lines :]) if self.lines else []


class MaxLines:
    """At most ``max`` lines: protected lines first (failures, wherever they are), then the
    head and the tail of the output share what is left.

    ``protect`` is in priority order: the lines matching the first pattern are kept before
    those matching the second, and so on (errors before warnings), each in output order.
    """

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.max = int(options["max"])
        patterns = options["protect"]
        self.protect = [patterns_compile(p) for p in patterns]
        self.head_share = float(options["head_share"])

    def __call__(self, lines: Lines) -> list[str]:
        n = len(lines)
        if n <= self.max:
            return list(lines)
        keep = [False] * n
        budget = self.max
        # Protected lines may take at most half the budget: the head says what ran, the tail
        # how it ended, and both matter as much as the failures between them.
        cap = budget // 2
        for pattern in self.protect:
            if cap <= 0:
                break
            for i in matching(pattern, lines):
                if cap <= 0:
                    break
                if not keep[i]:
                    keep[i] = True
                    cap -= 1
                    budget -= 1
        head = round(budget * self.head_share)
        taken = 0
        for i in range(n):
            if taken >= head:
                break
            if not keep[i]:
                keep[i] = True
                taken += 1
        tail = budget - taken
        for i in range(n - 1, -1, -1):
            if tail <= 0:
                break
            if not keep[i]:
                keep[i] = True
                tail -= 1
        return _pick(lines, keep)


class LimitBlocks:
    """Cap each block (a line matching ``start`` and the lines up to the next one) at ``max``
    lines: its first ``max - tail`` and last ``tail`` lines, plus the lines matching
    ``protect`` anywhere in it. Lines before the first block are left alone, and so are
    blocks whose first line does not match ``only`` (when given): cap warnings hard and errors
    less with two steps.

    One huge file in a diff, or one long failure among many, then no longer pushes the
    others out of a global line budget.
    """

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.start = patterns_compile(options["start"])
        self.max = int(options["max"])
        self.tail = min(int(options["tail"]), self.max - 1)
        self.protect = compile_all(options["protect"])
        only = options.get("only")
        self.only = patterns_compile(only) if only else None

    def _limit(self, block: list[str]) -> list[str]:
        if len(block) <= self.max:
            return block
        if self.only is not None and self.only.search(block[0]) is None:
            return block
        head = self.max - self.tail
        keep = [i < head or i >= len(block) - self.tail for i in range(len(block))]
        if self.protect is not None:
            for i in matching(self.protect, block):
                keep[i] = True
        return [line for line, wanted in zip(block, keep, strict=True) if wanted]

    def __call__(self, lines: Lines) -> list[str]:
        out: list[str] = []
        block: list[str] | None = None
        starts = set(matching(self.start, lines))
        for i, line in enumerate(lines):
            if i in starts:
                if block is not None:
                    out.extend(self._limit(block))
                block = [line]
            elif block is None:
                out.append(line)
            else:
                block.append(line)
        if block is not None:
            out.extend(self._limit(block))
        return out


class ShortCircuit:
    """Replace the whole output with one message when ``when`` matches it and no ``unless``
    pattern does. Never on a failed run: the engine's verdict (``lines.run.failed``) wins."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.when = patterns_compile(options["when"], re.MULTILINE)
        self.unless = compile_all(options["unless"])
        known = set(self.when.groupindex)
        self.message = FormatTemplate(
            str(options["message"]),
            "message",
            dict.fromkeys(known, ""),
            lambda name: (
                f"message uses {{{name}}}, which 'when' does not capture "
                f"(named groups: {', '.join(sorted(known)) or 'none'})"
            ),
        )

    def __call__(self, lines: Lines) -> list[str]:
        run = getattr(lines, "run", None)
        if run is not None and run.failed:
            return list(lines)
        text = "\n".join(lines)
        found = self.when.search(text)
        if found is None:
            return list(lines)
        if self.unless is not None and any(self.unless.search(line) for line in lines):
            return list(lines)
        values = {k: (v or "") for k, v in found.groupdict().items()}
        return [self.message.render(values, OutputBudget(lines, "short_circuit"))]


_PATTERNS = regex_list(
    "Patterns",
    "Regular expressions (Python syntax, searched anywhere in the line); a line matches when any of them does.",
)

ACTIONS: list[ActionSpec] = [
    (
        "context",
        Context,
        object_schema(
            {
                "patterns": _PATTERNS,
                "before": count("Lines before", "Context lines kept before each match (default 2).", default=2),
                "after": count("Lines after", "Context lines kept after each match (default 2).", default=2),
                "head": count("Head", "Also keep this many first lines (default 0).", default=0),
                "tail": count("Tail", "Also keep this many last lines (default 0).", default=0),
                "max_matches": count(
                    "Most matches",
                    "Keep context around at most this many matches (the first ones; default all).",
                    1,
                ),
                "if_none": {
                    "enum": ["keep", "drop"],
                    "title": "If nothing matches",
                    "description": "keep: leave the output as it is (default); drop: keep only head and tail.",
                    "default": "keep",
                },
            },
            ["patterns"],
            {"before": 2, "after": 2, "head": 0, "tail": 0, "if_none": "keep"},
        ),
        "Keep matching lines with context around them; elide the rest.",
    ),
    (
        "head",
        Head,
        object_schema({"lines": count("Lines", "How many first lines to keep.")}, ["lines"]),
        "Keep the first N lines.",
    ),
    (
        "tail",
        Tail,
        object_schema({"lines": count("Lines", "How many last lines to keep.")}, ["lines"]),
        "Keep the last N lines.",
    ),
    (
        "max_lines",
        MaxLines,
        object_schema(
            {
                "max": count("Most lines", "The output keeps at most this many lines.", 1),
                "protect": {
                    "type": "array",
                    "items": {"type": "string", "format": "regex", "minLength": 1},
                    "title": "Protect",
                    "description": "Lines matching these are kept first, up to half the "
                    "budget, the first pattern's lines before the second's (default: a generic "
                    "failure pattern; [] for none).",
                    "default": [FAILURE_PATTERN],
                },
                "head_share": {
                    "type": "number",
                    "minimum": 0,
                    "maximum": 1,
                    "title": "Head share",
                    "description": "Share of the remaining budget given to the first lines; "
                    "the tail gets the rest (default 0.5).",
                    "default": 0.5,
                },
            },
            ["max"],
            {"protect": [FAILURE_PATTERN], "head_share": 0.5},
        ),
        "Cap the number of lines, keeping failures, the head and the tail.",
    ),
    (
        "limit_blocks",
        LimitBlocks,
        object_schema(
            {
                "start": regex("Start", "A line matching this starts a block (e.g. '^diff --git ')."),
                "max": count("Most lines", "Lines kept per block.", 1),
                "tail": count("Tail", "Of those, how many come from the end of the block (default 0).", default=0),
                "protect": {
                    "type": "array",
                    "items": {"type": "string", "format": "regex", "minLength": 1},
                    "title": "Protect",
                    "description": "Lines of a block matching these are kept "
                    "beyond the cap (e.g. hunk headers; default none).",
                    "default": [],
                },
                "only": regex(
                    "Only",
                    "Cap only the blocks whose first line matches this (default: every block).",
                ),
            },
            ["start", "max"],
            {"tail": 0, "protect": []},
        ),
        "Cap every block (file in a diff, failure in a report) at N lines.",
    ),
    (
        "short_circuit",
        ShortCircuit,
        object_schema(
            {
                "when": regex(
                    "When",
                    "Searched in the whole output (multiline); its named groups can be used in the message.",
                ),
                "unless": {
                    "type": "array",
                    "items": {"type": "string", "format": "regex", "minLength": 1},
                    "title": "Unless",
                    "description": "Do nothing when any line matches one of "
                    "these (default: a generic failure pattern).",
                    "default": [FAILURE_PATTERN],
                },
                "message": {
                    "type": "string",
                    "minLength": 1,
                    "title": "Message",
                    "description": "The one line that replaces the output; {name} inserts a named group of `when`.",
                },
            },
            ["when", "message"],
            {"unless": [FAILURE_PATTERN]},
        ),
        "Replace a successful output by a one-line message.",
    ),
]


@hookimpl
def ctxrules_register_actions(register: Callable[..., None]) -> None:
    for name, factory, schema, description in ACTIONS:
        register(name, factory, schema, description)
