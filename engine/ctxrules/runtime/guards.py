"""Gateway and preflight guards: refuse a request before spending anything on it.

- The **gateway guard** (``guards.max_request_tokens`` in the pack) rejects a request whose
  prompt (messages and tool schemas) is larger than the limit before any stage runs.
- The **preflight guard** estimates a request against the model's window. The pipeline can
  shrink everything but the pinned messages and the tool schemas, so when those alone (plus
  ``reserve_output``) exceed the window, no compaction can make the call fit: refuse with the
  numbers instead of spending an API call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ctxrules.errors import CtxrulesError
from ctxrules.structure import pinned_indices
from ctxrules.tokens import REPLY_PRIMING_TOKENS

if TYPE_CHECKING:
    from ctxrules.pipeline.budget import Budget
    from ctxrules.tokens import TokenCounter


class RequestRejected(CtxrulesError):
    """A guard refused the request; the message carries the numbers."""

    exit_code = 1

    def __init__(self, message: str, *, tokens: int, limit: int) -> None:
        super().__init__(message)
        self.tokens = tokens
        self.limit = limit


def gateway_limit(pack: dict[str, Any]) -> int | None:
    guards = pack.get("guards") or {}
    limit = guards.get("max_request_tokens") if isinstance(guards, dict) else None
    return limit if isinstance(limit, int) and not isinstance(limit, bool) else None


def check_gateway(pack: dict[str, Any], tokens: int) -> None:
    limit = gateway_limit(pack)
    if limit is not None and tokens > limit:
        raise RequestRejected(
            f"request rejected by the gateway guard: {tokens} prompt tokens > guards.max_request_tokens {limit}",
            tokens=tokens,
            limit=limit,
        )


@dataclass(frozen=True)
class Preflight:
    """The estimate behind a preflight decision (all in tokens)."""

    request_tokens: int
    pinned_tokens: int
    tools_tokens: int
    reserve_output: int
    window: int
    fits_now: bool
    can_fit: bool

    @property
    def usable(self) -> int:
        return self.window - self.reserve_output

    def as_dict(self) -> dict[str, Any]:
        return {
            "request_tokens": self.request_tokens,
            "pinned_tokens": self.pinned_tokens,
            "tools_tokens": self.tools_tokens,
            "reserve_output": self.reserve_output,
            "window": self.window,
            "usable_window": self.usable,
            "fits_now": self.fits_now,
            "can_fit": self.can_fit,
        }


def preflight(
    messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]], *, counter: TokenCounter, budget: Budget
) -> Preflight:
    has_system = any(m.get("role") == "system" for m in messages)
    per = counter.count_each(messages)
    tools_tokens = counter.count_tools(list(tools), has_system_message=has_system)
    request = sum(per) + REPLY_PRIMING_TOKENS + tools_tokens
    pinned = sum(per[i] for i in pinned_indices(messages)) + REPLY_PRIMING_TOKENS + tools_tokens
    return Preflight(
        request,
        pinned,
        tools_tokens,
        budget.reserve_output,
        budget.window,
        fits_now=budget.fits(request),
        can_fit=budget.fits(pinned),
    )


def refuse_unless_fits(check: Preflight, model: str) -> None:
    if not check.can_fit:
        raise RequestRejected(
            f"preflight: this request cannot fit {model}'s window even after compaction: the pinned "
            f"messages and tool schemas alone are {check.pinned_tokens} tokens, the usable window is "
            f"{check.usable} ({check.window} - reserve_output {check.reserve_output})",
            tokens=check.pinned_tokens,
            limit=check.usable,
        )
