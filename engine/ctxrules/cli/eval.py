"""``ctxrules eval``: replay transcripts through packs and baselines; cost, cache, retention."""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Any, TextIO

from ctxrules.cli.io import distinct_outputs, outputs_apart_from, unwind_on_sigterm, writable_outputs, write_text
from ctxrules.cli.output import require_stdout, stdout_writer
from ctxrules.cli.progress import columns
from ctxrules.errors import PackError, UsageError
from ctxrules.eval.judge import JUDGE_TIMEOUT_S
from ctxrules.eval.replay import STEP_S, Task, step_clock_fits
from ctxrules.eval.report import dumps, eval_html, eval_json, eval_table, totals_of
from ctxrules.eval.run import load_transcripts, plans_from, run_tasks, workers
from ctxrules.models import lookup_model
from ctxrules.packs.validated import load_pack
from ctxrules.printable import printable


def register(sub: Any) -> None:
    p = sub.add_parser(
        "eval",
        help="replay transcripts through packs and baselines: cost per task, cache, retention",
        description="Replay each transcript call by call (prepare before every assistant message, "
        "one session per transcript and pack), model the provider's prompt cache, "
        "price it, and check retention probes and the invariants on every call. "
        "Exit 1 when an invariant broke on any call of a pack.",
    )
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="transcript files or folders")
    p.add_argument(
        "--pack",
        action="append",
        default=[],
        metavar="P",
        help="a pack to evaluate (a path or builtin:NAME); repeat for more",
    )
    p.add_argument(
        "--baseline",
        action="append",
        default=[],
        choices=("none", "trim"),
        help="also replay without ctxrules: none (the raw history) or trim (litellm.utils.trim_messages); repeatable",
    )
    p.add_argument("--model", required=True, metavar="M")
    p.add_argument("--window", type=int, metavar="N", help="override the model's window")
    p.add_argument(
        "--step-s",
        type=float,
        default=None,
        metavar="S",
        help="seconds between calls when messages carry no timestamps (default 20)",
    )
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="worker processes (default 1)")
    p.add_argument("--json", metavar="FILE", help="write every call and the totals as JSON")
    p.add_argument("--html", metavar="FILE", help="write one self-contained page with charts")
    p.add_argument(
        "--judge",
        metavar="MODEL",
        help="also ask MODEL the probe questions from the prepared context of each "
        "transcript's last call, and grade its answers (needs the model's API)",
    )
    p.add_argument("--judge-api-base", metavar="URL", help="the judge's OpenAI-compatible endpoint")
    p.add_argument(
        "--judge-timeout",
        type=float,
        default=JUDGE_TIMEOUT_S,
        metavar="S",
        help=f"seconds one judge call may take, its whole answer (default {JUDGE_TIMEOUT_S:g})",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=run)


class _Bar:
    """A one-line progress bar on a terminal: the transcript, the plan and the turn."""

    def __init__(self, stream: TextIO, total: int) -> None:
        self.stream = stream
        self.total = max(1, total)
        self.done = 0
        self.last = 0.0

    def __call__(self, transcript: str, plan: str, turn: int, turns: int) -> None:
        self.done += 1
        now = time.monotonic()
        if now - self.last < 0.1 and self.done < self.total:
            return
        self.last = now
        width = 24
        filled = int(width * self.done / self.total)
        line = (
            f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
            f"{transcript[:36]} · {plan[:24]} · turn {turn}/{turns}"
        )
        # The names escaped, not the carriage return that redraws the line (escaped with them,
        # the bar showed a literal "\x0d" and ran on along one line); cut to the terminal.
        cut = columns(self.stream)
        self.stream.write("\r" + printable(line)[:cut].ljust(cut))
        self.stream.flush()

    def close(self) -> None:
        self.stream.write("\r" + " " * columns(self.stream) + "\r")
        self.stream.flush()


