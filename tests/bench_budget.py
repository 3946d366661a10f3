"""Benchmark of the cost ledger: recording calls and computing the budget status.

Run: ``PYTHONPATH=engine python tests/bench_budget.py [N]`` (default N = 5000 calls).

Prints the time per recorded call (three appends with fsync: session, day and goal ledgers),
the status of a session with N calls read cold (a new process) and warm (one call appended
since the last look), and as the baseline measured in the same run, a bare ``json.loads`` of
every line of the session ledger.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))

from ctxrules.budget import ledger as ledger_mod
from ctxrules.budget.policy import BudgetPolicy
from ctxrules.budget.tracker import SessionLedger
from ctxrules.budget.usage import TokenUsage


def main(n: int) -> None:
    policy = BudgetPolicy.from_pack(
        {"budgets": {"session": {"usd": 1e6}, "day": {"usd": 1e6}, "goal": {"tokens": 10**12}}}
    )
    with tempfile.TemporaryDirectory() as tmp:
        s = SessionLedger(Path(tmp) / "st" / "s", "s", model="claude-sonnet-4-5", policy=policy, goal="g")
        usage = TokenUsage.of(prompt=40_000, completion=800, cached=35_000, cache_write=2_000)
        t0 = time.perf_counter()
        for _ in range(n):
            s.record(usage)
        per_record = (time.perf_counter() - t0) / n
        path = s.own.path

        t0 = time.perf_counter()
        rows = [json.loads(line) for line in path.read_bytes().splitlines()]
        baseline = time.perf_counter() - t0
        assert len(rows) == n

        ledger_mod._FILES.clear()  # as a new process would see it
        ledger_mod._BY_STORE.clear()
        cold_owner = SessionLedger(s.dir, "s", model="claude-sonnet-4-5", policy=policy, goal="g")
        t0 = time.perf_counter()
        st = cold_owner.status()
        cold = time.perf_counter() - t0
        cold_owner.record(usage)
        t0 = time.perf_counter()
        cold_owner.status()
        warm = time.perf_counter() - t0

    print(f"calls in the ledgers:           {n}")
    print(f"record one call (3 fsynced appends): {per_record * 1e3:8.3f} ms")
    print(f"baseline json.loads of {n} lines:  {baseline * 1e3:8.3f} ms")
    print(f"status, cold (parse all):        {cold * 1e3:8.3f} ms  ({cold / baseline:.1f}x baseline)")
    print(f"status, warm (1 new call):       {warm * 1e3:8.3f} ms")
    print(f"level {st.level.label}, {st.totals.calls} calls, ${st.totals.usd:.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5000)
