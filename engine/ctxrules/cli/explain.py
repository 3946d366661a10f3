"""``ctxrules explain PACK [--model M] [--origins]``: the resolved pack as YAML."""

from __future__ import annotations

import argparse
from typing import Any

from ctxrules.cli.io import add_search_path
from ctxrules.cli.output import write_stdout
from ctxrules.diagnostics import Reporter
from ctxrules.errors import UsageError
from ctxrules.packs.loader import BUILTIN_PREFIX, BUILTIN_REF, builtin_names, builtin_path
from ctxrules.packs.models_match import effective_context, select_model_entry
from ctxrules.packs.render import to_yaml
from ctxrules.packs.validated import load_pack
from ctxrules.printable import printable
from ctxrules.timeouts import TimeoutPolicy, lint_timeouts, render_table


def register(sub: Any) -> None:
    p = sub.add_parser(
        "explain",
        help="print the resolved pack as YAML",
        description="Resolve a pack with all its parents and print the result as YAML. PACK is a path or builtin:NAME.",
    )
    p.add_argument("pack", metavar="PACK")
    p.add_argument("--model", help="show which models: entry applies and the context it yields")
    p.add_argument("--origins", action="store_true", help="add the file:line each value came from")
    p.add_argument(
        "--timeouts", action="store_true", help="print each tool's effective stream timeout instead (docs/timeouts.md)"
    )
    add_search_path(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    _check_exists(args.pack)
    pack = load_pack(args.pack, search_path=args.search_path)
    if getattr(args, "timeouts", False):
        return _print_timeouts(pack)
    origins = pack.origins() if args.origins else None
    out = []
    out.append(printable(f"# pack: {pack.name} (files applied: {', '.join(pack.files)})"))
    if args.model:
        hit = select_model_entry(pack.data, args.model)
        if hit is None:
            out.append(printable(f"# model {args.model}: no models: entry matches"))
        else:
            i, entry = hit
            where = pack.origins().get(f"/models/{i}")
            applies = f"# model {args.model}: models entry '{entry.get('id')}' applies"
            applies += f" ({where})" if where else ""
            out.append(printable(applies))
            out.append("# effective context for this model:")
            out.extend(
                printable("#   " + ln)
                for ln in to_yaml({"context": effective_context(pack.data, entry)}).rstrip("\n").split("\n")
            )
    for d in pack.diagnostics:
        out.append(printable(f"# {d.severity}[{d.code}] {d.file}:{d.line}:{d.col}: {d.message}"))
    write_stdout("\n".join(out) + "\n" + to_yaml(pack.data, origins))
    return 0


def _check_exists(ref: str) -> None:
    """A PACK that names nothing is a usage error (exit 2), like a missing path for validate."""
    from pathlib import Path

    if ref.startswith(BUILTIN_PREFIX):
        m = BUILTIN_REF.match(ref)
        if m is None or not builtin_path(m["name"]).is_file():
            raise UsageError(
                f"no built-in pack '{ref}' (there are: " + ", ".join(BUILTIN_PREFIX + n for n in builtin_names()) + ")"
            )
    elif Path(ref).is_dir():
        raise UsageError(f"{ref} is a folder, not a pack file; name the pack's YAML file")
    elif not Path(ref).exists():
        # Only what is not there: a FIFO or a device is there, and loading it says what it is
        # (CR101, exit 1, as `run` and `validate` say it), not "no such pack file".
        raise UsageError(f"no such pack file: {ref}")


def _print_timeouts(pack: Any) -> int:
    """The effective-timeouts table (``--timeouts``) and the timeout lints with their numbers."""
    policy = TimeoutPolicy.from_pack(pack.data)
    head = printable(f"# pack: {pack.name} (files applied: {', '.join(pack.files)})") + "\n"
    if policy is None:
        write_stdout(
            head + "# no timeouts: declared (stream timeouts belong to the agent runtime; see docs/timeouts.md)\n"
        )
        return 0
    origin = Reporter(pack).origin  # where validate puts each warning: the value it is about

    def locate(pointer: str) -> str:
        found = origin(pointer)
        return f"{found.file}:{found.line}:{found.col}"

    write_stdout(head + render_table(policy, lint_timeouts(pack.data), locate))
    return 0
