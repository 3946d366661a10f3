"""Limits on JSON-like data from outside: message files, message lists, session state.

Python's own limits turn hostile data into crashes deep inside the engine: nesting a thousand
levels deep is a ``RecursionError`` in whatever walks it next, an integer of 5,000 digits a
``ValueError`` when it is written out, a lone surrogate (``"\\ud800"``, valid in JSON text) a
``UnicodeEncodeError`` when it is encoded, and ``NaN`` is accepted by ``json`` but is not JSON.
:func:`scan` finds all of them in one iterative walk (no recursion of its own), so each caller
can reject or repair them with a message that says where.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = [
    "MAX_DEPTH",
    "MAX_INPUT_BYTES",
    "MAX_INT_DIGITS",
    "NonFinite",
    "Problem",
    "Scan",
    "is_plain",
    "pointer",
    "repair_surrogates",
    "scan",
    "short_pointer",
]

# Arrays and objects inside one another. Real agent messages nest a few levels (content parts,
# tool-call arguments given as objects, JSON schemas in tools: a few dozen at most).
MAX_DEPTH: Final = 100
# What Python converts between int and str by default (sys.get_int_max_str_digits).
MAX_INT_DIGITS: Final = 4300
# A message file larger than this is refused before it is read (a whole agent session with
# every tool output verbatim is tens of MB; a gigabyte would take the machine's memory).
MAX_INPUT_BYTES: Final = 256 * 1024 * 1024

_SURROGATE = re.compile("[\ud800-\udfff]")
_INT_LIMIT: Final = 10**MAX_INT_DIGITS  # the smallest integer of MAX_INT_DIGITS + 1 digits
_INT_BITS: Final = _INT_LIMIT.bit_length() - 1


class NonFinite:
    """What :func:`json.loads` gives for ``NaN``/``Infinity`` through ``parse_constant``, so
    that :func:`scan` can say where it was."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


Path = tuple[str | int, ...]


@dataclass
class Problem:
    kind: str  # "depth" | "int" | "nonfinite" | "type"
    path: Path
    detail: str


@dataclass
class Scan:
    value: Any  # the data with lone surrogates replaced (the very same object when none were)
    problems: list[Problem] = field(default_factory=list)
    replaced: list[Path] = field(default_factory=list)  # where surrogates were replaced


def pointer(path: Path) -> str:
    """The RFC 6901 JSON pointer of ``path`` (printable: a lone surrogate in a key shows as
    U+FFFD and its code point, as it will be after the repair)."""
    parts = (repair_surrogates(p, exact=True) if isinstance(p, str) else str(p) for p in path)
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


def short_pointer(path: Path, width: int = 80) -> str:
    """:func:`pointer`, its middle elided when it is longer than ``width`` (a path 100 levels
    deep would fill the screen)."""
    text = pointer(path) or "/"
    return text if len(text) <= width else f"{text[: width // 2]}...{text[-width // 4 :]}"


