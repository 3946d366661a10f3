"""The context every stage receives next to the messages."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

    import structlog

    from ctxrules.budget.tracker import SessionLedger
    from ctxrules.models import ModelInfo
    from ctxrules.pipeline.budget import Budget
    from ctxrules.tokens import TokenCounter
    from ctxrules.types import Message
    from ctxrules.vault import Vault


CACHE_TTL_S = 300.0
"""Providers keep a prompt-cache prefix for about five minutes after its last use."""


@dataclass
class StageContext:
    """Everything a stage may consult; built by the runner just before the stage runs.

    - ``counter`` counts tokens for the session's model (memoized per message).
    - ``budget`` knows the window, usable window and thresholds; ``tier``/``utilization`` are
      the values measured on the stage's input (``when:`` was evaluated on them).
    - ``state`` is this stage's persistent per-session dict (JSON-serializable values only);
      changes made to it are saved with the session.
    - ``pack`` is the resolved pack as plain data (read-only by convention).
    - ``protected`` holds ``id()`` of message dicts that later content stages must not touch
      (intent matches, ``critical`` priority); only the emergency pass may move them.
    - ``target`` is the tier below which a hysteresis stage (``compress.*``, ``summarize.*``)
      stops; ``clock`` is the time of this prepare (seconds since the epoch).
    - ``cache_hot``: the provider's prompt cache very likely still holds this session's prefix
      (same fingerprint, previous prepare less than ``CACHE_TTL_S`` ago). Stages with a
      ``hot_cache_bypass`` option leave already-sent content alone then.
    - ``valid_prefix``: how many leading messages are known to satisfy invariant 1 already (the
      session's previous output, on a turn that only appended): the integrity stage checks
      from there on. 0 for every stage but the first integrity pass.
    - ``hooks``: the plugin manager's hook relay (``hooks.ctxrules_semantic_filter(...)``), for
      the pipeline hooks of ``ctxrules.hookspecs``; ``None`` when the caller built no manager.
    - ``registry``: the engine's plugin registry (stage types, compressor actions, template
      filters): a stage that looks one up uses this one, never the process-wide default, so a
      plugin handed to ``Engine.load(plugins=...)`` is seen. ``None`` when built by hand: such a
      stage then does without (``tool_output.filter`` runs no compressor).
    - ``cache_key``: the provider prompt-cache key of the session (its id, or the parent's key
      for a sub-agent); ``cache.markers`` sets ``prompt_cache_key`` from it.
    - ``compactions``: stage type names of the content stages that shortened the messages
      (fewer tokens out than in) earlier in this run, in order; ``reread.recent_files`` reads
      it to know whether a compaction happened.
    - ``ledger``: the session's cost ledger (:class:`~ctxrules.budget.tracker.SessionLedger`):
      a stage that calls a model itself records the call's usage there
      (``ledger.record(usage, model=..., source=...)``), so that it counts in the budgets.
      ``None`` when built by hand.
    """

    stage_id: str
    model: ModelInfo
    counter: TokenCounter
    budget: Budget
    vault: Vault
    tools: list[dict[str, Any]]
    pack: dict[str, Any]
    log: structlog.typing.FilteringBoundLogger
    tier: str = "below"
    utilization: float = 0.0
    state: dict[str, Any] = field(default_factory=dict)
    session_id: str = ""
    protected: set[int] = field(default_factory=set)
    target: str = "monitor"
    clock: float = 0.0
    cache_hot: bool = False
    valid_prefix: int = 0
    hooks: Any = None
    compactions: tuple[str, ...] = ()
    # A ctxrules.plugins.Registry; typed loosely like ``hooks`` because naming the type here
    # would tie the stage contract and the plugin manager into an import cycle.
    registry: Any = None
    cache_key: str = ""
    ledger: SessionLedger | None = None

    def count(self, messages: Sequence[Message]) -> int:
        """Prompt tokens of ``messages`` plus the tool schemas."""
        return self.counter.count_messages(messages, self.tools)

    def utilization_of(self, messages: Sequence[Message]) -> float:
        return self.budget.utilization(self.count(messages))

    def below(self, messages: Sequence[Message], tier: str) -> bool:
        """Whether ``messages`` are under ``tier`` (hysteresis: a stage stops once this holds)."""
        return self.budget.utilization(self.count(messages)) < self.budget.thresholds[tier]
