"""The Python API: ``Engine.load`` → ``engine.session`` → ``session.prepare``.

See docs/reference/concepts.md "Python API". The CLI is a thin layer over this module.
"""

from __future__ import annotations

import contextlib
import copy
import enum
import functools
import hashlib
import itertools
import json
import math
import operator
import os
import time
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctxrules import structure
from ctxrules.budget.gate import finish_prepare, open_ledger, start_prepare
from ctxrules.budget.router import route_for_session
from ctxrules.dangling import marker_ids, missing, replace_lost
from ctxrules.errors import CtxrulesError, PackError, UsageError
from ctxrules.formats import openai as openai_format
from ctxrules.formats.request import prepare_request
from ctxrules.injected import InjectionKey, key_for_session, key_in_store, key_scope
from ctxrules.json_stream import serialise_once
from ctxrules.logs import configure, get_logger, structlog_configured
from ctxrules.messages import clone_json, split_input, validate_messages, validate_tools
from ctxrules.models import check_model_name, lookup_model
from ctxrules.notes import SessionNotes
from ctxrules.packs.loader import PackLoader, ResolvedPack
from ctxrules.packs.models_match import effective_context, select_model_entry
from ctxrules.packs.validated import raise_for_errors, resolve_and_validate
from ctxrules.patterns import time_budget
from ctxrules.pipeline.budget import Budget, make_budget
from ctxrules.pipeline.context import CACHE_TTL_S, StageContext
from ctxrules.pipeline.prefix import EMPTY_CHAIN, HistoryChain, PrefixCache
from ctxrules.pipeline.report import build_report, report_header
from ctxrules.pipeline.runner import PlannedStage, RunOutcome, run_pipeline, when_allows
from ctxrules.plugins import Registry, build_plugin_manager, collect, default_registry
from ctxrules.printable import encodable
from ctxrules.private_files import check_dir, ensure_dir
from ctxrules.progress import listening
from ctxrules.prompts.assemble import assemble
from ctxrules.recall import RecallSettings, answer_recall, referenced_ids, tool_definition
from ctxrules.resources import rules_dir
from ctxrules.results import PrepareResult
from ctxrules.runtime import checkpoint
from ctxrules.runtime.continuation import Decision, evaluate
from ctxrules.runtime.guards import Preflight, check_gateway, preflight, refuse_unless_fits
from ctxrules.runtime.health import health, open_breakers
from ctxrules.runtime.overflow import Completion, acomplete, complete
from ctxrules.runtime.spill import DEFAULT_PREVIEW_TOKENS, Spilled, spill
from ctxrules.runtime.subagents import Handover, child_path, make_handover
from ctxrules.runtime.subagents import settings as subagent_settings
from ctxrules.session_store import DEFAULT_STATE_ROOT, state_root_from_env
from ctxrules.stores import Store, open_store
from ctxrules.stores.filesystem import FilesystemStore, durable_at_commit
from ctxrules.threads import ForkSafeLock
from ctxrules.tokens import REPLY_PRIMING_TOKENS, TokenCounter, token_ceiling, trusted_objects
from ctxrules.toolroles import tool_roles
from ctxrules.tracker import FileTracker
from ctxrules.types import Message
from ctxrules.vault import Vault

__all__ = [
    "DEFAULT_STATE_ROOT",
    "Engine",
    "PrepareResult",
    "Session",
    "SessionIOError",
    "check_path",
    "open_session",
    "state_root_from_env",
]


def check_path(value: object, what: str) -> None:
    """Raise :class:`UsageError` unless ``value`` is None or a path as text: an int, bytes or a
    NUL in the text failed later as a TypeError or ValueError from inside ``pathlib``/``os``,
    and an empty one (an unset variable) was the current directory, which became a session
    directory."""
    if value is None:
        return
    text = os.fspath(value) if isinstance(value, os.PathLike) else value
    if not isinstance(text, str):
        raise UsageError(f"{what} must be a string or a path, not {type(value).__name__}")
    if not text:
        raise UsageError(f"{what} must not be empty (None is the default)")
    if "\0" in text:
        raise UsageError(f"{what} must not contain NUL bytes: {text!r}")


class SessionIOError(CtxrulesError):
    """The session directory could not be written (``ENOSPC``, ``EROFS``, ...) during a run."""


if TYPE_CHECKING:
    from ctxrules.runtime.streaming import AsyncCompletionStream, CompletionStream


@dataclass(slots=True)
class _Turn:
    """What one ``prepare`` works with, handed from step to step."""

    history: list[Message]
    tools: list[dict[str, Any]]
    state: dict[str, Any]
    clock: float
    fingerprint: str
    parts: dict[str, str]
    cache_hot: bool = False
    reused: int = 0  # leading messages of history that the last prepare saw
    previous: list[Message] = field(default_factory=list)  # the last output, when reused
    chain: HistoryChain = EMPTY_CHAIN
    pipeline_input: list[Message] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)  # fingerprint parts that changed
    given_ids: set[str] = field(default_factory=set)  # vault ids the new messages' markers name
    lost: set[str] = field(default_factory=set)  # ... whose vault item is gone
    msgs_sum: int = 0
    tokens_in: int = 0
    known: int = 0  # tokens of the pipeline input
    compacting: list[str] = field(default_factory=list)
    prefix: int = 0  # leading input messages the checkpoint does not back up
    vault_new: list[str] = field(default_factory=list)  # vault ids the stages added


class _Keep(enum.Enum):
    """``switch(window=...)`` not given: keep the session's window override."""

    WINDOW = "keep"


