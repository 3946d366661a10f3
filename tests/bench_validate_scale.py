"""Benchmark: validation time against pack size (it must grow linearly).

Run it from anywhere::

    python tests/bench_validate_scale.py [--rules 2500] [--files 4] [--ring 1000]

It writes packs of N and 4N priority rules (one file each), and a chain of F files that extend
each other with N rules each, then times ``ctxrules validate`` on each in a fresh process. The
baseline, measured in the same run, is the smallest pack: the 4N pack should take about four
times as long (a quadratic step would make it sixteen), and the chain about F times as long.
Then a folder of R packs that extend each other in one ring (each is CR031), and a folder of R
packs each extending the next in a chain, against a folder of R packs that extend nothing,
measured in the same run: about as long (each pack walking the whole ring made it R/2 times as
long: 125 s for 2,000 files; each pack spelling out its whole chain, 35 s for 5,000).
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
    head = ["apiVersion: ctxrules/v1", "kind: RulePack", f"metadata: {{name: {path.stem}, version: 1.0.0}}"]
    head += [f"extends: ./{parent}"] if parent else []
    path.write_text("\n".join([*head, "priorities:", *_rules(start, count)]) + "\n", encoding="utf-8")
    return path


def _time(path: Path, status: int = 0) -> float:
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
    if proc.returncode != status:
        raise SystemExit(f"validate failed on {path.name}: {proc.stdout[-400:]}{proc.stderr[-400:]}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rules", type=int, default=2500)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--ring", type=int, default=1000)
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
        lone, ring, line = root / "lone", root / "ring", root / "line"
        last = args.ring - 1
        for folder, parent in (
            (lone, None),
            (ring, lambda i: f"r{(i + 1) % args.ring}.yaml"),
            (line, lambda i: f"r{i + 1}.yaml" if i < last else None),
        ):
            folder.mkdir()
            for i in range(args.ring):
                _write(folder / f"r{i}.yaml", 0, 1, parent(i) if parent else None)
        alone = _time(lone)
        ringed = _time(ring, status=1)
        lined = _time(line)
    print(f"validate, {n:,} rules (baseline):      {base:7.2f} s")
    print(f"validate, {4 * n:,} rules in one file:  {four:7.2f} s  ({four / base:4.1f} x; linear ~ 4)")
    print(f"validate, {files} files x {n:,} rules:    {chained:7.2f} s  ({chained / base:4.1f} x; linear ~ {files})")
    print(f"validate, {args.ring:,} packs (baseline):    {alone:7.2f} s")
    print(f"validate, {args.ring:,} packs in a ring:     {ringed:7.2f} s  ({ringed / alone:4.1f} x; linear ~ 1)")
    print(f"validate, {args.ring:,} packs in a chain:    {lined:7.2f} s  ({lined / alone:4.1f} x; linear ~ 1)")


if __name__ == "__main__":
    main()
