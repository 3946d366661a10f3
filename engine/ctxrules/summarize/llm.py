"""The summarizer call: litellm, streaming, with progress-aware timeouts.

A slow model is not a dead one. The call streams, and two limits apply (seed: "慢≠死"):

- **inactivity** (``inactivity_s``, 90 s by default): the longest wait for the next streamed
  token (content or reasoning). Every token resets it, so a local 8B model that writes a few
  tokens a second is never cut off; a stream that goes silent is abandoned at this limit;
- **total** (``total_s``, 600 s): a ceiling however steadily tokens arrive;
- **size** (``max_chars``, optional): the longest reply kept. The summarizer asks for at most
  ``max_output_tokens`` tokens; a server that ignores that (a broken proxy, a model looping)
  would otherwise fill memory for the whole ``total_s`` — hundreds of MB from a local server.

The stream is read by a worker thread that hands chunks over a queue; the caller waits on the
queue with the nearer of the two deadlines, so the limits hold even when the HTTP read blocks.
On a timeout the worker is told to stop and the stream is closed; the socket's own read timeout
(1.5 times the inactivity limit, plus 1 s) ends a worker stuck in a read.

litellm is imported lazily, inside the call path, after ``LITELLM_LOCAL_MODEL_COST_MAP=True``
is set (so it never fetches its price map over the network); nothing imports it when no model
is callable.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import queue
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ctxrules.llm import error_text, own_call
from ctxrules.progress import note
from ctxrules.reply_limits import ReplyRefused, plain_reply
from ctxrules.threads import abandon, helper_thread

__all__ = [
    "CallFailed",
    "InactivityTimeout",
    "ProgressClock",
    "StreamLimits",
    "StreamResult",
    "TotalTimeout",
    "ensure_litellm",
    "litellm_completion",
    "stream_completion",
]

Completion = Callable[..., Iterable[Any]]


class CallFailed(Exception):
    """The summarizer call did not produce a reply. ``kind``: ``error``, ``context_length``,
    ``inactivity``, ``total``, ``too_long`` or ``empty``."""

    kind = "error"

    def __init__(self, message: str, *, kind: str | None = None, partial: str = "") -> None:
        super().__init__(message)
        if kind is not None:
            self.kind = kind
        self.partial = partial
        self.seconds = 0.0
        """How long the call ran before it failed (set by :func:`stream_completion`)."""


class InactivityTimeout(CallFailed):
    """No streamed token for ``inactivity_s`` seconds."""

    kind = "inactivity"


class TotalTimeout(CallFailed):
    """The call ran past ``total_s`` seconds although tokens kept coming."""

    kind = "total"


@dataclass(frozen=True)
class StreamLimits:
    """The limits of one call: two in seconds (tests pass small ones), and the longest reply
    in characters (``None``: no limit)."""

    inactivity_s: float = 90.0
    total_s: float = 600.0
    max_chars: int | None = None

    def __post_init__(self) -> None:
        if not (self.inactivity_s > 0 and self.total_s > 0) or (self.max_chars is not None and self.max_chars <= 0):
            raise ValueError(f"stream limits must be positive, got {self}")


class ProgressClock:
    """When the call started and when the last token arrived; ``touch()`` on every token."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.started = clock()
        self.last = self.started
        self.tokens = 0

    def touch(self) -> None:
        self.last = self._clock()
        self.tokens += 1

    def idle(self) -> float:
        return self._clock() - self.last

    def elapsed(self) -> float:
        return self._clock() - self.started


@dataclass(frozen=True)
class StreamResult:
    text: str
    chunks: int
    seconds: float
    finish_reason: str | None = None
    usage: Mapping[str, Any] = field(default_factory=dict)


_WARM_MODULES = (
    "litellm.llms.openai.openai",
    "h11",
    "h2.connection",
    "litellm.llms.github_copilot",
    "litellm.proxy",
)
_warmed = False
_warm_lock = threading.Lock()