class Engine:
    """A loaded, validated pack with its stages configured; cheap to share across sessions."""

    def __init__(self, pack: ResolvedPack, registry: Registry) -> None:
        self.pack = pack
        self.registry = registry
        self.plan = self._build_plan()
        # thinking.clean's preserved_thinking: pin extends the pins of every stage (structure).
        self.pin_signed_prefix = any(
            p.type.name == "thinking.clean" and p.options.get("preserved_thinking") == "pin" for p in self.plan
        )
        canonical = json.dumps(pack.data, sort_keys=True, ensure_ascii=False, default=str)
        self.digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
        # The pack's files as strings: every prepare stats them (a hot reload), and a str path
        # skips the conversion of a Path on each of those calls. Not the built-in pack files:
        # they are part of the installed package (rewritten only by an upgrade, whose new code
        # this process does not run either), and `builtin:default` alone is 18 files.
        self._paths = _watched(pack.real_paths.values())
        self._stamps = _stamps(self._paths)
        self._refresh_lock = ForkSafeLock()
        self._compacting: dict[str, list[str]] = {}  # tier -> compacting stages (_compacting_at)

    def refresh(self) -> list[str]:
        """Reload the pack when one of its files changed on disk (hot switch: no restart).
        An edit that makes the pack invalid keeps the pack in use and returns a warning."""
        if _stamps(self._paths) == self._stamps:
            return []
        with self._refresh_lock:
            stamps = _stamps(self._paths)
            if stamps == self._stamps:
                return []
            pack = resolve_and_validate(
                self.pack.real_paths[self.pack.files[-1]], self.registry, loader=PackLoader(self.pack.search_path)
            )
            errors = [d for d in pack.diagnostics if d.severity == "error"]
            if errors:
                self._stamps = stamps  # report this edit once, not on every call
                first = errors[0]
                return [
                    f"the pack changed on disk but is now invalid ({first.file}:{first.line}:{first.col}: "
                    f"{first.code} {first.message}); still using the previous version"
                ]
            fresh = Engine(pack, self.registry)
            self.pack, self.plan, self.digest, self._stamps = fresh.pack, fresh.plan, fresh.digest, fresh._stamps
            self._paths = fresh._paths
            self.pin_signed_prefix = fresh.pin_signed_prefix
            self._compacting = {}
            return [f"the pack changed on disk and was reloaded ({', '.join(pack.files)})"]

    @classmethod
    def load(
        cls,
        ref: str | Path = "builtin:default",
        *,
        plugins: list[tuple[str, object]] | None = None,
        search_path: Sequence[str | os.PathLike[str]] = (),
    ) -> Engine:
        """Load and validate a pack (a path or ``builtin:NAME``); raises ``PackError``.

        ``plugins``: extra ``(name, plugin)`` pairs registered next to the installed ones.
        ``search_path``: folders besides the pack's own that the pack may read from
        (``extends:``, template ``file:``, test inputs); anything else it names is CR100.
        """
        configure()  # CTXRULES_LOG: an unknown level is a UsageError here, not a silent default
        registry = collect(*build_plugin_manager(plugins)) if plugins else default_registry()
        # Validated once, against the registry the engine will run with.
        return cls(raise_for_errors(resolve_and_validate(ref, registry, loader=PackLoader(search_path))), registry)

    def _compacting_at(self, tier: str) -> list[str]:
        """The ids of the compacting stages (content phase, with hysteresis) that run at
        ``tier``: the plan is fixed until a reload, so each tier's list is made once."""
        found = self._compacting.get(tier)
        if found is None:
            found = self._compacting[tier] = [
                p.id for p in self.plan if p.phase == "content" and p.type.hysteresis and when_allows(p.when, tier)
            ]
        return found

    def _build_plan(self) -> list[PlannedStage]:
        plan: list[PlannedStage] = []
        named: set[str] = set()
        for item in self.pack.data.get("pipeline") or []:
            st = self.registry.stage(item["use"])
            options = copy.deepcopy(item.get("with") or {})
            try:
                stage = st.factory(options)
            except Exception as exc:  # validate reports these as CR061; keep the same words here
                where = self.pack.origins().get(f"/pipeline/{len(plan)}")
                raise PackError(
                    f"{where or self.pack.name}: error[CR061] options of '{st.name}' are rejected: {exc}"
                ) from exc
            plan.append(
                PlannedStage(item["id"], st, stage, options, dict(item.get("when") or {}), item.get("on_error", "skip"))
            )
            named.add(st.name)
        for name, st in sorted(self.registry.stages.items()):
            if st.essential and name not in named:
                plan.append(PlannedStage(name, st, st.factory({}), {}, implicit=True))
        return plan

    def session(
        self,
        path: str | Path | None = None,
        *,
        model: str,
        window: int | None = None,
        session_id: str | None = None,
        cache_key: str | None = None,
        on_event: Callable[[dict[str, Any]], None] | None = None,
        goal: str | None = None,
        state_root: str | Path | None = None,
        private: bool = False,
        store: Store | str | os.PathLike[str] | None = None,
    ) -> Session:
        """Open (or create) the session directory ``path`` for ``model`` — or, with ``store``
        (a :class:`ctxrules.stores.Store` or a URL such as ``redis://host:6379/0``), the session
        ``path`` (or ``session_id``, default ``default``) names in that store
        (``store.session_key``: an id matching ``[A-Za-z0-9._-]{1,128}`` as it is, else its sha256).

        ``cache_key``: the provider prompt-cache key to use instead of this session's id; a
        sub-agent's session passes its parent's ``session.cache_key`` to inherit it.
        ``goal``: the goal whose budget this session's calls count against; ``state_root``:
        where day and goal ledgers live (default: the session directory's parent).
        ``private``: ``path`` is a fresh directory no other process knows of (a temporary
        directory of this process, as pack tests use): ``prepare`` takes no cross-process lock."""
        check_path(path, "the session path")
        check_path(state_root, "state_root")
        if store is not None:
            if state_root is not None:
                raise UsageError("give state_root (a directory) or store (a Store or URL), not both")
            opened = open_store(store)
            key = opened.session_key(os.fspath(path) if path is not None else session_id or "default")
            if isinstance(opened, FilesystemStore):
                state_root = opened.root  # its sessions share its ledgers and injection key
        else:
            if path is None:
                path = Path(DEFAULT_STATE_ROOT) / (session_id or "default")
            # A directory opened by path: the filesystem store of its state root (day and goal
            # ledgers), by default the directory's parent, as always.
            root = Path(state_root) if state_root is not None else Path(path).resolve().parent
            opened = FilesystemStore(root, private=private)  # private: its spools need no lock either
            key = str(path)
        return Session(
            self,
            Path(key),
            store=opened,
            key=key,
            model=model,
            window=window,
            session_id=session_id,
            cache_key=cache_key,
            on_event=on_event,
            goal=goal,
            state_root=state_root,
            private=private,
        )

    def assemble(self, mode: str, model: str, variables: dict[str, Any] | None = None) -> str:
        """The system prompt of ``mode`` for ``model`` (see ``ctxrules.prompts.assemble``):
        byte-identical for the same pack, mode, matched ``models:`` entry and variables, and
        cached on exactly those, so a repeat is a lookup. Raises ``AssemblyError``."""
        return assemble(self.pack, mode=mode, model=model, variables=variables, registry=self.registry).text


