"""``ctxrules mcp --session DIR``: serve a session's recall tool over MCP (stdio)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ctxrules.cli.output import require_stdout
from ctxrules.cli.stores import (
    add_store_options,
    check_session_dir,
    is_filesystem,
    session_key,
    store_of,
)
from ctxrules.errors import UsageError
from ctxrules.integrations.mcp import open_session, serve
from ctxrules.stores import StoreUsageError


def register(sub: Any) -> None:
    p = sub.add_parser(
        "mcp",
        help="serve a session's recall tool over MCP (stdio)",
        description="Run an MCP server on stdin/stdout with one tool (the pack's recall: tool, "
        "default ctxrules_recall) that gives back the exact original lines behind "
        "the session's elision markers. Needs the MCP SDK: pip install "
        '"ctxrules[mcp]".',
    )
    p.add_argument(
        "--session", required=True, metavar="DIR", help="the session directory (the session id with a --store URL)"
    )
    add_store_options(p)
    p.add_argument(
        "--pack",
        default="builtin:default",
        metavar="P",
        help="the pack whose recall: settings word the tool (default builtin:default)",
    )
    p.add_argument(
        "--model",
        default="gpt-4o",
        metavar="M",
        help="the model whose tokenizer counts the answer budget (default gpt-4o)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Started with `<&-`: no client could send a call (the SDK failed on None, an internal error).
    if sys.stdin is None:
        raise UsageError("standard input is closed: no client can send the server a call")
    require_stdout()  # the protocol's answers go there: refused before the session is opened
    store = store_of(args)
    if is_filesystem(store):
        path = Path(args.session)
        if not path.is_dir():
            raise UsageError(f"--session {path}: no such session directory")
        check_session_dir(args.session, store.root)
        session = open_session(str(path), pack=args.pack, model=args.model)
    else:
        key = session_key(store, args.session)
        if not store.exists(key):
            raise StoreUsageError("CR147", f"--session {args.session}: no such session in {store.url}")
        session = open_session(key, store=store, pack=args.pack, model=args.model)
    try:
        serve(session)
    except ImportError as exc:
        raise UsageError(str(exc)) from None
    return 0
