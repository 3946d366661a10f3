"""litellm: a ``CustomLogger`` that runs a pack's pipeline in front of every model call.

- **Proxy** (``litellm --config``): ``async_pre_call_hook`` handles ``completion``/
  ``acompletion`` (OpenAI messages) and ``anthropic_messages`` (``/v1/messages``, through the
  Anthropic codec); any other call type passes through with one debug line.
- **Async SDK** (``litellm.acompletion``, the Router): ``async_pre_call_deployment_hook``.
- **Sync SDK**: litellm's sync path fires neither hook; :func:`completion` prepares the
  messages and calls ``litellm.completion``.

Sessions come from ``litellm_session_id``, ``metadata.session_id`` or the
``x-litellm-trace-id`` header (:func:`ctxrules.integrations.session_name`); proxy sessions live
under a hash of the caller's API key, so two keys never share one. Without an id a request is
compacted on its own: no session state is kept, and what leaves the context goes to the state
root's shared vault. Both hooks may fire for one request (and for ``/v1/messages`` routed to
an OpenAI model the deployment hook fires twice): a request equal to an output this hook
produced for the same session, and a model of the same window and provider (not a router's
fallback to another), passes unchanged, with no state written. A proxy ``model_name``
ctxrules does not know is read as the model its deployments serve (their
``litellm_params.model``). A request the gateway guard refuses is a
``litellm.BadRequestError`` (HTTP 400 from the proxy) and one an exceeded budget refuses a
``litellm.RateLimitError`` (429), both with ctxrules' message; any other failure of ctxrules
passes the request on unchanged with a logged warning (``on_error="pass"``, the default) or
refuses it (``on_error="reject"``: 500, or 400 for a request ctxrules cannot read, a
``MessagesError``) — a request is never lost because ctxrules failed.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

# litellm reaches for the network on import unless told to use its bundled model map.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
try:
    from litellm.integrations.custom_logger import CustomLogger
except ImportError as exc:  # pragma: no cover - litellm is a core dependency; a broken install
    raise ImportError(
        'ctxrules.integrations.litellm needs litellm and its proxy: pip install "ctxrules[litellm-proxy]"'
    ) from exc

from ctxrules.budget.usage import as_mapping, is_failed_response, parse_usage
from ctxrules.errors import MessagesError
from ctxrules.formats import openai as openai_format
from ctxrules.injected import KEY_FILE
from ctxrules.integrations import OpenSessions, session_name
from ctxrules.integrations.sizing import ModelProfile, check_sizing, model_profile
from ctxrules.json_limits import MAX_INT_DIGITS
from ctxrules.litellm_objects import as_dicts
from ctxrules.logs import get_logger
from ctxrules.private_files import ensure_dir
from ctxrules.stores import open_store
from ctxrules.stores.filesystem import FilesystemStore
from ctxrules.stores.memory import MemoryStore
from ctxrules.threads import ForkSafeLock

if TYPE_CHECKING:
    from ctxrules.engine import Engine, Session
    from ctxrules.stores.base import Store

__all__ = ["ContextHook", "completion"]

Kind = Literal["openai", "anthropic"]
_OPENAI_CALLS = frozenset({"completion", "acompletion"})
_ANTHROPIC_CALLS = frozenset({"anthropic_messages"})
_ANTHROPIC_KEYS = ("system", "messages", "tools")
_PRODUCED_LIMIT = 4096
_PROFILES_LIMIT = 1024


class ContextHook(CustomLogger):
    """Run ``pack`` on every request; sessions under ``state`` (the state root), or in ``store``
    (a :class:`ctxrules.stores.Store` or a URL such as ``redis://host:6379/0``, so that proxy
    replicas share sessions; not both).

    ``model``/``window``: the model whose facts (window, tokenizer) apply to every request (a
    proxy ``model_name`` ctxrules does not know is otherwise read as the model its deployments
    serve); ``on_error``: ``pass`` or ``reject``;
    ``max_sessions``: sessions kept open in memory (older ones reopen from disk)."""

    def __init__(
        self,
        pack: str | Path = "builtin:default",
        state: str | Path | None = None,
        *,
        store: Store | str | None = None,
        model: str | None = None,
        window: int | None = None,
        on_error: Literal["pass", "reject"] = "pass",
        max_sessions: int = 256,
    ) -> None:
        super().__init__()
        from ctxrules.engine import Engine, check_path

        if on_error not in ("pass", "reject"):
            raise ValueError(f"on_error must be 'pass' or 'reject', got {on_error!r}")
        if store is not None and state is not None:
            raise ValueError("give state (a directory) or store (a Store or URL), not both")
        check_path(state, "state")  # "" was the current directory
        self.engine: Engine = Engine.load(pack)
        # Checked at start-up: a window or model no request can be sized with failed every
        # request instead, each with a warning (or a 500 with on_error="reject").
        check_sizing(self.engine.pack.data, model or None, window)
        self.model, self.window = model, window
        self.state_root = Path(state if state is not None else ".ctxrules")
        self.store: Store = open_store(store) if store is not None else FilesystemStore(self.state_root)
        # The filesystem store keeps sessions as directories, named as they always were.
        self._files = isinstance(self.store, FilesystemStore)
        if isinstance(self.store, FilesystemStore):
            self.state_root = self.store.root  # store="file://DIR" is state="DIR"
        self.on_error = on_error
        self.max_sessions = max_sessions
        self.stats = {"prepared": 0, "unchanged": 0, "passed": 0, "failed": 0}
        self._sessions: OpenSessions[Session] = OpenSessions(max_sessions)
        self._produced: OrderedDict[str, None] = OrderedDict()
        # Calls (litellm_call_id and request digest) the store failed with on_error="pass": the
        # proxy runs a later hook of the same call (the deployment hook) on the same request,
        # which met the same dead or locked store again — twice the socket or lock timeout, and
        # the warning twice — before the call went on unchanged all the same.
        self._store_failed: OrderedDict[str, None] = OrderedDict()
        # What each model name a request gave is sized by (None: no session can be), so that a
        # proxy alias ctxrules does not know costs one failed registry lookup, not one (some 4
        # ms, its close matches) per request.
        self._profiles: OrderedDict[str, ModelProfile | None] = OrderedDict()
        self._lock = ForkSafeLock()
        self._log = get_logger("ctxrules.litellm")

    # -- the hooks litellm calls (defined on this class: the proxy checks vars(cls)) ------------

    async def async_pre_call_hook(
        self, user_api_key_dict: Any, cache: Any, data: dict[str, Any], call_type: Any
    ) -> dict[str, Any] | None:
        """Proxy: before the router picks a deployment. ``cache`` is the proxy's auth cache;
        nothing is kept there."""
        return await self._hook(data, call_type, api_key=_caller_key(user_api_key_dict, _metadata(data)), proxy=True)

    async def async_pre_call_deployment_hook(self, kwargs: dict[str, Any], call_type: Any) -> dict[str, Any] | None:
        """Async SDK (and the proxy, after a deployment was picked)."""
        metadata = _metadata(kwargs)
        return await self._hook(kwargs, call_type, api_key=_caller_key(metadata.get("user_api_key_auth"), metadata))

    async def async_log_success_event(
        self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        """After a successful call (proxy and async SDK): its usage goes to the session's ledger,
        so the pack's budgets see what the calls cost."""
        try:
            await asyncio.to_thread(self._record, kwargs, response_obj)
        except RuntimeError:
            # No thread to hand it to: the program is ending (``asyncio.run(main())`` returned
            # and litellm's logging worker runs during the interpreter's shutdown). Recorded
            # here, blocking the worker a moment, rather than the call's usage lost.
            self._record(kwargs, response_obj)

    def log_success_event(self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any) -> None:
        """The same for litellm's sync path (``completion`` with this hook in ``litellm.callbacks``)."""
        self._record(kwargs, response_obj)

    def _record(self, kwargs: Mapping[str, Any], response: Any) -> None:
        try:
            params = kwargs.get("litellm_params")
            params = params if isinstance(params, Mapping) else {}
            metadata = {**_metadata(kwargs), **_metadata(params)}
            probe = {
                "litellm_session_id": params.get("litellm_session_id") or kwargs.get("litellm_session_id"),
                "metadata": metadata,
                "proxy_server_request": params.get("proxy_server_request"),
            }
            raw = _session_id(probe)
            if raw is None:
                return  # stateless: there is no session ledger to count against
            key = _caller_key(metadata.get("user_api_key_auth"), metadata)
            model = self.model or str(kwargs.get("model") or "")
            dump = getattr(response, "model_dump", None)  # litellm's pydantic responses
            body = as_mapping(dump() if callable(dump) else response)
            if is_failed_response(body):
                return
            # Read before the session is opened: a record that is refused writes nothing.
            usage = parse_usage(body)
            # The logged model may be the deployment's name: no switch (it would drop the
            # session's in-memory reuse of its last compaction).
            session = self._session(self._session_key(raw, key), model, switch=False)
            session.record_usage(usage)
        except Exception as exc:  # the call succeeded; a ledger problem must not turn it into an error
            self._log.warning("litellm.usage_error", error=_described(exc))

    def _session_key(self, raw: str, api_key: str | None) -> str:
        """The session of a request: namespaced by a hash of the caller's API key, so two keys
        never share a session."""
        tenant = hashlib.sha256(api_key.encode()).hexdigest()[:16] if api_key is not None else None
        if self._files:
            base = self.state_root if tenant is None else self.state_root / "keys" / tenant
            return str(base / session_name(raw))
        name = session_name(raw)
        return self.store.session_key(name if tenant is None else f"{tenant}.{name}")

    # -- the work ------------------------------------------------------------------------------

    async def _hook(
        self, data: dict[str, Any], call_type: Any, *, api_key: str | None, proxy: bool = False
    ) -> dict[str, Any] | None:
        name = str(getattr(call_type, "value", call_type))
        kind: Kind | None = "openai" if name in _OPENAI_CALLS else "anthropic" if name in _ANTHROPIC_CALLS else None
        if kind is None or not isinstance(data.get("messages"), list):
            self.stats["passed"] += 1
            self._log.debug("litellm.passthrough", call_type=name)
            return data
        return await asyncio.to_thread(self.process, data, kind, api_key=api_key, proxy=proxy)

    def process(
        self, data: dict[str, Any], kind: Kind, *, api_key: str | None = None, proxy: bool = False
    ) -> dict[str, Any]:
        """``data`` (a litellm request) with its messages prepared; the same object when it
        equals an output this hook produced for the same session. Raises litellm's
        BadRequestError (guard) or RateLimitError (budget); other failures follow ``on_error``
        (with ``reject``, a malformed request is a BadRequestError, anything else an
        InternalServerError). ``proxy``: the proxy's pre-call hook, whose ``model`` may be a
        ``model_name`` of the proxy's config rather than a model (:meth:`_model`)."""
        from ctxrules.budget.tracker import BudgetExceeded
        from ctxrules.runtime.guards import RequestRejected
        from ctxrules.stores.base import StoreError

        model = self._model(data, proxy)
        if model is None:
            self.stats["passed"] += 1
            self._log.debug(
                "litellm.passthrough",
                kind=kind,
                detail=f"the deployments of {data.get('model')!r} (and its fallbacks) serve no one model "
                "ctxrules knows: left to the deployment hook, which sees the picked deployment's model",
            )
            return data
        profile = self._profile(model)
        digest = self._digest(kind, data, api_key, profile)
        if digest is not None and digest in self._produced:
            self.stats["unchanged"] += 1
            self._log.debug("litellm.unchanged", kind=kind, detail="equals an output of this hook for this session")
            return data
        call = data.get("litellm_call_id")
        failed_key = f"{call}:{digest}" if isinstance(call, str) and call and digest is not None else None
        if failed_key is not None and failed_key in self._store_failed:
            self.stats["passed"] += 1
            self._log.debug("litellm.passthrough", kind=kind, detail="the store failed this call in an earlier hook")
            return data
        started = time.perf_counter()
        try:
            out, label, report = self._prepare(data, kind, api_key, model)
        except RequestRejected as exc:
            raise _litellm_error("BadRequestError", f"ctxrules: {exc}", data) from None
        except BudgetExceeded as exc:
            raise _litellm_error("RateLimitError", f"ctxrules: {exc}", data) from None
        except Exception as exc:
            self.stats["failed"] += 1
            if self.on_error == "reject" and isinstance(exc, MessagesError):
                # The request's own fault (malformed, not JSON data): a 500 would be retried.
                raise _litellm_error("BadRequestError", f"ctxrules: {exc}", data) from None
            if self.on_error == "reject":
                raise _litellm_error("InternalServerError", f"ctxrules failed: {_described(exc)}", data) from None
            if failed_key is not None and isinstance(exc, StoreError):
                self._remember(failed_key, self._store_failed)
            self._log.warning(
                "litellm.error",
                error=_described(exc),
                detail="the request goes on unchanged (on_error: pass)",
            )
            return data
        self.stats["prepared"] += 1
        produced = self._digest(kind, out, api_key, profile)
        if produced is not None:
            self._remember(produced, self._produced)
        self._log.debug(
            "litellm.prepared",
            kind=kind,
            session=label,
            tokens_before=report["before"]["tokens"],
            tokens_after=report["after"]["tokens"],
            ms=round((time.perf_counter() - started) * 1000, 1),
        )
        return out

    def _model(self, data: Mapping[str, Any], proxy: bool) -> str | None:
        """The model whose facts apply: ``model=``, else the request's. In the proxy's pre-call
        hook the request names a ``model_name`` of the proxy's config, which need not be a
        model (``my-fast`` for ``openai/gpt-4o``): one ctxrules does not know (no registry
        entry, no ``models:`` entry of the pack, no ``window=``) is read as its router reads it,
        as the model its deployments serve (``litellm_params.model``, else
        ``model_info.base_model``). None when they serve no one model ctxrules knows (one
        unknown, or a group of several models: prepared for one, a request routed to another
        would carry the wrong provider's call options): the deployment hook, which litellm runs
        with the picked deployment's model, prepares the request (or reports that model
        unknown)."""
        name = self.model or str(data.get("model") or "")
        if not proxy or self.model:
            return name
        if self._knows(name):
            chosen: str | None = name
        else:
            served = {next((m for m in models if self._knows(m)), None) for models in _deployments(name)}
            chosen = served.pop() if len(served) == 1 else None
        if chosen is None:
            return None
        # The router's fallbacks send the same request on to other groups when this one fails:
        # prepared here for one model, it reached a model of another window or provider as it
        # was. Left to the deployment hook then, which prepares each deployment's call for it.
        profile = self._profile(chosen)
        groups = _fallback_groups(name, data)
        if groups is None:
            return None
        for group in groups:
            for models in _deployments(group) or [[group]]:
                other = next((m for m in models if self._knows(m)), None)
                if other is None or self._profile(other) != profile:
                    return None
        return chosen

    def _knows(self, name: str) -> bool:
        """Whether a session can be sized for ``name`` as it is (what ``Session`` asks)."""
        return self._profile(name) is not None

    def _profile(self, name: str) -> ModelProfile | None:
        """:func:`model_profile` of ``name`` under this hook's pack and window, remembered for the
        last ``_PROFILES_LIMIT`` names (the pack and the window are the hook's for its life)."""
        with self._lock:
            if name in self._profiles:
                self._profiles.move_to_end(name)
                return self._profiles[name]
        profile = model_profile(self.engine.pack.data, name, self.window)
        with self._lock:
            self._profiles[name] = profile
            while len(self._profiles) > _PROFILES_LIMIT:
                self._profiles.popitem(last=False)
        return profile

    def _prepare(
        self, data: dict[str, Any], kind: Kind, api_key: str | None, model: str
    ) -> tuple[dict[str, Any], str, dict[str, Any]]:
        raw = _session_id(data)
        if raw is None:
            return self._stateless(data, kind, model)
        key = self._session_key(raw, api_key)
        out, report = _apply(self._session(key, model), data, kind)
        label = str(Path(key).relative_to(self.state_root)) if self._files else key
        return out, label, report

    def _stateless(self, data: dict[str, Any], kind: Kind, model: str) -> tuple[dict[str, Any], str, dict[str, Any]]:
        from ctxrules.vault import Vault

        if not self._files:
            # A one-off session in memory, gone with the call: nothing of the conversation stays
            # in the shared store but what leaves the context, in a vault every worker reads (so
            # its markers resolve), and the store's key signs (so injected messages read as such
            # on the next request, whichever worker serves it).
            memory = MemoryStore()
            shared = self.store.secret(None, KEY_FILE, lambda: secrets.token_bytes(32))
            memory.secret(None, KEY_FILE, lambda: shared)
            session = self.engine.session("stateless", store=memory, model=model, window=self.window)
            session.vault = Vault.of(self.store, self.store.session_key("stateless"))
            out, report = _apply(session, data, kind)
            return out, "(stateless)", report
        scratch = self.state_root / ".stateless"
        ensure_dir(scratch, inside=self.state_root)  # a link planted for it is refused
        path = Path(tempfile.mkdtemp(dir=scratch))
        try:
            session = self.engine.session(path, model=model, window=self.window, state_root=self.state_root)
            session.vault = Vault(self.state_root / "vault")  # what leaves the context stays findable
            out, report = _apply(session, data, kind)
            return out, "(stateless)", report
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def _session(self, key: str, model: str, *, switch: bool = True) -> Session:
        def opener() -> Session:
            if self._files:
                path = Path(key)
                # Opened first: a model it cannot size (unknown, empty) leaves no directory.
                opened = self.engine.session(path, model=model, window=self.window, state_root=self.state_root)
                # Every folder below the state root (``keys/``, the tenant's) is ctxrules' own: a
                # link planted there would receive the conversations of every session under it.
                ensure_dir(path, inside=self.state_root)
                return opened
            return self.engine.session(key, store=self.store, model=model, window=self.window)

        session = self._sessions.get(key, opener)
        if switch and session.model.name != model:
            session.switch(model=model, window=self.window)
        return session

    def _digest(
        self, kind: Kind, data: Mapping[str, Any], api_key: str | None, profile: ModelProfile | None
    ) -> str | None:
        """What the request's session, messages and tools, and the profile of the model it goes
        to, hash to; None for a request no digest can be taken of (nested past Python's stack,
        a key no JSON has, a session id that is the request's error): it is then not one this
        hook made.

        The digest lets the later hooks of one call (the proxy runs the pre-call and the
        deployment hook, retries and fallbacks run the deployment hook again) pass the output
        of the first on, not prepare it twice. The session is part of it: another session's
        request equal to that output (the same first message of a new conversation) is not
        one this hook made for it — passed unchanged, that session kept no turn and its
        budget was never checked. So is the model's profile: an output prepared for one model
        is not one made for a model of another window or provider, which a router's fallback
        sends it to (it went on with the first model's window, cache markers and options)."""
        # The tools too: a request with this output's messages and other tools is not one
        # this hook made (its tools were never checked nor normalized).
        keys = _ANTHROPIC_KEYS if kind == "anthropic" else ("messages", "tools")
        view: dict[str, Any] = {k: data.get(k) for k in keys}
        try:
            raw = _session_id(data)
        except MessagesError:
            return None
        tenant = hashlib.sha256(api_key.encode()).hexdigest()[:16] if api_key is not None else None
        # The id as given, with the caller's key: what _session_key names the session by.
        view[" session"] = [tenant, raw]
        view[" model"] = profile
        try:
            text = json.dumps(view, sort_keys=True, ensure_ascii=False, default=str)
        except (RecursionError, ValueError, TypeError):
            return None
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()

    def _remember(self, digest: str, into: OrderedDict[str, None]) -> None:
        with self._lock:
            into[digest] = None
            into.move_to_end(digest)
            while len(into) > _PRODUCED_LIMIT:
                into.popitem(last=False)


