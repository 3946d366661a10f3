"""Benchmark: validation time against pack size (it must grow linearly).

Run it from anywhere::

    python tests/bench_validate_scale.py [--rules 2500] [--files 4]

It writes packs of N and 4N priority rules (one file each), and a chain of F files that extend
each other with N rules each, then times ``ctxrules validate`` on each in a fresh process. The
baseline, measured in the same run, is the smallest pack: the 4N pack should take about four
times as long (a quadratic step would make it sixteen), and the chain about F times as long.
Timings are machine-dependent and reported, not asserted.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _rules(start: int, count: int) -> list[str]:
    return [f"  - {{id: r{k}, match: {{contains: 'err{k}'}}, priority: critical}}" for k in range(start, start + count)]


def _write(path: Path, start: int, count: int, parent: str | None = None) -> Path:
    head = ["apiVersion: ctxrules/v1", "kind: RulePack"] + ([f"extends: ./{parent}"] if parent else [])
    path.write_text("\n".join([*head, "priorities:", *_rules(start, count)]) + "\n", encoding="utf-8")
    return path


def _time(path: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(REPO / "engine")}
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "ctxrules.cli.main", "validate", str(path)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    took = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"validate failed on {path.name}: {proc.stdout[-400:]}{proc.stderr[-400:]}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rules", type=int, default=2500)
    parser.add_argument("--files", type=int, default=4)
    args = parser.parse_args()
    n, files = args.rules, args.files
    with tempfile.TemporaryDirectory(prefix="ctxrules-bench-") as tmp:
        root = Path(tmp)
        small = _write(root / "small.yaml", 0, n)
        big = _write(root / "big.yaml", 0, 4 * n)
        chain = None
        for f in range(files):
            chain = _write(root / f"c{f}.yaml", f * n, n, f"c{f - 1}.yaml" if f else None)
        assert chain is not None
        base = _time(small)
        four = _time(big)
        chained = _time(chain)
    print(f"validate, {n:,} rules (baseline):      {base:7.2f} s")
    print(f"validate, {4 * n:,} rules in one file:  {four:7.2f} s  ({four / base:4.1f} x; linear ~ 4)")
    print(f"validate, {files} files x {n:,} rules:    {chained:7.2f} s  ({chained / base:4.1f} x; linear ~ {files})")


if __name__ == "__main__":
    main()
