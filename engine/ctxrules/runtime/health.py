"""Context health for a UI: green / yellow / red, and a fork suggestion at ≥ 75 % utilization.

- red: the output does not fit the usable window, or utilization after the pipeline is still at
  the emergency tier, or a summarizer circuit breaker is open;
- yellow: utilization after the pipeline reached the ``light`` tier, or a stage failed;
- green otherwise.
"""

from __future__ import annotations

from typing import Any

FORK_AT = 0.75


def open_breakers(stage_states: Any) -> list[str]:
    """``stage/model`` of every summarizer breaker the session state holds open. The breaker
    stays open between turns whether or not a summary stage runs, so health reads the state,
    not this turn's actions."""
    found: list[str] = []
    if not isinstance(stage_states, dict):
        return found
    for stage_id, st in sorted(stage_states.items()):
        breakers = st.get("breakers") if isinstance(st, dict) else None
        if isinstance(breakers, dict):
            found.extend(
                f"{stage_id}/{model}"
                for model, b in sorted(breakers.items())
                if isinstance(b, dict) and b.get("state") == "open"
            )
    return found


def health(report: dict[str, Any], *, breakers: list[str] | None = None) -> dict[str, Any]:
    """``breakers``: the open breakers (:func:`open_breakers` of the saved stage states)."""
    after = report["after"]
    # The summary stage also reports each model's breaker as an action "breaker"
    # ("MODEL: state=open failures=2 retry_at=..."), for callers that pass no state.
    acted = any(
        a.get("kind") == "breaker" and "state=open" in str(a.get("detail", "")).split()
        for st in report["stages"]
        for a in st["actions"]
    )
    breaker = "open" if acted or breakers else None
    failed = [s["id"] for s in report["stages"] if s.get("error")]
    red: list[str] = []
    if not after.get("fits", True):
        red.append("the output does not fit the usable window")
    if after["tier"] == "emergency":
        red.append("utilization is at the emergency tier after the pipeline")
    if breaker == "open":
        which = f" ({', '.join(breakers)})" if breakers else ""
        red.append(f"the summarizer's circuit breaker is open{which}")
    yellow: list[str] = []
    if after["tier"] in ("light", "full"):
        yellow.append(f"utilization is at the {after['tier']} tier")
    if failed:
        yellow.append("stages failed: " + ", ".join(failed))
    state = "red" if red else "yellow" if yellow else "green"
    util = float(after["utilization"])
    out: dict[str, Any] = {
        "state": state,
        "utilization": util,
        "reasons": red + yellow,
        "fork_suggested": util >= FORK_AT,
    }
    if out["fork_suggested"]:
        out["fork_hint"] = (
            f"utilization is {util:.0%} after the pipeline: consider forking the session "
            "(start a new one from a summary or a handover)"
        )
    return out