def _apply(session: Session, data: dict[str, Any], kind: Kind) -> tuple[dict[str, Any], dict[str, Any]]:
    if kind == "anthropic":
        # litellm passes every parameter of anthropic_messages, the unset ones as None (and
        # drops them before the call): a None system or tools list is one not given.
        body = {k: data[k] for k in _ANTHROPIC_KEYS if data.get(k) is not None}
        result = session.prepare(body, format="anthropic")
        out = {k: v for k, v in data.items() if k not in _ANTHROPIC_KEYS}
        out.update(result.body)
        return out, result.report
    tools = data.get("tools")
    # Anything but a list (none given to completion(), None) is for prepare to refuse: the
    # request's error (MessagesError), not ctxrules failing.
    messages = data.get("messages")
    result = session.prepare(
        as_dicts(messages) if isinstance(messages, list) else messages, tools if isinstance(tools, list) else None
    )
    # The call options the pack adds (prompt_cache_key, ...) where the caller set none.
    out = openai_format.encode(result.messages, result.tools if isinstance(tools, list) else None, data, result.request)
    return out, result.report


def _deployments(name: str) -> list[list[str]]:
    """The deployments the proxy's router serves ``name`` with, each as the names of its model
    (``litellm_params.model``, then ``model_info.base_model``: an Azure deployment's name says
    nothing of its model); none outside the proxy or for a name it does not route."""
    server = sys.modules.get("litellm.proxy.proxy_server")  # the proxy only: never imported here
    router = getattr(server, "llm_router", None)
    if router is None:
        return []
    try:
        registry = getattr(router, "registry", None)  # litellm 1.110+; get_model_list warns there
        found = registry().deployments(name) if callable(registry) else router.get_model_list(model_name=name)
    except Exception as exc:  # the router's own trouble: the deployment hook still sees the model
        get_logger("ctxrules.litellm").debug("litellm.router_error", error=_described(exc))
        return []
    out: list[list[str]] = []
    for deployment in found if isinstance(found, list | tuple) else ():
        if not isinstance(deployment, Mapping):
            continue
        names = []
        for part, key in (("litellm_params", "model"), ("model_info", "base_model")):
            section = deployment.get(part)
            value = section.get(key) if isinstance(section, Mapping) else None
            if isinstance(value, str) and value:
                names.append(value)
        out.append(names)
    return out


