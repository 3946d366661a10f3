"""Every regular expression a pack provides is compiled and matched here.

The pattern language is Python's ``re`` (a pattern that ``re`` rejects is a CR070 error), but
``re`` backtracks without limit: ``(a+)+$`` on 40,000 ``a`` and a ``b`` never ends. So a pack
pattern runs on one of two engines:

- **RE2** (``google-re2``, linear time) when it compiles there *and* means the same thing. RE2's
  ``\\d \\w \\s \\b`` (and their negations) are ASCII-only where Python's are Unicode, and its
  ``$`` (without ``(?m)``) does not match before a final newline; a pattern using any of them,
  a POSIX-looking class (``[[:``), or flags RE2 has no equivalent for stays off RE2. Iterating
  operations (``finditer``, ``sub``, ``split``, ``findall``) use RE2 only for patterns that
  cannot match the empty string (where empty-match rules are the same everywhere), and ``sub``
  only with a replacement that is a function or a plain string without backslashes.
- otherwise the **regex** module, with a time limit on every call (:data:`MATCH_TIME_LIMIT_S`),
  given the pattern as :func:`regex_source` rewrites it: ``regex`` reads some text ``re`` takes
  literally as its own syntax (``a{e<=1}`` as fuzzy matching, ``[[:alpha:]]`` as a POSIX class).
  Before compiling there, the pattern's unrolled size is estimated: ``regex`` expands counted
  repetitions when it compiles (``x{4294967294}`` would take hours), so a pattern beyond
  :data:`MAX_UNROLLED` is refused (CR070).

A call that hits the limit raises :class:`PatternTimeout`; the pattern is then *remembered*
as timed out (:func:`remembering` keeps that memory in a stage's persistent state) and every
later call raises at once, so a rerun behaves the same whatever the machine's load was.
"""

from __future__ import annotations

import bisect
import contextvars
import hashlib
import itertools
import re
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cache, lru_cache
from typing import Any, NamedTuple, Protocol


# Both engines are imported on the first pattern that runs on them, not with this module:
# judging a pack's patterns (``ctxrules validate``) needs only ``re``'s parser, and the two
# imports were a tenth of validating the built-in pack.
@cache
def regex_module() -> Any:
    """The ``regex`` module (the bounded backtracking engine), imported on first use."""
    import regex  # type: ignore[import-untyped]

    return regex


@cache
def re2_module() -> Any:
    """The ``re2`` module (google-re2), imported on first use; None when it is missing."""
    try:  # google-re2 is a dependency; without it every pattern runs on `regex` (still bounded)
        import re2  # type: ignore[import-untyped]
    except ImportError:  # pragma: no cover - exercised only on a broken install
        return None
    return re2


__all__ = [
    "MATCH_TIME_LIMIT_S",
    "MAX_UNROLLED",
    "PAST_RE2",
    "STATE_KEY",
    "Match",
    "Memory",
    "Pattern",
    "PatternError",
    "PatternTimeout",
    "candidate_lines",
    "compile",
    "lines_touched",
    "merged_entries",
    "nested_quantifier",
    "re2_module",
    "regex_module",
    "regex_source",
    "remembering",
    "time_budget",
    "timed_out_before",
]

MATCH_TIME_LIMIT_S = 1.0
"""Seconds one call of a pattern on the backtracking engine may take."""

TIMEOUT_BUDGET_S = 3.0
"""Seconds the pattern calls that time out may take together within one :func:`time_budget`
(a ``prepare``, a ``compress`` run): past it, every other pattern that would run on the
backtracking engine there is skipped at once. Each distinct pattern times out once before it
is remembered, and ``regex`` checks its limit coarsely (1.5 s for a 1 s limit on an idle
machine, 5-9 s on a busy one): thirty such patterns in a pack made one call take minutes."""

MAX_UNROLLED = 100_000
"""Largest estimated size of a pattern once counted repetitions are expanded."""

STATE_KEY = "timed_out_patterns"
"""Where :func:`remembering` keeps the patterns that timed out, in a stage's state dict."""

_REPEATS = ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")
_CATEGORIES_DIFFERENT = {
    "CATEGORY_DIGIT",
    "CATEGORY_NOT_DIGIT",
    "CATEGORY_WORD",
    "CATEGORY_NOT_WORD",
    "CATEGORY_SPACE",
    "CATEGORY_NOT_SPACE",
}


class PatternError(re.error):
    """A pattern ``re`` accepts but that cannot run in bounded time (too large to unroll)."""


class PatternTimeout(Exception):
    """A pattern took longer than :data:`MATCH_TIME_LIMIT_S` (now, or in an earlier run)."""

    def __init__(self, pattern: Pattern, earlier: bool = False, reason: str | None = None) -> None:
        shown = pattern.pattern if len(pattern.pattern) <= 80 else pattern.pattern[:77] + "..."
        when = (
            "timed out in an earlier run and is skipped"
            if earlier
            else (f"took longer than {MATCH_TIME_LIMIT_S:g} s on one match and is skipped from now on")
        )
        if reason is not None:
            when = f"cannot run ({reason}) and is skipped"
        super().__init__(f"pattern {shown!r} {when}")
        self.pattern = pattern


