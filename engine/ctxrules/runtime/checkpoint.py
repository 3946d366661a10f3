"""Crash-safe checkpoints around compactions, an orphan scan, and resume.

Before a ``prepare`` that will compact (a ``compress.*``/``summarize.*`` stage's ``when:`` is met),
the session writes ``checkpoint.json`` (atomically: a killed process never leaves it torn)
holding the state it had before and the vault id of a backup of the messages the pipeline
starts from (the vault is fsynced). On a warm turn the backup holds only the appended messages:
the rest are the first ``prefix`` lines of ``last_output.jsonl``, which the session does not
write while the checkpoint exists; :func:`interrupted` and :func:`recovered` make it whole.
The checkpoint itself is not fsynced, like the session's other files: a session at a compacting
tier writes it on every turn, and it only has to outlive the process, which it does without.
A finished ``prepare`` removes it (before it saves); a handled interruption
(an exception, SIGTERM in the CLI) marks it ``interrupted``. A process killed outright leaves it
``running`` with a pid that is gone.

:func:`scan` finds interrupted sessions under a state root; :func:`resume` puts a session back
into the state it had before the interrupted compaction and returns the backed-up messages.
``state.json`` is written only after a run, so an interrupted compaction never reaches it; the
checkpoint is what lets a caller know a compaction was cut short and restore from before it.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctxrules.errors import CtxrulesError
from ctxrules.json_stream import write_json_list
from ctxrules.stores import store_and_session
from ctxrules.stores.base import StoreUsageError
from ctxrules.stores.staging import is_staging
from ctxrules.vault import Vault

if TYPE_CHECKING:
    from collections.abc import Callable

    from ctxrules.stores.base import Store

CHECKPOINT_FILE = "checkpoint.json"


@dataclass(frozen=True)
class Interrupted:
    session: Path | str
    """The session directory (filesystem store) or the session's key in its store."""
    status: str
    pid: int | None
    started: float | None
    backup: str | None
    reason: str
    prefix: int = 0
    """When not 0: the backup holds the messages after the first ``prefix`` lines of
    ``last_output.jsonl`` (the last output, which the compaction started from)."""


def _where(session: Path | str, store: Store | None) -> tuple[Store, str]:
    if store is not None:
        return store, str(session)
    return store_and_session(Path(session), None, None)


def put_backup(vault: Vault, messages: list[Any]) -> str:
    """Store ``messages`` as ``vault.put_text(json.dumps(messages, ensure_ascii=False))`` does
    (the same bytes, the same id), written in pieces: a 50 MB tool result is never held as the
    whole list's text and its UTF-8 copy (:mod:`ctxrules.json_stream`). Within a prepare each
    message's text is kept for the other writes of the same message (``serialise_once``)."""
    writer = vault.open_writer()
    try:
        write_json_list(writer.write, messages)
        return writer.commit()
    finally:
        writer.discard()


def read(session: Path | str, *, store: Store | None = None) -> dict[str, Any] | None:
    st, key = _where(session, store)
    try:
        raw = st.read_doc(key, "checkpoint")
        data = json.loads(raw) if raw is not None else None
    except (OSError, ValueError, RecursionError, CtxrulesError):
        return None
    return data if isinstance(data, dict) else None


def _write(st: Store, key: str, data: dict[str, Any]) -> None:
    st.write_doc(key, "checkpoint", json.dumps(data, ensure_ascii=False).encode("utf-8"))


def begin(
    session: Path | str,
    *,
    backup: str,
    state: dict[str, Any],
    messages: int,
    clock: float,
    prefix: int = 0,
    store: Store | None = None,
) -> None:
    """``backup``: the vault id of the messages the compaction starts from, after the first
    ``prefix`` lines of ``last_output.jsonl`` (which the session does not write again before
    :func:`complete`)."""
    st, key = _where(session, store)
    _write(
        st,
        key,
        {
            "status": "running",
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": clock,
            "written": time.time(),
            "backup": backup,
            "prefix": prefix,
            "messages": messages,
            "state_before": state,
        },
    )


