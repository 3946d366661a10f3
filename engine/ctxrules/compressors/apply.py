"""Run a rule's steps, then enforce the truthfulness rules that no rule can switch off.

1. **Failures stay failures.** A run *failed* when its exit code is not 0, or, when the exit
   code is unknown, when its output looks like a failure (:data:`FAILURE_TEXT`). Actions see
   that verdict (``short_circuit`` refuses to summarize a failed run) and the last
   ``failure_tail`` lines (at least :data:`~ctxrules.compressors.rules.FAILURE_TAIL`) of a
   failed run are always in the result: lines a rule dropped are put back.
2. **Every elision is marked.** Whatever original line no output line stands for gets a
   marker ``[ctxrules:elided kind=lines count=N ref=vault://<id>#La-Lb]`` where it was; runs
   of blank lines alone need none. Beyond ``max_markers`` runs, the closest runs share one
   marker whose range spans them (it may include shown lines; ``count`` is what was elided).
   The line that reports the exit code (one the pack's ``tools.exit_code`` patterns find) is
   kept the same way.
3. **Failure lines are never elided.** Every original line matching one of the rule's
   ``failures`` patterns (:mod:`ctxrules.compressors.failures`) is put back, up to
   ``failures_max``; a marker whose range holds failure lines beyond the cap says how many
   (``failures=N``).
4. **Lossless means lossless.** For ``lossless: true`` rules every dropped line is put back
   (rewrites and folds of identical lines stay).
5. **Never larger.** A result that is not smaller than the input, in UTF-8 bytes, is no
   result: the caller keeps the original.

Put-back lines are placed after the last output line that comes from earlier in the
original; lines of a failure tail lose their terminal escape sequences, lossless ones are
put back byte for byte.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ctxrules.compressors.failures import failure_lines
from ctxrules.compressors.lines import Line, Lines, RunInfo, without_escapes
from ctxrules.compressors.rules import CompiledRule, CompressorError
from ctxrules.patterns import Pattern, PatternTimeout, candidate_lines
from ctxrules.vault import format_marker

__all__ = ["FAILURE_TEXT", "Applied", "Window", "apply_rule", "apply_rule_window", "looks_failed", "split_output"]

FAILURE_TEXT = re.compile(
    r"(?im)^.*(?:\b(?:error|fatal|panic|panicked|failed|failure|exception)\b"
    r"|traceback \(most recent call last\)|command not found|no such file or directory)"
)


def looks_failed(output: str) -> bool:
    """Whether an output whose exit code is unknown reads like a failure (checked near its end,
    where tools report the outcome)."""
    return FAILURE_TEXT.search(output[-20_000:]) is not None


def is_failure(exit_code: int | None, output: str) -> bool:
    if exit_code is not None:
        return exit_code != 0
    return looks_failed(output)


def split_output(output: str) -> tuple[list[str], bool]:
    """Lines as the vault numbers them (only ``\\n`` ends a line), and a trailing newline flag."""
    if not output:
        return [], False
    lines = output.split("\n")
    trailing = output.endswith("\n")
    if trailing:
        lines.pop()
    return lines, trailing


@dataclass(frozen=True)
class Applied:
    text: str
    lines_before: int
    lines_after: int
    elided: int
    markers: int
    failed: bool


def _run_steps(rule: CompiledRule, items: list[str], run: RunInfo) -> list[str]:
    for index, step in enumerate(rule.steps, 1):
        try:
            result = step.run(Lines(items, run))
        except (CompressorError, PatternTimeout):
            raise  # a timed-out pack pattern skips the rule (compressors.api)
        except Exception as exc:  # an action bug must name itself, not surface as a traceback
            raise CompressorError(
                f"compressor '{rule.id}', step {index} ({step.action}) failed: {type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(result, list | tuple) or not all(isinstance(x, str) for x in result):
            raise CompressorError(
                f"compressor '{rule.id}', step {index} ({step.action}) must return "
                f"a list of str, got {type(result).__name__}"
            )
        items = list(result)
    return items


class _Placer:
    """Where an original line goes back: after the last output item from earlier lines."""

    def __init__(self, items: Sequence[str]) -> None:
        keys: list[int] = []
        key = 0
        for item in items:
            if isinstance(item, Line):
                key = item.src[0]
            keys.append(key)
        order = sorted(range(len(items)), key=lambda j: keys[j])
        self.sorted_keys = [keys[j] for j in order]
        self.prefix_max: list[int] = []
        best = -1
        for j in order:
            best = max(best, j)
            self.prefix_max.append(best)

    def position(self, line_no: int) -> int:
        """Index in the item list before which something about ``line_no`` is inserted."""
        count = bisect.bisect_left(self.sorted_keys, line_no)
        return 0 if count == 0 else self.prefix_max[count - 1] + 1


def _insert(items: list[str], inserts: list[tuple[int, float, str]]) -> list[str]:
    """Insert ``(position, order, text)`` entries; stable by order at the same position."""
    if not inserts:
        return items
    inserts.sort(key=lambda e: (e[0], e[1]))
    out: list[str] = []
    k = 0
    for index, item in enumerate(items):
        while k < len(inserts) and inserts[k][0] <= index:
            out.append(inserts[k][2])
            k += 1
        out.append(item)
    out.extend(entry[2] for entry in inserts[k:])
    return out


def _coalesce(runs: list[list[int]], limit: int) -> list[list[int]]:
    """At most ``limit`` runs: merge across the smallest separations first."""
    if len(runs) <= limit:
        return runs
    gaps = sorted(range(1, len(runs)), key=lambda i: (runs[i][0] - runs[i - 1][1], i))
    cuts = set(sorted(gaps[len(gaps) - (limit - 1) :]) if limit > 1 else [])
    merged: list[list[int]] = []
    for i, run in enumerate(runs):
        if merged and i not in cuts:
            merged[-1][1] = run[1]
            merged[-1][2] += run[2]
        else:
            merged.append(list(run))
    return merged


@dataclass(frozen=True)
class Window:
    """The part of an output the engine holds when the whole would not fit in memory
    (:mod:`ctxrules.compressors.large`): the rule's steps see ``lines`` (the head and the tail
    of the output, ``(number, text)`` in order), the engine's rules also see what ``middle``
    gives: ``extra`` (lines of the middle that match a failure or exit-code pattern, and the
    lines around them) and ``lost`` (the numbers of further matching lines whose text was not
    kept). Every other line of the middle is elided."""

    lines: Sequence[tuple[int, str]]
    middle: Callable[[], tuple[Mapping[int, str], Sequence[int]]]
    """``(extra, lost)``, asked for once the rule's steps have run on ``lines`` (the middle
    may still be being searched while they run)."""
    total: int
    trailing: bool
    tail: str
    """The end of the output, for the failure verdict when the exit code is unknown."""


def apply_rule(
    rule: CompiledRule,
    output: str,
    *,
    command: str,
    argv: tuple[str, ...],
    exit_code: int | None,
    vault_id: str,
    lossless: bool = False,
    keep: Sequence[Pattern] = (),
) -> Applied:
    """The compressed output of ``rule`` on ``output``, with the engine's rules enforced."""
    originals, trailing = split_output(output)
    n = len(originals)
    failed = is_failure(exit_code, output)
    return _apply(
        rule,
        [Line(text, (i, i)) for i, text in enumerate(originals, 1)],
        _Known(originals),
        total=n,
        trailing=trailing,
        failed=failed,
        command=command,
        argv=argv,
        exit_code=exit_code,
        vault_id=vault_id,
        lossless=lossless,
        keep=keep,
    )


