"""Prompt-cache warm-up and idle keep-alive: small litellm calls that keep a prefix hot.

A provider keeps a cached prefix for about five minutes after its last use. Two moments make
the next real call pay full price: a fresh prefix (session start, or right after a compaction
rewrote the messages) and a pause longer than the TTL. This module covers both:

- :func:`send_probe` sends the prefix once with ``max_tokens`` 1 (0 where a provider accepts
  it: :data:`ZERO_MAX_TOKENS_PROVIDERS`), so the provider writes (or refreshes) its cache
  entry; it returns a :class:`Probe` with the tokens read from and written to the cache and the
  probe's cost. A failure is logged as a warning and returned in the probe (``ok`` false,
  ``error``, ``status``); with ``check=True`` it raises :class:`ProbeFailed` instead;
- :class:`KeepAlive` runs in a background thread: it warms the prefix after session start and
  after a compaction (:meth:`KeepAlive.after_prepare` tells them apart from the run report),
  and while the session is idle sends a probe every ``interval_s`` (240 s: below the 5-minute
  TTL). A call in flight (``with keepalive.active():``) pauses it, the idle timer restarts when
  the call ends, and :meth:`KeepAlive.stop` (or leaving ``with KeepAlive(...)``) ends it. After
  ``max_idle_s`` without activity it stops probing until the next call: a forgotten session
  does not pay for keep-alives forever. A probe the provider *rejects* (an HTTP 4xx other than
  408/409/429: the request itself is wrong, so the real calls will fail the same way) stops the
  probing until the next :meth:`KeepAlive.update`, and is raised as :class:`ProbeFailed` from
  the caller's next ``update``/``after_prepare`` (and from leaving the ``with``) — once;
  transient failures (timeouts, 5xx, rate limits) are logged and retried on schedule.

A probe is one request (no blind retries: each would pay for the prefix again) and fails after
``timeout_s`` however the server stalls, so neither the keep-alive thread nor ``stop()`` hangs.

``import litellm`` is slow and reaches for the network unless ``LITELLM_LOCAL_MODEL_COST_MAP``
is set, so it is imported on the first probe only, with that variable set first.
``time_scale`` runs the whole schedule on a scaled clock (tests: 0.001 turns 240 s into 0.24 s);
reported times are in unscaled seconds.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ctxrules.budget.tracker import SessionLedger
    from ctxrules.budget.usage import TokenUsage

from ctxrules.errors import CtxrulesError
from ctxrules.llm import call_within, error_text
from ctxrules.llm import load_litellm as load
from ctxrules.logs import get_logger
from ctxrules.models import lookup_model
from ctxrules.threads import helper_thread

__all__ = [
    "ZERO_MAX_TOKENS_PROVIDERS",
    "KeepAlive",
    "Probe",
    "ProbeFailed",
    "load_litellm",
    "probe_cost",
    "probe_messages",
    "send_probe",
]

# Providers whose API accepts max_tokens=0 (a pure prefill); the others need at least 1.
ZERO_MAX_TOKENS_PROVIDERS: frozenset[str] = frozenset()
DEFAULT_INTERVAL_S = 240.0
DEFAULT_MAX_IDLE_S = 3600.0
PROBE_USER_TEXT = "."


@dataclass(frozen=True)
class Probe:
    """One warm-up or keep-alive call and what it cost."""

    kind: str  # "warmup" | "keepalive"
    reason: str
    at: float  # seconds since the keep-alive started (unscaled); 0 for a lone probe
    ok: bool
    latency_s: float
    prompt_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None
    error: str | None = None
    status: int | None = None  # the HTTP status of a failed probe, when the provider sent one
    usage_error: str | None = None  # why the ledger did not take a sent probe's usage

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def rejected(self) -> bool:
        """The provider refused the request itself (4xx other than 408/409/429): sending it
        again fails the same way, and so will the real calls that share its messages."""
        return (
            not self.ok and self.status is not None and 400 <= self.status < 500 and self.status not in (408, 409, 429)
        )


class ProbeFailed(CtxrulesError):
    """A warm-up or keep-alive probe failed (``check=True``) or was rejected (``KeepAlive``)."""

    exit_code = 2

    def __init__(self, probe: Probe) -> None:
        what = f"HTTP {probe.status}: " if probe.status is not None else ""
        super().__init__(f"{probe.kind} probe failed: {what}{probe.error}")
        self.probe = probe


def _status_of(exc: BaseException) -> int | None:
    for name in ("status_code", "status"):
        value = getattr(exc, name, None)
        if isinstance(value, int):
            return value
    response = getattr(exc, "response", None)
    value = getattr(response, "status_code", None)
    return value if isinstance(value, int) else None


def load_litellm() -> Any:
    """``litellm`` through :func:`ctxrules.llm.load_litellm` (kept here for callers of this module)."""
    return load()


def probe_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The messages of a probe: the prefix as prepared, ending with a user turn (a minimal one
    is appended after an assistant or tool message, or when there is no user message yet, so
    every provider accepts the request; it sits after the cached prefix and changes nothing in
    it)."""
    out = [dict(m) for m in messages]
    if not out or out[-1].get("role") != "user":
        out.append({"role": "user", "content": PROBE_USER_TEXT})
    return out


