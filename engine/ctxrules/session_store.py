"""A session directory on disk: state file, last output, and the cross-process lock.

Layout (docs/reference/api.md "Sessions and the vault"): ``state.json`` (stage states,
fingerprint, a chained digest of the last history, the sha256 of ``last_output.jsonl``),
``last_output.jsonl`` (what the last ``prepare`` returned, a message per line), ``vault/``,
``.lock``. Every file is opened through :mod:`ctxrules.private_files` (no link followed, a
regular file of ours). Files have mode 0600, directories 0700. Both files are caches: losing
them costs the reuse of the last compaction, never the conversation. ``last_output.jsonl`` is
replaced by rename or appended to (the state says how many of its lines count), and
``state.json`` is rewritten in place through a handle kept open
(:meth:`SessionStore._write_state`).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import json.encoder
import operator
import os
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, cast

from ctxrules.errors import CtxrulesError
from ctxrules.json_stream import LONG_STRING, dumps_once, json_text_sorted
from ctxrules.private_files import (
    ensure_dir,
    open_private,
    read_private,
    write_atomic,
)

if TYPE_CHECKING:
    from ctxrules.locks import FileLock

__all__ = [
    "DEFAULT_STATE_ROOT",
    "MAX_STATE_BYTES",
    "STATE_VERSION",
    "SessionLock",
    "SessionStore",
    "ensure_dir",
    "state_root_from_env",
    "unusable_state",
    "write_atomic",
]

DEFAULT_STATE_ROOT = ".ctxrules"
"""Where sessions and the day and goal ledgers live when nothing else is said."""


def state_root_from_env() -> Path:
    """The state root: ``CTXRULES_STATE`` when set, else :data:`DEFAULT_STATE_ROOT`. Set empty
    (``CTXRULES_STATE=$UNSET``) it counts as not set, as an empty ``CTXRULES_STORE`` does: the
    current directory never becomes a state root by accident."""
    return Path(os.environ.get("CTXRULES_STATE", "").strip() or DEFAULT_STATE_ROOT)


STATE_VERSION = 1

MAX_STATE_BYTES = 64 * 1024 * 1024
"""Read no more of ``state.json`` than this (a state is kilobytes: stage states, digests, not
messages): a larger file is not one ctxrules wrote, and reading a file that claims gigabytes
(a sparse file, a disk image copied over it) would take the machine's memory and minutes."""

_LOOK_FRESH_S = 0.05  # a load's lstat of state.json stands for the save's this long after it


