"""The budget's part in ``Session.prepare``: check the level before any stage, scale the
thresholds in eco mode, add the notice and the report's ``budget_status`` afterwards.

Kept here so that the session code calls three functions and the budget rules stay in one
package (docs/budgets.md "What happens at each level").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctxrules.budget.notices import append_notice, budget_notice
from ctxrules.budget.policy import BudgetPolicy
from ctxrules.budget.tracker import BudgetStatus, SessionLedger
from ctxrules.stores.filesystem import FilesystemStore

if TYPE_CHECKING:
    from ctxrules.pipeline.budget import Budget
    from ctxrules.stores.base import Store

__all__ = ["finish_prepare", "open_ledger", "start_prepare"]

_STATE_KEY = "budget"


def open_ledger(
    pack: Mapping[str, Any],
    session_dir: Path,
    session_id: str,
    model: str,
    *,
    goal: str | None = None,
    state_root: str | Path | None = None,
    store: Store | None = None,
    session: str | None = None,
) -> SessionLedger:
    """The ledger of a session under ``pack``'s ``budgets:`` policy; with ``store`` the session
    ``session`` of that store (else the session directory, as before)."""
    if store is not None and not isinstance(store, FilesystemStore):
        return SessionLedger(
            None, session_id, store=store, session=session, policy=BudgetPolicy.from_pack(pack), goal=goal, model=model
        )
    return SessionLedger(
        session_dir,
        session_id,
        state_root=None if state_root is None else Path(state_root),
        policy=BudgetPolicy.from_pack(pack),
        goal=goal,
        model=model,
    )


def start_prepare(
    ledger: SessionLedger, budget: Budget, state: dict[str, Any], clock: float
) -> tuple[BudgetStatus, Budget]:
    """Before any stage runs: the status (raises ``BudgetExceeded`` when the level refuses
    calls) and the Budget the pipeline uses (eco mode: thresholds scaled)."""
    saved = state.get(_STATE_KEY)
    turn_from = saved.get("turn_from") if isinstance(saved, dict) else None
    status = ledger.check(clock, turn_from=turn_from if isinstance(turn_from, int) else None)
    if status.eco:
        budget = dataclasses.replace(budget, thresholds=status.scaled_thresholds(budget.thresholds))
    state[_STATE_KEY] = {"turn_from": status.own_calls}
    return status, budget


def finish_prepare(
    status: BudgetStatus, messages: list[dict[str, Any]], report: dict[str, Any]
) -> list[dict[str, Any]]:
    """Sets ``report['budget_status']``; returns the messages with the level's notice last."""
    report["budget_status"] = status.report_dict()
    text = status.notice()
    if text is None:
        return messages
    return append_notice(messages, budget_notice(text, status.level.label))
