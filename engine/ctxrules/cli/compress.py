"""``ctxrules compress``: run a command (or read captured output) and print it compressed.

Proxy mode: ``ctxrules compress [--pack P] [--raw] [--stream] [--stats] -- CMD ARGS...`` runs
CMD with its standard error merged into its standard output (as an agent's shell tool sees
them), prints nothing until it ends, then prints the compressed output, stores the full output
in the session's vault and exits with CMD's exit code (128+N when a signal N ended it). Exit 125
when ctxrules itself cannot start (bad pack, bad option, bad store: CMD does not run; argparse's
usage errors too, :func:`ctxrules.cli.main.run`), 126 when CMD is not executable and 127 when it
is not found, as ``env`` and ``timeout`` do. A failure of ctxrules *after* CMD ran (a rule that
misbehaves, a vault that cannot be written) prints the full, uncompressed output, warns on
standard error, and still exits with CMD's code. CMD runs in its own process group; SIGINT,
SIGTERM and SIGHUP are forwarded to it (:mod:`ctxrules.cli.child`), and what it wrote before a
signal ended it is still compressed, vaulted and printed. A background job CMD leaves (``sh -c
'server & ...'``) is not waited for and keeps running; what it writes after CMD ended is not
part of the output. A pack pattern that times out is recorded in the session's ``state.json``
(``compress`` section), so later ``compress`` processes of the session skip it at once
(:mod:`ctxrules.patterns`).

Filter mode: ``ctxrules compress --command "CMD" [--exit-code N] --input FILE|-`` compresses
output captured earlier; it exits 0, or 2 on a usage error.

Only the first ``--max-output`` bytes of an output are kept (:data:`~ctxrules.compressors.large.MAX_BYTES`
by default): proxy mode reads and drops the rest while CMD runs on, filter mode stops reading;
the printed result ends with a line that says so.

When standard output feeds another command of a shell pipeline
(:func:`ctxrules.compressors.pipes.stdout_feeds_pipeline`), proxy mode passes CMD's output
through unchanged unless ``--always`` is given.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import shlex
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from ctxrules.cli.io import add_search_path, stdin_binary, unwind_on_sigterm
from ctxrules.cli.output import STDOUT_CLOSED
from ctxrules.cli.stores import add_store_options, session_key, store_of
from ctxrules.compressors.api import CompressorSkipped, compress_large, compress_text, early_scan
from ctxrules.compressors.large import MAX_BYTES, Capture, Large
from ctxrules.compressors.pipes import stdout_feeds_pipeline
from ctxrules.errors import CtxrulesError, UsageError
from ctxrules.json_files import input_stat
from ctxrules.models import lookup_model
from ctxrules.packs.validated import load_pack
from ctxrules.patterns import STATE_KEY, merged_entries, remembering, time_budget
from ctxrules.plugins import default_registry
from ctxrules.printable import encodable, printable
from ctxrules.stores import Store
from ctxrules.tokens import TokenCounter
from ctxrules.vault import Vault

if TYPE_CHECKING:
    from ctxrules.cli.child import Child

DEFAULT_MODEL = "gpt-4o"
"""Tokenizer for ``--stats``: o200k_base, exact and offline, the most common agent family."""

EXIT_CTXRULES_FAILED = 125
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127
_CLOSED = STDOUT_CLOSED  # the words every verb uses


def register(sub: Any) -> None:
    p = sub.add_parser(
        "compress",
        help="run a command and print its output compressed",
        description="Run CMD (after --), print its output compressed by the pack's compressor "
        "rules and exit with its exit code; or, with --command and --input, compress output "
        "captured earlier. The full output goes to the session's vault; every elided line "
        "leaves a [ctxrules:elided ...] marker that `ctxrules vault get` resolves.",
    )
    p.add_argument(
        "--pack", default="builtin:default", help="rule pack: a path or builtin:NAME (default builtin:default)"
    )
    p.add_argument("--raw", action="store_true", help="print the output unchanged (run the command, drop nothing)")
    p.add_argument(
        "--stream", action="store_true", help="also copy the output live to standard error while the command runs"
    )
    p.add_argument("--stats", action="store_true", help="print lines and tokens before and after on standard error")
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"tokenizer for --stats (default {DEFAULT_MODEL})")
    p.add_argument(
        "--always", action="store_true", help="compress even when the output feeds another command of a pipeline"
    )
    p.add_argument(
        "--session",
        help="session directory (the session id with a --store URL) whose vault keeps the full output "
        "(default: <state>/default)",
    )
    add_store_options(p)
    p.add_argument("--command", dest="command_line", help="filter mode: the command line that produced --input")
    p.add_argument(
        "--exit-code", type=int, default=None, help="filter mode: the command's exit code (default: unknown)"
    )
    p.add_argument("--input", help="filter mode: captured output, a file or - for stdin")
    p.add_argument(
        "--max-output",
        type=_size,
        default=MAX_BYTES,
        metavar="SIZE",
        help="keep at most this much of the output (bytes, or with K, M, G; default 1G): the vault "
        "keeps the first SIZE bytes, the rest is not kept and the printed result says so",
    )
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD ARGS", help="the command to run")
    add_search_path(p)
    p.set_defaults(func=run)


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _size(text: str) -> int:
    """``--max-output``: bytes, or a number with K, M, G or T (binary units, ``B``/``iB`` allowed)."""
    import re

    m = re.fullmatch(r"\s*([0-9]{1,15})\s*([KMGT]?)(?:I?B)?\s*", text, re.IGNORECASE)
    if m is None or int(m[1]) < 1:
        raise argparse.ArgumentTypeError(f"expected a size of at least 1 byte such as 500M or 2G, got {text[:40]!r}")
    return int(m[1]) * _UNITS[m[2].upper()]


def _session(args: argparse.Namespace) -> tuple[Store, str]:
    """The store and the session whose vault keeps the full output (and whose state remembers
    timed-out patterns), opened once, before any input is read or CMD runs."""
    opened: tuple[Store, str] | None = getattr(args, "opened_session", None)
    if opened is None:
        store = store_of(args)
        opened = args.opened_session = (store, session_key(store, args.session))
    return opened


def _load(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    pack = load_pack(args.pack, search_path=args.search_path)
    counter = TokenCounter.for_model(lookup_model(args.model)) if args.stats else None
    return pack.data, counter


def _decode(raw: bytes) -> tuple[str, bool]:
    """The text to compress, and whether it is exactly ``raw`` (valid UTF-8)."""
    try:
        return raw.decode("utf-8"), True
    except UnicodeDecodeError:
        # Lines and their numbers survive "replace" (it never touches b"\n"), so markers still
        # point at the right lines of the raw bytes the vault keeps.
        return raw.decode("utf-8", "replace"), False


def _compress(
    args: argparse.Namespace, pack: dict[str, Any], counter: Any, command: str, raw: bytes, exit_code: int | None
) -> bytes:
    """The bytes to print: compressed (full output stored first) or ``raw`` when nothing applies."""
    text, exact = _decode(raw)
    vault_id = hashlib.sha256(raw).hexdigest()
    store, session = _session(args)
    # Patterns that timed out in an earlier compress of this session are skipped at once, so
    # the outcome does not depend on how loaded the machine was (ctxrules.patterns).
    section = _remembered(store, session)
    known = list(section.get(STATE_KEY) or [])
    try:
        with remembering(section), time_budget():
            result = compress_text(pack, command, text, exit_code, vault_id=vault_id, registry=default_registry())
    except CompressorSkipped as exc:  # a pack pattern timed out: the output goes out as it is
        _note(f"warning: {exc}")
        result = None
    if section.get(STATE_KEY, known) != known:
        _remember(store, session, section[STATE_KEY])
    if result is None:
        if counter is not None:
            tokens = counter.count_text(text)
            _note(
                f"no compressor applied to {command!r} (no rule matches, or it would not save "
                f"anything); {tokens:,} tokens ({args.model})"
            )
        return raw
    vault = Vault.of(store, session)
    stored = vault.put_text(text) if exact else vault.put_bytes(raw, "text/plain")
    if stored != vault_id:  # pragma: no cover - the vault's id is the sha256 of these bytes
        raise CtxrulesError(f"vault stored the output as {stored}, markers say {vault_id}")
    if counter is not None:
        before, after = counter.count_text(text), counter.count_text(result.text)
        kind = "estimate" if counter.is_estimate else "exact"
        saved = 100 * (before - after) / before if before else 0.0
        _note(
            f"compressor '{result.rule_id}': {result.lines_before:,} -> {result.lines_after:,} "
            f"lines, {before:,} -> {after:,} tokens (-{saved:.0f}%, {args.model}, {kind}); "
            f"full output: vault://{vault_id}"
        )
    return result.text.encode("utf-8", "surrogateescape" if exact else "replace")


def _remembered(store: Store, session: str) -> dict[str, Any]:
    """The ``compress`` section of the session's state (empty when there is none). A state
    that cannot be read (a link where ``state.json`` belongs) costs the memory, not the run;
    it is reported only when there is something to remember (:func:`_remember`), so that a
    command's output does not carry the same warning on every call."""
    try:
        section = store.load_turn(session, output=False).state.get("compress")
    except CtxrulesError:
        return {}
    return dict(section) if isinstance(section, dict) else {}