def apply_rule_window(
    rule: CompiledRule,
    window: Window,
    *,
    command: str,
    argv: tuple[str, ...],
    exit_code: int | None,
    vault_id: str,
    lossless: bool = False,
    keep: Sequence[Pattern] = (),
) -> Applied:
    """:func:`apply_rule` for an output of which only ``window`` is held."""
    failed = is_failure(exit_code, window.tail)
    return _apply(
        rule,
        [Line(text, (i, i)) for i, text in window.lines],
        _Sparse(window.lines, window.middle),
        total=window.total,
        trailing=window.trailing,
        failed=failed,
        command=command,
        argv=argv,
        exit_code=exit_code,
        vault_id=vault_id,
        lossless=lossless,
        keep=keep,
    )


class _Known:
    """Every line of the output (the ordinary case)."""

    lost: Sequence[int] = ()

    def __init__(self, originals: list[str]) -> None:
        self.originals = originals

    def text(self, line_no: int) -> str | None:
        return self.originals[line_no - 1]

    def numbered(self) -> tuple[list[int] | None, list[str]]:
        return None, self.originals


class _Sparse:
    """Some lines of an output held only in part; the others are unknown (None). The lines
    of the middle (``Window.middle``) are asked for when first needed: after the steps."""

    def __init__(
        self, lines: Sequence[tuple[int, str]], middle: Callable[[], tuple[Mapping[int, str], Sequence[int]]]
    ) -> None:
        self._lines = lines
        self._middle = middle
        self._known: dict[int, str] | None = None
        self._lost: Sequence[int] = ()

    @property
    def known(self) -> dict[int, str]:
        if self._known is None:
            extra, self._lost = self._middle()
            known = dict(self._lines)
            known.update(extra)
            self._known = known
        return self._known

    @property
    def lost(self) -> Sequence[int]:
        _ = self.known
        return self._lost

    def text(self, line_no: int) -> str | None:
        return self.known.get(line_no)

    def numbered(self) -> tuple[list[int] | None, list[str]]:
        known = self.known
        numbers = sorted(known)
        return numbers, [known[i] for i in numbers]


