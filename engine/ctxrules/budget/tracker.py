"""The budget of one session: record calls, roll sub-agents up to their root, compute the level.

:class:`SessionLedger` is what ``session.ledger`` is. It appends every call to the session's
ledger, the day ledger and (when the session works for a goal) the goal ledger, and computes
a :class:`BudgetStatus` from them: spend per dimension, level, burn rate, ETA.

**Root tasks.** A sub-agent's session is registered with its parent (``register_child``); it
records into its own ledger and into the day and goal ledgers of the root's state root, and
the root's session dimension adds the ledgers of every descendant. Registration is refused
beyond ``max_descendants`` (20) per root, counted across
the whole tree, so runaway spawning stops.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctxrules.budget.ledger import (
    LAST_EPOCH,
    CallEntry,
    LedgerFile,
    Totals,
    call_record,
    check_goal,
    ledger_of,
    one_read,
    reset_record,
)
from ctxrules.budget.policy import DIMENSIONS, BudgetPolicy, DimensionLimit, Level
from ctxrules.budget.preflight import PreflightEstimate, preflight
from ctxrules.budget.pricing import Rates, price_call, rates_for
from ctxrules.budget.status import BudgetStatus, BurnRate, DimensionStatus
from ctxrules.budget.usage import TokenUsage, UsageFormat, as_mapping, is_failed_response, parse_usage
from ctxrules.errors import CtxrulesError, UsageError
from ctxrules.injected import KEY_FILE
from ctxrules.logs import get_logger
from ctxrules.stores.base import Log
from ctxrules.stores.filesystem import FilesystemStore

if TYPE_CHECKING:
    from ctxrules.stores.base import Store

__all__ = [
    "BudgetExceeded",
    "BudgetStatus",
    "BurnRate",
    "DimensionStatus",
    "SessionLedger",
    "SpawnLimitExceeded",
    "TrackedCall",
]

_MIN_BURN_SPAN_S = 60.0
"""Burn rates are averaged over at least a minute, so one call just made is not a huge rate: a
``burn_window_s`` under a minute reads the calls of the last minute."""


class BudgetExceeded(CtxrulesError):
    """A budget is used up: no further model calls until it is reset or raised (exit code 1)."""

    exit_code = 1

    def __init__(self, message: str, status: BudgetStatus | None = None) -> None:
        super().__init__(message)
        self.status = status


class SpawnLimitExceeded(CtxrulesError):
    """A root task already has ``max_descendants`` sub-agents (exit code 1)."""

    exit_code = 1


@dataclass
class TrackedCall:
    """Handed out by :meth:`SessionLedger.track`; set ``usage`` (or ``response``) on success."""

    model: str
    usage: TokenUsage | Mapping[str, Any] | None = None
    response: Any = None
    record: dict[str, Any] | None = None


class SessionLedger:
    """Cost recording and budget status of one session (``session.ledger``)."""

    def __init__(
        self,
        session_dir: Path | None,
        session_id: str,
        *,
        state_root: Path | None = None,
        policy: BudgetPolicy | None = None,
        goal: str | None = None,
        model: str | None = None,
        clock: Callable[[], float] = time.time,
        store: Store | None = None,
        session: str | None = None,
    ) -> None:
        if store is None:
            if session_dir is None:
                raise TypeError("SessionLedger needs a session directory, or store= and session=")
            session = str(session_dir)
            # The link is a file of the session directory: any filesystem store reads it.
            link = _read_link(FilesystemStore(Path(session_dir).parent), session)
            # A sub-agent reopened on its own (a restart, `usage show --session CHILD`) still
            # counts in its root's state root: the link written at registration names it.
            if state_root is not None:
                root = Path(state_root)
            elif link.get("state_root"):
                root = Path(link["state_root"])
            else:
                root = Path(session_dir).resolve().parent
            store = FilesystemStore(root)
        elif session is None:
            raise TypeError("SessionLedger(store=...) needs session=")
        else:
            link = _read_link(store, session)
        self.store: Store = store
        self.key: str = session
        self.id = session_id
        self.policy = policy or BudgetPolicy()
        self.model = model
        self.clock = clock
        self.root_id: str = link.get("root_id") or session_id
        self.root_key: str = str(link.get("root_dir") or session)
        self.goal = check_goal(goal) if goal is not None else link.get("goal")
        self.own = ledger_of(store, Log("session", session))
        # The descendants registry as last read (log, cursor, keys) and a generation that moves
        # when it changes; the last status computed and what it was computed from (_Memo).
        self._descendants: tuple[Log, Any, list[str]] | None = None
        self._descendants_generation = 0
        self._memo: _Memo | None = None

    @property
    def dir(self) -> Path:
        """The session directory (filesystem stores)."""
        return Path(self.key)

    @property
    def root_dir(self) -> Path:
        return Path(self.root_key)

    @property
    def state_root(self) -> Path | None:
        """Where the day and goal ledgers are (filesystem stores; None for the others)."""
        root = getattr(self.store, "root", None)
        return Path(root) if root is not None else None

    # -- recording ---------------------------------------------------------------------------

    def record(
        self,
        usage: TokenUsage | Mapping[str, Any] | object,
        *,
        model: str | None = None,
        source: str = "api",
        tier: str | None = None,
        service_tier: str = "standard",
        at: float | None = None,
        fmt: UsageFormat = "auto",
    ) -> dict[str, Any] | None:
        """Record one successful call; returns the record (``None`` for a failed-call body).

        ``usage`` is a :class:`TokenUsage`, a provider's usage object or whole response (see
        :func:`ctxrules.budget.usage.parse_usage`). A response that is an error records nothing:
        the ledger never counts usage a failed call did not have.
        """
        if not isinstance(usage, TokenUsage):
            data = as_mapping(usage)  # SDK objects are read once (model_dump)
            if is_failed_response(data):
                return None
            usage = parse_usage(data, fmt)
        name = model or self.model
        if not name:
            raise UsageError("record_usage needs the model that was called (model=...)")
        rates = rates_for(name, prompt_tokens=usage.prompt, service_tier=service_tier, prices=self.policy.prices)
        ts = self.clock() if at is None else checked_epoch(at)
        rec = call_record(
            usage=usage,
            cost=price_call(usage, rates),
            rates=rates,
            model=name,
            session=self.id,
            root=self.root_id,
            goal=self.goal,
            ts=ts,
            source=source,
            tier=tier,
            service_tier=service_tier,
        )
        # One call for the three ledgers: one round trip for a network store.
        self.store.append(self.call_logs(ts), rec)
        return rec

    def call_logs(self, ts: float) -> list[Log]:
        """The ledgers a call made at ``ts`` is recorded in: the session's, the day's and the
        goal's (a caller may check they can be written before :meth:`record`)."""
        out = [Log("session", self.key), Log("day", datetime.fromtimestamp(ts, UTC).date().isoformat())]
        if self.goal:
            out.append(Log("goal", self.goal))
        return out

    def _targets(self, ts: float) -> list[LedgerFile]:
        return [ledger_of(self.store, log) for log in self.call_logs(ts)]

    @contextlib.contextmanager
    def track(self, model: str | None = None, **options: Any) -> Iterator[TrackedCall]:
        """``with ledger.track("gpt-4o") as call: resp = ...; call.response = resp`` records the
        call's usage when the block succeeds and nothing when it raises (a failed call)."""
        call = TrackedCall(model=model or self.model or "")
        yield call
        source = call.usage if call.usage is not None else _usage_of(call.response)
        if source is None:
            raise UsageError("the tracked call set neither usage nor a response with usage")
        call.record = self.record(source, model=call.model or None, **options)

    def rates(self, model: str | None = None, prompt_tokens: int = 0) -> Rates | None:
        name = model or self.model
        return None if not name else rates_for(name, prompt_tokens=prompt_tokens, prices=self.policy.prices)

    # -- status ------------------------------------------------------------------------------

    def root_entries(self) -> list[CallEntry]:
        """Calls of the root task since its last session reset: the root and every descendant."""
        return self._root_entries(self._descendant_cache())

    def _root_entries(self, descendants: list[str]) -> list[CallEntry]:
        root = ledger_of(self.store, Log("session", self.root_key))
        since = root.last_reset
        out = root.entries()
        for child in descendants:
            out.extend(ledger_of(self.store, Log("session", child)).entries(start=since, honor_resets=False))
        out.sort(key=lambda e: e.ts)
        return out

    def day_window(self, now: float) -> tuple[float, float, str]:
        tz = self.policy.tz
        local = datetime.fromtimestamp(now, tz)
        # fold=0: in the repeated hour after a fall-back to midnight (America/Havana) ``local``
        # has fold=1, and its midnight would be the second one, leaving the day's first hour out.
        start = local.replace(hour=0, minute=0, second=0, microsecond=0, fold=0)
        end = (start + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0, fold=0)
        return start.timestamp(), end.timestamp(), start.date().isoformat()

    def day_entries(self, now: float) -> tuple[list[CallEntry], str]:
        start, end, label = self.day_window(now)
        files = [ledger_of(self.store, Log("day", d)) for d in _utc_dates(start, end)]
        resets = [r for f in files for r in f.resets_in(start, end)]
        lo = max([start, *resets])
        out = [e for f in files for e in f.entries(lo, end, honor_resets=False)]
        out.sort(key=lambda e: e.ts)
        return out, label

    def goal_entries(self) -> list[CallEntry]:
        if not self.goal:
            return []
        return ledger_of(self.store, Log("goal", self.goal)).entries()

    def status(self, now: float | None = None, *, turn_from: int | None = None) -> BudgetStatus:
        """The budget status at ``now``; ``turn_from`` = own calls counted at the last prepare.

        Every prepare asks. When no ledger it reads changed since the last answer, the day is
        the same and no call is recent enough to count in a burn rate (nothing in the answer
        depends on the time then), the last answer is given again: asking costs one look at
        each ledger instead of reading and summing them (:class:`_Memo`)."""
        when = self.clock() if now is None else now
        with one_read():  # each ledger read once: the session's is looked at several times
            memo, self._memo = self._memo, None
            # Read once per status (here or below): the registry names the ledgers to look at.
            descendants = self._descendant_cache()
            if memo is not None and memo.holds(self, when, turn_from):
                self._memo = memo
                return memo.status
            status, files, latest, day_end = self._status(when, turn_from, descendants)
            # Valid while nothing can enter a burn window: every call older than the window.
            if latest < when - self._burn_window():
                self._memo = _Memo(self, status, when, turn_from, files, day_end)
            return status

    def _status(
        self, now: float, turn_from: int | None, descendants: list[str]
    ) -> tuple[BudgetStatus, list[LedgerFile], float, float]:
        """The status; the ledgers it read, the time of the latest call among them, and the
        end of the day window it used (``inf`` without a day budget)."""
        root = self._root_entries(descendants)
        files = [ledger_of(self.store, Log("session", self.root_key))]
        files.extend(ledger_of(self.store, Log("session", k)) for k in descendants)
        latest = max((e.ts for e in root), default=float("-inf"))
        day_end = float("inf")
        dims: list[DimensionStatus] = []
        for lim in self.policy.limits:
            if lim.name == "session":
                entries, scope = root, self.root_id
            elif lim.name == "day":
                entries, scope = self.day_entries(now)
                start, day_end, _label = self.day_window(now)
                files.extend(ledger_of(self.store, Log("day", d)) for d in _utc_dates(start, day_end))
            else:
                if not self.goal:
                    continue  # a goal budget binds only sessions that work for a goal
                entries, scope = self.goal_entries(), self.goal
                files.append(ledger_of(self.store, Log("goal", self.goal)))
            latest = max(latest, max((e.ts for e in entries), default=latest))
            dims.extend(self._pairs(lim, scope, entries, now))
        level = max((d.level for d in dims), default=Level.OK)
        own = self.own.entries()
        files.append(self.own)
        turn = own[turn_from:] if turn_from is not None and 0 <= turn_from <= len(own) else []
        bad = self.own.bad_lines
        status = BudgetStatus(
            level=level,
            dimensions=dims,
            totals=Totals.of(root),
            burn=self._burn(root, now),
            policy=self.policy,
            turn=Totals.of(turn),
            own_calls=len(own),
            bad_lines=bad,
        )
        return status, files, latest, day_end

    def check(self, now: float | None = None, *, turn_from: int | None = None) -> BudgetStatus:
        """:meth:`status`, raising :class:`BudgetExceeded` when the level refuses calls."""
        st = self.status(now, turn_from=turn_from)
        if st.refuses:
            raise BudgetExceeded(st.refusal(), st)
        return st

    def _pairs(self, lim: DimensionLimit, scope: str, entries: list[CallEntry], now: float) -> list[DimensionStatus]:
        burn = self._burn(entries, now)
        out = []
        for unit, limit, spent, rate in (
            ("usd", lim.usd, sum(e.cost.total for e in entries if e.cost), burn.usd_per_min),
            (
                "tokens",
                lim.tokens,
                float(sum(e.tokens.total for e in entries)),
                burn.tokens_per_min,
            ),
        ):
            if limit is None:
                continue
            share = spent / limit if limit > 0 else 1.0
            remaining = max(0.0, limit - spent)
            eta = 0.0 if remaining <= 0 else (remaining / rate * 60.0 if rate > 0 else None)
            out.append(DimensionStatus(lim.name, scope, unit, float(limit), spent, lim.level_of(share), burn, eta))
        return out

    def _burn_window(self) -> float:
        return max(_MIN_BURN_SPAN_S, self.policy.burn_window_s)

    def _burn(self, entries: list[CallEntry], now: float) -> BurnRate:
        # The window and the span are at least a minute: the calls of a shorter window spread
        # over a minute would be too low a rate, over the window itself too high.
        window = self._burn_window()
        recent = [e for e in entries if now - window <= e.ts <= now]
        if not recent:
            return BurnRate(0.0, 0.0, 0.0, 0)
        span = min(window, max(_MIN_BURN_SPAN_S, now - min(e.ts for e in recent)))
        tokens = sum(e.tokens.total for e in recent)
        usd = sum(e.cost.total for e in recent if e.cost is not None)
        return BurnRate(tokens / span * 60.0, usd / span * 60.0, span, len(recent))

    def preflight(
        self,
        mode: str,
        per_call: TokenUsage | Mapping[str, Any],
        *,
        model: str | None = None,
        now: float | None = None,
        **counts: int,
    ) -> PreflightEstimate:
        """Calls and USD of a batch / council / alternatives run against what is left in this
        session's budget (see :mod:`ctxrules.budget.preflight`); nothing is recorded."""
        usage = per_call if isinstance(per_call, TokenUsage) else parse_usage(per_call)
        name = model or self.model
        if not name:
            raise UsageError("preflight needs the model the sub-agents will call (model=...)")
        sizes: dict[str, Any] = dict(counts)  # only the run's sizes (tasks, experts, ...)
        return preflight(mode, model=name, per_call=usage, status=self.status(now), **sizes)

    # -- resets ------------------------------------------------------------------------------

    def reset(self, dimension: str, now: float | None = None) -> str:
        """Start ``dimension`` afresh from now; returns the ledger written.

        The history stays in the ledger: a reset record makes totals count from it on."""
        ts = self.clock() if now is None else now
        log = self.reset_log(dimension, ts)
        self.store.append([log], reset_record(ts=ts))
        location: str = self.store.log_location(log)
        return location

    def reset_log(self, dimension: str, ts: float) -> Log:
        """The ledger a reset of ``dimension`` at ``ts`` is written to: the root task's, the
        day's or the goal's (a usage error for an unknown dimension, or a goal reset without a
        goal)."""
        if dimension not in DIMENSIONS:
            raise UsageError(f"unknown budget dimension {dimension!r}; one of: {', '.join(DIMENSIONS)}")
        if dimension == "session":
            return Log("session", self.root_key)
        if dimension == "day":
            return Log("day", datetime.fromtimestamp(ts, UTC).date().isoformat())
        if not self.goal:
            raise UsageError("the goal dimension needs a goal (--goal NAME)")
        return Log("goal", self.goal)

    # -- sub-agents --------------------------------------------------------------------------

    def descendant_keys(self) -> list[str]:
        """Session keys registered under this session's root task."""
        return list(self._descendant_cache())

    def _descendant_cache(self) -> list[str]:
        """:meth:`descendant_keys`, read on from where the last read ended (the registry only
        grows; a replaced one is read whole). The list is this object's: not to be changed."""
        seen = self._descendants
        # The registry of the root as last read (every prepare asks): its Log made again only
        # when the root changed (register_child), as a dataclass made and compared costs more.
        log = seen[0] if seen is not None and seen[0].name == self.root_key else Log("descendants", self.root_key)
        cursor = seen[1] if seen is not None and seen[0] is log else None
        try:
            chunk = self.store.read_log(log, cursor)
        except (OSError, CtxrulesError):
            self._descendants = None
            self._descendants_generation += 1
            return []
        if seen is not None and seen[0] is log and not chunk.lines and not chunk.restarted and chunk.cursor == cursor:
            return seen[2]
        keys = [] if seen is None or seen[0] is not log or chunk.restarted or chunk.cursor is None else list(seen[2])
        for line in chunk.lines:
            key = _path_of(line)
            if key is not None:
                keys.append(key)
        self._descendants = (log, chunk.cursor, keys)
        self._descendants_generation += 1
        return keys

    def descendants(self) -> list[Path]:
        """Session directories registered under this session's root task."""
        return [Path(k) for k in self.descendant_keys()]

    def register_child(self, child: SessionLedger) -> None:
        """Make ``child`` a sub-agent of this session's root task; its calls count there.

        Raises :class:`SpawnLimitExceeded` when the root already has ``max_descendants``.
        """
        filesystem = isinstance(self.store, FilesystemStore)
        # Filesystem keys are paths, recorded absolute (the registry outlives the cwd).
        child_key = str(Path(child.key).resolve()) if filesystem else child.key
        root_key = str(Path(self.root_key).resolve()) if filesystem else self.root_key
        entry = {"id": child.id, "path": child_key, "parent": self.id, "ts": self.clock()}
        limit = self.policy.max_descendants
        outcome = self.store.append_once(Log("descendants", self.root_key), entry, key="path", limit=limit)
        if outcome == "present":
            return
        if outcome == "full":
            raise SpawnLimitExceeded(
                f"root task {self.root_id} already has {limit} sub-agent sessions "
                f"(budgets.max_descendants {limit}); finish with the agents you have or "
                "raise budgets.max_descendants"
            )
        state_root = self.state_root
        link = {
            "root_id": self.root_id,
            "root_dir": root_key,
            "parent_id": self.id,
            "goal": self.goal,
            "state_root": str(state_root.resolve()) if state_root is not None else self.store.url,
        }
        child.store.write_doc(child.key, "root", json.dumps(link, sort_keys=True).encode("utf-8"))
        child.root_id, child.root_key = self.root_id, root_key
        child.store = self.store
        child.own = ledger_of(self.store, Log("session", child.key))
        if child.goal is None:
            child.goal = self.goal


