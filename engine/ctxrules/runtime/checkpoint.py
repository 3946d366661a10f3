"""Crash-safe checkpoints around compactions, an orphan scan, and resume.

Before a ``prepare`` that will compact (a ``compress.*``/``summarize.*`` stage's ``when:`` is met),
the session writes ``checkpoint.json`` (atomically: a killed process never leaves it torn)
holding the state it had before and the vault id of a backup of the messages the pipeline
starts from (the vault is fsynced). The checkpoint itself is not fsynced, like the session's
other files: a session at a compacting tier writes it on every turn, and it only has to outlive
the process, which it does without. A finished ``prepare`` removes it; a handled interruption
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
from ctxrules.session_store import write_atomic

CHECKPOINT_FILE = "checkpoint.json"


@dataclass(frozen=True)
class Interrupted:
    session: Path
    status: str
    pid: int | None
    started: float | None
    backup: str | None
    reason: str


def _path(session: Path) -> Path:
    return session / CHECKPOINT_FILE


def read(session: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(_path(session).read_bytes())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def begin(session: Path, *, backup: str, state: dict[str, Any], messages: int, clock: float) -> None:
    write_atomic(_path(session), json.dumps({
        "status": "running", "pid": os.getpid(), "started": clock, "written": time.time(),
        "backup": backup, "messages": messages, "state_before": state,
    }, ensure_ascii=False).encode("utf-8"), durable=False)


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


def interrupted(session: Path, reason: str) -> None:
    _set_status(session, "interrupted", reason=reason, finished=time.time())


def recovered(session: Path) -> None:
    """The session was reopened after an interrupted compaction and goes on from before it."""
    _set_status(session, "recovered", recovered=time.time())


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
    return Interrupted(session, str(status), pid if isinstance(pid, int) else None,
                       data.get("started"), data.get("backup"), reason)


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
    from ctxrules.session_store import SessionLock, SessionStore
    from ctxrules.vault import Vault

    with SessionLock(session):
        hit = check(session)
        data = read(session) or {}
        if hit is None and data.get("status") == "recovered":
            # Reopening the session already went on from the state before the cut; the
            # backup of what that compaction started from can still be had.
            hit = Interrupted(session, "recovered", data.get("pid"), data.get("started"), data.get("backup"),
                              "recovered")
        if hit is None:
            raise CtxrulesError(f"{session}: no interrupted compaction to resume")
        if not hit.backup:
            raise CtxrulesError(f"{session}: the checkpoint has no backup of the messages")
        messages = json.loads(Vault.for_session(session).get_text(hit.backup))
        state = data.get("state_before")
        store = SessionStore(session)
        if isinstance(state, dict):
            write_atomic(store.state_file, json.dumps(state, ensure_ascii=False, sort_keys=True).encode("utf-8"))
        _set_status(session, "resumed", resumed=time.time())
    if not isinstance(messages, list):
        raise CtxrulesError(f"{session}: the checkpoint backup is not a message list")
    return messages