def _usage_numbers(usage: Any) -> tuple[int, int, int, int]:
    def get(obj: Any, name: str) -> Any:
        return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)

    prompt = int(get(usage, "prompt_tokens") or 0)
    completion = int(get(usage, "completion_tokens") or 0)
    details = get(usage, "prompt_tokens_details")
    cached = int(
        (get(details, "cached_tokens") if details is not None else None) or get(usage, "cache_read_input_tokens") or 0
    )
    written = int(get(usage, "cache_creation_input_tokens") or 0)
    return prompt, cached, written, completion


def _counted_usage(
    model: str, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]], response: Any
) -> TokenUsage:
    """A probe's tokens counted with the model's tokenizer (the name's guess for a model the
    registry does not know): the prefix sent, and the reply's text (:func:`reply_text`, as
    ``session.complete`` counts a reply without usage)."""
    from ctxrules.budget.usage import TokenUsage, reply_text
    from ctxrules.models import classify_model
    from ctxrules.tokens import TokenCounter

    try:
        tokenizer = lookup_model(model).tokenizer
    except CtxrulesError:
        tokenizer = classify_model(model)[1]
    counter = TokenCounter.for_tokenizer(tokenizer)
    text = reply_text(response)
    return TokenUsage.of(
        prompt=counter.count_messages(list(messages), list(tools) or None),
        completion=counter.count_text(text) if text else 0,
    )


def probe_cost(model: str, prompt: int, cached: int, written: int, completion: int) -> float | None:
    """USD cost of a probe from the model registry's prices (None when the model is unknown).
    ``prompt`` includes the cached tokens (OpenAI's convention); cache writes are priced at the
    registry's cache-creation rate where it has one."""
    try:
        info = lookup_model(model)
    except CtxrulesError:
        return None
    if info.input_cost_per_token is None:
        return None
    base = info.input_cost_per_token
    read = info.cache_read_input_token_cost if info.cache_read_input_token_cost is not None else base
    write = info.cache_creation_input_token_cost if info.cache_creation_input_token_cost is not None else base
    out = info.output_cost_per_token or 0.0
    uncached = max(prompt - cached - written, 0)
    return uncached * base + cached * read + written * write + completion * out