def _litellm() -> Any:
    """Import litellm (offline-safe) and warm it up once per process.

    litellm imports much of itself lazily on the first real call (1-2 s); that time would run
    on the inactivity clock of the first summarization, so a mock completion (no network) and
    the provider modules are loaded here, before any clock starts.
    """
    global _warmed
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    with warnings.catch_warnings():
        # Import-time deprecation noise of litellm's dependencies is not ours to fix.
        warnings.simplefilter("ignore")
        import litellm

        litellm.suppress_debug_info = True  # no "Give Feedback / Get Help" banners on stderr
        with _warm_lock:
            if not _warmed:
                _warmed = True
                with contextlib.suppress(Exception):
                    stream = litellm.completion(
                        model="openai/ctxrules-warm-up",
                        stream=True,
                        messages=[{"role": "user", "content": "-"}],
                        mock_response="-",
                    )
                    for _chunk in stream:
                        pass
                for name in _WARM_MODULES:
                    with contextlib.suppress(Exception):
                        importlib.import_module(name)
    return litellm


def ensure_litellm() -> None:
    """Import and warm up litellm now (the summarizer does so before its clocks start)."""
    _litellm()


def litellm_completion(**kwargs: Any) -> Iterable[Any]:
    """``litellm.completion(**kwargs)``, importing litellm on first use (offline-safe)."""
    result: Iterable[Any] = _litellm().completion(**kwargs)
    return result


