"""``ctxrules run``: run a pack's pipeline over a message file."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ctxrules.cli.io import (
    add_search_path,
    distinct_outputs,
    dump,
    outputs_apart_from,
    outputs_outside,
    read_json,
    unwind_on_sigterm,
    write_text,
)
from ctxrules.cli.output import stdout_writer
from ctxrules.cli.progress import TerminalProgress, wanted
from ctxrules.cli.stores import (
    add_store_options,
    check_session_dir,
    is_filesystem,
    kept_places,
    named_store,
    session_key,
)
from ctxrules.cli.tables import report_table
from ctxrules.engine import open_session
from ctxrules.errors import MessagesError, UsageError
from ctxrules.formats import FormatError, detect
from ctxrules.formats import anthropic as anthropic_format
from ctxrules.formats import openai as openai_format
from ctxrules.messages import split_input, validate_messages
from ctxrules.printable import printable


def register(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="run the pipeline over messages",
        description="Run a pack's pipeline over a JSON list of OpenAI chat messages "
        '(or {"messages": [...], "tools": [...]}), or over an Anthropic '
        "Messages request, and write the result in the same format.",
    )
    p.add_argument("--pack", required=True, help="pack path or builtin:NAME")
    p.add_argument("--model", required=True, help="model name, bare or provider-prefixed")
    p.add_argument("--window", type=int, help="window in tokens (overrides pack and registry)")
    p.add_argument("--input", default="-", help="message file (default: stdin)")
    p.add_argument("--output", default="-", help="where to write the messages (default: stdout)")
    p.add_argument("--report", help="write the JSON run report here")
    p.add_argument("--session", help="session directory, or the session id with a --store URL (default: STATE/default)")
    add_store_options(p)
    p.add_argument(
        "--format",
        choices=("openai", "anthropic", "auto"),
        default="auto",
        help="input format: OpenAI chat messages, an Anthropic Messages request, or auto "
        "(a top-level 'system', tool_use/tool_result blocks or tools with input_schema "
        "mean Anthropic); the output is in the input's format (default: auto)",
    )
    p.add_argument("--explain", action="store_true", help="print a readable table of what each stage did")
    p.add_argument(
        "--quiet",
        action="store_true",
        help="no progress line on stderr (shown only on a terminal, for work over about 1 s)",
    )
    p.add_argument(
        "--touched",
        nargs="+",
        metavar="FILE",
        default=[],
        help="files the agent changed since the last run (recorded in the session for reread.recent_files)",
    )
    add_search_path(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    unwind_on_sigterm()  # an ongoing compaction is marked as interrupted
    distinct_outputs(output=args.output, report=args.report)
    # The caller's history is what every later call starts from: never written over.
    outputs_apart_from([args.input], "the input", output=args.output, report=args.report)
    store = named_store(args)  # a bad --store is a usage error before any input is read
    if args.session and (store is None or is_filesystem(store)):
        check_session_dir(args.session, store.root if store is not None else None)
    outputs_outside(kept_places(store, args.session), output=args.output, report=args.report)
    data = read_json(args.input)
    name = "<stdin>" if args.input == "-" else args.input
    # The whole input is read in its format before a session is opened: an input that is not
    # readable is an error, never half-processed.
    messages: Any = None
    tools: Any = None
    try:
        kind = detect(data) if args.format == "auto" else args.format
        if kind == "anthropic":
            anthropic_format.decode(data)
        elif args.format == "openai" and isinstance(data, dict) and detect(data) == "anthropic":
            raise FormatError(
                "this is an Anthropic Messages request (top-level 'system', tool_use/tool_result "
                "blocks or tools with input_schema); use --format anthropic or auto"
            )
        else:
            messages, tools = split_input(data)
            validate_messages(messages)  # what no stage repairs is named here, with the file
    except MessagesError as exc:  # a FormatError too
        raise UsageError(f"{name}: {exc}") from None
    session = open_session(
        args.pack,
        args.model,
        # A session id of a URL store by the rule every verb names one with (cli.stores).
        session=args.session if store is None or is_filesystem(store) else session_key(store, args.session),
        window=args.window,
        search_path=args.search_path,
        store=store,
    )
    if args.touched:
        session.touch(*args.touched)
    if wanted(args.quiet):
        display = TerminalProgress()
        session.on_event = display.on_event  # stage events, and the summarizer's stream notes
        with display:
            result, out = _prepare(session, kind, data, messages, tools)
    else:
        result, out = _prepare(session, kind, data, messages, tools)
    write_text(args.output, dump(out))
    if args.report:
        write_text(args.report, dump(result.report))
    if args.explain:
        stream = sys.stderr if "-" in (args.output, args.report) else stdout_writer()
        stream.write(printable(report_table(result.report), one_line=False))
    after = result.report["after"]
    if not after.get("fits", True):
        # The output and the report are written as usual (the caller may still inspect or
        # send them); the exit code says the provider will reject this request.
        failure = _vault_failure(result.report)
        if failure is not None:  # not the window's fault: the disk's (exit 2, as any vault error)
            sys.stderr.write(
                f"ctxrules: error: {failure}; the stages that needed it failed, so the output does not fit\n"
            )
            return 2
        sys.stderr.write(f"ctxrules: does not fit: {after.get('reason', 'the output exceeds the usable window')}\n")
        return 1
    return 0


def _vault_failure(report: dict[str, Any]) -> str | None:
    """The first stage error of the run that is a vault the session cannot write (a full disk,
    a folder it may not write in), without its type name; None when there is none."""
    for stage in report.get("stages") or []:
        error = stage.get("error") or ""
        if error.startswith(_VAULT_WRITE):
            return error.removeprefix("VaultError: ")
    return None


_VAULT_WRITE = "VaultError: cannot write to the vault at "


def _prepare(session: Any, kind: str, data: Any, messages: Any, tools: Any) -> tuple[Any, Any]:
    """The prepare result and the output to write, in the input's format."""
    if kind == "anthropic":
        result = session.prepare(data, format="anthropic")
        return result, result.body
    result = session.prepare(messages, tools)
    return result, _openai_output(data, tools, result)


def _openai_output(data: Any, tools: Any, result: Any) -> Any:
    """A list for a list; a request object with its messages (and tools) replaced and the call
    options the pack adds where the caller set none (a body sendable as it is)."""
    if isinstance(data, dict):
        return openai_format.encode(result.messages, result.tools if tools is not None else None, data, result.request)
    return result.messages