def _has_surrogate(text: str) -> bool:
    if text.isascii():  # the common case, and cheap
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def is_plain(value: Any, *, max_depth: int = MAX_DEPTH) -> bool:
    """Whether :func:`scan` would find nothing in ``value`` (no problem, no lone surrogate):
    the same walk without the paths, for the common case of data that is fine (every message
    of every call is checked). False only means "scan it"."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    pop, push = stack.pop, stack.append
    while stack:
        obj, depth = pop()
        kind = type(obj)
        if kind is str:
            if not obj.isascii() and _has_surrogate(obj):
                return False
        elif kind is dict:
            if depth >= max_depth:
                return False
            for key, child in obj.items():
                if type(key) is not str or (not key.isascii() and _has_surrogate(key)):
                    return False
                push((child, depth + 1))
        elif kind is list:
            if depth >= max_depth:
                return False
            for child in obj:
                push((child, depth + 1))
        elif kind is bool or obj is None:
            pass
        elif kind is int:
            if obj.bit_length() >= _INT_BITS:
                return False
        elif kind is float:
            if not math.isfinite(obj):
                return False
        else:  # subclasses, NonFinite, anything else: the full walk decides
            return False
    return True


def scan(value: Any, *, max_depth: int = MAX_DEPTH, base: Path = ()) -> Scan:
    """Walk ``value`` (dicts, lists, scalars) without recursion: report nesting deeper than
    ``max_depth``, integers of more than :data:`MAX_INT_DIGITS` digits, non-finite floats and
    :class:`NonFinite` markers; return it with lone surrogates (in strings and in keys)
    replaced by U+FFFD, in copies of just the containers on the way to them."""
    result = Scan(value)
    key_fixes: list[Path] = []  # paths of dict keys to rename (the path ends with the old key)
    stack: list[tuple[Any, Path, int]] = [(value, (), 0)]
    while stack:
        obj, path, depth = stack.pop()
        if isinstance(obj, str):
            if _has_surrogate(obj):
                result.replaced.append(path)
        elif isinstance(obj, dict):
            if depth >= max_depth:
                result.problems.append(Problem("depth", path, f"nested deeper than {max_depth} levels"))
                continue
            for key, child in obj.items():
                if not isinstance(key, str):
                    # json.dumps writes some (1 as "1": the saved output would differ from the
                    # one returned) and fails on others: either way not a JSON object's key.
                    shown = repr(key)
                    shown = shown if len(shown) <= 40 else shown[:37] + "..."
                    result.problems.append(Problem("type", path, f"a key that is not a string: {shown}"))
                    continue
                if _has_surrogate(key):
                    key_fixes.append((*path, key))
                stack.append((child, (*path, key), depth + 1))
        elif isinstance(obj, list | tuple):  # a tuple is written as an array
            if depth >= max_depth:
                result.problems.append(Problem("depth", path, f"nested deeper than {max_depth} levels"))
                continue
            stack.extend((child, (*path, i), depth + 1) for i, child in enumerate(obj))
        elif isinstance(obj, bool) or obj is None:
            pass
        elif isinstance(obj, int):
            if obj.bit_length() >= _INT_BITS and abs(obj) >= _INT_LIMIT:
                result.problems.append(Problem("int", path, f"an integer of more than {MAX_INT_DIGITS} digits"))
        elif isinstance(obj, float):
            if not math.isfinite(obj):
                result.problems.append(Problem("nonfinite", path, f"{obj!r} is not a finite number"))
        elif isinstance(obj, NonFinite):
            result.problems.append(Problem("nonfinite", path, f"{obj.name} is not valid JSON"))
        else:  # bytes, a set, an object: no JSON writer takes it, so say where it is now
            result.problems.append(Problem("type", path, f"a value of type {type(obj).__name__} is not JSON data"))
    if result.replaced or key_fixes:
        result.value = _repaired(value, result.replaced, key_fixes)
        result.replaced = sorted([*result.replaced, *key_fixes], key=pointer)
    result.problems.sort(key=lambda p: pointer(p.path))
    if base:
        result.replaced = [(*base, *p) for p in result.replaced]
        for problem in result.problems:
            problem.path = (*base, *problem.path)
    return result


def repair_surrogates(text: str, *, exact: bool = False) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD; with ``exact``, by U+FFFD and the
    surrogate's code point (``"\ufffd(U+D800)"``), so that two texts that differed only in
    their lone surrogates still differ: for what names something (a key, a tool call's id),
    where two distinct names must not become one."""
    if not exact:
        return _SURROGATE.sub("\ufffd", text)
    return _SURROGATE.sub(lambda m: f"\ufffd(U+{ord(m.group()):04X})", text)


def _names_something(path: Path) -> bool:
    """Whether the string at ``path`` is an identifier: the value of an ``id`` key or of a key
    ending in ``_id`` (``tool_call_id``, ``tool_use_id``), which pairs calls with results."""
    key = path[-1] if path else None
    return isinstance(key, str) and (key == "id" or key.endswith("_id"))


def _repaired(value: Any, strings: list[Path], keys: list[Path]) -> Any:
    """``value`` with the strings at ``strings`` and the keys at ``keys`` repaired; every
    container on the way to one is copied, the rest shared."""
    copies: dict[Path, Any] = {}

    def copy_of(path: Path) -> Any:
        if path in copies:
            return copies[path]
        if not path:
            node = value
        else:
            parent = copy_of(path[:-1])
            node = parent[path[-1]]
        node = dict(node) if isinstance(node, dict) else list(node)
        if path:
            copies[path[:-1]][path[-1]] = node
        copies[path] = node
        return node

    for path in strings:
        if not path:
            return _SURROGATE.sub("\ufffd", value)
        parent = copy_of(path[:-1])
        parent[path[-1]] = repair_surrogates(parent[path[-1]], exact=_names_something(path))
    # Keys last, deepest first: renaming a key changes the paths below it.
    for path in sorted(keys, key=len, reverse=True):
        parent = copy_of(path[:-1])
        old = path[-1]
        assert isinstance(old, str)
        renamed = {(repair_surrogates(k, exact=True) if k == old else k): v for k, v in parent.items()}
        parent.clear()
        parent.update(renamed)  # in place (the copy is linked into its parent), order kept
    return copies.get((), value)
