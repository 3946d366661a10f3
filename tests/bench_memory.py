"""Benchmark: memory and scale of the CLI, each figure next to a floor measured in the same run.

    python tests/bench_memory.py [--only NAME ...] [--mb-output 200] [--mb-message 50]

Every figure is one child process, timed by wall clock; its peak RSS comes from ``os.wait4``
(that child alone, ``ru_maxrss``; started from a small helper process, see ``_SPAWN``). The
floor beside it is the least a program could do for the same result, run the same way on the
same machine and input, so a loaded machine moves both; the goal is the one the project set
(issue 22).

- ``corpus``: ``ctxrules run`` (builtin:default, gpt-4o, 32K) on the largest transcript of
  ``$CTXRULES_CORPUS``; floor: a Python process that reads the file and counts its message
  texts with the same tokenizer. Goal: peak RSS <= 200 MB.
- ``tool-50mb`` / ``user-50mb``: one 50 MB tool result (a log) or user message (prose) in a
  short conversation, ``ctxrules run`` at 128K; floor: read and parse the file and store that
  content in a file (sha256, write, fsync), what spilling it must cost at least. Goals: <= 10 s
  and <= 300 MB.
- ``small-20k``: 20,000 short messages (a chat, and an agent loop of tool calls and results),
  ``ctxrules run`` at 128K; floor: the same run over the last 20 messages (start-up, pack
  load, one pipeline). Goal: <= 5 s.
- ``compress-200mb``: ``ctxrules compress --always -- cat FILE`` on a 200 MB log with failure
  lines in its middle; floors: ``cat FILE`` into a file through sha256 and fsync ("into the
  vault"), plus ``ctxrules compress --command cat --input W`` on W = the head and tail windows
  the rules see (the compressor's own work). Goal: peak RSS <= 200 MB, time <= the two floors
  together (ratio <= 1). The run and its floors take turns ``--reps`` times (medians).
- ``empty-lines-8mb`` / ``short-lines-8mb``: ``ctxrules compress --command make --input F`` on
  8 MB of empty (or two-byte) lines; floor: F through sha256 into a fsynced file. Goal: peak
  RSS <= 200 MB (an output spills by lines as well as by bytes).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from conftest import TRANSCRIPTS  # noqa: E402  (the corpus folder: $CTXRULES_CORPUS)

ENV = {**os.environ, "PYTHONPATH": str(REPO / "engine")}
for _key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "CTXRULES_DEBUG"):
    ENV.pop(_key, None)
CLI = [sys.executable, "-m", "ctxrules.cli.main"]


# The child is started from this small process, not from the benchmark: on Linux a child's
# ru_maxrss starts from the RSS of the process it was forked from, and the benchmark holds the
# inputs it generated.
_SPAWN = """
import json, os, subprocess, sys, time
report, argv = sys.argv[1], sys.argv[2:]
started = time.perf_counter()
proc = subprocess.Popen(argv)
_, status, usage = os.wait4(proc.pid, 0)
elapsed = time.perf_counter() - started
with open(report, "w") as out:
    json.dump([elapsed, usage.ru_maxrss, os.waitstatus_to_exitcode(status)], out)