def send_probe(
    model: str,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] = (),
    *,
    kind: str = "warmup",
    reason: str = "",
    request: Mapping[str, Any] | None = None,
    max_tokens: int | None = None,
    timeout_s: float = 30.0,
    at: float = 0.0,
    ledger: SessionLedger | None = None,
    check: bool = False,
) -> Probe:
    """Send the prefix once to warm or refresh the provider's cache.

    A failure is logged (warning ``probe.failed``) and returned as a probe with ``ok`` false;
    ``check=True`` raises it as :class:`ProbeFailed`.

    ``request`` holds extra litellm arguments: ``api_base``, ``api_key``, and what
    ``result.request`` carries (``prompt_cache_key``, ``tool_choice``), so the probe hits the
    same cache entry and routing as the real calls. With ``ledger`` (``session.ledger``) the
    probe's usage is recorded there (``source`` = the probe's kind), so it counts in the
    session, day and goal budgets, and no probe is sent once the budget refuses calls. A
    response that reports no tokens is counted with the model's tokenizer (``source``
    ``<kind>-counted``): the probe was billed all the same.
    """
    extra = dict(request or {})
    provider = model.split("/", 1)[0] if "/" in model else ""
    if max_tokens is None:
        max_tokens = 0 if provider in ZERO_MAX_TOKENS_PROVIDERS else 1
    started = time.perf_counter()
    if ledger is not None:
        status = ledger.status()
        if status.refuses:
            return Probe(kind, reason, at, False, 0.0, error=f"not sent: {status.refusal()}")
    try:
        litellm = load_litellm()
        kwargs: dict[str, Any] = {
            "model": model,
            "messages": probe_messages(messages),
            "max_tokens": max_tokens,
            "timeout": timeout_s,
            # One probe is one request: every retry pays for the whole prefix again, and a
            # transient failure is retried on the keep-alive's schedule anyway.
            "max_retries": 0,
            "num_retries": 0,
            **extra,
        }
        if tools:
            kwargs["tools"] = [dict(t) for t in tools]
        response = call_within(litellm.completion, kwargs, timeout_s, name="ctxrules-probe")
        usage = response.get("usage") if isinstance(response, Mapping) else getattr(response, "usage", None)
        prompt, cached, written, completion = _usage_numbers(usage or {})
        counted = None
        if not (prompt or completion):
            # A provider (or proxy) that sends no usage: litellm fills in zeros, and the probe,
            # billed all the same, was recorded as a free call. Counted with the model's
            # tokenizer instead, as session.complete counts such a reply.
            counted = _counted_usage(model, kwargs["messages"], kwargs.get("tools") or [], response)
            prompt, completion = counted.prompt, counted.completion
    except Exception as exc:  # best effort: reported (log, probe, ProbeFailed), never swallowed
        failed = Probe(
            kind,
            reason,
            at,
            False,
            time.perf_counter() - started,
            error=error_text(exc, 2000),
            status=_status_of(exc),
        )
        get_logger("ctxrules.cache").warning(
            "probe.failed", kind=kind, reason=reason, model=model, status=failed.status, error=failed.error
        )
        if check:
            raise ProbeFailed(failed) from exc
        return failed
    usage_error = None
    if ledger is not None:
        # The probe was sent and billed: a ledger that refuses or cannot take its usage does not
        # make it a failed probe (the keep-alive would send it again), as session.complete keeps
        # a reply whose usage could not be recorded. Said in the probe and in a warning.
        try:
            if counted is None:
                ledger.record(response, model=model, source=kind)
            else:
                ledger.record(counted, model=model, source=f"{kind}-counted")
        except Exception as exc:
            usage_error = error_text(exc, 500)
            get_logger("ctxrules.cache").warning("probe.usage_not_recorded", kind=kind, model=model, error=usage_error)
    cost = probe_cost(
        model.split("/", 1)[1] if provider == "openai" else model,
        prompt,
        cached,
        written,
        completion,
    )
    return Probe(
        kind,
        reason,
        at,
        True,
        time.perf_counter() - started,
        prompt,
        cached,
        written,
        completion,
        cost,
        usage_error=usage_error,
    )