class _Memo:
    """A :class:`BudgetStatus` and what it was computed from: the ledgers read (each with its
    generation), the descendants registry's generation, the ledger's own settings, the time.
    It holds at a later time when all of those are unchanged and the day window is the same
    (the status computation adds to that only burn rates, which a memo is not made with)."""

    __slots__ = ("day_end", "descendants", "files", "key", "now", "status", "turn_from")

    def __init__(
        self,
        ledger: SessionLedger,
        status: BudgetStatus,
        now: float,
        turn_from: int | None,
        files: list[LedgerFile],
        day_end: float,
    ) -> None:
        self.status, self.now, self.turn_from, self.day_end = status, now, turn_from, day_end
        self.files = [(f, f.generation) for f in files]
        self.descendants = ledger._descendants_generation
        self.key = _settings(ledger)

    def holds(self, ledger: SessionLedger, now: float, turn_from: int | None) -> bool:
        if not (self.now <= now < self.day_end and turn_from == self.turn_from and self.key == _settings(ledger)):
            return False
        if ledger._descendants_generation != self.descendants:  # a sub-agent registered since
            return False
        for file, generation in self.files:
            file.refresh()
            if file.generation != generation:
                return False
        return True


def _settings(ledger: SessionLedger) -> tuple[Any, ...]:
    # What a status depends on besides the ledgers and the time (register_child changes the
    # root and the own ledger; a goal or policy may be set on the object).
    return (ledger.policy, ledger.root_key, ledger.root_id, ledger.goal, ledger.own, ledger.store)


