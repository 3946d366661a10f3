"""Benchmark: the wall time of the README's Quick start command on a warm session.

    python tests/bench_startup.py [--runs 9]

Runs, as fresh processes, the Quick start ``ctxrules run --pack builtin:default --model gpt-4o
--window 32000 --input rules/examples/agent-session.json ...`` against one session directory
that a first (untimed) run made warm, so every timed run reuses the previous compaction: what
a user who runs the command again pays, which is mostly start-up. Interleaved in the same run,
the same number of ``python -c "import yaml, jsonschema, jinja2"`` processes (the libraries any
pack load needs) are timed as the baseline. Prints both medians, their ratio, and whether the
command stays within the goal of 0.8 s; then the heaviest top-level imports of one run
(``python -X importtime``) and whether the run loaded litellm (it must not).

Not a pytest test: timings depend on the machine and are reported, not asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GOAL_S = 0.8
EXAMPLE = REPO / "rules" / "examples" / "agent-session.json"


def _env() -> dict[str, str]:
    # Without PYTHONDONTWRITEBYTECODE: the warm-up run writes ctxrules's .pyc files, as the first
    # run of an installed ctxrules does (else every run would compile the changed modules again).
    dropped = ("CTXRULES_DEBUG", "CTXRULES_LOG", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    paths = (str(REPO / "engine"), env.get("PYTHONPATH"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


def _command(work: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "ctxrules.cli.main",
        "run",
        "--pack",
        "builtin:default",
        "--model",
        "gpt-4o",
        "--window",
        "32000",
        "--input",
        str(EXAMPLE),
        "--output",
        str(work / "compacted.json"),
        "--report",
        str(work / "report.json"),
        "--explain",
        "--state",
        str(work / "state"),
    ]


def _time(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    return time.perf_counter() - start, proc


def _heaviest_imports(argv: list[str], env: dict[str, str], cwd: Path, top: int = 8) -> tuple[list[str], bool]:
    proc = subprocess.run(
        [argv[0], "-X", "importtime", *argv[1:]], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    rows: list[tuple[int, str]] = []
    litellm = False
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line.removeprefix("import time:").split("|")
        litellm = litellm or name.strip().split(".")[0] == "litellm"
        if not name.startswith("  "):
            rows.append((int(cumulative), name.strip()))
    return [f"{us / 1000:7.1f} ms  {name}" for us, name in sorted(rows, reverse=True)[:top]], litellm


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=9, help="fresh processes of each kind")
    args = parser.parse_args(argv)
    env = _env()
    floor = [sys.executable, "-c", "import yaml, jsonschema, jinja2"]
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        work = Path(tmp)
        command = _command(work)
        _, first = _time(command, env, work)  # makes the session warm (and the .pyc files)
        if first.returncode != 0:
            print(f"FAIL: the Quick start command exited {first.returncode}\n{first.stderr}")
            return 1
        _time(floor, env, work)
        runs: list[float] = []
        floors: list[float] = []
        for _ in range(args.runs):
            t, _ = _time(floor, env, work)
            floors.append(t)
            t, proc = _time(command, env, work)
            if proc.returncode != 0:
                print(f"FAIL: the Quick start command exited {proc.returncode}\n{proc.stderr}")
                return 1
            if "reused the previous compaction" not in proc.stdout:
                print("FAIL: the session was not warm (the previous compaction was not reused)")
                return 1
            runs.append(t)
        imports, litellm = _heaviest_imports(command, env, work)
    med_run, med_floor = statistics.median(runs), statistics.median(floors)
    print(f"python {sys.version.split()[0]}, {args.runs} fresh processes each, warm session")
    print(f"{'':46} {'median':>8} {'min':>8} {'max':>8}")
    for label, ts in (("ctxrules run (Quick start, warm session)", runs), (" ".join(floor[1:]), floors)):
        print(f"{label:46} {statistics.median(ts):7.3f}s {min(ts):7.3f}s {max(ts):7.3f}s")
    within = med_run <= GOAL_S
    print(f"run / import floor = {med_run / med_floor:.2f}; goal: run <= {GOAL_S} s: {'OK' if within else 'MISSED'}")
    print("heaviest top-level imports of one run (cumulative):")
    for row in imports:
        print(f"  {row}")
    if litellm:
        print("FAIL: the run imported litellm")
        return 1
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
