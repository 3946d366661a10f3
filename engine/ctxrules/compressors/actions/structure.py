"""Structure-aware actions: group (lines by file or prefix), carry (a header's file onto the
lines below it), paths (file names packed per directory) and json (compaction)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from itertools import pairwise
from typing import Any

from ctxrules.compressors.actions.common import ActionSpec, count, object_schema, regex
from ctxrules.compressors.actions.templates import FormatTemplate, OutputBudget, check_text
from ctxrules.compressors.lines import Line, Lines
from ctxrules.hookspecs import hookimpl
from ctxrules.patterns import Match
from ctxrules.patterns import compile as patterns_compile


class Group:
    """Gather the lines whose ``pattern`` captures the same ``key`` under one header line.

    ``src/a.py:3: error: x`` and ``src/a.py:9: error: y`` become ``src/a.py`` followed by the
    indented ``3: error: x`` and ``9: error: y``: the file name is written once. Each group
    sits where its first line was; lines that do not match stay in place. A group smaller than
    ``min_size`` is left as it was.
    """

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.pattern = patterns_compile(options["pattern"])
        if "key" not in self.pattern.groupindex:
            raise ValueError("the pattern needs a named group 'key', e.g. (?P<key>[^:]+):(?P<rest>.*)")
        self.header = FormatTemplate(
            str(options["header"]),
            "header",
            {"key": ""},
            lambda name: f"'header' uses {{{name}}}; its field is {{key}}",
        )
        self.indent = check_text(str(options["indent"]), "indent")
        self.min_size = int(options["min_size"])

    def _rest(self, line: str, found: Match) -> str:
        if "rest" in self.pattern.groupindex and found.group("rest") is not None:
            return str(found.group("rest"))
        key = self.pattern.groupindex["key"]  # by number: an RE2 match takes no group names there
        return line[: found.start(key)] + line[found.end(key) :]

    def __call__(self, lines: Lines) -> list[str]:
        groups: dict[str, list[tuple[str, Match]]] = {}
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
        budget = OutputBudget(lines, "group")
        for line, key in order:
            if key is None:
                out.append(line)
                continue
            members = groups[key]
            if len(members) < self.min_size:
                out.extend(member for member, _ in members)
                continue
            out.append(self.header.render({"key": key}, budget))
            for member, found in members:
                rest = self._rest(member, found).lstrip()
                budget.charge(len(self.indent) + len(rest))
                text = self.indent + rest
                out.append(member.derive(text) if isinstance(member, Line) else text)
        return out


class Carry:
    """Rewrite the lines below a header with what the header names, so each one stands alone.

    Tools that print a file once and its diagnostics below it (eslint's stylish format,
    shellcheck's ``In x.sh line 3:``) leave lines an agent cannot jump by. ``header``
    captures named groups (``file``, ``line``...); every later line matching ``pattern`` is
    rewritten to ``with``, a format string over the header's and the line's named groups
    (``{file}:{pos} {rest}``), until the next header. With ``absorb``, a header directly
    followed by a rewritten line is folded into that line (which then stands for both), since
    everything it said is on the line now.
    """

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.header = patterns_compile(options["header"])
        self.pattern = patterns_compile(options["pattern"])
        self.absorb = bool(options["absorb"])
        names = set(self.header.groupindex) | set(self.pattern.groupindex)
        self.template = FormatTemplate(
            str(options["with"]),
            "with",
            dict.fromkeys(names, ""),
            lambda name: (
                f"'with' uses {{{name}}}, which neither header nor pattern captures "
                f"(named groups: {', '.join(sorted(names)) or 'none'})"
            ),
        )

    def __call__(self, lines: Lines) -> list[str]:
        out: list[str] = []
        budget = OutputBudget(lines, "carry")
        context: dict[str, str] | None = None
        pending: str | None = None  # the header just seen, not yet written out
        for line in lines:
            found = self.header.search(line)
            if found is not None:
                if pending is not None:
                    out.append(pending)
                context = {k: v or "" for k, v in found.groupdict().items()}
                pending = line if self.absorb else None
                if not self.absorb:
                    out.append(line)
                continue
            hit = self.pattern.search(line) if context is not None else None
            if hit is None or context is None:
                if pending is not None:
                    out.append(pending)
                    pending = None
                out.append(line)
                continue
            fields = {**context, **{k: v or "" for k, v in hit.groupdict().items()}}
            text = self.template.render(fields, budget)
            new = line.derive(text) if isinstance(line, Line) else text
            if pending is not None:
                head = pending
                pending = None
                contiguous = isinstance(head, Line) and isinstance(line, Line) and head.src[1] + 1 == line.src[0]
                if contiguous:
                    assert isinstance(head, Line) and isinstance(line, Line)
                    new = Line(text, (head.src[0], line.src[1]))
                else:
                    out.append(head)
            out.append(new)
        if pending is not None:
            out.append(pending)
        return out


_NEEDS_QUOTES = re.compile(r"[\s'\"\\]")


def _shell_word(name: str) -> str:
    """``name`` as one space-separated word: quoted when it holds spaces or quotes."""
    if name and not _NEEDS_QUOTES.search(name):
        return name
    return "'" + name.replace("'", "'\\''") + "'"


class Paths:
    """Pack file names onto one line per directory: ``dir/: a.py b.py c/``.

    Every line matching ``pattern`` (a named group ``path``) is a path; the others stay where
    they were (errors, totals). Paths are gathered by directory (within a block, when
    ``header`` starts blocks: ``ls`` of several directories), each directory's line at the
    place of its first path, its names in output order, wrapped at ``width`` characters.
    Gathered lines stand for every original they name, wherever it was.

    When the packed listing is longer than ``max_chars``, directories give way largest first:
    the largest keeps the names that fit its share and says how many more it holds
    (``... +312 more``), so every directory still appears and the elided names are marked.
    """

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.pattern = patterns_compile(options["pattern"])
        if "path" not in self.pattern.groupindex:
            raise ValueError("the pattern needs a named group 'path', e.g. ^(?P<path>\\S.*)$")
        header = options.get("header")  # no default: one block
        self.header = patterns_compile(header) if header else None
        self.width = int(options["width"])
        self.max_chars = int(options["max_chars"])
        self.min_paths = int(options["min_paths"])
        self.split = bool(options["split"])

    def __call__(self, lines: Lines) -> list[str]:
        # slots: plain lines, or a directory key whose packed lines go there
        slots: list[str | tuple[int, str]] = []
        dirs: dict[tuple[int, str], list[tuple[str, str]]] = {}
        block = 0
        found_paths = 0
        for line in lines:
            if self.header is not None and self.header.search(line) is not None:
                block += 1
                slots.append(line)
                continue
            found = self.pattern.search(line)
            path = found.group("path") if found is not None else None
            if not path:
                slots.append(line)
                continue
            found_paths += 1
            if self.split:
                head, sep, name = path.rstrip("/").rpartition("/")
                name = name + ("/" if path.endswith("/") and name else "")
            else:
                head, sep, name = "", "", path
            key = (block, head + sep)
            if key not in dirs:
                dirs[key] = []
                slots.append(key)
            dirs[key].append((line, name or path))
        if found_paths < self.min_paths:
            return list(lines)
        shares = self._shares(dirs)
        out: list[str] = []
        for slot in slots:
            if isinstance(slot, str):
                out.append(slot)
            else:
                out.extend(self._pack(slot[1], dirs[slot], shares[slot]))
        return out

    def _cost(self, prefix: str, names: list[tuple[str, str]]) -> int:
        return len(prefix) + 2 + sum(len(_shell_word(n)) + 1 for _, n in names)

    def _shares(self, dirs: Mapping[tuple[int, str], list[tuple[str, str]]]) -> dict[Any, int]:
        """How many names each directory shows: all, unless the listing is over budget; then
        the smallest directories first, and the budget left split among the larger ones."""
        shares = {key: len(names) for key, names in dirs.items()}
        total = sum(self._cost(key[1], names) for key, names in dirs.items())
        if total <= self.max_chars:
            return shares
        budget = self.max_chars
        order = sorted(dirs, key=lambda k: self._cost(k[1], dirs[k]))
        for index, key in enumerate(order):
            names = dirs[key]
            fair = budget // max(1, len(order) - index)
            cost = self._cost(key[1], names)
            if cost <= fair:
                budget -= cost
                continue
            room = fair - len(key[1]) - 16
            kept = 0
            for _, name in names:
                room -= len(_shell_word(name)) + 1
                if room < 0:
                    break
                kept += 1
            shares[key] = kept
            budget -= max(0, fair)
        return shares

    def _pack(self, prefix: str, names: list[tuple[str, str]], share: int) -> list[str]:
        shown, rest = names[:share], names[share:]
        label = prefix + ":" if prefix else ""
        out: list[str] = []
        words: list[str] = []
        members: list[str] = []
        indent = "  " if label else ""  # names of a labelled directory line up under it

        def flush(final: bool) -> None:
            if not words and not final:
                return
            lead = label if not out else indent
            text = lead + (" " if words and lead else "") + " ".join(words)
            if final and rest:
                text += f" ... +{len(rest)} more"
            ranges = [r for m in members if isinstance(m, Line) for r in m.ranges()]
            if ranges:
                out.append(Line(text, ranges[0], tuple(ranges[1:])))
            else:
                out.append(text)
            words.clear()
            members.clear()

        length = len(label)
        for line, name in shown:
            word = _shell_word(name)
            if words and length + len(word) + 1 > self.width:
                flush(final=False)
                length = len(indent)
            words.append(word)
            members.append(line)
            length += len(word) + 1
        flush(final=True)
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
                    isinstance(b, Line) and isinstance(a, Line) and b.src[0] == a.src[1] + 1 for a, b in pairwise(lines)
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
    except (ValueError, RecursionError):  # nested past Python's limit: not usable as JSON
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
                    "description": "The header line of a group; {key} inserts the key (default '{key}').",
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
            {"header": "{key}", "indent": "  ", "min_size": 2},
        ),
        "Group lines by file or prefix under one header.",
    ),
    (
        "carry",
        Carry,
        object_schema(
            {
                "header": regex(
                    "Header",
                    "A line naming what the lines below it belong to; its named groups "
                    "(e.g. file) are available to `with`.",
                ),
                "pattern": regex("Pattern", "The lines below a header to rewrite; its named groups too."),
                "with": {
                    "type": "string",
                    "minLength": 1,
                    "title": "With",
                    "description": "The rewritten line: {name} inserts a named group of the header or the line.",
                },
                "absorb": {
                    "type": "boolean",
                    "title": "Absorb",
                    "description": "Fold a header into the rewritten line right below it "
                    "(default false: headers stay).",
                    "default": False,
                },
            },
            ["header", "pattern", "with"],
        ),
        "Carry a header's file (or other fields) onto each line below it.",
    ),
    (
        "paths",
        Paths,
        object_schema(
            {
                "pattern": {
                    **regex(
                        "Pattern",
                        "Lines that are paths: a named group 'path' (default: every line that "
                        "does not start with a space).",
                    ),
                    "default": r"^(?P<path>\S.*)$",
                },
                "header": regex(
                    "Header",
                    "A line matching this starts a new block (e.g. ls's 'dir:' lines); "
                    "directories are not merged across blocks.",
                ),
                "width": count("Width", "Longest packed line, in characters (default 160).", 20, 160),
                "max_chars": count(
                    "Most characters",
                    "Budget of the packed listing (default 8000); over it, the largest "
                    "directories show the names that fit and count the others.",
                    100,
                    8000,
                ),
                "split": {
                    "type": "boolean",
                    "title": "Split",
                    "description": "Gather by the directory part of each path (default true); "
                    "false: the lines are names (ls), gathered per block.",
                    "default": True,
                },
                "min_paths": count(
                    "Fewest paths",
                    "Outputs with fewer paths are left as they are (default 8).",
                    1,
                    8,
                ),
            }
        ),
        "Pack file names per directory on one line; count the rest when over budget.",
    ),
    (
        "json",
        JsonCompact,
        object_schema(
            {
                "ndjson": {
                    "type": "boolean",
                    "title": "NDJSON",
                    "description": "Also compact each line that is a JSON document on its own (default true).",
                    "default": True,
                },
                "min_lines": count(
                    "Fewest lines",
                    "Compact a whole JSON document only when it spans at least this many lines (default 2).",
                    1,
                    2,
                ),
            },
            defaults={"ndjson": True, "min_lines": 2},
        ),
        "Compact JSON and NDJSON: same values, valid JSON, no whitespace.",
    ),
]


@hookimpl
def ctxrules_register_actions(register: Callable[..., None]) -> None:
    for name, factory, schema, description in ACTIONS:
        register(name, factory, schema, description)