"""


def measure(
    argv: list[str], *, stdout: int | None = subprocess.DEVNULL, stdin: int | None = None
) -> tuple[float, float]:
    """(wall seconds, peak RSS in MB) of one child process."""
    with tempfile.TemporaryFile() as err, tempfile.NamedTemporaryFile(suffix=".json") as report:
        subprocess.run(
            [sys.executable, "-c", _SPAWN, report.name, *argv],
            env=ENV,
            stdout=stdout,
            stderr=err,
            stdin=stdin,
            check=False,
        )
        elapsed, maxrss, code = json.loads(Path(report.name).read_text(encoding="utf-8"))
        if code not in (0, 1):
            err.seek(0)
            message = err.read().decode(errors="replace")[-2000:]
            raise SystemExit(f"{' '.join(argv[:6])}... exited {code}: {message}")
    return elapsed, maxrss / 1024


def row(name: str, what: str, value: float, floor: float | None, goal: float | None, unit: str) -> None:
    ratio = f"{value / floor:6.2f}x" if floor else "      -"
    goal_text = f"{goal:8.1f}" if goal is not None else "       -"
    floor_text = f"{floor:8.2f}" if floor is not None else "       -"
    verdict = "" if goal is None else ("ok" if value <= goal else "OVER")
    print(f"{name:<16} {what:<10} {value:9.2f} {unit:<3} {floor_text} {ratio} {goal_text}  {verdict}")


def header() -> None:
    print(f"{'case':<16} {'figure':<10} {'value':>9} {'':<3} {'floor':>8} {'ratio':>7} {'goal':>8}")


# --- inputs ----------------------------------------------------------------------------------


def big_tool(path: Path, mb: int) -> None:
    line = "2026-12-01T10:00:00Z INFO worker[%d] processed item %d status=ok latency=%dms path=/srv/m_%d.py\n"
    parts, size, i = [], 0, 0
    while size < mb * 1_000_000:
        s = line % (i % 8, i, i % 997, i % 50)
        parts.append(s)
        size += len(s)
        i += 1
    call = {"id": "call_1", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "./job.sh"}'}}
    msgs = [
        {"role": "user", "content": "Run the job and tell me what failed."},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "".join(parts)},
        {"role": "assistant", "content": "The job ran."},
        {"role": "user", "content": "Summarize it."},
    ]
    path.write_text(json.dumps(msgs), encoding="utf-8")


def big_user(path: Path, mb: int) -> None:
    words = ["lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit", "sed", "do", "tempor"]
    rnd = random.Random(1)
    parts, size = [], 0
    while size < mb * 1_000_000:
        s = " ".join(rnd.choice(words) for _ in range(12)) + "\n"
        parts.append(s)
        size += len(s)
    msgs = [
        {"role": "user", "content": "".join(parts)},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "What did I paste?"},
    ]
    path.write_text(json.dumps(msgs), encoding="utf-8")


def small_chat(path: Path, n: int) -> None:
    msgs = []
    for i in range(n // 2):
        msgs.append({"role": "user", "content": f"Question {i}: what is {i} plus {i}?"})
        msgs.append({"role": "assistant", "content": f"{i} plus {i} is {2 * i}."})
    path.write_text(json.dumps(msgs), encoding="utf-8")


def small_agent(path: Path, n: int) -> None:
    msgs: list[dict[str, object]] = [{"role": "user", "content": "Fix the failing tests in the repo."}]
    i = 0
    while len(msgs) < n:
        cid = f"call_{i}"
        args = json.dumps({"command": f"pytest -q tests/test_{i % 40}.py"})
        msgs.append(
            {
                "role": "assistant",
                "content": f"Step {i}: running the tests of module {i % 40}.",
                "tool_calls": [{"id": cid, "type": "function", "function": {"name": "Bash", "arguments": args}}],
            }
        )
        msgs.append({"role": "tool", "tool_call_id": cid, "content": f"{i % 7} passed, {i % 3} failed in 0.{i % 9}s"})
        i += 1
    msgs = [*msgs[: n - 1], {"role": "user", "content": "Where are we?"}]
    path.write_text(json.dumps(msgs), encoding="utf-8")


def big_log(path: Path, mb: int) -> None:
    rnd = random.Random(7)
    with open(path, "w", encoding="utf-8") as out:
        size, i = 0, 0
        while size < mb * 1_000_000:
            if i % 500_000 == 250_000:
                s = f"src/module_{i}.py:{i % 900}: error: something failed at step {i}\n"
            else:
                s = f"2026-12-01T10:00:{i % 60:02d}Z INFO worker[{i % 8}] item {i} ok latency={rnd.randrange(1000)}ms\n"
            out.write(s)
            size += len(s)
            i += 1


# --- cases -----------------------------------------------------------------------------------

COUNT_FLOOR = """
import json, sys
from ctxrules.models import lookup_model
from ctxrules.tokens import TokenCounter
data = json.load(open(sys.argv[1]))
TokenCounter.for_model(lookup_model("gpt-4o")).count_each(data)
"""

SPILL_FLOOR = """
import hashlib, json, os, sys
data = json.load(open(sys.argv[1]))
text = max((m["content"] for m in data), key=len).encode("utf-8")
with open(sys.argv[2], "wb") as out:
    out.write(text)
    out.flush()
    os.fsync(out.fileno())
