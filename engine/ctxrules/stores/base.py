"""The :class:`Store` protocol: everything a session persists, behind one interface.

A store holds sessions (addressed by a *session key*: a session id for a URL store, the session
directory for the filesystem store) and what they share (day and goal ledgers, misroutes, the
injection key). What a session persists:

- its **turn**: the state (stage states, fingerprint, history chain, budget marks, summarizer
  circuit breakers — they live inside the stage states) and the last output, checked against the
  digest the state records before it is reused (:meth:`Store.load_turn`, :meth:`Store.commit_turn`);
- **vault blobs**, content-addressed by sha256 (:meth:`Store.put_blob` ...): a store may keep one
  copy per session (filesystem) or one copy shared by every session that references it (Redis);
  either way a session sees exactly the blobs it put (its *referenced set*);
- small **documents** rewritten as a whole under a lock (:data:`DOCS`: notes, touched files,
  router state, the compaction checkpoint, the sub-agent link), as opaque bytes the owning
  module parses (so each keeps its own format and its own error messages);
- append-only **logs** (:class:`Log`: the session, day and goal ledgers, misroutes, the sub-agent
  registry): one record per call, read back incrementally through a cursor, with totals a
  network store keeps as atomic counters beside the records (never a read-modify-write);
- two **locks**: the prepare lock (one ``prepare`` per session at a time, across processes and
  machines; waits up to a timeout; renewable while a long compaction runs) and the compaction
  lock (taken without waiting: a busy one skips the compaction);
- **secrets** created once and shared by every worker (the injection key).

A network backend should serve a warm turn in one round trip where it can: :meth:`load_turn`
reads the state and the last output together, :meth:`commit_turn` writes state, last output and
any ledger records in one call.

Store settings (TTLs, timeouts, ``on_error``) are the backend's constructor options or URL query
parameters (``redis://host/0?ttl_s=86400``), never pack keys.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, Protocol, runtime_checkable

from ctxrules.errors import (
    SessionExists,
    StoreError,
    StoreLockTimeout,
    StoreUnavailable,
    StoreUsageError,
    VaultError,
)
from ctxrules.private_files import UnsafePathError, open_private
from ctxrules.stores.hashing import StreamHash
from ctxrules.threads import ForkSafeLock

__all__ = [
    "DOCS",
    "DOC_MAX_BYTES",
    "LOG_KINDS",
    "SECRET_BYTES",
    "SESSION_ID_RE",
    "SPOOL_PREFIX",
    "STALE_SPOOL_S",
    "SWEEP_S",
    "BlobWriter",
    "CompactionBusy",
    "Log",
    "LogChunk",
    "PrepareLock",
    "SessionExists",
    "SpooledBlobWriter",
    "Store",
    "StoreError",
    "StoreLockTimeout",
    "StoreUnavailable",
    "StoreUsageError",
    "Turn",
    "VaultError",
    "remove_stale_spools",
]

SESSION_ID_RE: Final = re.compile(r"[A-Za-z0-9._-]{1,128}")
"""A session id a URL store uses as it is; anything else is replaced by its sha256
(:func:`ctxrules.stores.session_id_for`)."""

DOC_MAX_BYTES: Final = 256 * 1024 * 1024
"""The largest document ctxrules writes (notes are at most 500 of 20,000 characters, some 60 MB
escaped, with room for their tags; router state, a checkpoint, root.json are kilobytes): the
filesystem store reads no document past it, and ``sessions import`` no document line longer
than its base64 (:mod:`ctxrules.stores.archive`)."""

SECRET_BYTES: Final = (16, 64)
"""The length of an injection key any store accepts, in bytes (the filesystem store's key file
holds 32 to 128 hex digits): a key of another length is damage, never signed with."""

DocName = Literal["notes", "touched", "router", "checkpoint", "root"]
DOCS: Final[tuple[DocName, ...]] = ("notes", "touched", "router", "checkpoint", "root")
"""The per-session documents: ``notes`` (ctxrules.notes), ``touched`` (the file tracker),
``router`` (the complexity router's recent decisions), ``checkpoint`` (a running or cut-short
compaction, ctxrules.runtime.checkpoint), ``root`` (a sub-agent's link to its root task)."""

LogKind = Literal["session", "day", "goal", "misroutes", "descendants"]
LOG_KINDS: Final[tuple[LogKind, ...]] = ("session", "day", "goal", "misroutes", "descendants")


class CompactionBusy(Exception):
    """Another compaction of this session holds the compaction lock (also
    ``ctxrules.summarize.lock.CompactionBusy``)."""


@dataclass(frozen=True)
class Log:
    """An append-only log. ``kind`` / ``name``:

    - ``session`` / session key: the session's own ledger;
    - ``day`` / ``YYYY-MM-DD`` (UTC): every call of that date, across sessions;
    - ``goal`` / goal name: every call made for that goal;
    - ``misroutes`` / ``""``: the router's misroute reports;
    - ``descendants`` / root session key: the sub-agent sessions registered under a root task.
    """

    kind: LogKind
    name: str = ""


@dataclass(frozen=True)
class LogChunk:
    """What :meth:`Store.read_log` found after a cursor: complete records (raw JSON lines, not
    parsed: a damaged one is the reader's to count and skip), the cursor to pass next time, and
    whether the log was replaced since ``cursor`` (then ``lines`` is the whole log again)."""

    lines: list[bytes]
    cursor: Any
    restarted: bool = False


@dataclass
class Turn:
    """What a session persisted after its last ``prepare``: ``state`` (``{"version": 1}`` for a
    new session; a damaged state reads as new with ``state["recovered"]`` saying why) and
    ``output``, the last output when it was asked for, is complete and matches the digest the
    state records (else None: a cache miss, never text the session did not write)."""

    state: dict[str, Any]
    output: list[dict[str, Any]] | None = None
    notes: list[str] = field(default_factory=list)
    """Things the caller should report (a store that fell back, a store that lost its keys)."""


@runtime_checkable
class BlobWriter(Protocol):
    """A vault blob written in pieces (an output too large to hold in memory), hashed as it
    grows. Until :meth:`commit` or :meth:`discard` the bytes written so far are readable at
    :attr:`path`, a private local file (``size`` bytes)."""

    path: Path
    size: int

    @property
    def vault_id(self) -> str:
        """The id the blob gets: the sha256 of what was written so far."""
        ...

    def write(self, data: bytes) -> None:
        """Append ``data`` (raises ``VaultError`` on failure; then ``size`` bytes are in :attr:`path`)."""
        ...

    def commit(self) -> str:
        """Store the blob (durably) under its id and return the id."""
        ...

    def discard(self) -> None:
        """Drop it (harmless after :meth:`commit`)."""
        ...

    # Optional: ``sync_soon()``, called once everything is written (before the output is
    # compressed), may start making the bytes durable in the background so that ``commit``
    # waits less. Callers look it up with ``getattr``; a writer without it loses nothing.


STALE_SPOOL_S: Final = 3600.0
"""A spool file (a blob written in pieces: :class:`SpooledBlobWriter` in the system's temporary
directory, the filesystem store's in its vault) untouched this long whose writer holds it no
more, or a filesystem store's temporary file in a vault shard untouched this long, was left by a
process killed mid-write (``kill -9``, the OOM killer, a power cut): nothing names it, and it
may hold gigabytes of a command's output. The next writer removes it
(:func:`remove_stale_spools`). The age keeps clear of a writer between creating its file and
marking it held, or renaming it."""
SWEEP_S: Final = 600.0  # a process looks for such files in one directory this often at most
SPOOL_PREFIX: Final = "ctxrules-blob-"  # a SpooledBlobWriter's file in the temporary directory


def remove_stale_spools(
    directory: str, prefix: str, *, held: bool = True, names: re.Pattern[str] | None = None
) -> None:
    """Remove the files named ``prefix...`` in ``directory`` that killed writers left
    (:data:`STALE_SPOOL_S`): untouched that long, regular files of this user, and held by no
    writer (:func:`ctxrules.locks.held_elsewhere`; ``held=False``: files no writer marks, whose
    age alone tells, as the filesystem store's shards explain). ``names``: only names it matches
    whole (a session directory may be a folder of the user's, whose own files are not ours).
    The lock module is loaded only when there is such a file to ask about. Best effort:
    whatever cannot be looked at is left as it is."""
    cutoff = time.time() - STALE_SPOOL_S
    try:
        with os.scandir(directory) as entries:
            old = [
                e.path
                for e in entries
                if e.name.startswith(prefix)
                and (names is None or names.fullmatch(e.name))
                and e.is_file(follow_symlinks=False)
                and e.stat(follow_symlinks=False).st_mtime < cutoff
            ]
    except OSError:
        return
    for path in old:
        if not held:
            with contextlib.suppress(OSError):
                os.unlink(path)
            continue
        try:
            fd = open_private(path, os.O_RDONLY)  # another user's (a shared /tmp) is refused
        except (OSError, UnsafePathError):
            continue
        try:
            from ctxrules import locks

            st = os.fstat(fd)
            if st.st_mtime < cutoff and not locks.held_elsewhere(fd) and os.lstat(path).st_ino == st.st_ino:
                os.unlink(path)
        except OSError:
            continue
        finally:
            os.close(fd)


_spools_swept: dict[str, float] = {}  # temporary directory -> when this process last swept it
_spools_mutex = ForkSafeLock()


def _sweep_spools(directory: str) -> None:
    """:func:`remove_stale_spools` of :class:`SpooledBlobWriter` files in ``directory``, once in
    :data:`SWEEP_S` per process (a system's temporary directory may hold thousands of files)."""
    now = time.monotonic()
    with _spools_mutex:
        last = _spools_swept.get(directory)
        if last is not None and now - last < SWEEP_S:
            return
        _spools_swept[directory] = now
    remove_stale_spools(directory, SPOOL_PREFIX)


class SpooledBlobWriter:
    """A :class:`BlobWriter` for any store: the pieces go to a private temporary file (mode
    0600) and :meth:`commit` hands the whole to :meth:`Store.put_blob`. The filesystem store
    writes in its vault directory instead and renames on commit (no copy)."""

    def __init__(self, store: Store, session: str) -> None:
        self._store, self._session = store, session
        fd, name = self._temporary()
        self.path = Path(name)
        self._handle = os.fdopen(fd, "wb", buffering=0)  # what write() accepted is in the file
        os.fchmod(fd, 0o600)
        self._hash = StreamHash()
        self.size = 0
        self._done = False

    def _temporary(self) -> tuple[int, str]:
        """(fd, path) of the file the pieces go to: in the system's temporary directory, held
        until it is closed (:func:`ctxrules.locks.hold_shared`), so that the next writer, in any
        process, removes the spools of writers killed mid-write (:func:`remove_stale_spools`)
        and never a live one's, however long idle."""
        from ctxrules import locks

        directory = tempfile.gettempdir()
        _sweep_spools(directory)
        fd, name = tempfile.mkstemp(prefix=SPOOL_PREFIX, dir=directory)
        locks.hold_shared(fd)
        return fd, name

    def _write_failed(self, exc: OSError) -> VaultError:
        return VaultError(f"cannot spool a vault blob to {self.path}: {exc}")

    @property
    def vault_id(self) -> str:
        return self._hash.hexdigest()

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                written = self._handle.write(view) or 0
            except OSError as exc:
                raise self._write_failed(exc) from exc
            self._hash.update(view[:written])
            self.size += written
            view = view[written:]

    def sync_soon(self) -> None:
        """Nothing to start: :meth:`commit` hands the whole file to the store."""

    def commit(self) -> str:
        with open(self.path, "rb") as fh:
            blob_id = self._store.put_blob(self._session, fh.read())
        self.discard()
        return blob_id

    def discard(self) -> None:
        if self._done:
            return
        self._done = True
        with contextlib.suppress(Exception):  # what the hash failed with matters to no one now
            self._hash.close()
        with contextlib.suppress(OSError):
            self._handle.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


@runtime_checkable
class PrepareLock(Protocol):
    """The per-session prepare lock: ``with lock: ...``; :meth:`renew` extends a lease-based lock
    while a long compaction runs (a no-op for a lock held until release, as a file lock is)."""

    def __enter__(self) -> PrepareLock: ...

    def __exit__(self, *exc: object) -> None: ...

    def renew(self) -> None:
        """Extend the hold (raise :class:`StoreError` when it was lost to another worker)."""
        ...


@runtime_checkable
class Store(Protocol):
    """Everything a session persists (module docstring). Implementations: ``FilesystemStore``
    (:mod:`ctxrules.stores.filesystem`, the default) and ``RedisStore``
    (:mod:`ctxrules.stores.redis`). Every method is safe to call from several threads and
    several processes (or machines, for a network store) at once."""

    @property
    def url(self) -> str:
        """Where the store is, as a URL without credentials (``file:///abs/dir``, ``redis://h:6379/0``)."""
        ...

    # --- sessions -------------------------------------------------------------------------------

    def session_key(self, name: str) -> str:
        """The key of the session ``name`` (an id or, for the filesystem store, a directory); a
        URL store maps a name outside :data:`SESSION_ID_RE` to its sha256."""
        ...

    def describe(self, session: str) -> str:
        """How messages and reports name the session (its directory, or ``URL#id``)."""
        ...

    def sessions(self) -> list[str]:
        """The keys of every session the store holds (sub-agent sessions included), sorted."""
        ...

    def exists(self, session: str) -> bool:
        """Whether the store holds anything of ``session``."""
        ...

    def creating(self, session: str) -> AbstractContextManager[str]:
        """Make the new session ``session`` all at once (``sessions import``): ``with
        store.creating(session) as key:`` writes it under ``key``, which neither
        :meth:`sessions` nor :meth:`exists` shows; a block that ends normally makes it
        ``session`` in one step, one that raises leaves nothing of it. What a process killed
        inside the block left (a staging folder, keys without the session's marker) is removed
        by the next ``creating`` of the same session, and never shown as a session.
        :class:`SessionExists` when ``session`` exists (before the block, or made by another
        writer meanwhile: the block's writes are dropped). No lock is needed around it: a
        prepare that makes the session meanwhile wins, and the block ends in SessionExists."""
        ...

    # --- the turn -------------------------------------------------------------------------------

    def load_turn(self, session: str, *, output: bool = True) -> Turn:
        """The state and (``output``) the verified last output of ``session``, in one round trip."""
        ...

    def commit_turn(
        self,
        session: str,
        state: dict[str, Any],
        output: list[dict[str, Any]],
        *,
        records: Sequence[tuple[Sequence[Log], Mapping[str, Any]]] = (),
    ) -> None:
        """Save ``state`` and ``output`` as the session's last turn (the store records the
        output's digest and count in ``state["last"]``; the caller holds the prepare lock), and
        append each ``(logs, record)`` of ``records`` as in :meth:`append`, in one call."""
        ...

    def output_holds(self, session: str, output: list[dict[str, Any]]) -> bool:
        """Whether the stored last output is exactly ``output`` as this store object last wrote
        it (the same message objects), so a checkpoint may name its first lines instead of
        copying them."""
        ...

    def forget(self, session: str) -> None:
        """Drop what this object caches of ``session`` (after a run that failed part-way)."""
        ...

    def save_state(self, session: str, state: dict[str, Any]) -> None:
        """Replace the state alone, leaving the last output as it is (``sessions resume`` puts
        back the state from before a cut-short compaction; ``compress`` keeps its own section).
        The caller holds the prepare lock."""
        ...

    # --- the vault ------------------------------------------------------------------------------

    def put_blob(self, session: str, data: bytes, media_type: str | None = None) -> str:
        """Store ``data`` (durably) for ``session``; returns its id (the sha256 hex). Idempotent,
        and harmless when several writers race (the bytes are the same)."""
        ...

    def get_blob(self, session: str, blob_id: str) -> bytes:
        """The bytes of a full id ``session`` references, verified against the id; raises
        :class:`VaultError` when missing or corrupt."""
        ...

    def open_blob_writer(self, session: str) -> BlobWriter:
        """A blob of ``session`` written in pieces (see :class:`BlobWriter`); a store without a
        better way returns :class:`SpooledBlobWriter` ``(self, session)``."""
        ...

    def has_blob(self, session: str, blob_id: str) -> bool:
        """Whether ``session`` references the full id ``blob_id`` and its bytes are there."""
        ...

    def missing_blobs(self, session: str, blob_ids: Sequence[str]) -> set[str]:
        """The ids of ``blob_ids`` that :meth:`has_blob` would deny (one round trip)."""
        ...

    def blob_ids(self, session: str, prefix: str = "") -> list[str]:
        """The ids ``session`` references that start with ``prefix`` (hex), sorted."""
        ...

    def blob_media_type(self, session: str, blob_id: str) -> str | None:
        """The media type ``put_blob`` recorded for the id, if any."""
        ...

    # --- documents ------------------------------------------------------------------------------

    def read_doc(self, session: str, name: DocName) -> bytes | None:
        """The bytes of the document (None: there is none)."""
        ...

    def update_doc(self, session: str, name: DocName, update: Callable[[bytes | None], bytes | None]) -> None:
        """Under the document's own lock: ``update(current)`` returns the new bytes (None: leave
        it as it is). Another writer of the same document waits."""
        ...

    def write_doc(self, session: str, name: DocName, data: bytes | None) -> None:
        """Replace the document (atomically) or, with None, remove it; no lock: for documents
        only the prepare-lock holder writes (the checkpoint)."""
        ...

    def doc_location(self, session: str, name: DocName) -> str:
        """How error messages name the document (a file path, or ``URL#id/name``)."""
        ...

    # --- logs -----------------------------------------------------------------------------------

    def append(self, logs: Sequence[Log], record: Mapping[str, Any]) -> None:
        """Append ``record`` (a JSON object) to each of ``logs``, durably, one whole record each,
        and add a ``"type": "call"`` record's tokens and USD to the logs' totals."""
        ...

    def append_once(
        self, log: Log, record: Mapping[str, Any], *, key: str, limit: int
    ) -> Literal["added", "present", "full"]:
        """Atomically: ``present`` when a record of ``log`` has the same ``record[key]``, else
        ``full`` when the log holds ``limit`` records, else append ``record`` and ``added``
        (the sub-agent registry and its spawn cap)."""
        ...

    def read_log(self, log: Log, cursor: Any = None) -> LogChunk:
        """The records appended after ``cursor`` (None: from the start)."""
        ...

    def log_location(self, log: Log) -> str:
        """How error messages and reports name the log."""
        ...

    def logs(self, kind: LogKind) -> list[Log]:
        """Every log of ``kind`` the store holds (``usage`` reads every day ledger)."""
        ...

    # --- locks ----------------------------------------------------------------------------------

    def prepare_lock(self, session: str, *, timeout: float | None = None) -> PrepareLock:
        """The session's prepare lock (not yet taken). ``timeout``: seconds to wait (None: the
        store's default); :class:`StoreLockTimeout` when it runs out."""
        ...

    def compaction_lock(self, session: str) -> AbstractContextManager[Any]:
        """The session's compaction lock, taken without waiting: entering raises
        :class:`CompactionBusy` when another compaction holds it."""
        ...

    # --- secrets --------------------------------------------------------------------------------

    def secret(self, session: str | None, name: str, make: Callable[[], bytes]) -> bytes:
        """The secret ``name`` of the store (``session`` None) or of a session; the first caller
        stores ``make()`` and every later caller, on any worker, gets the same bytes."""
        ...

    # --- lifetime -------------------------------------------------------------------------------

    def close(self) -> None:
        """Release connections and handles; the store may not be used afterwards."""
        ...
