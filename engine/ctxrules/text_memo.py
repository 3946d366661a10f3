"""Values computed from a text, remembered across turns without holding the texts.

Stages ask again on every turn what a message's text gives (its terms, its duplicate digest);
a caller that decodes its history from JSON per call passes new string objects each time, so
these memos are keyed by the text, not by the object. Keyed by the text itself (an
``lru_cache``), a memo of 4,096 entries held 4,096 whole tool outputs for the life of the
process: megabytes each, in an agent that runs for days. A :class:`TextMemo` keys a long text
by its sha256 instead (hashing costs a fraction of what the memo saves), and holds short ones
as they are.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable
from typing import Final, Generic, TypeVar

__all__ = ["SHORT_TEXT", "TextMemo"]

SHORT_TEXT: Final = 4096
"""Texts up to this many characters are keys themselves; longer ones are keyed by their sha256."""

V = TypeVar("V")


class TextMemo(Generic[V]):
    """At most ``limit`` values, each under its text (or the text's digest) and ``extra`` (the
    other arguments the value depends on). Emptied when full, as the per-object memos are; a
    plain dict, so threads that compute one value at once store the same one."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._values: dict[tuple[str | bytes, Hashable], V] = {}

    def get(self, text: str, extra: Hashable, compute: Callable[[str], V]) -> V:
        key: str | bytes = text
        if len(text) > SHORT_TEXT:
            key = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
        values = self._values
        found = values.get((key, extra), _MISSING)
        if found is not _MISSING:
            return found  # type: ignore[return-value]
        value = compute(text)
        if len(values) >= self._limit:
            values.clear()
        values[(key, extra)] = value
        return value

    def clear(self) -> None:
        self._values.clear()


_MISSING: Final = object()
