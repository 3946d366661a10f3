"""Line rewrites and line filters: strip_ansi, drop, keep, replace, collapse_repeats,
collapse_progress, squeeze_blank."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ctxrules.compressors.actions.common import (
    ActionSpec,
    compile_all,
    count,
    fold,
    is_blank,
    matching,
    object_schema,
    regex,
    regex_list,
)
from ctxrules.compressors.actions.templates import FormatTemplate, OutputBudget, Replacement
from ctxrules.compressors.lines import Line, Lines
from ctxrules.compressors.terminal import redrawn, strip_escapes
from ctxrules.hookspecs import hookimpl
from ctxrules.patterns import compile as patterns_compile

# Backspace overstrikes (`man`-style bold "b\bb", underline "_\bx"): the last character stays.
_OVERSTRIKE = re.compile(r".\x08")


def _rewrite(line: str, text: str) -> str:
    if text == line:
        return line
    return line.derive(text) if isinstance(line, Line) else text


def _joined(lines: Sequence[str], text: str) -> str:
    """One line standing for ``lines``, which a control string spanning them made one."""
    ranges = sorted(r for line in lines if isinstance(line, Line) for r in line.ranges())
    if not ranges:
        return text
    spans = [list(ranges[0])]
    for a, b in ranges[1:]:
        if a <= spans[-1][1] + 1:
            spans[-1][1] = max(spans[-1][1], b)
        else:
            spans.append([a, b])
    return Line(text, (spans[0][0], spans[0][1]), tuple((a, b) for a, b in spans[1:]))


class StripAnsi:
    """Remove terminal control sequences; optionally resolve carriage-return redraws.

    What is removed and kept is :mod:`ctxrules.compressors.terminal`'s rules: a control string
    (an image, a title) that spans lines leaves one line standing for all of them.
    """

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.carriage_returns = bool(options["carriage_returns"])

    def __call__(self, lines: Lines) -> list[str]:
        out: list[str] = []
        for text, first, last in strip_escapes(lines):
            if "\x08" in text:
                text = _OVERSTRIKE.sub("", text)
            if self.carriage_returns and "\r" in text:
                text = redrawn(text)
            out.append(_rewrite(lines[first], text) if first == last else _joined(lines[first : last + 1], text))
        return out


class Drop:
    """Drop every line that matches one of ``patterns``."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.matcher = compile_all(options["patterns"])

    def __call__(self, lines: Lines) -> list[str]:
        matcher = self.matcher
        assert matcher is not None
        hits = set(matching(matcher, lines))
        return [line for i, line in enumerate(lines) if i not in hits]


class Keep:
    """Keep only the lines that match one of ``patterns``."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.matcher = compile_all(options["patterns"])

    def __call__(self, lines: Lines) -> list[str]:
        matcher = self.matcher
        assert matcher is not None
        return [lines[i] for i in matching(matcher, lines)]


class Replace:
    """``re.sub`` on every line (``with`` may use ``\\1`` / ``\\g<name>``).

    The replacement is parsed when the step is built (:class:`Replacement`: a bad escape or
    group fails there, not on the first matching line) and expanded match by match within the
    step's :class:`OutputBudget`."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.pattern = patterns_compile(options["pattern"])
        self.replacement = Replacement(str(options["with"]), self.pattern.groups, self.pattern.groupindex)

    def __call__(self, lines: Lines) -> list[str]:
        if self.replacement.literal == "":  # deleting never grows a line
            return [_rewrite(line, self.pattern.sub("", line)) for line in lines]
        expand = self.replacement.expander(OutputBudget(lines, "replace"))
        return [_rewrite(line, self.pattern.sub(expand, line)) for line in lines]