class Match(Protocol):
    """What callers may use of a match (``re``, ``regex`` and RE2 matches all have it)."""

    def group(self, *args: int | str) -> Any: ...
    def groups(self, default: Any = None) -> tuple[Any, ...]: ...
    def groupdict(self, default: Any = None) -> dict[str, Any]: ...
    # RE2's matches take a group's number here, never its name (groupindex maps one to the other)
    def start(self, group: int = 0) -> int: ...
    def end(self, group: int = 0) -> int: ...
    def span(self, group: int = 0) -> tuple[int, int]: ...
    def __getitem__(self, group: int | str) -> Any: ...


# -- the memory of timed-out patterns ------------------------------------------------------


@dataclass
class Memory:
    """The patterns that timed out, and what was reported about them since.

    ``keys`` maps a pattern's key to the shortest text length from which its searches raise at
    once (0: on any text). A pattern that times out on a text of N characters is skipped from
    then on for texts of N/2 characters and more, and a pattern with nested repetitions (which
    may explode on a short text too, CR102) for every text. A linear pattern that took over a
    second on 12 MB of hostile text says nothing about the next message of a few hundred
    characters; halving bounds how often one pattern can time out (a text half as long takes
    about half as long, or less). A rerun on the same texts skips the same searches."""

    keys: dict[str, int] = field(default_factory=dict)
    reports: list[str] = field(default_factory=list)

    def report(self, message: str) -> None:
        if message not in self.reports:
            self.reports.append(message)

    def holds(self, key: str, length: int) -> bool:
        """Whether a search of ``key`` on a text of ``length`` characters raises at once."""
        shortest = self.keys.get(key)
        return shortest is not None and length >= shortest

    def add(self, key: str, length: int) -> None:
        """Skip ``key`` at once on texts of ``length`` characters and more."""
        shortest = self.keys.get(key)
        if shortest is None or length < shortest:
            self.keys[key] = length


def _entries(listed: Any) -> dict[str, int]:
    """The memory a state's ``timed_out_patterns`` list holds: ``"KEY"`` (any text, as
    earlier versions wrote it) or ``"KEY@LENGTH"``; anything else is left out."""
    out: dict[str, int] = {}
    if not isinstance(listed, list):
        return out
    for entry in listed:
        if not isinstance(entry, str):
            continue
        key, at, length = entry.partition("@")
        if not at:
            shortest = 0
        elif length.isascii() and length.isdigit() and len(length) <= 15:
            shortest = int(length)
        else:
            continue
        if key not in out or shortest < out[key]:
            out[key] = shortest
    return out


def _listed(keys: dict[str, int]) -> list[str]:
    """``keys`` as a state's ``timed_out_patterns`` list (sorted: the state stays stable)."""
    return sorted(f"{key}@{length}" if length else key for key, length in keys.items())


def merged_entries(*lists: Any) -> list[str]:
    """The ``timed_out_patterns`` lists given, as one (each pattern at its shortest length)."""
    return _listed(_entries([entry for listed in lists if isinstance(listed, list) for entry in listed]))


class _Budget:
    """What is left of :data:`TIMEOUT_BUDGET_S` in one :func:`time_budget` block."""

    __slots__ = ("left",)

    def __init__(self, seconds: float) -> None:
        self.left = seconds


_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("ctxrules_pattern_budget", default=None)


class time_budget:  # lower case: used like a function, as remembering
    """Within the block, the pattern calls that time out take :data:`TIMEOUT_BUDGET_S` seconds
    together at most (see there); blocks do not nest (an inner one keeps the outer's budget)."""

    __slots__ = ("_seconds", "_token")

    def __init__(self, seconds: float | None = None) -> None:
        self._seconds = TIMEOUT_BUDGET_S if seconds is None else seconds
        self._token: contextvars.Token[_Budget | None] | None = None

    def __enter__(self) -> None:
        if _BUDGET.get() is None:
            self._token = _BUDGET.set(_Budget(self._seconds))

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _BUDGET.reset(self._token)
            self._token = None


_UNSET: Any = object()
_PROCESS_MEMORY = Memory()  # outside any session (validate, a bare compress): this process
_MEMORY: contextvars.ContextVar[Memory] = contextvars.ContextVar("ctxrules_timed_out")


def _memory() -> Memory:
    return _MEMORY.get(_PROCESS_MEMORY)


class remembering:  # lower case: used like the function it was (``with remembering(state) as memory``)
    """Within the block, patterns listed in ``state[STATE_KEY]`` count as timed out (on texts
    at least half as long as the one they timed out on, see :class:`Memory`), and patterns that time
    out are added there (a sorted list of strings, JSON-serializable), so a later run in the
    same session skips them without trying. ``reports`` of the memory says which patterns timed
    out or were skipped in the block (for the stage's warnings).

    The memory is the state's own: what timed out in one session (a hostile message in it)
    changes nothing for another session of the same process.

    A class, not a generator-based context manager: the runner enters one around every stage
    of every turn, and the generator machinery cost more than a warm turn's small stages."""

    __slots__ = ("_known", "_memory", "_state", "_token")

    def __init__(self, state: dict[str, Any]) -> None:
        self._state = state
        listed = state.get(STATE_KEY)
        self._known = _entries(listed) if listed else {}
        self._memory = Memory(dict(self._known))
        self._token: contextvars.Token[Memory] | None = None

    def __enter__(self) -> Memory:
        self._token = _MEMORY.set(self._memory)
        return self._memory

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _MEMORY.reset(self._token)
            self._token = None
        keys = self._memory.keys
        if keys != self._known:
            self._state[STATE_KEY] = _listed(keys)


# -- analysis ------------------------------------------------------------------------------


