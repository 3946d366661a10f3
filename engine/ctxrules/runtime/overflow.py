"""``session.complete(...)``: a litellm call with context-overflow recovery.

The call sends what ``prepare`` returns as it is (it carries no field ctxrules adds), with the
request options such as ``prompt_cache_key`` merged in. When the provider answers that the prompt is
too long, an emergency pass runs at the limit the provider named (or, when it names none, at
80 % of what was sent) — the pack's own ``compress.emergency`` stage with its ``with:`` options
(phase 1 cuts long contents to head + tail, phase 2 drops the oldest steps, both into the vault),
then the pack's pairing stage repairs the tool pairs — and the call is retried once. A pack
without a ``compress.emergency`` entry gets the registered stage type with its defaults; when
that plugin is blocked (``CTXRULES_BLOCK_PLUGINS``), there is no recovery and the error stands.
What happened is returned with the response; usage goes to the ledger when the session has one.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ctxrules.errors import CtxrulesError
from ctxrules.injected import InjectionKey, key_scope
from ctxrules.llm import load_litellm, quiet
from ctxrules.logs import get_logger
from ctxrules.pipeline.context import StageContext
from ctxrules.results import PrepareResult

if TYPE_CHECKING:
    from ctxrules.models import ModelInfo
    from ctxrules.packs.loader import ResolvedPack
    from ctxrules.pipeline.budget import Budget
    from ctxrules.pipeline.runner import PlannedStage
    from ctxrules.plugins import Registry
    from ctxrules.stages.base import Stage
    from ctxrules.tokens import TokenCounter
    from ctxrules.vault import Vault

EMERGENCY_STAGE = "compress.emergency"
PAIRING_STAGE = "normalize.tool_pairs"

_LIMIT_PATTERNS = (
    re.compile(r"maximum context length is (\d[\d,]*)", re.I),
    re.compile(r"\d[\d,]* tokens? > (\d[\d,]*)", re.I),
    re.compile(r"context (?:window|length)[^\d]{0,40}(\d[\d,]*) tokens", re.I),
)
_OVERFLOW_TEXT = re.compile(r"context[_ ]length|context window|prompt is too long|too many tokens|"
                            r"maximum context|reduce the length", re.I)


class CompletionFailed(CtxrulesError):
    exit_code = 2


class _EngineView(Protocol):
    @property
    def pack(self) -> ResolvedPack: ...
    @property
    def plan(self) -> list[PlannedStage]: ...
    @property
    def registry(self) -> Registry: ...


class OverflowSession(Protocol):
    """What the recovery needs of a session (``ctxrules.Session`` is one)."""

    @property
    def id(self) -> str: ...
    @property
    def engine(self) -> _EngineView: ...
    @property
    def model(self) -> ModelInfo: ...
    @property
    def counter(self) -> TokenCounter: ...
    @property
    def budget(self) -> Budget: ...
    @property
    def vault(self) -> Vault: ...
    @property
    def injection_key(self) -> InjectionKey: ...

    def prepare(self, messages: Any, tools: list[dict[str, Any]] | None = None) -> PrepareResult: ...


@dataclass
class Completion:
    response: Any
    prepared: PrepareResult
    recovered: bool = False
    attempts: list[dict[str, Any]] = field(default_factory=list)


def is_overflow(exc: BaseException) -> bool:
    name = type(exc).__name__
    return name == "ContextWindowExceededError" or bool(_OVERFLOW_TEXT.search(str(exc)))


def limit_from(exc: BaseException) -> int | None:
    text = str(exc)
    for pat in _LIMIT_PATTERNS:
        m = pat.search(text)
        if m:
            return int(m.group(1).replace(",", ""))
    return None


def _pack_stage(session: OverflowSession, type_name: str) -> Stage | None:
    """The pack's configured stage of ``type_name`` (its ``with:`` options applied), else the
    registered type with its defaults, else None (not registered: e.g. a blocked plugin)."""
    for planned in session.engine.plan:
        if planned.type.name == type_name:
            return planned.stage
    st = session.engine.registry.stages.get(type_name)
    return st.factory({}) if st is not None else None


def emergency_pass(session: OverflowSession, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                   window: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
    """Shrink ``messages`` to fit ``window`` (minus reserve_output): cut, then drop steps.
    None when the pack has no emergency stage to run."""
    emergency = _pack_stage(session, EMERGENCY_STAGE)
    if emergency is None:
        return None
    reserve = min(session.budget.reserve_output, max(window // 4, 1))
    budget = dataclasses.replace(session.budget, window=window, reserve_output=reserve, window_source="override")
    ctx = StageContext(stage_id="overflow", model=session.model, counter=session.counter, budget=budget,
                       vault=session.vault, tools=tools, pack=session.engine.pack.data,
                       log=get_logger("ctxrules.overflow", session=session.id), tier="emergency",
                       session_id=session.id, target="light", hooks=session.engine.registry.hooks,
                       registry=session.engine.registry)
    pairing = _pack_stage(session, PAIRING_STAGE)
    with key_scope(session.injection_key):  # what it marks and recognises is the session's
        out = emergency(messages, ctx)
        repaired = pairing(out.messages, ctx) if pairing is not None else out
    actions = [a.as_dict() for a in [*out.actions, *(repaired.actions if repaired is not out else [])]]
    return repaired.messages, actions


def complete(session: OverflowSession, messages: Any, *, tools: list[dict[str, Any]] | None = None,
             model: str | None = None, **kwargs: Any) -> Completion:
    """``litellm.completion`` on the prepared messages, with one overflow recovery."""
    litellm = load_litellm()

    prepared = session.prepare(messages, tools)
    call_model = model or session.model.name
    sent = prepared.messages
    attempts: list[dict[str, Any]] = []
    for attempt in range(2):
        options = {**prepared.request, **kwargs}
        if prepared.tools:
            options.setdefault("tools", prepared.tools)
        try:
            with quiet():
                response = litellm.completion(model=call_model, messages=sent, **options)
        except Exception as exc:
            tokens = session.counter.count_messages(sent, prepared.tools)
            attempts.append({"attempt": attempt + 1, "error": f"{type(exc).__name__}: {exc}"[:500], "tokens": tokens})
            _record(session, call_model, None, ok=False)
            recovery = None
            if attempt == 0 and is_overflow(exc):
                limit = limit_from(exc) or int(tokens * 0.8)
                recovery = emergency_pass(session, sent, prepared.tools, min(limit, session.budget.window))
            if recovery is not None:
                sent, actions = recovery
                attempts[-1].update(recovery={"window": limit, "actions": actions,
                                              "tokens_after": session.counter.count_messages(sent, prepared.tools)})
                continue
            raise CompletionFailed(f"model call failed: {type(exc).__name__}: {str(exc)[:300]}") from exc
        attempts.append({"attempt": attempt + 1, "ok": True})
        _record(session, call_model, response, ok=True)
        return Completion(response, prepared, recovered=attempt > 0, attempts=attempts)
    raise CompletionFailed("model call failed after the overflow recovery")  # pragma: no cover - loop returns


def _record(session: OverflowSession, model: str, response: Any, *, ok: bool) -> None:
    """Usage into the session's ledger when there is one (failed calls record nothing)."""
    recorder = getattr(session, "record_usage", None)
    if not ok or recorder is None or response is None:
        return
    usage = getattr(response, "usage", None)
    if usage is not None:
        # litellm's Usage is a pydantic model; the ledger takes plain JSON-like data.
        dump = getattr(usage, "model_dump", None)
        recorder(dump() if callable(dump) else usage, model=model)
