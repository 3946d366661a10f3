"""Thin layers that put ``Session.prepare`` where agents already run (docs/integrations.md).

Each module imports its framework lazily and, when that is missing, raises an ImportError that
names the extra to install. They map the framework's notion of a session to a ctxrules
session and own no behaviour: the pack decides what happens to the context.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

from ctxrules.threads import ForkSafeLock

__all__ = ["OpenSessions", "session_name"]

_S = TypeVar("_S")

_PLAIN_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")


# Names a store keeps beside its sessions (a filesystem root's vault/, ledger/, router/ and
# keys/ folders and its injection.key; the shared vault of stateless calls). Compared in lower
# case: a filesystem that ignores case would make "Vault" the vault too. A session named
# injection.key took the key file's place: every session of the root failed on the key after.
# (the key file's name is ctxrules.injected.KEY_FILE, which imports the store that imports this)
_STORE_NAMES = frozenset({"vault", "ledger", "router", "keys", "stateless", "injection.key"})


def session_name(raw: str) -> str:
    """A session directory name for an id taken from a request: the id itself when it matches
    ``[A-Za-z0-9._-]{1,128}``, does not start with a dot (hidden, and the store's scratch
    space) and is none of the store's own names (``vault``, ``ledger``, ``router``, ``keys``,
    ``stateless``, ``injection.key``, in any case); else its sha256 hex."""
    if _PLAIN_ID.fullmatch(raw) and not raw.startswith(".") and raw.lower() not in _STORE_NAMES:
        return raw
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()


class _Opening:
    """A session being opened by one thread, which the others asking for it wait on. ``pid``:
    the process of that thread; a forked child has the parent's openings but not their threads,
    and opens the session itself instead of waiting for an opening that never ends there."""

    __slots__ = ("done", "error", "pid", "value")

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.done = threading.Event()
        self.value: object = None
        self.error: BaseException | None = None


class OpenSessions(Generic[_S]):
    """The sessions an integration keeps open, at most ``limit`` of them: the least recently
    used one is let go when another opens (it reopens from its store, warm, on its next call).
    A long-lived server sees an unbounded number of conversations; each open session holds its
    last output in memory and its lock file open, so the set must be bounded.

    A session is opened outside the set's lock: opening asks the store (a Redis that is slow or
    gone takes up to its socket timeout), and the calls of sessions already open must not wait
    for it. Threads asking for the session being opened wait for that one opening."""

    def __init__(self, limit: int) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"max_sessions must be a whole number of at least 1, got {limit!r}")
        self.limit = limit
        self._open: OrderedDict[str, _S] = OrderedDict()
        self._opening: dict[str, _Opening] = {}
        self._lock = ForkSafeLock()

    def get(self, key: str, opener: Callable[[], _S]) -> _S:
        """The open session ``key``, opened with ``opener()`` when it is not open."""
        with self._lock:
            session = self._open.get(key)
            if session is not None:
                self._open.move_to_end(key)
                return session
            opening = self._opening.get(key)
            if opening is not None and opening.pid != os.getpid():
                opening = None  # begun in the process this one was forked from (see _Opening)
            mine = opening is None
            if opening is None:
                opening = self._opening[key] = _Opening()
        if not mine:
            opening.done.wait()
            if opening.error is not None:
                raise opening.error
            return opening.value  # type: ignore[return-value]
        try:
            session = opener()
        except BaseException as exc:
            with self._lock:
                del self._opening[key]
            opening.error = exc
            opening.done.set()
            raise
        with self._lock:
            del self._opening[key]
            self._open[key] = session
            while len(self._open) > self.limit:
                self._open.popitem(last=False)
        opening.value = session
        opening.done.set()
        return session

    def __len__(self) -> int:
        return len(self._open)

    def __contains__(self, key: object) -> bool:
        return key in self._open
