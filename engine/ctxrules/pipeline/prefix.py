"""Recognizing an append-only history, so the next turn reuses the last compaction.

The caller passes the full history on every call. When the new history starts with the one the
session saw last, the pipeline runs on *the previous output* plus the appended messages: the
compaction is not redone, and the prefix the provider caches stays byte-identical. Invariant 4
(the pipeline changes nothing on its own output) makes this equal to a fresh run's decisions.

Within one process the session compares the new history with its own copy of the last one;
across processes (``ctxrules run`` twice on one session) it compares a chained digest of the
first messages with the one stored in ``state.json`` (:class:`HistoryChain`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from ctxrules.messages import message_digest


class HistoryChain:
    """One digest for a whole history, extended message by message.

    ``state.json`` keeps this (and the message count) instead of one digest per message, so
    the file stays small however long the session grows; a process that picks the session up
    recomputes the chain over the first ``count`` messages it is given and compares one value.
    """

    __slots__ = ("_hash", "count")

    def __init__(self) -> None:
        self._hash = hashlib.sha256(b"ctxrules.history.v1")
        self.count = 0

    def extended(self, messages: Iterable[Mapping[str, Any]]) -> HistoryChain:
        """A new chain over this history plus ``messages`` (this one is left as it is)."""
        out = HistoryChain.__new__(HistoryChain)
        out._hash, out.count = self._hash.copy(), self.count
        for message in messages:
            out._hash.update(message_digest(message).encode("ascii"))
            out.count += 1
        return out

    @property
    def value(self) -> str:
        return self._hash.hexdigest()
