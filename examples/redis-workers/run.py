"""Two worker processes serve one session through one Redis (README.md next to this file).

python examples/redis-workers/run.py [--redis URL] [--turns N] [--transcript FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MODEL = "gpt-4o"
WINDOW = 16_000


def worker(url: str, jobs: Any, results: Any) -> None:
    """One application server: its own engine and Redis client; serves turns until None."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network for model facts
    from ctxrules import Engine

    engine = Engine.load("builtin:default")
    while (job := jobs.get()) is not None:
        session_id, turn, history = job
        session = engine.session(session_id=session_id, store=url, model=MODEL, window=WINDOW)
        started = time.perf_counter()
        result = session.prepare(history)
        took = (time.perf_counter() - started) * 1000
        # What the model call would have cost; the ledger is shared by every worker.
        session.record_usage({"prompt_tokens": 900 + 40 * turn, "completion_tokens": 60})
        results.put((turn, os.getpid(), len(history), result.messages, result.report, took))


def conversation(path: str | None, turns: int) -> list[list[dict[str, Any]]]:
    """The history sent at each turn (each one extends the last)."""
    if path:
        messages = json.loads(Path(path).read_text(encoding="utf-8"))
        cuts = [i for i, m in enumerate(messages) if m.get("role") == "assistant" and i > 0]
        step = max(1, len(cuts) // turns)
        return [messages[:cut] for cut in cuts[::step][:turns]]
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. Work in small, checked steps."},
        {"role": "user", "content": "The test suite fails on CI; find out why and fix it."},
    ]
    out = []
    for i in range(turns):
        call_id = f"call_{i}"
        history = [
            *history,
            {
                "role": "assistant",
                "content": f"Step {i}: running the tests of module {i}.",
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "bash", "arguments": json.dumps({"command": f"pytest tests/m{i}"})},
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": call_id,
                "content": "".join(f"tests/m{i}/test_{k}.py::test_case PASSED\n" for k in range(300))
                + f"FAILED tests/m{i}/test_io.py::test_read - AssertionError: expected 3, got {i}\n",
            },
        ]
        out.append(history)
    return out


@contextlib.contextmanager
def local_redis() -> Iterator[str]:
    """Debian's redis-server on a unix socket in a temporary folder, nothing saved to disk."""
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server is not installed (apt-get install redis-server), or pass --redis URL")
    folder = tempfile.mkdtemp(prefix="ctxrules-demo-")
    sock = os.path.join(folder, "redis.sock")
    proc = subprocess.Popen(
        [binary, "--port", "0", "--unixsocket", sock, "--save", "", "--appendonly", "no", "--dir", folder],
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while not os.path.exists(sock):
            if time.monotonic() > deadline or proc.poll() is not None:
                sys.exit("redis-server did not start")
            time.sleep(0.01)
        yield f"unix://{sock}"
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(folder, ignore_errors=True)


def shared_prefix(a: list[Any], b: list[Any]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if json.dumps(x, sort_keys=True) != json.dumps(y, sort_keys=True):
            break
        n += 1
    return n


def run(url: str, turns: list[list[dict[str, Any]]]) -> int:
    session_id = f"demo-{os.getpid()}-{int(time.time())}"  # a fresh session on a shared server
    from ctxrules.stores.base import Log
    from ctxrules.stores.redis import RedisStore

    ctx = multiprocessing.get_context("spawn")
    inboxes = [ctx.Queue(), ctx.Queue()]
    results = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(url, inbox, results)) for inbox in inboxes]
    for p in procs:
        p.start()
    previous: list[Any] = []
    header = ("turn", 4), ("worker", 7), ("in", 5), ("out", 5), ("same prefix", 11), ("reused", 6), ("tokens", 13)
    print(" ".join(f"{name:>{width}}" for name, width in header), f"{'ms':>7}")
    try:
        for turn, history in enumerate(turns):
            inboxes[turn % 2].put((session_id, turn, history))
            _, pid, sent, messages, report, took = results.get(timeout=300)
            reused = report.get("reused_messages", 0)
            tokens = f"{report['before']['tokens']}->{report['after']['tokens']}"
            same = shared_prefix(previous, messages)
            print(f"{turn:>4} {pid:>7} {sent:>5} {len(messages):>5} {same:>11} {reused:>6} {tokens:>13} {took:>7.1f}")
            previous = messages
    finally:
        for inbox in inboxes:
            inbox.put(None)
        for p in procs:
            p.join()
    store = RedisStore.from_url(url)
    records = store.read_log(Log("session", session_id)).lines
    holds = store.prepares(session_id)
    overlaps = sum(1 for a, b in itertools.pairwise(holds) if a[1] > b[0])
    workers = len({h[2].split(":")[1] for h in holds})
    tokens = store.totals(Log("session", session_id)).get("tokens.prompt", 0)
    print(f"session {session_id} on {store.url}")
    print(f"ledger: {len(records)} calls, {tokens:.0f} prompt tokens (atomic totals beside the records)")
    print(f"prepare lock: {len(holds)} holds by {workers} workers, {overlaps} overlapping")
    store.close()
    return 0 if len(records) == len(turns) and overlaps == 0 else 1


def main() -> int:
    parser = argparse.ArgumentParser(description="two workers serve one session through one Redis")
    parser.add_argument("--redis", metavar="URL", help="a running Redis (default: start redis-server)")
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--transcript", metavar="FILE", help="a JSON list of chat messages to replay")
    args = parser.parse_args()
    turns = conversation(args.transcript, args.turns)
    if args.redis:
        return run(args.redis, turns)
    with local_redis() as url:
        return run(url, turns)


if __name__ == "__main__":
    raise SystemExit(main())
