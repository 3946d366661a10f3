"""Reading and writing the message files the CLI takes (``-`` is stdin/stdout)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ctxrules.cli.output import flush_stdout, write_stdout
from ctxrules.cli.stops import unwind_on_sigterm as unwind_on_sigterm  # the verbs that clean up call it
from ctxrules.errors import UsageError
from ctxrules.json_files import read_json as read_json  # the verbs read their inputs through it
from ctxrules.json_files import stdin_binary as stdin_binary  # and `-` that is not JSON


def write_text(path: str, text: str) -> None:
    """``text`` as the whole of the file ``path`` (``-``: standard output). A regular file
    (or a new one) is written beside itself and renamed over the old one: a write that fails (a
    full disk) leaves the file as it was, never cut off. A device or a pipe (``/dev/stdout``) is
    written in place, and so is a file whose folder takes no new file."""
    if path == "-":
        write_stdout(text)
        flush_stdout()
        return
    data = text.encode("utf-8")
    try:
        stream = _standard_stream(path)
        if stream == 1:  # `--output /dev/stdout >> log`: opened again, the log would be cut off
            write_stdout(text)
            flush_stdout()
        elif stream == 2:
            sys.stderr.flush()
            _write_all(2, data)
        elif not _replace_with(path, data):
            with open(path, "wb") as out:
                out.write(data)
    except OSError as exc:
        raise UsageError(f"{path}: cannot write: {exc.strerror or exc}") from None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _standard_stream(path: str) -> int | None:
    """1 or 2 when ``path`` names the file this process's standard output or error is (through
    ``/dev/stdout``, ``/proc/self/fd/1``, or the file's own name): written through that
    descriptor, which keeps the shell's ``>>`` and the position; else None."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    for fd in (1, 2):
        with contextlib.suppress(OSError):
            other = os.fstat(fd)
            if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino):
                return fd
    return None


def _replace_with(path: str, data: bytes) -> bool:
    """Write ``data`` to a new file beside ``path`` (a link: beside the file it names) and rename
    it over ``path``, keeping the old file's mode (a new file gets the mode ``open`` gives it);
    False when ``path`` is not a plain regular file (a device, a pipe, a name under ``/dev`` or
    ``/proc``) or its folder takes no new file (write it in place)."""
    if os.path.abspath(path).startswith(("/dev/", "/proc/")):
        return False
    target = os.path.realpath(path)
    try:
        st: os.stat_result | None = os.stat(target)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        return False
    folder, name = os.path.split(target)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.{secrets.token_hex(4)}.partial")
    try:
        # Never through a link someone planted under the name; the umask applies to a new file.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600 if st else 0o666)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError) or st is None:
            raise  # no such folder, or a new file that cannot be made: say so
        return False  # a folder this user cannot add to, over a file it may write
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        if st is not None:
            os.chmod(tmp, stat.S_IMODE(st.st_mode))
            if os.geteuid() == 0 and (st.st_uid, st.st_gid) != (0, 0):
                os.chown(tmp, st.st_uid, st.st_gid)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return True


def distinct_outputs(**outputs: str | None) -> None:
    """Refuse (usage error) two options that would write to one place: both ``-`` (stdout
    would hold two documents, neither readable) or one file (the second would overwrite the
    first). ``outputs``: option name (``report`` for ``--report``) to the path given, or None."""
    seen: dict[object, str] = {}
    for option, path in outputs.items():
        if path is None:
            continue
        # A file that exists is also known by its identity: /dev/stdout is stdout, a hard link
        # is the file it links.
        keys: list[object] = ["-" if path == "-" else os.path.realpath(path)]  # (resolve() raises on a link loop)
        ident = _identity(path)
        if ident is not None:
            keys.append(ident)
        for key in keys:
            if key in seen:
                where = "stdout" if key in ("-", _identity("-")) else f"the same file ({path})"
                raise UsageError(f"--{seen[key]} and --{option} both write to {where}; give each its own file")
        for key in keys:
            seen[key] = option


def outputs_apart_from(inputs: Iterable[str | Path], noun: str, **outputs: str | None) -> None:
    """Refuse (usage error) an output that names one of ``inputs`` (each ``noun``, "a
    transcript"), by its path, through a symbolic link or as a hard link to it: it would be
    written over a file the run has just read. ``outputs``: as for :func:`distinct_outputs`
    (``-`` is never an output here). An input ``-`` is standard input: when a file was
    redirected to it (``< h.json``), that file is known by its identity."""
    read: set[object] = set()
    for item in inputs:
        if item == "-":
            ident = _stdin_identity()
            if ident is not None:
                read.add(ident)
            continue
        read.add(os.path.realpath(item))
        ident = _identity(str(item))
        if ident is not None:
            read.add(ident)
    for option, path in outputs.items():
        if path is None or path == "-":
            continue
        ident = _identity(path)
        if os.path.realpath(path) in read or (ident is not None and ident in read):
            raise UsageError(f"--{option} {path} is {noun} this run reads; give the output its own file")