print(hashlib.sha256(text).hexdigest())
"""

VAULT_FLOOR = """
import hashlib, os, sys
digest = hashlib.sha256()
with open(sys.argv[1], "wb") as out:
    while chunk := sys.stdin.buffer.read(65536):
        digest.update(chunk)
        out.write(chunk)
    out.flush()
    os.fsync(out.fileno())
"""


def run_argv(tmp: Path, path: Path, window: int, state: str) -> list[str]:
    return [
        *CLI,
        "run",
        "--pack",
        "builtin:default",
        "--model",
        "gpt-4o",
        "--window",
        str(window),
        "--input",
        str(path),
        "--output",
        os.devnull,
        "--state",
        str(tmp / state),
        "--quiet",
    ]


def case_corpus(tmp: Path) -> None:
    transcripts = sorted(TRANSCRIPTS.glob("*.json"), key=lambda p: p.stat().st_size)
    if not transcripts:
        print(f"corpus           (skipped: no transcripts in {TRANSCRIPTS}; set CTXRULES_CORPUS)")
        return
    largest = transcripts[-1]
    seconds, rss = measure(run_argv(tmp, largest, 32_000, "corpus"))
    floor_s, floor_rss = measure([sys.executable, "-c", COUNT_FLOOR, str(largest)])
    row("corpus", "peak RSS", rss, floor_rss, 200, "MB")
    row("corpus", "time", seconds, floor_s, None, "s")
    print(f"{'':<16} ({largest.name}, {largest.stat().st_size / 1e6:.1f} MB; floor: read + count its texts)")


def case_big(tmp: Path, name: str, make: object, mb: int) -> None:
    path = tmp / f"{name}.json"
    make(path, mb)  # type: ignore[operator]
    seconds, rss = measure(run_argv(tmp, path, 128_000, name))
    floor_s, floor_rss = measure([sys.executable, "-c", SPILL_FLOOR, str(path), str(tmp / f"{name}.stored")])
    row(name, "time", seconds, floor_s, 10, "s")
    row(name, "peak RSS", rss, floor_rss, 300, "MB")


def case_small(tmp: Path, n: int) -> None:
    for shape, make in (("chat", small_chat), ("agent", small_agent)):
        path = tmp / f"small-{shape}.json"
        make(path, n)
        messages = json.loads(path.read_text(encoding="utf-8"))
        short = tmp / f"small-{shape}-20.json"
        tail = messages[-20:]
        if tail and tail[0].get("role") == "tool":
            tail = tail[1:]
        short.write_text(json.dumps(tail), encoding="utf-8")
        seconds, _ = measure(run_argv(tmp, path, 128_000, f"small-{shape}"))
        floor_s, _ = measure(run_argv(tmp, short, 128_000, f"small-{shape}-20"))
        row(f"small-{n // 1000}k {shape}", "time", seconds, floor_s, 5, "s")


def case_compress(tmp: Path, mb: int, reps: int) -> None:
    name = f"compress-{mb}mb"
    try:
        from ctxrules.compressors.large import WINDOW_BYTES
    except ImportError:  # a tree from before outputs were streamed: the same windows
        WINDOW_BYTES = 1024 * 1024

    log = tmp / "big.log"
    big_log(log, mb)
    out = tmp / "compressed.txt"
    windows = tmp / "windows.txt"
    with open(log, "rb") as handle:
        head = handle.read(WINDOW_BYTES)
        handle.seek(-WINDOW_BYTES, os.SEEK_END)
        tail = handle.read()
    windows.write_bytes(head[: head.rfind(b"\n") + 1] + tail[tail.find(b"\n") + 1 :])
    # The run and its floors take turns, `reps` times: on a shared machine one sample of each
    # says more about the neighbours than about the code. Medians are printed.
    runs: list[tuple[float, float]] = []
    vaults: list[tuple[float, float]] = []
    works: list[tuple[float, float]] = []
    for rep in range(reps):
        with open(out, "wb") as sink:
            argv = [*CLI, "compress", "--always", "--state", str(tmp / f"compress-state-{rep}"), "--", "cat", str(log)]
            runs.append(measure(argv, stdout=sink.fileno()))
        cat = subprocess.Popen(["cat", str(log)], stdout=subprocess.PIPE)
        vaults.append(measure([sys.executable, "-c", VAULT_FLOOR, str(tmp / "vault-floor")], stdin=cat.stdout))
        cat.wait()
        work = [*CLI, "compress", "--session", str(tmp / f"w{rep}"), "--command", f"cat {log}", "--input", str(windows)]
        works.append(measure(work))
        shutil.rmtree(tmp / f"compress-state-{rep}", ignore_errors=True)  # a 200 MB vault entry per run
    # Times: medians; peak RSS: the highest seen.
    seconds, vault_s, work_s = (statistics.median(r[0] for r in rows) for rows in (runs, vaults, works))
    rss, vault_rss, work_rss = (max(r[1] for r in rows) for rows in (runs, vaults, works))
    row(name, "time", seconds, vault_s + work_s, vault_s + work_s, "s")  # goal: no slower than the floor
    print(f"{'':<16} (floor = cat into a fsynced file {vault_s:.2f} s + compress of the windows {work_s:.2f} s;")
    print(f"{'':<16}  medians of {reps}, peak RSS the highest; runs {', '.join(f'{r[0]:.2f}' for r in runs)} s)")
    row(name, "peak RSS", rss, max(vault_rss, work_rss), 200, "MB")
    print(f"{'':<16} (output {out.stat().st_size:,} bytes from {log.stat().st_size:,})")


def case_short_lines(tmp: Path) -> None:
    """``ctxrules compress`` on 8 MB of empty lines and of two-byte lines (just under the byte
    limit at which an output streams to the vault): millions of lines, each costing far more
    held than its bytes. Floor: the same input through sha256 into a fsynced file."""
    for name, line in (("empty-lines-8mb", b"\n"), ("short-lines-8mb", b"x\n")):
        path = tmp / f"{name}.txt"
        path.write_bytes(line * (8_000_000 // len(line)))
        argv = [*CLI, "compress", "--session", str(tmp / f"s-{name}"), "--command", "make", "--input", str(path)]
        seconds, rss = measure(argv)
        with open(path, "rb") as source:
            floor = [sys.executable, "-c", VAULT_FLOOR, str(tmp / "short-floor")]
            floor_s, floor_rss = measure(floor, stdin=source.fileno())
        row(name, "time", seconds, floor_s, None, "s")
        row(name, "peak RSS", rss, floor_rss, 200, "MB")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=["corpus", "tool", "user", "small", "compress", "short"])
    parser.add_argument("--mb-message", type=int, default=50)
    parser.add_argument("--mb-output", type=int, default=200)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--reps", type=int, default=5, help="runs of compress and its floors (medians)")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "engine"))
    wanted = set(args.only or ["corpus", "tool", "user", "small", "compress", "short"])
    header()
    with tempfile.TemporaryDirectory(prefix="ctxrules-bench-memory-") as name:
        tmp = Path(name)
        if "corpus" in wanted:
            case_corpus(tmp)
        if "tool" in wanted:
            case_big(tmp, f"tool-{args.mb_message}mb", big_tool, args.mb_message)
        if "user" in wanted:
            case_big(tmp, f"user-{args.mb_message}mb", big_user, args.mb_message)
        if "small" in wanted:
            case_small(tmp, args.messages)
        if "compress" in wanted:
            case_compress(tmp, args.mb_output, args.reps)
        if "short" in wanted:
            case_short_lines(tmp)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
