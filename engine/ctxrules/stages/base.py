"""What a stage is: the contract between the pipeline runner and every stage type.

A stage is a small callable, configured once from its validated ``with:`` options, that takes
the current message list and a :class:`StageContext` and returns a :class:`StageOutcome`.
Stages treat messages as immutable: a changed message is a new dict (``{**msg, ...}``), so the
caller's objects are never mutated (invariant 5, docs/reference/concepts.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

# Message, Phase and the tier names live in the leaf module ctxrules.types; they are named here
# too because this module is the stage contract a plugin author reads.
from ctxrules.types import PHASES, THRESHOLD_NAMES, TIERS, Message, Phase

if TYPE_CHECKING:
    from ctxrules.pipeline.context import StageContext

__all__ = [
    "EMPTY_OPTIONS_SCHEMA",
    "PHASES",
    "TIERS",
    "Action",
    "Message",
    "Phase",
    "Stage",
    "StageFactory",
    "StageOutcome",
    "StageType",
    "options_schema_for",
    "unchanged",
]

EMPTY_OPTIONS_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {},
}


@dataclass(frozen=True)
class Action:
    """One thing a stage did, for the report. ``index`` is the message index in the stage's input."""

    kind: str
    detail: str
    index: int | None = None
    tokens_saved: int = 0
    vault_id: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "detail": self.detail}
        if self.index is not None:
            out["index"] = self.index
        if self.tokens_saved:
            out["tokens_saved"] = self.tokens_saved
        if self.vault_id is not None:
            out["vault_id"] = self.vault_id
        return out


@dataclass
class StageOutcome:
    """What a stage returns: the new message list and what it did.

    ``request`` holds extra call options a finalize stage adds (e.g. ``prompt_cache_key``);
    ``tools`` is a replacement tool list (finalize stages only: normalized, never narrowed);
    ``state`` is merged into the stage's persistent per-session state.
    """

    messages: list[Message]
    actions: list[Action] = field(default_factory=list)
    request: dict[str, Any] = field(default_factory=dict)
    tools: list[dict[str, Any]] | None = None
    warnings: list[str] = field(default_factory=list)


def unchanged(messages: Sequence[Message]) -> list[Message]:
    """What a stage that changed nothing returns: its input list itself (a copy only when the
    input is not a list). The runner then knows at once that nothing changed, instead of
    comparing the messages one by one; lists are never mutated once made, so sharing one is safe."""
    return messages if isinstance(messages, list) else list(messages)


class Stage(Protocol):
    """A configured stage: ``stage(messages, ctx) -> StageOutcome``."""

    def __call__(self, messages: Sequence[Message], ctx: StageContext) -> StageOutcome: ...


StageFactory: TypeAlias = Callable[[Mapping[str, Any]], Stage]


@dataclass(frozen=True)
class StageType:
    """A stage type as a plugin registers it.

    ``hysteresis`` marks stage types (``compress.*``, ``summarize.*``) that accept a ``target``
    tier and stop as soon as utilization is below it; the runner adds ``target`` to their
    option schema. ``essential`` stage types run even when a pack does not name them and
    cannot be disabled. ``after_compaction`` content stage types run once more after the last
    content stage when a stage after them changed the messages (``thinking.clean``: a
    compaction in this very call may have changed the prefix a signature covers).
    """

    name: str
    phase: Phase
    factory: StageFactory
    options_schema: Mapping[str, Any] = field(default_factory=lambda: dict(EMPTY_OPTIONS_SCHEMA))
    description: str = ""
    essential: bool = False
    hysteresis: bool = False
    after_compaction: bool = False


_TARGET_SCHEMA: Mapping[str, Any] = {
    "title": "Target tier",
    "description": "Stop as soon as utilization is below this tier (hysteresis: keeps the next "
    "turn from re-triggering). Default: monitor.",
    "enum": list(THRESHOLD_NAMES),
}


def options_schema_for(stage_type: StageType) -> dict[str, Any]:
    """The schema a pack's ``with:`` is checked against: the plugin's, plus ``target`` for
    stage types with hysteresis (the runner, not each stage, owns that option)."""
    schema = dict(stage_type.options_schema)
    if stage_type.hysteresis:
        props = dict(schema.get("properties", {}))
        props.setdefault("target", dict(_TARGET_SCHEMA))
        schema["properties"] = props
    return schema