def _read_link(store: Store, session: str) -> dict[str, Any]:
    try:
        raw = store.read_doc(session, "root")
        data = json.loads(raw) if raw is not None else {}
    except (OSError, ValueError, RecursionError, CtxrulesError):
        return {}
    if not isinstance(data, dict):
        return {}
    if isinstance(store, FilesystemStore) and data and not _link_in_place(session, data):
        # A root.json that register_child did not write for this directory (copied along
        # with a session, planted in a repository): its paths would decide where ledgers are
        # written. The session counts as a root of its own.
        get_logger("ctxrules.budget").warning("budget.root_link_ignored", session=session)
        return {}
    return data


def _link_in_place(session: str, link: Mapping[str, Any]) -> bool:
    """Whether a sub-agent's link names what :meth:`SessionLedger.register_child` writes: the
    session below its root as ``children/NAME`` (once per generation); the state root the
    root's records go to, which is the root session's folder's parent (the default) or a state
    root ctxrules made (it holds the injection key); a goal name that is a file name."""
    root_dir, state_root, goal = link.get("root_dir"), link.get("state_root"), link.get("goal")
    if not isinstance(root_dir, str) or not isinstance(state_root, str) or not isinstance(link.get("root_id"), str):
        return False
    if goal is not None:
        try:
            check_goal(goal)
        except UsageError:
            return False
    try:
        root = Path(root_dir)
        if not root.is_absolute() or not Path(state_root).is_absolute():
            return False
        real_root = root.resolve()
        rel = Path(session).resolve().relative_to(real_root).parts
        if not rel or len(rel) % 2 or any(part != "children" for part in rel[::2]):
            return False
        states = Path(state_root).resolve()
        return states == real_root.parent or (states / KEY_FILE).is_file()
    except (OSError, ValueError, RuntimeError):
        return False


