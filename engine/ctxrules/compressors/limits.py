"""The bounds every compressor rule keeps, whether or not ``ctxrules validate`` saw its pack.

A pack is data someone else may have written: its compressors must not make ``ctxrules
compress`` (or the ``tool_output.filter`` stage) allocate without limit or run for minutes. The
limits below are checked twice: by the action or rule when it is built (``ctxrules validate``
reports a breach as CR061 or CR014 at the option or step, without running anything), and, where
the size of what a step writes depends on the output, while the step runs (the step fails: the
output is kept as it was, with a warning, as for any step that fails).
"""

from __future__ import annotations

__all__ = [
    "FORMAT_WIDTH_MAX",
    "MAX_STEPS",
    "OUTPUT_GROWTH",
    "OUTPUT_SLACK",
    "TEMPLATE_MAX",
    "OptionError",
    "OutputTooLarge",
]

MAX_STEPS = 100
"""Steps one compressor may have (the built-in rules have at most 9): each step reads every
line, so 20,000 steps made a 2,000-line output take 12 s."""

TEMPLATE_MAX = 1_000
"""Characters of a text option that actions write out: a format string (``collapse_repeats``
``format``, ``group`` ``header``, ``carry`` ``with``, ``short_circuit`` ``message``), a
``replace`` replacement, ``group``'s ``indent``."""

FORMAT_WIDTH_MAX = 1_000
"""Largest width or precision in a format field (``{count:>5}``, ``{line:.80}``): a shell
output line needs a few dozen; ``{count:>9999999999}`` asked for a 10 GB string per line."""

OUTPUT_GROWTH = 8
OUTPUT_SLACK = 10_000
"""What one step of ``replace``, ``carry``, ``collapse_repeats``, ``group`` or
``short_circuit`` may write: :data:`OUTPUT_GROWTH` times the characters of its input (each
line counted with its newline) plus :data:`OUTPUT_SLACK`. Compressing makes output smaller (a
result that is not is dropped anyway); a replacement of ``\\1`` 300,000 times, a header's
name carried onto every line below it, or a message repeating a group that spans the output
would otherwise grow without bound."""


class OptionError(ValueError):
    """An option an action refuses when it is built; ``option`` names it, so that ``ctxrules
    validate`` reports the problem at that option (CR061)."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option


class OutputTooLarge(ValueError):
    """A step would write more than its input allows (:data:`OUTPUT_GROWTH`); raised before
    the text is built. The step fails, and with it the compression of that output."""