def _apply(
    rule: CompiledRule,
    lines: list[Line],
    source: _Known | _Sparse,
    *,
    total: int,
    trailing: bool,
    failed: bool,
    command: str,
    argv: tuple[str, ...],
    exit_code: int | None,
    vault_id: str,
    lossless: bool,
    keep: Sequence[Pattern],
) -> Applied:
    n = total
    run = RunInfo(command, argv, exit_code, failed, n)
    items = _run_steps(rule, list(lines), run)

    shown = bytearray(n + 2)
    for item in items:
        if isinstance(item, Line):
            for a, b in item.ranges() if item.also else (item.src,):
                if not 1 <= a <= b <= n:
                    raise CompressorError(f"compressor '{rule.id}': a line claims original lines {a}-{b} of {n}")
                shown[a : b + 1] = b"\x01" * (b - a + 1)

    placer = _Placer(items)
    inserts: list[tuple[int, float, str]] = []
    numbers, texts = source.numbered()

    def put_back(line_no: int, verbatim: bool) -> bool:
        text = source.text(line_no)
        if text is None:  # a line of the middle of an output held in part: it stays elided
            return False
        if not verbatim:
            text = without_escapes(text)
        inserts.append((placer.position(line_no), line_no, Line(text, (line_no, line_no))))
        shown[line_no] = 1
        return True

    if lossless or rule.lossless:
        for line_no in range(1, n + 1):
            if not shown[line_no]:
                put_back(line_no, verbatim=True)
    else:
        if failed:
            for line_no in range(max(1, n - rule.failure_tail + 1), n + 1):
                if not shown[line_no]:
                    put_back(line_no, verbatim=False)
        if keep:
            # The line that reports the exit code (the pack's tools.exit_code patterns) stays:
            # whoever reads the result later must still see how the command ended.
            found = candidate_lines(keep, texts)
            for i in range(len(texts)) if found is None else found:
                line_no = numbers[i] if numbers else i + 1
                if not shown[line_no] and any(p.search(texts[i]) for p in keep):
                    put_back(line_no, verbatim=False)

    # Failure lines survive every budget: put back what the steps dropped, in the rule's
    # priority order, until the rule's cap; the markers name the ones beyond it.
    hidden_failures: list[int] = []
    if rule.failures:
        hits = failure_lines(rule.failures, texts, numbers, n)
        room = rule.failures_max  # lines put back; the ones the steps kept are free
        for line_no in hits:
            if shown[line_no]:
                continue
            if room > 0 and put_back(line_no, verbatim=False):
                room -= 1
            else:
                hidden_failures.append(line_no)
        hidden_failures.extend(line_no for line_no in source.lost if not shown[line_no])
        hidden_failures.sort()

    elided = n - shown.count(1, 1, n + 1)
    runs = [r for r in _missing_runs(shown, n) if _has_text(source, r[0], r[1])]
    runs = _coalesce(runs, rule.max_markers)
    for first, last, count in runs:
        inside = bisect.bisect_right(hidden_failures, last) - bisect.bisect_left(hidden_failures, first)
        extra = {"failures": inside} if inside else {}
        marker = format_marker("lines", count, vault_id, lines=(first, last), **extra)
        inserts.append((placer.position(first), first - 0.5, marker))
    final = _insert(items, inserts)
    text = "\n".join(final) + ("\n" if trailing and final else "")
    return Applied(
        text=text,
        lines_before=n,
        lines_after=len(final),
        elided=elided,
        markers=len(runs),
        failed=failed,
    )


def _missing_runs(shown: bytearray, n: int) -> list[list[int]]:
    """``[first, last, count]`` of each run of lines no output line stands for (found with
    ``bytearray.find``: an output of millions of lines needs no list of their numbers)."""
    runs: list[list[int]] = []
    pos, end = 1, n + 1
    while pos < end:
        first = shown.find(0, pos, end)
        if first == -1:
            break
        after = shown.find(1, first, end)
        if after == -1:
            after = end
        runs.append([first, after - 1, after - first])
        pos = after
    return runs


def _has_text(source: _Known | _Sparse, first: int, last: int) -> bool:
    """Whether lines ``first``..``last`` hold more than blank lines (which need no marker); a
    line whose text is not held counts as text."""
    for line_no in range(first, last + 1):
        text = source.text(line_no)
        if text is None or text.strip():
            return True
    return False
