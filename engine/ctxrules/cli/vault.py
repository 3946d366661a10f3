"""``ctxrules vault get ID [--lines A:B] [--session DIR]``: the exact original bytes."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from ctxrules.cli.output import stdout_writer
from ctxrules.cli.stores import (
    add_store_options,
    describe_store,
    is_filesystem,
    session_key,
    store_of,
)
from ctxrules.errors import UsageError
from ctxrules.stores import StoreUsageError
from ctxrules.vault import Vault, VaultError, parse_ref


def register(sub: Any) -> None:
    p = sub.add_parser("vault", help="read what stages moved out of the context")
    vsub = p.add_subparsers(dest="vault_verb", metavar="ACTION", parser_class=type(p))
    vsub.required = True
    g = vsub.add_parser(
        "get",
        help="print a vault item's exact bytes",
        description="Print the exact original bytes of a vault item. ID is the full "
        "sha256 or a unique prefix of at least 12 hex digits; a marker's "
        "ref (vault://ID#L3-L9) is accepted too.",
    )
    g.add_argument("id", metavar="ID")
    g.add_argument("--lines", help="only lines A:B (1-based, inclusive)")
    g.add_argument(
        "--session",
        help="session directory, or the session id with a --store URL (default: search every session of the store)",
    )
    add_store_options(g)
    g.set_defaults(func=run_get)


def _parse_lines(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"([0-9]{1,18}):([0-9]{1,18})", text.strip())
    if not m or int(m[1]) < 1 or int(m[2]) < int(m[1]):
        raise UsageError(f"--lines takes A:B with 1 <= A <= B (numbers of at most 18 digits), got {text[:80]!r}")
    return int(m[1]), int(m[2])


def run_get(args: argparse.Namespace) -> int:
    ident, lines = args.id, None
    if ident.startswith("vault://"):
        ident, lines = parse_ref(ident)
    if args.lines is not None:  # given empty (`--lines "$UNSET"`): refused, not the whole item
        given = _parse_lines(args.lines)
        if lines is not None and given != lines:
            # Neither wins silently: the caller meant one range and would get the other.
            raise UsageError(
                f"the ref names lines {lines[0]}:{lines[1]} and --lines {given[0]}:{given[1]}: give one range"
            )
        lines = given
    store = store_of(args)
    if args.session:
        key = session_key(store, args.session)
        if is_filesystem(store) and not Path(key).is_dir():
            raise UsageError(f"no such session directory: {args.session}")
        if not is_filesystem(store) and not store.exists(key):
            raise StoreUsageError("CR147", f"no session {args.session!r} in {store.url}")
        candidates = [key]
    else:
        # A session whose vault was removed still counts: its items are "missing".
        candidates = store.sessions()
        if not candidates:
            raise UsageError(f"no sessions in {describe_store(store)}; give --session DIR")
    errors = []
    out = stdout_writer(binary=True)
    printed = 0

    def write(block: bytes) -> None:
        nonlocal printed
        out.write(block)
        printed += len(block)

    for session in candidates:
        vault = Vault.of(store, session)
        try:
            # A block at a time: an item of gigabytes is never held, and a damaged one is
            # refused before anything is printed (then another session may hold it intact).
            vault.copy_to(ident, write, lines)
        except VaultError as exc:
            if printed:
                raise UsageError(str(exc)) from None
            errors.append(str(exc))
            continue
        out.flush()
        return 0
    if len(candidates) == 1:
        raise UsageError(errors[0])
    raise UsageError(f"vault item {ident} is missing from all {len(candidates)} sessions (not found)")