class Session:
    """One conversation's state: vault, stage states, the last compaction, the lock."""

    def __init__(
        self,
        engine: Engine,
        path: Path,
        *,
        model: str,
        window: int | None,
        session_id: str | None,
        cache_key: str | None = None,
        on_event: Callable[[dict[str, Any]], None] | None = None,
        goal: str | None = None,
        state_root: str | Path | None = None,
        private: bool = False,
        store: Store | None = None,
        key: str | None = None,
    ) -> None:
        if store is None:
            store = FilesystemStore(
                Path(state_root) if state_root is not None else path.resolve().parent, private=private
            )
        # Everything the session persists goes through its store (ctxrules.stores).
        self.store: Store = store
        self.key: str = key if key is not None else str(path)
        self._files = isinstance(store, FilesystemStore)
        if self._files:
            # The session directory must be ctxrules' own: a link planted in its place (in a
            # repository, say) is refused before anything is read or written through it.
            check_dir(path)
        self.engine = engine
        self.path = path
        self.id = session_id or (path.resolve().name if self._files else self.key)
        # Provider prompt-cache routing key (cache.markers): a sub-agent inherits its parent's.
        self.cache_key = cache_key or self.id
        self.on_event = on_event
        # The key that signs injected messages' tags: the state root's, else this session's
        # (ctxrules.injected); loaded on the first prepare, so opening a session writes nothing.
        self._state_root = Path(state_root) if state_root is not None else None
        self._injection_key: InjectionKey | None = None
        self._fingerprint_memo: tuple[Any, dict[str, str], str] | None = None
        self._configure(model, window)
        # Cost ledger and budget level (docs/budgets.md); session.record_usage(...) records.
        self.ledger = open_ledger(
            engine.pack.data, path, self.id, model, goal=goal, state_root=state_root, store=store, session=self.key
        )
        self.vault = Vault.of(store, self.key)
        # Fork-safe: a worker forked while another thread ran a prepare of this session (a server
        # that forks after opening sessions) takes it afresh, and starts from the store's turn.
        self._thread_lock = ForkSafeLock(self._forget_memory)
        # A private directory needs no cross-process lock (and pack tests, which use one, then
        # never load the lock module).
        self._session_lock: contextlib.AbstractContextManager[Any] = (
            contextlib.nullcontext() if private else store.prepare_lock(self.key)
        )
        # What the last prepare saw and returned (an append-only history reuses it).
        self._prefix = PrefixCache()
        self._own_copies = _OwnCopies()
        self._log_memo: tuple[Any, Any] | None = None
        self._path_memo: tuple[str, str] | None = None
        self._header_memo: tuple[tuple[Any, ...], dict[str, Any]] | None = None
        self._prepared = False
        self._continuation_memory: dict[str, Any] = {}
        self.parent: Session | None = None
        self.root: Session = self
        self._notices: list[str] = []
        if window is not None:
            self._notices.extend(self._window_notes(model, window))
        self._tools_checked: tuple[Any, list[dict[str, Any]]] | None = None
        self._notes: SessionNotes | None = None
        cut = checkpoint.check(self.key, store=store)
        if cut is not None:
            backup = checkpoint.recovered(self.key, store=store)
            # state.json is written only after a run, so the state on disk is the one from
            # before the cut compaction (or, if the process died while writing it, a damaged
            # file that reads as empty state): continue from it.
            where = f"its input is in the vault: {backup}" if backup else "its input could not be kept"
            self._notices.append(
                f"the previous compaction in this session was interrupted ({cut.reason}); "
                f"continuing from the state before it; {where}"
            )

    @property
    def injection_key(self) -> InjectionKey:
        """The key this session signs and verifies injected messages with."""
        if self._injection_key is None:
            if self._files:
                self._injection_key = key_for_session(self.path, self._state_root)
            else:  # one key per store (every worker signs alike), or the session's own
                self._injection_key = key_in_store(self.store, self.key)
        return self._injection_key

    def _configure(self, model: str, window: int | None) -> None:
        """Model facts, token counter and budget for ``model`` under the current pack; thresholds
        scale with the window (a 128K → 200K switch moves every threshold proportionally).
        All or nothing: a model or window that is refused (unknown, a window too small for the
        output reserve) leaves the session as it was, not half-switched with a budget of the
        old model and an override every later switch would fail on again."""
        check_model_name(model)  # before the pack's models: entries are matched against it
        hit = select_model_entry(self.engine.pack.data, model)
        entry = hit[1] if hit else None
        context = effective_context(self.engine.pack.data, entry)
        pack_window = context.get("window")
        fallback = window if window is not None else (pack_window if isinstance(pack_window, int) else None)
        info = lookup_model(model, window=fallback)
        counter = TokenCounter.for_model(info)
        budget = make_budget(
            context,
            registry_window=info.window if window is None else None,
            override=window,
            safety_margin=counter.safety_margin,
            model=model,
        )
        self.model_entry, self.model, self.counter, self.budget = entry, info, counter, budget
        self.window_override = window
        self._configured_digest = self.engine.digest

    def switch(self, *, model: str | None = None, window: int | _Keep | None = _Keep.WINDOW) -> list[str]:
        """Hot switch: use another model (or window) from the next ``prepare`` on, no restart.
        The next report's ``fingerprint.changed`` says what changed.

        An explicit window override (``session(..., window=N)`` or ``switch(window=N)``) is kept
        across ``switch(model=...)``; ``window=None`` drops it (the pack's or the registry's
        window applies again). A kept override above the new model's own window is capped at
        that window. Returns the warnings, which the next report's ``warnings`` carry too."""
        with self._thread_lock:
            name = model or self.model.name
            check_model_name(name)  # before _own_window matches it against the pack's models:
            override = self.window_override if isinstance(window, _Keep) else window
            notes: list[str] = []
            if model is not None and isinstance(window, _Keep) and override is not None:
                own = self._own_window(name)
                if own is not None and override > own:
                    notes.append(
                        f"switch to {name}: the window override {override} is above the model's own "
                        f"window {own}; using {own} (pass window=None to drop the override)"
                    )
                    override = own
            elif isinstance(window, int):  # said for this model: taken as it is, with a warning
                notes.extend(self._window_notes(name, window))
            self._configure(name, override)
            self._prefix.clear()
            for note in notes:
                get_logger("ctxrules", session=self.id).warning("switch.window_capped", detail=note)
            self._notices.extend(notes)
            return notes

    def _window_notes(self, model: str, window: int) -> list[str]:
        """A warning when a window given for ``model`` is above the model's own: the caller's
        word is taken (a deployment may allow more than the registry says), but the provider
        may refuse a prompt over its own window, so the report says so."""
        own = self._own_window(model)
        if own is None or window <= own:
            return []
        return [
            f"the window {window} is above {model}'s own window {own} (its models: entry, else the "
            "model registry); prompts over it may be refused by the provider"
        ]

    def _own_window(self, model: str) -> int | None:
        """``model``'s window without any override: its pack ``models:`` entry, else the registry."""
        hit = select_model_entry(self.engine.pack.data, model)
        pack_window = effective_context(self.engine.pack.data, hit[1] if hit else None).get("window")
        if isinstance(pack_window, int) and not isinstance(pack_window, bool):
            return pack_window
        try:
            return lookup_model(model).window
        except CtxrulesError:
            return None  # a model the registry does not know: nothing to cap at

    def preflight(self, messages: Any, tools: list[dict[str, Any]] | None = None, *, refuse: bool = True) -> Preflight:
        """Estimate a request against the window before calling the model. With ``refuse``,
        raise ``RequestRejected`` (with the numbers) when even the pinned messages and tool
        schemas cannot fit, instead of spending an API call."""
        listed, given_tools = split_input(messages)
        history = validate_messages(listed)
        tool_list = validate_tools(tools if tools is not None else given_tools)
        estimate = preflight(history, tool_list, counter=self.counter, budget=self.budget)
        if refuse:
            refuse_unless_fits(estimate, self.model.name)
        return estimate

    def spill(self, text: str | bytes, *, kind: str = "output", preview_tokens: int | None = None) -> Spilled:
        """Store a large output (MCP result, hook output, background log; ``str`` or ``bytes``,
        anything else is a ``TypeError``) in the vault; return the marker and a preview within
        ``preview_tokens`` (default 2,500): a JSON document's skeleton, else head + tail lines."""
        return spill(
            self.vault, text, kind=kind, counter=self.counter, preview_tokens=preview_tokens or DEFAULT_PREVIEW_TOKENS
        )

    def record_usage(self, usage: Any, *, model: str | None = None, **options: Any) -> dict[str, Any] | None:
        """Record one successful model call in the session, day and goal ledgers (see
        ``SessionLedger.record``): ``usage`` is a provider usage object or whole response, or a
        ``TokenUsage``; an error body records nothing. Returns the ledger record."""
        return self.ledger.record(usage, model=model or self.model.name, **options)

    def route(self, text: Any, *, regenerate: bool = False, now: float | None = None) -> Any:
        """The complexity router's ``RouteDecision`` (tier, model, reasons) for the next call
        under the pack's ``router:``; ``text`` is the message or the history (docs/budgets.md)."""
        return route_for_session(self, text, regenerate=regenerate, now=now)

    def should_continue(self, state: dict[str, Any]) -> Decision:
        """The pack's continuation guards (``guards.continuation``) on an agent loop's state:
        ``messages``, ``cancel``, ``budget_ok``, ``drift_check``, ``cwd``. The budget check
        reads this session's ledger (the root's tree, the day and the goal): it reports the
        level and stops at EXCEEDED; ``decision.budget`` holds the status."""
        guards = self.engine.pack.data.get("guards") or {}
        config = guards.get("continuation") or {} if isinstance(guards, dict) else {}
        return evaluate(
            config,
            state,
            self._continuation_memory,
            is_error=tool_roles(self.engine.pack.data).is_error,
            budget=self.ledger.status(),
        )

    def child(self, name: str, *, model: str | None = None, window: int | None = None) -> Session:
        """A sub-agent session in ``<this>/children/<name>``: same pack, this session's prompt
        cache key, state root and goal, and this session's root as budget root: its calls count
        in the root's session budget and in the day and goal ledgers of the state root.
        ``budgets.max_descendants`` (default 20) caps how many child sessions one root may
        spawn across the tree; beyond it ``SpawnLimitExceeded`` is raised and nothing is created."""
        path = child_path(self.path, name)
        if self._files:
            # ``children/`` must be this session's own folder: a link planted in its place
            # would receive the child's state and link before the child's own check sees it.
            check_dir(path.parent)
        sub = Session(
            self.engine,
            path,
            store=self.store,
            key=str(path) if self._files else f"{self.key}/children/{name}",
            model=model or self.model.name,
            window=window if window is not None else self.window_override,
            session_id=f"{self.id}/{name}",
            cache_key=self.cache_key,
            on_event=self.on_event,
            goal=self.ledger.goal,
            state_root=self.ledger.state_root,
        )
        sub.parent, sub.root = self, self.root
        sub._injection_key = self.injection_key  # one key per tree: a handover stays recognisable
        self.ledger.register_child(sub.ledger)  # the one spawn cap; its costs count in the root's budget
        if self._files:
            ensure_dir(path, inside=self.path)
        return sub

    def handover(self, result: str) -> Handover:
        """This sub-agent's result, capped for the parent's context (see ``runtime.subagents``)."""
        cfg = subagent_settings(self.engine.pack.data)
        return make_handover(
            result,
            vault=self.vault,
            counter=self.counter,
            max_result_tokens=cfg["max_result_tokens"],
            spill_chars=cfg["spill_chars"],
        )

    def complete(
        self,
        messages: Any,
        *,
        tools: list[dict[str, Any]] | None = None,
        model: str | None = None,
        stream: bool = False,
        **kwargs: Any,
    ) -> Completion | CompletionStream:
        """``prepare`` + ``litellm.completion`` with one context-overflow recovery (see
        ``ctxrules.runtime.overflow``); litellm is imported only here. Returns a ``Completion``;
        with ``stream=True`` a ``CompletionStream`` of the chunks (recovered when the overflow
        comes before the first chunk; usage recorded when the stream ends)."""
        return complete(self, messages, tools=tools, model=model, stream=stream, **kwargs)

    async def acomplete(
        self,
        messages: Any,
        *,
        tools: list[dict[str, Any]] | None = None,
        model: str | None = None,
        stream: bool = False,
        **kwargs: Any,
    ) -> Completion | AsyncCompletionStream:
        """``complete`` on the event loop (``aprepare`` + ``litellm.acompletion``); with
        ``stream=True`` an ``AsyncCompletionStream`` (``async for chunk in stream``)."""
        return await acomplete(self, messages, tools=tools, model=model, stream=stream, **kwargs)

    def keepalive(self, *, model: str | None = None, **options: Any) -> Any:
        """A ``ctxrules.cache.warmup.KeepAlive`` for this session: its warm-up and keep-alive
        probes are recorded in this session's ledger and count in its budgets. ``options`` are
        KeepAlive's (``request``, ``interval_s``, ``max_idle_s``, ...)."""
        from ctxrules.cache.warmup import KeepAlive

        return KeepAlive(model or self.model.name, ledger=self.ledger, **options)

    @property
    def notes(self) -> SessionNotes:
        """The session's notes (``add/update/remove/list``), rendered by ``notes.render``."""
        if self._notes is None:
            self._notes = SessionNotes(store=self.store, session=self.key)
        return self._notes

    def touch(self, *paths: str | os.PathLike[str]) -> list[str]:
        """Record files the agent changed, for ``reread.recent_files``; returns them absolute."""
        return FileTracker(store=self.store, session=self.key).touch(*paths)

    # --- recall: the agent reads back what was moved out (ctxrules.recall) ---------------

    def recall_tool(self, format: str = "openai") -> dict[str, Any]:
        """The recall tool's definition (``openai`` or ``anthropic`` tools format), worded by
        the pack's ``recall:``. Offer it from the first call on: the tools layer of the cached
        prefix then never changes mid-session."""
        return tool_definition(RecallSettings.from_pack(self.engine.pack.data), format)

    def recall(self, arguments: Any) -> str:
        """The answer to one recall call (``{"id": ..., "lines": "A:B"}``, or its JSON string):
        the exact original lines of an item this session's markers reference, paged within
        ``recall.budget_tokens``. Raises ``RecallError`` (a ``CtxrulesError``) for a call it
        cannot answer."""
        allowed = referenced_ids(self.last_output(), self.vault)
        return answer_recall(
            arguments,
            vault=self.vault,
            allowed=allowed,
            count=self.counter.count_text,
            settings=RecallSettings.from_pack(self.engine.pack.data),
        )

    def last_output(self) -> list[Message]:
        """What the last ``prepare`` of this session returned (read back from the session
        directory in a new process; empty when there is none)."""
        if self._prefix.output is not None:
            return list(self._prefix.output)
        # The digest is checked: a tampered file must not widen what recall may hand out.
        output = self.store.load_turn(self.key).output
        return output or []

    def fingerprint_parts(self) -> dict[str, str]:
        """Everything that shapes the output of ``prepare``."""
        return dict(self._fingerprint()[0])

    @property
    def fingerprint(self) -> str:
        return self._fingerprint()[1]

    def _fingerprint(self) -> tuple[dict[str, str], str]:
        # Remembered for the same engine, pack digest and budget (a switch or a pack reload
        # makes new ones): every prepare asks.
        key = (self.engine, self.engine.digest, self.model.name, self.budget)
        memo = self._fingerprint_memo
        if memo is None or memo[0] != key:
            parts = {
                "pack": self.engine.digest,
                "model": self.model.name,
                "window": str(self.budget.window),
                "reserve_output": str(self.budget.reserve_output),
                "thresholds": ",".join(f"{k}={v}" for k, v in sorted(self.budget.thresholds.items())),
                "plugins": self.engine.registry.fingerprint(),
            }
            memo = self._fingerprint_memo = (key, parts, _fingerprint_of(parts))
        return memo[1], memo[2]

    def prepare(
        self,
        messages: Any,
        tools: list[dict[str, Any]] | None = None,
        *,
        clock: float | None = None,
        format: str = "openai",
    ) -> PrepareResult:
        """Run the pipeline before a model call. ``messages`` is the full history (append-only);
        a JSON-style ``{"messages": [...], "tools": [...]}`` is accepted too.

        ``format``: ``openai`` (the default), ``anthropic`` (``messages`` is a whole Anthropic
        Messages request body) or ``auto`` (:func:`ctxrules.formats.detect`). ``result.body``
        is the request in that format; ``result.messages`` the internal OpenAI form."""
        if format != "openai":
            return prepare_request(self, messages, tools, clock=clock, format=format)
        result = self._prepare_openai(messages, tools, clock)
        original = messages if isinstance(messages, dict) else None
        result.body = openai_format.encode(result.messages, result.tools, original, result.request)
        return result

    def _prepare_openai(self, messages: Any, tools: list[dict[str, Any]] | None, clock: float | None) -> PrepareResult:
        # A clock that is not a finite number failed deep in the turn (a string), or went into
        # state.json as NaN, which is not JSON (a NaN or inf).
        if clock is not None and (
            isinstance(clock, bool) or not isinstance(clock, int | float) or not math.isfinite(clock)
        ):
            raise UsageError(f"clock must be a finite number of seconds (time.time()), not {clock!r}")
        listed, given_tools = split_input(messages)
        if tools is None:
            tools = given_tools
        if not isinstance(listed, list):
            listed = validate_messages(listed)
        tool_notes: list[str] = []
        tool_list = self._checked_tools(tools, tool_notes)  # before anything runs: a bad one raises
        # Progress notes from deep inside (the summarizer's stream) reach on_event too.
        notes = listening(self._emit) if self.on_event is not None else contextlib.nullcontext()
        # Messages are not edited while a prepare runs, and the session notices edits between
        # calls (structure.forget): token counts may be looked up by message object.
        # A text over the window counts by an upper bound past it (tokens.token_ceiling): it
        # cannot be sent whole whatever its exact count, and tokenizing 50 MB would take seconds.
        try:
            with (
                self._thread_lock,
                self._session_lock,
                trusted_objects(),
                time_budget(),  # patterns that time out: a few seconds per call in all (ctxrules.patterns)
                token_ceiling(self.budget.window),
                serialise_once(),  # each message's JSON made once: backup, vault entries, last output
                durable_at_commit(self.store, self.key),  # the turn's vault items fsynced together
                notes,
                key_scope(self.injection_key),
            ):
                self._notices.extend(tool_notes)
                try:
                    return self._prepare(listed, tool_list, time.time() if clock is None else clock)
                except OSError as exc:
                    # A full disk, a read-only or vanished session directory: the caller's messages
                    # are untouched and the session files read as a cache miss (SessionStore.save).
                    self.store.forget(self.key)
                    self._prefix.clear()
                    raise self._io_error(exc) from exc
                except BaseException:
                    # A run that did not finish may have changed the state in memory (read back
                    # from the store next time), and a match that adopted the last output the prefix
                    # cache's counts (put back: the cache stays, and the next turn can still reuse).
                    self.store.forget(self.key)
                    self._prefix.rollback()
                    raise
        except OSError as exc:
            # Entering or leaving the turn's scope: the session directory made (a read-only
            # file system), its lock opened, the vault items fsynced. Said as a turn's write is.
            self.store.forget(self.key)
            self._prefix.clear()
            raise self._io_error(exc) from exc

    def _io_error(self, exc: OSError) -> SessionIOError:
        # (a byte of the path that is not UTF-8 shown as that byte, \xff, as the CLI names a path)
        return SessionIOError(
            f"cannot write the session {encodable(self.store.describe(self.key))}: {exc.strerror or exc}; the "
            "messages were not changed, and the next run starts from them"
        )

    def _forget_memory(self) -> None:
        """Drop what this object remembers of the last turn (the next one reads it back from
        the store): a turn another thread was running when this process was forked from it may
        have left it half changed."""
        self.store.forget(self.key)
        self._prefix.clear()

    def _checked_tools(self, tools: Any, notes: list[str]) -> list[dict[str, Any]]:
        """:func:`validate_tools` of ``tools``; the same tools come with every call, so a list
        equal to the last one checked is not walked again (nor warned about again, like an
        unchanged message). The copy kept is the caller's list as it was, deep: a list edited
        in place between calls is not mistaken for the one checked."""
        seen = self._tools_checked
        if seen is not None and tools == seen[0]:
            return list(seen[1])
        checked = validate_tools(tools, warnings=notes)
        self._tools_checked = (copy.deepcopy(tools), checked)
        return list(checked)

    async def aprepare(
        self, messages: Any, tools: list[dict[str, Any]] | None = None, *, format: str = "openai"
    ) -> PrepareResult:
        """``prepare`` off the event loop."""
        import asyncio  # here: a synchronous caller (the CLI) never pays for importing it

        return await asyncio.to_thread(functools.partial(self.prepare, messages, tools, format=format))

    def _prepare(self, history: list[Message], tools: list[dict[str, Any]], clock: float) -> PrepareResult:
        started = time.perf_counter()
        reload_notes = self._reload_pack()
        # Every turn asks the store (cheap when this object wrote last): another worker may have
        # committed a turn since, and then the copy in memory is not the session's last one.
        loaded = self.store.load_turn(self.key, output=False)
        state = loaded.state
        self._notices.extend(loaded.notes)
        if isinstance(state.get("recovered"), str):  # damaged cache: say so, then go on cold
            self._notices.append(state["recovered"])
        # Budget level before any stage runs: EXCEEDED raises BudgetExceeded; WARNING's eco
        # mode hands the pipeline scaled thresholds (docs/budgets.md).
        budget_status, budget = start_prepare(self.ledger, self.budget, state, clock)
        turn = self._reuse(history, tools, state, clock)
        self._heal_markers(turn)
        self._measure(turn)
        self._begin_compaction(turn, budget)
        outcome = self._run(turn, budget)
        self._remember(turn, outcome)
        report = self._report(turn, outcome, budget, reload_notes, started)
        out = finish_prepare(budget_status, self._own_copies(turn.history, outcome.messages), report)
        return PrepareResult(out, clone_json(outcome.tools), clone_json(outcome.request), report)

    def _reload_pack(self) -> list[str]:
        """Pick up an edited pack (hot switch); the notes go into the report's warnings."""
        notes = self.engine.refresh()
        if notes and self.engine.digest != self._configured_digest:
            self._configure(self.model.name, self.window_override)
            self._prefix.clear()
        return notes

    def _reuse(self, history: list[Message], tools: list[dict[str, Any]], state: dict[str, Any], clock: float) -> _Turn:
        """The turn: how much of ``history`` extends what the last prepare saw (same
        fingerprint), the validated history, and whether the provider's cache is likely hot."""
        parts, fingerprint = self._fingerprint()
        turn = _Turn(history=history, tools=tools, state=state, clock=clock, fingerprint=fingerprint, parts=dict(parts))
        same = state.get("fingerprint") == fingerprint
        last_clock = state.get("last_clock")
        turn.cache_hot = same and isinstance(last_clock, int | float) and 0 <= clock - last_clock < CACHE_TTL_S
        # Messages whose lone surrogates an earlier turn replaced: the same repaired copy again,
        # so that the history still extends the one the last turn saw.
        history = self._prefix.with_repairs(history)
        if same:
            turn.reused, turn.previous, turn.chain = self._prefix.match(
                history, state, lambda: self.store.load_turn(self.key).output, self.counter, self.vault
            )
            if turn.reused and self._prefix.loaded:
                turn.previous = self._unfinalized(turn.previous, state)
        else:
            state["stages"] = {}
        if not turn.reused or not self._prepared:
            # Not an extension of what this session saw (or a switch): a message may have been
            # edited in place, which per-object memos of message facts and counts cannot see.
            # So on this session object's first prepare: the memos are per process, and another
            # session may have seen the caller's message objects before they were edited.
            structure.forget()
        self._prepared = True
        # The reused prefix equals a history that was validated already.
        notes: list[str] = []
        turn.history = validate_messages(history, start=turn.reused, warnings=notes)
        if notes:
            self._notices.extend(notes)
            self._prefix.note_repairs(history, turn.history, turn.reused)
        turn.pipeline_input = [*turn.previous, *turn.history[turn.reused :]] if turn.reused else turn.history
        before = state.get("fingerprint_parts") or {}
        turn.changed = sorted(k for k, v in turn.parts.items() if before and before.get(k) != v)
        state["fingerprint_parts"] = turn.parts
        return turn

    def _unfinalized(self, output: list[Message], state: dict[str, Any]) -> list[Message]:
        """The last output without what its finalize stages added (the cache breakpoints), by
        the stages that offer ``unfinalize``, last stage first: a turn that reads the output
        back from the store runs on what a session that kept it in memory runs on."""
        stages = state.get("stages")
        given = output
        for p in reversed(self.engine.plan):
            undo = getattr(p.stage, "unfinalize", None) if p.phase == "finalize" else None
            own = stages.get(p.id) if isinstance(stages, dict) else None
            if undo is not None and isinstance(own, dict):
                try:
                    output = undo(output, own)
                except Exception:  # a damaged state.json: the stage meets it in the run, contained there
                    return given
        return output if isinstance(output, list) else list(output)

    def _heal_markers(self, turn: _Turn) -> None:
        """Markers the caller's new messages hold whose vault item is gone cannot be re-derived:
        they become lost markers (dangling ones of our own output forced a cold run instead)."""
        turn.given_ids = marker_ids(turn.history[turn.reused :])
        turn.lost = missing(self.vault, turn.given_ids) if turn.given_ids else set()
        if not turn.lost:
            return
        head = len(turn.previous) if turn.reused else 0
        tail, n_lost = replace_lost(turn.pipeline_input[head:], turn.lost)
        turn.pipeline_input = [*turn.pipeline_input[:head], *tail]
        self._notices.append(
            f"{len(turn.lost)} marker(s) in {n_lost} message(s) point at vault items that are missing; "
            "they are marked as lost"
        )

    def _measure(self, turn: _Turn) -> None:
        """Tokens in (the caller's history and tools) and of the pipeline input; a warm turn
        counts only the appended messages. Refuses what the gateway limit does not admit."""
        cache, appended_messages = self._prefix, turn.history[turn.reused :]
        appended = sum(self.counter.count_each(appended_messages))
        turn.msgs_sum = (cache.msgs_sum if turn.reused else 0) + appended
        cache.has_system = (cache.has_system if turn.reused else False) or _has_system(appended_messages)
        tools_tokens = self.counter.count_tools(turn.tools, has_system_message=cache.has_system)
        turn.tokens_in = turn.msgs_sum + REPLY_PRIMING_TOKENS + tools_tokens
        check_gateway(self.engine.pack.data, turn.tokens_in)
        if turn.reused and cache.out_tokens is not None and turn.tools == cache.tools:
            turn.known = cache.out_tokens + appended
        else:
            turn.known = self.counter.count_messages(turn.pipeline_input, turn.tools)

    def _begin_compaction(self, turn: _Turn, budget: Budget) -> None:
        """When a compacting stage will run at this tier: say so, and checkpoint its input."""
        tier_in = budget.tier(turn.known)
        compacting = self.engine._compacting_at(tier_in)
        if not compacting:
            return
        turn.compacting = list(compacting)
        self._emit({"event": "compacting", "stages": turn.compacting, "tier": tier_in, "tokens": turn.known})
        # The backup of what the compaction starts from: the appended messages only, when the
        # rest is the last output and last_output.jsonl holds it (it is not written again
        # before the checkpoint is gone); a session that stays at a compacting tier would
        # otherwise store its whole context in the vault on every turn.
        # The last output without its breakpoints (PrefixCache.basis) is, line for line, the
        # saved output with them: those lines stand for it (the stage that placed the
        # breakpoints takes its own off again).
        saved = self._prefix.output if turn.reused and turn.previous is self._prefix.basis else turn.previous
        turn.prefix = len(turn.previous) if turn.reused and saved and self.store.output_holds(self.key, saved) else 0
        backup = checkpoint.put_backup(self.vault, turn.pipeline_input[turn.prefix :])
        checkpoint.begin(
            self.key,
            store=self.store,
            backup=backup,
            prefix=turn.prefix,
            state=clone_json(turn.state),
            messages=len(turn.pipeline_input),
            clock=turn.clock,
        )

    def _run(self, turn: _Turn, budget: Budget) -> RunOutcome:
        """The pipeline on the turn's input; an interrupted compaction is marked as such."""
        base = StageContext(
            stage_id="",
            model=self.model,
            counter=self.counter,
            budget=budget,
            vault=self.vault,
            tools=turn.tools,
            pack=self.engine.pack.data,
            log=self._pipeline_log(),
            session_id=self.id,
            clock=turn.clock,
            cache_hot=turn.cache_hot,
            hooks=self.engine.registry.hooks,
            registry=self.engine.registry,
            cache_key=self.cache_key,
            valid_prefix=len(turn.previous) if turn.reused else 0,
            ledger=self.ledger,
        )
        pin_token = structure.PIN_SIGNED_PREFIX.set(self.engine.pin_signed_prefix)
        try:
            return run_pipeline(
                self.engine.plan,
                turn.pipeline_input,
                base,
                turn.state.setdefault("stages", {}),
                known_tokens=turn.known,
                on_event=self._emit if self.on_event else None,
            )
        except BaseException as exc:
            if turn.compacting:
                # This session may save again before anyone resumes: back up the whole input.
                full = checkpoint.put_backup(self.vault, turn.pipeline_input) if turn.prefix else None
                checkpoint.interrupted(self.key, f"{type(exc).__name__}: {exc}", backup=full, store=self.store)
            raise
        finally:
            structure.PIN_SIGNED_PREFIX.reset(pin_token)

    def _pipeline_log(self) -> Any:
        """The pipeline's logger bound to this session: the same object turn after turn while
        the logging configuration stays (the stages' loggers are bound from it once)."""
        root = get_logger("ctxrules.pipeline")
        memo = self._log_memo
        if memo is None or memo[0] is not root:
            memo = self._log_memo = (root, root.bind(session=self.id))
        return memo[1]

    def _remember(self, turn: _Turn, outcome: RunOutcome) -> None:
        """Keep the turn for the next one (in memory and in state.json) and save the session."""
        turn.chain = turn.chain.extended(turn.history[turn.reused :])
        turn.vault_new = sorted({a["vault_id"] for r in outcome.records for a in r.actions if a.get("vault_id")})
        output_counts = self._prefix.counts_of(outcome.messages, turn.reused, self.counter)
        self._prefix.remember(
            turn.history,
            turn.reused,
            outcome.messages,
            turn.chain,
            msgs_sum=turn.msgs_sum,
            out_tokens=outcome.tokens if outcome.basis_tokens is None else outcome.basis_tokens,
            output_counts=output_counts,
            tools=turn.tools,
            new_ids=turn.given_ids | set(turn.vault_new),
            lost=turn.lost,
            basis=outcome.basis,
        )
        state = turn.state
        state["fingerprint"] = turn.fingerprint
        state["last_clock"] = turn.clock
        # The counts of this history and of the output: a new process continuing the session
        # takes them instead of loading the tokenizer to count the same messages again.
        state["last"] = {
            "count": turn.chain.count,
            "chain": turn.chain.value,
            "tokens": turn.msgs_sum,
            "output_counts": output_counts[1],
        }
        if not turn.reused:
            # The history did not extend the last one: a message of the last output may be a
            # caller's object edited in place since it was saved (the output shares unchanged
            # messages with the caller), so the store must not take "the same object" for "the
            # same line" and append to the file it wrote.
            self.store.forget(self.key)
        if turn.compacting:
            # Before the save: a checkpoint whose backup names lines of last_output.jsonl must
            # be gone before that file is written. Dying in the save costs one turn's reuse.
            checkpoint.complete(self.key, store=self.store)
        self.store.commit_turn(self.key, state, outcome.messages)

    def _report(
        self, turn: _Turn, outcome: RunOutcome, budget: Budget, reload_notes: list[str], started: float
    ) -> dict[str, Any]:
        """The run report, and the events and the log line that go with it."""
        report = build_report(
            self._report_header(),
            budget=budget,
            history_tokens=turn.tokens_in,
            history_len=len(turn.history),
            reused=turn.reused,
            outcome=outcome,
            vault_new=turn.vault_new,
            ms=(time.perf_counter() - started) * 1000,
        )
        report["fingerprint"] = {"value": turn.fingerprint, "changed": turn.changed}
        report["warnings"].extend(reload_notes + self._notices)
        self._notices = []
        # A store that fell back to memory after the turn was read (on_error=local, Redis gone
        # in the middle of the turn) says so only through this; the read's note is there already.
        fell_back = getattr(self.store, "fell_back", None)
        if isinstance(fell_back, str) and fell_back not in report["warnings"]:
            report["warnings"].append(fell_back)
        report["compacting"] = turn.compacting
        report["health"] = health(report, breakers=open_breakers(turn.state.get("stages")))
        for st in report["stages"]:
            for action in st["actions"]:
                if action["kind"] == "checkpoint":  # the summarizer fell back to the checkpoint
                    self._emit({"event": "fallback", "stage": st["id"], "detail": action["detail"]})
                elif action["kind"] == "breaker":
                    self._emit({"event": "breaker", "stage": st["id"], "detail": action["detail"]})
        self._emit(
            {
                "event": "prepare.end",
                "health": report["health"]["state"],
                "tokens_before": turn.tokens_in,
                "tokens_after": outcome.tokens,
            }
        )
        _log_prepare(self.id, report)
        return report

    def _report_header(self) -> dict[str, Any]:
        # The same parts every turn until a switch, a pack reload or another working directory:
        # made once, copied into each report (report_header copies them).
        cwd_path = self._resolved_path() if self._files else None
        engine, counter = self.engine, self.counter
        key = (engine.pack, engine.digest, self.model, counter, counter.is_estimate, self.model_entry, cwd_path)
        memo = self._header_memo
        if memo is None or memo[0] != key:
            memo = self._header_memo = (key, self._build_header())
        return report_header(**memo[1])

    def _build_header(self) -> dict[str, Any]:
        pack = self.engine.pack
        return report_header(
            pack={"name": pack.name, "digest": self.engine.digest, "files": pack.files},
            # absolute: read-back commands; a URL store names the store and the session id
            session={"id": self.id, "path": self._resolved_path()}
            if self._files
            else {"id": self.id, "path": self.store.describe(self.key), "store": self.store.url, "key": self.key},
            model={
                "name": self.model.name,
                "registry_key": self.model.key,
                "provider": self.model.provider,
                "family": self.model.family,
                "tokenizer": self.model.tokenizer,
                "tokens_are_estimates": self.counter.is_estimate,
                "models_entry": (self.model_entry or {}).get("id"),
            },
        )

    def _resolved_path(self) -> str:
        """The session directory's absolute path, resolved once per working directory (it is in
        every report; resolving walks every component of the path)."""
        cwd = os.getcwd()
        memo = self._path_memo
        if memo is None or memo[0] != cwd:
            memo = self._path_memo = (cwd, str(self.path.resolve()))
        return memo[1]

    def _emit(self, event: dict[str, Any]) -> None:
        """Hand an event to ``on_event``; a failing callback is logged, never fatal."""
        if self.on_event is None:
            return
        try:
            self.on_event({"session": self.id, **event})
        except Exception as exc:  # the UI's problem must not cost the agent its context
            get_logger("ctxrules").warning("on_event.error", error=f"{type(exc).__name__}: {exc}")