def _remember(store: Store, session: str, keys: list[str]) -> None:
    """Add ``keys`` (timed-out patterns) to the session state, under the session lock: the
    state is loaded again there, so what a concurrent ``run`` wrote is kept."""
    try:
        with store.prepare_lock(session):
            state = store.load_turn(session, output=False).state
            section = state.get("compress")
            section = dict(section) if isinstance(section, dict) else {}
            section[STATE_KEY] = merged_entries(section.get(STATE_KEY), keys)
            state["compress"] = section
            store.save_state(session, state)
    except (CtxrulesError, OSError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        _note(f"warning: timed-out patterns are not remembered: {reason}")


class _Stderr:
    """Standard error is shared by the live copy (``--stream``) and ctxrules's own notes: a note
    must start on a line of its own even when the command's last line had no newline."""

    line_open = False
    watched = True  # neither the live copy nor a note is written once nobody reads them

    @classmethod
    def gone(cls) -> None:
        """Nobody reads standard error any more (a closed terminal, `2>&1 >out | head`): CMD
        runs on and its output is still compressed and printed. What is left buffered for
        standard error goes to the null device, so that no later write to it fails again."""
        cls.watched = False
        with contextlib.suppress(OSError), open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), 2)


def _note(message: str) -> None:
    if not _Stderr.watched:
        return
    lead = "\n" if _Stderr.line_open else ""
    _Stderr.line_open = False
    try:
        # CMD's name and what the system says come from outside: shown as escapes, never acted
        # on by the terminal (`compress -- $'\e[2J'` cleared the screen), a non-UTF-8 byte as \xff.
        sys.stderr.write(f"{lead}ctxrules: {printable(encodable(message), one_line=False)}\n")
        sys.stderr.flush()
    except (OSError, AttributeError):  # AttributeError: sys.stderr is None, its fd 2 was closed
        _Stderr.gone()


