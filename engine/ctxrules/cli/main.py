"""Entry point: parse the verb, run it, turn handled errors into one line and an exit code.

Exit codes (docs/reference/concepts.md "CLI contract"): 0 ok, 1 problems found, 2 usage or runtime error.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from ctxrules._version import __version__
from ctxrules.errors import CtxrulesError

# Each module defines ``register(subparsers)``; its parser sets ``func(args) -> int``.
VERBS: tuple[str, ...] = (
    "ctxrules.cli.validate",
    "ctxrules.cli.explain",
    "ctxrules.cli.schema",
    "ctxrules.cli.plugins",
    "ctxrules.cli.run",
    "ctxrules.cli.vault",
    "ctxrules.cli.compress",
    "ctxrules.cli.assemble",
    "ctxrules.cli.test",
    "ctxrules.cli.report",
    "ctxrules.cli.sessions",
    "ctxrules.cli.usage",
    "ctxrules.cli.eval",
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ctxrules", description="Declarative rules for the context of LLM agents.")
    parser.add_argument("--version", action="version", version=f"ctxrules {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)
    sub.required = True
    for modname in VERBS:
        importlib.import_module(modname).register(sub)
    return parser


def run(argv: Sequence[str] | None = None) -> int:
    """Run the CLI in-process; handled errors become a message on stderr and an exit code."""
    parser = build_parser()
    args = parser.parse_args(list(argv) if argv is not None else None)
    try:
        code: int = args.func(args)
    except CtxrulesError as exc:
        sys.stderr.write(f"ctxrules: error: {exc}\n")
        return exc.exit_code
    except BrokenPipeError:
        return 0
    return code


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point: no traceback reaches a user unless CTXRULES_DEBUG=1."""
    try:
        code = run(argv)
    except KeyboardInterrupt:
        code = 130
    except SystemExit:
        raise
    except Exception as exc:  # a bug: say so in one line, keep the traceback for debugging
        if os.environ.get("CTXRULES_DEBUG"):
            raise
        sys.stderr.write(f"ctxrules: internal error: {type(exc).__name__}: {exc}\n"
                         "  (this is a bug in ctxrules; set CTXRULES_DEBUG=1 for a traceback)\n")
        code = 2
    sys.stdout.flush()
    raise SystemExit(code)


if __name__ == "__main__":
    main()
