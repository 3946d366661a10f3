"""The Python API: ``Engine.load`` → ``engine.session`` → ``session.prepare``.

See DESIGN.md "Python API". The CLI is a thin layer over this module.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxrules.errors import UsageError
from ctxrules.logs import get_logger
from ctxrules.messages import split_input, validate_messages
from ctxrules.packs.loader import PackLoader, ResolvedPack, load_pack
from ctxrules.packs.models_match import effective_context, select_model_entry
from ctxrules.pipeline.budget import Budget, make_budget
from ctxrules.pipeline.context import CACHE_TTL_S, StageContext
from ctxrules.pipeline.prefix import message_digest
from ctxrules.pipeline.report import build_report
from ctxrules.pipeline.runner import PlannedStage, run_pipeline
from ctxrules.plugins import Registry, build_plugin_manager, collect, default_registry
from ctxrules.session_store import SessionLock, SessionStore
from ctxrules.stages.base import Message
from ctxrules.tokens import REPLY_PRIMING_TOKENS

DEFAULT_STATE_ROOT = ".ctxrules"


@dataclass
class PrepareResult:
    """What ``prepare`` returns: new lists (the input is untouched), call options, the report."""

    messages: list[Message]
    tools: list[dict[str, Any]]
    request: dict[str, Any]
    report: dict[str, Any]


class Engine:
    """A loaded, validated pack with its stages configured; cheap to share across sessions."""

    def __init__(self, pack: ResolvedPack, registry: Registry) -> None:
        self.pack = pack
        self.registry = registry
        self.plan = self._build_plan()
        canonical = json.dumps(pack.data, sort_keys=True, ensure_ascii=False, default=str)
        self.digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    @classmethod
    def load(cls, ref: str | Path = "builtin:default", *,
             plugins: list[tuple[str, object]] | None = None) -> Engine:
        """Load and validate a pack (a path or ``builtin:NAME``); raises ``PackError``.

        ``plugins``: extra ``(name, plugin)`` pairs registered next to the installed ones.
        """
        if plugins:
            pm, infos = build_plugin_manager(plugins)
            registry = collect(pm, infos)
        else:
            registry = default_registry()
        from ctxrules.validation.validate import validate_resolved

        loader = PackLoader()
        pack = loader.resolve(str(ref))
        pack.diagnostics = validate_resolved(pack, loader, registry)
        if not pack.ok:
            load_pack(ref, loader=loader)  # raises PackError with the first error
        return cls(pack, registry)

    def _build_plan(self) -> list[PlannedStage]:
        plan: list[PlannedStage] = []
        named: set[str] = set()
        for item in self.pack.data.get("pipeline") or []:
            st = self.registry.stage(item["use"])
            options = copy.deepcopy(item.get("with") or {})
            plan.append(PlannedStage(item["id"], st, st.factory(options), options,
                                     dict(item.get("when") or {}), item.get("on_error", "skip")))
            named.add(st.name)
        for name, st in sorted(self.registry.stages.items()):
            if st.essential and name not in named:
                plan.append(PlannedStage(name, st, st.factory({}), {}, implicit=True))
        return plan

    def session(self, path: str | Path | None = None, *, model: str, window: int | None = None,
                session_id: str | None = None) -> Session:
        """Open (or create) the session directory ``path`` for ``model``."""
        if path is None:
            path = Path(DEFAULT_STATE_ROOT) / (session_id or "default")
        return Session(self, Path(path), model=model, window=window, session_id=session_id)


class Session:
    """One conversation's state: vault, stage states, the last compaction, the lock."""

    def __init__(self, engine: Engine, path: Path, *, model: str, window: int | None,
                 session_id: str | None) -> None:
        from ctxrules.models import lookup_model
        from ctxrules.tokens import TokenCounter
        from ctxrules.vault import Vault

        self.engine = engine
        self.path = path
        self.id = session_id or path.resolve().name
        self.store = SessionStore(path)
        hit = select_model_entry(engine.pack.data, model)
        self.model_entry = hit[1] if hit else None
        context = effective_context(engine.pack.data, self.model_entry)
        pack_window = context.get("window")
        fallback = window if window is not None else (pack_window if isinstance(pack_window, int) else None)
        self.model = lookup_model(model, window=fallback)
        self.counter = TokenCounter.for_model(self.model)
        self.budget: Budget = make_budget(
            context, registry_window=self.model.window if window is None else None, override=window,
            safety_margin=self.counter.safety_margin, model=model)
        self.vault = Vault.for_session(path)
        self._thread_lock = threading.Lock()
        self._last_history: list[Message] | None = None
        self._last_output: list[Message] | None = None
        self._last_digests: list[str] = []
        self._last_msgs_sum = 0
        self._last_out_tokens: int | None = None
        self._last_tools: list[dict[str, Any]] = []

    @property
    def fingerprint(self) -> str:
        parts = [self.engine.digest, self.model.name, str(self.budget.window), str(self.budget.reserve_output),
                 self.engine.registry.fingerprint()]
        return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:32]

    def prepare(self, messages: Any, tools: list[dict[str, Any]] | None = None, *,
                clock: float | None = None) -> PrepareResult:
        """Run the pipeline before a model call. ``messages`` is the full history (append-only);
        a JSON-style ``{"messages": [...], "tools": [...]}`` is accepted too."""
        listed, given_tools = split_input(messages)
        if tools is None:
            tools = given_tools
        if not isinstance(listed, list):
            listed = validate_messages(listed)
        tool_list = list(tools or [])
        with self._thread_lock, SessionLock(self.path):
            return self._prepare(listed, tool_list, time.time() if clock is None else clock)

    async def aprepare(self, messages: Any, tools: list[dict[str, Any]] | None = None) -> PrepareResult:
        """``prepare`` off the event loop."""
        return await asyncio.to_thread(self.prepare, messages, tools)

    def _prepare(self, history: list[Message], tools: list[dict[str, Any]], clock: float) -> PrepareResult:
        started = time.perf_counter()
        state = self.store.load()
        fingerprint = self.fingerprint
        same = state.get("fingerprint") == fingerprint
        last_clock = state.get("last_clock")
        cache_hot = same and isinstance(last_clock, int | float) and 0 <= clock - last_clock < CACHE_TTL_S
        reused, previous, digests = 0, [], []
        if same:
            reused, previous, digests = self._previous(history, state)
        else:
            state["stages"] = {}
        # The reused prefix equals a history that was validated already.
        history = validate_messages(history, start=reused)
        pipeline_input = [*previous, *history[reused:]] if reused else history
        appended = sum(self.counter.count_each(history[reused:]))
        msgs_sum = (self._last_msgs_sum if reused else 0) + appended
        tools_tokens = self.counter.count_tools(tools, has_system_message=_has_system(history))
        tokens_in = msgs_sum + REPLY_PRIMING_TOKENS + tools_tokens
        known = None
        if reused and self._last_out_tokens is not None and tools == self._last_tools:
            known = self._last_out_tokens + appended
        base = StageContext(
            stage_id="", model=self.model, counter=self.counter, budget=self.budget, vault=self.vault,
            tools=tools, pack=self.engine.pack.data, log=get_logger("ctxrules.pipeline", session=self.id),
            session_id=self.id, clock=clock, cache_hot=cache_hot,
        )
        outcome = run_pipeline(self.engine.plan, pipeline_input, base, state.setdefault("stages", {}),
                               known_tokens=known)
        self._last_msgs_sum, self._last_out_tokens, self._last_tools = msgs_sum, outcome.tokens, tools
        vault_new = sorted({a["vault_id"] for r in outcome.records for a in r.actions if a.get("vault_id")})
        digests = digests[:reused] + [message_digest(m) for m in history[reused:]]
        kept = self._last_history[:reused] if reused and self._last_history else []
        self._last_history = [*kept, *(_clone(m) for m in history[reused:])]
        self._last_output, self._last_digests = outcome.messages, digests
        state["fingerprint"] = fingerprint
        state["last_clock"] = clock
        state["last"] = {"count": len(history), "digests": digests}
        self.store.save(state, outcome.messages)
        report = build_report(self, history_tokens=tokens_in, history_len=len(history), reused=reused,
                              outcome=outcome, vault_new=vault_new,
                              ms=(time.perf_counter() - started) * 1000)
        # New lists. Messages no stage changed are the caller's own objects (the session notices
        # if the caller edits them later); messages a stage made are copies, so that editing them
        # cannot corrupt the session's record of its last output.
        own = {id(m) for m in history}
        out = [m if id(m) in own else _clone(m) for m in outcome.messages]
        return PrepareResult(out, _clone(outcome.tools), _clone(outcome.request), report)

    def _previous(self, history: list[Message], state: dict[str, Any]) -> tuple[int, list[Message], list[str]]:
        """(messages reused, the previous output, digests of the reused history) when ``history``
        extends the one the last ``prepare`` saw; (0, [], []) otherwise."""
        last = self._last_history
        if last is not None and self._last_output is not None:
            # Our copies share leaf strings with what the caller passed, so `==` mostly meets
            # identical objects and stays cheap; a message edited in place compares unequal.
            n = len(last)
            if n <= len(history) and all(a == b for a, b in zip(last, history)):
                return n, self._last_output, self._last_digests
            return 0, [], []
        record = state.get("last") or {}
        digests = record.get("digests") or []
        n = len(digests)
        if not n or n > len(history) or not all(message_digest(m) == d for m, d in zip(history, digests)):
            return 0, [], []
        output = self.store.load_output(int(record.get("output_count", -1)))
        if output is None:
            return 0, [], []
        self._last_history = [_clone(m) for m in history[:n]]
        self._last_msgs_sum = sum(self.counter.count_each(history[:n]))
        self._last_out_tokens = None
        return n, output, list(digests)


def _has_system(messages: list[Message]) -> bool:
    return any(m.get("role") == "system" for m in messages)


def _clone(value: Any) -> Any:
    """A copy of JSON-like data; much cheaper than ``copy.deepcopy`` (no memo, no reduce)."""
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clone(v) for v in value]
    return value


def state_root_from_env() -> Path:
    return Path(os.environ.get("CTXRULES_STATE", DEFAULT_STATE_ROOT))


def open_session(pack: str, model: str, *, session: str | None = None, state: str | None = None,
                 window: int | None = None) -> Session:
    """What ``ctxrules run`` does to get a session (CLI helper)."""
    engine = Engine.load(pack)
    if session is not None:
        path = Path(session)
    else:
        path = Path(state) / "default" if state else state_root_from_env() / "default"
    if window is not None and window <= 0:
        raise UsageError(f"--window must be a positive number of tokens, got {window}")
    return engine.session(path, model=model, window=window)