def _set_status(st: Store, key: str, status: str, **extra: Any) -> None:
    data = read(key, store=st)
    if data is None:
        return
    data.update(status=status, **extra)
    _write(st, key, data)


def complete(session: Path | str, *, store: Store | None = None) -> None:
    """The compaction finished: nothing is left to resume, so the checkpoint goes (cheaper than
    rewriting it, on every turn of a session that stays at a compacting tier)."""
    st, key = _where(session, store)
    st.write_doc(key, "checkpoint", None)


def interrupted(session: Path | str, reason: str, *, backup: str | None = None, store: Store | None = None) -> None:
    """A handled interruption; ``backup`` (the whole input) replaces a backup that needs
    ``last_output.jsonl``, which the still running session may write again."""
    st, key = _where(session, store)
    extra: dict[str, Any] = {"backup": backup, "prefix": 0} if backup else {}
    _set_status(st, key, "interrupted", reason=reason, finished=time.time(), **extra)


def recovered(session: Path | str, *, store: Store | None = None) -> str | None:
    """The session was reopened after an interrupted compaction and goes on from before it.
    A backup that needs ``last_output.jsonl`` is made whole first (the reopened session will
    write that file). Returns the vault id of the backup of the whole input (None: lost)."""
    st, key = _where(session, store)
    data = read(key, store=st) or {}
    if _prefix(data):
        try:
            messages = _backed_up(st, key, data)
            full: str | None = Vault.of(st, key).put_text(json.dumps(messages, ensure_ascii=False))
        except (CtxrulesError, OSError, ValueError) as exc:
            _set_status(st, key, "recovered", recovered=time.time(), backup_lost=str(exc))
            return None
        _set_status(st, key, "recovered", recovered=time.time(), backup=full, prefix=0)
        return full
    _set_status(st, key, "recovered", recovered=time.time())
    backup = data.get("backup")
    return str(backup) if backup else None


def _prefix(data: dict[str, Any]) -> int:
    prefix = data.get("prefix")
    # (a damaged `"prefix": true` is no count: it was shown as "the first True messages")
    return prefix if isinstance(prefix, int) and not isinstance(prefix, bool) and prefix > 0 else 0


def _backed_up(st: Store, key: str, data: dict[str, Any]) -> list[Any]:
    """The messages the interrupted compaction started from: the first ``prefix`` lines of
    ``last_output.jsonl`` (checked against the state saved with them) and the backup."""
    where = st.describe(key)
    backup = data.get("backup")
    if not backup:
        raise CtxrulesError(f"{where}: the checkpoint has no backup of the messages")
    try:
        tail = json.loads(Vault.of(st, key).get_text(str(backup)))
    except ValueError as exc:
        raise CtxrulesError(f"{where}: the checkpoint backup is not JSON: {exc}") from exc
    if not isinstance(tail, list):
        raise CtxrulesError(f"{where}: the checkpoint backup is not a message list")
    prefix = _prefix(data)
    if not prefix:
        return tail
    turn = st.load_turn(key)
    if turn.output is None:
        # Missing, damaged, or no longer the one the saved state names (state.json damaged).
        raise CtxrulesError(
            f"{where}: the checkpoint's backup starts after the first {prefix} messages of "
            "last_output.jsonl, and that file (or the state saved with it) cannot be read"
        )
    if len(turn.output) < prefix:
        raise CtxrulesError(
            f"{where}: the checkpoint's backup starts after the first {prefix} messages of "
            "last_output.jsonl, and that file no longer holds them"
        )
    head = turn.output[:prefix]
    return [*head, *tail]


def _alive(pid: int) -> bool:
    # A pid no process can have (0 and -1 would ask about a process group, or every process;
    # one past a C long cannot be asked about) is a damaged checkpoint's: its writer is gone.
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True
    return True


