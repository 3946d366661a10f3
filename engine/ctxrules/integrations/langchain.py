"""A LangChain v1 agent middleware that runs ``Session.prepare`` before every model call.

::

    from langchain.agents import create_agent
    from ctxrules.integrations.langchain import CtxrulesMiddleware

    agent = create_agent(model, tools=tools, middleware=[CtxrulesMiddleware(model="gpt-4o")])
    agent.invoke({"messages": [...]}, {"configurable": {"thread_id": "run-42"}})

The middleware works in ``wrap_model_call`` / ``awrap_model_call``: the graph state keeps the
full history, and only the model sees the prepared one. The session is the run's ``thread_id``
(used as it is when it matches ``[A-Za-z0-9._-]{1,128}``, else its sha256), a directory under
the state root. Messages no stage changed reach the model as the original LangChain objects; the
rest are converted with ``langchain_core``'s converters, with the id of the message each stands
for (found by position); messages ctxrules injected have none. The system prompt
(``request.system_message``) goes through ``prepare`` as the leading system message, so it counts
and stays pinned. With ``recall=True`` (the default) the middleware also gives the agent the
recall tool (``session.recall``), from the first call on, so the tools layer of the cached
prefix never changes mid-session. The pack decides everything else. Needs ``ctxrules[langchain]``.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctxrules.engine import Engine, check_path
from ctxrules.errors import CtxrulesError, MessagesError, UsageError
from ctxrules.injected import key_scope
from ctxrules.integrations import OpenSessions, session_name
from ctxrules.integrations.sizing import check_sizing
from ctxrules.messages import is_injected
from ctxrules.recall import PARAMETERS, RecallSettings
from ctxrules.stages.normalize_tool_pairs import DERIVED_ID_PREFIX
from ctxrules.stores import open_store

if TYPE_CHECKING:
    from ctxrules.stores.base import Store

try:
    from langchain.agents.middleware import AgentMiddleware
    from langchain_core.messages import (
        BaseMessage,
        HumanMessage,
        SystemMessage,
        ToolMessage,
        convert_to_messages,
        convert_to_openai_messages,
    )
    from langchain_core.tools import StructuredTool, ToolException
except ImportError as exc:  # pragma: no cover - only without the extra
    raise ImportError('the LangChain middleware needs LangChain v1: pip install "ctxrules[langchain]"') from exc

__all__ = ["CtxrulesMiddleware"]

DEFAULT_SESSION = "default"


def _thread_id(request: Any) -> str | None:
    info = getattr(getattr(request, "runtime", None), "execution_info", None)
    thread = _named(getattr(info, "thread_id", None))
    return thread if thread is not None else _config_thread_id()


def _config_thread_id() -> str | None:
    try:
        from langgraph.config import get_config

        config = get_config()
    except (ImportError, RuntimeError):
        return None
    return _named((config.get("configurable") or {}).get("thread_id"))


def _named(thread: Any) -> str | None:
    """A thread id as a string; None when there is none. Any value but None and "" is one: a
    thread 0 is not the runs without a thread id."""
    return None if thread is None or thread == "" else str(thread)


def _tool_dict(tool: Any) -> dict[str, Any] | None:
    """An OpenAI tool definition of a LangChain tool (for counting its tokens)."""
    if isinstance(tool, dict):
        return tool
    try:
        from langchain_core.utils.function_calling import convert_to_openai_tool

        return convert_to_openai_tool(tool)
    except Exception:  # a tool LangChain itself cannot describe is not ours to count
        return None


class CtxrulesMiddleware(AgentMiddleware):
    """``prepare`` before every model call of a LangChain v1 agent (see the module docstring).

    :param pack: the rule pack (a path or ``builtin:NAME``).
    :param model: the model name ctxrules counts and sizes the window for (the LangChain model
        object does not say it reliably).
    :param state: the state root; each thread is a session directory under it.
    :param store: instead of ``state``, a :class:`ctxrules.stores.Store` or a store URL
        (``redis://host:6379/0``): each thread is a session id in it, shared by every worker.
    :param window: override the model's window.
    :param session_id: the session to use when a run has no ``thread_id``.
    :param recall: give the agent the recall tool and answer its calls.
    :param max_sessions: threads whose sessions stay open in memory (the least recently used one
        is let go; it reopens from the state, warm, on its next call).
    """

    def __init__(
        self,
        pack: str | Path = "builtin:default",
        *,
        model: str,
        state: str | Path | None = None,
        store: Store | str | None = None,
        window: int | None = None,
        session_id: str = DEFAULT_SESSION,
        recall: bool = True,
        max_sessions: int = 256,
    ) -> None:
        super().__init__()
        if store is not None and state is not None:
            raise ValueError("give state (a directory) or store (a Store or URL), not both")
        # An empty state ("" from an unset variable) was the current directory: threads named
        # `src` or `tests` became session directories beside the application's own folders.
        check_path(state, "state")
        if not isinstance(session_id, str) or not session_id:
            raise UsageError(f"session_id must be a non-empty string, not {session_id!r}")
        self.engine = Engine.load(pack)
        # Checked here, as the litellm hook does: a window or model no call can be sized with
        # failed the agent's first model call (and every one after it) instead.
        check_sizing(self.engine.pack.data, model, window)
        self.model_name = model
        self.state = Path(state if state is not None else ".ctxrules")
        self.store: Store | None = open_store(store) if store is not None else None
        self.window = window
        self.default_session = session_name(session_id)
        self._sessions: OpenSessions[Any] = OpenSessions(max_sessions)
        self.tools = [self._recall_tool()] if recall else []

    # --- sessions ----------------------------------------------------------------------------

    def session_for(self, thread_id: str | None) -> Any:
        """The ctxrules session of a thread (opened once per middleware and thread)."""
        name = session_name(thread_id) if thread_id else self.default_session

        def opener() -> Any:
            if self.store is not None:
                return self.engine.session(name, store=self.store, model=self.model_name, window=self.window)
            return self.engine.session(
                self.state / name, model=self.model_name, window=self.window, state_root=self.state
            )

        return self._sessions.get(name, opener)

    # --- the model call ----------------------------------------------------------------------

    def _prepare(self, request: Any) -> Any:
        session = self.session_for(_thread_id(request))
        messages: list[BaseMessage] = list(request.messages)
        converted = [_with_invalid_calls(_to_openai(m, f"message {i}"), m) for i, m in enumerate(messages)]
        system = request.system_message
        system_dict: dict[str, Any] | None = None
        if system is not None:
            system_dict = _to_openai(system, "the system message")
        tools = [t for t in (_tool_dict(tool) for tool in request.tools or []) if t is not None]
        result = session.prepare(converted if system_dict is None else [system_dict, *converted], tools=tools)
        prepared = result.messages
        new_system = system
        if system_dict is not None and prepared and prepared[0].get("role") == "system":
            if prepared[0] is not system_dict:
                new_system = SystemMessage(content=prepared[0].get("content") or "", id=system.id)
            prepared = prepared[1:]
        out: list[BaseMessage] = []
        with key_scope(session.injection_key):  # what this session injected, under its key
            sources = _sources(prepared, converted)
        for msg, source in zip(prepared, sources, strict=True):
            if source is not None and msg is converted[source]:
                out.append(messages[source])
                continue
            (made,) = convert_to_messages([msg])
            if source is not None:
                _keep_own_fields(made, messages[source])
            out.append(made)
        return request.override(messages=out, system_message=new_system)

    def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        return handler(self._prepare(request))

    async def awrap_model_call(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        # prepare is CPU work on local files: off the event loop, so other runs go on.
        prepared = await asyncio.to_thread(self._prepare, request)
        return await handler(prepared)

    # --- the recall tool ---------------------------------------------------------------------

    def _recall_tool(self) -> Any:
        settings = RecallSettings.from_pack(self.engine.pack.data)

        # Every parameter optional and extra ones taken: the tool's schema (a dict) is not
        # enforced before the call, so a model's call without ``id`` or with a key of its own
        # reached this function as a TypeError that ended the agent's run. session.recall says
        # what is missing, as the tool's error result.
        def recall(id: Any = None, lines: Any = None, **_ignored: Any) -> str:
            arguments: dict[str, Any] = {"id": id}
            if lines:
                arguments["lines"] = lines
            try:
                answer: str = self.session_for(_config_thread_id()).recall(arguments)
            except CtxrulesError as exc:  # the call, the vault or the store: the reason is the result
                raise ToolException(str(exc)) from None
            return answer

        return StructuredTool.from_function(
            func=recall,
            name=settings.name,
            description=settings.description,
            args_schema=dict(PARAMETERS),
            handle_tool_error=True,
        )


def _to_openai(message: Any, where: str) -> dict[str, Any]:
    """``message`` as an OpenAI message dict (``langchain_core``'s converter). A standard content
    block the converter has no Chat Completions form for (``video``, ``text-plain``, a ``file``
    by URL: what Gemini or Claude take) goes through as it is, an opaque part, rather than
    ending the agent's run. What the converter cannot take otherwise (a ``RemoveMessage``, which
    only the graph's reducer reads; a content block without a ``type``) raised its own
    ValueError or KeyError from deep inside it: it is a :class:`MessagesError` naming the
    message instead."""
    try:
        converted: dict[str, Any] = convert_to_openai_messages(message)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        opaque = _with_opaque_blocks(message)
        if opaque is not None:
            return opaque
        detail = f"no key {exc.args[0]!r} in one of its parts" if isinstance(exc, KeyError) and exc.args else exc
        kind = type(message).__name__
        raise MessagesError(f"{where} ({kind}): LangChain cannot convert it to a chat message: {detail}") from None
    return converted


_OPAQUE = "ctxrules-opaque-block-"


def _with_opaque_blocks(message: Any) -> dict[str, Any] | None:
    """``message`` converted with each content block the converter refuses on its own kept as
    it is: such a block is swapped for a stand-in of a type the converter passes through
    untouched, and put back in the result. None when no block is refused on its own (the
    message's failure is not a block's)."""
    content = getattr(message, "content", None)
    if not isinstance(content, list) or not hasattr(message, "model_copy"):
        return None
    kept: dict[str, Any] = {}
    standins: list[Any] = []
    for block in content:
        if isinstance(block, dict) and isinstance(block.get("type"), str) and _refused(block):
            name = f"{_OPAQUE}{len(kept)}"
            kept[name] = block
            standins.append({"type": name})
        else:
            standins.append(block)
    if not kept:
        return None
    try:
        converted: dict[str, Any] = convert_to_openai_messages(message.model_copy(update={"content": standins}))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    parts = converted.get("content")
    if not isinstance(parts, list):
        return None
    restored = [kept.get(str(p.get("type")), p) if isinstance(p, dict) else p for p in parts]
    if sum(isinstance(p, dict) and p.get("type") in kept for p in parts) != len(kept):
        return None  # the converter dropped or merged a stand-in: not what this can undo
    return {**converted, "content": restored}


def _refused(block: dict[str, Any]) -> bool:
    """Whether the converter refuses ``block`` alone, in a user message."""
    try:
        convert_to_openai_messages(HumanMessage(content=[block]))
    except (ValueError, TypeError, KeyError, AttributeError):
        return True
    return False


def _sources(prepared: list[dict[str, Any]], converted: list[dict[str, Any]]) -> list[int | None]:
    """For each message ``prepare`` returned, the index of the converted message it stands for.

    A message no stage changed is the converted object itself. A changed one is looked for
    between the unchanged ones around it, from the newest back (stages remove old messages,
    not new ones), among those not taken: the same role and call id, or the id the pairing stage
    renamed (a reused ``c1`` is ``c1_2``, in the call and in its result); for a message without
    calls, one without. A message ctxrules injected (notes, summaries, placeholders,
    interrupted results) stands for none: ``None``, so it never takes an agent message's id.
    """
    where = {id(m): i for i, m in enumerate(converted)}
    out = [where.get(id(m)) for m in prepared]
    taken = {j for j in out if j is not None}
    starts: list[int] = []  # for each position: just after the unchanged message before it
    start = 0
    for j in out:
        starts.append(start)
        start = start if j is None else j + 1
    stop = len(converted)
    for p in range(len(prepared) - 1, -1, -1):
        msg, source = prepared[p], out[p]
        if source is not None or is_injected(msg):
            stop = stop if source is None else source
            continue
        role, calls = msg.get("role"), _call_ids(msg)
        for j in range(stop - 1, starts[p] - 1, -1):
            other = converted[j]
            if j in taken or other.get("role") != role:
                continue
            if _renamed_from(calls, _call_ids(other)) if calls else not _call_ids(other):
                out[p], stop = j, j
                taken.add(j)
                break
    return out


def _keep_own_fields(made: BaseMessage, original: BaseMessage) -> None:
    """``made`` (converted back from a changed message) keeps what the OpenAI form has no field
    for: the id of the message it stands for and, for a tool result, its ``status`` (an error
    result goes to Anthropic models as ``is_error``) and ``artifact``."""
    made.id = original.id
    if isinstance(made, ToolMessage) and isinstance(original, ToolMessage):
        made.status = original.status
        made.artifact = original.artifact


def _call_ids(msg: dict[str, Any]) -> list[str]:
    """A result's ``tool_call_id``, or an assistant message's call ids (``""`` for a call
    without one: LangChain allows ``id=None``)."""
    if msg.get("role") == "tool":
        return [_an_id(msg.get("tool_call_id"))]
    return [_an_id(call.get("id")) for call in msg.get("tool_calls") or () if isinstance(call, dict)]


def _an_id(value: object) -> str:
    return value if isinstance(value, str) else "" if value is None else str(value)


def _renamed_from(calls: list[str], before: list[str]) -> bool:
    """Whether one of ``calls`` is one of ``before``, or its rename ``<id>_<n>``, or the id the
    pairing stage derived for one of ``before`` that had none."""
    return any(
        (c == b or re.fullmatch(re.escape(b) + r"_[0-9]+", c)) if b else c.startswith(DERIVED_ID_PREFIX)
        for c in calls
        for b in before
    )


def _with_invalid_calls(converted: dict[str, Any], message: Any) -> dict[str, Any]:
    """``converted`` with the message's ``invalid_tool_calls`` (calls whose arguments did not
    parse) as tool calls, their arguments the raw text: what langchain-openai sends for them.
    ``convert_to_openai_messages`` leaves them out, and the pairing stage then saw their
    results as orphans and removed them, while the unconverted message still carried the calls."""
    invalid = getattr(message, "invalid_tool_calls", None)
    if not invalid:
        return converted
    calls = list(converted.get("tool_calls") or [])
    have = {c.get("id") for c in calls if isinstance(c, dict)}
    for call in invalid:
        ident = call.get("id") if isinstance(call, dict) else None
        if not isinstance(ident, str) or ident in have:
            continue
        args = call.get("args")
        calls.append(
            {
                "id": ident,
                "type": "function",
                "function": {"name": str(call.get("name") or ""), "arguments": args if isinstance(args, str) else ""},
            }
        )
        have.add(ident)
    return {**converted, "tool_calls": calls} if calls else converted
