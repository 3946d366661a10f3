"""YAML read with a position for every node, and duplicate keys treated as errors.

PyYAML's loaders keep the last of two equal keys without a word; a pack author would never see
that their first value is ignored. We compose the node graph ourselves and build plain Python
values from it, recording ``(line, column)`` (1-based) for every JSON pointer on the way.
"""

from __future__ import annotations

import functools
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import yaml


@dataclass(frozen=True, order=True)
class Origin:
    """Where a value was written: a file, a 1-based line and column, and the value's JSON
    pointer in that file's own document (a merged pack numbers list items differently)."""

    file: str
    line: int
    col: int
    pointer: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


class YamlProblem(Exception):
    """A YAML document that cannot become a pack: syntax error, duplicate key, bad shape."""

    def __init__(
        self, code: str, message: str, line: int, col: int, pointer: str = "", hint: str | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.line = line
        self.col = col
        self.pointer = pointer
        self.hint = hint


@dataclass
class SourceDoc:
    """One parsed YAML file: plain data plus the position of every node by JSON pointer."""

    path: str
    text: str
    data: Any
    positions: dict[str, tuple[int, int]]
    # Origins are immutable and a document is annotated once per pack that reads it (a
    # fragment: once alone, once in each pack extending it): each is built once.
    _origins: dict[str, Origin] = field(default_factory=dict, init=False, repr=False, compare=False)

    def origin(self, pointer: str) -> Origin:
        """Origin of ``pointer``, or of its nearest ancestor that has one."""
        found = self._origins.get(pointer)
        if found is None:
            found = self._origins[pointer] = self._find_origin(pointer)
        return found

    def _find_origin(self, pointer: str) -> Origin:
        p = pointer
        while True:
            pos = self.positions.get(p)
            if pos is not None:
                return Origin(self.path, pos[0], pos[1], p)
            if not p:
                return Origin(self.path, 1, 1)
            p = p.rsplit("/", 1)[0]

    def key_origin(self, pointer: str) -> Origin:
        """Origin of the *key* that introduces ``pointer`` (for 'unknown key' diagnostics)."""
        pos = self.positions.get(pointer + "#key")
        if pos is not None:
            return Origin(self.path, pos[0], pos[1], pointer)
        return self.origin(pointer)


def escape_token(token: str) -> str:
    """Escape one JSON-pointer reference token (RFC 6901)."""
    return token.replace("~", "~0").replace("/", "~1")


# The most values one file may hold once aliases are expanded.
MAX_VALUES = 200_000


_STR = "tag:yaml.org,2002:str"
_INT = "tag:yaml.org,2002:int"
_MERGE = "tag:yaml.org,2002:merge"
_PLAIN_COLLECTION: dict[type, str] = {
    yaml.MappingNode: "tag:yaml.org,2002:map",
    yaml.SequenceNode: "tag:yaml.org,2002:seq",
}
_FLATTENED = (_MERGE, "tag:yaml.org,2002:value")  # the key tags SafeConstructor.flatten_mapping rewrites


def _pos(node: yaml.Node) -> tuple[int, int]:
    return (node.start_mark.line + 1, node.start_mark.column + 1)


# Line breaks to YAML 1.1 (and so to PyYAML's marks) that no editor, git or GitHub counts.
_ODD_BREAKS = ("\x85", "\u2028", "\u2029")


class _Lines:
    """Marks renumbered the way an editor numbers lines (after LF, CRLF or CR): PyYAML also
    breaks a line at NEL, LS and PS, so after one of them in a string every position was a line
    (or more) further down than the author, ``grep -n`` or a GitHub annotation finds it."""

    def __init__(self, text: str) -> None:
        self.starts = [0] + [m.end() for m in re.finditer(r"\r\n|\r|\n", text)]
        self.bom = text.startswith("\ufeff")  # not a column, as PyYAML counts them

    def fix(self, mark: Any) -> None:
        if mark is None:
            return
        from bisect import bisect_right

        line = bisect_right(self.starts, mark.index) - 1
        mark.line, mark.column = line, mark.index - self.starts[line] - (self.bom and line == 0)

    def fix_graph(self, root: yaml.Node) -> None:
        seen: set[int] = set()
        stack = [root]
        while stack:
            node = stack.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            self.fix(node.start_mark)
            self.fix(node.end_mark)
            if isinstance(node, yaml.SequenceNode):
                stack.extend(node.value)
            elif isinstance(node, yaml.MappingNode):
                stack.extend(n for pair in node.value for n in pair)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _whole_text(value: str, node: yaml.Node, pointer: str) -> str:
    """``value`` with escaped surrogate pairs (``"\\ud83d\\ude00"``, JSON's way of writing
    an emoji) joined into their character. A lone surrogate is not text: no file, digest or
    terminal can take it, so it is refused where it is written."""
    if _SURROGATE.search(value) is None:
        return value
    joined = value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
    found = _SURROGATE.search(joined)
    if found is None:
        return joined
    raise YamlProblem(
        "CR001",
        f"YAML: the string holds a lone surrogate (U+{ord(found.group()):04X}), which is not a character",
        *_pos(node),
        pointer,
        hint="write the character itself, or a \\U escape of a code point outside D800-DFFF",
    )


_INT_DIGITS: Final = 4300
"""Decimal digits an integer of a pack may have at most: Python's default limit for turning
text into an integer and back (``sys.get_int_max_str_digits``), whatever the process sets."""
_INT_BITS: Final = 14_000  # an integer this long or shorter has fewer digits: no exact check


@functools.cache
def _int_ceiling() -> int:
    ceiling: int = 10**_INT_DIGITS
    return ceiling


class _Builder:
    def __init__(self, loader: yaml.SafeLoader, text: str) -> None:
        self.loader = loader
        # A surrogate reaches a string only through a \u or \U escape (the file is UTF-8).
        self.escapes = "\\u" in text or "\\U" in text
        self.positions: dict[str, tuple[int, int]] = {}
        self.open: set[int] = set()  # collections being built (an alias back into one loops)
        self.count = 0

    def build(self, node: yaml.Node, pointer: str) -> Any:
        mark = node.start_mark
        self.positions[pointer] = (mark.line + 1, mark.column + 1)
        self.count += 1
        if self.count > MAX_VALUES:
            # Aliases of aliases expand exponentially ("billion laughs"); no pack is this big.
            raise YamlProblem(
                "CR001",
                f"YAML: the document expands to more than {MAX_VALUES} values (aliases referring to aliases?)",
                *_pos(node),
                pointer,
            )
        kind = type(node)
        if kind is yaml.ScalarNode and node.tag == _STR and self.count <= MAX_VALUES:
            # What the constructor returns for a string, without its Python-level dispatch
            # (most values of a pack are strings; this was half the time of reading one).
            return _whole_text(node.value, node, pointer) if self.escapes else node.value
        if isinstance(node, yaml.MappingNode | yaml.SequenceNode):
            if node.tag != _PLAIN_COLLECTION[kind]:
                # `!!python/object:...`, `!!set`, `!custom` on a mapping or list: a pack holds
                # plain mappings, lists and scalars, and read as plain data such a tag would
                # look as if it did something. (On a scalar the constructor refuses it.)
                shown = node.tag.replace("tag:yaml.org,2002:", "!!", 1)
                raise YamlProblem(
                    "CR001",
                    f"YAML: the tag {shown!r} is not allowed; a pack holds plain mappings, lists and scalars",
                    *_pos(node),
                    pointer,
                    hint="remove the tag in front of the value",
                )
            if id(node) in self.open:
                raise YamlProblem("CR001", "YAML: an alias refers to the collection holding it", *_pos(node), pointer)
            self.open.add(id(node))
            try:
                if isinstance(node, yaml.MappingNode):
                    return self._mapping(node, pointer)
                return [self.build(item, f"{pointer}/{i}") for i, item in enumerate(node.value)]
            finally:
                self.open.discard(id(node))
        value = self._scalar(node, pointer)
        if type(value) is int and value.bit_length() > _INT_BITS and abs(value) >= _int_ceiling():
            # Written in hex, binary or base 60, PyYAML builds it without Python's digit limit,
            # and the first str() of it (a diagnostic quoting it, `explain`) failed.
            text = str(node.value)
            raise YamlProblem(
                "CR104",
                f"YAML: the integer {text[:20]}… ({len(text):,} characters) has more than {_INT_DIGITS:,} decimal "
                "digits; no pack value needs more than a few",
                *_pos(node),
                pointer,
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise YamlProblem(
                "CR104",
                f"YAML: {node.value} is not a finite number",
                *_pos(node),
                pointer,
                hint="write a finite number (or leave the key out for the default)",
            )
        return value

    def _scalar(self, node: yaml.Node, pointer: str) -> Any:
        """The value of a scalar, or a located problem: PyYAML's constructors take an explicit
        tag's text as it is (`!!bool maybe`, `!!timestamp soon`) and fail with whatever error
        that text provokes."""
        try:
            return self.loader.construct_object(node, deep=True)
        except yaml.constructor.ConstructorError:
            raise
        except Exception:
            text = str(node.value)
            if node.tag == _INT and sum(c.isdigit() for c in text) > sys.get_int_max_str_digits():
                raise YamlProblem(
                    "CR104",
                    f"YAML: the integer has {len(text):,} characters; no pack value needs more than a few digits",
                    *_pos(node),
                    pointer,
                ) from None
            shown = text if len(text) <= 40 else text[:40] + "…"
            raise YamlProblem(
                "CR001",
                f"YAML: {shown!r} is not a valid {node.tag.removeprefix('tag:yaml.org,2002:')}",
                *_pos(node),
                pointer,
                hint="correct the value, or remove the explicit tag (!!...) in front of it"
                if _tagged(node)
                else "correct the value, or quote it to make it a string",
            ) from None

    def _mapping(self, node: yaml.MappingNode, pointer: str) -> dict[str, Any]:
        # Anchors with `<<:` merge keys are legitimate YAML; flatten them the way PyYAML would,
        # then apply our own duplicate check to the keys the author wrote explicitly. An explicit
        # key overrides a merged one, as YAML intends.
        explicit_ids = {id(k) for k, _ in node.value if k.tag != _MERGE}
        if any(k.tag in _FLATTENED for k, _ in node.value):  # else flatten_mapping changes nothing
            self.loader.flatten_mapping(node)
        named: list[tuple[str, yaml.Node, yaml.Node, bool]] = []
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                line, col = _pos(key_node)
                raise YamlProblem("CR002", "mapping keys must be plain strings", line, col, pointer)
            key = key_node.value if key_node.tag == _STR else self._scalar(key_node, pointer)
            if self.escapes and isinstance(key, str):
                key = _whole_text(key, key_node, pointer)
            if not isinstance(key, str):
                # `on:`/`yes:`/`1:` become bool/int under YAML 1.1; packs only have string keys.
                key = str(key_node.value)
            named.append((key, key_node, value_node, id(key_node) in explicit_ids))
        first_explicit: dict[str, tuple[int, int]] = {}
        for key, key_node, _, explicit in named:
            if not explicit:
                continue
            if key in first_explicit:
                line, col = _pos(key_node)
                raise YamlProblem(
                    "CR003",
                    f"duplicate key '{key}' (first defined at line {first_explicit[key][0]})",
                    line,
                    col,
                    f"{pointer}/{escape_token(key)}",
                    hint="YAML keeps only one of them; remove or rename the other",
                )
            first_explicit[key] = _pos(key_node)
        # flatten_mapping lists merged pairs so that the last one wins (the earlier of
        # `<<: [*a, *b]` has precedence, as YAML says); an explicit key beats every merged one.
        winner: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for key, key_node, value_node, explicit in named:
            if explicit or key not in first_explicit:
                winner[key] = (key_node, value_node)
        out: dict[str, Any] = {}
        for key, (key_node, value_node) in winner.items():
            child = f"{pointer}/{escape_token(key)}"
            self.positions[child + "#key"] = _pos(key_node)
            out[key] = self.build(value_node, child)
        return out


def parse_yaml(text: str, path: str) -> SourceDoc:
    """Parse one YAML document; raises :class:`YamlProblem` with a position on any problem.

    libyaml (when PyYAML has it) composes the node graph some 20 times faster than the
    pure-Python parser, with the same positions; it reads the files that are fine. Whatever it
    finds wrong, and any text with a tab (where libyaml is more lenient), is read again by the
    pure-Python parser, whose messages the diagnostics are written for: the answer is the same
    with or without libyaml.
    """
    fast = _parse_fast(text, path)
    return fast if fast is not None else _parse_pure(text, path)


def _parse_fast(text: str, path: str) -> SourceDoc | None:
    loader_class = getattr(yaml, "CSafeLoader", None)
    if loader_class is None or "\t" in text or any(c in text for c in _ODD_BREAKS):
        return None  # (the pure-Python parser's marks can be renumbered)
    try:
        loader = loader_class(text)
        try:
            node = _single_node(loader)
            if node is None:
                return SourceDoc(path, text, None, {"": (1, 1)})
            builder = _Builder(loader, text)
            return SourceDoc(path, text, builder.build(node, ""), builder.positions)
        finally:
            loader.dispose()
    except Exception:  # any problem at all: the pure-Python parser reports it
        return None


def _parse_pure(text: str, path: str) -> SourceDoc:
    try:
        loader = yaml.SafeLoader(text)
    except yaml.reader.ReaderError as exc:  # a control character such as NUL
        at = exc.position
        line, col = text.count("\n", 0, at) + 1, at - text.rfind("\n", 0, at)
        hint = 'remove it, or write it as an escape in a double-quoted string (e.g. "\\x00")'
        if exc.character == 0 and text.count("\x00") * 4 >= len(text):
            # NUL beside most characters: UTF-16 or UTF-32 without a byte-order mark (ASCII
            # text saved so is valid UTF-8, with a NUL after or before each character).
            hint = "the file looks saved as UTF-16 or UTF-32 (without a byte-order mark); save it as UTF-8"
        raise YamlProblem(
            "CR001", f"YAML: character {exc.character:#06x} is not allowed in YAML", line, col, hint=hint
        ) from None
    lines = _Lines(text) if any(c in text for c in _ODD_BREAKS) else None
    try:
        try:
            node = _compose(loader, lines)
        except yaml.composer.ComposerError as exc:
            mark = exc.problem_mark or exc.context_mark
            line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
            if "single document" in str(exc.context):
                raise YamlProblem(
                    "CR002",
                    "the file holds several YAML documents; a pack is one document",
                    line,
                    col,
                    hint="remove the '---' line and what follows, or split the packs into separate files",
                ) from None
            raise YamlProblem("CR001", f"YAML: {exc.problem or exc}", line, col) from None
        except yaml.MarkedYAMLError as exc:
            opened = list(getattr(loader, "marks", ()))  # the collections being parsed, outermost first
            if lines is not None:
                for mark in opened:
                    lines.fix(mark)
            raise _syntax_problem(exc, text, opened) from None
        except RecursionError:
            mark = loader.get_mark()
            if lines is not None:
                lines.fix(mark)
            raise YamlProblem("CR001", "YAML: values are nested too deeply", mark.line + 1, mark.column + 1) from None
        if node is None:
            return SourceDoc(path, text, None, {"": (1, 1)})
        builder = _Builder(loader, text)
        try:
            data = builder.build(node, "")
        except yaml.constructor.ConstructorError as exc:
            mark = exc.problem_mark
            line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
            raise YamlProblem("CR001", f"YAML: {exc.problem}", line, col) from None
        return SourceDoc(path, text, data, builder.positions)
    finally:
        loader.dispose()


def _single_node(loader: Any) -> yaml.Node | None:
    """The node graph of a pack file's document: its first, which only empty documents may
    follow. A trailing ``---`` (hand-edited files, YAML that tools generate) starts one; a
    document after the pack with anything in it is refused as PyYAML's ``get_single_node``
    refuses it (CR002, at its ``---``: the pure-Python parser's mark; libyaml's parser cannot
    peek, and leaves such a file to it)."""
    pure = isinstance(loader, yaml.SafeLoader)
    node = loader.get_node() if loader.check_node() else None
    while loader.check_node():
        start = loader.peek_event().start_mark if pure else None
        extra = loader.get_node()
        if not _empty_document(extra):
            raise yaml.composer.ComposerError(
                "expected a single document in the stream",
                node.start_mark if node is not None else None,
                "but found another document",
                start,
            )
    return node


def _empty_document(node: yaml.Node) -> bool:
    """Whether ``node`` is a document with nothing written in it (``---`` alone, or with a
    comment): the empty plain scalar YAML reads it as. ``~``, ``null`` or ``""`` are content."""
    return (
        isinstance(node, yaml.ScalarNode)
        and node.value == ""
        and not node.style
        and node.start_mark.index == node.end_mark.index
    )


def _compose(loader: yaml.SafeLoader, lines: _Lines | None) -> yaml.Node | None:
    """The document's node graph, its marks (and those of an error) numbered by ``lines``."""
    try:
        node = _single_node(loader)
    except yaml.MarkedYAMLError as exc:
        if lines is not None:
            lines.fix(exc.problem_mark)
            lines.fix(exc.context_mark)
        raise
    if lines is not None and node is not None:
        lines.fix_graph(node)
    return node


def _syntax_problem(exc: yaml.MarkedYAMLError, text: str, opened: Sequence[Any] = ()) -> YamlProblem:
    mark = exc.problem_mark or exc.context_mark
    # An unclosed quote or bracket is found only at the end of the file: point where it opens.
    at_end = any(w in str(exc.problem) for w in ("end of stream", "<stream end>"))
    unclosed = exc.context_mark is not None and at_end
    context = exc.context
    if unclosed:
        mark = exc.context_mark
        if context == "while parsing a flow node":
            # ... where the entry a '[' or '{' waits for was due (the end): point at the bracket
            bracket = next((m for m in reversed(opened) if text[m.index : m.index + 1] in ("[", "{")), None)
            if bracket is not None:
                mark = bracket
                kind = "sequence" if text[bracket.index] == "[" else "mapping"
                context = f"while parsing a flow {kind}"
    line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
    message = exc.problem or str(exc)
    hint = None
    src = _line_of(text, line)
    if "\t" in src and ("tab" in message or "cannot start any token" in message):
        indent = src[: len(src) - len(src.lstrip(" \t"))]
        if "\t" in indent:
            message = "a tab character is used for indentation"
            hint = "YAML indents with spaces only; replace the tab with spaces"
        else:
            message = "a tab character where YAML expects a space"
            hint = "replace the tab with a space (or quote the value if the tab belongs to it)"
    elif unclosed and context:
        thing = context.removeprefix("while parsing ").removeprefix("while scanning ")
        hint = f"the {thing.removeprefix('a ')} that starts here is never closed"
    elif "mapping values are not allowed" in message:
        hint = "check the indentation of this line, or quote a value that contains ': '"
    elif exc.context_mark is not None and exc.context and exc.context_mark.line + 1 != line:
        thing = exc.context.removeprefix("while parsing ").removeprefix("while scanning ")
        start = exc.context_mark.line + 1
        hint = f"the error is inside the {thing.removeprefix('a ')} that starts at line {start}"
    ctx = f" ({exc.context})" if exc.context and hint is None else ""
    return YamlProblem("CR001", f"YAML syntax error: {message}{ctx}", line, col, hint=hint)


def _line_of(text: str, line: int) -> str:
    lines = split_lines(text)
    return lines[line - 1] if 0 < line <= len(lines) else ""


def _tagged(node: yaml.Node) -> bool:
    """Whether the source gives ``node`` an explicit tag (``!!timestamp x``), not one YAML
    resolved from its text (``2024-02-30``)."""
    mark = node.start_mark
    buffer = getattr(mark, "buffer", None)
    return isinstance(buffer, str) and buffer.startswith("!", mark.pointer)


def split_lines(text: str) -> list[str]:
    """``text``'s lines as positions number them: broken at LF, CRLF and CR only (not at
    ``str.splitlines``' form feeds, NEL or LS, which editors show within a line)."""
    return re.split(r"\r\n|\r|\n", text)