class _Shape(NamedTuple):
    re2_safe: bool  # means the same on RE2 (given the flags)
    min_width: int
    unrolled: int
    nested: bool
    # Matches in a line wherever it matches in text holding that line between newlines (no
    # look-around, \A, \Z, atomic group or possessive repeat): see :func:`candidate_lines`.
    line_local: bool = True
    # RE2 finds at least what Python's engine finds on ASCII text without the characters
    # Python's \s takes and RE2's does not (\v, \x1c-\x1f): only Unicode-aware classes,
    # word boundaries and a final ``$`` stood between the pattern and RE2.
    re2_ascii: bool = True


_PLAIN = re.compile(r"[^\\.^$*+?{}\[\]|()]*")
# Plain ints: `flags & re.IGNORECASE` goes through enum.Flag's Python-level operators, and the
# analysis tests flags thousands of times per pack.
_I, _M, _S, _A, _X, _L = (int(f) for f in (re.IGNORECASE, re.MULTILINE, re.DOTALL, re.ASCII, re.VERBOSE, re.LOCALE))
_TYPE_FLAGS = _A | _L | int(re.UNICODE)


def _in_scope(flags: int, group: Any) -> int:
    """The flags in force inside a group (a ``SUBPATTERN``'s ``(group, add, del, items)``):
    ``(?i:...)`` and ``(?-m:...)`` set and clear flags for their own scope only, and ``re``
    compiles what they hold with them (as its compiler combines them: a character-type flag
    replaces the one outside)."""
    add, remove = int(group[1]), int(group[2])
    if add & _TYPE_FLAGS:
        flags &= ~_TYPE_FLAGS
    return (flags | add) & ~remove


def _plain_text(pattern: str, flags: int) -> bool:
    return not flags & (_X | _L) and _PLAIN.fullmatch(pattern) is not None


def _parse(pattern: str, flags: int) -> Any:
    """``re``'s parse tree of ``pattern`` (raises ``re.error`` as ``re.compile`` would)."""
    from re import _parser  # type: ignore[attr-defined]

    return _parser.parse(pattern, flags)


def _check_lookbehinds(pattern: str, tree: Any) -> None:
    """Raise what ``re``'s compiler raises of a parsed pattern, without compiling it.

    Past the parser, ``re``'s compiler refuses one thing a pack can write: a look-behind whose
    width is not fixed (or is beyond what its code can hold). The runtime engines are RE2 and
    ``regex``, never ``re``, so compiling only for that verdict cost a third of judging a
    pattern; this walk gives the same verdict, in the same words.
    """
    if "(?<" not in pattern:  # `(?<=` and `(?<!` are the only spellings of a look-behind
        return
    from re import _compiler, _parser  # type: ignore[attr-defined]

    def walk(items: Any) -> None:
        for op, av in _ops(items):
            name = op.name
            if name in ("ASSERT", "ASSERT_NOT"):
                if av[0] < 0:
                    lo, hi = av[1].getwidth()
                    if lo > _compiler.MAXCODE:
                        raise re.error("looks too much behind")
                    if lo != hi:
                        raise re.error("look-behind requires fixed-width pattern")
                walk(av[1])
            elif name in _REPEATS:
                walk(av[2])
            elif name == "SUBPATTERN":
                walk(av[-1])
            elif name == "BRANCH":
                for branch in av[1]:
                    walk(branch)
            elif name == "GROUPREF_EXISTS":
                for branch in av[1:]:
                    if isinstance(branch, _parser.SubPattern):
                        walk(branch)
            elif name == "ATOMIC_GROUP":
                walk(av)

    walk(tree)


def _ops(items: Any) -> Any:
    """The items of a parse tree node as a plain list: ``re``'s ``SubPattern`` iterates through
    ``__getitem__`` one index at a time, which was a third of the analysis."""
    return getattr(items, "data", items)


