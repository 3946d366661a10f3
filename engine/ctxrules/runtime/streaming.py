"""``session.complete(..., stream=True)`` and ``session.acomplete(..., stream=True)``.

The stream is opened with the same overflow recovery as a plain call: a context-length error
that comes **before the first chunk** (at the request, or as the stream's first event) runs the
emergency pass and retries once; the caller never sees the failed attempt. An error **after**
the first chunk has reached the caller cannot be undone (the caller holds part of an answer)
and is raised as ``CompletionFailed``.

Usage is recorded when the stream ends: from the provider's final usage chunk (ctxrules asks
for it with ``stream_options={"include_usage": True}`` unless the caller set stream_options, and
then keeps that chunk, which has no choices, from the caller),
or, when the provider sends none, counted with the session's tokenizer — the prompt that was
sent and the text, reasoning and tool-call arguments that came back (``source`` ``stream`` or
``stream-counted`` in the ledger). A stream the caller closes early records what it received,
and so does one it drops without closing (when it is collected); a stream that failed records
nothing, like a failed call. Usage is recorded once, however many threads (or tasks) read the stream: they
take turns, each chunk goes to one of them. A ledger that cannot be written (a full disk)
never costs the caller the reply: the attempt carries ``usage_error`` and a warning is logged.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from ctxrules.budget.usage import TokenUsage
from ctxrules.errors import CompletionFailed, CtxrulesError, UsageError
from ctxrules.llm import error_text
from ctxrules.logs import get_logger
from ctxrules.reply_limits import reading_until
from ctxrules.threads import helper_thread

if TYPE_CHECKING:
    from ctxrules.results import PrepareResult
    from ctxrules.tokens import TokenCounter


class Session(Protocol):
    """What a stream needs of its session (``ctxrules.Session`` is one)."""

    @property
    def counter(self) -> TokenCounter: ...

    def record_usage(self, usage: Any, *, model: str | None = None, **options: Any) -> Any: ...


__all__ = ["AsyncCompletionStream", "CompletionStream", "within"]


async def within(awaitable: Any, limit: float | None) -> Any:
    """``await awaitable``, given up after ``limit`` seconds (``None``: however long it takes)
    with ``TimeoutError``: the caller's ``timeout`` bounds each read of the connection, and a
    server that sends a byte now and then never lets it expire."""
    if limit is None:
        return await awaitable
    import asyncio

    try:
        return await asyncio.wait_for(awaitable, limit)
    except TimeoutError:
        raise TimeoutError(f"no answer within the caller's timeout of {limit:g} s") from None


class _StreamState:
    """What both stream kinds keep: the call, what came back, and whether usage was recorded."""

    def __init__(
        self,
        session: Session,
        prepared: PrepareResult,
        model: str,
        sent: list[dict[str, Any]],
        attempts: list[dict[str, Any]],
    ) -> None:
        self.session = session
        self.prepared = prepared
        self.model = model
        self.sent = sent
        self.attempts = attempts
        self.recovered = len(attempts) > 1
        self.chunks = 0
        self.text_parts: list[str] = []
        self.usage_chunk: Any = None
        self.record: dict[str, Any] | None = None
        self.usage_counted = False
        self.finished = False
        self._own_usage_chunk = False
        self.withheld = 0  # chunks read but kept from the caller (see for_caller); ``chunks`` counts them
        # finish() runs once whichever thread gets there first: the end of the stream in one
        # reader, close() in another, or the collector of a stream dropped unclosed.
        self._finish_lock = threading.Lock()

    @property
    def text(self) -> str:
        """The content streamed so far (text, reasoning and tool-call arguments, in order)."""
        return "".join(self.text_parts)

    def observe(self, chunk: Any) -> None:
        self.chunks += 1
        if reports_tokens(_get(chunk, "usage")):
            self.usage_chunk = chunk
        for choice in _get(chunk, "choices") or []:
            delta = _get(choice, "delta")
            if delta is None:
                continue
            for key in ("reasoning_content", "content"):
                piece = _get(delta, key)
                if isinstance(piece, str):
                    self.text_parts.append(piece)
            for call in _get(delta, "tool_calls") or []:
                fn = _get(call, "function")
                args = _get(fn, "arguments") if fn is not None else None
                name = _get(fn, "name") if fn is not None else None
                self.text_parts.extend(p for p in (name, args) if isinstance(p, str))

    def for_caller(self, chunk: Any) -> bool:
        """Whether the caller gets ``chunk``: not the usage-only one (no choices) that ctxrules
        asked for itself (``include_usage``) — a loop reading ``chunk.choices[0]``, right for
        the stream the caller asked for, would fail on it. Its usage is in ``record``."""
        if self._own_usage_chunk and not _get(chunk, "choices") and _get(chunk, "usage") is not None:
            self.withheld += 1
            return False
        return True

    def finish(self, *, failed: bool = False) -> None:
        """Record the call's usage once (nothing for a failed stream)."""
        with self._finish_lock:
            if self.finished:
                return
            self.finished = True
        if failed:
            self.attempts[-1].update(ok=False)
            return
        self.attempts[-1].update(ok=True, chunks=self.chunks)
        if self.usage_chunk is not None:
            try:
                self.record = record_usage(self.session, self.attempts[-1], self.usage_chunk, self.model, "stream")
                return
            except UsageError as exc:  # usage the ledger refuses: the chunks were delivered, count them
                self.attempts[-1]["usage_refused"] = str(exc)[:300]
        counter = self.session.counter
        prompt = counter.count_messages(self.sent, self.prepared.tools)
        completion = counter.count_text(self.text) if self.text else 0
        self.usage_counted = True
        usage = TokenUsage.of(prompt=prompt, completion=completion)
        self.record = record_usage(self.session, self.attempts[-1], usage, self.model, "stream-counted")

    def __del__(self) -> None:
        """A stream dropped before its end (a ``break`` without ``close()`` or ``with``) still
        records what was received. Not here: the collector may run inside this thread's own
        ledger write, whose locks do not nest; a thread of its own waits for them instead. That
        thread is not a daemon (the process waits for the paid usage to be written before it
        exits) and blocks the stop signals like every thread ctxrules starts."""
        if getattr(self, "finished", True):  # (True: __init__ did not get that far)
            return
        try:
            helper_thread(self._finish_dropped, "ctxrules-stream-usage", daemon=False).start()
        except Exception:  # interpreter shutdown: no new threads, modules half torn down
            return

    def _finish_dropped(self) -> None:
        try:
            self.finish()
        except Exception as exc:  # nobody is left to raise to
            get_logger("ctxrules.stream").warning("stream.usage_lost", model=self.model, error=error_text(exc, 300))

    def failure(self, exc: BaseException) -> Exception:
        self.finish(failed=True)
        self.attempts[-1].update(error=error_text(exc, 500))
        return CompletionFailed(f"model stream failed after {self.chunks} chunk(s): {error_text(exc)}")


