"""Context health for a UI: green / yellow / red, and a fork suggestion at ≥ 75 % utilization.

- red: the output does not fit the usable window, or utilization after the pipeline is still at
  the emergency tier, or a summarizer circuit breaker is open;
- yellow: utilization after the pipeline reached the ``light`` tier, or a stage failed;
- green otherwise.
"""

from __future__ import annotations

from typing import Any

FORK_AT = 0.75


def health(report: dict[str, Any]) -> dict[str, Any]:
    after = report["after"]
    # The summary stage reports each model's breaker as an action "breaker" ("MODEL: STATE").
    breaker = "open" if any(a.get("kind") == "breaker" and str(a.get("detail", "")).endswith(": open")
                            for st in report["stages"] for a in st["actions"]) else None
    failed = [s["id"] for s in report["stages"] if s.get("error")]
    red: list[str] = []
    if not after.get("fits", True):
        red.append("the output does not fit the usable window")
    if after["tier"] == "emergency":
        red.append("utilization is at the emergency tier after the pipeline")
    if breaker == "open":
        red.append("the summarizer's circuit breaker is open")
    yellow: list[str] = []
    if after["tier"] in ("light", "full"):
        yellow.append(f"utilization is at the {after['tier']} tier")
    if failed:
        yellow.append("stages failed: " + ", ".join(failed))
    state = "red" if red else "yellow" if yellow else "green"
    util = float(after["utilization"])
    out: dict[str, Any] = {"state": state, "utilization": util, "reasons": red + yellow,
                           "fork_suggested": util >= FORK_AT}
    if out["fork_suggested"]:
        out["fork_hint"] = (f"utilization is {util:.0%} after the pipeline: consider forking the session "
                            "(start a new one from a summary or a handover)")
    return out