def _caller_key(auth: Any, metadata: Mapping[str, Any]) -> str | None:
    """The caller's API key, which proxy sessions are namespaced by: the one every hook of a
    request derives, so that the request lands in one session. ``auth``: litellm's
    ``UserAPIKeyAuth`` of the request (the pre-call hook's argument; the proxy carries the same
    object in the request's metadata, ``user_api_key_auth``, to the deployment hook and the
    success callback); ``metadata``: the request's, read when there is no such object (the
    SDK, whose caller may set ``user_api_key_hash`` itself).

    The key as litellm logs it (``user_api_key_hash``): a login's session token
    (``litellm-proxy login``) by its key alias, the same for every login of that user (the
    token itself is new at each login), and any other key by its hash. The pre-call hook read
    the token and the deployment hook the alias, so a login's request was prepared twice, in
    two sessions, and its usage counted in the one that did not check the budget."""
    if auth is not None and not isinstance(auth, Mapping):
        alias = getattr(auth, "key_alias", None)
        if getattr(auth, "is_session_token", False) is True and isinstance(alias, str) and alias:
            return alias
        key = getattr(auth, "api_key", None) or getattr(auth, "token", None)
    else:
        key = metadata.get("user_api_key_hash") or metadata.get("user_api_key")
    return str(key) if key else None


