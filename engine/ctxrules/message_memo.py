"""Values computed from a message, remembered per message object across turns.

A warm turn hands the stages the last output plus the new messages: the same message objects,
turn after turn. What a stage reads from a message's text (its terms, whether it reports a
failure, its duplicate digest) is then the same as last turn, and asking a memo keyed by the
text (:class:`ctxrules.text_memo.TextMemo`) would join a text made of parts and hash a long one
again on every turn. A :class:`MessageMemo` answers from the object instead.

An entry holds the message and its ``content`` object, so a message given a new content is read
again. A message whose content was changed *inside* (a list of parts edited in place) is the same
objects: the session notices such edits between calls and calls
:func:`ctxrules.structure.forget`, whose :func:`~ctxrules.structure.generation` every entry
records; the next entry after a forget empties the memo (its entries would never match again,
and would hold the messages of every cold turn of a long-lived process until the limit). A memo
also empties once its entries keep :data:`TEXT_CHARS` characters of content alive: the messages a
compaction replaced are held by nobody else, and 4,096 of them may be large tool outputs.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import Any, Final, Generic, TypeVar

from ctxrules.messages import message_text
from ctxrules.structure import generation

__all__ = ["TEXT_CHARS", "MessageMemo"]

TEXT_CHARS: Final = 1 << 25
"""Characters of message content one memo may keep alive (as the token counter's memos)."""

V = TypeVar("V")


class MessageMemo(Generic[V]):
    """At most ``limit`` values, each under a message object and ``extra`` (what else the value
    depends on: compared with ``==``)."""

    __slots__ = ("_chars", "_limit", "_values")

    def __init__(self, limit: int = 4096) -> None:
        self._limit = limit
        self._chars = 0  # characters of content the entries keep alive
        # id(message) -> (message, its content, generation, extra, value)
        self._values: dict[int, tuple[Mapping[str, Any], Any, int, Hashable, V]] = {}

    def get(self, msg: Mapping[str, Any], extra: Hashable, compute: Callable[[Mapping[str, Any]], V]) -> V:
        values = self._values
        hit = values.get(id(msg))
        content, gen = msg.get("content"), generation()
        if hit is not None and hit[0] is msg and hit[1] is content and hit[2] == gen:
            known = hit[3]
            if known is extra or known == extra:
                return hit[4]
        value = compute(msg)
        chars = len(content) if isinstance(content, str) else len(message_text(msg))
        # All entries are of one generation: the first one tells whether they are stale.
        if values and (
            len(values) >= self._limit or self._chars + chars > TEXT_CHARS or next(iter(values.values()))[2] != gen
        ):
            self.clear()
        values[id(msg)] = (msg, content, gen, extra, value)
        self._chars += chars
        return value

    def clear(self) -> None:
        self._values.clear()
        self._chars = 0