def run(args: argparse.Namespace) -> int:
    unwind_on_sigterm()  # `timeout` stopping it: the workers are ended, their sessions removed
    if not args.pack and not args.baseline:
        raise UsageError("name at least one --pack or --baseline")
    if args.jobs < 1:
        raise UsageError("--jobs must be at least 1")
    require_stdout()  # `>&-`: refused before the replay, not after it
    distinct_outputs(json=args.json, html=args.html)  # before the replay, not after it
    writable_outputs(json=args.json, html=args.html)
    if args.window is not None and args.window <= 0:
        raise UsageError("--window must be a positive number of tokens")
    lookup_model(args.model, window=args.window)  # an unknown model is a usage error up front
    if args.step_s is not None and not 0 < args.step_s < math.inf:
        raise UsageError("--step-s must be a positive number of seconds")
    if not 0 < args.judge_timeout < math.inf:
        raise UsageError("--judge-timeout must be a positive number of seconds")
    for ref in args.pack:
        try:
            load_pack(ref)  # an invalid pack fails here, with its diagnostics, before any replay
        except PackError as exc:  # exit 2: eval's exit 1 says an invariant broke
            raise UsageError(str(exc)) from None
    transcripts, notes = load_transcripts(args.inputs)
    # A result written over a transcript just read would lose it (a skipped file, such as an
    # earlier result in the folder, may be written again).
    outputs_apart_from([path for _, path, _, _ in transcripts], "a transcript", json=args.json, html=args.html)
    for note in notes:
        sys.stderr.write(f"ctxrules: note: {printable(note)}\n")
    plans = plans_from(args.pack, list(dict.fromkeys(args.baseline)))
    step_s = STEP_S if args.step_s is None else args.step_s
    tasks = [
        Task(
            name,
            str(path),
            tuple(msgs),
            tuple(tools),
            plan,
            args.model,
            args.window,
            step_s,
            args.judge,
            args.judge_api_base,
            args.judge_timeout,
        )
        for plan in plans
        for name, path, msgs, tools in transcripts
    ]
    names = [name for name, *_ in transcripts]
    turns = [
        sum(1 for i, m in enumerate(msgs) if m.get("role") == "assistant" and i > 0) for _, _, msgs, _ in transcripts
    ]
    total_turns = sum(turns) * len(plans)
    if not step_clock_fits(max(turns), step_s):
        raise UsageError(f"--step-s {args.step_s:g} puts the clock of call {max(turns)} past the year 9999")
    bar = (
        _Bar(sys.stderr, total_turns) if (sys.stderr.isatty() and not args.quiet and not os.environ.get("CI")) else None
    )
    started = time.perf_counter()
    try:
        try:
            results = run_tasks(tasks, jobs=args.jobs, progress=bar)
        finally:
            if bar is not None:
                bar.close()
    except PackError as exc:
        # Each replay loads its pack again: one edited into an invalid pack after the check
        # above is the same usage error (exit 2), not eval's exit 1 for a broken invariant.
        raise UsageError(f"a pack no longer loads (was it changed during the run?): {exc}") from None
    except (KeyboardInterrupt, SystemExit):
        # Ctrl-C (130) or SIGTERM (143), after the workers were ended: minutes of replay may
        # have gone, so say so rather than end without a word.
        sys.stderr.write("ctxrules: eval stopped by a signal before the replay ended: nothing was written\n")
        raise
    seconds = time.perf_counter() - started
    overall, each = totals_of(results, [p.name for p in plans], {p.name: p.baseline for p in plans})
    table = eval_table(overall, each, names, model=args.model, window=args.window)
    # The table goes to stderr when a file written to stdout (-) would otherwise follow it.
    shown = sys.stderr if "-" in (args.json, args.html) else stdout_writer()
    shown.write(printable(table, one_line=False))
    shown.write(f"\n{total_turns} calls replayed in {seconds:.1f} s ({workers(args.jobs, len(tasks))} job(s))\n")
    if args.json:
        write_text(
            args.json, dumps(eval_json(results, overall, each, model=args.model, window=args.window, seconds=seconds))
        )
    if args.html:
        write_text(args.html, eval_html(results, overall, each, names, model=args.model, window=args.window))
    # A judge call that failed is in the errors too, but only reported (docs/eval.md).
    broken = [p for p, t in overall.items() if not t.baseline and (t.violations or t.failed)]
    if broken:
        sys.stderr.write(f"ctxrules: invariants broke on calls of: {printable(', '.join(broken))}\n")
        return 1
    return 0
