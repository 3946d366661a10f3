"""``ctxrules assemble --pack P --mode M --model X [--var k=v] [--format text|json]``, ``--matrix``.

Prints the assembled system prompt. ``--matrix`` renders every mode for every ``models:``
entry of the pack and for a model that matches none (``no-entry``), so a reviewer sees all the
prompts a pack can produce. ``--var`` values are converted to the type of the variable's
declared default (``true``/``false`` for booleans, numbers for numbers); everything else is a
string.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ctxrules.cli.io import add_search_path
from ctxrules.cli.output import write_stdout
from ctxrules.errors import UsageError
from ctxrules.packs.validated import load_pack
from ctxrules.plugins import default_registry
from ctxrules.prompts.assemble import NO_ENTRY, prompt_set

_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def register(sub: Any) -> None:
    p = sub.add_parser(
        "assemble",
        help="print the assembled system prompt(s) of a pack",
        description="Assemble a pack's system prompt for a mode and a model: the mode's sections "
        "and the discipline of the models: entry the model matches, each in its XML tag. "
        "--matrix prints every mode for every models: entry (and for no entry).",
    )
    p.add_argument(
        "--pack",
        default="builtin:default",
        help="pack path or builtin:NAME (default: builtin:default)",
    )
    p.add_argument("--mode", help="prompt mode, e.g. full, lean, naked, search (with --matrix: only this mode)")
    p.add_argument("--model", help="model name, bare or provider-prefixed; picks the models: entry")
    p.add_argument(
        "--entry",
        help="use this models: entry id instead of matching --model ('no-entry' for none)",
    )
    p.add_argument(
        "--var",
        action="append",
        default=[],
        metavar="K=V",
        help="set a declared prompt variable (repeatable)",
    )
    p.add_argument("--matrix", action="store_true", help="every mode x models: entry, plus no entry")
    p.add_argument("--format", choices=("text", "json"), default="text")
    add_search_path(p)
    p.set_defaults(func=run)


def parse_vars(items: list[str], declared: dict[str, Any]) -> dict[str, Any]:
    """``K=V`` items as typed values (the type of each variable's default)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"--var expects K=V, got {item!r}")
        default = declared.get(key)
        value: Any = raw
        if isinstance(default, bool):
            if raw.lower() not in _TRUE | _FALSE:
                raise UsageError(f"--var {key}: expected true or false, got {raw!r}")
            value = raw.lower() in _TRUE
        elif isinstance(default, int):
            try:
                value = int(raw)
            except ValueError:
                raise UsageError(f"--var {key}: expected an integer, got {raw!r}") from None
        elif isinstance(default, float):
            try:
                value = float(raw)
            except ValueError:
                raise UsageError(f"--var {key}: expected a number, got {raw!r}") from None
        out[key] = value
    return out


def run(args: argparse.Namespace) -> int:
    if not args.matrix and not args.mode:
        raise UsageError("assemble needs --mode (or --matrix)")
    if not args.matrix and not args.model and not args.entry:
        raise UsageError("assemble needs --model (or --entry, or --matrix)")
    if args.matrix and (args.model or args.entry):
        raise UsageError("--matrix renders every models: entry; leave out --model and --entry")
    pack = load_pack(args.pack, search_path=args.search_path)
    ps = prompt_set(pack, default_registry())
    defaults = {name: var.default for name, var in ps.variables.items()}
    variables = parse_vars(args.var, defaults)

    if not args.matrix:
        entry = args.entry if args.entry and args.entry != NO_ENTRY else None
        model = None if args.entry else args.model
        prompt = ps.assemble(args.mode, model=model, entry=entry, variables=variables)
        if args.format == "json":
            doc = {"pack": pack.name, "model": args.model, **prompt.as_dict()}
            write_stdout(json.dumps(doc, ensure_ascii=False, indent=2) + "\n")
        else:
            write_stdout(prompt.text + "\n")
        return 0

    modes = [args.mode] if args.mode else ps.mode_names()
    results = []
    for mode in modes:
        for entry in [*ps.entry_ids(), None]:
            results.append(ps.assemble(mode, entry=entry, variables=variables))
    if args.format == "json":
        doc = {"pack": pack.name, "prompts": [r.as_dict() for r in results]}
        write_stdout(json.dumps(doc, ensure_ascii=False, indent=2) + "\n")
        return 0
    blocks = []
    for r in results:
        header = f"=== mode={r.mode} entry={r.entry or NO_ENTRY} chars={len(r.text)} sha256={r.sha256[:16]} ==="
        blocks.append(f"{header}\n{r.text}\n")
    write_stdout("\n".join(blocks))
    return 0