class CollapseRepeats:
    """Fold runs of equal consecutive lines into one line with ``(xN)``.

    With ``ignore`` (a regex), lines are equal when they are equal after removing what it
    matches (timestamps, counters): the fold then stands only for the first line and the
    engine marks the others as elided, since they were not identical.
    """

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.min_run = int(options["min_run"])
        ignore = options.get("ignore")
        self.ignore = patterns_compile(ignore) if ignore else None
        self.format = FormatTemplate(
            str(options["format"]),
            "format",
            {"line": "", "count": 0},
            lambda name: f"'format' uses {{{name}}}; its fields are {{line}} and {{count}}",
        )

    def _key(self, line: str) -> str:
        return self.ignore.sub("", line) if self.ignore is not None else line

    def __call__(self, lines: Lines) -> list[str]:
        out: list[str] = []
        budget = OutputBudget(lines, "collapse_repeats")
        i = 0
        n = len(lines)
        while i < n:
            key = self._key(lines[i])
            j = i + 1
            while j < n and self._key(lines[j]) == key:
                j += 1
            run = lines[i:j]
            if len(run) >= self.min_run and not is_blank(run[0]):
                text = self.format.render({"line": run[0], "count": len(run)}, budget)
                identical = all(line == run[0] for line in run)
                out.append(fold(run, text) if identical else _rewrite(run[0], text))
            else:
                out.extend(run)
            i = j
        return out


# Progress bars and spinners of common tools (pip, npm, cargo, curl, wget, docker, git, tqdm).
# Those that show a percentage are only tried on lines with a "%": digits are everywhere in
# logs, and a pattern that starts at each digit makes long outputs slow to scan.
_PROGRESS_PERCENT = [
    # 45% |█████   | and tqdm's bars; bounded gaps keep long log lines linear to scan.
    r"\d{1,3}(?:\.\d+)?\s?%[^%\n]{0,12}?[\u2580-\u259f\u2500-\u257f]{3,}",
    r"[\u2580-\u259f\u2500-\u257f]{3,}[^%\n]{0,60}?\d{1,3}(?:\.\d+)?\s?%",
    r"\d{1,3}%\s?\[[=#>\-. ]{3,}\]",  # 45% [=====>    ]
    r"(?i)^\s*(?:remote: )?(?:counting|compressing|receiving|resolving|writing|enumerating)"
    r" (?:objects|deltas):\s+\d{1,3}%",
    r"(?i)^\s*(?:downloading|uploading|fetching|progress)\b[^\n]{0,200}?\d{1,3}(?:\.\d+)?%",
]
_PROGRESS = [
    r"^\s*[\u2800-\u28ff]",  # braille spinners ⠋⠙⠹
    r"^\s*[\u2500-\u257f]{5,}\s+\d",  # pip's ━━━━━━ 1.2/3.4 MB
    r"^\s*\[[=#>\-. ]{5,}\]",  # [=====>    ]
    r"^[0-9a-f]{12}: (?:Waiting|Downloading|Extracting|Verifying Checksum|Pulling fs layer)",
    r"^\s*(?:\d+(?:\.\d+)?\s*[kKMG]i?B\s*/\s*\d+(?:\.\d+)?\s*[kKMG]i?B)\b",
    r"^Progress: resolved \d+, reused \d+, downloaded \d+, added \d+(?!, done)",  # pnpm
]


class CollapseProgress:
    """Keep only the final state of progress bars and spinners.

    Carriage-return redraws inside a line are resolved to what a terminal shows last; a run of
    consecutive progress lines keeps only its last line (the others are elided and marked).
    """

    def __init__(self, options: Mapping[str, Any]) -> None:
        extra = list(options.get("patterns", []))
        defaults = not options["replace_defaults"]
        self.matcher = compile_all([*_PROGRESS, *extra] if defaults else extra)
        self.percent = compile_all(_PROGRESS_PERCENT) if defaults else None

    def _progress(self, lines: list[str]) -> set[int]:
        """Indexes of the progress lines: the patterns, or a percentage the percent patterns find."""
        found = set(matching(self.matcher, lines)) if self.matcher is not None else set()
        if self.percent is not None:
            with_percent = [i for i, line in enumerate(lines) if "%" in line and i not in found]
            texts = [lines[i] for i in with_percent]
            found.update(with_percent[k] for k in matching(self.percent, texts))
        return found

    def __call__(self, lines: Lines) -> list[str]:
        resolved = [_rewrite(line, redrawn(line)) if "\r" in line else line for line in lines]
        progress = self._progress(resolved)
        out: list[str] = []
        pending: str | None = None
        for i, line in enumerate(resolved):
            if i in progress:
                pending = line  # a later state of the same bar replaces it
                continue
            if pending is not None:
                out.append(pending)
                pending = None
            out.append(line)
        if pending is not None:
            out.append(pending)
        return out