def _analyse(pattern: str, flags: int, tree: Any = None) -> _Shape:
    from re import _parser  # type: ignore[attr-defined]

    if _plain_text(pattern, flags):  # plain text: most `contains:` rules
        return _Shape(True, len(pattern), len(pattern), False)
    if tree is None:
        tree = _parse(pattern, flags)
    all_flags = int(tree.state.flags)
    # `[[:alpha:]]` is a POSIX class to RE2 and a set of characters to `re`; `x{,5}` is a
    # repetition to `re` and text to RE2.
    safe = "[:" not in pattern and "{," not in pattern
    on_ascii = safe
    repeats = 0
    local = True

    # ``flags``: those in force where ``items`` stand (a scoped group's own within it).
    def walk(items: Any, depth_repeat: bool, flags: int) -> int:
        nonlocal safe, repeats, local, on_ascii
        ascii_only = bool(flags & _A)
        if flags & (_X | _L) or (ascii_only and flags & _I):
            safe = on_ascii = False  # RE2 has no such flags; with both, Python folds ASCII only, RE2 all of Unicode
        size = 0
        for op, av in _ops(items):
            name = op.name
            if name in _REPEATS:
                lo, hi, sub = av
                repeats += 1
                local = local and name != "POSSESSIVE_REPEAT"
                inner = walk(sub, depth_repeat or (hi > 1 and name != "POSSESSIVE_REPEAT"), flags)
                count = lo if hi == _parser.MAXREPEAT else hi
                if count > 1000:
                    safe = on_ascii = False  # RE2 refuses such counts, or reads `x{4294967294}` as text
                size += max(inner, 1) * max(count, 1)
            elif name == "SUBPATTERN":
                # `^` and `$` in a `(?-m:...)` group mean the ends of the text even when the
                # lines are searched joined (with MULTILINE): not where the lines meet.
                local = local and not av[2] & _M
                size += walk(av[-1], depth_repeat, _in_scope(flags, av))
            elif name == "BRANCH":
                size += sum(walk(b, depth_repeat, flags) for b in av[1])
            elif name in ("ASSERT", "ASSERT_NOT"):
                safe = local = on_ascii = False
                size += walk(av[1], depth_repeat, flags)
            elif name == "GROUPREF_EXISTS":
                safe = local = on_ascii = False
                size += sum(walk(b, depth_repeat, flags) for b in av[1:] if b is not None)
            elif name == "ATOMIC_GROUP":
                safe = local = on_ascii = False
                size += walk(av, depth_repeat, flags)
            elif name == "IN":
                for iop, iav in av:
                    if iop.name == "CATEGORY" and iav.name in _CATEGORIES_DIFFERENT and not ascii_only:
                        safe = False
                size += 1
            elif name == "CATEGORY":
                if av.name in _CATEGORIES_DIFFERENT and not ascii_only:
                    safe = False
                size += 1
            elif name == "AT":
                at = av.name
                local = local and at not in ("AT_BEGINNING_STRING", "AT_END_STRING")
                if (
                    (at in ("AT_BOUNDARY", "AT_NON_BOUNDARY") and not ascii_only)
                    or at == "AT_END_STRING"
                    or (at == "AT_END" and not flags & _M)
                ):
                    safe = False
                size += 1
            else:
                if name.startswith("GROUPREF"):
                    safe = on_ascii = False
                size += 1
        return size

    unrolled = walk(tree, False, all_flags)
    low, _ = tree.getwidth()
    # A nested repetition needs two of them.
    return _Shape(safe, low, unrolled, repeats > 1 and _ambiguous_repeat(tree, all_flags), local, on_ascii)


# A sample of characters stands for "what an item can match": enough to tell \d from '.',
# \w from ' ' and letters from digits in the scripts packs meet.
_SAMPLE = (*(chr(i) for i in range(128)), "\xa0", "\xe9", "\xdf", "\u0416", "\u0663", "\u2028", "\u4e2d")
_ALL = frozenset(_SAMPLE)


def _category(name: str, ch: str, flags: int) -> bool:
    probe = {"DIGIT": r"\d", "WORD": r"\w", "SPACE": r"\s"}
    negated = "_NOT_" in name
    for key, cls in probe.items():
        if key in name:
            hit = re.match(cls, ch, _A if flags & _A else 0) is not None
            return hit != negated
    return True


# The sample characters an item of a class can match, per item and per relevant flag: the same
# few items (\d, \w, a-z, ...) recur in hundreds of pack patterns, and testing each of the 135
# sample characters against each item again dominated the validation of a pack.
@lru_cache(maxsize=4096)
def _category_chars(name: str, flags: int) -> frozenset[str]:
    return frozenset(ch for ch in _SAMPLE if _category(name, ch, flags))


@lru_cache(maxsize=4096)
def _class_item_chars(op: str, av: Any, flags: int) -> frozenset[str]:
    """The sample characters one item of a ``[...]`` class matches (``flags``: I and ASCII)."""
    if op == "LITERAL":
        lit = chr(av)
        if flags & _I:
            folded = lit.lower()
            return frozenset(ch for ch in _SAMPLE if ch == lit or ch.lower() == folded)
        return frozenset({lit}) & _ALL
    if op == "RANGE":
        lo, hi = av

        def within(ch: str) -> bool:
            cased = {ch, ch.lower(), ch.upper()} if flags & _I else {ch}
            return any(len(c) == 1 and lo <= ord(c) <= hi for c in cased)  # 'ß'.upper() is 'SS'

        return frozenset(ch for ch in _SAMPLE if within(ch))
    if op == "CATEGORY":
        return _category_chars(str(av), flags)
    return _ALL  # RANGE_UNI_IGNORE, CHARSET...: assume it may


def _chars(op: str, av: Any, flags: int) -> frozenset[str]:
    """The sample characters one item can consume (any position), for the ambiguity test."""
    if op == "LITERAL":
        return frozenset({chr(av)} | ({chr(av).swapcase()} if flags & _I else set()))
    if op == "NOT_LITERAL":
        return _ALL - {chr(av)}
    if op == "ANY":
        return _ALL if flags & _S else _ALL - {"\n"}
    if op == "IN":
        relevant = flags & (_I | _A)
        hits: frozenset[str] = frozenset()
        negate = False
        for o, a in av:
            name = o.name
            if name == "NEGATE":
                negate = True
                continue
            hits = hits | _class_item_chars(name, a if name != "CATEGORY" else a.name, relevant)
        return _ALL - hits if negate else hits
    if op == "CATEGORY":
        return _category_chars(av.name, flags & _A)
    if op in _REPEATS:
        return _seq_chars(av[2], flags)
    if op == "SUBPATTERN":
        return _seq_chars(av[-1], _in_scope(flags, av))
    if op == "ATOMIC_GROUP":
        return _seq_chars(av, flags)
    if op == "BRANCH":
        return frozenset().union(*(_seq_chars(b, flags) for b in av[1]))
    if op in ("AT", "ASSERT", "ASSERT_NOT"):
        return frozenset()
    return _ALL  # a backreference, a conditional: anything


def _seq_chars(items: Any, flags: int) -> frozenset[str]:
    return frozenset().union(*(_chars(op.name, av, flags) for op, av in _ops(items)))


