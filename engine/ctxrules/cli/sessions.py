"""``ctxrules sessions scan|resume|export|import``: interrupted compactions, and moving a
session between stores."""

from __future__ import annotations

import argparse
import contextlib
import errno
import io
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, BinaryIO, cast

from ctxrules.cli.io import outputs_outside, stdin_binary, writable_outputs, write_text
from ctxrules.cli.output import require_stdout, stdout_writer, write_stdout
from ctxrules.cli.stores import (
    add_store_options,
    check_session_dir,
    describe_store,
    is_filesystem,
    kept_places,
    session_key,
    store_of,
)
from ctxrules.errors import UsageError
from ctxrules.json_files import input_stat
from ctxrules.printable import printable
from ctxrules.runtime.checkpoint import resume, scan
from ctxrules.stores import session_id_for
from ctxrules.stores.archive import ArchiveFile, export_session, import_session


def register(sub: Any) -> None:
    p = sub.add_parser("sessions", help="find and resume interrupted sessions; move sessions between stores")
    ssub = p.add_subparsers(dest="sessions_verb", metavar="ACTION", parser_class=type(p))
    ssub.required = True
    s = ssub.add_parser("scan", help="list the sessions of a store whose last compaction was cut short")
    add_store_options(s)
    s.set_defaults(func=run_scan)
    r = ssub.add_parser(
        "resume",
        help="restore a session to the state before its interrupted compaction "
        "and print the messages that compaction started from",
    )
    r.add_argument("session", metavar="SESSION", help="the session directory (the session id with a --store URL)")
    r.add_argument("--output", default="-", help="where to write the messages (default: stdout)")
    add_store_options(r)
    r.set_defaults(func=run_resume)
    e = ssub.add_parser(
        "export",
        help="write a session (state, last output, vault, notes, ledger) to one portable file",
        description="Write a session to a JSON-lines archive that `ctxrules sessions import` reads into "
        "any store (filesystem or Redis); vault items keep their exact bytes.",
    )
    e.add_argument("session", metavar="SESSION", help="the session directory (the session id with a --store URL)")
    e.add_argument("--to", required=True, metavar="FILE", help="the archive to write, or - for stdout")
    add_store_options(e)
    e.set_defaults(func=run_export)
    i = ssub.add_parser(
        "import",
        help="read a session archive (from `sessions export`) into a store",
        description="Read an archive written by `ctxrules sessions export` into a store, as a new "
        "session (an existing one is never overwritten).",
    )
    i.add_argument("archive", metavar="FILE", help="the archive, or - for stdin")
    i.add_argument(
        "--session",
        metavar="SESSION",
        help="the session to create: a directory, or an id with a --store URL (default: the exported session's id)",
    )
    add_store_options(i)
    i.set_defaults(func=run_import)


def run_scan(args: argparse.Namespace) -> int:
    store = store_of(args)
    if is_filesystem(store):
        # A state root the options name must be there: "0 interrupted sessions" for a mistyped
        # path would read as "nothing to resume". The default root may not exist yet.
        named = args.state is not None or args.store is not None
        if named and not store.root.exists():
            raise UsageError(f"{store.root}: no such directory")
    found = scan(store.root) if is_filesystem(store) else scan(store)
    for hit in found:
        after = f" (after the first {hit.prefix} messages of last_output.jsonl)" if hit.prefix else ""
        where = hit.session if is_filesystem(store) else store.describe(str(hit.session))
        # The reason and the backup come from the checkpoint file, which a cloned repository's
        # .ctxrules may hold: escape sequences shown as escapes, one line per session.
        where, reason, backup = (printable(str(value)) for value in (where, hit.reason, hit.backup))
        write_stdout(f"{where}\t{reason}\tbackup={backup}{after}\n")
    write_stdout(f"{len(found)} interrupted session(s) under {describe_store(store)}\n")
    return 0


def run_resume(args: argparse.Namespace) -> int:
    store = store_of(args)
    outputs_outside(kept_places(store, args.session), output=args.output)
    # Refused before the checkpoint is used up, and written before it is marked resumed: the
    # messages are delivered, or the session stays as it was for a retry.
    writable_outputs(output=args.output)
    if args.output in (None, "-"):
        require_stdout()

    def deliver(messages: list[dict[str, Any]]) -> None:
        write_text(args.output, json.dumps(messages, ensure_ascii=False, indent=2) + "\n")

    if is_filesystem(store):
        check_session_dir(args.session, store.root)
        resume(Path(args.session), deliver=deliver)
    else:
        resume(session_key(store, args.session), store=store, deliver=deliver)
    return 0