def _writer_gone(st: Store, key: str, data: dict[str, Any], *, locked: bool = False) -> str | None:
    """Why the process that wrote a ``running`` checkpoint is gone (None: it may be running).
    On this host its pid tells; a checkpoint from another host (a shared store) counts as cut
    short when the session's prepare lock is free: a running compaction holds it. ``locked``:
    the caller holds that lock (then no compaction of the session is running)."""
    pid, host = data.get("pid"), data.get("host")
    if host is None or host == socket.gethostname():
        if isinstance(pid, int) and not _alive(pid):
            return f"process {pid} ended during a compaction"
        return None
    if not locked:
        try:
            with st.prepare_lock(key, timeout=0):
                pass
        except CtxrulesError:
            return None
    return f"process {pid} on {host} ended during a compaction (the session's lock is free)"


def check(session: Path | str, *, store: Store | None = None, locked: bool = False) -> Interrupted | None:
    """The session's interrupted compaction, if it has one. ``locked``: the caller holds the
    session's prepare lock (:func:`resume`): taking it again to ask whether a writer on another
    host still runs would find it held, by the caller itself."""
    st, key = _where(session, store)
    data = read(key, store=st)
    if not data:
        return None
    status, pid = data.get("status"), data.get("pid")
    if status == "interrupted":
        reason = str(data.get("reason") or "interrupted")
    elif status == "running" and (gone := _writer_gone(st, key, data, locked=locked)) is not None:
        reason = gone
    else:
        return None
    return Interrupted(
        session if store is None else key,
        str(status),
        pid if isinstance(pid, int) else None,
        data.get("started"),
        data.get("backup"),
        reason,
        _prefix(data),
    )


def scan(state_root: Path | Store) -> list[Interrupted]:
    """Every session under ``state_root`` (a directory, or every session of a store) whose last
    compaction was cut short."""
    if isinstance(state_root, str | os.PathLike):
        root = Path(state_root)
        if not root.is_dir():
            return []
        found = []
        for cp in sorted(root.glob(f"**/{CHECKPOINT_FILE}")):
            if any(is_staging(part) for part in cp.relative_to(root).parts[:-1]):
                continue  # an import's, not yet a session (ctxrules.stores.staging)
            hit = check(cp.parent)
            if hit is not None:
                found.append(hit)
        return found
    store = state_root
    return [hit for key in store.sessions() if (hit := check(key, store=store)) is not None]


def resume(
    session: Path | str,
    *,
    store: Store | None = None,
    deliver: Callable[[list[dict[str, Any]]], None] | None = None,
) -> list[dict[str, Any]]:
    """Restore the state from before the interrupted compaction; return the backed-up messages.
    ``deliver`` (the CLI's write of them) runs before anything is restored: when it raises, the
    checkpoint stays interrupted and a retry finds it."""
    st, key = _where(session, store)
    if not st.exists(key):  # before the lock, which would make the session (and its folders)
        raise StoreUsageError("CR147", f"no session {st.describe(key)} to resume")
    with st.prepare_lock(key):
        hit = check(key, store=st, locked=True)
        data = read(key, store=st) or {}
        where = st.describe(key)
        if hit is None and data.get("status") == "recovered":
            # Reopening the session already went on from the state before the cut; the
            # backup of what that compaction started from can still be had.
            hit = Interrupted(key, "recovered", data.get("pid"), data.get("started"), data.get("backup"), "recovered")
        if hit is None:
            raise CtxrulesError(f"{where}: no interrupted compaction to resume")
        messages = _backed_up(st, key, data)  # before the state is put back
        if deliver is not None:
            deliver(messages)
        state = data.get("state_before")
        if isinstance(state, dict):
            st.save_state(key, state)
        _set_status(st, key, "resumed", resumed=time.time())
    return messages