class _Unprinted(Exception):
    """Standard output did not take the result: its reader went away (``EPIPE``), a full disk."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


@contextlib.contextmanager
def _printing() -> Iterator[None]:
    """Writing to standard output; a failure there is :class:`_Unprinted`, and what is still
    buffered for it goes to the null device (the exit-time flush would fail again)."""
    try:
        yield
    except OSError as exc:
        with contextlib.suppress(OSError, AttributeError, ValueError), open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), sys.stdout.fileno())
        raise _Unprinted(exc) from exc


class _Stdout:
    """Whether what was printed last ended a line (or nothing was printed), and a failure to
    print the output passed through (:func:`_pass_through`)."""

    line_start = True
    unprinted: _Unprinted | None = None


def _write(data: bytes) -> None:
    with _printing():
        out: IO[bytes] = sys.stdout.buffer
        out.write(data)
        out.flush()
    if data:
        _Stdout.line_start = data.endswith(b"\n")


def _code_of(returncode: int) -> int:
    # A child killed by signal N reports -N; shells report 128+N.
    return 128 - returncode if returncode < 0 else returncode


def _spawn(argv: list[str], capture: bool) -> Child:
    from ctxrules.cli.child import Child

    name = argv[0]
    if not name:  # `compress -- "$UNSET"`: no command, as a shell says it (exec of "" is EACCES)
        raise _Exit(EXIT_NOT_FOUND, "'': command not found")
    try:
        return Child(argv, capture=capture)
    except FileNotFoundError:
        found = name if os.sep in name else shutil.which(name)
        if found is not None and os.path.isfile(found):
            # The file is there: what is missing is the interpreter its #! line names (ENOENT
            # from exec too). 127 still, as env and timeout exit.
            raise _Exit(EXIT_NOT_FOUND, f"{name}: cannot run: the interpreter {_shebang(found)} is not found") from None
        raise _Exit(EXIT_NOT_FOUND, f"{name}: command not found") from None
    except PermissionError:
        if os.path.isdir(name):  # exec of a folder is EACCES too
            raise _Exit(EXIT_NOT_EXECUTABLE, f"{name}: cannot run: it is a folder") from None
        raise _Exit(EXIT_NOT_EXECUTABLE, f"{name}: permission denied (not executable)") from None
    except OSError as exc:  # ENOEXEC, ...
        raise _Exit(EXIT_NOT_EXECUTABLE, f"{name}: cannot run: {exc.strerror or exc}") from None


def _shebang(path: str) -> str:
    """The ``#!`` line of ``path`` as the message shows it (its first 200 bytes at most)."""
    try:
        with open(path, "rb") as file:
            first = file.readline(200)
    except OSError:
        return "its #! line names"
    line = first.rstrip(b"\r\n").decode("utf-8", "surrogateescape")
    return f"its #! line names ({line})" if line.startswith("#!") else "its #! line names"