def outputs_outside(places: Iterable[str | Path], **outputs: str | None) -> None:
    """Refuse (usage error) an output file in one of ``places`` (a session directory, a state
    root's signing key or ledgers: :func:`ctxrules.cli.stores.kept_places`), by its path or
    through a symbolic link: `--report SESSION/injection.key` wrote the report over the key that
    signs the session's injected messages, `--to SESSION/state.json` an archive over the state.
    ``outputs``: as for :func:`distinct_outputs` (``-`` is never an output here)."""
    kept = [(str(place), os.path.realpath(place)) for place in places]
    for option, path in outputs.items():
        if path is None or path == "-":
            continue
        where = os.path.realpath(path)
        for shown, real in kept:
            if where == real:
                said = f"is {shown}, which ctxrules keeps (it would be written over)"
            elif where.startswith(real.rstrip(os.sep) + os.sep):
                said = f"is in {shown}, which holds files ctxrules keeps (they would be written over)"
            else:
                continue
            raise UsageError(f"--{option} {path} {said}; give the output a file elsewhere")
        other = _in_another_store(where)
        if other is not None:
            raise UsageError(f"--{option} {path} {other}; give the output a file elsewhere")


def _in_another_store(real: str) -> str | None:
    """Why the output file ``real`` (resolved) would write over what ctxrules keeps for another
    session or state root than the command's: a file of a session directory (its state, last
    output, ledger), a vault, ledger or router folder's, a state root's signing key. None when
    it would not. (The places of the command's own session are in its ``places``.)"""
    from ctxrules.stores.filesystem import holds_a_session, own_folder

    parent = os.path.dirname(real)
    if holds_a_session(parent):
        return f"is in {parent}, a session directory (its files would be written over)"
    own = own_folder(parent)
    if own is not None:
        return f"is in {own[0]}, which holds {own[1]} (they would be written over)"
    if os.path.basename(real) == "injection.key" and os.path.lexists(real):
        return "is a state root's signing key (it would be written over)"
    return None


def writable_outputs(**outputs: str | None) -> None:
    """Refuse (usage error) an output file that cannot be written, before a long run rather
    than after it: a folder that does not exist, a read-only file or folder, a folder given as
    the file. A file that does not exist yet is created and removed again; one that exists is
    opened for appending (nothing written, its time stamps kept). Pipes and devices are left
    to the write itself. ``outputs``: as for :func:`distinct_outputs`."""
    for option, path in outputs.items():
        if path is None or path == "-":
            continue
        try:
            st = os.stat(path)
        except FileNotFoundError:
            if os.path.islink(path):  # a link to a file not there yet: the write makes it
                continue
            st = None
        except OSError as exc:
            raise UsageError(f"--{option} {path}: cannot write: {exc.strerror}") from None
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise UsageError(f"--{option} {path}: cannot write: it is a folder")
        if st is not None and not stat.S_ISREG(st.st_mode):
            continue  # a pipe (>(jq ...)), /dev/stdout: what reads it may not be there yet
        try:
            if st is None:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
                os.unlink(path)
            else:
                os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
        except OSError as exc:
            raise UsageError(f"--{option} {path}: cannot write: {exc.strerror}") from None


def _stdin_identity() -> tuple[int, int] | None:
    """``(device, inode)`` of the regular file standard input reads, when it is one."""
    try:
        st = os.fstat(sys.stdin.fileno())
    except (OSError, ValueError, AttributeError):  # closed, or replaced by an object without a file
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISREG(st.st_mode) else None


def _identity(path: str) -> tuple[int, int] | None:
    """``(device, inode)`` of the file or pipe ``path`` names (``-``: stdout), when there is one;
    None for a device (writing twice to /dev/null or a terminal loses nothing)."""
    try:
        st = os.fstat(sys.stdout.fileno()) if path == "-" else os.stat(path)
    except (OSError, ValueError, AttributeError):  # AttributeError: stdout is closed (None)
        return None
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode)):
        return None
    return (st.st_dev, st.st_ino)


def dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=2) + "\n"


def add_search_path(parser: Any) -> None:
    """``--search-path DIR`` (repeatable) on a verb that loads packs."""
    parser.add_argument(
        "--search-path",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder, besides the pack's own, that packs may read from (extends:, template "
        "file:, test inputs); repeatable",
    )
