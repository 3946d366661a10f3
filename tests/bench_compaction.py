"""Benchmark: a full compaction of the largest transcript at a 32K window, next to
``litellm.utils.trim_messages`` on the same input, in the same run.

    python tests/bench_compaction.py [--reps N] [--disk-dir DIR]

First, the cold figure against its floor, for claudecode-ae4a77f8 (485 messages, ~122K tokens)
and claudecode-4d5611e5 (303 messages, ~173K tokens): ``Engine.load`` + a fresh session + one
``prepare`` to 32K, with the token memos emptied before each repetition (no message of the
transcript was counted before: what a process sees the first time it meets a history; the
tokenizer file is loaded, as in any process that counted once). The floor is ONE
``encode_ordinary_batch`` pass of the o200k tokenizer over every text the transcript's
messages hold, measured right before each repetition (interleaved: both see the machine in
the same state). The goal is a ratio of at most 1.5. The session lives on a memory-backed
directory (``/dev/shm``) for the ratio, since the vault writes (each item fsynced) are the disk's
cost, not ours; the same run on a real disk (``--disk-dir``, default: the system temporary
directory when it is not memory-backed) is printed beside it.
The in-process CPU time (every thread's, least of the repetitions) of both sides and its ratio
follow: the work each side does, steadier than wall time when other programs share the machine.
Last, where our time goes: ``count`` is our own tokenizer pass alone (``count_each`` of the
history from scratch, right after each repetition), ``rest`` the memory-dir median minus it.

Input: ``claudecode-ae4a77f8.json`` (485 messages, ~122K tokens with gpt-4o). ctxrules runs
``builtin:default`` with every non-LLM stage (the ``summarize.*`` stages, which call a model,
are left out of the plan) in a fresh session each repetition, so every repetition compacts
from scratch (no reuse of an earlier compaction). litellm trims the same messages to the token
count ctxrules' ``compress.remove`` aims below (the ``light`` threshold of the usable window).

Printed per side: median wall time, tokens and messages after, whether every tool call is
still answered (OpenAI and Anthropic reject orphans), whether the first and the latest user
messages survive, and how much of what left the context can be recovered (ctxrules: from the
vault; trim_messages keeps no copy). Also the per-stage times of one ctxrules run.
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

# The longest Claude Code session of the corpus (485 messages, ~122K tokens)
TRANSCRIPT = TRANSCRIPTS / "claudecode-ae4a77f8.json"
WINDOW = 32_000
MODEL = "gpt-4o"


def median_ms(fn: Callable[[], Any], reps: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(reps):
        t = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times), result


def orphans(messages: list[dict[str, Any]]) -> int:
    from invariants import pairing_problems

    return len(pairing_problems(messages))


FLOOR_TRANSCRIPTS = ("claudecode-ae4a77f8.json", "claudecode-4d5611e5.json")
GOAL_RATIO = 1.5


def _memory_dir() -> Path | None:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else None


def cold_against_floor(reps: int, disk_dir: Path | None) -> bool:
    """Print the cold compaction figure next to its tokenizer floor; True when within goal."""
    import shutil

    import tiktoken

    from ctxrules import Engine, structure
    from ctxrules.tokens import TokenCounter

    counter = TokenCounter.for_tokenizer("o200k_base")
    counter.count_text("x")  # points tiktoken at the BPE file litellm ships (never downloads)
    encoding = tiktoken.get_encoding("o200k_base")
    memory = _memory_dir()
    places = {"memory": memory, "disk": disk_dir}
    print(f"cold compaction to {WINDOW} vs one o200k encode_ordinary_batch pass (median of {reps})")
    print(
        f"  {'transcript':28s} {'messages':>8s} {'floor ms':>9s} {'memory-dir ms':>14s} {'ratio':>6s}"
        f" {'on-disk ms':>11s} {'ratio':>6s}   {'cpu floor':>9s} {'cpu ours':>8s} {'ratio':>6s}"
        f"   {'count ms':>8s} {'rest ms':>7s}"
    )
    ok = True
    for name in FLOOR_TRANSCRIPTS:
        history = json.loads((TRANSCRIPTS / name).read_text())
        # Every text the counter tokenizes for these messages (contents, arguments, names, ids).
        texts = [t for m in history for t in counter._tally_message(m).texts]
        figures: dict[str, tuple[float, float]] = {}
        cpu: dict[str, tuple[float, float]] = {}
        count_ms: dict[str, float] = {}
        for place, where in places.items():
            if where is None:
                continue
            root = Path(tempfile.mkdtemp(prefix="bench-cold-", dir=where))
            floors, ours, floors_cpu, ours_cpu, counts = [], [], [], [], []
            try:
                for i in range(reps + 1):
                    t, c = time.perf_counter(), time.process_time()
                    encoding.encode_ordinary_batch(texts)
                    floor = (time.perf_counter() - t) * 1000
                    floor_cpu = (time.process_time() - c) * 1000
                    counter.clear_memo()  # no message of this history was counted before
                    structure.forget()
                    t, c = time.perf_counter(), time.process_time()
                    engine = Engine.load("builtin:default")
                    session = engine.session(root / f"s{i}", model=MODEL, window=WINDOW)
                    session.prepare(history)
                    took = (time.perf_counter() - t) * 1000
                    took_cpu = (time.process_time() - c) * 1000
                    # Our own tokenizer pass alone: counting the history's messages from
                    # scratch, as the compaction's first count does (the rest of its time is
                    # the stages, the vault and the session files).
                    counter.clear_memo()
                    structure.forget()
                    t = time.perf_counter()
                    counter.count_each(history)
                    counted = (time.perf_counter() - t) * 1000
                    if i:  # the first one loads modules and files: a process does that once
                        floors.append(floor)
                        ours.append(took)
                        floors_cpu.append(floor_cpu)
                        ours_cpu.append(took_cpu)
                        counts.append(counted)
            finally:
                shutil.rmtree(root, ignore_errors=True)
            figures[place] = (statistics.median(floors), statistics.median(ours))
            count_ms[place] = statistics.median(counts)
            # CPU time of the process (every thread's), the least of the repetitions: what the
            # work costs, steadier than wall time on a machine other programs keep busy.
            cpu[place] = (min(floors_cpu), min(ours_cpu))
        floor = figures["memory"][0] if "memory" in figures else figures["disk"][0]
        cells = []
        for place in ("memory", "disk"):
            if place in figures:
                f, o = figures[place]
                cells.append(f"{o:14.1f} {o / f:6.2f}" if place == "memory" else f"{o:11.1f} {o / f:6.2f}")
            else:
                cells.append(f"{'-':>14s} {'-':>6s}" if place == "memory" else f"{'-':>11s} {'-':>6s}")
        f_cpu, o_cpu = cpu["memory"] if "memory" in cpu else cpu["disk"]
        decisive_place = "memory" if "memory" in figures else "disk"
        counted = count_ms[decisive_place]
        print(
            f"  {name.removesuffix('.json'):28s} {len(history):8d} {floor:9.1f} {cells[0]} {cells[1]}"
            f"   {f_cpu:9.1f} {o_cpu:8.1f} {o_cpu / f_cpu:6.2f}"
            f"   {counted:8.1f} {figures[decisive_place][1] - counted:7.1f}"
        )
        decisive = figures.get("memory") or figures["disk"]
        ok = ok and decisive[1] / decisive[0] <= GOAL_RATIO
    print(f"  goal: memory-dir ratio <= {GOAL_RATIO}: {'OK' if ok else 'MISSED'}")
    print("  (cpu: in-process CPU time of all threads, least of the repetitions, memory-dir run)")
    print(
        "  (count: median of our tokenizer pass alone over the history, TokenCounter.count_each from"
        " scratch; rest: the memory-dir median minus it: stages, vault, session files)\n"
    )
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument(
        "--disk-dir",
        type=Path,
        default=None,
        help="where the on-disk sessions go (default: the temporary directory unless memory-backed)",
    )
    parser.add_argument("--floor-only", action="store_true", help="only the cold figure against its floor")
    args = parser.parse_args()
    disk_dir = args.disk_dir
    if disk_dir is None:
        default = Path(tempfile.gettempdir())
        disk_dir = None if _on_tmpfs(default) else default
    within = cold_against_floor(args.reps, disk_dir)
    if args.floor_only:
        return 0 if within else 1

    from compress_kit import expand

    from ctxrules import Engine
    from ctxrules.messages import is_real_user

    history = json.loads(TRANSCRIPT.read_text())
    engine = Engine.load("builtin:default")
    engine.plan = [p for p in engine.plan if not p.type.name.startswith("summarize.")]
    tmp = Path(tempfile.mkdtemp(prefix="bench-compaction-"))
    runs = iter(range(10**6))

    def ctxrules_compaction() -> Any:
        session = engine.session(tmp / f"s{next(runs)}", model=MODEL, window=WINDOW)
        return session, session.prepare(history)

    ctxrules_compaction()  # tokenizer files loaded, count memo warm: what a live process has
    ours_ms, (session, result) = median_ms(ctxrules_compaction, args.reps)
    budget, counter = session.budget, session.counter
    goal = budget.tokens_at("light")

    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # never fetch the cost map
    t = time.perf_counter()
    import litellm  # only here: importing it costs seconds

    import_ms = (time.perf_counter() - t) * 1000
    litellm.suppress_debug_info = True
    litellm.utils.trim_messages(history, model=MODEL, max_tokens=goal)  # warm its tokenizer
    theirs_ms, trimmed = median_ms(
        lambda: litellm.utils.trim_messages(history, model=MODEL, max_tokens=goal), args.reps
    )

    first_user = next(m for m in history if is_real_user(m))
    last_user = next(m for m in reversed(history) if is_real_user(m))
    ours, theirs = result.messages, trimmed
    restored = expand(ours, session.vault)
    rows = [
        ("median wall time (ms)", f"{ours_ms:.1f}", f"{theirs_ms:.1f}"),
        ("tokens after (gpt-4o)", counter.count_messages(ours), counter.count_messages(theirs)),
        ("messages after", len(ours), len(theirs)),
        ("unanswered calls / orphan results", orphans(ours), orphans(theirs)),
        ("first user message kept", first_user in ours, first_user in theirs),
        ("latest user message kept", last_user in ours, last_user in theirs),
        (
            "removed messages recoverable",
            f"{len(restored)}/{len(history)} (vault)",
            f"{len(theirs)}/{len(history)} (no copy)",
        ),
    ]
    print(
        f"input: {TRANSCRIPT.name}, {len(history)} messages, "
        f"{counter.count_messages(history)} tokens; window {WINDOW}, reserve "
        f"{budget.reserve_output}, target below {goal} tokens (light); reps {args.reps}"
    )
    print(f"{'':36s} {'ctxrules':>24s} {'litellm.trim_messages':>24s}")
    for label, a, b in rows:
        print(f"{label:36s} {a!s:>24s} {b!s:>24s}")
    print(f"(import litellm took {import_ms:.0f} ms; ctxrules never imports it for this)")
    print("\nctxrules stages (one run):")
    for stage in result.report["stages"]:
        if stage["ran"] and (stage["tokens_saved"] or stage["ms"] > 1):
            print(f"  {stage['id']:12s} {stage['ms']:8.1f} ms  saved {stage['tokens_saved']:7d}")
    return 0 if within else 1


def _on_tmpfs(path: Path) -> bool:
    """Whether ``path`` lies on a memory-backed file system (from /proc/mounts; Linux)."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return False
    best, kind = "", ""
    resolved = str(path.resolve())
    for line in mounts:
        fields = line.split()
        inside = len(fields) >= 3 and (resolved == fields[1] or resolved.startswith(fields[1].rstrip("/") + "/"))
        if inside and len(fields[1]) > len(best):
            best, kind = fields[1], fields[2]
    return kind in ("tmpfs", "ramfs")


if __name__ == "__main__":
    sys.exit(main())