_FALLBACK_KINDS = ("fallbacks", "context_window_fallbacks", "content_policy_fallbacks")


def _fallback_groups(name: str, data: Mapping[str, Any]) -> list[str] | None:
    """The model groups the proxy's router may send a request for the group ``name`` on to:
    the request's own ``fallbacks`` and the router's fallbacks of every kind (an entry ``"*"``
    is every group's), and theirs in turn; none outside the proxy; None when the router's
    cannot be read."""
    server = sys.modules.get("litellm.proxy.proxy_server")  # the proxy only: never imported here
    router = getattr(server, "llm_router", None)
    try:
        settings = getattr(router, "settings", None)  # litellm 1.110+; the attributes warn there
        source = settings() if callable(settings) else router
        tables = [getattr(source, kind, None) for kind in _FALLBACK_KINDS] if source is not None else []
    except Exception as exc:  # the router's own trouble: left to the deployment hooks, which see each call
        get_logger("ctxrules.litellm").debug("litellm.router_error", error=_described(exc))
        return None
    found: list[str] = []
    own = data.get("fallbacks")
    for target in own if isinstance(own, list) else ():
        model = target.get("model") if isinstance(target, Mapping) else target
        if isinstance(model, str) and model and model not in found:
            found.append(model)
    pending, seen = [name, *found], {name}
    while pending:
        group = pending.pop()
        for table in tables:
            for entry in table if isinstance(table, list) else ():
                if not isinstance(entry, Mapping):
                    continue
                for key in (group, "*"):
                    targets = entry.get(key)
                    for target in targets if isinstance(targets, list) else ():
                        if isinstance(target, str) and target not in seen:
                            seen.add(target)
                            pending.append(target)
                            if target not in found:
                                found.append(target)
    return found