class CompletionStream(_StreamState):
    """The chunks of a streamed ``session.complete``; iterate it (or use it as a context
    manager). ``text``, ``chunks`` (received, ``withheld`` of them kept from the caller),
    ``recovered``, ``attempts``, ``prepared``; after the end,
    ``record`` (the ledger record) and ``usage_counted`` (no usage chunk came)."""

    def __init__(
        self,
        session: Session,
        prepared: PrepareResult,
        model: str,
        sent: list[dict[str, Any]],
        attempts: list[dict[str, Any]],
        stream: Any,
        first: Any,
        *,
        ended: bool,
        idle_s: float | None = None,
        own_usage_chunk: bool = False,
    ) -> None:
        super().__init__(session, prepared, model, sent, attempts)
        self._own_usage_chunk = own_usage_chunk
        self._stream = stream
        self._idle_s = idle_s
        self._iter: Iterator[Any] = iter(stream) if not ended else iter(())
        self._pending = first
        self._ended = ended
        # Readers in several threads take turns: the provider's stream is a generator, which
        # raises when a second thread enters it (and that would fail the whole stream).
        self._read_lock = threading.Lock()

    def __iter__(self) -> CompletionStream:
        return self

    def __next__(self) -> Any:
        with self._read_lock:
            return self._next()

    def _next(self) -> Any:
        while True:
            chunk = self._read()
            if self.for_caller(chunk):
                return chunk

    def _read(self) -> Any:
        from ctxrules.llm import quiet

        if self.finished:  # closed (by any thread) or ended: its usage is recorded, nothing follows
            raise StopIteration
        if self._pending is not None:
            chunk, self._pending = self._pending, None
        elif self._ended:
            self.finish()
            raise StopIteration
        else:
            until = None if self._idle_s is None else time.monotonic() + self._idle_s
            try:
                with quiet(), reading_until(until):  # the caller's timeout, from chunk to chunk
                    chunk = next(self._iter)
            except StopIteration:
                self._ended = True
                self.finish()
                raise
            except Exception as exc:
                self._ended = True
                raise self.failure(exc) from exc
        self.observe(chunk)
        return chunk

    def close(self) -> None:
        """Stop reading; records the usage of what was received."""
        if not self._ended:
            self._ended = True
            closer = getattr(self._stream, "close", None)
            if callable(closer):
                with contextlib.suppress(Exception):  # the provider's connection is gone either way
                    closer()
        self.finish()

    def __enter__(self) -> CompletionStream:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.finished:
            self.close()