def _field(obj: Any, name: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _chunk_parts(chunk: Any) -> tuple[str, bool, str | None, Mapping[str, Any] | None]:
    """(content text, whether any token arrived, finish reason, usage) of one stream chunk."""
    choices = _field(chunk, "choices") or []
    text, progressed, finish = "", False, None
    for choice in choices:
        delta = _field(choice, "delta")
        content = _field(delta, "content") if delta is not None else None
        if isinstance(content, str) and content:
            text += content
            progressed = True
        for extra in ("reasoning_content", "thinking"):
            value = _field(delta, extra) if delta is not None else None
            if isinstance(value, str) and value:
                progressed = True  # a reasoning model thinking out loud is alive
        finish = _field(choice, "finish_reason") or finish
    usage = _field(chunk, "usage")
    if usage is not None and not isinstance(usage, Mapping):
        dump = getattr(usage, "model_dump", None)
        usage = dump() if callable(dump) else None
    return text, progressed, finish, usage if isinstance(usage, Mapping) else None


def _plain_completion(content_type: str, body: bytes) -> dict[str, Any]:
    """One stream chunk holding the reply of a server that answered a streaming request with
    one JSON completion; raises :class:`CallFailed` when the body holds none."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        value = None
    choices = value.get("choices") if isinstance(value, dict) else None
    first = choices[0] if isinstance(choices, list) and choices else None
    message = _field(first, "message") if first is not None else None
    content = _field(message, "content") if isinstance(message, Mapping) else None
    if not isinstance(content, str):
        shown = " ".join(body[:200].decode("utf-8", "replace").split())
        raise CallFailed(
            f"the server answered with one {content_type} body that holds no completion, not an event stream: {shown!r}"
        )
    usage = value.get("usage") if isinstance(value, dict) else None
    choice = {"delta": {"content": content}, "finish_reason": _field(first, "finish_reason")}
    return {"choices": [choice], "usage": usage if isinstance(usage, Mapping) else None}


def _classify(exc: BaseException, partial: str) -> CallFailed:
    if isinstance(exc, CallFailed):
        return exc
    if isinstance(exc, ReplyRefused):
        return CallFailed(str(exc), kind=exc.kind, partial=partial)
    names = {cls.__name__ for cls in type(exc).__mro__}
    message = " ".join(str(exc).split())
    label = error_text(exc)
    if "ContextWindowExceededError" in names or "context_length_exceeded" in message:
        return CallFailed(label, kind="context_length", partial=partial)
    if names & {"Timeout", "APITimeoutError", "ReadTimeout", "TimeoutException"}:
        # The socket's read timeout: nothing at all arrived for longer than the inactivity limit.
        return InactivityTimeout(f"no byte within the connection's read timeout ({label})", partial=partial)
    return CallFailed(label, partial=partial)


def stream_completion(
    request: Mapping[str, Any],
    limits: StreamLimits,
    *,
    completion: Completion | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> StreamResult:
    """Run one streaming completion under ``limits``; return the reply text.

    ``request`` holds the litellm keyword arguments (``stream=True`` is forced, and the HTTP
    read timeout is set to the inactivity limit unless given). ``completion`` replaces
    ``litellm.completion`` (tests, other clients). Raises :class:`CallFailed` (or its timeout
    subclasses), never anything else.
    """
    if completion is None:
        # Import before the clock starts: importing litellm takes seconds, which is no
        # inactivity of the model's.
        _litellm()
    call = completion or litellm_completion
    kwargs = {**request, "stream": True}
    # The socket's read timeout backs the inactivity clock up (it ends a worker stuck in a
    # read); it is set a little later so that the clock, which counts tokens rather than
    # bytes, is what decides.
    kwargs.setdefault("timeout", limits.inactivity_s * 1.5 + 1)
    inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
    cancel = threading.Event()
    holder: dict[str, Any] = {}

    def work() -> None:
        stream: Any = None
        try:
            with own_call(cancel, streaming=True), warnings.catch_warnings():
                # litellm imports provider modules lazily on the first call, and their
                # deprecation noise would surface in the user's output (or fail a test run
                # that turns warnings into errors).
                warnings.simplefilter("ignore")
                stream = call(**kwargs)
                holder["stream"] = stream
                texts = 0
                for chunk in stream:
                    if cancel.is_set():
                        break
                    texts += bool(_chunk_parts(chunk)[0])
                    inbox.put(("chunk", chunk))
                plain = plain_reply()
                if not texts and plain is not None and not cancel.is_set():
                    # A server that ignored `stream` and answered with one JSON body: the
                    # stream's reader found no event in it.
                    inbox.put(("chunk", _plain_completion(*plain)))
            inbox.put(("done", None))
        except BaseException as exc:  # handed to the caller, who classifies it
            inbox.put(("error", exc))
        finally:
            _close(stream)

    progress = ProgressClock(clock)
    worker = helper_thread(work, "ctxrules-summarizer-stream")
    worker.start()
    parts: list[str] = []
    size = 0
    chunks = 0
    finish: str | None = None
    usage: Mapping[str, Any] = {}
    try:
        while True:
            now = clock()
            total_left = progress.started + limits.total_s - now
            idle_left = progress.last + limits.inactivity_s - now
            if total_left <= 0:
                raise TotalTimeout(
                    f"the call ran past its {limits.total_s:g} s ceiling ({progress.tokens} tokens received)",
                    partial="".join(parts),
                )
            if idle_left <= 0:
                raise InactivityTimeout(
                    f"no token for {limits.inactivity_s:g} s ({progress.tokens} tokens received before)",
                    partial="".join(parts),
                )
            try:
                kind, payload = inbox.get(timeout=min(total_left, idle_left))
            except queue.Empty:
                continue
            if kind == "error":
                raise _classify(payload, "".join(parts))
            if kind == "done":
                break
            chunks += 1
            text, progressed, chunk_finish, chunk_usage = _chunk_parts(payload)
            if text:
                parts.append(text)
                size += len(text)
                if limits.max_chars is not None and size > limits.max_chars:
                    raise CallFailed(
                        f"the reply ran past {limits.max_chars} characters (the server ignored max_tokens)",
                        kind="too_long",
                    )
            if progressed:
                progress.touch()
                note(
                    "summarizer.stream",
                    model=str(kwargs.get("model", "")),
                    tokens=progress.tokens,
                    seconds=round(progress.elapsed(), 1),
                )
            finish = chunk_finish or finish
            if chunk_usage:
                usage = chunk_usage
    except CallFailed as exc:
        cancel.set()
        _close(holder.get("stream"))
        abandon(worker)
        exc.seconds = progress.elapsed()
        raise
    except BaseException:
        cancel.set()
        _close(holder.get("stream"))
        abandon(worker)
        raise
    text = "".join(parts)
    if not text.strip():
        empty = CallFailed("the model sent an empty reply", kind="empty")
        empty.seconds = progress.elapsed()
        raise empty
    return StreamResult(text, chunks, progress.elapsed(), finish, usage)


def _close(stream: Any) -> None:
    close = getattr(stream, "close", None)
    if callable(close):
        with contextlib.suppress(Exception):  # best effort: the stream may be mid-read
            close()