class _Exit(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _echo(chunk: bytes) -> None:
    if not chunk or not _Stderr.watched:
        return
    try:
        err = sys.stderr.buffer
        err.write(chunk)
        err.flush()
    except (OSError, AttributeError):
        _Stderr.gone()
        return
    _Stderr.line_open = not chunk.endswith(b"\n")


def _status(child: Child, returncode: int) -> int:
    """The command's status; after a forwarded signal, 128+N even if the command exited 0."""
    code = _code_of(returncode)
    if child.signal is not None and code == 0:
        return 128 + child.signal
    return code


def _proxy(args: argparse.Namespace, argv: list[str]) -> int:
    # While CMD runs, Child forwards SIGTERM to it; after, SIGTERM unwinds (exit 143) as in
    # filter mode, so the entry of a spilled output is removed instead of left in the vault.
    unwind_on_sigterm()
    try:
        # A bad --store (an unknown scheme, --state too) stops ctxrules before CMD runs: 125,
        # not 2, which could be CMD's own code.
        _session(args)
        pack, counter = _load(args)
    except CtxrulesError as exc:
        _note(f"error: {exc}")
        return EXIT_CTXRULES_FAILED
    if sys.stdout is None and not args.raw:  # `>&-`: the result could go nowhere
        _note(f"error: {_CLOSED} (CMD does not run)")
        return EXIT_CTXRULES_FAILED
    passthrough = args.raw or (
        not args.always and not sys.stdout.isatty() and stdout_feeds_pipeline(sys.stdout.fileno())
    )
    try:
        child = _spawn(argv, capture=not passthrough)
    except _Exit as exc:
        _note(str(exc))
        return exc.code
    # SIGINT, SIGTERM and SIGHUP go to the command's process group while it runs; what it
    # wrote before it ended is kept, compressed, vaulted and printed like any output.
    if passthrough:
        return _status(child, child.run()[1])
    capture = _capture(args, pack, shlex.join(argv))

    def sink(chunk: bytes) -> None:
        capture.write(chunk)
        if args.stream:
            _echo(chunk)

    try:
        code = _status(child, child.run_into(sink))
        _emit(args, pack, counter, shlex.join(argv), capture, code)
        _say_cut(capture, read_on=True)
    except _Unprinted as exc:
        # The exit code is still CMD's: a reader that went away (`| head -1`) is no news,
        # a full disk is.
        if not isinstance(exc.error, BrokenPipeError):
            _note(f"warning: the output was not printed: {exc.error.strerror or exc.error}")
    except BaseException:
        _abandon(capture)
        raise
    return code


def _abandon(capture: Capture) -> None:
    """Stopped (Ctrl-C, SIGTERM) or failed while compressing: the scan of a spilled output's
    middle ends and is waited for, and the entry not yet committed goes (harmless after the
    commit). Left, the entry stayed in the vault as a temporary file as large as the output,
    and the scan's thread, still in RE2 as the interpreter ended, aborted the process."""
    capture.discard()


def _capture(args: argparse.Namespace, pack: dict[str, Any], command: str, exit_code: int | None = 0) -> Capture:
    """Where the output goes as it comes: memory, then (when large) the session's vault, its
    middle searched for failure lines as it is written (compressors.api.early_scan)."""
    return Capture(
        lambda: Vault.of(*_session(args)).open_writer(),
        early=early_scan(pack, command, registry=default_registry(), exit_code=exit_code),
        max_bytes=args.max_output,
        overflow=_pass_through,
    )


def _pass_through(data: bytes) -> None:
    """The output as it comes, unchanged, once the vault could not take it (a full disk
    mid-spill): printed now instead of held. A standard output that fails is reported after."""
    if _Stdout.unprinted is None:
        try:
            _write(data)
        except _Unprinted as exc:
            _Stdout.unprinted = exc


def _say_cut(capture: Capture, *, read_on: bool) -> None:
    """Print, after the result, that the output went past ``--max-output`` (it ends mid-line,
    most likely: the note starts a line of its own), and warn on standard error. ``read_on``:
    the rest was read and dropped (proxy mode: CMD runs to its end); else it was not read."""
    if not capture.dropped:
        return
    rest = f"{capture.dropped:,} more bytes were not kept" if read_on else "the rest was not read"
    note = f"output cut at {capture.size:,} bytes (--max-output); {rest}"
    _note(f"warning: {note}")
    _write(f"{'' if _Stdout.line_start else chr(10)}[ctxrules: {note}]\n".encode())


def _emit(
    args: argparse.Namespace, pack: dict[str, Any], counter: Any, command: str, capture: Capture, code: int | None
) -> None:
    captured = capture.finish()
    if capture.overflowed:  # printed as it came
        _note(f"warning: output not compressed: {capture.error}")
        if _Stdout.unprinted is not None:
            raise _Stdout.unprinted
        return
    if isinstance(captured, Large):
        _emit_large(args, pack, counter, command, captured, code)
        return
    try:
        out = _compress(args, pack, counter, command, captured, code)
    except CtxrulesError as exc:
        _note(f"warning: output not compressed: {exc}")
        out = captured
    _write(out)


def _emit_large(
    args: argparse.Namespace, pack: dict[str, Any], counter: Any, command: str, large: Large, code: int | None
) -> None:
    """An output held in part: compressed from its windows, the vault entry kept; or, when no
    compressor applies, copied out whole from the entry being written, which is then dropped."""
    writer = large.writer
    store, session = _session(args)
    section = _remembered(store, session)  # timed-out patterns, as for an output held whole
    known = list(section.get(STATE_KEY) or [])
    try:
        with remembering(section), time_budget():
            result = compress_large(pack, command, large, code, registry=default_registry())
        # Counted before the commit: the entry is a local file until then, whatever the store.
        before = _count_file(counter, Path(writer.path)) if counter is not None and result is not None else 0
        stored = writer.commit() if result is not None else None
    except CompressorSkipped as exc:  # a pack pattern timed out: the output goes out as it is
        _note(f"warning: {exc}")
        result = stored = None
    except CtxrulesError as exc:
        _note(f"warning: output not compressed: {exc}")
        result = stored = None
    if section.get(STATE_KEY, known) != known:
        _remember(store, session, section[STATE_KEY])
    if result is None or stored is None:
        if counter is not None and result is None:
            _note(f"no compressor applied to {command!r}; ~{_count_file(counter, writer.path):,} tokens ({args.model})")
        try:
            _copy_out(writer.path)
        finally:  # printed or not (a reader that went away), the entry is not kept
            writer.discard()
        return
    if counter is not None:
        after = counter.count_text(result.text)
        saved = 100 * (before - after) / before if before else 0.0
        _note(
            f"compressor '{result.rule_id}': {result.lines_before:,} -> {result.lines_after:,} "
            f"lines, ~{before:,} -> {after:,} tokens (-{saved:.0f}%, {args.model}; the output was "
            f"{large.size:,} bytes, compressed from its first and last lines); full output: vault://{stored}"
        )
    _write(result.text.encode("utf-8", "replace"))


def _count_file(counter: Any, path: Path) -> int:
    """Tokens of a file too large to tokenize at once, counted in pieces cut at line ends (a
    piece boundary can shift the count by a token, hence the ``~`` where it is shown)."""
    total = 0
    carry = b""
    with open(path, "rb") as handle:
        while True:
            data = handle.read(1 << 20)
            if not data:
                break
            data = carry + data
            cut = data.rfind(b"\n") + 1 or len(data)
            total += counter.count_text(data[:cut].decode("utf-8", "replace"))
            carry = data[cut:]
    if carry:
        total += counter.count_text(carry.decode("utf-8", "replace"))
    return total


def _copy_out(path: Path) -> None:
    with open(path, "rb") as handle, _printing():
        out: IO[bytes] = sys.stdout.buffer
        shutil.copyfileobj(handle, out, 1 << 20)
        out.flush()
        if handle.tell():
            handle.seek(-1, os.SEEK_CUR)
            _Stdout.line_start = handle.read(1) == b"\n"


def _filter(args: argparse.Namespace) -> int:
    if not args.input:
        raise UsageError("--command needs --input FILE (or - for standard input)")
    unwind_on_sigterm()  # `timeout` stopping it: what a large input had spilled is removed
    pack, counter = _load(args)
    stdin = stdin_binary() if args.input == "-" else None  # closed (`<&-`): refused here
    name = "<stdin>" if stdin is not None else args.input
    capture = _capture(args, pack, args.command_line, args.exit_code)
    try:
        if stdin is not None:
            _read_into(stdin, capture)
        else:
            with open(args.input, "rb") as handle:
                input_stat(handle.fileno(), name)  # /dev/zero would fill the vault
                _read_into(handle, capture)
    except BaseException as exc:
        # Nothing was printed: what a large input had spilled to the vault goes (a read that
        # failed, a Ctrl-C), or it would stay there as a temporary file of any size.
        capture.discard()
        if isinstance(exc, FileNotFoundError):
            raise UsageError(f"{name}: no such file") from None
        if isinstance(exc, IsADirectoryError):
            raise UsageError(f"{name}: is a directory") from None
        if isinstance(exc, OSError):
            raise UsageError(f"{name}: cannot read: {exc.strerror or exc}") from None
        raise
    try:
        # As in proxy mode: when compressing fails (a vault that cannot be written), the
        # input is printed unchanged with a warning; read from stdin, it exists nowhere else.
        _emit(args, pack, counter, args.command_line, capture, args.exit_code)
        _say_cut(capture, read_on=False)
    except BaseException:
        _abandon(capture)
        raise
    return 0


def _read_into(handle: IO[bytes], capture: Capture) -> None:
    """Read until the end, or until a byte past ``--max-output`` came (``yes |`` never ends:
    the writer gets SIGPIPE once ctxrules exits)."""
    while not capture.dropped:
        data = handle.read(1 << 20)
        if not data:
            return
        capture.write(data)


def run(args: argparse.Namespace) -> int:
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if args.command_line is not None:
        if argv:
            raise UsageError("give either --command with --input, or a command after --, not both")
        if sys.stdout is None:
            raise UsageError(_CLOSED)
        _session(args)  # a bad --store is a usage error before the input is read
        try:
            return _filter(args)
        except _Unprinted as exc:
            if isinstance(exc.error, BrokenPipeError):  # the reader went away: as for every verb
                return 0
            raise CtxrulesError(f"the output was not printed: {exc.error.strerror or exc.error}") from None
    if args.input is not None or args.exit_code is not None:
        raise UsageError('--input and --exit-code need --command "CMD"')
    if not argv:
        raise UsageError('nothing to run: ctxrules compress [OPTIONS] -- CMD ARGS... (or --command "CMD" --input FILE)')
    try:
        return _proxy(args, argv)
    except BrokenPipeError:
        # Our reader went away; the command's status is still what the caller asked for.
        with open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), sys.stdout.fileno())
        return 0