def _log_prepare(session_id: str, report: dict[str, Any]) -> None:
    """One info line per prepare (``CTXRULES_LOG=info``): tokens and tier before → after, the
    stages that changed something, the time."""
    import logging

    if not structlog_configured() and not logging.getLogger("ctxrules.session").isEnabledFor(logging.INFO):
        return  # nobody reads it: skip building the line (and the logger)
    log = get_logger("ctxrules.session")
    before, after = report["before"], report["after"]
    changed = [
        st["id"]
        for st in report["stages"]
        if st.get("ran") and (st.get("tokens_before") != st.get("tokens_after") or st.get("actions"))
    ]
    log.info(
        "prepare",
        session=session_id,
        tokens=f"{before['tokens']}->{after['tokens']}",
        tier=f"{before['tier']}->{after['tier']}",
        changed=",".join(changed) or "-",
        ms=round(report.get("ms", 0.0), 1),
    )


def _watched(paths: Any) -> tuple[str, ...]:
    """The pack files a hot reload looks at: every one outside the built-in packs' folder."""
    try:
        builtin = os.path.join(os.fspath(rules_dir().resolve()), "")
    except CtxrulesError:  # installed without the folder: every file is the user's
        builtin = None
    names = (os.fspath(p) for p in paths)
    return tuple(n for n in names if builtin is None or not os.path.abspath(n).startswith(builtin))


