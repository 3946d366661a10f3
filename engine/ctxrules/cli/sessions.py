"""``ctxrules sessions scan [--state DIR]`` / ``ctxrules sessions resume DIR``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ctxrules.cli.io import write_text
from ctxrules.runtime.checkpoint import resume, scan
from ctxrules.session_store import state_root_from_env


def register(sub: Any) -> None:
    p = sub.add_parser("sessions", help="find and resume sessions whose compaction was interrupted")
    ssub = p.add_subparsers(dest="sessions_verb", metavar="ACTION", parser_class=type(p))
    ssub.required = True
    s = ssub.add_parser("scan", help="list sessions under the state root whose last compaction was cut short")
    s.add_argument("--state", help="state root (default: .ctxrules or $CTXRULES_STATE)")
    s.set_defaults(func=run_scan)
    r = ssub.add_parser(
        "resume",
        help="restore a session to the state before its interrupted compaction "
        "and print the messages that compaction started from",
    )
    r.add_argument("session", metavar="DIR")
    r.add_argument("--output", default="-", help="where to write the messages (default: stdout)")
    r.set_defaults(func=run_resume)


def run_scan(args: argparse.Namespace) -> int:
    root = Path(args.state) if args.state else state_root_from_env()
    found = scan(root)
    for hit in found:
        after = f" (after the first {hit.prefix} messages of last_output.jsonl)" if hit.prefix else ""
        sys.stdout.write(f"{hit.session}\t{hit.reason}\tbackup={hit.backup}{after}\n")
    sys.stdout.write(f"{len(found)} interrupted session(s) under {root}\n")
    return 0


def run_resume(args: argparse.Namespace) -> int:
    messages = resume(Path(args.session))
    write_text(args.output, json.dumps(messages, ensure_ascii=False, indent=2) + "\n")
    return 0
