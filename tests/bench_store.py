"""Benchmark: a warm ``prepare`` on the Redis store against the filesystem store, in one run.

    python tests/bench_store.py [--reps N]

The largest corpus transcript (claudecode-ae4a77f8.json, 485 messages) with gpt-4o at a 400K
window (the steady state: every turn reuses the last output) and at 32K (a compacted session:
every turn reuses the compaction). After a first ``prepare``, one step is appended and
``prepare`` runs again, REPS times, on each store: the filesystem store in a temporary folder
and the Redis store on a ``redis-server`` this script starts on a unix socket (Debian's binary;
``--redis URL`` uses a running one instead). The turns alternate between the stores, so both see
the machine in the same state. Also the store's own share: ``load_turn`` + lock + ``commit_turn``
of that output, without the stages.

Prints medians and the ratio Redis / filesystem; the goal is at most 1.5. Exits 1 when the
400K warm ratio misses it. Also the CPU a warm prepare costs (ctxrules' process, plus the Redis
server's): wall time on a loaded machine includes waiting for the server to be scheduled at
every round trip, CPU does not. With ``--redis URL`` the server's CPU includes other clients'.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "engine"))
sys.path.insert(0, str(HERE))
from conftest import TRANSCRIPTS  # noqa: E402  (the corpus folder: $CTXRULES_CORPUS)
from redis_server import REDIS_SERVER, RedisServer  # noqa: E402

TRANSCRIPT = TRANSCRIPTS / "claudecode-ae4a77f8.json"
GOAL = 1.5


def step(i: int) -> list[dict[str, Any]]:
    return [
        {
            "role": "assistant",
            "content": f"Next I will check item {i}.",
            "tool_calls": [
                {
                    "id": f"bench_{i}",
                    "type": "function",
                    "function": {"name": "Bash", "arguments": json.dumps({"command": f"ls {i}"})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": f"bench_{i}", "content": f"file_{i}.txt\n" * 20},
    ]


def timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1000


class ServerCPU:
    """Seconds of CPU the Redis server used so far (INFO cpu: user + system), through a client of
    its own."""

    def __init__(self, url: str) -> None:
        import redis

        self.client = redis.Redis.from_url(url)

    def __call__(self) -> float:
        info = self.client.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def bench_prepare(stores: dict[str, str], history: list[dict[str, Any]], window: int, reps: int) -> dict[str, float]:
    from ctxrules import Engine

    engine = Engine.load("builtin:default")
    sessions = {
        label: engine.session(session_id=f"bench-{window}", store=url, model="gpt-4o", window=window)
        for label, url in stores.items()
    }
    for session in sessions.values():
        session.prepare(history)  # cold
    grown = list(history)
    samples: dict[str, list[float]] = {label: [] for label in stores}
    cpu: dict[str, float] = dict.fromkeys(stores, 0.0)
    server = ServerCPU(stores["redis"])
    for i in range(reps):
        grown = grown + step(i)
        for label, session in sessions.items():
            # The server's counter outside the client's: asking it costs the client CPU too.
            server_before = server() if label == "redis" else 0.0
            before = time.process_time()
            samples[label].append(timed(lambda s=session, g=grown: s.prepare(g)))
            after = time.process_time()
            server_after = server() if label == "redis" else 0.0
            cpu[label] += (after - before) + (server_after - server_before)
    server.client.close()
    out = {label: statistics.median(v) for label, v in samples.items()}
    out.update({f"{label} cpu": cpu[label] * 1000 / reps for label in stores})
    return out


def bench_store_ops(stores: dict[str, str], history: list[dict[str, Any]], reps: int) -> dict[str, float]:
    """The store's share of a warm turn: lock, load_turn, commit_turn with one step appended."""
    from ctxrules.stores import open_store

    opened = {label: open_store(url) for label, url in stores.items()}
    keys = {label: st.session_key("bench-ops") for label, st in opened.items()}
    outputs = {label: list(history) for label in stores}
    for label, st in opened.items():
        with st.prepare_lock(keys[label]):
            st.commit_turn(keys[label], st.load_turn(keys[label]).state, outputs[label])
    samples: dict[str, list[float]] = {label: [] for label in stores}
    for i in range(reps):
        for label, st in opened.items():
            key = keys[label]

            def turn(st: Any = st, key: str = key, label: str = label, i: int = i) -> None:
                with st.prepare_lock(key):
                    got = st.load_turn(key)
                    assert got.output is not None and len(got.output) == len(outputs[label])
                    outputs[label] = [*got.output, *step(i)]
                    st.commit_turn(key, got.state, outputs[label])

            samples[label].append(timed(turn))
    for st in opened.values():
        st.close()
    return {label: statistics.median(v) for label, v in samples.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=21)
    parser.add_argument("--redis", metavar="URL", help="a running Redis to use (default: start redis-server)")
    args = parser.parse_args()
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    if not TRANSCRIPT.is_file():
        print(f"skipped: the corpus transcript {TRANSCRIPT} is missing (set CTXRULES_CORPUS)")
        return 0
    server = None
    if args.redis is None:
        if REDIS_SERVER is None:
            print("skipped: redis-server is not installed (apt-get install redis-server), and no --redis URL")
            return 0
        server = RedisServer()
        server.start()
    url = args.redis or (server.url if server else "")
    history = json.loads(TRANSCRIPT.read_text())
    code = 0
    try:
        with tempfile.TemporaryDirectory() as tmp:
            stores = {"filesystem": f"file://{tmp}/state", "redis": url}
            load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
            print(f"{TRANSCRIPT.name}: {len(history)} messages, {args.reps} warm turns per store, medians")
            print(f"load average {load:.1f} on {os.cpu_count()} CPUs (a busy machine delays every round trip to Redis)")
            print(f"{'':<28}{'filesystem':>12}{'redis':>12}{'ratio':>8}")
            rows = [
                ("warm prepare, 400K window", bench_prepare(stores, history, 400_000, args.reps)),
                ("warm prepare, 32K window", bench_prepare(stores, history, 32_000, args.reps)),
                ("store ops of a warm turn", bench_store_ops(stores, history, args.reps)),
            ]
            for label, got in rows:
                ratio = got["redis"] / got["filesystem"]
                print(f"{label:<28}{got['filesystem']:>10.2f}ms{got['redis']:>10.2f}ms{ratio:>7.2f}x")
                if "redis cpu" in got:
                    # CPU, not wall time: ctxrules' process plus the Redis server's, per turn (the
                    # mean); what the work costs whatever else the machine is doing.
                    fs_cpu, redis_cpu = got["filesystem cpu"], got["redis cpu"]
                    name = "  cpu (client + server)"
                    print(f"{name:<28}{fs_cpu:>10.2f}ms{redis_cpu:>10.2f}ms{redis_cpu / fs_cpu:>7.2f}x")
            ratio_400k = rows[0][1]["redis"] / rows[0][1]["filesystem"]
            verdict = "met" if ratio_400k <= GOAL else "MISSED"
            print(f"goal: warm prepare on Redis <= {GOAL}x the filesystem store: {verdict} ({ratio_400k:.2f}x)")
            code = 0 if ratio_400k <= GOAL else 1
    finally:
        if server is not None:
            server.close()
    return code


if __name__ == "__main__":
    raise SystemExit(main())