class AsyncCompletionStream(_StreamState):
    """The chunks of a streamed ``session.acomplete``: ``async for chunk in stream``, or
    ``async with``. Same attributes as :class:`CompletionStream`."""

    def __init__(
        self,
        session: Session,
        prepared: PrepareResult,
        model: str,
        sent: list[dict[str, Any]],
        attempts: list[dict[str, Any]],
        stream: Any,
        first: Any,
        *,
        ended: bool,
        idle_s: float | None = None,
        own_usage_chunk: bool = False,
    ) -> None:
        super().__init__(session, prepared, model, sent, attempts)
        self._own_usage_chunk = own_usage_chunk
        self._stream = stream
        self._idle_s = idle_s
        self._iter: AsyncIterator[Any] | None = None if ended else stream.__aiter__()
        self._pending = first
        self._ended = ended
        import asyncio  # (made on the event loop; the CLI never imports asyncio)

        # Tasks reading one stream take turns, as threads do on a CompletionStream (an async
        # generator raises when a second task enters it).
        self._read_lock = asyncio.Lock()

    def __aiter__(self) -> AsyncCompletionStream:
        return self

    async def __anext__(self) -> Any:
        async with self._read_lock:
            return await self._next()

    async def _next(self) -> Any:
        while True:
            chunk = await self._read()
            if self.for_caller(chunk):
                return chunk

    async def _read(self) -> Any:
        if self.finished:  # closed or ended: its usage is recorded, nothing follows
            raise StopAsyncIteration
        if self._pending is not None:
            chunk, self._pending = self._pending, None
        elif self._ended or self._iter is None:
            self.finish()
            raise StopAsyncIteration
        else:
            try:
                chunk = await within(self._iter.__anext__(), self._idle_s)  # from chunk to chunk
            except StopAsyncIteration:
                self._ended = True
                self.finish()
                raise
            except Exception as exc:
                self._ended = True
                raise self.failure(exc) from exc
        self.observe(chunk)
        return chunk

    async def aclose(self) -> None:
        """Stop reading; records the usage of what was received."""
        if not self._ended:
            self._ended = True
            closer = getattr(self._stream, "aclose", None)
            if callable(closer):
                with contextlib.suppress(Exception):  # the provider's connection is gone either way
                    await closer()
        self.finish()

    async def __aenter__(self) -> AsyncCompletionStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self.finished:
            await self.aclose()


def reports_tokens(usage: Any) -> bool:
    """Whether a provider's usage object counts any tokens: litellm fills in zeros for a
    provider that sent none, and a call is never free of prompt tokens."""
    return usage is not None and bool(_get(usage, "prompt_tokens") or _get(usage, "completion_tokens"))


def record_usage(session: Session, attempt: dict[str, Any], usage: Any, model: str, source: str | None = None) -> Any:
    """``session.record_usage``, except that a ledger that cannot be written (a full disk, a
    link planted for a ledger folder: nothing was recorded, in none of its ledgers) never costs
    the caller the reply it paid for: ``attempt`` says why (``usage_error``) and a warning is
    logged. Usage the ledger refuses (``UsageError``) is raised: the caller counts instead."""
    try:
        return session.record_usage(usage, model=model, **({"source": source} if source else {}))
    except UsageError:
        raise
    except (CtxrulesError, OSError) as exc:
        attempt["usage_error"] = error_text(exc, 300)
        get_logger("ctxrules.complete").warning("usage.not_recorded", model=model, error=attempt["usage_error"])
        return None


def _get(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)