def _first(items: Any, flags: int) -> tuple[frozenset[str], bool]:
    """(characters a match of ``items`` can start with, whether it can be empty)."""
    out: frozenset[str] = frozenset()
    for op, av in _ops(items):
        op = op.name
        if op == "AT" and av.name == "AT_END_STRING":
            return out, False  # \Z: nothing can follow
        if op == "AT" and av.name in ("AT_END", "AT_END_LINE"):
            return out | {"\n"}, False  # $: at most a line break follows
        if op in ("AT", "ASSERT", "ASSERT_NOT"):
            continue
        if op in _REPEATS:
            chars, empty = _first(av[2], flags)
            out |= chars
            if av[0] > 0 and not empty:
                return out, False
            continue
        if op in ("SUBPATTERN", "ATOMIC_GROUP"):
            chars, empty = _first(av[-1], _in_scope(flags, av)) if op == "SUBPATTERN" else _first(av, flags)
            out |= chars
            if not empty:
                return out, False
            continue
        if op == "BRANCH":
            parts = [_first(b, flags) for b in av[1]]
            out = out.union(*(p[0] for p in parts))
            if not any(p[1] for p in parts):
                return out, False
            continue
        return out | _chars(op, av, flags), False
    return out, True


_SCANNED = frozenset({"MAX_REPEAT", "MIN_REPEAT", "SUBPATTERN", "BRANCH"})


def _ambiguous_repeat(tree: Any, flags: int) -> bool:
    r"""Whether a repetition sits inside another one so that the text it could consume may
    instead start what follows it, or the next round of the outer repetition (``(a+)+``,
    ``(\w+\s?)*``, ``(.*,)+``): the shape that makes a backtracking engine try exponentially
    many ways to split an input that fails at the end. ``(\d+\.)+`` or ``(?:\.\w+)*`` are
    not: a delimiter the inner repetition cannot consume separates the rounds."""

    # ``follow``: what may come right after ``items`` within the innermost enclosing round
    # (the round's own start when nothing else does); what follows the outer repetition as a
    # whole only makes for polynomial retries, which the time limit absorbs.
    def scan(items: Any, follow: frozenset[str], inside: bool, flags: int) -> bool:
        items = _ops(items)
        for i, (op, av) in enumerate(items):
            op = op.name
            if op not in _SCANNED:
                continue  # nothing inside it to look at, and no use for what follows it
            rest_first, rest_empty = _first(items[i + 1 :], flags)
            after = rest_first | (follow if rest_empty else frozenset())
            if op in ("MAX_REPEAT", "MIN_REPEAT"):
                _, hi, body = av
                if hi > 1:
                    if inside and _seq_chars(body, flags) & after:
                        return True
                    if scan(body, _first(body, flags)[0], True, flags):
                        return True
                elif scan(body, after, inside, flags):
                    return True
            elif op == "SUBPATTERN":
                if scan(av[-1], after, inside, _in_scope(flags, av)):
                    return True
            elif op == "BRANCH" and any(scan(b, after, inside, flags) for b in av[1]):
                return True
        return False

    return scan(tree, frozenset(), False, flags)


def nested_quantifier(pattern: str, flags: int = 0) -> bool:
    """Whether ``pattern`` repeats something that itself repeats (``(a+)+``) *and* runs on the
    backtracking engine: such patterns can take exponential time there (RE2 cannot)."""
    try:
        compiled = compile(pattern, flags)
    except re.error:
        return False
    return compiled.shape.nested and compiled.may_backtrack


# -- compiled patterns ---------------------------------------------------------------------

_RE2_FLAGS = ((re.IGNORECASE, "i"), (re.MULTILINE, "m"), (re.DOTALL, "s"))
_REGEX_FLAGS = ("IGNORECASE", "MULTILINE", "DOTALL", "VERBOSE", "ASCII", "UNICODE")  # same names in `regex`