def checked_epoch(at: object) -> float:
    """``at`` as seconds since 1970 (UTC), or :class:`UsageError` when it is not a time a call
    can have been made at: not a number, NaN or infinite, before 1970 or after year 9999."""
    if isinstance(at, bool) or not isinstance(at, int | float):
        raise UsageError(f"a call's time must be seconds since 1970, got {type(at).__name__}")
    try:
        ts = float(at)
    except OverflowError:
        ts = math.inf
    if not 0 <= ts <= LAST_EPOCH:  # NaN fails both comparisons
        raise UsageError(f"a call's time must be seconds since 1970 up to the year 9999, got {at!r}")
    return ts


def _utc_dates(start: float, end: float) -> list[str]:
    """The UTC dates (day ledgers) that can hold calls made in ``[start, end)``."""
    first = datetime.fromtimestamp(start, UTC).date()
    last = datetime.fromtimestamp(max(start, end - 1e-6), UTC).date()
    out = []
    d = first
    while d <= last:
        out.append(d.isoformat())
        d += timedelta(days=1)
    return out


def _path_of(line: bytes) -> str | None:
    try:
        obj = json.loads(line)
        return str(obj["path"])
    except (ValueError, TypeError, KeyError):
        return None


def _usage_of(response: Any) -> Mapping[str, Any] | None:
    """The usage of a response object or dict (litellm's ModelResponse has ``model_dump``)."""
    if response is None:
        return None
    if isinstance(response, Mapping):
        return response
    dump = getattr(response, "model_dump", None)
    if callable(dump):
        data = dump()
        if isinstance(data, Mapping):
            return data
    usage = getattr(response, "usage", None)
    if usage is not None:
        return _usage_of(usage)
    return None