class SqueezeBlank:
    """Fold runs of blank lines to ``max_run`` and drop leading and trailing blank lines."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.max_run = int(options["max_run"])
        self.rstrip = bool(options["rstrip"])

    def __call__(self, lines: Lines) -> list[str]:
        out: list[str] = []
        run = 0
        for line in lines:
            if self.rstrip and line != line.rstrip():
                line = _rewrite(line, line.rstrip())
            if is_blank(line):
                run += 1
                if run > self.max_run or not out:
                    continue
            else:
                run = 0
            out.append(line)
        while out and is_blank(out[-1]):
            out.pop()
        return out


_PATTERNS = regex_list(
    "Patterns",
    "Regular expressions (Python syntax, searched anywhere in the line); a line matches when any of them does.",
)

ACTIONS: list[ActionSpec] = [
    (
        "strip_ansi",
        StripAnsi,
        object_schema(
            {
                "carriage_returns": {
                    "type": "boolean",
                    "title": "Resolve carriage returns",
                    "description": "Keep only the last state, with text, of a line redrawn with \\r (default true).",
                    "default": True,
                },
            },
            defaults={"carriage_returns": True},
        ),
        "Remove colours, other terminal escape sequences and control strings (titles, images).",
    ),
    (
        "drop",
        Drop,
        object_schema({"patterns": _PATTERNS}, ["patterns"]),
        "Drop the lines that match any pattern (the engine marks them as elided).",
    ),
    (
        "keep",
        Keep,
        object_schema({"patterns": _PATTERNS}, ["patterns"]),
        "Keep only the lines that match any pattern.",
    ),
    (
        "replace",
        Replace,
        object_schema(
            {
                "pattern": regex("Pattern", "Regular expression to replace in each line."),
                "with": {
                    "type": "string",
                    "title": "Replacement",
                    "description": "Replacement text; \\1 or \\g<name> insert groups (default: empty).",
                    "default": "",
                },
            },
            ["pattern"],
            {"with": ""},
        ),
        "Rewrite each line with a regular expression substitution.",
    ),
    (
        "collapse_repeats",
        CollapseRepeats,
        object_schema(
            {
                "min_run": count("Shortest run", "Fold runs of at least this many equal lines (default 2).", 2, 2),
                "ignore": regex(
                    "Ignore",
                    "Parts of a line not compared (timestamps, counters); folding "
                    "then keeps the first line and marks the rest as elided.",
                ),
                "format": {
                    "type": "string",
                    "title": "Format",
                    "description": "The folded line; {line} and {count} (default '{line} (x{count})').",
                    "default": "{line} (x{count})",
                },
            },
            defaults={"min_run": 2, "format": "{line} (x{count})"},
        ),
        "Fold runs of repeated lines into one line with (xN).",
    ),
    (
        "collapse_progress",
        CollapseProgress,
        object_schema(
            {
                "patterns": regex_list("Extra patterns", "More lines to treat as progress output."),
                "replace_defaults": {
                    "type": "boolean",
                    "title": "Replace defaults",
                    "description": "Use only `patterns`, not the built-in progress patterns.",
                    "default": False,
                },
            },
            defaults={"replace_defaults": False},
        ),
        "Keep only the last state of progress bars and spinners.",
    ),
    (
        "squeeze_blank",
        SqueezeBlank,
        object_schema(
            {
                "max_run": count("Longest blank run", "Blank lines kept in a row (default 1).", 0, 1),
                "rstrip": {
                    "type": "boolean",
                    "title": "Strip trailing spaces",
                    "description": "Remove trailing whitespace from every line (default true).",
                    "default": True,
                },
            },
            defaults={"max_run": 1, "rstrip": True},
        ),
        "Fold runs of blank lines and trim trailing whitespace.",
    ),
]


@hookimpl
def ctxrules_register_actions(register: Callable[..., None]) -> None:
    for name, factory, schema, description in ACTIONS:
        register(name, factory, schema, description)
