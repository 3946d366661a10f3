"""Failure lines: the lines of an output no compressor may elide (docs/compressors.md).

Every compressor rule declares its ``failures:`` patterns, in priority order (a test's
summary line before its assertion lines). After a rule's steps have run, the engine puts back
every original line that matches one of them and that no output line stands for, so a budget
(``max_lines``, ``limit_blocks``, ``head``...) never hides a failure. Only when the failure
lines the steps dropped are more than ``failures_max`` does the engine stop: it puts them back
in priority order up to the cap, and the markers of the elided runs name how many failure
lines each one holds (``failures=N``), so the count and the vault range are always in the
output.

A pattern is a regular expression, or ``{pattern: RE, before: N, after: M}`` to also protect
the lines around each match: a traceback's exception line with ``before: 2`` keeps the last
frame (its ``File "...", line N`` line and the source line) with it.

A rule without ``failures:`` gets :data:`DEFAULT_FAILURES`; ``failures: []`` opts out (a rule
whose every line would match, such as a search, protects nothing instead of everything).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ctxrules import patterns as pack_patterns
from ctxrules.compressors.actions.common import Matcher, compile_all, matching
from ctxrules.compressors.lines import without_escapes

__all__ = [
    "DEFAULT_FAILURES",
    "FAILURES_MAX",
    "FailurePattern",
    "combined_matcher",
    "compile_failures",
    "failure_lines",
]

DEFAULT_FAILURES: tuple[str, ...] = (
    # Outcome words as tools print them: upper-case verdicts and lower-case severities at the
    # start of a diagnostic; "0 errors" or a test named test_error_path is no failure.
    r"\b(?:FAIL|FAILED|FAILURE|ERROR|ERRORS|FATAL|PANIC)\b",
    r"(?:^|\s)(?:[A-Z]\w*)?(?:Error|Exception|Failure):(?:\s|$)",
    r"^Traceback \(most recent call last\):",
    # Pods and containers that keep failing (kubectl, docker ps, helm status...).
    r"\b(?:CrashLoopBackOff|ImagePullBackOff|ErrImagePull|OOMKilled|CreateContainerConfigError)\b",
    # A process that died: what the shell, the kernel and the runtimes print for it.
    # (bash says `PID Killed` / `PID Aborted` for a job it ran, an interactive shell `Killed`.)
    r"\b(?:Segmentation fault|Illegal instruction|Floating point exception|core dumped|Out of memory|std::bad_alloc)\b",
    r"^(?:Killed|Aborted)(?: \(core dumped\))?$|\s\d+\s+(?:Killed|Aborted)(?:\s|$)|^terminate called\b",
    r"\b\w*Sanitizer:|\bERR!(?:\s|$)",
    # A merge, rebase or pull that stopped on conflicts (git's lines, one per file).
    r"^CONFLICT \(",
    r"\bpanic(?:ked)?\b",
    r"(?i)^\s*(?:\S+:\s*)?(?:fatal|error)(?:\[\w+\])?:",
    # A location: path:line: or path:line:col: with a file extension (what editors jump by).
    r"^\s*[\w./~+@-]*\w\.\w+:\d+(?::\d+)?:(?:\s|$)",
)
"""The failure patterns of a rule that declares none (and of ``generic``)."""

FAILURES_MAX = 200
"""Failure lines the engine puts back into one output at most (a rule may ask for more or
less); the ones the rule's steps kept do not count."""


@dataclass(frozen=True)
class FailurePattern:
    """One declared failure pattern and the lines around a match it also protects. The
    pattern runs bounded in time, as every pack pattern (:mod:`ctxrules.patterns`): a line that
    another failure pattern matched is searched with it too, and Python's ``re`` would take
    exponential time there on ``(a+)+c``."""

    regex: pack_patterns.Pattern
    before: int = 0
    after: int = 0


def compile_failures(patterns: Sequence[Any]) -> tuple[FailurePattern, ...]:
    """The compiled patterns; raises ``re.error`` for the first that does not compile or
    cannot run in bounded time, and ``ValueError`` for an entry that is neither a string nor
    ``{pattern, before, after}``."""
    out: list[FailurePattern] = []
    for entry in patterns:
        if isinstance(entry, str):
            out.append(FailurePattern(pack_patterns.compile(entry)))
        elif isinstance(entry, Mapping) and isinstance(entry.get("pattern"), str):
            before, after = entry.get("before", 0), entry.get("after", 0)
            if not (isinstance(before, int) and isinstance(after, int)) or min(before, after) < 0:
                raise ValueError("before and after of a failure pattern are counts (>= 0)")
            out.append(FailurePattern(pack_patterns.compile(entry["pattern"]), before, after))
        else:
            raise ValueError(f"a failure pattern is a string or {{pattern: ...}}, got {entry!r}")
    return tuple(out)


@lru_cache(maxsize=256)
def combined_matcher(regexes: tuple[pack_patterns.Pattern, ...]) -> Matcher:
    """One matcher for any of ``regexes`` (at least one), made once per set: the failure
    patterns of a pack and the large-output compressor's filters are matched line by line."""
    matcher = compile_all([r.pattern for r in regexes])
    assert matcher is not None
    return matcher


def failure_lines(
    patterns: Sequence[FailurePattern],
    lines: Sequence[str],
    numbers: Sequence[int] | None = None,
    total: int | None = None,
) -> list[int]:
    """1-based numbers of the lines matching ``patterns``, in priority order: the lines of the
    first pattern in output order, then those of the second that the first did not take...

    Lines are matched without their terminal escapes (a red ``FAILED`` is still ``FAILED``).
    ``numbers`` (ascending) and ``total`` are for a part of an output: ``lines[i]`` is line
    ``numbers[i]`` of ``total`` (an output too large to hold, see
    :mod:`ctxrules.compressors.large`); by default the lines are the whole output.
    """
    if not patterns:
        return []
    plain = [without_escapes(line) for line in lines]
    taken: set[int] = set()
    order: list[int] = []
    n = len(plain) if total is None else total
    # One pass with all patterns as one alternation finds the few candidate lines; the
    # priority order is then worked out on those alone.
    anyone = combined_matcher(tuple(p.regex for p in patterns))
    found = matching(anyone, plain)
    candidates = [(i + 1 if numbers is None else numbers[i], plain[i]) for i in found]
    for pattern in patterns:
        search = pattern.regex.search
        for index, text in candidates:
            if search(text) is None:
                continue
            first, last = max(1, index - pattern.before), min(n, index + pattern.after)
            for line_no in range(first, last + 1):
                if line_no not in taken:
                    taken.add(line_no)
                    order.append(line_no)
    return order
