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

import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctxrules.errors import CtxrulesError
from ctxrules.json_stream import write_json
from ctxrules.private_files import read_private, write_atomic
from ctxrules.session_store import SessionLock, SessionStore
from ctxrules.vault import Vault

CHECKPOINT_FILE = "checkpoint.json"


@dataclass(frozen=True)
class Interrupted:
    session: Path
    status: str
    pid: int | None
    started: float | None
    backup: str | None
    reason: str
    prefix: int = 0
    """When not 0: the backup holds the messages after the first ``prefix`` lines of
    ``last_output.jsonl`` (the last output, which the compaction started from)."""


def put_backup(vault: Vault, messages: list[Any]) -> str:
    """Store ``messages`` as ``vault.put_text(json.dumps(messages, ensure_ascii=False))`` does
    (the same bytes, the same id), written in pieces: a 50 MB tool result is never held as the
    whole list's text and its UTF-8 copy (:mod:`ctxrules.json_stream`)."""
    writer = vault.open_writer()
    try:
        write_json(writer.write, messages)
        return writer.commit()
    finally:
        writer.discard()


def _path(session: Path) -> Path:
    return session / CHECKPOINT_FILE


def read(session: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(read_private(_path(session)))
    except (OSError, ValueError, RecursionError, CtxrulesError):
        return None
    return data if isinstance(data, dict) else None


def begin(session: Path, *, backup: str, state: dict[str, Any], messages: int, clock: float, prefix: int = 0) -> None:
    """``backup``: the vault id of the messages the compaction starts from, after the first
    ``prefix`` lines of ``last_output.jsonl`` (which the session does not write again before
    :func:`complete`)."""
    write_atomic(
        _path(session),
        json.dumps(
            {
                "status": "running",
                "pid": os.getpid(),
                "started": clock,
                "written": time.time(),
                "backup": backup,
                "prefix": prefix,
                "messages": messages,
                "state_before": state,
            },
            ensure_ascii=False,
        ).encode("utf-8"),
        durable=False,
    )


def _set_status(session: Path, status: str, **extra: Any) -> None:
    data = read(session)
    if data is None:
        return
    data.update(status=status, **extra)
    write_atomic(_path(session), json.dumps(data, ensure_ascii=False).encode("utf-8"), durable=False)


def complete(session: Path) -> None:
    """The compaction finished: nothing is left to resume, so the checkpoint goes (cheaper than
    rewriting it, on every turn of a session that stays at a compacting tier)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_path(session))


def interrupted(session: Path, reason: str, *, backup: str | None = None) -> None:
    """A handled interruption; ``backup`` (the whole input) replaces a backup that needs
    ``last_output.jsonl``, which the still running session may write again."""
    extra: dict[str, Any] = {"backup": backup, "prefix": 0} if backup else {}
    _set_status(session, "interrupted", reason=reason, finished=time.time(), **extra)


def recovered(session: Path) -> str | None:
    """The session was reopened after an interrupted compaction and goes on from before it.
    A backup that needs ``last_output.jsonl`` is made whole first (the reopened session will
    write that file). Returns the vault id of the backup of the whole input (None: lost)."""
    data = read(session) or {}
    if _prefix(data):
        try:
            messages = _backed_up(session, data)
            full: str | None = Vault.for_session(session).put_text(json.dumps(messages, ensure_ascii=False))
        except (CtxrulesError, OSError, ValueError) as exc:
            _set_status(session, "recovered", recovered=time.time(), backup_lost=str(exc))
            return None
        _set_status(session, "recovered", recovered=time.time(), backup=full, prefix=0)
        return full
    _set_status(session, "recovered", recovered=time.time())
    backup = data.get("backup")
    return str(backup) if backup else None


def _prefix(data: dict[str, Any]) -> int:
    prefix = data.get("prefix")
    return prefix if isinstance(prefix, int) and prefix > 0 else 0


def _backed_up(session: Path, data: dict[str, Any]) -> list[Any]:
    """The messages the interrupted compaction started from: the first ``prefix`` lines of
    ``last_output.jsonl`` (checked against the state saved with them) and the backup."""
    backup = data.get("backup")
    if not backup:
        raise CtxrulesError(f"{session}: the checkpoint has no backup of the messages")
    try:
        tail = json.loads(Vault.for_session(session).get_text(str(backup)))
    except ValueError as exc:
        raise CtxrulesError(f"{session}: the checkpoint backup is not JSON: {exc}") from exc
    if not isinstance(tail, list):
        raise CtxrulesError(f"{session}: the checkpoint backup is not a message list")
    prefix = _prefix(data)
    if not prefix:
        return tail
    store = SessionStore(session)
    record = store.load().get("last") or {}
    head = store.load_output(prefix, record.get("output_file"), record.get("output_digest"))
    if head is None:
        raise CtxrulesError(
            f"{session}: the checkpoint's backup starts after the first {prefix} messages of "
            "last_output.jsonl, and that file no longer holds them"
        )
    return [*head, *tail]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def check(session: Path) -> Interrupted | None:
    """The session's interrupted compaction, if it has one."""
    data = read(session)
    if not data:
        return None
    status, pid = data.get("status"), data.get("pid")
    if status == "interrupted":
        reason = str(data.get("reason") or "interrupted")
    elif status == "running" and isinstance(pid, int) and not _alive(pid):
        reason = f"process {pid} ended during a compaction"
    else:
        return None
    return Interrupted(
        session,
        str(status),
        pid if isinstance(pid, int) else None,
        data.get("started"),
        data.get("backup"),
        reason,
        _prefix(data),
    )


def scan(state_root: Path) -> list[Interrupted]:
    """Every session under ``state_root`` whose last compaction was cut short."""
    if not state_root.is_dir():
        return []
    found = []
    for cp in sorted(state_root.glob(f"**/{CHECKPOINT_FILE}")):
        hit = check(cp.parent)
        if hit is not None:
            found.append(hit)
    return found


def resume(session: Path) -> list[dict[str, Any]]:
    """Restore the state from before the interrupted compaction; return the backed-up messages."""
    with SessionLock(session):
        hit = check(session)
        data = read(session) or {}
        if hit is None and data.get("status") == "recovered":
            # Reopening the session already went on from the state before the cut; the
            # backup of what that compaction started from can still be had.
            hit = Interrupted(
                session, "recovered", data.get("pid"), data.get("started"), data.get("backup"), "recovered"
            )
        if hit is None:
            raise CtxrulesError(f"{session}: no interrupted compaction to resume")
        messages = _backed_up(session, data)  # before state.json is put back
        state = data.get("state_before")
        store = SessionStore(session)
        if isinstance(state, dict):
            write_atomic(store.state_file, json.dumps(state, ensure_ascii=False, sort_keys=True).encode("utf-8"))
        _set_status(session, "resumed", resumed=time.time())
    return messages