def _stamps(paths: Any) -> tuple[tuple[str, int, int], ...]:
    out = []
    stat = os.stat
    for p in paths:
        name = p if isinstance(p, str) else os.fspath(p)
        try:
            st = stat(name)
        except OSError:
            out.append((name, -1, -1))
            continue
        out.append((name, st.st_mtime_ns, st.st_size))
    return tuple(out)


def _fingerprint_of(parts: dict[str, str]) -> str:
    return hashlib.sha256("\x1f".join(f"{k}={v}" for k, v in sorted(parts.items())).encode()).hexdigest()[:32]


def _has_system(messages: list[Message]) -> bool:
    return any(m.get("role") == "system" for m in messages)


class _OwnCopies:
    """The output a caller gets: a new list. Messages no stage changed are the caller's own
    objects (the session notices if the caller edits them later); messages a stage made are
    copies, so that editing them cannot corrupt the session's record of its last output.

    Which output messages are not the caller's is remembered from the last turn: when this
    turn's history starts with the same objects as the last one's and the output with the same
    objects as the last output, only the new messages of each are looked at (a warm turn
    handles its tail, not a set of every message's id).

    A client that sends its whole history as new objects on every call (an HTTP proxy, JSON
    decoded per request) gets its own objects too: the session's record of the reused prefix
    holds the objects of an earlier call, and one that equals the caller's message where that
    object was is handed back as the caller's message, not copied."""

    __slots__ = ("_copies", "_foreign", "_history", "_ids", "_origin", "_output")

    def __init__(self) -> None:
        self._history: list[Message] = []
        self._ids: set[int] = set()  # of the messages of self._history (which keeps them alive)
        self._output: list[Message] = []
        self._foreign: list[int] = []  # positions of self._output that are not caller objects
        # id of such a message -> index of the caller's equal message it was handed back as
        self._origin: dict[int, int] = {}
        # id of such a message -> (it, the copy handed back for it last call)
        self._copies: dict[int, tuple[Message, Message]] = {}

    def __call__(self, history: list[Message], output: list[Message]) -> list[Message]:
        try:
            last_ids = self._ids  # _foreign_of may replace it with the ids of this history
            foreign, carried = self._foreign_of(history, output)
            out = list(output)
            origin = self._hand_back(history, output, foreign, carried, out, last_ids)
        except BaseException:
            # _ids may now hold ids of messages not kept: the next call starts over from the
            # whole history (an empty last output never takes the incremental way).
            self._output = []
            raise
        self._history, self._output, self._foreign, self._origin = history, output, foreign, origin[0]
        self._copies = origin[1]
        return out

    def _hand_back(
        self,
        history: list[Message],
        output: list[Message],
        foreign: list[int],
        carried: AbstractSet[int],
        out: list[Message],
        last_ids: set[int],
    ) -> tuple[dict[int, int], dict[int, tuple[Message, Message]]]:
        """Fills the ``foreign`` positions of ``out``: the caller's equal message where the
        object was the caller's (this call's history at the index it had then), else a copy:
        the one handed back for the same message last call when it still equals it (the
        caller did not edit it), else a new one. A compacted session's messages thus keep
        their objects from call to call, like the caller's own: a caller that remembers work
        per message object (token counts, digests) does it once, and no call copies what
        the last one copied.

        The ``carried`` positions were foreign last turn too, with the same objects, and the
        last history is a prefix of this one: one of them that was not handed back then is not
        an object of the last history (it would not have been foreign), so it is copied without
        looking for it there; nor is one whose id ``last_ids`` (the ids of the last history's
        messages, alive in it) does not hold: a message a stage made this turn."""
        origin: dict[int, int] = {}
        copies: dict[int, tuple[Message, Message]] = {}
        handed = self._copies
        before = self._origin
        where: dict[int, int] | None = None
        used: set[int] = set()
        for i in foreign:
            message = output[i]
            key = id(message)
            k = before.get(key)
            if k is None and i not in carried and key in last_ids:
                if where is None:
                    where = {id(m): j for j, m in enumerate(self._history)}
                k = where.get(key)
            # Equal, checked here (a C compare): an id seen before may belong to a new object.
            if k is not None and k < len(history) and k not in used and history[k] == message:
                out[i] = history[k]
                used.add(k)
                origin[key] = k
                continue
            # The copy of last call, unless the caller edited it since (a C compare, cheaper
            # than a new copy; the message itself is the session's and never edited) or this
            # call handed it back already (one object at two places of the output: two copies,
            # as on the first call, or an edit of one would show at the other).
            last = handed.get(key) if key not in copies else None
            if last is not None and last[0] is message and last[1] == message:
                out[i] = last[1]
            else:
                out[i] = clone_json(message)
            if key not in copies:
                copies[key] = (message, out[i])
        return origin, copies

    def _foreign_of(self, history: list[Message], output: list[Message]) -> tuple[list[int], AbstractSet[int]]:
        """The positions of ``output`` that hold no object of ``history``, in order, and those
        of them that were such positions of the last output too (the same objects). A history
        that extends the last one and an output that extends the last one but for a few
        positions (the breakpoints a Claude model's cache stage moves on every call) are
        looked at only where they are new."""
        seen_history, seen_output = self._history, self._output
        changed: list[int] = []
        if (
            seen_output
            and len(seen_history) <= len(history)
            and len(seen_output) <= len(output)
            and all(map(operator.is_, seen_history, history))
        ):
            changed = list(itertools.islice(structure.replaced(seen_output, output), _FEW_REPLACED + 1))
        else:
            seen_output = []
        if not seen_output or len(changed) > _FEW_REPLACED:
            own = self._ids = set(map(id, history))
            theirs = map(own.__contains__, map(id, output))
            return list(itertools.compress(range(len(output)), map(operator.not_, theirs))), frozenset()
        added = set(map(id, history[len(seen_history) :]))
        # A message a stage made last turn stays one unless the caller now passes that very
        # object (say, from last_output()); new output messages are the new history's or new.
        moved = set(changed)
        carried = {i for i in self._foreign if i not in moved and id(output[i]) not in added}
        everyone = self._ids
        everyone |= added  # the last history is a prefix of this one
        fresh = [i for i in changed if id(output[i]) not in everyone]
        fresh.extend(i for i in range(len(seen_output), len(output)) if id(output[i]) not in everyone)
        return sorted(carried.union(fresh)), carried


