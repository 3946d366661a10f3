"""``session.complete(...)``: a litellm call with context-overflow recovery.

The call sends what ``prepare`` returns as it is (it carries no field ctxrules adds), with the
request options such as ``prompt_cache_key`` merged in. When the provider answers that the prompt is
too long, an emergency pass runs at the limit the provider named (or, when it names none, at
80 % of what was sent) — the pack's own ``compress.emergency`` stage with its ``with:`` options
(phase 1 cuts long contents to head + tail, phase 2 drops the oldest steps, both into the vault),
then the pack's pairing stage repairs the tool pairs — and the call is retried once (unless the
pass could not make the prompt smaller: the same request would be refused alike). A pack
without a ``compress.emergency`` entry gets the registered stage type with its defaults; when
that plugin is blocked (``CTXRULES_BLOCK_PLUGINS``), there is no recovery and the error stands.
What happened is returned with the response; usage goes to the ledger when the session has one.
``acomplete`` is the same on the event loop; ``stream=True`` (both) returns the chunks with the
same recovery before the first chunk (``ctxrules.runtime.streaming``).
"""

from __future__ import annotations

import dataclasses
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ctxrules.budget.usage import TokenUsage, reply_text
from ctxrules.errors import CompletionFailed, UsageError
from ctxrules.injected import InjectionKey, key_scope
from ctxrules.litellm_objects import as_dicts
from ctxrules.llm import error_text, load_litellm, quiet
from ctxrules.logs import get_logger
from ctxrules.pipeline.context import StageContext
from ctxrules.reply_limits import reading_until
from ctxrules.results import PrepareResult
from ctxrules.runtime.streaming import (
    AsyncCompletionStream,
    CompletionStream,
    record_usage,
    reports_tokens,
    within,
)

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

# The second pattern starts only where a run of digits does: from every digit of a long run it
# ran to the run's end looking for " tokens", quadratic in the provider's text (100,000 digits
# in an error message held `complete` for 40 s).
_LIMIT_PATTERNS = (
    re.compile(r"maximum context length is (\d[\d,]*)", re.I),
    re.compile(r"(?<![\d,])\d[\d,]* tokens? > (\d[\d,]*)", re.I),
    re.compile(r"context (?:window|length)[^\d]{0,40}(\d[\d,]*) tokens", re.I),
)
# Providers name the limit in the first line of their error; the rest may be anything a proxy
# or a server echoes back (the prompt itself).
_LIMIT_TEXT_CHARS = 16_384
_OVERFLOW_TEXT = re.compile(
    r"context[_ ]length|context window|prompt is too long|too many tokens|"
    r"maximum context|reduce the length",
    re.I,
)


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

    async def aprepare(self, messages: Any, tools: list[dict[str, Any]] | None = None) -> PrepareResult: ...

    def record_usage(self, usage: Any, *, model: str | None = None, **options: Any) -> Any: ...


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
    text = str(exc)[:_LIMIT_TEXT_CHARS]
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


