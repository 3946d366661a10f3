"""Benchmark: ``ctxrules eval`` on long transcripts, against one ``prepare`` of the same messages.

    python tests/bench_eval.py

Synthetic transcripts of 1,000, 2,000 and 5,000 small messages (a system prompt, then user and
assistant in turns: 2,500 calls at 5,000 messages, every one below the pack's first threshold
with gpt-4o) are replayed through ``builtin:default`` by ``ctxrules eval``, in this process.
Beside each replay: one ``prepare`` of the whole transcript in a fresh session, timed in the
same run, so a loaded machine slows both. A replay makes one call per assistant message, each on
a history that grows by two messages; when each call did Python work for its whole history, the
replay grew with the square of the length (5,000 messages: 22 s). Goal: 5,000 messages replayed
in under :data:`GOAL_S` seconds; exits 1 when missed.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "engine"))

SIZES = (1000, 2000, 5000)
GOAL_S = 5.0


def chat(n: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "You are a helpful assistant."}]
    for i in range(n - 1):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"})
    return messages


def main() -> int:
    from ctxrules import Engine
    from ctxrules.cli.main import run as cli_run

    engine = Engine.load("builtin:default")
    with tempfile.TemporaryDirectory() as tmp:  # the tokenizer and the stages loaded, untimed
        engine.session(Path(tmp), model="gpt-4o").prepare(chat(20))
    missed = False
    print(f"{'messages':>8}  {'calls':>5}  {'eval s':>7}  {'ms/call':>7}  {'1 prepare ms':>12}  {'eval/prepare':>12}")
    with tempfile.TemporaryDirectory() as tmp:
        for n in SIZES:
            messages = chat(n)
            path = Path(tmp) / f"chat{n}.json"
            path.write_text(json.dumps(messages))
            session = engine.session(Path(tmp) / f"session{n}", model="gpt-4o")
            started = time.perf_counter()
            session.prepare(messages)
            prepare_s = time.perf_counter() - started
            calls = sum(1 for i, m in enumerate(messages) if m["role"] == "assistant" and i > 0)
            started = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):
                code = cli_run(["eval", "--pack", "builtin:default", "--model", "gpt-4o", "--quiet", str(path)])
            eval_s = time.perf_counter() - started
            if code != 0:
                print(f"ctxrules eval exited {code} on {n} messages", file=sys.stderr)
                return 1
            print(
                f"{n:>8}  {calls:>5}  {eval_s:>7.2f}  {eval_s * 1000 / calls:>7.2f}  "
                f"{prepare_s * 1000:>12.1f}  {eval_s / prepare_s:>12.0f}"
            )
            if n == SIZES[-1] and eval_s >= GOAL_S:
                missed = True
    if missed:
        print(f"goal missed: {SIZES[-1]} messages replayed in {GOAL_S:g} s or more", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