def _metadata(data: Mapping[str, Any]) -> dict[str, Any]:
    """litellm's metadata of a call: ``metadata`` with ``litellm_metadata`` over it. An
    ``anthropic_messages`` call keeps litellm's own (the caller's key hash) in
    ``litellm_metadata``, as ``metadata`` is the Anthropic request's field: read alone, the
    first hid the key from the deployment hook, which then took the call for another session
    than the pre-call hook's (one outside the caller's key) and prepared its output again."""
    out: dict[str, Any] = {}
    for key in ("metadata", "litellm_metadata"):
        value = data.get(key)
        if isinstance(value, Mapping):
            out.update(value)
    return out


def _session_id(data: Mapping[str, Any]) -> str | None:
    """``litellm_session_id``, else ``metadata.session_id``, else the ``x-litellm-trace-id``
    header of the proxied request."""
    found = _as_id(data.get("litellm_session_id"))
    if found is not None:
        return found
    for key in ("metadata", "litellm_metadata"):
        value = data.get(key)
        if isinstance(value, Mapping) and (found := _as_id(value.get("session_id"))) is not None:
            return found
    request = data.get("proxy_server_request")
    headers = request.get("headers") if isinstance(request, Mapping) else None
    if isinstance(headers, Mapping):
        for name, value in headers.items():
            if isinstance(name, str) and name.lower() == "x-litellm-trace-id" and isinstance(value, str) and value:
                return value
    return None