def emergency_pass(
    session: OverflowSession, messages: list[dict[str, Any]], tools: list[dict[str, Any]], window: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
    """Shrink ``messages`` to fit ``window`` (minus reserve_output): cut, then drop steps.
    None when the pack has no emergency stage to run."""
    emergency = _pack_stage(session, EMERGENCY_STAGE)
    if emergency is None:
        return None
    budget = dataclasses.replace(
        session.budget, window=window, reserve_output=_reserve(session, window), window_source="override"
    )
    ctx = StageContext(
        stage_id="overflow",
        model=session.model,
        counter=session.counter,
        budget=budget,
        vault=session.vault,
        tools=tools,
        pack=session.engine.pack.data,
        log=get_logger("ctxrules.overflow", session=session.id),
        tier="emergency",
        session_id=session.id,
        target="light",
        hooks=session.engine.registry.hooks,
        registry=session.engine.registry,
    )
    pairing = _pack_stage(session, PAIRING_STAGE)
    with key_scope(session.injection_key):  # what it marks and recognises is the session's
        out = emergency(messages, ctx)
        repaired = pairing(out.messages, ctx) if pairing is not None else out
    actions = [a.as_dict() for a in [*out.actions, *(repaired.actions if repaired is not out else [])]]
    return repaired.messages, actions


def _reserve(session: OverflowSession, window: int) -> int:
    """The output reserve of an emergency pass at ``window``: the session's, at most a quarter,
    and never all of it (a provider naming a limit of 1 token left the pass no usable token)."""
    return max(min(session.budget.reserve_output, max(window // 4, 1), window - 1), 0)


def recovery_window(session: OverflowSession, exc: BaseException, tokens: int) -> int:
    """The window the emergency pass aims at after ``exc`` for a prompt of ``tokens`` (as the
    session counts it): the limit the provider named (80 % of ``tokens`` when it names none),
    never above the session's window. When the usable part of that window already holds the
    prompt, the provider counts it higher than the session's tokenizer does (another tokenizer,
    images): a pass at that limit would cut nothing and the retry would fail alike, so it aims
    at 80 % of ``tokens`` instead."""
    window = min(limit_from(exc) or int(tokens * 0.8), session.budget.window)
    if window - _reserve(session, window) >= tokens:
        window = int(tokens * 0.8)
    return max(window, 1)


def complete(
    session: OverflowSession,
    messages: Any,
    *,
    tools: list[dict[str, Any]] | None = None,
    model: str | None = None,
    stream: bool = False,
    **kwargs: Any,
) -> Completion | CompletionStream:
    """``litellm.completion`` on the prepared messages, with one overflow recovery; with
    ``stream``, a :class:`~ctxrules.runtime.streaming.CompletionStream` of the chunks."""
    litellm = load_litellm()

    # (the caller's history may hold the message object litellm returned last time)
    prepared = session.prepare(as_dicts(messages) if isinstance(messages, list) else messages, tools)
    call_model = model or session.model.name
    sent = prepared.messages
    attempts: list[dict[str, Any]] = []
    limit = timeout_s(kwargs)
    for attempt in range(2):
        options = _options(prepared, kwargs, stream)
        try:
            with quiet(), reading_until(None if limit is None else time.monotonic() + limit):
                response = litellm.completion(model=call_model, messages=sent, **options)
                # A stream's errors may come with its first event: that one is still recoverable.
                first, ended = _first_chunk(response) if stream else (None, False)
        except Exception as exc:
            retry = _after_failure(session, sent, prepared, exc, attempt, attempts)
            if retry is None:
                raise CompletionFailed(_failure(exc, attempts)) from exc
            sent = retry
            continue
        attempts.append({"attempt": attempt + 1})
        if stream:
            return CompletionStream(
                session,
                prepared,
                call_model,
                sent,
                attempts,
                response,
                first,
                ended=ended,
                idle_s=limit,
                own_usage_chunk=_asks_usage(prepared, kwargs),
            )
        attempts[-1]["ok"] = True
        _record(session, call_model, response, ok=True, sent=sent, tools=prepared.tools, attempts=attempts)
        return Completion(response, prepared, recovered=attempt > 0, attempts=attempts)
    raise CompletionFailed("model call failed after the overflow recovery")  # pragma: no cover - loop returns


async def acomplete(
    session: OverflowSession,
    messages: Any,
    *,
    tools: list[dict[str, Any]] | None = None,
    model: str | None = None,
    stream: bool = False,
    **kwargs: Any,
) -> Completion | AsyncCompletionStream:
    """:func:`complete` on the event loop: ``aprepare``, ``litellm.acompletion``, the same
    overflow recovery (its emergency pass off the loop); with ``stream``, an
    :class:`~ctxrules.runtime.streaming.AsyncCompletionStream`."""
    import asyncio

    litellm = await asyncio.to_thread(load_litellm)  # the first import takes seconds
    prepared = await session.aprepare(as_dicts(messages) if isinstance(messages, list) else messages, tools)
    call_model = model or session.model.name
    sent = prepared.messages
    attempts: list[dict[str, Any]] = []
    limit = timeout_s(kwargs)
    for attempt in range(2):
        options = _options(prepared, kwargs, stream)
        try:
            with quiet():
                response = await within(litellm.acompletion(model=call_model, messages=sent, **options), limit)
                first, ended = await within(_afirst_chunk(response), limit) if stream else (None, False)
        except Exception as exc:
            retry = await asyncio.to_thread(_after_failure, session, sent, prepared, exc, attempt, attempts)
            if retry is None:
                raise CompletionFailed(_failure(exc, attempts)) from exc
            sent = retry
            continue
        attempts.append({"attempt": attempt + 1})
        if stream:
            return AsyncCompletionStream(
                session,
                prepared,
                call_model,
                sent,
                attempts,
                response,
                first,
                ended=ended,
                idle_s=limit,
                own_usage_chunk=_asks_usage(prepared, kwargs),
            )
        attempts[-1]["ok"] = True
        _record(session, call_model, response, ok=True, sent=sent, tools=prepared.tools, attempts=attempts)
        return Completion(response, prepared, recovered=attempt > 0, attempts=attempts)
    raise CompletionFailed("model call failed after the overflow recovery")  # pragma: no cover - loop returns


def timeout_s(kwargs: dict[str, Any]) -> float | None:
    """The caller's ``timeout`` when it is a number of seconds (litellm's, also an
    ``httpx.Timeout``: left to litellm alone)."""
    value = kwargs.get("timeout")
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        return None
    return float(value)


def _asks_usage(prepared: PrepareResult, kwargs: dict[str, Any]) -> bool:
    """Whether ctxrules, not the caller, asks a stream for its usage chunk (see _options)."""
    return "stream_options" not in kwargs and "stream_options" not in prepared.request


def _options(prepared: PrepareResult, kwargs: dict[str, Any], stream: bool) -> dict[str, Any]:
    options = {**prepared.request, **kwargs}
    if prepared.tools:
        options.setdefault("tools", prepared.tools)
    if stream:
        options["stream"] = True
        # The final usage chunk is what the ledger records; without it usage is only counted.
        options.setdefault("stream_options", {"include_usage": True})
    return options


def _after_failure(
    session: OverflowSession,
    sent: list[dict[str, Any]],
    prepared: PrepareResult,
    exc: BaseException,
    attempt: int,
    attempts: list[dict[str, Any]],
) -> list[dict[str, Any]] | None:
    """Note a failed attempt; the messages to retry with when it was the first attempt and the
    prompt was too long (after the emergency pass), else ``None`` (raise). A pass that could not
    make the prompt smaller (the pinned messages alone are too long) means no retry: the same
    request would be refused the same way."""
    tokens = session.counter.count_messages(sent, prepared.tools)
    attempts.append({"attempt": attempt + 1, "error": error_text(exc, 500), "tokens": tokens})
    if attempt != 0 or not is_overflow(exc):
        return None
    window = recovery_window(session, exc, tokens)
    recovery = emergency_pass(session, sent, prepared.tools, window)
    if recovery is None:  # no emergency stage to run (its plugin is blocked): the error stands
        return None
    smaller, actions = recovery
    after = session.counter.count_messages(smaller, prepared.tools)
    attempts[-1].update(recovery={"window": window, "actions": actions, "tokens_after": after})
    return smaller if after < tokens else None


def _failure(exc: BaseException, attempts: list[dict[str, Any]]) -> str:
    """The message of the error that stands; it says whether the overflow recovery ran (the
    provider's own text, "maximum context length is N", reads the same either way)."""
    first = attempts[0] if attempts else {}
    if len(attempts) > 1 and "recovery" in first:
        before, after = first["tokens"], first["recovery"]["tokens_after"]
        return f"model call failed after the overflow recovery ({before} -> {after} tokens): {error_text(exc)}"
    message = f"model call failed: {error_text(exc)}"
    last = attempts[-1] if attempts else {}
    if "recovery" in last and last["recovery"]["tokens_after"] >= last["tokens"]:
        message += f" (the emergency pass could not make the {last['tokens']}-token prompt smaller: not retried)"
    return message


def _first_chunk(response: Any) -> tuple[Any, bool]:
    """The stream's first chunk (``(None, True)`` for an empty stream)."""
    try:
        return next(iter(response)), False
    except StopIteration:
        return None, True


async def _afirst_chunk(response: Any) -> tuple[Any, bool]:
    try:
        return await response.__aiter__().__anext__(), False
    except StopAsyncIteration:
        return None, True


def _record(
    session: OverflowSession,
    model: str,
    response: Any,
    *,
    ok: bool,
    sent: Any,
    tools: list[dict[str, Any]],
    attempts: list[dict[str, Any]],
) -> None:
    """Usage into the session's ledger when there is one (failed calls record nothing). A
    response that reports no tokens (a provider that sends no usage: litellm fills in zeros) is
    counted with the session's tokenizer, as a stream without a usage chunk is: the call was
    billed all the same, and a zero would hide it from every budget. Usage the ledger refuses
    (reasoning tokens above the completion tokens, as a provider billing them apart reports)
    never costs the caller the reply it paid for: the call's tokens are counted instead, and the
    attempt says why; nor does a ledger that cannot be written (``streaming.record_usage``)."""
    recorder = getattr(session, "record_usage", None)
    if not ok or recorder is None or response is None:
        return
    if reports_tokens(getattr(response, "usage", None)):
        try:
            record_usage(session, attempts[-1], response, model)  # the ledger reads litellm's ModelResponse itself
            return
        except UsageError as exc:
            attempts[-1]["usage_refused"] = str(exc)[:300]
    text = reply_text(response)
    counter = session.counter
    usage = TokenUsage.of(
        prompt=counter.count_messages(sent, tools), completion=counter.count_text(text) if text else 0
    )
    attempts[-1]["usage_counted"] = True
    record_usage(session, attempts[-1], usage, model, "counted")
