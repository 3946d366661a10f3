"""Head + tail of a text, with a marker line for the lines in between.

The vault holds the whole original text; every marker written here points into it with a
``#L<a>-L<b>`` range (1-based, inclusive, lines as :func:`ctxrules.vault.split_lines` counts
them), so the lines that were cut come back byte-identical through ``vault get --lines a:b``.
A line that is too long to show whole is clipped and followed by a marker for that one line.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import overload

from ctxrules.vault import format_marker

__all__ = ["Count", "LineIndex", "LineReduction", "line_count", "lines_of", "reduce_lines", "text_lines"]

Count = Callable[[str], int]
"""Tokens of a string (the session's tokenizer)."""

_MIN_LINE_CHARS = 80
# Tightening rounds when the first layout still counts over budget (the chars-per-token ratio
# of the kept lines differs from the whole text's).
_ROUNDS = 6


@dataclass(frozen=True)
class LineReduction:
    """A head/tail layout: the new text, how many lines were cut and how many were clipped."""

    text: str
    lines_total: int
    lines_elided: int
    lines_clipped: int
    ranges: tuple[tuple[int, int], ...]


def text_lines(text: str) -> list[str]:
    """``text`` split after each ``\\n`` (terminators kept), exactly as the vault counts lines."""
    if not text:
        return []
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


LARGE_CHARS = 1 << 20
"""Texts longer than this are split by :class:`LineIndex` (offsets), not into strings."""


class LineIndex(Sequence[str]):
    """The lines of ``text`` exactly as :func:`text_lines` gives them, cut out when asked for:
    a 50 MB text's half a million lines are an array of offsets, not half a million strings."""

    def __init__(self, text: str) -> None:
        self._text = text
        ends = array("q")
        find = text.find
        pos = find("\n")
        while pos != -1:
            ends.append(pos + 1)
            pos = find("\n", pos + 1)
        if text and (not ends or ends[-1] != len(text)):
            ends.append(len(text))
        self._ends = ends

    def __len__(self) -> int:
        return len(self._ends)

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> list[str]: ...
    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self._ends)
        if not 0 <= index < len(self._ends):
            raise IndexError(index)
        start = self._ends[index - 1] if index else 0
        return self._text[start : self._ends[index]]


def lines_of(text: str) -> Sequence[str]:
    """:func:`text_lines`, or for a long text the same lines as a :class:`LineIndex`."""
    return LineIndex(text) if len(text) > LARGE_CHARS else text_lines(text)


def line_count(text: str) -> int:
    """``len(text_lines(text))`` without splitting."""
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


def reduce_lines(
    text: str,
    *,
    vault_id: str,
    budget_tokens: int,
    count: Count,
    head_share: float = 0.6,
    keep_first: int = 0,
    marker_fields: dict[str, object] | None = None,
    tokens: int | None = None,
) -> LineReduction | None:
    """Keep the first and last lines of ``text`` within ``budget_tokens``.

    ``keep_first`` lines (a CSV header) are always kept. ``marker_fields`` are added to the
    marker of the elided middle. Returns ``None`` when the text already fits the budget.
    """
    lines = lines_of(text)
    if not lines:
        return None
    total_tokens = count(text) if tokens is None else tokens
    if total_tokens <= budget_tokens:
        return None
    chars_per_token = max(1.0, len(text) / max(1, total_tokens))
    chars = max(_MIN_LINE_CHARS * 2, int(budget_tokens * chars_per_token))
    best: LineReduction | None = None
    smallest: LineReduction | None = None
    for _ in range(_ROUNDS):
        layout = _layout(lines, vault_id, chars, chars_per_token, head_share, keep_first, marker_fields or {})
        used = max(1, count(layout.text))
        if used <= budget_tokens:
            if best is None or len(layout.text) > len(best.text):
                best = layout
            shows_all = layout.lines_elided == 0 and not layout.lines_clipped
            if used >= budget_tokens * 0.85 or shows_all:
                break  # close enough to the budget, or nothing left to grow into
        elif smallest is None or len(layout.text) < len(smallest.text):
            smallest = layout
        # The kept lines' chars-per-token ratio differs from the whole text's: rescale.
        scaled = int(chars * budget_tokens / used * 0.95)
        if scaled == chars or (scaled <= _MIN_LINE_CHARS * 2 and used > budget_tokens):
            break
        chars = max(_MIN_LINE_CHARS * 2, scaled)
    if best is None:
        best = smallest
    return best


def _layout(
    lines: Sequence[str],
    vault_id: str,
    chars: int,
    ratio: float,
    head_share: float,
    keep_first: int,
    fields: dict[str, object],
) -> LineReduction:
    n = len(lines)
    if n == 1:
        return _single_line(lines[0], vault_id, chars, ratio, head_share)
    head_budget = int(chars * head_share)
    tail_budget = chars - head_budget
    # A long line is clipped to a share of the budget, so one line cannot eat all of it.
    clip = max(_MIN_LINE_CHARS, chars // 4)
    head: list[int] = []
    used = 0
    for i in range(n):
        cost = min(len(lines[i]), clip)
        if head and i >= keep_first and used + cost > head_budget:
            break
        head.append(i)
        used += cost
    tail: list[int] = []
    used = 0
    # The last line is always shown (clipped if need be): errors and summaries end a log.
    for i in range(n - 1, head[-1], -1):
        cost = min(len(lines[i]), clip)
        if tail and used + cost > tail_budget:
            break
        tail.append(i)
        used += cost
    tail.reverse()
    out: list[str] = []
    clipped = 0
    for i in head:
        piece, was_clipped = _shown(lines[i], i + 1, vault_id, clip, ratio)
        out.append(piece)
        clipped += was_clipped
    first_cut = head[-1] + 2
    last_cut = tail[0] if tail else n
    ranges: list[tuple[int, int]] = []
    elided = 0
    if first_cut <= last_cut:
        elided = last_cut - first_cut + 1
        ranges.append((first_cut, last_cut))
        if out and not out[-1].endswith("\n"):
            out[-1] += "\n"
        marker = format_marker("lines", elided, vault_id, lines=(first_cut, last_cut), **fields)
        out.append(marker + "\n")
    for i in tail:
        piece, was_clipped = _shown(lines[i], i + 1, vault_id, clip, ratio)
        out.append(piece)
        clipped += was_clipped
    return LineReduction("".join(out), n, elided, clipped, tuple(ranges))


def _shown(line: str, number: int, vault_id: str, clip: int, ratio: float) -> tuple[str, int]:
    """The line as shown: whole, or its first ``clip`` chars and a marker for that line."""
    if len(line) <= clip:
        return line, 0
    body = line[:-1] if line.endswith("\n") else line
    rest = len(body) - clip
    marker = format_marker("tokens", max(1, round(rest / ratio)), vault_id, lines=(number, number), chars=rest)
    return f"{body[:clip]}… {marker}" + ("\n" if line.endswith("\n") else ""), 1


def _single_line(line: str, vault_id: str, chars: int, ratio: float, head_share: float) -> LineReduction:
    """One huge line (minified data, a base64 blob): its start and end around a marker."""
    head = max(1, int(chars * head_share))
    tail = max(0, chars - head)
    body = line[:-1] if line.endswith("\n") else line
    if head + tail >= len(body):
        return LineReduction(line, 1, 0, 0, ())
    cut = len(body) - head - tail
    marker = format_marker("tokens", max(1, round(cut / ratio)), vault_id, lines=(1, 1), chars=cut)
    text = f"{body[:head]}\n{marker}\n{body[len(body) - tail :] if tail else ''}"
    return LineReduction(text, 1, 0, 1, ())
