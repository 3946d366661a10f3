"""Append-only JSONL ledgers of model calls, safe under concurrent writers.

Where they live (docs/reference/concepts.md "session"):

- ``<session>/ledger.jsonl``: the calls of one session;
- ``<state>/ledger/days/<YYYY-MM-DD>.jsonl``: every call of that UTC date, across sessions (a
  budget day in another time zone reads the one or two files that cover it);
- ``<state>/ledger/goals/<goal>.jsonl``: every call made for a goal, across sessions and days.

One JSON object per line: ``{"type": "call", ...}`` for a call (see :func:`call_record`) or
``{"type": "reset", ...}`` for a budget reset (``ctxrules usage reset``): totals count only the
calls after the last reset, and the history stays in the file.

**Concurrency.** A writer appends one whole line under an exclusive lock (``<ledger>.lock``) and
fsyncs it (the ledger is money: it must survive a crash). If a crashed writer left a partial
last line, the next writer ends it first, so the damage stays one unreadable line that readers
count and skip. Readers take no lock: they consume complete lines only, and remember how far
they read, so a process that asks again reads only what was appended since.
"""

from __future__ import annotations

import contextvars
import functools
import json
import math
import os
import re
import time
import uuid
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from ctxrules.budget.pricing import Cost, Rates
from ctxrules.budget.usage import MAX_TOKENS, TOKEN_KINDS, TokenUsage
from ctxrules.errors import UsageError
from ctxrules.stores.base import Log, LogKind
from ctxrules.stores.filesystem import FilesystemStore
from ctxrules.threads import ForkSafeLock

if TYPE_CHECKING:
    from ctxrules.stores.base import Store

__all__ = [
    "CallEntry",
    "LedgerFile",
    "Totals",
    "call_record",
    "check_goal",
    "day_ledger_path",
    "goal_ledger_path",
    "ledger",
    "ledger_files_between",
    "ledger_of",
    "one_read",
    "reset_record",
    "session_ledger_path",
]

RECORD_VERSION: Final = 1
_GOAL_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_COST_KEYS: Final = (
    "input",
    "cache_read",
    "cache_write",
    "output",
    "reasoning",
    "citation",
    "cache_savings",
)
# No call costs more than this (a thousand trillion USD, as MAX_TOKENS is a thousand trillion
# tokens): a cost above it comes from absurd prices, and sums of such costs would overflow to
# inf and make every report, JSON output and dashboard unusable.
MAX_USD: Final = 1e15


# --- paths ------------------------------------------------------------------------------------


def session_ledger_path(session_dir: Path) -> Path:
    return session_dir / "ledger.jsonl"


def day_ledger_path(state_root: Path, day: date) -> Path:
    return state_root / "ledger" / "days" / f"{day.isoformat()}.jsonl"


