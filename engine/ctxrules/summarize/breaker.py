"""A circuit breaker per summarizer model, its state persisted with the session.

``closed`` — calls go through; each failure counts, a success resets the count. After
``failures`` consecutive failures the breaker **opens**: no call for ``cooldown_s`` seconds (the
deterministic checkpoint is used instead, so a dead summarizer costs nothing per turn). After the
cool-down it is **half-open**: exactly one probe call goes through; success closes it, failure
opens it again for another cool-down.

The state is a small JSON-serializable dict kept in the stage's per-session state, so it
survives between ``prepare`` calls and processes; time is the prepare's clock (``ctx.clock``),
so tests drive it without waiting.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

__all__ = ["CLOSED", "HALF_OPEN", "OPEN", "CircuitBreaker"]

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


@dataclass
class CircuitBreaker:
    """One model's breaker over the persisted dict ``state`` (changed in place)."""

    state: MutableMapping[str, Any]
    failures: int = 3
    cooldown_s: float = 300.0

    def __post_init__(self) -> None:
        if self.state.get("state") not in (CLOSED, OPEN, HALF_OPEN):
            self.state.clear()
            self.state.update({"state": CLOSED, "failures": 0})

    @property
    def status(self) -> str:
        return str(self.state["state"])

    def retry_at(self) -> float | None:
        opened = self.state.get("opened_at")
        if self.status != OPEN or not isinstance(opened, int | float):
            return None
        return float(opened) + self.cooldown_s

    def allow(self, now: float) -> bool:
        """Whether a call may go out now; moves ``open`` to ``half_open`` once cooled down."""
        if self.status == OPEN:
            retry = self.retry_at()
            if retry is not None and now < retry:
                return False
            self.state["state"] = HALF_OPEN
        return True

    def success(self) -> None:
        self.state.clear()
        self.state.update({"state": CLOSED, "failures": 0})

    def failure(self, now: float, reason: str = "") -> None:
        count = int(self.state.get("failures", 0)) + 1
        self.state["failures"] = count
        if reason:
            self.state["last_error"] = reason[:300]
        if self.status == HALF_OPEN or count >= self.failures:
            self.state["state"] = OPEN
            self.state["opened_at"] = now

    def describe(self) -> str:
        text = f"state={self.status} failures={self.state.get('failures', 0)}"
        retry = self.retry_at()
        if retry is not None:
            text += f" retry_at={retry:.0f}"
        return text
