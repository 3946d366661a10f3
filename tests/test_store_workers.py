"""Many workers, one session: 4 worker processes serve the turns of 8 real transcripts round-robin
through one real ``redis-server``, so consecutive turns of a session land on different workers.

Against a single process on the filesystem store, turn for turn: the outputs are equal message
for message, the stable prompt prefix between consecutive turns is the same bytes, every marker's
vault item resolves from every worker, the ledgers add up exactly, and no two prepares of one
session overlapped (by the lock holds the store records, in the server's clock).
"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import queue
from pathlib import Path
from typing import Any

import pytest
from conftest import TRANSCRIPTS

pytestmark = pytest.mark.corpus

PACK = "builtin:default"
MODEL = "gpt-4o"
WINDOW = 16_000  # small enough that most of these sessions compact
TURNS = 5  # per transcript: evenly spaced over the whole conversation
WORKERS = 4
CLOCK = 1_780_000_000.0
KEY = bytes(range(32))  # the injection key both runs sign with (signatures then repeat)
NAMES = [
    "claudecode-subagent-a2898e3",
    "claudecode-subagent-afc096d",
    "minisweagent-django__django-13925",
    "minisweagent-mwaskom__seaborn-3069",
    "minisweagent-sympy__sympy-13877",
    "openhands-ponylang__ponyc-4588",
    "openhands-ponylang__ponyc-4595",
    "sweagent-pydicom__pydicom-1458",
]


def _turn_points(history: list[dict[str, Any]]) -> list[int]:
    """Where prepares happen: before an assistant message, TURNS of them spread evenly."""
    points = [i for i, m in enumerate(history) if m.get("role") == "assistant" and i > 0]
    if len(points) <= TURNS:
        return points
    step = (len(points) - 1) / (TURNS - 1)
    return sorted({points[round(k * step)] for k in range(TURNS)})


def _usage(name: str, turn: int) -> dict[str, int]:
    return {"prompt_tokens": 1000 + 7 * turn + len(name), "completion_tokens": 50 + turn}


def _open(engine: Any, store: str, name: str) -> Any:
    return engine.session(session_id=name, store=store, model=MODEL, window=WINDOW)


def _serve(store: str, jobs: Any, results: Any) -> None:
    """A worker: one engine, one store client; serves ``(name, upto, turn)`` jobs until None."""
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    from ctxrules import Engine

    engine = Engine.load(PACK)
    histories: dict[str, list[dict[str, Any]]] = {}
    while True:
        job = jobs.get()
        if job is None:
            return
        kind, name, *args = job
        try:
            if kind == "turn":
                upto, turn = args
                history = histories.get(name)
                if history is None:
                    history = histories[name] = json.loads((TRANSCRIPTS / f"{name}.json").read_text())
                session = _open(engine, store, name)
                result = session.prepare(history[:upto], clock=CLOCK + 60 * turn)
                session.record_usage(_usage(name, turn))
                results.put(("turn", name, turn, os.getpid(), result.messages, result.report.get("notes", [])))
            else:  # resolve: every vault id the markers name, read through this worker's store
                ids = args[0]
                session = _open(engine, store, name)
                missing = [i for i in ids if not session.vault.exists(i)]
                results.put(("resolved", name, os.getpid(), missing))
        except Exception as exc:  # reported to the test, which fails with it
            results.put(("error", name, os.getpid(), f"{type(exc).__name__}: {exc}"))


def _reference(tmp: Path, histories: dict[str, list[dict[str, Any]]]) -> dict[tuple[str, int], list[Any]]:
    """The same turns in one process on the filesystem store."""
    from ctxrules import Engine

    root = tmp / "fs"
    root.mkdir()
    from ctxrules.stores.filesystem import FilesystemStore

    FilesystemStore(root).secret(None, "injection.key", lambda: KEY)
    engine = Engine.load(PACK)
    out: dict[tuple[str, int], list[Any]] = {}
    for name, history in histories.items():
        for turn, upto in enumerate(_turn_points(history)):
            session = _open(engine, f"file://{root}", name)
            out[(name, turn)] = session.prepare(history[:upto], clock=CLOCK + 60 * turn).messages
    return out


def _common_prefix_bytes(a: list[Any], b: list[Any]) -> bytes:
    prefix = []
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        prefix.append(json.dumps(x, sort_keys=True))
    return "\n".join(prefix).encode()


def test_four_workers_serve_eight_sessions_as_one_process_would(redis_url: str, tmp_path: Path) -> None:
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    from ctxrules.stores.base import Log
    from ctxrules.stores.redis import RedisStore
    from ctxrules.vault import parse_markers

    histories = {n: json.loads((TRANSCRIPTS / f"{n}.json").read_text()) for n in NAMES}
    expected = _reference(tmp_path, histories)

    store = RedisStore.from_url(redis_url)
    store.secret(None, "injection.key", lambda: KEY)
    ctx = multiprocessing.get_context("spawn")
    inboxes = [ctx.Queue() for _ in range(WORKERS)]
    results = ctx.Queue()
    procs = [ctx.Process(target=_serve, args=(redis_url, inboxes[w], results)) for w in range(WORKERS)]
    for p in procs:
        p.start()
    got: dict[tuple[str, int], tuple[int, list[Any]]] = {}
    try:
        plans = {n: _turn_points(h) for n, h in histories.items()}
        rounds = max(len(p) for p in plans.values())
        for turn in range(rounds):
            # Session i's turn t goes to worker (i + t) % 4: never the worker of its last turn.
            sent = 0
            for i, name in enumerate(NAMES):
                if turn < len(plans[name]):
                    inboxes[(i + turn) % WORKERS].put(("turn", name, plans[name][turn], turn))
                    sent += 1
            for _ in range(sent):
                reply = results.get(timeout=120)
                assert reply[0] == "turn", reply
                _, name, t, pid, messages, _notes = reply
                got[(name, t)] = (pid, messages)
        # Every marker's vault item, asked of every worker.
        resolved = 0
        for name in NAMES:
            ids = sorted(
                {
                    marker.vault_id
                    for (n, _), (_, messages) in got.items()
                    if n == name
                    for m in messages
                    if isinstance(m.get("content"), str)
                    for marker in parse_markers(m["content"])
                }
            )
            resolved += len(ids)
            for inbox in inboxes:
                inbox.put(("resolve", name, ids))
            for _ in inboxes:
                reply = results.get(timeout=60)
                assert reply[0] == "resolved", reply
                assert reply[3] == [], f"{name}: worker {reply[2]} cannot resolve {reply[3]}"
    finally:
        for inbox in inboxes:
            inbox.put(None)
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    with pytest.raises(queue.Empty):
        results.get_nowait()
    assert resolved > 20  # the sessions compacted: there were markers to resolve

    # Outputs: message for message what one process on the filesystem store returned.
    assert set(got) == set(expected)
    for key, (_, messages) in got.items():
        assert messages == expected[key], f"{key}: the workers' output differs from one process's"
    # Consecutive turns ran on different workers.
    for name in NAMES:
        pids = [got[(name, t)][0] for t in range(len(plans[name]))]
        assert all(a != b for a, b in itertools.pairwise(pids))
    # The stable prefix between consecutive turns: the same bytes as in one process.
    for name in NAMES:
        for t in range(1, len(plans[name])):
            ours = _common_prefix_bytes(got[(name, t - 1)][1], got[(name, t)][1])
            theirs = _common_prefix_bytes(expected[(name, t - 1)], expected[(name, t)])
            assert ours == theirs and ours
    # Ledgers: one record per turn, and the atomic totals are exactly the records' sums.
    all_records = []
    for name in NAMES:
        lines = store.read_log(Log("session", name)).lines
        records = [json.loads(line) for line in lines]
        assert len(records) == len(plans[name])
        all_records += records
        totals = store.totals(Log("session", name))
        assert totals["calls"] == len(records)
        sent = sum(_usage(name, t)["prompt_tokens"] for t in range(len(plans[name])))
        assert totals["tokens.prompt"] == sum(r["tokens"]["prompt"] for r in records) == sent
        assert totals["tokens.completion"] == sum(r["tokens"]["completion"] for r in records)
    days = store.logs("day")
    assert sum(store.totals(d).get("calls", 0) for d in days) == len(all_records) == sum(map(len, plans.values()))
    assert sum(store.totals(d).get("tokens.prompt", 0) for d in days) == sum(r["tokens"]["prompt"] for r in all_records)
    # No two prepares of a session overlapped (lock holds in the server's clock).
    for name in NAMES:
        holds = store.prepares(name)
        assert len({h[2] for h in holds}) > 1  # several workers held it
        for (_, end, _), (start, _, _) in itertools.pairwise(holds):
            assert end <= start
    store.close()
