"""Benchmark: a full compaction of the largest transcript at a 32K window, next to
``litellm.utils.trim_messages`` on the same input, in the same run.

    python tests/bench_compaction.py [--reps N]

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()

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
    return 0


if __name__ == "__main__":
    sys.exit(main())
