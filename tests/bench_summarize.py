"""Benchmark: what summarization costs besides the model call.

    python tests/bench_summarize.py

1. Redaction throughput of the built-in patterns over every text of the real transcripts,
   next to the baseline of one pass of a single simple regex (``\\bsk-``) over the same texts,
   measured in the same run.
2. A compaction with the deterministic checkpoint (no model), per real transcript, at a window
   that puts it at 105% of the usable window: the summary stage's own time (from the report)
   next to the time of the whole ``prepare`` it ran in.
3. Grounding: auditing one summary against a conversation's real user messages.

Prints medians; there is no pass/fail target (the model call dominates a real summarization by
orders of magnitude), so these numbers are for spotting regressions.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "engine"))
sys.path.insert(0, str(HERE))
from conftest import TRANSCRIPTS as CORPUS  # noqa: E402  (the corpus folder: $CTXRULES_CORPUS)

SUMMARY_ONLY = HERE / "fixtures" / "summarize" / "summary-only.yaml"
REPS = 5


def median_ms(fn, reps: int = REPS) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> int:
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        os.environ.pop(var, None)  # the checkpoint path: no model is called
    from ctxrules import Engine
    from ctxrules.messages import is_real_user, message_text
    from ctxrules.redaction import default_redactor
    from ctxrules.summarize import SummaryAuditor

    paths = sorted(p for p in CORPUS.glob("*.json") if p.name != "stats.json")
    transcripts = {p.name: json.loads(p.read_text(encoding="utf-8")) for p in paths}
    texts = [message_text(m) for msgs in transcripts.values() for m in msgs]
    size_mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6

    redactor = default_redactor()
    simple = re.compile(r"\bsk-")
    full = median_ms(lambda: [redactor.redact(t) for t in texts])
    base = median_ms(lambda: [simple.sub("x", t) for t in texts])
    print(
        f"redaction: {size_mb:.1f} MB of transcript text in {full:.0f} ms "
        f"({size_mb / full * 1000:.1f} MB/s) "
        f"with {len(redactor.patterns)} patterns; baseline one simple regex {base:.0f} ms"
    )

    engine = Engine.load(str(SUMMARY_ONLY))
    print(f"\n{'transcript':48} {'msgs':>5} {'tokens':>7} {'stage ms':>9} {'prepare ms':>11} {'saved':>7}")
    for name, messages in transcripts.items():
        probe = engine.session(None, model="gpt-4o", window=10**6, session_id="probe")
        tokens = probe.counter.count_messages(messages, [])
        window = int(tokens / 1.05) + 8192
        stage_ms: list[float] = []
        prepare_ms: list[float] = []
        saved = 0
        for _ in range(3):
            with tempfile.TemporaryDirectory() as tmp:
                session = engine.session(Path(tmp) / "s", model="gpt-4o", window=window)
                started = time.perf_counter()
                result = session.prepare(messages, clock=1.0)
                prepare_ms.append((time.perf_counter() - started) * 1000)
                stage = next(s for s in result.report["stages"] if s["type"] == "summarize.structured")
                stage_ms.append(stage["ms"])
                saved = stage["tokens_saved"]
        print(
            f"{name[:48]:48} {len(messages):>5} {tokens:>7} {statistics.median(stage_ms):>9.1f} "
            f"{statistics.median(prepare_ms):>11.1f} {saved:>7}"
        )

    name, messages = max(transcripts.items(), key=lambda kv: len(kv[1]))
    users = [message_text(m) for m in messages if is_real_user(m)]
    summary = {
        "user_goal": "Continue the implementation of the ready beads tasks",
        "constraints": [],
        "active_tasks": [],
        "completed_actions": ["Ran the tests"],
        "errors": [],
        "decisions": [],
        "open_questions": [],
        "relevant_files": [],
        "key_facts": [],
        "tool_state": [],
        "pending_user_asks": ["continue implementation"],
        "risks": [],
        "blocked_items": [],
        "next_steps": [],
    }
    audit = median_ms(lambda: SummaryAuditor(users).audit(summary))
    print(f"\naudit of one summary against {len(users)} user messages of {name}: {audit:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
