"""Carry-over of per-message work from one message list to the next that extends it.

A warm turn hands the stages the last turn's list with a few messages appended. A stage that
walks every message (to find matches, say) can keep what it found per index and, on a list
that holds the same message objects up front, walk only the new ones::

    carry = Carry()                       # one per stage instance
    start, found = carry.resume(ctx.session_id, messages, key)
    found = dict(found or {})             # never change what was carried: copy it
    for i in range(start, len(messages)):
        ...
    carry.keep(ctx.session_id, messages, key, found)

The carried value is used only when ``key`` (what the work depended on besides the messages:
options, search terms) is equal, the injection key is the same, no message was edited in place
since (:func:`ctxrules.structure.forget` changes the generation) and every message of the old
list is at the same position of the new one: the same object, or an equal one (what a stage
carries depends on the messages' content). Otherwise ``resume`` returns ``(0, None)``.

The last condition is asked of the lists' shapes (:meth:`ctxrules.structure.Shape.extends`):
:func:`ctxrules.structure.shape` compared the new list with the last one once, when it derived
the new shape, so a carry resumes without a pass over the messages of its own.

A stage may also pass ``alike(old, new)``: whether it derives the same from two messages. Then
a few old messages replaced by other objects it finds alike do not stop the carry. A warm turn
gets the last turn's *output* back, and the stages after this one changed some messages in form
only (``cache.markers`` puts its breakpoints on the newest messages, making a string content a
text part with ``cache_control``): without it, such a stage would start over on every turn.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Generic, NamedTuple, TypeVar

from ctxrules.injected import current_key
from ctxrules.structure import Shape, generation, replaced, shape

__all__ = ["Carry", "PerSession"]

T = TypeVar("T")


class _Kept(NamedTuple, Generic[T]):
    shape: Shape
    key: Hashable
    injection: Any
    generation: int
    value: T


class Carry(Generic[T]):
    """What one stage computed on the last list of each session (see the module docstring)."""

    def __init__(self, sessions: int = 16) -> None:
        self._kept: dict[str, _Kept[T]] = {}
        self._sessions = sessions
        self._lock = threading.Lock()

    def resume(
        self,
        session: str,
        messages: Sequence[Mapping[str, Any]],
        key: Hashable,
        alike: Callable[[Mapping[str, Any], Mapping[str, Any]], bool] | None = None,
    ) -> tuple[int, T | None]:
        """``(m, value)`` when ``value`` was kept for ``messages[:m]`` under ``key``; else
        ``(0, None)``. With ``alike``, up to :data:`ALIKE_EDITS` of the old messages may be
        other objects for which ``alike(old, new)`` holds (see the module docstring)."""
        with self._lock:
            kept = self._kept.get(session)
        if kept is None or kept.generation != generation() or kept.injection is not current_key() or kept.key != key:
            return 0, None
        start = shape(messages).extends(kept.shape)
        if start is None and alike is not None:
            start = _alike_prefix(kept.shape, messages, alike)
        if start is None:
            return 0, None
        return start, kept.value

    def keep(self, session: str, messages: Sequence[Mapping[str, Any]], key: Hashable, value: T) -> None:
        """Remember ``value`` as computed on ``messages`` under ``key`` (the caller must not
        change ``value`` afterwards: the next turn starts from it)."""
        kept = _Kept(shape(messages), key, current_key(), generation(), value)
        with self._lock:
            self._kept.pop(session, None)
            self._kept[session] = kept
            while len(self._kept) > self._sessions:  # the least recently kept session goes
                del self._kept[next(iter(self._kept))]


ALIKE_EDITS = 8
"""Most old messages replaced by alike ones that a carry resumes over (more: it starts over)."""


def _alike_prefix(
    old: Shape,
    messages: Sequence[Mapping[str, Any]],
    alike: Callable[[Mapping[str, Any], Mapping[str, Any]], bool],
) -> int | None:
    """``len(old.facts)`` when ``messages`` starts with the messages ``old`` was made from, each
    the same object or, at most :data:`ALIKE_EDITS` of them, one ``alike`` finds alike; None
    otherwise. The positions come from one identity pass in C (:func:`ctxrules.structure.replaced`)."""
    snapshot = old.snapshot
    if snapshot is None or len(messages) < len(snapshot):
        return None
    changed = list(itertools.islice(replaced(snapshot, messages), ALIKE_EDITS + 1))
    if len(changed) > ALIKE_EDITS or not all(alike(snapshot[i], messages[i]) for i in changed):
        return None
    return len(snapshot)


class PerSession(Generic[T]):
    """One value per session, for a stage's memo of its last call that checks itself (the
    stage compares the kept message objects with the new ones before it uses anything).

    A memo on the stage instance serves every session of its engine: two sessions taking
    turns (one proxy, many agents) would each find the other's list there and start over.
    Kept here, each session finds its own. The least recently stored session goes first."""

    def __init__(self, sessions: int = 16) -> None:
        self._values: dict[str, T] = {}
        self._sessions = sessions
        self._lock = threading.Lock()

    def get(self, session: str) -> T | None:
        with self._lock:
            return self._values.get(session)

    def pop(self, session: str) -> T | None:
        """Take the session's value out (a stage about to extend it in place: should the stage
        fail before it puts the value back, the next call starts over instead of resuming
        from a half-changed one)."""
        with self._lock:
            return self._values.pop(session, None)

    def put(self, session: str, value: T) -> None:
        with self._lock:
            self._values.pop(session, None)
            self._values[session] = value
            while len(self._values) > self._sessions:
                del self._values[next(iter(self._values))]

    def clear(self) -> None:
        with self._lock:
            self._values.clear()