class KeepAlive:
    """Warm-up and idle keep-alive for one session's prefix (see the module docstring).

    ``send`` replaces :func:`send_probe` (same signature), e.g. to route probes elsewhere.
    ``ledger`` (``session.ledger``, or use ``session.keepalive(...)``): every probe's usage is
    recorded there and counts in the budgets; probes stop while the budget refuses calls.
    """

    def __init__(
        self,
        model: str,
        *,
        request: Mapping[str, Any] | None = None,
        interval_s: float = DEFAULT_INTERVAL_S,
        max_idle_s: float | None = DEFAULT_MAX_IDLE_S,
        time_scale: float = 1.0,
        max_tokens: int | None = None,
        timeout_s: float = 30.0,
        send: Callable[..., Probe] | None = None,
        ledger: SessionLedger | None = None,
        raise_rejections: bool = True,
    ) -> None:
        # NaN compares false with everything: a NaN time_scale made every probe due at once (a
        # probe storm, each paying for the prefix), a NaN interval made the schedule meaningless.
        if not (interval_s > 0 and 0 < time_scale < math.inf):
            raise ValueError(
                f"interval_s must be > 0 (inf: no idle probes) and time_scale a finite number > 0, "
                f"got {interval_s!r} and {time_scale!r}"
            )
        if max_idle_s is not None and not max_idle_s >= 0:
            raise ValueError(f"max_idle_s must be >= 0 or None, got {max_idle_s!r}")
        if not 0 < timeout_s < math.inf:
            raise ValueError(f"timeout_s must be a finite number > 0, got {timeout_s!r}")
        self.model = model
        self.request = dict(request or {})
        self.interval_s = interval_s
        self.max_idle_s = max_idle_s
        self.time_scale = time_scale
        self.max_tokens = max_tokens
        self.timeout_s = timeout_s
        self._send = send or send_probe
        self.ledger = ledger  # probes count in this session's budgets (send_probe's ledger=)
        self._cond = threading.Condition()
        self._messages: list[dict[str, Any]] = []
        self._tools: list[dict[str, Any]] = []
        self._pending: str | None = None  # reason of a warm-up to send as soon as possible
        self._active = 0
        self._stopped = False
        self._started = time.monotonic()
        self._last_activity = self._started
        self._last_probe: float | None = None
        self._probes: list[Probe] = []
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()  # the process whose thread probes (_after_fork)
        self.raise_rejections = raise_rejections
        self._rejected: Probe | None = None  # the last rejected probe; probing waits for an update
        self._unraised: Probe | None = None  # ... not yet raised to the caller

    # -- clock ------------------------------------------------------------------
    def _now(self) -> float:
        return time.monotonic()

    def _virtual(self, t: float) -> float:
        return (t - self._started) / self.time_scale

    # -- control ------------------------------------------------------------------
    def start(self) -> KeepAlive:
        self._after_fork()
        with self._cond:
            if self._thread is None:
                self._thread = helper_thread(self._run, f"ctxrules-keepalive-{self.model}")
                self._thread.start()
        return self

    def stop(self, timeout_s: float | None = 5.0) -> None:
        """Stop probing and end the thread (waits for a probe in flight up to ``timeout_s``)."""
        self._after_fork()
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _after_fork(self) -> None:
        """In a process forked from the one whose thread probes (a server forking workers): that
        thread is not here, so nothing was probed, not even a warm-up the child asked for, and
        it may have held the condition. The child takes a fresh condition and, unless stopped,
        a probing thread of its own; calls in flight were the parent's."""
        pid = os.getpid()
        if self._pid == pid:
            return
        self._pid, self._cond, self._active = pid, threading.Condition(), 0
        restart, self._thread = self._thread is not None and not self._stopped, None
        if restart:
            self.start()

    def __enter__(self) -> KeepAlive:
        return self.start()

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.stop()
        if exc_type is None:
            self._raise_rejection()

    def _raise_rejection(self) -> None:
        with self._cond:
            probe, self._unraised = self._unraised, None
        if probe is not None and self.raise_rejections:
            raise ProbeFailed(probe)

    def update(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] = (),
        *,
        request: Mapping[str, Any] | None = None,
        warm: str | None = None,
    ) -> None:
        """Set the prefix the probes send; ``warm`` (a reason) sends a warm-up right away."""
        self._after_fork()
        with self._cond:
            self._messages = [dict(m) for m in messages]
            self._tools = [dict(t) for t in tools]
            if request:
                self.request.update(request)
            if warm:
                self._pending = warm
            self._rejected = None  # new messages: worth probing again
            self._last_activity = self._now()
            self._cond.notify_all()
        # A rejection the thread saw reaches the caller here, on its own thread, once.
        self._raise_rejection()

    def after_prepare(self, result: Any) -> None:
        """Feed a ``PrepareResult``: the first one warms the prefix ("session start"), one whose
        content stages changed the messages warms it again ("after compaction")."""
        report = getattr(result, "report", {}) or {}
        compacted = any(
            s.get("phase") == "content"
            and s.get("ran")
            and (s.get("tokens_saved") or any(a.get("vault_id") for a in s.get("actions") or []))
            for s in report.get("stages") or []
        )
        first = not self._messages and not self._probes
        warm = "session start" if first else "after compaction" if compacted else None
        extra = {k: v for k, v in (getattr(result, "request", {}) or {}).items() if k == "prompt_cache_key"}
        self.update(result.messages, result.tools, request=extra, warm=warm)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Mark a model call in flight: no keep-alive meanwhile; the idle timer restarts after.

        A warm-up still waiting to be sent is dropped: the call sends the same prefix and writes
        it to the cache itself, so a warm-up after it would only pay for that prefix again."""
        self._after_fork()
        with self._cond:
            self._active += 1
            self._pending = None
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                self._last_activity = self._now()
                self._cond.notify_all()

    # -- results ------------------------------------------------------------------
    @property
    def probes(self) -> list[Probe]:
        with self._cond:
            return list(self._probes)

    def report(self) -> dict[str, Any]:
        """Every probe with its cost, and the totals."""
        probes = self.probes
        costs = [p.cost_usd for p in probes if p.cost_usd is not None]
        return {
            "model": self.model,
            "interval_s": self.interval_s,
            "probes": [p.as_dict() for p in probes],
            "warmups": sum(p.kind == "warmup" for p in probes),
            "keepalives": sum(p.kind == "keepalive" for p in probes),
            "failed": sum(not p.ok for p in probes),
            "rejected": sum(p.rejected for p in probes),
            "cost_usd": sum(costs) if costs else None,
        }

    # -- the thread ------------------------------------------------------------------
    def _run(self) -> None:
        interval = self.interval_s * self.time_scale
        max_idle = self.max_idle_s * self.time_scale if self.max_idle_s is not None else None
        while True:
            with self._cond:
                if self._stopped:
                    return
                now = self._now()
                kind = reason = None
                if self._pending and self._messages and not self._active:
                    kind, reason, self._pending = "warmup", self._pending, None
                elif self._active or not self._messages or self._rejected is not None:
                    self._cond.wait()
                    continue
                else:
                    since = (
                        self._last_activity if self._last_probe is None else max(self._last_activity, self._last_probe)
                    )
                    if max_idle is not None and now - self._last_activity >= max_idle:
                        self._cond.wait()  # idle too long: wait for the next call
                        continue
                    due = since + interval
                    if now < due:
                        # (an interval of inf, or just a long one, is past what a lock can wait)
                        self._cond.wait(min(due - now, threading.TIMEOUT_MAX))
                        continue
                    kind, reason = "keepalive", "idle"
                messages, tools, request = (
                    list(self._messages),
                    list(self._tools),
                    dict(self.request),
                )
                at = self._virtual(now)
            # A custom ``send`` need not take ``ledger``: passed only when there is one.
            extra: dict[str, Any] = {"ledger": self.ledger} if self.ledger is not None else {}
            probe = self._send(
                self.model,
                messages,
                tools,
                kind=kind,
                reason=reason,
                request=request,
                max_tokens=self.max_tokens,
                timeout_s=self.timeout_s,
                at=at,
                **extra,
            )
            with self._cond:
                self._probes.append(probe)
                self._last_probe = self._now()
                if probe.rejected:
                    self._rejected = self._unraised = probe
