"""The filesystem store: sessions as directories, the default backend.

The layout is the one ctxrules has always written (docs/reference/api.md "Sessions and the
vault"); a session directory written by an earlier version is read as it is::

    <root>/                       the state root (``--state``; default .ctxrules)
      injection.key               the key that signs injected messages' tags
      ledger/days/<date>.jsonl    every call of a UTC date     (+ .lock)
      ledger/goals/<goal>.jsonl   every call made for a goal   (+ .lock)
      router/misroutes.jsonl      the router's misroute reports (+ .lock)
      <session>/                  a session directory (anywhere: the key is its path)
        state.json, last_output.jsonl   the last turn (ctxrules.session_store)
        vault/ab/ab12...          vault blobs by sha256 (+ .meta for a media type)
        notes.json, touched.json, router.json, checkpoint.json, root.json
        ledger.jsonl, descendants.jsonl
        .lock, .compaction.lock, .notes.lock, .tracker.lock, router.json.lock, *.jsonl.lock

Guarantees: every file is opened without following a link and checked through its descriptor
(:mod:`ctxrules.private_files`): a regular file of this user, mode 0600, in directories of this
user, mode 0700; whole-file writes go to a temporary file in the same directory, renamed over
the old one; vault blobs and ledger records are fsynced before they count; ledger appends and
document updates hold a :class:`ctxrules.locks.FileLock`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from types import ModuleType
from typing import Any, BinaryIO, Final, Literal
from urllib.parse import parse_qsl, unquote, urlsplit

from ctxrules.errors import CtxrulesError, UsageError
from ctxrules.integrations import session_name
from ctxrules.private_files import (
    NOFOLLOW,
    UnsafePathError,
    atomic_temporaries,
    check_dir,
    check_dirs_below,
    ensure_dir,
    open_private,
    read_private,
    write_atomic,
)
from ctxrules.session_store import SessionStore
from ctxrules.stores.base import (
    DOC_MAX_BYTES,
    LOG_KINDS,
    SECRET_BYTES,
    SWEEP_S,
    BlobWriter,
    CompactionBusy,
    DocName,
    Log,
    LogChunk,
    LogKind,
    PrepareLock,
    SpooledBlobWriter,
    StoreError,
    StoreLockTimeout,
    StoreUsageError,
    Turn,
    VaultError,
    remove_stale_spools,
)
from ctxrules.stores.staging import staged_dir
from ctxrules.threads import ForkSafeLock, helper_thread

__all__ = ["FilesystemStore", "durable_at_commit", "file_path", "for_session_dir", "holds_a_session", "own_folder"]

_ID_LEN: Final = 64
_HEX_RE: Final = re.compile(r"[0-9a-f]+")
_META_SUFFIX: Final = ".meta"
# A sidecar is ``{"media_type": "image/png"}``: one longer than this is not ctxrules' and is
# not read further (a sparse file claiming gigabytes would take the memory of ``sessions export``).
_META_MAX_BYTES: Final = 64 * 1024
_TMP_PREFIX: Final = ".tmp-"
_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY: Final = getattr(os, "O_DIRECTORY", 0)
_ACCESS_NOFOLLOW: Final = os.access in os.supports_follow_symlinks  # not on Windows
_CHECK_S: Final = 2.0  # a vault directory checked longer ago than this is checked again
# document -> (file in the session directory, lock file or None: written under the prepare lock)
_DOC_FILES: Final[dict[str, tuple[str, str | None]]] = {
    "notes": ("notes.json", ".notes.lock"),
    "touched": ("touched.json", ".tracker.lock"),
    "router": ("router.json", "router.json.lock"),
    "checkpoint": ("checkpoint.json", None),
    "root": ("root.json", None),
}
# What marks a directory as a session (for listing and scans).
_SESSION_FILES: Final = ("state.json", "last_output.jsonl", "checkpoint.json", "ledger.jsonl", "notes.json")
_SKIP_DIRS: Final = frozenset({"vault", "ledger", "router", "keys"})
# The lock files ctxrules makes in a session directory (the session's; its ledger's, notes', ...).
_SESSION_LOCKS: Final = (".lock", "ledger.jsonl.lock", *(lock for _file, lock in _DOC_FILES.values() if lock))
# The temporary files of whole-file writes (private_files.write_atomic, _link_secret) in a
# session directory and in the state root: what a writer killed before its rename leaves.
_SESSION_TEMPORARIES: Final = atomic_temporaries(
    [*(file for file, _lock in _DOC_FILES.values()), "last_output.jsonl", "injection.key"]
)


# Documents up to this size are kept in memory after a read (notes, touched files).
_DOC_MEMO_BYTES: Final = 1 << 20
_DOC_SETTLED_NS: Final = 2_000_000_000


class FilesystemStore:
    """Sessions as directories under (or outside) the state root ``root``; see the module
    docstring. A session key is the session directory's path; :meth:`session_key` maps a plain
    id to ``root/<id>``."""

    def __init__(
        self,
        root: str | os.PathLike[str] = ".ctxrules",
        *,
        vault_name: str = "vault",
        private: bool = False,
        lock_timeout_s: float | None = None,
    ) -> None:
        self.root = Path(root)
        # How long a prepare waits for another's hold of the session's lock (None: as long as
        # it is held; a holder that dies frees it at once).
        self.lock_timeout_s = lock_timeout_s
        self._vault_name = vault_name
        # Sessions no other process knows of (a pack test's temporary directory): a vault
        # writer marks its spool held for no one, and so never loads the lock module.
        self._private = private
        # (session, shard or None for the vault) -> when it was last swept of what killed writers left
        self._swept: dict[tuple[str, str | None], float] = {}
        self._sessions: dict[str, SessionStore] = {}
        self._mutex = ForkSafeLock()
        # Vault directories (session, directory) checked to be real directories of this user,
        # with the time of the check: a turn storing 70 items checks each of its directories
        # once, not on every write; every turn checks them again (commit_turn forgets them),
        # and so does a write more than _CHECK_S after the check (writers outside a turn).
        self._checked_shards: dict[tuple[str, str], float] = {}
        # Sessions inside durable_at_commit, and per session the vault files written but not
        # yet fsynced there, their directories, and descriptors of the first of those files
        # (kept open for the fsync: reopening each by its path cost a system call pair).
        self._unsynced: dict[str, tuple[list[str], set[str], list[int]]] = {}
        # log -> its path, and the path as a string: the budget gate reads every ledger of the
        # session on every prepare (one lstat each), and building the Path cost more than that.
        self._log_paths: dict[tuple[str, str], tuple[Path, str]] = {}
        # (session, document) -> its path and lock path, and the bytes last read with the
        # identity of the file they came from: notes.render reads the notes on every turn.
        self._doc_paths: dict[tuple[str, str], tuple[Path, Path | None]] = {}
        self._doc_reads: dict[tuple[str, str], tuple[tuple[int, int, int, int, int], bytes]] = {}
        # session -> its vault directory with a trailing separator (every warm turn asks)
        self._vault_roots: dict[str, str] = {}
        # Item path -> the identity (inode, size, mtime, ctime) of the file found not to hold
        # its id: read again on every turn that asks for it, a damaged item claiming gigabytes
        # (a sparse file) cost each of those turns a pass over all of it.
        self._corrupt: dict[str, tuple[int, int, int, int]] = {}

    @classmethod
    def from_url(cls, url: str) -> FilesystemStore:
        return cls(file_path(url), lock_timeout_s=_lock_timeout(url))

    @property
    def url(self) -> str:
        return Path(os.path.abspath(self.root)).as_uri()

    def __repr__(self) -> str:
        return f"FilesystemStore({str(self.root)!r})"

    # --- sessions -------------------------------------------------------------------------------

    def session_key(self, name: str) -> str:
        if os.sep in name or (os.altsep and os.altsep in name) or name in (".", ".."):
            return name
        return str(self.root / session_name(name))

    def session_dir(self, session: str) -> Path:
        return Path(session)

    def describe(self, session: str) -> str:
        return str(session)

    def sessions(self) -> list[str]:
        found: list[str] = []
        if not self.root.is_dir():
            return found
        for dirpath, dirnames, filenames in os.walk(self.root, followlinks=False):
            here = Path(dirpath)
            dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
            if here != self.root and (any(f in filenames for f in _SESSION_FILES) or "vault" in os.listdir(here)):
                found.append(str(here))
        return sorted(found)

    def exists(self, session: str) -> bool:
        path = Path(session)
        return path.is_dir() and any((path / f).exists() for f in (*_SESSION_FILES, "vault"))

    @contextlib.contextmanager
    def creating(self, session: str) -> Iterator[str]:
        """Written in a hidden folder beside the session directory, renamed to it at the end
        (:mod:`ctxrules.stores.staging`); no lock is needed: no other writer knows that folder."""
        with staged_dir(Path(session), lambda: self.exists(session)) as staging:
            key = str(staging)
            try:
                yield key
            finally:
                self.forget(key)
                with self._mutex:
                    self._sessions.pop(key, None)
                    self._vault_roots.pop(key, None)

    # --- the turn -------------------------------------------------------------------------------

    def _turn_files(self, session: str) -> SessionStore:
        with self._mutex:
            found = self._sessions.get(session)
            if found is None:
                found = self._sessions[session] = SessionStore(Path(session))
            return found

    def load_turn(self, session: str, *, output: bool = True) -> Turn:
        files = self._turn_files(session)
        state = files.load()
        turn = Turn(state)
        record = state.get("last") or {}
        count = record.get("output_count")
        if output and isinstance(count, int):
            turn.output = files.load_output(count, record.get("output_file"), record.get("output_digest"))
        return turn

    def commit_turn(
        self,
        session: str,
        state: dict[str, Any],
        output: list[dict[str, Any]],
        *,
        records: Sequence[tuple[Sequence[Log], Mapping[str, Any]]] = (),
    ) -> None:
        self._sync_vault(session)  # every item the output may name is on disk before it is saved
        self._sweep_files(session)
        self._turn_files(session).save(state, output)
        self._forget_checks(session)  # the next turn checks the vault's directories again
        for logs, record in records:
            self.append(logs, record)

    def output_holds(self, session: str, output: list[dict[str, Any]]) -> bool:
        return self._turn_files(session).holds(output)

    def forget(self, session: str) -> None:
        self._turn_files(session).forget()
        self._forget_checks(session)

    def save_state(self, session: str, state: dict[str, Any]) -> None:
        # In place, as a turn's state is written (ctxrules.session_store.SessionStore.save_state).
        self._turn_files(session).save_state(state)

    # --- the vault ------------------------------------------------------------------------------

    def vault_dir(self, session: str) -> Path:
        return Path(session) / self._vault_name

    def _blob_path(self, session: str, blob_id: str) -> Path:
        # Sharding by two hex digits keeps directories small (256 shards) for long sessions.
        return self.vault_dir(session) / blob_id[:2] / blob_id

    def put_blob(self, session: str, data: bytes, media_type: str | None = None) -> str:
        try:
            return self._put_blob(session, data, media_type)
        except OSError as exc:
            # A full disk or a read-only session directory is the user's to fix, not a bug.
            where = self.vault_dir(session)
            raise VaultError(f"cannot write to the vault at {where}: {_reason(exc, where)}") from exc

    def _put_blob(self, session: str, data: bytes, media_type: str | None) -> str:
        blob_id = hashlib.sha256(data).hexdigest()
        # Plain strings, not Path objects: a compaction stores dozens of small items, and
        # building paths cost more than the system calls.
        shard = os.path.join(self._vault_path(session), blob_id[:2])
        path = os.path.join(shard, blob_id)
        key = (session, shard)
        # A shard this call just created holds nothing to check (a fresh session makes one for
        # almost every item); an item another process puts there meanwhile has the same bytes.
        created = False if self._checked(key) else self._ensure_shard(key)
        if created or not _intact(path, blob_id, len(data)):
            # Missing, or corrupt: rewriting repairs it, and the bytes are the same either way.
            self._write_blob(session, shard, path, data)
        if media_type is not None:
            meta = json.dumps({"media_type": media_type}, sort_keys=True).encode("utf-8")
            meta_path = path + _META_SUFFIX
            try:
                current: bytes | None = read_private(Path(meta_path), limit=_META_MAX_BYTES + 1)
            except FileNotFoundError:
                current = None
            if current != meta:
                self._write_blob(session, shard, meta_path, meta)
        return blob_id

    def _vault_path(self, session: str) -> str:
        return os.path.join(session, self._vault_name)

    def _write_blob(self, session: str, shard: str, path: str, data: bytes) -> None:
        """``data`` made durable at ``path`` in the vault directory ``shard`` (inside
        :meth:`durable_at_commit`: by the commit). Every directory from the session's down is
        checked (a planted ``vault`` link would otherwise receive the originals), once per
        turn: a directory removed since is created again."""
        key = (session, shard)
        if not self._checked(key):
            self._ensure_shard(key)
        unsynced = self._unsynced.get(session)
        keep = unsynced is not None and len(unsynced[2]) < _KEPT_FDS
        try:
            fd = _write_durable(shard, path, data, sync=unsynced is None, keep_open=keep)
        except FileNotFoundError:
            # The directory went away since it was checked (a user removed the vault): check
            # and create it again, then write once more.
            self._forget_checks(session)
            self._ensure_shard(key)
            fd = _write_durable(shard, path, data, sync=unsynced is None, keep_open=keep)
        if unsynced is not None:
            if fd is not None:
                unsynced[2].append(fd)
            else:
                unsynced[0].append(path)
            unsynced[1].add(shard)

    def durable_at_commit(self, session: str) -> AbstractContextManager[None]:
        """Within this scope (a session's ``prepare``, under its prepare lock) vault items are
        written and visible at once but fsynced together, files then their directories, before
        :meth:`commit_turn` saves the output that names them, or when the scope ends: one disk
        flush for a compaction's dozens of items instead of one each. A crash before that can
        leave an item cut short, which nothing saved names yet: reads verify the digest
        (a clear error), and the next write of the same bytes repairs it."""
        return _DurableScope(self, session)

    def _sync_vault(self, session: str) -> None:
        unsynced = self._unsynced.get(session)
        if unsynced is None or not (unsynced[0] or unsynced[1] or unsynced[2]):
            return
        paths, dirs, fds = unsynced
        try:
            while fds:
                fd = fds[-1]
                try:
                    os.fsync(fd)
                finally:
                    fds.pop()
                    os.close(fd)
            for path in paths:
                _fsync_path(path, os.O_RDONLY | NOFOLLOW)
            for directory in sorted(dirs):  # the renames
                _fsync_path(directory, os.O_RDONLY | _DIRECTORY)
        except OSError as exc:
            where = self.vault_dir(session)
            raise VaultError(f"cannot write to the vault at {where}: {_reason(exc, where)}") from exc
        paths.clear()
        dirs.clear()

    def _checked(self, key: tuple[str, str]) -> bool:
        when = self._checked_shards.get(key)
        return when is not None and time.monotonic() - when < _CHECK_S

    def _ensure_shard(self, key: tuple[str, str]) -> bool:
        """Check (and create) the shard directory; True when this call created it (empty)."""
        session, shard = key
        checked = self._checked_shards
        parent = (session, os.path.dirname(shard))
        made = created = False
        if self._checked(parent):
            # The vault directory was checked this turn: only the shard is new (a fresh
            # session creates one for almost every item it stores).
            with contextlib.suppress(FileExistsError, FileNotFoundError):  # not found: no vault
                os.mkdir(shard, 0o700)
                created = True
            made = check_dir(shard)
        if not made:
            # From the session directory itself down: a long-lived session's directory swapped
            # for a link since the session was opened must not receive the originals.
            ensure_dir(Path(shard), inside=Path(session).parent)
            self._sweep(session)
        if not created:
            self._sweep(session, shard)
        if len(checked) > 4096:  # a store serving many sessions: bounded
            checked.clear()
        now = time.monotonic()
        checked.setdefault(parent, now)
        checked[key] = now
        return created

    def _forget_checks(self, session: str) -> None:
        """Directories of ``session`` are checked again before the next vault write."""
        checked = self._checked_shards
        if checked:
            for key in [k for k in tuple(checked) if k[0] == session]:  # tuple(): a copy in one step
                checked.pop(key, None)

    def open_blob_writer(self, session: str) -> BlobWriter:
        """A temporary file in the vault directory, renamed to its id on commit (no copy)."""
        root = self.vault_dir(session)
        try:
            key = (session, self._vault_path(session))
            if not self._checked(key):
                ensure_dir(root, inside=Path(session).parent)  # the session directory too
                self._checked_shards[key] = time.monotonic()
                self._sweep(session)
            return _FileBlobWriter(self, session)
        except OSError as exc:
            raise VaultError(f"cannot write to the vault at {root}: {_reason(exc, root)}") from exc

    def _sweep(self, session: str, shard: str | None = None) -> None:
        """Remove what killed writers left in the vault of ``session`` (checked for a write just
        now, :func:`~ctxrules.stores.base.remove_stale_spools`): the spools in the vault itself
        (``shard`` None), or the temporary files of :func:`_write_durable` in ``shard``, one the
        caller is about to write to. Each once in :data:`~ctxrules.stores.base.SWEEP_S` per store
        object: every turn checks the vault again, and a warm turn lists only the shards it
        writes to (a shard of a 5,000-item vault holds some 20 entries: tens of microseconds),
        never all 256 (some 4 ms). A file left in a shard goes when the session next writes an
        item of that shard an hour or more later.

        A shard's temporary files (an item or a ``.meta`` sidecar on its way in) are marked by
        no lock: their writer holds one only between creating it and renaming it over the item,
        within one call, writing bytes it holds in memory. An hour untouched is no live writer;
        and one stopped that long (``SIGSTOP``, a suspended machine) loses nothing: its rename
        finds no file (``FileNotFoundError``), and :meth:`_write_blob` writes the item again, as
        for a shard removed meanwhile. Nothing is visible under an item's id until it is whole."""
        if not self._due((session, shard)):
            return
        if shard is None:
            remove_stale_spools(self._vault_path(session), _TMP_PREFIX)
        else:
            remove_stale_spools(shard, _TMP_PREFIX, held=False)

    def _due(self, key: tuple[str, str | None]) -> bool:
        """Whether the place ``key`` names is to be swept now: once in
        :data:`~ctxrules.stores.base.SWEEP_S` per store object, never for private sessions."""
        now = time.monotonic()
        last = self._swept.get(key)
        if self._private or (last is not None and now - last < SWEEP_S):
            return False
        if len(self._swept) > 4096:  # a store serving many sessions: bounded
            self._swept.clear()
        self._swept[key] = now
        return True

    def _sweep_files(self, session: str) -> None:
        """Remove the temporary files of whole-file writes (``.last_output.jsonl.*.tmp``,
        ``.notes.json.*.tmp``, ...: :data:`_SESSION_TEMPORARIES`) that writers killed before
        their rename left in the session directory, once untouched for
        :data:`~ctxrules.stores.base.STALE_SPOOL_S`; before the session's files are written,
        once in :data:`~ctxrules.stores.base.SWEEP_S` per store object (a session directory
        holds a dozen entries: some microseconds). Such a file is held by no lock: its writer
        holds it within one call, writing bytes it has in memory, and one stopped for that hour
        writes again (:func:`ctxrules.private_files.write_atomic`). An agent killed on every
        turn no longer grows its session directory without bound."""
        if self._due((session, "")):
            remove_stale_spools(session, ".", held=False, names=_SESSION_TEMPORARIES)

    def get_blob(self, session: str, blob_id: str) -> bytes:
        handle, path = self._open_item(session, blob_id)
        with handle:
            try:
                st = os.fstat(handle.fileno())
                self._known_corrupt(st, blob_id, path)
                if st.st_size > _READ_WHOLE_BYTES:
                    # Checked a block at a time before it is read whole: a damaged item claiming
                    # gigabytes (a sparse file) is refused without taking the memory.
                    self._verified(handle, st, blob_id, path)
                    handle.seek(0)
                data = handle.read(st.st_size + 1)  # grown since: more than it was, and refused below
            except OSError as exc:
                raise VaultError(f"cannot read vault entry {blob_id}: {exc}") from exc
        actual = hashlib.sha256(data).hexdigest()
        if actual != blob_id:
            self._remember_corrupt(st, path)
            raise VaultError(f"vault entry {blob_id} is corrupt: its content hashes to {actual} ({path})")
        return data

    def _known_corrupt(self, st: os.stat_result, blob_id: str, path: Path) -> None:
        """:class:`VaultError` when the file is the very one found corrupt before (same inode,
        size, mtime and ctime): not read again."""
        if self._corrupt.get(str(path)) == (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns):
            raise VaultError(
                f"vault entry {blob_id} is corrupt: its content does not hash to its id ({path}, unchanged "
                "since it was read)"
            )

    def _remember_corrupt(self, st: os.stat_result, path: Path) -> None:
        if len(self._corrupt) >= 1024:
            self._corrupt.clear()
        self._corrupt[str(path)] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def _verified(self, handle: BinaryIO, st: os.stat_result, blob_id: str, path: Path) -> None:
        try:
            _verify(handle, blob_id, path)
        except VaultError:
            self._remember_corrupt(st, path)
            raise

    def open_blob(self, session: str, blob_id: str) -> BinaryIO:
        """The item as a file open at its start, checked against its id first, a block at a
        time: ``vault get`` copies an item of gigabytes (``compress`` of a huge output) without
        holding it, and refuses a damaged one (:class:`VaultError`) before printing a byte, in
        as little memory. The caller closes it."""
        handle, path = self._open_item(session, blob_id)
        try:
            st = os.fstat(handle.fileno())
            self._known_corrupt(st, blob_id, path)
            self._verified(handle, st, blob_id, path)
            handle.seek(0)
        except OSError as exc:
            handle.close()
            raise VaultError(f"cannot read vault entry {blob_id}: {exc}") from exc
        except BaseException:
            handle.close()
            raise
        return handle

    def _open_item(self, session: str, blob_id: str) -> tuple[BinaryIO, Path]:
        path = self._blob_path(session, blob_id)
        try:
            # The directories on the way, as a run checks them: a link among them would read
            # from outside the session (``vault get`` on a session whose vault was swapped).
            for directory in (session, path.parent.parent, path.parent):
                check_dir(directory)
            fd = open_private(path, os.O_RDONLY)
        except FileNotFoundError:
            raise VaultError(
                f"vault item {blob_id} is missing from {self.vault_dir(session)} "
                "(not found: deleted, or never stored in this session)"
            ) from None
        except (OSError, UnsafePathError) as exc:
            raise VaultError(f"cannot read vault entry {blob_id}: {exc}") from exc
        return os.fdopen(fd, "rb"), path

    def has_blob(self, session: str, blob_id: str) -> bool:
        # Not through a link: a link, a FIFO or a directory in an item's place is no item.
        return _is_regular(str(self._blob_path(session, blob_id)))

    def missing_blobs(self, session: str, blob_ids: Sequence[str]) -> set[str]:
        # One lstat per id (a warm turn asks for every marker of its output), on a string path
        # (a Path per id cost more than the call). What is not a regular file (a link, a FIFO,
        # a directory put in its place) counts as missing: the turn derives the output again,
        # and writing the item renames it over what was planted. Bytes changed in place are found when read (the
        # digest), not here: hashing every item on every turn would cost more than the turn.
        if not blob_ids:
            return set()
        root = self._vault_roots.get(session)
        if root is None:
            if len(self._vault_roots) > 4096:  # a store serving many sessions: bounded
                self._vault_roots.clear()
            root = self._vault_roots[session] = os.path.join(self._vault_path(session), "")
        return {b for b in blob_ids if not _is_regular(f"{root}{b[:2]}/{b}")}

    def blob_ids(self, session: str, prefix: str = "") -> list[str]:
        """The items as :meth:`has_blob` sees them: regular files only (a link, a FIFO or a
        directory in an item's place is no item). The vault and its shards are listed only
        when they are real directories of this user, as :meth:`get_blob` reads them: a planted
        ``vault`` or shard link is refused (:class:`VaultError`), never listed through."""
        root = self.vault_dir(session)
        ids: list[str] = []
        try:
            if not (check_dir(session) and check_dir(root)):
                return ids
            if len(prefix) >= 2:
                shards = [prefix[:2]]
            else:
                shards = sorted(s for s in os.listdir(root) if len(s) == 2 and _HEX_RE.fullmatch(s))
                shards = [s for s in shards if s.startswith(prefix)]
            for shard in shards:
                if not check_dir(root / shard):
                    continue
                with contextlib.suppress(FileNotFoundError), os.scandir(root / shard) as entries:
                    ids.extend(
                        e.name
                        for e in entries
                        if len(e.name) == _ID_LEN
                        and e.name.startswith(shard)
                        and e.name.startswith(prefix)
                        and _HEX_RE.fullmatch(e.name)
                        and e.is_file(follow_symlinks=False)
                    )
        except FileNotFoundError:  # the vault removed while listed
            return []
        except (OSError, UnsafePathError) as exc:
            raise VaultError(f"cannot list the vault {root}: {exc}") from exc
        return sorted(ids)

    def blob_media_type(self, session: str, blob_id: str) -> str | None:
        meta_path = self._blob_path(session, blob_id).with_name(blob_id + _META_SUFFIX)
        try:
            raw = read_private(meta_path, limit=_META_MAX_BYTES + 1)
        except FileNotFoundError:
            return None
        if len(raw) > _META_MAX_BYTES:
            return None  # not a sidecar ctxrules wrote, as below
        try:
            meta = json.loads(raw)
        except (ValueError, RecursionError):
            return None  # a sidecar ctxrules did not write (not its JSON): no media type, as on Redis
        value = meta.get("media_type") if isinstance(meta, dict) else None
        return value if isinstance(value, str) else None

    # --- documents ------------------------------------------------------------------------------

    def _doc_path(self, session: str, name: DocName) -> tuple[Path, Path | None]:
        known = self._doc_paths.get((session, name))
        if known is None:
            file, lock = _DOC_FILES[name]
            base = Path(session)
            known = (base / file, (base / lock if lock else None))
            if len(self._doc_paths) >= 4096:
                self._doc_paths.clear()
            self._doc_paths[(session, name)] = known
        return known

    def doc_location(self, session: str, name: DocName) -> str:
        return str(self._doc_path(session, name)[0])

    def read_doc(self, session: str, name: DocName) -> bytes | None:
        path, _lock = self._doc_path(session, name)
        # One lstat first: a document that is not there (most sessions keep no notes) costs no
        # open, and one whose file is the very file read last time (same inode, size, change
        # and modification times: every writer renames a new file in place) is not read again.
        # Only a file last changed _DOC_SETTLED_NS ago or more is taken from memory: file times
        # are coarse (a few ms), and a freed inode number may come back with a new file of the
        # same size within one tick (git's "racy" index entries have the same problem).
        seen = self._doc_reads.get((session, name))
        if seen is None and _ACCESS_NOFOLLOW and not os.access(path, os.F_OK, follow_symlinks=False):
            return None  # absent (as last time, most likely): no exception for a failed lstat
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            self._doc_reads.pop((session, name), None)
            return None
        ident = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if seen is not None and seen[0] == ident and stat.S_ISREG(st.st_mode):
            return seen[1]
        settled = time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) >= _DOC_SETTLED_NS
        try:
            data = _read_doc_file(path)
        except FileNotFoundError:
            return None
        if settled and len(data) == st.st_size and len(data) <= _DOC_MEMO_BYTES:
            if len(self._doc_reads) >= 256:
                self._doc_reads.clear()
            self._doc_reads[(session, name)] = (ident, data)
        return data

    def update_doc(self, session: str, name: DocName, update: Callable[[bytes | None], bytes | None]) -> None:
        path, lock_path = self._doc_path(session, name)
        self._doc_reads.pop((session, name), None)
        try:
            ensure_dir(path.parent)
            lock = _locks().FileLock(lock_path or path.with_name(path.name + ".lock"))
            lock.acquire()
        except (OSError, _locks().LockError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else str(exc)
            raise StoreError(f"cannot use session directory {path.parent}: {why}") from exc
        try:
            try:
                current: bytes | None = _read_doc_file(path)
            except FileNotFoundError:
                current = None
            new = update(current)
            if new is not None and new != current:
                self._sweep_files(session)
                # Notes and touched files are the user's: durable. Router state is a cache.
                write_atomic(path, new, durable=name != "router")
        finally:
            lock.release()

    def write_doc(self, session: str, name: DocName, data: bytes | None) -> None:
        path, _lock = self._doc_path(session, name)
        self._doc_reads.pop((session, name), None)
        if data is None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return
        self._sweep_files(session)
        # The checkpoint only has to outlive the process (ctxrules.runtime.checkpoint): no fsync.
        write_atomic(path, data, durable=name != "checkpoint")

    # --- logs -----------------------------------------------------------------------------------

    def log_path(self, log: Log) -> Path:
        return self._log_path(log)[0]

    def _log_path(self, log: Log) -> tuple[Path, str]:
        key = (log.kind, log.name)  # a dataclass hashes in Python, a tuple of two strings in C
        found = self._log_paths.get(key)
        if found is None:
            if len(self._log_paths) > 4096:  # one per ledger a process reads: bounded all the same
                self._log_paths.clear()
            path = self._new_log_path(log)
            found = self._log_paths[key] = (path, os.fspath(path))
        return found

    def _new_log_path(self, log: Log) -> Path:
        if log.kind == "session":
            return Path(log.name) / "ledger.jsonl"
        if log.kind == "descendants":
            return Path(log.name) / "descendants.jsonl"
        if log.kind == "day":
            return self.root / "ledger" / "days" / f"{log.name}.jsonl"
        if log.kind == "goal":
            return self.root / "ledger" / "goals" / f"{log.name}.jsonl"
        if log.kind == "misroutes":
            return self.root / "router" / "misroutes.jsonl"
        raise StoreError(f"unknown log kind {log.kind!r}; one of: {', '.join(LOG_KINDS)}")

    def log_location(self, log: Log) -> str:
        return self._log_path(log)[1]

    def logs(self, kind: LogKind) -> list[Log]:
        if kind in ("day", "goal"):
            folder = self.root / "ledger" / ("days" if kind == "day" else "goals")
            try:
                if not check_dirs_below(folder, self.root):  # a planted link is refused
                    return []
                names = sorted(n for n in os.listdir(folder) if n.endswith(".jsonl"))
            except (FileNotFoundError, NotADirectoryError):
                return []
            return [Log(kind, n[: -len(".jsonl")]) for n in names]
        if kind == "misroutes":
            path = self.log_path(Log("misroutes"))
            return [Log("misroutes")] if check_dirs_below(path.parent, self.root) and path.is_file() else []
        file = "ledger.jsonl" if kind == "session" else "descendants.jsonl"
        return [Log(kind, s) for s in self.sessions() if (Path(s) / file).is_file()]

    def append(self, logs: Sequence[Log], record: Mapping[str, Any]) -> None:
        """All or nothing: a call lands in its session, day and goal ledgers or in none, so a
        retry after a failure never counts it twice. Every ledger is opened under its lock
        before any is written (a folder that cannot be made, a file in its way, a lock that
        cannot be taken: nothing written); a write or fsync that fails then takes the line
        back out of the ledgers it reached (each is cut back to its size before, still under
        its lock). Locks are taken in one order (by log kind, then path), so two writers that
        share a day ledger never wait on each other."""
        line = json.dumps(record, ensure_ascii=False, sort_keys=True, allow_nan=False).encode("utf-8") + b"\n"
        unique = {os.path.abspath(self.log_path(log)): log for log in logs}  # a log named twice: once
        with contextlib.ExitStack() as held:
            opened: list[tuple[Path, Log, int, int]] = []
            for key in sorted(unique, key=lambda k: (unique[k].kind, k)):
                log, path = unique[key], self.log_path(unique[key])
                try:
                    fd = held.enter_context(_locked_log(path, inside=self._log_top(log)))
                    opened.append((path, log, fd, os.fstat(fd).st_size))
                except OSError as exc:
                    raise CtxrulesError(f"cannot write the ledger {path}: {exc.strerror}") from exc
            failed = opened[0][0] if opened else Path()
            try:
                for path, _log, fd, _size in opened:
                    failed = path
                    _append_to(fd, line)
                for path, log, fd, _size in opened:
                    failed = path
                    # Misroute reports steer a heuristic: losing the last one to a power cut costs nothing.
                    if log.kind != "misroutes":
                        os.fsync(fd)
            except OSError as exc:
                for _path, _log, fd, size in opened:  # (a ledger not reached yet is left as it was)
                    with contextlib.suppress(OSError):
                        os.ftruncate(fd, size)
                        os.fsync(fd)
                raise CtxrulesError(
                    f"cannot write the ledger {failed}: {exc.strerror}; nothing was recorded (in none of its ledgers)"
                ) from exc

    def append_once(
        self, log: Log, record: Mapping[str, Any], *, key: str, limit: int
    ) -> Literal["added", "present", "full"]:
        path = self.log_path(log)
        wanted = record.get(key)
        try:
            with _locked_log(path, inside=self._log_top(log)) as fd:
                with os.fdopen(os.dup(fd), "rb") as fh:
                    fh.seek(0)
                    known = [ln for ln in _complete_lines(fh, 0)[0] if ln.strip()]
                if any(_field(ln, key) == wanted for ln in known):
                    return "present"
                if len(known) >= limit:
                    return "full"
                _append_to(fd, json.dumps(dict(record), sort_keys=True).encode("utf-8") + b"\n")
                os.fsync(fd)
        except OSError as exc:
            raise CtxrulesError(f"cannot write {path}: {exc.strerror}") from exc
        return "added"

    def _log_top(self, log: Log) -> Path | None:
        """Where the directories a log is written in start to be the store's own: the state
        root for its day, goal and misroute ledgers (a ``ledger`` or ``router`` link planted in
        it must not receive them), the session directory's parent for a session's logs."""
        return self.root if log.kind in ("day", "goal", "misroutes") else None

    def read_log(self, log: Log, cursor: Any = None) -> LogChunk:
        """Cursor: ``(device, inode, offset, size)`` of the file as last read. Readers take no
        lock: they consume complete lines only. A link where the log belongs is refused."""
        path, where = self._log_path(log)
        ident = offset = size = None
        if isinstance(cursor, tuple) and len(cursor) == 4:
            ident, offset, size = (cursor[0], cursor[1]), cursor[2], cursor[3]
        elif cursor is None and _ACCESS_NOFOLLOW and not os.access(where, os.F_OK, follow_symlinks=False):
            # Never read, or absent last time (most sessions have no sub-agents, many record no
            # calls): asked every prepare, and a failed lstat costs an exception each time.
            return LogChunk([], None)
        try:
            # An lstat first: every prepare asks, and the file rarely grew since.
            st = os.lstat(where)
            if ident == (st.st_dev, st.st_ino) and st.st_size == size and stat.S_ISREG(st.st_mode):
                return LogChunk([], cursor)
            # The file itself is opened without following a link; the folders between the
            # state root and it must be real too (a planted ``ledger`` link would hand over
            # another place's ledger: budgets read from records this store never wrote).
            top = self._log_top(log)
            if top is not None and not check_dirs_below(path.parent, top):
                raise FileNotFoundError(path)
            fd = open_private(path, os.O_RDONLY)
        except FileNotFoundError:
            return LogChunk([], None, restarted=cursor is not None)
        except OSError as exc:
            raise CtxrulesError(f"cannot read the ledger {path}: {exc.strerror}") from exc
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            restarted = (st.st_dev, st.st_ino) != ident or offset is None or st.st_size < offset
            start = 0 if restarted else int(offset or 0)
            fh.seek(start)
            lines, new_offset, end = _complete_lines(fh, start)
        return LogChunk(lines, (st.st_dev, st.st_ino, new_offset, end), restarted)

    # --- locks ----------------------------------------------------------------------------------

    def prepare_lock(self, session: str, *, timeout: float | None = None) -> PrepareLock:
        return _PrepareLock(Path(session), timeout, self)

    def compaction_lock(self, session: str) -> AbstractContextManager[Any]:
        return _CompactionLock(Path(session) / ".compaction.lock")

    # --- secrets --------------------------------------------------------------------------------

    def secret(self, session: str | None, name: str, make: Callable[[], bytes]) -> bytes:
        """``<root or session>/<name>``, hex text, created exclusively (two creators agree: the
        loser reads the winner's) and fsynced. It is written whole to a hidden file first and
        linked into place: created empty and then written, a first ``prepare`` of another
        session under the same root, in another thread or process, read it in between and
        failed on an empty key."""
        path = (self.root if session is None else Path(session)) / name
        try:
            return _read_secret(path)
        except FileNotFoundError:
            pass
        value = make()  # first: a caller that only asks (make raises) creates nothing
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # The hidden files of creators killed before their link (the only time one is made:
        # none once the key exists), when untouched for an hour (see _sweep_files).
        remove_stale_spools(str(path.parent), f".{name}.", held=False, names=_SESSION_TEMPORARIES)
        if _link_secret(path, value):
            return value
        try:
            return _read_secret(path)  # another creator's, linked first
        except FileNotFoundError:
            pass
        # A file system without hard links: created exclusively, then written.
        try:
            fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        except FileExistsError:
            return _read_secret(path)
        except OSError as exc:
            raise UsageError(f"{path}: cannot create the {_what(path)}: {exc.strerror or exc}") from None
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(value.hex() + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        return value

    def close(self) -> None:
        with self._mutex:
            self._sessions.clear()


class _PrepareLock:
    """The session's ``.lock`` (:class:`ctxrules.session_store.SessionLock`), with a wait timeout."""

    def __init__(self, path: Path, timeout: float | None, store: FilesystemStore | None = None) -> None:
        self.path = path
        self._name = os.fspath(path)  # checked on every turn: no Path conversion each time
        self._timeout = timeout
        self._store = store  # its lock_timeout_s when no timeout is given, read at each wait
        # The lock on <session>/.lock (ctxrules.session_store.SessionLock's), made on first use.
        self._file: Any = None

    def __enter__(self) -> _PrepareLock:
        # Every turn, before the lock file is opened (a kept descriptor, a directory made once
        # per lock object): the session directory may have been removed since the last turn
        # (made again) or swapped for a link (refused, nothing opened through it).
        if not check_dir(self._name):
            ensure_dir(self.path)
        timeout = self._timeout
        if timeout is None and self._store is not None:
            timeout = self._store.lock_timeout_s
        lock = self._file
        if lock is None or lock.timeout != timeout:
            lock = self._file = _locks().FileLock(self.path / ".lock", timeout=timeout)
        try:
            lock.acquire()
        except _locks().LockTimeout:
            raise StoreLockTimeout(
                f"[CR149] the session {self.path} stayed locked by another process or session object "
                f"for {timeout:g}s (lock_timeout_s)"
            ) from None
        except _locks().LockError:
            if not _read_only(self._name):
                raise
            # On a read-only file system (a backup mounted read-only) no process can change
            # the session: a reader (sessions export) needs no lock, and a writer fails on its
            # first write, saying so.
        return self

    def __exit__(self, *exc: object) -> None:
        lock = self._file
        if lock is not None and lock.is_locked:
            lock.release()

    def renew(self) -> None:
        """A file lock is held until release: nothing to renew."""


class _CompactionLock:
    """``<session>/.compaction.lock``, taken without waiting (:class:`CompactionBusy` when held)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock: Any = None

    def __enter__(self) -> _CompactionLock:
        lock = _locks().FileLock(self.path, timeout=0)
        try:
            lock.acquire()
        except _locks().LockTimeout:
            raise CompactionBusy(f"another compaction of {self.path.parent} is running") from None
        self._lock = lock
        return self

    def __exit__(self, *exc: object) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None


def _locks() -> ModuleType:
    """:mod:`ctxrules.locks`, imported on the first lock taken: verbs that only read packs
    (``validate``, ``explain``, ``assemble``, ``test``) never load it, nor ``filelock``."""
    from ctxrules import locks

    return locks


def file_path(url: str) -> Path:
    """The directory of a ``file://`` URL (``file://rel/dir`` is taken relative, as users write it)."""
    parts = urlsplit(url)
    if parts.fragment or any(name != "lock_timeout_s" for name, _ in parse_qsl(parts.query, keep_blank_values=True)):
        raise StoreUsageError("CR145", f"store URL {url!r}: a file:// store takes one option, lock_timeout_s")
    folder = unquote(parts.netloc + parts.path)
    # `file://` (an unset variable: file://$DIR) would be the current directory, and a NUL
    # byte no path at all (an internal error when the first file was opened).
    if not folder.strip() or "\0" in folder:
        raise StoreUsageError("CR145", f"store URL {url!r} names no folder: give file://DIR")
    return Path(folder)


def _lock_timeout(url: str) -> float | None:
    """``lock_timeout_s`` of a ``file://`` URL: seconds, 0 up to ten years (None: not given)."""
    values = [v for name, v in parse_qsl(urlsplit(url).query, keep_blank_values=True) if name == "lock_timeout_s"]
    if not values:
        return None
    try:
        seconds = float(values[-1])
    except ValueError:
        seconds = float("nan")
    if len(values) > 1 or not 0 <= seconds <= 315_360_000:
        raise StoreUsageError(
            "CR145", f"store URL {url!r}: lock_timeout_s must be one number of seconds from 0 to 315360000"
        )
    return seconds


def _what(path: Path) -> str:
    return "injection key" if path.name.endswith(".key") else f"secret {path.name}"


def _link_secret(path: Path, value: bytes) -> bool:
    """Write ``value`` (hex text) to a hidden file beside ``path``, fsync it and hard-link it to
    ``path``, which then appears whole or not at all. False when ``path`` exists already or
    the file system makes no links (nothing is left behind either way)."""
    try:
        fd, spare = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError:  # the exclusive creation below says what is wrong
        return False
    try:
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(value.hex() + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.link(spare, path)
    except OSError:  # FileExistsError: another creator won; else no links here
        return False
    finally:
        with contextlib.suppress(OSError):
            os.unlink(spare)
    return True


# A key file's text: whole bytes in hex, as many as a key may have.
_KEY_TEXT: Final = re.compile(f"(?:[0-9a-f]{{2}}){{{SECRET_BYTES[0]},{SECRET_BYTES[1]}}}")


def _read_secret(path: Path) -> bytes:
    try:
        raw = read_private(path, limit=200)
    except FileNotFoundError:
        raise
    except (OSError, UnsafePathError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise UsageError(f"{path}: cannot read the {_what(path)}: {why}") from None
    text = raw.decode("ascii", "replace").strip()
    # An empty file is a creation that died before writing: not a key, and not ours to guess.
    # Whole bytes: a key cut short by an odd number of digits is damage too (fromhex refuses it).
    if not _KEY_TEXT.fullmatch(text):
        raise UsageError(
            f"{path}: not an injection key (expected {2 * SECRET_BYTES[0]} to {2 * SECRET_BYTES[1]} hex digits, "
            "an even number); delete it to make a new one"
        )
    return bytes.fromhex(text)


def _read_doc_file(path: Path) -> bytes:
    """A document's bytes, at most :data:`~ctxrules.stores.base.DOC_MAX_BYTES`: a file claiming
    gigabytes (sparse) would take the memory and minutes of every verb that reads it; larger, it
    is no document ctxrules wrote (:class:`StoreError`, naming it). ``FileNotFoundError`` propagates."""
    data = read_private(path, limit=DOC_MAX_BYTES + 1)
    if len(data) > DOC_MAX_BYTES:
        raise StoreError(f"{path} is larger than {DOC_MAX_BYTES >> 20} MiB: not a document ctxrules wrote (remove it)")
    return data


_LOG_BLOCK: Final = 1 << 20
_LOG_LINE_MAX: Final = 1 << 20
"""A ledger record is a few hundred bytes: a line longer than this is damage (a file claiming
gigabytes without a newline, say), not held in memory as it is read: it stands as
:data:`_OVERLONG`, which no reader parses (a damaged line, skipped and counted as any other)."""
_OVERLONG: Final = b"(a line longer than 1 MiB, not read)"


def _complete_lines(fh: Any, start: int) -> tuple[list[bytes], int, int]:
    """The complete lines of ``fh`` from its position ``start`` to its end, read a block at a
    time, those longer than :data:`_LOG_LINE_MAX` as :data:`_OVERLONG`: (lines, the offset after
    the last newline, the offset of the end). Bytes after the last newline (a record being
    appended) are not a line yet."""
    lines: list[bytes] = []
    pending = bytearray()  # the line read so far
    overlong = False  # the line read so far is past the limit: skipped to its newline
    after_newline = position = start
    while block := fh.read(_LOG_BLOCK):
        parts = block.split(b"\n")
        if len(parts) > 1:
            first, rest = parts[0], parts[1:-1]  # the first ends the line read so far
            if overlong or len(pending) + len(first) > _LOG_LINE_MAX:
                lines.append(_OVERLONG)
            else:
                lines.append(bytes(pending) + first if pending else first)
            pending.clear()
            overlong = False
            if rest and max(map(len, rest)) > _LOG_LINE_MAX:
                rest = [part if len(part) <= _LOG_LINE_MAX else _OVERLONG for part in rest]
            lines.extend(rest)
        position += len(block)
        if len(parts) > 1:
            after_newline = position - len(parts[-1])
        if not overlong:
            pending += parts[-1]
            if len(pending) > _LOG_LINE_MAX:
                pending.clear()
                overlong = True
    return lines, after_newline, position


def _field(line: bytes, key: str) -> Any:
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):  # a damaged line (nested past the stack too) names nothing
        return None
    return obj.get(key) if isinstance(obj, dict) else None


def _is_regular(path: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


_BLOCK: Final = 1 << 20
_READ_WHOLE_BYTES: Final = 64 << 20
"""An item larger than this is checked against its id a block at a time before it is read
whole (:meth:`FilesystemStore.get_blob`); a smaller one is read and hashed at once (one pass)."""


def _verify(handle: BinaryIO, blob_id: str, path: Path) -> None:
    """:class:`VaultError` unless ``handle``, read a block at a time from where it is to its
    end, holds the bytes of ``blob_id``."""
    actual = _sha256_of(handle)
    if actual != blob_id:
        raise VaultError(f"vault entry {blob_id} is corrupt: its content hashes to {actual} ({path})")


def _intact(path: str | Path, blob_id: str, size: int | None = None) -> bool:
    """Whether ``path`` holds the bytes of ``blob_id`` (read a block at a time: a blob may be
    a huge command output). With ``size`` (the bytes' length), a file of another size is not
    read at all: a damaged item claiming gigabytes (a sparse file) was hashed whole before the
    write that repairs it."""
    try:
        fd = open_private(path, os.O_RDONLY)
    except (FileNotFoundError, UnsafePathError):
        # Nothing there, or something planted in the item's place (a link, a FIFO): not read,
        # and the write renames the item over it, never writing through it.
        return False
    with os.fdopen(fd, "rb") as handle:
        if size is not None and os.fstat(handle.fileno()).st_size != size:
            return False
        return _sha256_of(handle) == blob_id


def _sha256_of(handle: BinaryIO) -> str:
    """The sha256 hex of what ``handle`` holds from where it is to its end, a block at a time."""
    digest = hashlib.sha256()
    while block := handle.read(_BLOCK):
        digest.update(block)
    return digest.hexdigest()


class _FileBlobWriter(SpooledBlobWriter):
    """A blob written in pieces: a private temporary file in the vault directory, hashed as it
    grows; :meth:`commit` makes it durable (fsync) and then visible under its id (a rename, no
    copy)."""

    def __init__(self, store: FilesystemStore, session: str) -> None:
        self._fs = store
        self._syncing: threading.Thread | None = None
        self._sync_error: OSError | None = None
        super().__init__(store, session)

    def _temporary(self) -> tuple[int, str]:
        fd, name = tempfile.mkstemp(prefix=_TMP_PREFIX, dir=self._fs.vault_dir(self._session))
        if not self._fs._private:
            # Held until the file is closed (committed or discarded): a live writer's spool,
            # however long idle, is never taken for one a killed process left.
            _locks().hold_shared(fd)
        return fd, name

    def _write_failed(self, exc: OSError) -> VaultError:
        where = self._fs.vault_dir(self._session)
        return VaultError(f"cannot write to the vault at {where}: {_reason(exc, where)}")

    def sync_soon(self) -> None:
        """Start writing the file to disk on a thread (``fsync`` lets go of the GIL), while the
        caller compresses the output: :meth:`commit`'s own fsync then finds little left to do.
        The thread syncs a duplicate descriptor, so a :meth:`discard` meanwhile closes nothing
        it uses. A failure there is kept for :meth:`commit` to raise: the duplicate shares the
        open file, so the kernel reports a write-back error once, to whichever fsync comes first."""
        if self._done or self._syncing is not None:
            return
        try:
            fd = os.dup(self._handle.fileno())
        except OSError:  # no descriptor to spare: commit syncs it all, as before
            return

        def sync() -> None:
            try:
                os.fsync(fd)
            except OSError as exc:
                self._sync_error = exc
            finally:
                os.close(fd)

        thread = helper_thread(sync, "ctxrules-blob-sync")
        try:
            thread.start()
        except RuntimeError:  # no thread to be had
            os.close(fd)
            return
        self._syncing = thread

    def commit(self) -> str:
        blob_id = self.vault_id
        if self._syncing is not None:
            self._syncing.join()
        try:
            if self._sync_error is not None:  # never visible unless durable
                raise self._sync_error
            os.fsync(self._handle.fileno())  # durable before visible, as every blob
            shard = os.path.join(self._fs._vault_path(self._session), blob_id[:2])
            target = os.path.join(shard, blob_id)
            key = (self._session, shard)
            if not self._fs._checked(key):
                self._fs._ensure_shard(key)
            try:
                _replace_item(str(self.path), target)  # a blob already there has the same bytes
            except FileNotFoundError:  # the shard went away since it was checked
                self._fs._forget_checks(self._session)
                self._fs._ensure_shard(key)
                _replace_item(str(self.path), target)
        except OSError as exc:
            raise self._write_failed(exc) from exc
        unsynced = self._fs._unsynced.get(self._session)
        if unsynced is not None:
            unsynced[1].add(shard)  # the rename, with the turn's other directories
        self._done = True
        with contextlib.suppress(OSError):
            self._handle.close()
        return blob_id


@contextlib.contextmanager
def _locked_log(path: Path, *, inside: Path | None = None) -> Iterator[int]:
    """A log file open for appending (never through a link), under its sibling lock file;
    every directory from ``inside`` (default: the parent of the log's directory) down to it
    must be a real directory of this user."""
    ensure_dir(path.parent, inside=inside)
    with _locks().FileLock(path.with_name(path.name + ".lock")):
        fd = open_private(path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
        try:
            yield fd
        finally:
            os.close(fd)


def _append_to(fd: int, line: bytes) -> None:
    """Append ``line`` whole, first ending a line a crashed writer left unfinished."""
    size = os.fstat(fd).st_size
    if size and os.pread(fd, 1, size - 1) != b"\n":
        line = b"\n" + line
    view = memoryview(line)
    while view:
        view = view[os.write(fd, view) :]


_KEPT_FDS = 64
"""Descriptors of unsynced vault files a turn keeps open for its commit, at most (the rest
are reopened by path then): a compaction storing thousands of items stays far below any
descriptor limit."""


def _replace_item(src: str, dst: str) -> None:
    """``os.replace``, also over an empty directory in a vault file's place (created by some
    other tool: it holds nothing, and left there it failed every write of that item, so every
    turn kept the output whole). A directory that holds something is not ours to remove: the
    error says so."""
    try:
        os.replace(src, dst)
    except IsADirectoryError:
        os.rmdir(dst)  # ENOTEMPTY for one that holds something
        os.replace(src, dst)


def _fsync_path(path: str, flags: int) -> None:
    fd = os.open(path, flags | _CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durable(directory: str, path: str, data: bytes, *, sync: bool = True, keep_open: bool = False) -> int | None:
    """``data`` at ``path`` (in ``directory``), durable before visible: after a crash the id
    either resolves to the full content or not at all. A temporary file of this user (mode
    0600, created exclusively, never through a link), written, fsynced, renamed over ``path``.
    ``sync=False``: not fsynced here; the caller does it (``durable_at_commit``), through the
    descriptor returned open with ``keep_open`` (else None)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW | _CLOEXEC
    while True:
        tmp_name = os.path.join(directory, _TMP_PREFIX + os.urandom(8).hex())
        try:
            fd = os.open(tmp_name, flags, 0o600)
            break
        except FileExistsError:  # 64 random bits taken: try another name
            continue
    kept = keep_open and not sync
    try:
        try:
            os.fchmod(fd, 0o600)  # whatever the umask
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if sync:
                os.fsync(fd)
        finally:
            if not kept:
                os.close(fd)
        _replace_item(tmp_name, path)
    except BaseException:
        if kept:
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    return fd if kept else None


class _DurableScope:
    """:meth:`FilesystemStore.durable_at_commit` (a class: entered around every prepare, and a
    generator-based context manager cost a measurable part of a warm turn)."""

    __slots__ = ("_outer", "_session", "_store")

    def __init__(self, store: FilesystemStore, session: str) -> None:
        self._store, self._session = store, session
        self._outer = False

    def __enter__(self) -> None:
        unsynced = self._store._unsynced
        self._outer = self._session not in unsynced  # nested: the outer scope syncs
        if self._outer:
            unsynced[self._session] = ([], set(), [])

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if not self._outer:
            return
        store, session = self._store, self._session
        try:
            if exc_type is None:
                store._sync_vault(session)
            else:
                with contextlib.suppress(OSError, CtxrulesError):  # the error that ended the turn counts
                    store._sync_vault(session)
        finally:
            left = store._unsynced.pop(session, None)
            for fd in left[2] if left is not None else ():  # a sync that failed part way
                with contextlib.suppress(OSError):
                    os.close(fd)


# What ctxrules keeps in each of its own folders, and whether an entry of such a folder is one
# ctxrules made: a folder of that name holding nothing of it, beside nothing of ctxrules', is
# the user's (a project's ``vault/`` with sessions below it).
_OWN_FOLDERS: Final[dict[str, tuple[str, Callable[[os.DirEntry[str]], bool]]]] = {
    "vault": ("the vault items", lambda entry: _is_shard(entry)),
    "ledger": ("the day and goal ledgers", lambda entry: entry.name in ("days", "goals") and entry.is_dir()),
    "router": ("the router's misroute reports", lambda entry: entry.name == "misroutes.jsonl"),
    "keys": ("keys", lambda entry: False),
}


_OWN_DEPTH: Final = 2  # vault/<shard>/<item>, ledger/days/<day>.jsonl


def _is_shard(entry: os.DirEntry[str]) -> bool:
    """Whether ``entry`` is a vault shard: a directory of two hex digits holding an item."""
    if len(entry.name) != 2 or not _HEX_RE.fullmatch(entry.name) or not entry.is_dir(follow_symlinks=False):
        return False
    with contextlib.suppress(OSError), os.scandir(entry.path) as items:
        return any(len(i.name) >= _ID_LEN and i.name.startswith(entry.name) for i in items)
    return False


def _read_only(path: str) -> bool:
    """Whether ``path`` is on a file system mounted read-only."""
    try:
        return bool(os.statvfs(path).f_flag & getattr(os, "ST_RDONLY", 0))
    except (OSError, AttributeError):  # no statvfs (Windows)
        return False


def _reason(exc: OSError, where: str | os.PathLike[str] | None = None) -> str:
    """What the system said, naming the path it said it of (``h.json: Not a directory``),
    without Python's ``[Errno 20]``; not when that path is ``where``, which the message names
    already (``vault at V: V: Read-only file system``)."""
    if exc.strerror and exc.filename is not None and (where is None or os.fsdecode(exc.filename) != os.fspath(where)):
        return f"{os.fsdecode(exc.filename)}: {exc.strerror}"
    return exc.strerror or str(exc)


def holds_a_session(folder: str | os.PathLike[str]) -> bool:
    """Whether ``folder`` is a session directory of a filesystem store, by what every one holds
    once ctxrules wrote there: a lock file of its own (the session's, or its ledger's when only
    usage was recorded), beside its state, last output, ledger or vault."""
    path = Path(folder)
    return any((path / lock).is_file() for lock in _SESSION_LOCKS) and any(
        (path / name).exists() for name in (*_SESSION_FILES, "vault")
    )


def own_folder(path: str | os.PathLike[str], root: str | os.PathLike[str] | None = None) -> tuple[Path, str] | None:
    """The folder of ctxrules' own that ``path`` is or lies in, and what ctxrules keeps there;
    None for any other path. Ctxrules' own: a ``vault``, ``ledger``, ``router`` or ``keys``
    folder (in any case: a file system may ignore it) in the state root ``root`` (there or not
    yet), or one beside a session's files or an injection key, or holding what ctxrules puts
    there (vault shards, the ledgers' ``days``/``goals``). A session made there would mix its files with the items and
    ledgers of another (``--session .ctxrules/s/vault``); the path is taken as it resolves, so a
    link or ``..`` does not hide it."""
    resolved = Path(path).resolve()
    top = Path(root).resolve() if root is not None else None
    for depth, folder in enumerate((resolved, *resolved.parents)):
        kind = _OWN_FOLDERS.get(folder.name.lower())
        if kind is None:
            continue
        what, made = kind
        if depth >= 2 and folder.name.lower() == "keys":
            # keys/<tenant>/<session>: a session the litellm proxy keeps for a caller's key
            # (integrations.md), the operator's to name (usage reset, vault get, export).
            continue
        parent = folder.parent
        if parent == top:  # the state root's, made or to be made (session ids never take the name)
            return folder, what
        # Told by what is beside or in it only as deep as ctxrules' own layouts go (a vault's
        # shard and item, a ledger's days and file): a folder further up that happens to be
        # named so (a project called ``router`` beside a ``state.json`` of its own) is the user's.
        if depth > _OWN_DEPTH:
            continue
        # Beside a session's files: its vault (or ledger) whether made yet or not.
        if any((parent / mark).exists() for mark in (*_SESSION_FILES, "injection.key")):
            return folder, what
        if not folder.is_dir():
            continue
        with contextlib.suppress(OSError), os.scandir(folder) as entries:
            if any(made(entry) for entry in entries):
                return folder, what
    return None


def durable_at_commit(store: object, session: str) -> AbstractContextManager[None]:
    """:meth:`FilesystemStore.durable_at_commit` for a filesystem store; other stores write
    each item as they are told (nothing to batch)."""
    if isinstance(store, FilesystemStore):
        return store.durable_at_commit(session)
    return contextlib.nullcontext()


def for_session_dir(path: str | os.PathLike[str], state_root: str | os.PathLike[str] | None = None) -> FilesystemStore:
    """The store a session directory opened by path belongs to: ``state_root`` when given, else
    the directory's parent (where day and goal ledgers have always lived)."""
    return FilesystemStore(Path(state_root) if state_root is not None else Path(path).resolve().parent)
