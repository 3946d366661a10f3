"""The values compressor actions work on: output lines that remember where they came from.

An action is ``lines -> lines`` (see :mod:`ctxrules.hookspecs`). To let the engine, not each
action, keep the truthfulness rules, every line of the original output enters the first step
as a :class:`Line`: a ``str`` that also carries ``src``, the 1-based, inclusive range of
original lines it stands for. An action that keeps a line returns the same object; one that
rewrites a line returns ``line.derive(new_text)`` (same ``src``); one that folds identical
lines into one returns a line whose ``src`` spans them; one that gathers lines from several
places onto one line gives the other ranges in ``also``. A plain ``str`` is a line the action
made up (a header, a summary): it stands for no original line.

Whatever original line no output line stands for has been *elided*: the engine writes the
vault marker for it. Actions never write markers themselves.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ctxrules.compressors.terminal import ESCAPES, without_escapes

__all__ = ["ESCAPES", "Line", "Lines", "RunInfo", "source_range", "without_escapes"]


class Line(str):
    """An output line (without its ``\\n``) and the original lines it stands for.

    ``src`` is ``(first, last)``, 1-based and inclusive, as in a marker's ``#L<a>-L<b>``.
    """

    src: tuple[int, int]
    also: tuple[tuple[int, int], ...]
    """Further ranges the line stands for, away from ``src`` (a directory's names gathered on
    one line from wherever they were); empty for almost every line."""

    def __new__(cls, text: str, src: tuple[int, int], also: tuple[tuple[int, int], ...] = ()) -> Line:
        obj = super().__new__(cls, text)
        obj.src = src
        obj.also = also
        return obj

    def derive(self, text: str) -> Line:
        """A rewritten version of this line that stands for the same original lines."""
        return Line(text, self.src, self.also)

    def ranges(self) -> tuple[tuple[int, int], ...]:
        """Every original range the line stands for, ``src`` first."""
        return (self.src, *self.also)

    def __reduce__(self) -> tuple[object, ...]:
        # str subclasses pickle as plain str otherwise; keep src (multiprocessing, caches).
        return (Line, (str(self), self.src, self.also))


def source_range(line: str) -> tuple[int, int] | None:
    """The original lines ``line`` stands for, or None for a line an action made up."""
    return line.src if isinstance(line, Line) else None


@dataclass(frozen=True)
class RunInfo:
    """What an action may know about the run besides the lines.

    ``failed`` is the engine's verdict (non-zero exit code, or an unknown one with
    failure-looking output); actions that summarize (``short_circuit``) must not when it holds.
    """

    command: str
    argv: tuple[str, ...]
    exit_code: int | None
    failed: bool
    total_lines: int


class Lines(list[str]):
    """The list an action receives: the current lines plus :class:`RunInfo` as ``run``."""

    run: RunInfo

    def __init__(self, items: Iterable[str], run: RunInfo) -> None:
        super().__init__(items)
        self.run = run
