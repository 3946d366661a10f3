"""What one call of a replay shares with the call before: the same objects at the same places.

Each call of a replay sends its last output plus a step, so the parts of eval that work per
call (the cache's blocks, the context's texts, the token counts) take what they made for the
shared prefix from the call before, and only do their work for the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress, count
from operator import ne

from ctxrules.structure import replaced

__all__ = ["same_values", "shared_prefix"]


def shared_prefix(old: Sequence[object], new: Sequence[object]) -> int:
    """How many leading items of ``new`` are the very objects of ``old``, at the same places.

    Found at C speed (:func:`ctxrules.structure.replaced`, no Python step per item): each call
    of a replay shares all but its last few messages with the call before, and a Python loop
    over that shared prefix on every call made a replay of N messages take N²/4 Python steps (a
    5,000 message transcript spent most of its 20 s there)."""
    return next(replaced(old, new), min(len(old), len(new)))


def same_values(old: Sequence[object], new: Sequence[object], limit: int) -> int:
    """How many of the first ``limit`` items of ``new`` equal those of ``old`` (token counts);
    all of them, the usual answer, is found by one list comparison."""
    if list(old[:limit]) == list(new[:limit]):
        return min(limit, len(old), len(new))
    return min(limit, next(compress(count(), map(ne, old, new)), min(len(old), len(new))))
