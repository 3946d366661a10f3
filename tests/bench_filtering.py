"""Benchmark: the filtering stages (thinking, media, tool outputs, ttl) over the whole corpus.

    PYTHONPATH=engine python tests/bench_filtering.py

For every real transcript, each stage runs directly (a StageContext with the session's counter
and a fresh vault) at a high utilization (0.8, so every rule is live) and then again on its own
output (the steady state: nothing left to do). The baseline, measured in the same run on the
same input, is one token count of the whole history with a cold memo: the least work any
stage that looks at sizes must do. Reported: total and worst transcript per stage, cold and on
its own output, next to the baseline, plus tokens saved. Target: a stage's run on its own
output costs less than the baseline count (the steady state must not redo work).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "engine"))
sys.path.insert(0, str(HERE))
REPS = 3


def _ms(fn: Any) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(REPS):
        t = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times), result


def _cold_count(counter: Any, history: list[dict[str, Any]]) -> int:
    counter.clear_memo()
    return int(counter.count_messages(history))


def main() -> int:
    from conftest import transcript_paths
    from filtering_kit import make_ctx

    from ctxrules.stages.media_window import MediaWindow
    from ctxrules.stages.thinking_clean import ThinkingClean
    from ctxrules.stages.tool_output_filter import ToolOutputFilter
    from ctxrules.stages.ttl_prune import TtlPrune

    stages = {
        "thinking.clean": ThinkingClean({}),
        "media.window": MediaWindow({}),
        "tool_output.filter": ToolOutputFilter({}),
        "ttl.prune": TtlPrune({}),
    }
    totals: dict[str, list[float]] = {name: [0.0, 0.0, 0.0, 0] for name in stages}  # type: ignore[misc]
    worst: dict[str, tuple[float, str]] = {name: (0.0, "") for name in stages}
    baseline_total = 0.0
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for path in transcript_paths():
            history = json.loads(path.read_text())
            probe = make_ctx(Path(tmp) / "probe", model="gpt-4o")

            base_ms, _ = _ms(lambda h=history, c=probe.counter: _cold_count(c, h))
            baseline_total += base_ms
            for name, stage in stages.items():
                ctx = make_ctx(Path(tmp) / path.stem / name, model="gpt-4o", utilization=0.8, tier="full")
                first = stage(history, ctx)
                cold_ms, _ = _ms(lambda s=stage, c=ctx, h=history: s(h, c))
                warm_ms, again = _ms(lambda s=stage, c=ctx, o=first.messages: s(o, c))
                saved = sum(a.tokens_saved for a in first.actions)
                row = totals[name]
                row[0] += cold_ms
                row[1] += warm_ms
                row[3] += saved
                if cold_ms > worst[name][0]:
                    worst[name] = (cold_ms, path.stem)
                if [a for a in again.actions if a.kind != "hot_cache_bypass"]:
                    print(f"  ! {name} changed its own output on {path.stem}")
                    failed = True
                row[2] = max(row[2], warm_ms / base_ms if base_ms else 0.0)
        failed |= _synthetic(Path(tmp))
    n = len(transcript_paths())
    print(f"corpus: {n} transcripts; baseline (one cold token count of each history): {baseline_total:.1f} ms in total")
    print(
        f"{'stage':20} {'cold ms':>9} {'own output ms':>14} {'worst own/base':>15} "
        f"{'tokens saved':>13}  slowest transcript"
    )
    for name, (cold, warm, ratio, saved) in totals.items():
        print(
            f"{name:20} {cold:9.1f} {warm:14.1f} {ratio:15.2f} {int(saved):13d}  "
            f"{worst[name][1]} ({worst[name][0]:.1f} ms)"
        )
        if ratio >= 1.0:
            print(f"  ! {name}: a run on its own output costs more than the baseline count")
            failed = True
    return 1 if failed else 0


def _synthetic(tmp: Path) -> bool:
    """The corpus has no thinking and no images: the largest transcript with Anthropic thinking
    on every assistant message, and with a screenshot in every tool result."""
    from conftest import transcript_paths
    from filtering_kit import data_url, make_ctx, png_bytes

    from ctxrules.stages.media_window import MediaWindow
    from ctxrules.stages.thinking_clean import ThinkingClean

    path = max(transcript_paths(), key=lambda p: len(json.loads(p.read_text())))
    history = json.loads(path.read_text())
    thinking = [
        {
            **m,
            "reasoning_content": f"thought {i}",
            "thinking_blocks": [{"type": "thinking", "thinking": f"thought {i}", "signature": f"sig{i}"}],
        }
        if m["role"] == "assistant"
        else m
        for i, m in enumerate(history)
    ]
    shot = data_url(png_bytes(320, 200))
    media = [
        {**m, "content": [{"type": "text", "text": m["content"]}, {"type": "image_url", "image_url": {"url": shot}}]}
        if m["role"] == "tool"
        else m
        for m in history
    ]
    failed = False
    print(f"synthetic shapes on {path.stem} ({len(history)} messages):")
    for label, stage, msgs, model in (
        ("thinking.clean (anthropic)", ThinkingClean({}), thinking, "claude-sonnet-4-5"),
        ("media.window", MediaWindow({}), media, "gpt-4o"),
    ):
        probe = make_ctx(tmp / "probe-syn", model=model)

        base_ms, _ = _ms(lambda h=msgs, c=probe.counter: _cold_count(c, h))
        ctx = make_ctx(tmp / label.split()[0], model=model)
        first = stage(msgs, ctx)
        cold_ms, _ = _ms(lambda s=stage, c=ctx, m=msgs: s(m, c))
        warm_ms, again = _ms(lambda s=stage, c=ctx, o=first.messages: s(o, c))
        saved = sum(a.tokens_saved for a in first.actions)
        print(
            f"  {label:28} cold {cold_ms:7.1f} ms, own output {warm_ms:7.1f} ms, baseline count "
            f"{base_ms:7.1f} ms, {len(first.actions)} actions, {saved} tokens saved"
        )
        if again.actions or warm_ms >= base_ms:
            print(f"  ! {label}: not idempotent or slower than the baseline on its own output")
            failed = True
    return failed


if __name__ == "__main__":
    raise SystemExit(main())