def run_export(args: argparse.Namespace) -> int:
    store = store_of(args)
    key = session_key(store, args.session)
    outputs_outside(kept_places(store, key), to=args.to)
    name = Path(key).resolve().name if is_filesystem(store) else key
    if args.to == "-":
        counts = export_session(store, key, stdout_writer(binary=True), name=name)
    else:
        target = Path(args.to)
        if target.exists() and not target.is_file():
            raise UsageError(f"--to {target}: not a regular file")
        # A new file of a name nobody can have placed (no link followed), mode 0600 whatever
        # the umask: the archive holds the conversation and the session's signing key.
        try:
            fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".partial")
        except OSError as exc:
            raise UsageError(f"--to {target}: cannot write: {exc.strerror or exc}") from None
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb", buffering=0) as raw:  # unbuffered: no write left for close()
                counts = export_session(store, key, cast(IO[bytes], _Sink(raw)), name=name)
            tmp.replace(target)  # a reader never sees half an archive
        except _WriteFailed as failed:  # a full disk: the archive's place is the user's to fix
            raise UsageError(f"--to {target}: cannot write: {failed.reason}") from None
        finally:
            tmp.unlink(missing_ok=True)  # (gone once renamed)
    sys.stderr.write(
        f"exported {store.describe(key)}: {counts['blobs']} vault item(s), {counts['docs']} document(s), "
        f"{counts['ledger']} ledger record(s)\n"
    )
    return 0


class _WriteFailed(Exception):
    def __init__(self, exc: OSError) -> None:
        super().__init__(exc)
        self.reason = exc.strerror or str(exc)


class _Sink(io.RawIOBase):
    """The archive file: a write (or flush) that fails is the archive's, told apart from a
    failure reading the session (the store names its own paths)."""

    def __init__(self, out: Any) -> None:
        super().__init__()
        self._out = out

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        try:
            while view:
                written = self._out.write(view)
                if not written:  # (a regular file takes at least a byte, or says why not)
                    raise OSError(errno.EIO, os.strerror(errno.EIO))
                view = view[written:]
        except OSError as exc:
            raise _WriteFailed(exc) from exc
        return len(data)

    def flush(self) -> None:
        try:
            self._out.flush()
        except OSError as exc:
            raise _WriteFailed(exc) from exc


def run_import(args: argparse.Namespace) -> int:
    require_stdout()  # before the import: a retry after exit 2 would find the session there
    store = store_of(args)
    where = "<stdin>" if args.archive == "-" else args.archive
    keys: list[str] = []

    def target(header: dict[str, Any]) -> str:
        name = args.session
        if name is None:
            exported = header.get("session")
            if not isinstance(exported, str) or not exported:
                raise UsageError(f"{where}: the archive names no session; give --session")
            name = str(store.root / session_id_for(exported)) if is_filesystem(store) else exported
        keys.append(session_key(store, name))
        return keys[-1]

    if args.session is not None:
        target({})  # a --session that cannot be one is refused before the archive is read
    try:
        with _archive_file(args.archive) as handle, ArchiveFile(handle, where) as archive:
            counts = import_session(store, target, archive, where=where)
    except OSError as exc:
        if isinstance(exc.filename, (str, bytes)) and os.fsdecode(exc.filename) != args.archive:
            # A path of the store (a --session name too long, below a file; a full disk): not
            # the archive's fault, so the entry point names that path, not "cannot read".
            raise
        raise UsageError(f"{where}: cannot read: {exc.strerror or exc}") from None
    write_stdout(
        f"imported {store.describe(keys[-1])}: {counts['blobs']} vault item(s), {counts['docs']} document(s), "
        f"{counts['ledger']} ledger record(s)\n"
    )
    return 0


@contextlib.contextmanager
def _archive_file(path: str) -> Iterator[BinaryIO]:
    """The archive ``path`` names (``-``: standard input), open for reading a line at a time
    (never read whole: a sparse file claiming gigabytes costs no memory). A usage error for
    standard input closed, a file that cannot be opened, and one that is neither a regular file
    nor a pipe: a device such as /dev/zero never ends."""
    if path == "-":
        yield stdin_binary()
        return
    try:
        handle = open(path, "rb")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror or exc}") from None
    with handle:
        input_stat(handle.fileno(), path)
        yield handle
