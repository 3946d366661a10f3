"""Benchmark: ``ctxrules validate rules/`` in a fresh process, next to the import floor.

Run it from anywhere::

    python tests/bench_validate.py [--runs 15]

It times N fresh processes of ``ctxrules validate rules/`` and, interleaved in the same run,
N of ``python -c "import yaml, jsonschema, jinja2"`` (what validation cannot go below: the YAML
parser, the schema validator and the template engine it checks prompts with), and prints both
medians and their ratio (goal: at most 2; a miss prints FAIL and exits 1). It then runs
validate once more, in-process inside a fresh interpreter, and fails (prints FAIL, exits 1)
when validation imported litellm, tiktoken or tokenizers: validating a pack must never pay
for a model registry or a tokenizer.

Not a pytest test (the name does not start with ``test_``): timings are machine-dependent
and are reported, not asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FORBIDDEN = ("litellm", "tiktoken", "tokenizers")
GOAL_RATIO = 2.0

_PROBE = """
import contextlib, io, json, sys
from ctxrules.cli.main import run
with contextlib.redirect_stdout(io.StringIO()):
    code = run(["validate", "rules/"])
heavy = sorted({{m.split(".")[0] for m in sys.modules}} & set({forbidden!r}))
print(json.dumps({{"exit": code, "modules": len(sys.modules), "forbidden": heavy}}))
"""


# Where one fresh process spends its time, by phase (the floor's own imports first, so that
# what follows is ctxrules' share).
_PHASES = """
import time
t0 = time.perf_counter()
import yaml, jsonschema, jinja2
t1 = time.perf_counter()
from ctxrules.cli import validate as verb
from ctxrules.validation.validate import validate_paths
t2 = time.perf_counter()
from ctxrules.plugins import default_registry
registry = default_registry()
t3 = time.perf_counter()
validate_paths(["rules/"], registry)
t4 = time.perf_counter()
print(round((t1 - t0) * 1000, 1), round((t2 - t1) * 1000, 1), round((t3 - t2) * 1000, 1), round((t4 - t3) * 1000, 1))
"""
_PHASE_NAMES = (
    "the floor's imports (yaml, jsonschema, jinja2)",
    "ctxrules' imports for validate",
    "plugin registry (imports every stage and action module)",
    "reading, resolving and checking the 18 files",
)


def _phases(env: dict[str, str], runs: int = 5) -> list[float]:
    """The fastest of ``runs`` fresh processes for each phase, in milliseconds."""
    best = [float("inf")] * len(_PHASE_NAMES)
    for _ in range(runs):
        proc = subprocess.run(
            [sys.executable, "-c", _PHASES], cwd=REPO, env=env, capture_output=True, text=True, check=True
        )
        best = [min(b, float(x)) for b, x in zip(best, proc.stdout.split(), strict=True)]
    return best


def _env() -> dict[str, str]:
    # PYTHONDONTWRITEBYTECODE would make every run compile ctxrules from source (the libraries
    # of the floor have their .pyc files from pip): the warm-up run writes them, as any first
    # run of an installed ctxrules does.
    env = {k: v for k, v in os.environ.items() if k not in ("CTXRULES_DEBUG", "PYTHONDONTWRITEBYTECODE")}
    paths = (str(REPO / "engine"), env.get("PYTHONPATH"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


def _time(argv: list[str], env: dict[str, str]) -> tuple[float, int, str]:
    start = time.perf_counter()
    proc = subprocess.run(
        argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False
    )
    return time.perf_counter() - start, proc.returncode, proc.stderr


def _heaviest_imports(env: dict[str, str], top: int = 8) -> list[tuple[int, str]]:
    """The slowest imports of one validate run (cumulative microseconds), from -X importtime."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "ctxrules.cli.main", "validate", "rules/"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    rows = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line.removeprefix("import time:").split("|")
        if not name.startswith("  "):  # top level: imported by ctxrules itself, not by a library
            rows.append((int(cumulative), name.strip()))
    return sorted(rows, reverse=True)[:top]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="fresh processes of each kind")
    args = parser.parse_args(argv)
    env = _env()

    validate = [sys.executable, "-m", "ctxrules.cli.main", "validate", "rules/"]
    floor = [sys.executable, "-c", "import yaml, jsonschema, jinja2"]
    # one warm-up of each (file-system cache, .pyc files), then interleave to share any drift
    for cmd in (floor, validate):
        _time(cmd, env)
    times: dict[str, list[float]] = {"validate": [], "floor": []}
    for _ in range(args.runs):
        t, code, err = _time(floor, env)
        times["floor"].append(t)
        t, code, err = _time(validate, env)
        if code != 0:
            print(f"FAIL: `ctxrules validate rules/` exited {code}\n{err}")
            return 1
        times["validate"].append(t)

    probe = subprocess.run(
        [sys.executable, "-c", _PROBE.format(forbidden=FORBIDDEN)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        print(f"FAIL: the import probe crashed\n{probe.stderr}")
        return 1
    found = json.loads(probe.stdout.strip().splitlines()[-1])

    med_v, med_f = statistics.median(times["validate"]), statistics.median(times["floor"])
    print(f"python {sys.version.split()[0]} on {sys.platform}, {args.runs} fresh processes each")
    print(f"{'':44} {'median':>8} {'min':>8} {'max':>8}")
    rows = (("ctxrules validate rules/", "validate"), ('python -c "import yaml, jsonschema, jinja2"', "floor"))
    for label, key in rows:
        ts = times[key]
        print(f"{label:44} {statistics.median(ts) * 1000:7.0f}ms {min(ts) * 1000:7.0f}ms {max(ts) * 1000:7.0f}ms")
    ratio = med_v / med_f
    print(
        f"validate costs {ratio:.2f}x the import floor "
        f"(+{(med_v - med_f) * 1000:.0f} ms); {found['modules']} modules loaded; "
        f"goal <= {GOAL_RATIO}: {'OK' if ratio <= GOAL_RATIO else 'MISSED'}"
    )
    print("where one process spends it (fastest of 5 fresh processes, in-process timers):")
    for name, ms in zip(_PHASE_NAMES, _phases(env), strict=True):
        print(f"  {ms:7.1f} ms  {name}")
    print("heaviest top-level imports (cumulative):")
    for micros, name in _heaviest_imports(env):
        print(f"  {micros / 1000:7.1f} ms  {name}")
    if found["forbidden"]:
        print("FAIL: validate imported " + ", ".join(found["forbidden"]))
        return 1
    if found["exit"] != 0:
        print(f"FAIL: validate exited {found['exit']} in-process")
        return 1
    print("OK: no litellm, tiktoken or tokenizers imported")
    if ratio > GOAL_RATIO:
        print(f"FAIL: validate costs {ratio:.2f}x the import floor; the goal is at most {GOAL_RATIO}x")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
