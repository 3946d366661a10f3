"""Window, usable window, utilization and tiers (docs/reference/concepts.md "Vocabulary").

- window: ``--window``/``window=`` if given, else the pack's ``context.window`` when it is a
  number, else the registry's ``max_input_tokens`` (else ``max_tokens``).
- usable window = window - reserve_output; a usage error when ≤ 0.
- utilization = prompt tokens (messages and tool schemas) / usable window. For tokenizers whose
  counts are estimates, the count is raised by the safety margin first, so an estimate errs on
  the side of compacting.
- tier: the highest threshold utilization reaches (``below`` when none).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ctxrules.errors import UsageError
from ctxrules.packs.defaults import context_defaults
from ctxrules.printable import shown_int
from ctxrules.types import THRESHOLD_NAMES

# The defaults of context: are declared once, in the pack schema (schemas/rulepack.v1.schema.json).
_DEFAULTS = context_defaults()
DEFAULT_THRESHOLDS: dict[str, float] = {name: float(_DEFAULTS["thresholds"][name]) for name in THRESHOLD_NAMES}
DEFAULT_RESERVE: int = int(_DEFAULTS["reserve_output"])
DEFAULT_TAIL: float = float(_DEFAULTS["tail_budget"])


@dataclass(frozen=True)
class Budget:
    window: int
    reserve_output: int
    thresholds: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_THRESHOLDS))
    tail_budget: float = DEFAULT_TAIL
    safety_margin: float = 0.0
    window_source: str = "registry"

    @property
    def usable(self) -> int:
        return self.window - self.reserve_output

    def effective(self, tokens: int) -> int:
        """``tokens`` raised by the safety margin (estimates only)."""
        return math.ceil(tokens * (1 + self.safety_margin))

    def utilization(self, tokens: int) -> float:
        usable = self.usable
        return self.effective(tokens) / usable if usable > 0 else math.inf

    def tier(self, tokens: int) -> str:
        return self.tier_of(self.utilization(tokens))

    def tier_of(self, utilization: float) -> str:
        reached = "below"
        for name in THRESHOLD_NAMES:
            if utilization >= self.thresholds[name]:
                reached = name
        return reached

    def tokens_at(self, tier: str) -> int:
        """The largest prompt size (raw tokens) that stays *below* ``tier``."""
        if tier == "below":
            return 0
        limit = self.thresholds[tier] * self.usable / (1 + self.safety_margin)
        return max(0, math.ceil(limit) - 1)

    @property
    def tail_tokens(self) -> int:
        return int(self.tail_budget * self.usable)

    def fits(self, tokens: int) -> bool:
        return self.effective(tokens) <= self.usable

    def as_dict(self) -> dict[str, Any]:
        return {
            "window": self.window,
            "window_source": self.window_source,
            "reserve_output": self.reserve_output,
            "usable_window": self.usable,
            "thresholds": dict(self.thresholds),
            "tail_budget": self.tail_budget,
            "safety_margin": self.safety_margin,
        }


def make_budget(
    context: dict[str, Any], *, registry_window: int | None, override: int | None, safety_margin: float, model: str
) -> Budget:
    """Build the budget from the effective ``context:`` (pack merged with the model entry)."""
    pack_window = context.get("window", _DEFAULTS["window"])
    if override is not None:
        window, source = override, "override"
    elif isinstance(pack_window, int) and not isinstance(pack_window, bool):
        window, source = pack_window, "pack"
    elif registry_window:
        window, source = registry_window, "registry"
    else:
        raise UsageError(f"no window known for model '{model}': give --window N or context.window in the pack")
    if window <= 0:
        raise UsageError(f"window must be positive, got {window}")
    reserve = int(context.get("reserve_output", DEFAULT_RESERVE))
    if window - reserve <= 0:
        raise UsageError(
            f"reserve_output ({shown_int(reserve)}) leaves no usable window of {shown_int(window)} tokens; "
            "raise the window or lower context.reserve_output"
        )
    thresholds = dict(DEFAULT_THRESHOLDS)
    thresholds.update({k: float(v) for k, v in (context.get("thresholds") or {}).items() if k in DEFAULT_THRESHOLDS})
    margin = float(context.get("safety_margin", safety_margin))
    return Budget(window, reserve, thresholds, float(context.get("tail_budget", DEFAULT_TAIL)), margin, source)
