"""Delimited tables (CSV, TSV, ``;`` or ``|`` separated): the header and the first/last rows.

A text is a table when nearly every physical line of a sample has the same number of fields
(at least two) for one delimiter; a record spanning lines (a quoted newline) makes it a plain
text, so that every kept or cut span is whole lines and its ``#L`` range is exact.
"""

from __future__ import annotations

import csv
from collections import Counter
from dataclasses import dataclass

from ctxrules.stages.reduce.text_lines import Count, LineReduction, lines_of, reduce_lines

__all__ = ["Table", "detect_table", "reduce_table"]

DELIMITERS = (",", "\t", ";", "|")
_MIN_LINES = 5
_SAMPLE = 60
_AGREEMENT = 0.9


@dataclass(frozen=True)
class Table:
    delimiter: str
    columns: int
    rows: int


def _fields(line: str, delimiter: str) -> int:
    try:
        return len(next(csv.reader([line], delimiter=delimiter, strict=True)))
    except (csv.Error, StopIteration):
        return -1


def detect_table(text: str) -> Table | None:
    """The table shape of ``text``, or ``None`` when it is not a delimited table."""
    every = lines_of(text)  # a long text's lines are cut out only for the sample
    n = len(every)
    while n and not every[n - 1].strip():
        n -= 1
    if n < _MIN_LINES:
        return None
    half = _SAMPLE // 2
    picked = range(n) if n <= _SAMPLE else [*range(half), *range(n - half, n)]
    sample = [every[i].rstrip("\r\n") for i in picked]
    for delimiter in DELIMITERS:
        if not any(delimiter in line for line in sample[:3]):
            continue
        counts = Counter(_fields(line, delimiter) for line in sample)
        columns, agreeing = counts.most_common(1)[0]
        if columns >= 2 and agreeing >= _AGREEMENT * len(sample):
            return Table(delimiter, columns, n - 1)
    return None


def reduce_table(
    text: str,
    table: Table,
    *,
    vault_id: str,
    budget_tokens: int,
    count: Count,
    head_share: float,
    tokens: int | None = None,
) -> LineReduction | None:
    """Header, first rows and last rows; the rows between go behind a ``#L`` marker."""
    return reduce_lines(
        text,
        vault_id=vault_id,
        budget_tokens=budget_tokens,
        count=count,
        head_share=head_share,
        keep_first=1,
        marker_fields={"format": "csv", "rows": table.rows, "columns": table.columns},
        tokens=tokens,
    )
