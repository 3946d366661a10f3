"""Benchmark: the request codecs on huge turns, next to ``json.loads`` of the same body.

Run it from anywhere::

    python tests/bench_formats.py [--sizes 10000,50000,100000]

For each size N it builds the bodies a codec meets at its worst: one assistant turn of N
``tool_use`` blocks answered by one user turn of N ``tool_result`` blocks (also with a text
before each call, the layout the encoder rebuilds), N user messages in a row (one turn once
encoded), N tool results taking turns with user texts, and the OpenAI form of N parallel calls
(results in order and reversed). It times decoding, encoding and validating each, and prints
the time of ``json.loads`` of the body, measured in the same run: a codec step should stay a
small multiple of it at every size (a quadratic one grows its multiple with N). Timings are
machine-dependent and reported, not asserted.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))

from ctxrules.formats import anthropic, openai


def _best(step: Callable[[], object], runs: int = 3) -> float:
    """The fastest of ``runs`` timings (collection off, as the noise of a shared machine
    only ever adds time)."""
    best = float("inf")
    for _ in range(runs):
        gc.collect()
        gc.disable()
        try:
            started = time.perf_counter()
            step()
            best = min(best, time.perf_counter() - started)
        finally:
            gc.enable()
    return best


def _calls(n: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    uses = [{"type": "tool_use", "id": f"toolu_{i}", "name": "read", "input": {"path": f"f{i}"}} for i in range(n)]
    results = [{"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": f"line {i}"} for i in range(n)]
    return uses, results


def _cases(n: int) -> Iterator[tuple[str, Any, Callable[[Any], object]]]:
    """(what, body, step) for size ``n``; the step gets the parsed body."""
    uses, results = _calls(n)
    parallel = {"model": "m", "max_tokens": 5, "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": uses},
        {"role": "user", "content": [*results, {"type": "text", "text": "and now?"}]},
    ]}  # fmt: skip
    yield "anthropic decode, parallel calls", parallel, anthropic.decode
    yield "anthropic decode+encode, parallel calls", parallel, _round_trip
    yield "anthropic validate, parallel calls", parallel, anthropic.validate
    interleaved = [block for use in uses for block in ({"type": "text", "text": "next"}, use)]
    mixed = {**parallel, "messages": [parallel["messages"][0], {"role": "assistant", "content": interleaved}]}
    mixed["messages"].append(parallel["messages"][2])
    yield "anthropic decode+encode, text before each call", mixed, _round_trip
    users = [{"role": "user", "content": f"message {i}"} for i in range(n)]
    yield "anthropic encode, user messages in a row", users, anthropic.encode
    taking_turns: list[dict[str, Any]] = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": _openai_calls(n)},
    ]
    for i in range(n):
        taking_turns += [
            {"role": "tool", "tool_call_id": f"call_{i}", "content": "ok"},
            {"role": "user", "content": "u"},
        ]
    yield "anthropic encode, results and texts taking turns", taking_turns, anthropic.encode
    answers = [{"role": "tool", "tool_call_id": f"call_{i}", "content": "ok"} for i in range(n)]
    ordered = taking_turns[:2] + answers
    yield "openai validate, parallel calls", ordered, openai.validate
    yield "openai validate, results reversed", taking_turns[:2] + answers[::-1], openai.validate


def _openai_calls(n: int) -> list[dict[str, Any]]:
    return [{"id": f"call_{i}", "type": "function", "function": {"name": "read", "arguments": "{}"}} for i in range(n)]


def _round_trip(body: Any) -> object:
    decoded = anthropic.decode(body)
    return anthropic.encode(decoded.messages, decoded.tools, decoded.request)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10000,50000,100000", help="comma-separated block counts")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"{'step':50} {'blocks':>8} {'codec s':>9} {'json.loads s':>13} {'x loads':>8}")
    for n in sizes:
        for what, body, step in _cases(n):
            text = json.dumps(body)
            parsed = json.loads(text)  # the steps change nothing they are given
            loads = _best(lambda: json.loads(text))  # noqa: B023 (called at once)
            took = _best(lambda: step(parsed))  # noqa: B023
            print(f"{what:50} {n:>8,} {took:9.3f} {loads:13.3f} {took / loads:8.1f}")


if __name__ == "__main__":
    main()