class SessionStore:
    """``state.json`` and ``last_output.jsonl`` (one message per line, so that a turn that
    only appends messages appends lines instead of rewriting the file). Both are caches:
    losing them costs the reuse of the last compaction, never the conversation, so they are
    written without fsync."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # Made once: a turn stats both files several times, and a Path per look cost more.
        self._state_file = path / "state.json"
        self._output_file = path / "last_output.jsonl"
        self._state_name = os.fspath(self._state_file)
        self._output_name = os.fspath(self._output_file)
        self._written: list[dict[str, Any]] | None = None
        self._written_stat: tuple[int, int] | None = None
        self._state: dict[str, Any] | None = None
        self._state_stat: tuple[int, int] | None = None
        # lstat of state.json by the last load(), and when (see _write_state)
        self._looked: tuple[os.stat_result, float] | None = None
        self._hash: Any = None  # sha256 of what this object wrote to last_output.jsonl
        # For the last lines of that file: (lines before, their bytes, sha256 of them), so a
        # turn that changed only its last messages rewrites the file from there (see save).
        self._marks: list[tuple[int, int, Any]] = []
        self._state_text = _state_encoder()  # json_text_sorted, with this session's strings kept
        # Handles kept open between turns (opening, and above all creating, a file costs more
        # than a warm turn's stages): state.json, and last_output.jsonl for appending.
        self._state_handle = _Handle(self.state_file, os.O_RDWR | os.O_CREAT)
        self._output_handle = _Handle(self.output_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT)

    @property
    def state_file(self) -> Path:
        return self._state_file

    @property
    def output_file(self) -> Path:
        return self._output_file

    def load(self) -> dict[str, Any]:
        # The state this object wrote last is still what is on disk unless another process
        # wrote since (the session lock orders the writers): then it need not be parsed again.
        self._looked = None
        if self._state is not None:
            st = _lstat(self._state_name)
            if st is not None and (st.st_size, st.st_mtime_ns) == self._state_stat:
                # The save that follows (under the same lock) writes through the kept handle:
                # this look tells it which file is at the path, without another system call,
                # when the save comes soon (a warm turn); a longer turn looks again.
                self._looked = (st, time.monotonic())
                return self._state
        try:
            raw = read_private(self.state_file, limit=MAX_STATE_BYTES + 1)
        except FileNotFoundError:
            return {"version": STATE_VERSION}
        except OSError as exc:
            raise CtxrulesError(f"cannot read session state {self.state_file}: {exc.strerror}") from exc
        if len(raw) > MAX_STATE_BYTES:
            # A cache miss like any damage; the save that follows cuts the file to the new state.
            too_large = f"state.json is larger than {MAX_STATE_BYTES >> 20} MiB and was reset"
            return {"version": STATE_VERSION, "recovered": too_large}
        try:
            # The first JSON value: a writer stopped between writing the new state and cutting
            # the file to its length leaves the end of the old one behind it. Nesting deeper
            # than Python's recursion limit, or an integer too long to convert, is damage too.
            data, _end = json.JSONDecoder().raw_decode(raw.decode("utf-8"))
        except (ValueError, RecursionError):
            return {"version": STATE_VERSION, "recovered": "state.json was unreadable and was reset"}
        unusable = unusable_state(data)
        if unusable is not None:
            return {"version": STATE_VERSION, "recovered": f"state.json {unusable} and was reset"}
        return cast(dict[str, Any], data)  # an object: unusable_state said so

    def forget(self) -> None:
        """Drop the in-memory state (after a run that failed part-way changed it), and what
        this object wrote last: the next save rewrites ``last_output.jsonl`` whole. Its
        messages are the caller's objects, which may have been edited in place since; the
        same object again then says nothing about its line."""
        self._state = self._state_stat = self._looked = None
        self._written = self._written_stat = self._hash = None
        self._marks = []

    def load_output(self, count: int, written: Any = None, digest: Any = None) -> list[dict[str, Any]] | None:
        """The first ``count`` messages of the last output, or None when they are not all there
        or the file is not the one the state was saved with (``written``: the state's
        ``last.output_file``, inode and size, of which the size is compared; ``digest``: its
        ``last.output_digest``, the sha256 of those bytes, which must match). A process that
        died between writing the output and writing the state leaves a file the state does not
        describe; a file edited behind our back (even to the same size and mtime) fails the
        digest. Either costs the reuse, never puts text the session did not write into the
        context."""
        if not isinstance(digest, str) or not isinstance(written, list) or len(written) != 2:
            return None
        try:
            fd = open_private(self.output_file, os.O_RDONLY)
            with os.fdopen(fd, "rb") as fh:
                st = os.fstat(fh.fileno())
                # The size first (cheap), then the digest decides. Not the inode: a session
                # copied or restored from a backup has new inodes and the same bytes.
                if written[1] != st.st_size:
                    return None
                raw = fh.read(st.st_size)
            if hashlib.sha256(raw).hexdigest() != digest:
                return None
            out: list[dict[str, Any]] = []
            for line in raw.splitlines():
                if len(out) == count:
                    break
                msg = json.loads(line)
                if not isinstance(msg, dict):
                    return None
                out.append(msg)
        except (OSError, ValueError, RecursionError, CtxrulesError):
            return None
        return out if len(out) == count else None

    def holds(self, output: list[dict[str, Any]]) -> bool:
        """Whether ``last_output.jsonl`` is the file this object last wrote and holds exactly
        ``output`` (the same message objects), so its first lines can stand for them."""
        prev = self._written
        return (
            prev is not None
            and len(prev) == len(output)
            and self._stat() == self._written_stat
            and all(map(operator.is_, prev, output))
        )

    def save(self, state: dict[str, Any], output: list[dict[str, Any]]) -> None:
        state["version"] = STATE_VERSION
        state.pop("recovered", None)
        state.setdefault("last", {})["output_count"] = len(output)
        prev, written_stat = self._written, self._written_stat
        # Until both files are written, nothing this object remembers about them holds: a
        # write cut short (a full disk) must lead to a whole rewrite, never an append.
        self._written = self._written_stat = None
        self._state = self._state_stat = None
        # Append only to the file this object wrote last (another process may have rewritten it).
        appended: os.stat_result | None = None
        # One look at the file serves both checks below (the turn's system calls are most of
        # the cost of a warm save).
        at_path = _lstat(self._output_name) if prev is not None and self._hash is not None else None
        marks, self._marks = self._marks, []
        mark = None
        if prev is not None and at_path is not None and (at_path.st_size, at_path.st_mtime_ns) == written_stat:
            # The lines to keep: the messages up to the first that is not the same object. All
            # of them: append. A turn that changed only its last few messages (a breakpoint
            # that moves on with each call, on Anthropic models) rewrites from the first one.
            kept = next(itertools.compress(itertools.count(), map(operator.is_not, prev, output)), None)
            if kept is None and len(prev) > len(output):
                kept = len(output)
            mark = (len(prev), written_stat[0], self._hash) if kept is None else _mark_at(marks, kept)
        if mark is not None:
            lines, offset, digest = mark
            # Made before the file is touched: a message that cannot be written (a stage's
            # bad data) leaves the last output readable, as the state still describes it.
            tail = _jsonl_lines(output[lines:])
            data = b"".join(tail)
            fd = self._output_handle.fd(at_path)  # the file at the path (its identity checked)
            self._hash = None  # until the file holds what it describes
            if prev is not None and lines < len(prev):
                os.ftruncate(fd, offset)  # the file is opened for appending: cut, then append
            if data:
                _write_all(fd, data)
            # The digest follows the bytes written: a warm turn hashes only its new lines.
            self._hash, self._marks = _follow(digest.copy(), [m for m in marks if m[0] <= lines], lines, offset, tail)
            appended = os.fstat(fd)
        else:
            tail = _jsonl_lines(output)
            self._hash = None  # until the new file is in place
            write_atomic(self.output_file, b"".join(tail), durable=False)
            self._hash, self._marks = _follow(hashlib.sha256(), [], 0, 0, tail)
        self._written = list(output)
        st = appended if appended is not None else os.lstat(self._output_name)
        self._written_stat = (st.st_size, st.st_mtime_ns)
        state["last"]["output_file"] = [st.st_ino, st.st_size]
        state["last"]["output_digest"] = self._hash.hexdigest()
        data = self._state_text(state).encode("utf-8")
        try:
            written = self._write_state(data)
        except OSError:
            # A state cut short could hold the start of the new one over the end of the old:
            # an empty file instead reads as a cache miss (cutting a file needs no space).
            with contextlib.suppress(OSError):
                os.ftruncate(self._state_handle.fd(), 0)
            raise
        self._state, self._state_stat = state, written

    def save_state(self, state: dict[str, Any]) -> None:
        """Rewrite ``state.json`` alone, ``last_output.jsonl`` untouched: for a verb that keeps
        a section of its own there (``compress``'s timed-out patterns). The caller holds the
        session lock and passes the state it loaded under it, so no other field is lost."""
        state["version"] = STATE_VERSION
        data = json.dumps(state, ensure_ascii=False, sort_keys=True).encode("utf-8")
        self._state = self._state_stat = None
        try:
            written = self._write_state(data)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self._state_handle.fd(), 0)  # as in save: a miss, never a mix
            raise
        self._state, self._state_stat = state, written

    def _write_state(self, data: bytes) -> tuple[int, int]:
        """Rewrite ``state.json`` in place: the new state from offset 0, then the file cut to
        its length.

        Not a temp file renamed over it: creating a file and renaming it over another made
        ext4 write the data out (``auto_da_alloc``), which cost a warm turn more than all of its
        stages. A writer stopped between the two steps leaves the end of the old state behind
        the new one, which :meth:`load` ignores; a state torn by a power loss (it is never
        fsynced) reads as damaged and costs the reuse of one compaction, like a lost cache.

        The file's ``(size, mtime)`` after the write is returned (what :meth:`load` compares);
        it is cut only when the old state was longer (cutting costs more than asking).
        """
        looked, self._looked = self._looked, None
        recent = looked is not None and time.monotonic() - looked[1] < _LOOK_FRESH_S
        fd = self._state_handle.fd(looked[0] if recent and looked is not None else None)
        _write_all(fd, data, offset=0)
        st = os.fstat(fd)
        if st.st_size > len(data):
            os.ftruncate(fd, len(data))
            st = os.fstat(fd)
        return (st.st_size, st.st_mtime_ns)

    def _stat(self) -> tuple[int, int] | None:
        return _stat(self._output_name)


# The top-level fields of state.json and their types; anything else in a field ctxrules reads
# makes the whole file damaged cache (a cache miss), not a crash later in the turn.
_STATE_FIELDS: dict[str, type | tuple[type, ...]] = {
    "stages": dict,
    "fingerprint": str,
    "fingerprint_parts": dict,
    "last_clock": (int, float),
    "last": dict,
    "budget": dict,
    "compress": dict,
    "recovered": str,
}
_LAST_FIELDS: dict[str, type | tuple[type, ...]] = {
    "count": int,
    "chain": str,
    "output_count": int,
    "output_file": list,
    "output_digest": str,
}


def unusable_state(data: object) -> str | None:
    """Why a parsed state cannot be used (said in the warning of the reset), None when it can:
    not a JSON object, another version (a newer ctxrules wrote it), or a known key of the
    wrong type."""
    if not isinstance(data, dict):
        return f"was damaged (a JSON {type(data).__name__}, not an object)"
    version = data.get("version")
    if version != STATE_VERSION:
        return f"has version {repr(version)[:40]}, not {STATE_VERSION} (another version of ctxrules wrote it)"
    wrong = _mistyped(data)
    if wrong is not None:
        return f"was damaged ({wrong})"
    return None


def _mistyped(data: dict[str, Any]) -> str | None:
    """The first field of a loaded state whose type is wrong, or None."""
    for fields, where, obj in ((_STATE_FIELDS, "", data), (_LAST_FIELDS, "last.", data.get("last"))):
        if not isinstance(obj, dict):
            continue
        for key, kind in fields.items():
            value = obj.get(key)
            if key in obj and (not isinstance(value, kind) or isinstance(value, bool)):
                return f"{where}{key} is a {type(value).__name__}"
    stages = data.get("stages")
    if isinstance(stages, dict):
        for key, value in stages.items():
            if not isinstance(value, dict):
                return f"stages.{key} is a {type(value).__name__}"
    return None


class _Handle:
    """A file descriptor kept open between turns, reopened when the file at ``path`` is no
    longer the one it refers to (replaced by rename, or removed); closed when the handle is
    collected."""

    def __init__(self, path: Path, flags: int) -> None:
        self.path, self.flags = path, flags
        self._name = os.fspath(path)  # stat'ed on every use: no Path conversion each time
        self._fd: int | None = None
        self._close: weakref.finalize[..., Any] | None = None
        self._ident: tuple[int, int, int] | None = None

    def fd(self, at_path: os.stat_result | None = None) -> int:
        """The descriptor of the file at the path; ``at_path``: its lstat, just taken."""
        try:
            # lstat: a link swapped in for the file is a new identity, and reopening refuses it.
            st = at_path if at_path is not None else os.lstat(self._name)
            ident: tuple[int, int, int] | None = (st.st_dev, st.st_ino, os.getpid())
        except FileNotFoundError:
            ident = None
        # The pid is part of the identity: after a fork the child needs its own open file
        # description (a handle shared across a fork would share its file offset and state).
        if self._fd is not None and ident == self._ident:
            return self._fd
        if self._close is not None:
            self._close()
            self._fd = self._close = None
        try:
            fd = open_private(self.path, self.flags)
        except FileNotFoundError:
            ensure_dir(self.path.parent)
            fd = open_private(self.path, self.flags)
        self._fd, self._close = fd, weakref.finalize(self, os.close, fd)
        st = os.fstat(fd)
        self._ident = (st.st_dev, st.st_ino, os.getpid())
        return fd


def _write_all(fd: int, data: bytes, *, offset: int | None = None) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view) if offset is None else os.pwrite(fd, view, offset)
        view = view[written:]
        if offset is not None:
            offset += written


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def _stat(path: str | Path) -> tuple[int, int] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns)


def _jsonl_lines(messages: list[dict[str, Any]]) -> list[bytes]:
    # dumps_once: within a prepare, the text the backup or a vault entry made of the message
    return [dumps_once(m).encode("utf-8") + b"\n" for m in messages]


_MARKS = 32  # line boundaries of last_output.jsonl from which a save may rewrite it


def _mark_at(marks: list[tuple[int, int, Any]], lines: int) -> tuple[int, int, Any] | None:
    """The kept boundary after ``lines`` lines, when it is one of the last few."""
    for mark in marks[::-1]:
        if mark[0] == lines:
            return mark
        if mark[0] < lines:
            break
    return None


def _follow(
    digest: Any, marks: list[tuple[int, int, Any]], lines: int, offset: int, tail: list[bytes]
) -> tuple[Any, list[tuple[int, int, Any]]]:
    """``digest`` (of the file's first ``offset`` bytes, ``lines`` lines) updated with the
    ``tail`` lines written after them, and the boundaries kept: those of ``marks`` and one
    after each of the last :data:`_MARKS` lines."""
    first = max(0, len(tail) - _MARKS)
    head = b"".join(tail[:first])
    digest.update(head)
    lines, offset = lines + first, offset + len(head)
    if not marks or marks[-1][0] != lines:
        marks.append((lines, offset, digest.copy()))
    for line in tail[first:]:
        digest.update(line)
        lines, offset = lines + 1, offset + len(line)
        marks.append((lines, offset, digest.copy()))
    return digest, marks[-(_MARKS + 1) :]


_SHORT_TEXTS = 1024  # strings of a state kept with their JSON text, at most (then forgotten)
_LONG_STRING = 256  # a string at least this long is looked up as an extension of a known one
_LONG_TEXTS = 8  # long strings kept with their JSON text, at most


class _Escapes(dict[str, str]):
    """A string of the state -> its JSON text (``json.encoder.encode_basestring``), kept from
    one save to the next. Most strings of a session's state come back turn after turn (stage
    ids, keys, digests), and its long ones grow by appending: the cache stage's digests of
    the history, the output's token counts, a string of 16 hex digits or a number per message.
    Escaping those again cost a warm save more than writing the file; a long string that
    starts with one escaped before is escaped for its new end only (JSON escapes each
    character on its own, so the pieces join to the text of the whole)."""

    __slots__ = ("_long",)

    def __init__(self) -> None:
        super().__init__()
        self._long: list[tuple[str, str]] = []  # (long string, its text), the latest first

    def __missing__(self, value: str) -> str:
        if len(value) < _LONG_STRING:
            if len(self) >= _SHORT_TEXTS:
                self.clear()
            text = self[value] = _escape(value)
            return text
        known = self._long
        for i, (old, old_text) in enumerate(known):
            if value.startswith(old):  # False for a shorter one: nothing to check before
                grown = value[len(old) :]
                text = old_text[:-1] + _escape(grown)[1:] if grown else old_text
                known = [*known[:i], *known[i + 1 :]]
                break
        else:
            text = _escape(value)
        if len(value) <= LONG_STRING:  # a huge one is not kept (a second copy of it)
            # A new list, not changed in place: a thread saving meanwhile sees one or the other.
            self._long = [(value, text), *known[: _LONG_TEXTS - 1]]
        return text


_escape: Callable[[str], str] = json.encoder.encode_basestring
_make_encoder: Any = getattr(json.encoder, "c_make_encoder", None)


def _state_encoder() -> Callable[[Any], str]:
    """``json_text_sorted`` (the same text) through a string memo of its own (:class:`_Escapes`):
    one per session store, so the strings it keeps are those of one session's state."""
    if _make_encoder is None:  # no C accelerator (another Python implementation)
        return json_text_sorted
    # As json_text_sorted's encoder: sort_keys, no skipkeys, NaN allowed, no circular check.
    escapes = _Escapes().__getitem__
    encoder = _make_encoder(None, json.JSONEncoder().default, escapes, None, ": ", ", ", True, False, True)
    join = "".join

    def text(value: Any) -> str:
        return join(encoder(value, 0))

    return text


class SessionLock:
    """One ``prepare`` at a time per session, across threads of one process (the caller holds
    a thread lock too) and across processes (:class:`ctxrules.locks.FileLock` on
    ``<session>/.lock``). The lock module is imported on first use, so loading a session store
    to read it (``explain``, pack tests) does not load it."""

    def __init__(self, path: Path, *, timeout: float | None = None) -> None:
        self.path = path
        self.timeout = timeout
        self._lock: FileLock | None = None

    def __enter__(self) -> SessionLock:
        if self._lock is None:
            from ctxrules.locks import FileLock

            self._lock = FileLock(self.path / ".lock", timeout=self.timeout)
        self._lock.acquire()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._lock is not None and self._lock.is_locked:
            self._lock.release()
