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
import queue
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
    """One application server: its own engine and Redis client; serves turns until None.

    A turn that fails (Redis gone, a history ctxrules refuses) is reported to the parent as
    ``("error", message)`` instead of ending the process with a traceback: the parent would
    otherwise wait for a result that never comes."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network for model facts
    from ctxrules import CtxrulesError, Engine

    try:
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
    except CtxrulesError as exc:
        results.put(("error", f"worker {os.getpid()}: {exc}"))
    except KeyboardInterrupt:
        pass


def next_result(results: Any, procs: list[Any]) -> Any:
    """The next turn's result; a worker that died without sending one (killed, out of memory)
    ends the wait instead of leaving the demo hanging."""
    while True:
        try:
            return results.get(timeout=0.5)
        except queue.Empty:
            dead = [p for p in procs if not p.is_alive()]
            if dead:
                try:  # its answer (an error it reported, say) may have landed as it ended
                    return results.get(timeout=0.5)
                except queue.Empty:
                    pass
                raise DemoError(
                    f"worker {dead[0].pid} ended (exit code {dead[0].exitcode}) without an answer"
                ) from None


class DemoError(Exception):
    """A failure the demo reports in one line (exit 2)."""


def conversation(path: str | None, turns: int) -> list[list[dict[str, Any]]]:
    """The history sent at each turn (each one extends the last)."""
    if path:
        messages = read_transcript(path)
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


def read_transcript(path: str) -> list[dict[str, Any]]:
    """The messages of a transcript file: a JSON list of chat messages, or ``{"messages": [...]}``
    as ``ctxrules run`` reads it. Anything else is a :class:`DemoError` naming the file."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DemoError(f"cannot read the transcript {path}: {exc}") from None
    messages = data.get("messages") if isinstance(data, dict) else data
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise DemoError(f'{path} is not a transcript: a JSON list of chat messages, or {{"messages": [...]}}')
    return messages


def check_store(url: str) -> None:
    """Open the store once in this process, before the workers start: a URL no backend serves or
    a Redis that does not answer is one line here, not a traceback in each worker."""
    from ctxrules import CtxrulesError
    from ctxrules.stores import open_store
    from ctxrules.stores.redis import RedisStore

    try:
        store = open_store(url)
        try:
            if not isinstance(store, RedisStore):
                raise DemoError(f"--redis takes a Redis URL (redis://, rediss://, unix://), not {url!r}")
            store.exists("demo-check")
        finally:
            store.close()
    except CtxrulesError as exc:
        raise DemoError(str(exc)) from None


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
            answer = next_result(results, procs)
            if answer[0] == "error":
                raise DemoError(answer[1])
            _, pid, sent, messages, report, took = answer
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
        for q in (*inboxes, results):  # flushed and closed: a worker that stopped early leaves no
            q.close()  # unread None behind for multiprocessing to warn about at exit
            q.join_thread()
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
    parser.add_argument("--turns", type=positive_int, default=8, help="how many turns (default 8)")
    parser.add_argument("--transcript", metavar="FILE", help="a JSON list of chat messages to replay")
    args = parser.parse_args()
    try:
        turns = conversation(args.transcript, args.turns)
        if not turns:
            raise DemoError(f"{args.transcript} holds no assistant message after the first message: no turn to replay")
        if args.redis:
            check_store(args.redis)
            return run(args.redis, turns)
        with local_redis() as url:
            return run(url, turns)
    except DemoError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"not a positive whole number: {text!r}")
    return value


if __name__ == "__main__":
    raise SystemExit(main())