class Pattern:
    """A pack pattern: the ``re`` interface subset the engine uses, bounded in time."""

    __slots__ = ("_re2_compiled", "_regex", "flags", "groupindex", "groups", "key", "pattern", "shape")

    def __init__(self, pattern: str, flags: int) -> None:
        with warnings.catch_warnings():
            # "Possible nested set" and similar FutureWarnings are about the pattern, not us.
            warnings.simplefilter("ignore")
            try:
                # The language is `re`: its verdict first. Parsed once, for it and the analysis.
                tree = None if _plain_text(pattern, flags) else _parse(pattern, flags)
                if tree is not None:
                    _check_lookbehinds(pattern, tree)
            except (OverflowError, RecursionError) as exc:  # a count beyond 2**32, deep nesting
                raise PatternError(str(exc) or type(exc).__name__) from None
            self.shape = _analyse(pattern, flags, tree)
        self.pattern = pattern
        self.flags = flags
        # What `re.compile` would say of the groups (its compiler takes them from the parser).
        self.groups = 0 if tree is None else tree.state.groups - 1
        self.groupindex = {} if tree is None else dict(tree.state.groupdict)
        self.key = hashlib.sha256(f"{flags}:{pattern}".encode("utf-8", "surrogatepass")).hexdigest()[:24]
        # Both engines compile on first use (validating 140,000 rules matches none of them);
        # what decides whether the pattern is usable at all is settled now.
        self._re2_compiled: Any = _UNSET if self.shape.re2_safe else None
        self._regex: Any = None
        if self.shape.unrolled > MAX_UNROLLED and self._re2 is None:
            self._compile_regex()  # raises PatternError: too large for the backtracking engine

    @property
    def _re2(self) -> Any:
        if self._re2_compiled is _UNSET:
            self._re2_compiled = self._compile_re2()
        return self._re2_compiled

    def _compile_re2(self) -> Any:
        _re2 = re2_module()
        if _re2 is None:
            return None
        inline = "".join(f for flag, f in _RE2_FLAGS if self.flags & flag)
        options = _re2.Options()
        options.log_errors = False  # RE2 would print its refusals on stderr
        try:
            return _re2.compile((f"(?{inline})" if inline else "") + self.pattern, options)
        except Exception:  # not RE2 syntax, too large, a surrogate: the other engine runs it
            return None

    def _compile_regex(self) -> Any:
        if self.shape.unrolled > MAX_UNROLLED:
            raise PatternError(
                f"pattern is too large to run in bounded time: its repetitions expand to about "
                f"{self.shape.unrolled:,} items (the limit is {MAX_UNROLLED:,})"
            )
        _regex = regex_module()
        flags = 0
        for name in _REGEX_FLAGS:
            if self.flags & getattr(re, name):
                flags |= getattr(_regex, name)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return _regex.compile(regex_source(self.pattern, self.flags), flags | _regex.VERSION0)
        except _regex.error as exc:
            raise PatternError(f"pattern cannot be run safely: {exc}") from None

    @property
    def engine(self) -> str:
        return "re2" if self._re2 is not None else "regex"

    @property
    def may_backtrack(self) -> bool:
        """Whether some operation runs this pattern on the backtracking engine."""
        return self._re2 is None or self.shape.min_width == 0

    def __repr__(self) -> str:
        return f"<ctxrules pattern {self.pattern!r} on {self.engine}>"

    # -- engines ----------------------------------------------------------------------------
    def _backtracking(self, length: int) -> Any:
        memory = _memory()
        if memory.holds(self.key, length):
            error = PatternTimeout(self, earlier=True)
            memory.report(str(error))
            raise error
        if self._regex is None:
            try:
                self._regex = self._compile_regex()
            except PatternError as exc:  # `re` took it, `regex` does not: never run it
                memory.add(self.key, 0)
                error = PatternTimeout(self, earlier=False, reason=str(exc))
                memory.report(str(error))
                raise error from None
        return self._regex

    def _timed(self, text: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        budget = _BUDGET.get()
        if budget is None:
            limit = MATCH_TIME_LIMIT_S
        elif budget.left <= 0:
            raise self._over_budget()
        else:
            limit = min(MATCH_TIME_LIMIT_S, budget.left)
        started = time.monotonic()
        try:
            return call(*args, timeout=limit, **kwargs)
        except TimeoutError:
            if budget is not None:
                budget.left -= time.monotonic() - started
                if limit < MATCH_TIME_LIMIT_S:  # cut short by the budget: it may run in time later
                    raise self._over_budget() from None
            memory = _memory()
            memory.add(self.key, 0 if self.shape.nested else len(text) // 2)
            error = PatternTimeout(self)
            memory.report(str(error))
            raise error from None

    def _over_budget(self) -> PatternTimeout:
        """The error of a call skipped (or cut short) because the block's budget for patterns
        that time out is spent; not remembered as timed out: a later call tries it again."""
        error = PatternTimeout(self, reason=f"patterns that timed out took the {TIMEOUT_BUDGET_S:g} s this call allows")
        _memory().report(str(error))
        return error

    def _on_re2(self, text: str, iterating: bool) -> bool:
        if self._re2 is None or (iterating and self.shape.min_width == 0):
            return False
        # RE2 works on UTF-8: text with a lone surrogate cannot go there.
        return text.isascii() or _encodable(text)

    # -- the `re` interface -----------------------------------------------------------------
    def search(self, text: str) -> Match | None:
        text = _plain(text)
        if self._on_re2(text, False):
            return self._re2.search(text)  # type: ignore[no-any-return]
        return self._timed(text, self._backtracking(len(text)).search, text)  # type: ignore[no-any-return]

    def match(self, text: str) -> Match | None:
        text = _plain(text)
        if self._on_re2(text, False):
            return self._re2.match(text)  # type: ignore[no-any-return]
        return self._timed(text, self._backtracking(len(text)).match, text)  # type: ignore[no-any-return]

    def fullmatch(self, text: str) -> Match | None:
        text = _plain(text)
        if self._on_re2(text, False):
            return self._re2.fullmatch(text)  # type: ignore[no-any-return]
        return self._timed(text, self._backtracking(len(text)).fullmatch, text)  # type: ignore[no-any-return]

    def finditer(self, text: str) -> Iterator[Match]:
        text = _plain(text)
        if self._on_re2(text, True):
            return iter(list(self._re2.finditer(text)))
        found = self._backtracking(len(text))
        return iter(self._timed(text, lambda t, timeout: list(found.finditer(t, timeout=timeout)), text))

    def findall(self, text: str) -> list[Any]:
        text = _plain(text)
        if self._on_re2(text, True):
            return list(self._re2.findall(text))
        return list(self._timed(text, self._backtracking(len(text)).findall, text))

    def split(self, text: str, maxsplit: int = 0) -> list[str]:
        text = _plain(text)
        if self._on_re2(text, True):
            return list(self._re2.split(text, maxsplit))
        return list(self._timed(text, self._backtracking(len(text)).split, text, maxsplit))

    def subn(self, repl: str | Callable[[Any], str], text: str, count: int = 0) -> tuple[str, int]:
        text = _plain(text)
        if self._on_re2(text, True) and (callable(repl) or "\\" not in repl):
            fn = repl if callable(repl) else (lambda _m, r=repl: r)
            return self._re2.subn(fn, text, count)  # type: ignore[no-any-return]
        return self._timed(text, self._backtracking(len(text)).subn, repl, text, count)  # type: ignore[no-any-return]

    def sub(self, repl: str | Callable[[Any], str], text: str, count: int = 0) -> str:
        return self.subn(repl, text, count)[0]


def _plain(text: str) -> str:
    # `regex` builds results of the argument's own type: a str subclass (the compressors'
    # numbered lines) would be called with arguments it does not take.
    return text if type(text) is str else str(text)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# -- many lines at once ----------------------------------------------------------------------

CANDIDATES_MIN_LINES = 32
"""Fewer lines than this are cheaper to search one by one than joined."""

CANDIDATES_TIME_LIMIT_S = 0.25
"""Seconds the search of all lines at once may take before the lines are searched one by one."""


def timed_out_before(pattern: Pattern) -> bool:
    """Whether ``pattern`` is remembered as timed out on some text (a search of a text at least
    that long raises at once)."""
    return pattern.key in _memory().keys


def candidate_lines(patterns: Sequence[Pattern], lines: Sequence[str]) -> list[int] | None:
    """Ascending indexes of the ``lines`` in which one of ``patterns`` may match (every line
    it matches is among them), found by one search of the lines joined by newlines per
    pattern; None when that would not be cheaper or cannot be trusted, and every line is to
    be searched. The caller still searches each candidate: this only leaves out lines no
    pattern can match, so the outcome is that of searching every line, in a fraction of the
    time (one bounded call of the engine instead of one per line, each paying for its time
    limit and the call itself).

    It can be trusted for patterns that are ``line_local`` (see :class:`_Shape`): a match in a
    line alone is still one in the joined text, or the text of an earlier match reaches into
    the line (which makes the line a candidate too), with ``^`` and ``$`` matching at every
    newline. A pattern the session remembers as timed out is searched line by line, so that it
    is reported as it would be; so is everything when the joined search runs out of time (the
    pattern is not held against: each line gets its own time limit then)."""
    if len(lines) < CANDIDATES_MIN_LINES or not patterns:
        return None
    keys = _memory().keys
    if any(not p.shape.line_local or p.key in keys for p in patterns):
        return None
    joined = "\n".join(lines)
    # RE2, linear and faster, where it finds at least what the pattern finds: ASCII text.
    plain = joined.encode("ascii") if joined.isascii() and not any(c in joined for c in PAST_RE2) else None
    starts = list(itertools.accumulate((len(line) + 1 for line in lines), initial=0))
    last_line = len(lines) - 1
    most = len(lines) // 2  # beyond that, one search per line costs less than this
    deadline = time.monotonic() + CANDIDATES_TIME_LIMIT_S
    found: set[int] = set()
    for pattern in patterns:
        fast = _multiline_re2(pattern.pattern, pattern.flags) if plain is not None and pattern.shape.re2_ascii else None
        slow: Any = None if fast is not None else _multiline(pattern.pattern, pattern.flags)
        at = 0
        while True:
            # After a match, the search goes on from the start of the line after the last it
            # touched: at most one search per line, however often the pattern matches.
            try:
                if fast is not None:
                    match = fast.search(plain, at)
                else:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return None
                    match = slow.search(joined, at, timeout=left)
            except TimeoutError:
                return None
            except Exception:  # `regex` refuses what `re` took: line by line, as Pattern does it
                return None
            if match is None:
                break
            touched = _touched(starts, last_line, *match.span())
            found.update(touched)
            last = touched[-1]
            if len(found) > most:
                return None
            if last >= last_line:
                break
            at = starts[last + 1]
    return sorted(found)


def lines_touched(spans: Sequence[tuple[int, int]], lines: Sequence[str]) -> set[int]:
    """Indexes of the ``lines`` that the character ``spans`` of ``"\\n".join(lines)`` touch (a
    span across a newline touches both lines; an empty one, the line it is in)."""
    starts = list(itertools.accumulate((len(line) + 1 for line in lines), initial=0))
    out: set[int] = set()
    for start, end in spans:
        out.update(_touched(starts, len(lines) - 1, start, end))
    return out


def _touched(starts: list[int], last_line: int, start: int, end: int) -> range:
    """The lines (``starts``: where each begins in the joined text) the span touches."""
    first = bisect.bisect_right(starts, start) - 1
    return range(first, min(bisect.bisect_right(starts, max(start, end - 1)) - 1, last_line) + 1)


PAST_RE2 = "\x0b\x1c\x1d\x1e\x1f"
"""The ASCII characters Python's ``\\s`` matches and RE2's does not: ASCII text without them
is read alike by both wherever :attr:`_Shape.re2_ascii` holds."""


# `re` reads a `{` that does not open a counted repetition (`{2}`, `{2,}`, `{,5}`, `{2,5}`) as
# the character itself, and a `[` inside a set as one more character of the set. The `regex`
# module reads some of those differently: `a{e<=1}` as fuzzy matching (one error allowed),
# `[[:alpha:]]` as a POSIX class, and `x{1}{e}` not at all.
_COUNTED = re.compile(r"\{(?:[0-9]+(?:,[0-9]*)?|,[0-9]*)\}")
_COMMENT = re.compile(r"\(\?#(?:[^\\)]|\\.)*\)?|#[^\n]*", re.DOTALL)
# A group that sets flags for its own scope: `(?x:`, `(?i-x:`, `(?-x:`.
_SCOPED_FLAGS = re.compile(r"\(\?([aiLmsux]*)(?:-([imsx]*))?:")


@lru_cache(maxsize=1024)
def regex_source(pattern: str, flags: int = 0) -> str:
    """``pattern`` as the ``regex`` module must be given it to read what ``re`` reads: each
    ``{`` that ``re`` takes as the character, and each ``[`` inside a set, escaped. The
    rewrite is kept only when ``re`` parses it to the very tree it parses ``pattern`` to (it
    adds backslashes and nothing else); otherwise ``pattern`` is returned as it is."""
    if "{" not in pattern and "[" not in pattern:
        return pattern
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = _parse(pattern, flags)
    except (re.error, OverflowError, RecursionError):
        return pattern
    # Whether `#` opens a comment: under (?x), within a group that sets or clears it for its
    # own scope (`(?x:...)`, also what a list of patterns joined by `|` makes of a `(?x)`
    # pattern); `scopes` holds the state outside each open group.
    verbose = bool(tree.state.flags & _X)
    scopes: list[bool] = []
    out: list[str] = []
    i, n, in_set = 0, len(pattern), False
    while i < n:
        ch = pattern[i]
        comment = _COMMENT.match(pattern, i) if not in_set and (ch == "(" or (ch == "#" and verbose)) else None
        if comment is not None:  # `(?#...)`, and `# ...` to the end of the line under (?x)
            out.append(comment.group())
            i = comment.end()
            continue
        if not in_set and ch == "(":
            scopes.append(verbose)
            scoped = _SCOPED_FLAGS.match(pattern, i)
            if scoped is not None:
                verbose = "x" not in (scoped[2] or "") and (verbose or "x" in scoped[1])
        elif not in_set and ch == ")" and scopes:
            verbose = scopes.pop()
        if ch == "\\":
            # `\N{EM DASH}` names a character: its braces are not a repetition's.
            end = pattern.find("}", i + 3) + 1 if pattern.startswith("N{", i + 1) else 0
            end = end or i + 2
            out.append(pattern[i:end])
            i = end
            continue
        if in_set:
            if ch == "]":
                in_set = False
            out.append("\\[" if ch == "[" else ch)
            i += 1
            continue
        if ch == "[":
            # A `]` first in a set (after an optional `^`) is one of its characters.
            j = i + 1 + pattern.startswith("^", i + 1)
            j += pattern.startswith("]", j)
            out.append(pattern[i:j])
            i, in_set = j, True
            continue
        if ch == "{":
            counted = _COUNTED.match(pattern, i)
            out.append(counted.group() if counted else "\\{")
            i = counted.end() if counted else i + 1
            continue
        out.append(ch)
        i += 1
    rewritten = "".join(out)
    if rewritten == pattern:
        return pattern
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            same = _tree_of(tree) == _tree_of(_parse(rewritten, flags))
    except (re.error, OverflowError, RecursionError):
        same = False
    return rewritten if same else pattern


def _tree_of(parsed: Any) -> Any:
    """``re``'s parse tree as nested tuples (parse trees do not compare by value), with the
    flags and group names the parse found."""
    from re import _parser  # type: ignore[attr-defined]

    def frozen(node: Any) -> Any:
        if isinstance(node, _parser.SubPattern):
            return ("sub", *map(frozen, node.data))
        if isinstance(node, list | tuple):
            return tuple(map(frozen, node))
        return node

    return frozen(parsed), int(parsed.state.flags), tuple(sorted(parsed.state.groupdict.items()))


@lru_cache(maxsize=256)
def _multiline_re2(pattern: str, flags: int) -> Any:
    """``pattern`` on RE2 with ``^`` and ``$`` at every newline; None when RE2 cannot take it."""
    _re2 = re2_module()
    if _re2 is None:
        return None
    inline = "m" + "".join(f for flag, f in _RE2_FLAGS if flags & flag and f != "m")
    options = _re2.Options()
    options.log_errors = False
    try:
        return _re2.compile(f"(?{inline})" + pattern, options)
    except Exception:  # not RE2 syntax: the backtracking engine searches it
        return None


@lru_cache(maxsize=256)
def _multiline(pattern: str, flags: int) -> Any:
    """``pattern`` on the backtracking engine with ``^`` and ``$`` at every newline."""
    _regex = regex_module()
    converted = _regex.MULTILINE | _regex.VERSION0
    for name in _REGEX_FLAGS:
        if flags & getattr(re, name):
            converted |= getattr(_regex, name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _regex.compile(regex_source(pattern, flags), converted)


def compile(pattern: str, flags: int = 0) -> Pattern:
    """The :class:`Pattern` of ``pattern``; raises ``re.error`` (or :class:`PatternError`, a
    subclass) when it does not compile or cannot run in bounded time. One object per distinct
    (pattern, flags) in a process: a pattern is judged once however many packs, checks and
    actions name it (a pack that extends twelve fragments validated in the same run names
    each of their patterns twice)."""
    return _compiled(pattern, int(flags))


# Keyed by the two values alone (``compile(p)`` and ``compile(p, 0)`` are one entry; an
# lru_cache on ``compile`` itself keys them apart). Patterns are immutable once built.
@lru_cache(maxsize=8192)
def _compiled(pattern: str, flags: int) -> Pattern:
    return Pattern(pattern, flags)