def _as_id(value: object) -> str | None:
    """A session id given as a non-empty string or an integer (a JSON body's ``"session_id":
    42`` names the session ``42``; it ran stateless before), else ``None``. An integer too long
    to write out is the request's error (:class:`MessagesError`), as it is in a message."""
    if isinstance(value, str):
        return value or None
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return str(value)
        except ValueError:  # Python writes out no integer of more than 4300 digits
            raise MessagesError(f"session_id: an integer of more than {MAX_INT_DIGITS} digits") from None
    return None


def _described(exc: BaseException) -> str:
    """``exc`` as ``Class: message`` for the caller and the log, the class the nearest public
    one: a module's private subclass (the Redis store's ``_Unreachable``) is named as the
    documented error it is (``StoreUnavailable``), not as a name no user can look up."""
    public = next((c for c in type(exc).__mro__ if not c.__name__.startswith("_")), type(exc))
    return f"{public.__name__}: {exc}"


def _litellm_error(name: str, message: str, data: Mapping[str, Any]) -> Exception:
    import litellm

    cls = getattr(litellm, name)
    error: Exception = cls(message=message, model=str(data.get("model") or ""), llm_provider="ctxrules")
    return error


_DEFAULT: ContextHook | None = None
_DEFAULT_LOCK = ForkSafeLock()


def completion(*args: Any, hook: ContextHook | None = None, **kwargs: Any) -> Any:
    """``litellm.completion`` with the messages prepared first (litellm's sync path fires no
    hook). ``hook``: the :class:`ContextHook` to use; default one built from ``CTXRULES_PACK``
    (default ``builtin:default``) and ``CTXRULES_STORE`` (a store URL), else ``CTXRULES_STATE``
    (default ``.ctxrules``)."""
    import litellm

    global _DEFAULT
    if hook is None:
        with _DEFAULT_LOCK:
            if _DEFAULT is None:
                pack = os.environ.get("CTXRULES_PACK", "builtin:default")
                url = os.environ.get("CTXRULES_STORE")
                _DEFAULT = (
                    ContextHook(pack, store=url)
                    if url
                    else ContextHook(pack, os.environ.get("CTXRULES_STATE", ".ctxrules"))
                )
            hook = _DEFAULT
    if args:
        kwargs.setdefault("model", args[0])
        if len(args) > 1:
            kwargs.setdefault("messages", args[1])
    started = time.perf_counter()
    data = hook.process(kwargs, "openai")
    hook._log.debug("litellm.prepared", ms=round((time.perf_counter() - started) * 1000, 1))
    return litellm.completion(**data)
