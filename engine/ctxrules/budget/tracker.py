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
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from ctxrules.budget.ledger import (
    CallEntry,
    LedgerFile,
    Totals,
    call_record,
    check_goal,
    day_ledger_path,
    goal_ledger_path,
    ledger,
    ledger_files_between,
    reset_record,
    session_ledger_path,
)
from ctxrules.budget.policy import DIMENSIONS, BudgetPolicy, DimensionLimit, Level
from ctxrules.budget.preflight import PreflightEstimate, preflight
from ctxrules.budget.pricing import Rates, price_call, rates_for
from ctxrules.budget.status import BudgetStatus, BurnRate, DimensionStatus
from ctxrules.budget.usage import TokenUsage, UsageFormat, as_mapping, is_failed_response, parse_usage
from ctxrules.errors import CtxrulesError, UsageError
from ctxrules.private_files import ensure_dir, read_private, write_atomic

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
"""Burn rates are averaged over at least a minute, so one call just made is not a huge rate."""


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
        session_dir: Path,
        session_id: str,
        *,
        state_root: Path | None = None,
        policy: BudgetPolicy | None = None,
        goal: str | None = None,
        model: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.dir = Path(session_dir)
        self.id = session_id
        self.policy = policy or BudgetPolicy()
        self.model = model
        self.clock = clock
        link = self._read_link()
        # A sub-agent reopened on its own (a restart, `usage show --session CHILD`) still counts
        # in its root's state root: the link written at registration names it.
        if state_root is not None:
            self.state_root = Path(state_root)
        elif link.get("state_root"):
            self.state_root = Path(link["state_root"])
        else:
            self.state_root = self.dir.resolve().parent
        self.root_id: str = link.get("root_id") or session_id
        self.root_dir = Path(link["root_dir"]) if link.get("root_dir") else self.dir
        self.goal = check_goal(goal) if goal is not None else link.get("goal")
        self.own = ledger(session_ledger_path(self.dir))

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
        ts = self.clock() if at is None else float(at)
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
        for target in self._targets(ts):
            target.append(rec)
        return rec

    def _targets(self, ts: float) -> list[LedgerFile]:
        out = [
            self.own,
            ledger(day_ledger_path(self.state_root, datetime.fromtimestamp(ts, UTC).date())),
        ]
        if self.goal:
            out.append(ledger(goal_ledger_path(self.state_root, self.goal)))
        return out

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
        root = ledger(session_ledger_path(self.root_dir))
        since = root.last_reset
        out = root.entries()
        for child_dir in self.descendants():
            out.extend(ledger(session_ledger_path(child_dir)).entries(start=since, honor_resets=False))
        out.sort(key=lambda e: e.ts)
        return out

    def day_window(self, now: float) -> tuple[float, float, str]:
        tz = self.policy.tz
        local = datetime.fromtimestamp(now, tz)
        start = local.replace(hour=0, minute=0, second=0, microsecond=0)
        end = (start + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
        return start.timestamp(), end.timestamp(), start.date().isoformat()

    def day_entries(self, now: float) -> tuple[list[CallEntry], str]:
        start, end, label = self.day_window(now)
        files = [ledger(p) for p in ledger_files_between(self.state_root, start, end)]
        resets = [r for f in files for r in f.resets_in(start, end)]
        lo = max([start, *resets])
        out = [e for f in files for e in f.entries(lo, end, honor_resets=False)]
        out.sort(key=lambda e: e.ts)
        return out, label

    def goal_entries(self) -> list[CallEntry]:
        if not self.goal:
            return []
        return ledger(goal_ledger_path(self.state_root, self.goal)).entries()

    def status(self, now: float | None = None, *, turn_from: int | None = None) -> BudgetStatus:
        """The budget status at ``now``; ``turn_from`` = own calls counted at the last prepare."""
        now = self.clock() if now is None else now
        root = self.root_entries()
        dims: list[DimensionStatus] = []
        for lim in self.policy.limits:
            if lim.name == "session":
                entries, scope = root, self.root_id
            elif lim.name == "day":
                entries, scope = self.day_entries(now)
            else:
                if not self.goal:
                    continue  # a goal budget binds only sessions that work for a goal
                entries, scope = self.goal_entries(), self.goal
            dims.extend(self._pairs(lim, scope, entries, now))
        level = max((d.level for d in dims), default=Level.OK)
        own = self.own.entries()
        turn = own[turn_from:] if turn_from is not None and 0 <= turn_from <= len(own) else []
        bad = self.own.bad_lines
        return BudgetStatus(
            level=level,
            dimensions=dims,
            totals=Totals.of(root),
            burn=self._burn(root, now),
            policy=self.policy,
            turn=Totals.of(turn),
            own_calls=len(own),
            bad_lines=bad,
        )

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

    def _burn(self, entries: list[CallEntry], now: float) -> BurnRate:
        window = self.policy.burn_window_s
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

    def reset(self, dimension: str, now: float | None = None) -> Path:
        """Start ``dimension`` afresh from now; returns the ledger written.

        The history stays in the ledger: a reset record makes totals count from it on."""
        if dimension not in DIMENSIONS:
            raise UsageError(f"unknown budget dimension {dimension!r}; one of: {', '.join(DIMENSIONS)}")
        ts = self.clock() if now is None else now
        if dimension == "session":
            target = ledger(session_ledger_path(self.root_dir))
        elif dimension == "day":
            target = ledger(day_ledger_path(self.state_root, datetime.fromtimestamp(ts, UTC).date()))
        else:
            if not self.goal:
                raise UsageError("the goal dimension needs a goal (--goal NAME)")
            target = ledger(goal_ledger_path(self.state_root, self.goal))
        target.append(reset_record(ts=ts))
        return target.path

    # -- sub-agents --------------------------------------------------------------------------

    def _read_link(self) -> dict[str, Any]:
        try:
            data = json.loads(read_private(self.dir / "root.json"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def descendants(self) -> list[Path]:
        """Session directories registered under this session's root task."""
        path = self.root_dir / "descendants.jsonl"
        try:
            raw = read_private(path)
        except OSError:
            return []
        out = []
        for line in raw.split(b"\n"):
            with contextlib.suppress(ValueError, TypeError, KeyError):
                obj = json.loads(line)
                out.append(Path(obj["path"]))
        return out

    def register_child(self, child: SessionLedger) -> None:
        """Make ``child`` a sub-agent of this session's root task; its calls count there.

        Raises :class:`SpawnLimitExceeded` when the root already has ``max_descendants``.
        """
        registry = self.root_dir / "descendants.jsonl"
        ensure_dir(self.root_dir)
        from ctxrules.locks import FileLock

        with FileLock(registry.with_name(registry.name + ".lock")):
            fd = os.open(registry, os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
            try:
                size = os.fstat(fd).st_size
                known = [ln for ln in os.pread(fd, size, 0).split(b"\n") if ln.strip()]
                child_path = str(child.dir.resolve())
                if any(_path_of(ln) == child_path for ln in known):
                    return
                limit = self.policy.max_descendants
                if len(known) >= limit:
                    raise SpawnLimitExceeded(
                        f"root task {self.root_id} already has {len(known)} sub-agent sessions "
                        f"(budgets.max_descendants {limit}); finish with the agents you have or "
                        "raise budgets.max_descendants"
                    )
                entry = {"id": child.id, "path": child_path, "parent": self.id, "ts": self.clock()}
                prefix = b"" if not size or os.pread(fd, 1, size - 1) == b"\n" else b"\n"
                os.write(fd, prefix + json.dumps(entry, sort_keys=True).encode("utf-8") + b"\n")
                os.fsync(fd)
            finally:
                os.close(fd)
        link = {
            "root_id": self.root_id,
            "root_dir": str(self.root_dir.resolve()),
            "parent_id": self.id,
            "goal": self.goal,
            "state_root": str(self.state_root.resolve()),
        }
        write_atomic(child.dir / "root.json", json.dumps(link, sort_keys=True).encode("utf-8"))
        child.root_id, child.root_dir = self.root_id, self.root_dir.resolve()
        child.state_root = self.state_root
        if child.goal is None:
            child.goal = self.goal


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
