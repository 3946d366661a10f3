"""Continuation guards: should an autonomous agent loop take another step?

Declared in the pack under ``guards.continuation`` and evaluated by
``session.should_continue(state)``; every check that applies must pass:

- ``cancellation``: ``state["cancel"]`` is set (a ``threading.Event``/``asyncio.Event``, an
  object with a true ``cancelled`` attribute or ``is_set()``, or simply ``True``);
- ``budget``: the session's ledger is below EXCEEDED (``session.should_continue`` reads the
  level from the ledger; the check reports it: ``ok``, ``warning``, ``finalization``, or
  ``stop`` at EXCEEDED), and ``state["budget_ok"]`` is not False (a caller's own budget);
- ``convergence``: the newest ``max_identical_errors`` tool results are the same error (the
  agent is looping on one failure);
- ``drift``: every ``drift_every_steps`` steps, ``state["drift_check"](messages)`` is called;
  a false or a string result stops the loop (the string is the reason);
- ``protected_files``: files whose content must not change during the run; their digests are
  taken the first time the guard runs and compared after that.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxrules.budget.policy import Level
from ctxrules.budget.status import BudgetStatus
from ctxrules.errors import MessagesError, UsageError
from ctxrules.messages import message_text
from ctxrules.structure import steps

_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
DEFAULTS: dict[str, Any] = {"max_identical_errors": 3, "drift_every_steps": 0, "protected_files": []}


@dataclass
class Decision:
    proceed: bool
    reason: str | None = None
    checks: dict[str, str] = field(default_factory=dict)
    budget: dict[str, Any] | None = None
    """The ledger's budget status when the session has one (``BudgetStatus.as_dict()``)."""

    def __bool__(self) -> bool:
        return self.proceed


def _cancelled(token: Any) -> bool:
    if token is None or token is False:
        return False
    if token is True:
        return True
    is_set = getattr(token, "is_set", None)
    if callable(is_set):
        return bool(is_set())
    return bool(getattr(token, "cancelled", False))


def _file_digest(path: Path) -> str:
    """The file's sha256, read in blocks (a large file is never held whole). What is not a
    regular file is not read — a FIFO would hold the agent's loop until some process writes to
    it, a device never ends —: its kind stands for its content, so putting a file in its place
    is still a change."""
    try:
        fd = os.open(path, os.O_RDONLY | _NONBLOCK)  # (opening a FIFO would wait for a writer)
    except OSError as exc:
        return f"unreadable:{exc.strerror}"
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            return f"not a regular file:{stat.S_IFMT(mode):o}"
        if _NONBLOCK:
            os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError as exc:
        return f"unreadable:{exc.strerror}"
    finally:
        os.close(fd)


def _messages(state: object) -> Sequence[dict[str, Any]]:
    """``state["messages"]``, checked: a state that is not a dict, or messages that are not a
    list of message objects, raised AttributeError or TypeError from inside the checks."""
    if not isinstance(state, Mapping):
        raise UsageError(f"should_continue() takes the loop's state as a dict, not {type(state).__name__}")
    messages = state.get("messages") or []
    if not isinstance(messages, list | tuple):
        raise MessagesError(f"state['messages'] must be a list of messages, not {type(messages).__name__}")
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise MessagesError(f"state['messages'][{index}]: expected a message object, got {type(message).__name__}")
    return messages


def evaluate(
    config: dict[str, Any],
    state: dict[str, Any],
    memory: dict[str, Any],
    *,
    is_error: Callable[[str], bool],
    budget: BudgetStatus | None = None,
) -> Decision:
    """Run every applicable check. ``memory`` persists between calls (file digests);
    ``budget`` is the session ledger's status."""
    cfg = {**DEFAULTS, **(config or {})}
    messages = _messages(state)
    checks: dict[str, str] = {}
    stop: str | None = None

    def fail(name: str, reason: str) -> None:
        nonlocal stop
        checks[name] = "stop"
        stop = stop or reason

    if _cancelled(state.get("cancel")):
        fail("cancellation", "the run was cancelled")
    else:
        checks["cancellation"] = "ok"
    if state.get("budget_ok") is False:
        fail("budget", str(state.get("budget_reason") or "the budget is used up"))
    elif budget is not None and budget.level >= Level.EXCEEDED:
        fail("budget", budget.refusal())
    else:
        checks["budget"] = budget.level.label if budget is not None else "ok"
    n = int(cfg["max_identical_errors"] or 0)
    results = [message_text(m) for m in messages if m.get("role") == "tool"]
    if n > 1 and len(results) >= n:
        tail = results[-n:]
        if len(set(tail)) == 1 and is_error(tail[0]):
            fail("convergence", f"the last {n} tool results are the same error: {tail[0][:120]!r}")
        else:
            checks["convergence"] = "ok"
    every = int(cfg["drift_every_steps"] or 0)
    check = state.get("drift_check")
    if every > 0 and callable(check):
        count = len(steps(messages))
        if count and count % every == 0 and memory.get("drift_checked_at") != count:
            memory["drift_checked_at"] = count
            verdict = check(messages)
            if verdict is False or isinstance(verdict, str):
                fail("drift", verdict if isinstance(verdict, str) else f"drift check failed at step {count}")
            else:
                checks["drift"] = "ok"
    files = [str(f) for f in cfg.get("protected_files") or []]
    if files:
        base = Path(state.get("cwd") or ".")
        seen = memory.setdefault("protected", {})
        changed = []
        for f in files:
            digest = _file_digest(base / f)
            if f not in seen:
                seen[f] = digest
            elif seen[f] != digest:
                changed.append(f)
        if changed:
            fail("protected_files", "protected files changed: " + ", ".join(changed))
        else:
            checks["protected_files"] = "ok"
    return Decision(stop is None, stop, checks, None if budget is None else budget.as_dict())
