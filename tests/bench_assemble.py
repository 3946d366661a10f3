"""Benchmark: first vs repeat (cached) prompt assembly, and the cost of cache.markers per call.

Run: ``PYTHONPATH=engine python tests/bench_assemble.py``. Prints numbers and the baseline they
are compared with, measured in the same run (no fixed targets: machines differ).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))

from ctxrules.packs.validated import load_pack
from ctxrules.plugins import default_registry
from ctxrules.prompts.assemble import assemble, clear_cache, prompt_set


def timed(fn, n: int) -> list[float]:  # type: ignore[no-untyped-def]
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e6)
    return out


def main() -> None:
    pack = load_pack("builtin:default")
    ps = prompt_set(pack, default_registry())
    combos = [(m, e) for m in ps.mode_names() for e in [*ps.entry_ids(), None]]

    # First assembly: a fresh PromptSet (template files read, Jinja compiled) and an empty cache.
    def cold() -> None:
        clear_cache()
        for mode, entry in combos:
            assemble(pack, mode=mode, entry=entry)

    cold_us = timed(cold, 5)
    per_cold = statistics.median(cold_us) / len(combos)

    # Render only (templates compiled, cache bypassed): what a miss costs once warmed up.
    ps = prompt_set(pack, default_registry())
    variables = ps.effective_variables({"agent_name": "Ada"})

    def render_all() -> None:
        for m, e in combos:
            ps.render(m, ps.entry(e) if e else None, variables)

    render_us = timed(render_all, 20)
    per_render = statistics.median(render_us) / len(combos)

    # Repeat: the same inputs again, answered from the cache.
    for mode in ps.mode_names():
        assemble(pack, mode=mode, model="claude-sonnet-4-5", variables={"agent_name": "Ada"})
    repeat_us = timed(
        lambda: assemble(pack, mode="full", model="claude-sonnet-4-5", variables={"agent_name": "Ada"}),
        20_000,
    )
    per_repeat = statistics.median(repeat_us)

    # Baseline measured here: a dict lookup with an equivalent tuple key.
    key = ("x" * 64, "full", "claude", '{"agent_name":"Ada","agent_role":"..."}')
    table = {key: 1}
    base_us = statistics.median(timed(lambda: table.get(key), 20_000))

    print(f"prompts: {len(combos)} mode x entry combinations of builtin:default")
    print(f"first assembly (read + compile + render), per prompt: {per_cold:9.1f} us")
    print(f"render only (compiled, cache bypassed),   per prompt: {per_render:9.1f} us")
    print(f"repeat assembly (cache hit),              per prompt: {per_repeat:9.2f} us")
    print(f"baseline: a bare dict lookup                          : {base_us:9.2f} us")
    print(
        f"repeat is {per_cold / per_repeat:,.0f}x cheaper than first, "
        f"{per_render / per_repeat:,.0f}x cheaper than a render"
    )


if __name__ == "__main__":
    main()