_FEW_REPLACED = 16
"""How many positions of the last output may hold other objects for a turn's output to be
looked at only there (:meth:`_OwnCopies._foreign_of`)."""


def open_session(
    pack: str,
    model: str,
    *,
    session: str | None = None,
    state: str | None = None,
    window: int | None = None,
    search_path: Sequence[str] = (),
    store: Store | None = None,
) -> Session:
    """What ``ctxrules run`` does to get a session (CLI helper). ``store``: the store ``--store``
    named; with the filesystem store ``session`` is a directory, with the others an id."""
    if window is not None and window <= 0:
        raise UsageError(f"--window must be a positive number of tokens, got {window}")
    engine = Engine.load(pack, search_path=search_path)
    if store is not None and not isinstance(store, FilesystemStore):
        return engine.session(session or "default", store=store, model=model, window=window)
    if store is not None:
        state = str(store.root)
    if session is not None:
        path = Path(session)
    else:
        path = Path(state) / "default" if state else state_root_from_env() / "default"
    # Day and goal ledgers live in the state root: --state, else the session's parent directory.
    opened = engine.session(path, model=model, window=window, state_root=state)
    if store is not None and isinstance(opened.store, FilesystemStore):
        opened.store.lock_timeout_s = store.lock_timeout_s  # file://DIR?lock_timeout_s=N
    return opened
