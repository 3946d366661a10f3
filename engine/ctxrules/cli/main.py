"""Entry point: parse the verb, run it, turn handled errors into one line and an exit code.

Exit codes (docs/reference/cli.md): 0 ok, 1 problems found, 2 usage or runtime error (a standard
output that cannot take the output included; a reader that went away is 0: ctxrules.cli.output;
the system refusing a path, an OSError naming it, included).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import gc
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from ctxrules._version import __version__
from ctxrules.cli.output import flush_stdout, silence_stdout, tolerate_unread_stderr, utf8_stdout, write_stdout
from ctxrules.cli.stops import keep_the_exit_code, unwind_on_sigterm
from ctxrules.errors import CtxrulesError
from ctxrules.printable import encodable, printable
from ctxrules.threads import abandoned_alive

# Verb -> the module that implements it. Each module defines ``register(subparsers)``; its
# parser sets ``func(args) -> int``. Only the verb being run is imported (``ctxrules validate``
# must not pay for the tokenizer and the pipeline); help and a mistyped verb import them all.
VERBS: dict[str, str] = {
    "validate": "ctxrules.cli.validate",
    "explain": "ctxrules.cli.explain",
    "schema": "ctxrules.cli.schema",
    "plugins": "ctxrules.cli.plugins",
    "run": "ctxrules.cli.run",
    "vault": "ctxrules.cli.vault",
    "compress": "ctxrules.cli.compress",
    "assemble": "ctxrules.cli.assemble",
    "test": "ctxrules.cli.test",
    "report": "ctxrules.cli.report",
    "sessions": "ctxrules.cli.sessions",
    "usage": "ctxrules.cli.usage",
    "mcp": "ctxrules.cli.mcp",
    "eval": "ctxrules.cli.eval",
}


class _Parser(argparse.ArgumentParser):
    def _print_message(self, message: str, file: Any = None) -> None:
        """``--help`` and ``--version`` print through :func:`write_stdout`, so a standard output
        that cannot take them is exit 2 with one line like any verb's output (argparse drops a
        failed write and exits 0: ``ctxrules --help >/dev/full`` "succeeded" printing nothing);
        a reader that went away (``| head -1``) stays exit 0."""
        if message and (file is None or file is sys.stdout):
            write_stdout(message)
            flush_stdout()
        else:
            super()._print_message(message, file)

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{self.prog}: error: {printable(message, one_line=False)}\n")
        raise SystemExit(2)


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The parser with every verb, or with ``verb`` alone (when it is one of :data:`VERBS`)."""
    parser = _Parser(prog="ctxrules", description="Declarative rules for the context of LLM agents.")
    parser.add_argument("--version", action="version", version=f"ctxrules {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)
    sub.required = True
    for name, modname in VERBS.items():
        if verb is None or verb not in VERBS or name == verb:
            importlib.import_module(modname).register(sub)
    return parser


def _verb_in(argv: Sequence[str]) -> str | None:
    """The verb ``argv`` names: its first argument when that is not an option."""
    return argv[0] if argv and not argv[0].startswith("-") else None


# Arguments that name a file, a folder, a pack or a store. An empty one (an unset shell variable:
# `ctxrules test "$PACK"`) would otherwise mean the current directory: test or validate every
# pack below it, or make a session of it and write its state files there.
_PATH_DESTS = frozenset(
    {
        "archive", "html", "input", "inputs", "json", "output", "pack", "packs", "paths", "report",
        "response", "search_path", "session", "state", "store", "to", "touched",
    }
)  # fmt: skip


def _refuse_empty_paths(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A usage error (exit 2) for an empty value of any of :data:`_PATH_DESTS` in the verb run."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(args, action.dest, None) or "")
            if chosen is not None:
                _refuse_empty_paths(chosen, args)
            continue
        if action.dest not in _PATH_DESTS:
            continue
        value = getattr(args, action.dest, None)
        values = value if isinstance(value, list) else [value]
        if any(isinstance(v, str) and not v.strip() for v in values):
            name = action.option_strings[0] if action.option_strings else str(action.metavar or action.dest)
            parser.error(f"argument {name}: an empty value names no file, folder or store")


def run(argv: Sequence[str] | None = None) -> int:
    """Run the CLI in-process; handled errors become a message on stderr and an exit code."""
    arguments = list(argv) if argv is not None else sys.argv[1:]
    verb = _verb_in(arguments)
    parser = build_parser(verb)
    if verb == "validate":
        arguments = _pack_files_as_paths(arguments)
    try:
        try:
            args = parser.parse_args(arguments)  # --help and --version print here
            _refuse_empty_paths(parser, args)
        except SystemExit as usage:
            # `compress ... -- CMD` exits with CMD's code, so its own usage errors are 125 (as
            # with `env` and `timeout`): a 2 would read as CMD's; CMD does not run.
            if usage.code == 2 and verb == "compress" and "--" in arguments:
                return 125
            raise
        if (os.environ.get("CTXRULES_LOG") or "").strip() or "ctxrules.logs" in sys.modules:
            # Unset, with nothing configured before in this process, there is nothing to
            # apply (and `logging` stays unimported for verbs that never log, like validate).
            from ctxrules.logs import configure

            configure()  # an unknown CTXRULES_LOG level is a usage error before any work
        code: int = args.func(args)
        flush_stdout()  # a write that fails here is the verb's failure, with its exit code
    except CtxrulesError as exc:
        sys.stderr.write(f"ctxrules: error: {printable(str(exc), one_line=False)}\n")
        return exc.exit_code
    except BrokenPipeError:  # the reader went away (`| head -1`): it has what it wanted
        silence_stdout()
        return 0
    except OSError as exc:
        if not isinstance(exc.filename, (str, bytes)) or os.environ.get("CTXRULES_DEBUG"):
            raise
        # The system refused a path the user gave or one under it (a name too long for the
        # file system, a session "directory" below a file, a disk that is full or read-only):
        # the environment, not a bug, so one line naming the path rather than an internal error.
        return _path_refused(os.fsdecode(exc.filename), exc.strerror or str(exc))
    except RuntimeError as exc:
        # Path.resolve() on a symbolic link loop before Python 3.13 (OSError ELOOP since).
        loop = str(exc).removeprefix("Symlink loop from ")
        if loop == str(exc) or os.environ.get("CTXRULES_DEBUG"):
            raise
        return _path_refused(loop.strip("'\""), os.strerror(errno.ELOOP))
    return code


def _pack_files_as_paths(arguments: list[str]) -> list[str]:
    """``validate``'s arguments with every YAML file whose name starts with ``-`` moved behind
    a ``--``, so that it is read as a path. pre-commit passes each file of the repository by
    name: one named ``-x.yaml`` was an unknown option (a usage error, the batch unchecked) and
    one named ``--search-path=x.yaml`` an option taken silently (the pack never checked). An
    option never names an existing file that ends in ``.yaml`` or ``.yml``."""
    end = arguments.index("--") if "--" in arguments else len(arguments)
    dashed = [a for a in arguments[1:end] if a.startswith("-") and a.endswith((".yaml", ".yml")) and os.path.isfile(a)]
    if not dashed:
        return arguments
    kept = [a for a in arguments[:end] if a not in dashed]
    return [*kept, "--", *dashed, *arguments[end + 1 :]]


def _path_refused(path: str, reason: str) -> int:
    """Say in one line that the system refused ``path`` (a non-UTF-8 byte shown as ``\\xff``)."""
    sys.stderr.write(f"ctxrules: error: {printable(encodable(path))}: {reason}\n")
    return 2


# Verbs that read, check and print, in a process of their own: no cyclic garbage collection.
# What they allocate (modules, YAML trees, patterns, templates) lives until the report is
# printed, so the collector's passes walked a growing heap for almost nothing (validating the
# 18 built-in files leaves some 14,000 objects in cycles), and its exit-time pass over the
# whole heap came on top: together a sixth of `ctxrules validate`. Not for verbs that write
# (an object in a reference cycle may hold a buffered file) or serve (memory would grow).
_UNCOLLECTED_VERBS = frozenset({"validate"})

# Verbs that clean up on SIGTERM (exit 143: a compaction marked as interrupted, a half-spilled
# vault entry removed, eval's workers stopped). Each calls unwind_on_sigterm() as it starts; the
# entry point does too, before the verb's modules are imported (the pipeline, the tokenizer:
# most of a `run`'s start-up), or a SIGTERM then ended the process by the signal, not 143.
_UNWOUND_ON_SIGTERM = frozenset({"run", "compress", "eval"})


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point: no traceback reaches a user unless CTXRULES_DEBUG=1."""
    arguments = list(argv) if argv is not None else sys.argv[1:]
    verb = _verb_in(arguments)
    if verb in _UNWOUND_ON_SIGTERM:
        unwind_on_sigterm()
    keep_the_exit_code()
    if sys.stderr is None:
        # Started with `2>&-`: a message written to None failed, and so did the report of
        # that failure, and Python exited 1 (eval's "an invariant broke") whatever the code.
        # The messages go to the null device; the codes stay.
        sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 (for the process)
    tolerate_unread_stderr()
    utf8_stdout()
    uncollected = verb in _UNCOLLECTED_VERBS
    if uncollected:
        gc.disable()
    try:
        if not uncollected and verb in VERBS:
            # The verb's modules, imported now rather than by run(), live as long as the
            # process: frozen, the collector's passes no longer walk them (some 50 ms of a
            # `compress`).
            with contextlib.suppress(Exception):  # run() meets it again and reports it
                importlib.import_module(VERBS[verb])
            gc.freeze()
        code = run(arguments)
    except KeyboardInterrupt:
        code = 130
    except SystemExit:
        raise
    except Exception as exc:  # a bug: say so in one line, keep the traceback for debugging
        if os.environ.get("CTXRULES_DEBUG"):
            raise
        sys.stderr.write(
            f"ctxrules: internal error: {type(exc).__name__}: {printable(str(exc), one_line=False)}\n"
            "  (this is a bug in ctxrules; set CTXRULES_DEBUG=1 for a traceback)\n"
        )
        code = 2
    if sys.stdout is not None:  # None when the process started with its fd 1 closed (`>&-`)
        try:
            with contextlib.suppress(OSError, ValueError):  # run() reported a failed write already
                sys.stdout.flush()
        except KeyboardInterrupt:  # Ctrl-C as the verb ended: 130 as anywhere, no traceback
            code = 130
    if uncollected:
        gc.freeze()  # the interpreter's exit-time collection skips frozen objects
    if abandoned_alive():
        _exit_now(code)
    raise SystemExit(code)


def _exit_now(code: int) -> NoReturn:
    """End the process without the interpreter's teardown: a model call given up on still runs
    in a thread, which teardown freezes holding what it holds (the import lock, inside litellm);
    a finalizer that needs it then waited forever, SIGTERM included. Every output was written
    and closed by the verb; what is buffered is flushed here, and work a thread of ctxrules'
    must finish (``helper_thread(..., daemon=False)``) is waited for, as the interpreter would.
    Other threads are not: litellm's logging pool is idle workers that only teardown stops."""
    import threading

    for thread in threading.enumerate():
        if not thread.daemon and thread.name.startswith("ctxrules-") and thread is not threading.current_thread():
            thread.join()
    if "logging" in sys.modules:
        import logging

        with contextlib.suppress(Exception):
            logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
