"""Added latency per request of ctxrules' litellm hook: a real litellm proxy with the hook
against the same proxy without it (the baseline), same run, same fake upstream.

An agent's session is replayed as it grows: request k carries the transcript's first
``start + k * step`` messages (one session id, as a real agent sends it), plus one cold
request of the whole transcript in a fresh session. Both proxies see the same requests,
alternating, so machine load hits both alike.

    PYTHONPATH=engine python tests/bench_proxy.py [--transcript NAME] [--requests 20] [--window 32000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import transcript_paths
from proxy_kit import FakeUpstream, missing_proxy_modules, post, running_proxy, write_config

HOOK = (
    "from ctxrules.integrations.litellm import ContextHook\n\n"
    "hook = ContextHook('builtin:default', {state!r}, window={window})\n"
)


def prefix_at_step(history: list[dict], n: int) -> list[dict]:
    """The first ``n`` messages, cut back to before a dangling tool call (a request an agent sends)."""
    cut = history[:n]
    while cut and (cut[-1].get("role") == "assistant" and cut[-1].get("tool_calls")):
        cut = cut[:-1]
    return cut


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transcript", default="claudecode-ae4a77f8.json")
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--window", type=int, default=32_000)
    args = parser.parse_args()
    missing = missing_proxy_modules()
    if missing:
        print(f'skipped: the litellm proxy needs {", ".join(missing)}: pip install "ctxrules[litellm-proxy]"')
        return 0
    paths = [p for p in transcript_paths() if p.name == args.transcript]
    if not paths:
        print("skipped: the transcript corpus is absent (CTXRULES_CORPUS)")
        return 0
    history = json.loads(paths[0].read_text())
    step = max(1, (len(history) // 2) // args.requests)
    sizes = [len(history) // 2 + k * step for k in range(args.requests)]
    with tempfile.TemporaryDirectory() as tmp, FakeUpstream() as upstream:
        root = Path(tmp)
        (root / "plain").mkdir()
        (root / "hooked").mkdir()
        plain_cfg = write_config(root / "plain", upstream.url, hook=None)
        hooked_cfg = write_config(
            root / "hooked", upstream.url, hook=HOOK.format(state=str(root / "state"), window=args.window)
        )
        with running_proxy(plain_cfg) as plain, running_proxy(hooked_cfg) as hooked:
            timings: dict[str, list[float]] = {"plain": [], "hooked": []}
            sent: dict[str, list[int]] = {"plain": [], "hooked": []}
            # One warm-up request each (imports, first connection), not counted.
            for base in (plain, hooked):
                post(base, "/v1/chat/completions", {"model": "gpt-4o", "messages": history[:3]})
            for n in sizes:
                body = {"model": "gpt-4o", "messages": prefix_at_step(history, n), "litellm_session_id": "bench"}
                for name, base in (("plain", plain), ("hooked", hooked)):
                    started = time.perf_counter()
                    status, answer = post(base, "/v1/chat/completions", body)
                    timings[name].append((time.perf_counter() - started) * 1000)
                    if status != 200:
                        print(f"request failed ({name}): {status} {answer}")
                        return 1
                    sent[name].append(len(upstream.requests[-1][1]["messages"]))
            cold: dict[str, float] = {}
            for name, base in (("plain", plain), ("hooked", hooked)):
                started = time.perf_counter()
                post(
                    base,
                    "/v1/chat/completions",
                    {"model": "gpt-4o", "messages": history, "litellm_session_id": "bench-cold"},
                )
                cold[name] = (time.perf_counter() - started) * 1000
    plain_ms, hooked_ms = timings["plain"], timings["hooked"]
    added = [h - p for h, p in zip(hooked_ms, plain_ms, strict=True)]
    print(
        f"transcript {args.transcript}: {len(sizes)} requests of {sizes[0]}..{sizes[-1]} messages, "
        f"window {args.window}, one session"
    )
    print(
        f"  messages reaching the upstream: without hook {sent['plain'][-1]}, with hook {sent['hooked'][-1]} "
        f"(last request)"
    )
    print(
        f"  proxy without hook (baseline): median {statistics.median(plain_ms):8.1f} ms   "
        f"mean {statistics.mean(plain_ms):8.1f} ms"
    )
    print(
        f"  proxy with ctxrules hook:      median {statistics.median(hooked_ms):8.1f} ms   "
        f"mean {statistics.mean(hooked_ms):8.1f} ms"
    )
    print(
        f"  added per request (warm session): median {statistics.median(added):8.1f} ms   "
        f"p90 {sorted(added)[int(0.9 * (len(added) - 1))]:8.1f} ms"
    )
    print(
        f"  cold request, whole transcript ({len(history)} messages, new session): "
        f"{cold['plain']:.1f} ms without, {cold['hooked']:.1f} ms with (+{cold['hooked'] - cold['plain']:.1f} ms)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