def check_goal(goal: str) -> str:
    """A goal name is also a file name: letters, digits, ``.``, ``_``, ``-`` (at most 128)."""
    if not isinstance(goal, str) or not _GOAL_RE.fullmatch(goal):
        raise UsageError(
            f"invalid goal name {goal!r}: use 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return goal


def goal_ledger_path(state_root: Path, goal: str) -> Path:
    return state_root / "ledger" / "goals" / f"{check_goal(goal)}.jsonl"


def ledger_files_between(state_root: Path, start: float, end: float) -> list[Path]:
    """The day ledgers (UTC dates) that can hold calls made in ``[start, end)``."""
    first = datetime.fromtimestamp(start, UTC).date()
    last = datetime.fromtimestamp(max(start, end - 1e-6), UTC).date()
    out = []
    d = first
    while d <= last:
        out.append(day_ledger_path(state_root, d))
        d += timedelta(days=1)
    return out


# --- records ----------------------------------------------------------------------------------


def call_record(
    *,
    usage: TokenUsage,
    cost: Cost | None,
    rates: Rates | None,
    model: str,
    session: str,
    root: str,
    goal: str | None,
    ts: float,
    source: str,
    tier: str | None = None,
    service_tier: str = "standard",
    call_id: str | None = None,
) -> dict[str, Any]:
    """The JSON object one call is recorded as (the same line goes to every ledger it counts in).

    Raises :class:`UsageError` for a cost that is not a finite number of at most
    :data:`MAX_USD` (in any component, or in all): readers would skip such a line as damaged."""
    if cost is not None and not all(abs(v) <= MAX_USD for v in (*cost.as_tuple(), cost.total)):
        where = f" at the prices of {rates.source}" if rates is not None else ""
        raise UsageError(
            f"this call would cost {cost.total!r} USD{where}, more than one call can cost "
            f"({MAX_USD:.0e} USD); check the prices"
        )
    return {
        "v": RECORD_VERSION,
        "type": "call",
        "id": call_id or uuid.uuid4().hex,
        "ts": ts,
        "session": session,
        "root": root,
        "goal": goal,
        "model": model,
        "tier": tier,
        "service_tier": service_tier,
        "source": source,
        "tokens": usage.as_dict(),
        "usd": None if cost is None else cost.as_dict(),
        "rates": None if rates is None else rates.source,
    }


def reset_record(*, ts: float, reason: str = "command") -> dict[str, Any]:
    return {"v": RECORD_VERSION, "type": "reset", "ts": ts, "reason": reason}


# The last second of 9999-12-31 UTC: ledgers are named by date, and no later date exists.
LAST_EPOCH = 253402300799.0


def _number(value: Any, what: str, key: str = "", limit: float = math.inf) -> int | float:
    """A finite number the ledger wrote, not below zero (``cache_savings`` may be: it is net)
    and not above ``limit`` (nor below ``-limit``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(what)
    try:
        number = float(value)
    except OverflowError:
        raise ValueError(what) from None
    if not math.isfinite(number) or abs(number) > limit:
        raise ValueError(what)
    if value < 0 and key != "cache_savings":
        raise ValueError(what)
    return value


@dataclass(frozen=True)
class CallEntry:
    """A call as read back from a ledger (the fields budgets and reports need)."""

    ts: float
    model: str
    session: str
    root: str
    tokens: TokenUsage
    cost: Cost | None
    tier: str | None
    call_id: str

    @classmethod
    def parse(cls, obj: dict[str, Any]) -> CallEntry:
        """Raises ValueError (a bad line) for what the writer never writes: a count or a price
        that is negative, not finite or not a number, a time that is not finite. A damaged
        line must not crash every budget check, nor silently lift a budget (a negative or NaN
        sum passes every limit) or trip one for good (an infinite one)."""
        tokens = obj["tokens"]
        usage = TokenUsage(*(int(_number(tokens.get(k, 0), "tokens", limit=MAX_TOKENS)) for k in TOKEN_KINDS))
        usd = obj.get("usd")
        cost = (
            None if usd is None else Cost(**{k: float(_number(usd.get(k, 0.0), "usd", k, MAX_USD)) for k in _COST_KEYS})
        )
        ts = float(_number(obj["ts"], "ts", limit=LAST_EPOCH))
        return cls(
            float(ts),
            str(obj.get("model", "")),
            str(obj.get("session", "")),
            str(obj.get("root", obj.get("session", ""))),
            usage,
            cost,
            obj.get("tier") if isinstance(obj.get("tier"), str) else None,
            str(obj.get("id", "")),
        )


@dataclass
class Totals:
    """Sums over calls: the seven token kinds, USD by component, and per-model figures."""

    calls: int = 0
    unpriced_calls: int = 0
    tokens: TokenUsage = field(default_factory=TokenUsage)
    cost: Cost = field(default_factory=Cost)
    first_ts: float | None = None
    last_ts: float | None = None
    by_model: dict[str, dict[str, float]] = field(default_factory=dict)

    @classmethod
    def of(cls, entries: Iterable[CallEntry]) -> Totals:
        """Sums over ``entries`` (a plain loop over numbers: this runs on every prepare)."""
        t = cls()
        tok = [0] * 7
        usd = [0.0] * 7
        first = last = None
        for e in entries:
            t.calls += 1
            for i, v in enumerate(e.tokens.as_tuple()):
                tok[i] += v
            if e.cost is None:
                t.unpriced_calls += 1
                call_usd = 0.0
            else:
                for i, f in enumerate(e.cost.as_tuple()):
                    usd[i] += f
                call_usd = e.cost.total
            first = e.ts if first is None or e.ts < first else first
            last = e.ts if last is None or e.ts > last else last
            m = t.by_model.get(e.model)
            if m is None:
                m = t.by_model[e.model] = {"calls": 0, "tokens": 0, "usd": 0.0}
            m["calls"] += 1
            m["tokens"] += e.tokens.total
            m["usd"] += call_usd
        t.tokens = TokenUsage(*tok)
        t.cost = Cost(*usd)
        t.first_ts, t.last_ts = first, last
        return t

    def add(self, e: CallEntry) -> None:
        self.calls += 1
        self.tokens = self.tokens + e.tokens
        if e.cost is None:
            self.unpriced_calls += 1
        else:
            self.cost = self.cost + e.cost
        self.first_ts = e.ts if self.first_ts is None else min(self.first_ts, e.ts)
        self.last_ts = e.ts if self.last_ts is None else max(self.last_ts, e.ts)
        m = self.by_model.setdefault(e.model, {"calls": 0, "tokens": 0, "usd": 0.0})
        m["calls"] += 1
        m["tokens"] += e.tokens.total
        m["usd"] += e.cost.total if e.cost is not None else 0.0

    @property
    def usd(self) -> float:
        return self.cost.total

    def as_dict(self) -> dict[str, Any]:
        # No calls (a session that never recorded usage, a turn without calls): every report
        # has two of these, and the zeros need no rounding each time.
        if (
            not self.calls
            and not self.by_model
            and self.first_ts is None
            and self.last_ts is None
            and not any(self.tokens.as_tuple())
            and not any(self.cost.as_tuple())
        ):
            return {k: dict(v) if isinstance(v, dict) else v for k, v in _empty_totals().items()}
        return self._as_dict()

    def _as_dict(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "unpriced_calls": self.unpriced_calls,
            "tokens": self.tokens.as_dict(),
            "usd": round(self.cost.total, 10),
            "usd_by_kind": {k: round(v, 10) for k, v in self.cost.as_dict().items()},
            "cache_savings_usd": round(self.cost.cache_savings, 10),
            "cache_savings_share": round(self.cost.savings_share, 6),
            "cache_hit_share": round(self.tokens.cache_hit_share, 6),
            "first_ts": self.first_ts,
            "last_ts": self.last_ts,
            "by_model": {
                k: {
                    "calls": int(v["calls"]),
                    "tokens": int(v["tokens"]),
                    "usd": round(v["usd"], 10),
                }
                for k, v in sorted(self.by_model.items())
            },
        }


@functools.cache
def _empty_totals() -> dict[str, Any]:
    """``Totals().as_dict()``, made once (callers get copies)."""
    return Totals()._as_dict()


# --- files ------------------------------------------------------------------------------------


class LedgerFile:
    """One append-only ledger (a :class:`ctxrules.stores.Log` in a store), with a read cache
    that only reads what was appended since. Thread-safe; safe across processes (module
    docstring)."""

    def __init__(self, store: Store | Path, log: Log | None = None) -> None:
        if isinstance(store, str | os.PathLike):
            store, log = _file_log(Path(store))
        elif log is None:
            raise TypeError("LedgerFile(store, log)")
        self.store = store
        self.log = log
        self._lock = ForkSafeLock()
        self._cursor: Any = None
        self._entries: list[CallEntry] = []
        self._resets: list[float] = []
        self._bad = 0
        # Moves whenever a refresh found something (records, a replaced or vanished file): a
        # budget status computed from the ledger holds while its ledgers' generations stay.
        self.generation = 0

    @property
    def path(self) -> Path:
        """Where the ledger is (a file for the filesystem store; else the store's name for it)."""
        return Path(self.store.log_location(self.log))

    @property
    def location(self) -> str:
        return self.store.log_location(self.log)

    def append(self, record: dict[str, Any]) -> None:
        """Append one record as one line (exclusive lock, fsync)."""
        self.store.append([self.log], record)

    def refresh(self) -> None:
        """Read what was appended since the last call (all of it when the ledger was replaced).
        Inside :func:`one_read`, only the first call reads: the rest see the same snapshot."""
        scope = _READ_SCOPE.get()
        if scope is not None and id(self) in scope:
            return
        with self._lock:
            chunk = self.store.read_log(self.log, self._cursor)
            if chunk.lines or chunk.restarted or chunk.cursor != self._cursor:
                self.generation += 1
            if chunk.restarted or chunk.cursor is None:
                self._entries, self._resets, self._bad = [], [], 0
            for raw in chunk.lines:
                self._ingest(raw)
            self._cursor = chunk.cursor
        if scope is not None:  # after the read: a failed one is tried (and raises) again
            scope[id(self)] = self  # kept alive in the scope, so its id cannot be reused meanwhile

    def _ingest(self, raw: bytes) -> None:
        if not raw.strip():
            return
        try:
            obj = json.loads(raw)
            if not isinstance(obj, dict):
                raise ValueError("not an object")
            kind = obj.get("type")
            if kind == "call":
                self._entries.append(CallEntry.parse(obj))
            elif kind == "reset":
                self._resets.append(float(_number(obj["ts"], "ts", limit=LAST_EPOCH)))
            else:
                raise ValueError(f"unknown record type {kind!r}")
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError, OverflowError):
            self._bad += 1

    def entries(
        self, start: float | None = None, end: float | None = None, *, honor_resets: bool = True
    ) -> list[CallEntry]:
        """The calls in ``[start, end)`` made after the last reset in that span."""
        self.refresh()
        with self._lock:
            lo = start if start is not None else float("-inf")
            hi = end if end is not None else float("inf")
            if honor_resets:
                resets = [r for r in self._resets if lo <= r < hi]
                if resets:
                    lo = max(lo, max(resets))
            return [e for e in self._entries if lo <= e.ts < hi]

    def resets_in(self, start: float, end: float) -> list[float]:
        """Times of the resets recorded in ``[start, end)``."""
        self.refresh()
        with self._lock:
            return [r for r in self._resets if start <= r < end]

    @property
    def bad_lines(self) -> int:
        self.refresh()
        return self._bad

    @property
    def last_reset(self) -> float | None:
        self.refresh()
        return max(self._resets) if self._resets else None

    def __len__(self) -> int:
        self.refresh()
        return len(self._entries)

    def all_entries(self) -> Iterator[CallEntry]:
        self.refresh()
        with self._lock:
            yield from list(self._entries)


_READ_SCOPE: contextvars.ContextVar[dict[int, LedgerFile] | None] = contextvars.ContextVar(
    "ctxrules_ledger_read_scope", default=None
)


class one_read:  # lower case: used like the function it was (``with one_read():``)
    """Within the block each ledger is read (asked for what was appended) at most once: one
    budget check looks at the session ledger several times (root totals, its own calls, bad
    lines), and each look would stat the file again. The check also sees one consistent
    snapshot of each file. Nested blocks share the outer one's snapshot. A class, not a
    generator-based context manager: every prepare enters one."""

    __slots__ = ("_token",)

    def __init__(self) -> None:
        self._token: contextvars.Token[dict[int, LedgerFile] | None] | None = None

    def __enter__(self) -> None:
        if _READ_SCOPE.get() is None:
            self._token = _READ_SCOPE.set({})

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _READ_SCOPE.reset(self._token)
            self._token = None


# Read caches shared process-wide: by file for filesystem stores (any two store objects over
# the same directory see the same files), by store object for the others.
_FILES: dict[tuple[str, str], LedgerFile] = {}
_BY_STORE: weakref.WeakKeyDictionary[Any, dict[Log, LedgerFile]] = weakref.WeakKeyDictionary()
_FILES_LOCK = ForkSafeLock()


def ledger_of(store: Store, log: Log) -> LedgerFile:
    """The process-wide :class:`LedgerFile` of ``log`` in ``store`` (so its read cache is shared)."""
    with _FILES_LOCK:
        per_store = _BY_STORE.setdefault(store, {})
        found = per_store.get(log)
        if found is not None:
            return found
        if isinstance(store, FilesystemStore):
            # Shared by every store object naming the same file (a session and its ledger
            # may be opened through different roots); remembered per store too, so the next
            # lookup builds no path.
            key = ("file", os.path.abspath(store.log_location(log)))
            found = _FILES.get(key)
            if found is None:
                found = _FILES[key] = LedgerFile(store, log)
        else:
            found = LedgerFile(store, log)
        per_store[log] = found
        return found


def ledger(path: Path) -> LedgerFile:
    """The :class:`LedgerFile` of a ledger file of the filesystem layout (module docstring)."""
    return ledger_of(*_file_log(path))


def _file_log(path: Path) -> tuple[Store, Log]:
    path = Path(os.path.abspath(path))
    if path.parent.name in ("days", "goals") and path.parent.parent.name == "ledger" and path.suffix == ".jsonl":
        kind: LogKind = "day" if path.parent.name == "days" else "goal"
        return FilesystemStore(path.parent.parent.parent), Log(kind, path.stem)
    if path.name == "ledger.jsonl":
        return FilesystemStore(path.parent.parent), Log("session", str(path.parent))
    raise UsageError(f"{path} is not a ledger of the state layout (<session>/ledger.jsonl, ledger/days|goals/*.jsonl)")


def now() -> float:
    return time.time()
