"""Heartbeats for long tools: keep a runtime's chunk timer from ending a tool that works silently.

An agent runtime's chunk timer (``timeouts.chunk_ms``) measures the silence between stream
chunks, and it keeps running while a tool executes; it is global, so raising the tool's own
limit does not help (docs/timeouts.md, CR091). The one signal that re-arms it is a value the
tool yields. :func:`heartbeat` wraps a tool's awaitable so that, while it runs, a *minimal
preliminary* value is yielded every ``interval_s`` (below the chunk limit), and the full result
is yielded **last**::

    async def execute(command: str) -> dict:            # the real tool
        ...

    async def execute_streaming(command: str):          # what the runtime calls
        async for value in heartbeat(execute(command), interval_s=30,
                                     preliminary=lambda elapsed, n: {"exitCode": -1, "result": "",
                                                                     "executionTime": elapsed}):
            yield value

or ``execute_streaming = with_heartbeat(interval_s=30, preliminary=...)(execute)``.

The contract (the seed's, and the AI SDK's for async-iterable tools): every value but the last
is preliminary and never reaches the model; the last value is the tool result. So the
preliminary value should be the smallest valid snapshot (an empty result, ``exitCode: -1`` for
"still running"), never partial output: rich output belongs to the runtime's own progress
channel, and sending it twice would duplicate it.

Closing or cancelling the iterator (the runtime aborting the step) cancels the tool; an
exception of the tool propagates from the iterator after the heartbeats stop.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

__all__ = ["heartbeat", "interval_for", "with_heartbeat"]

T = TypeVar("T")
P = ParamSpec("P")

Preliminary = Callable[[float, int], Any]
"""``preliminary(elapsed_s, beat)`` builds the value of heartbeat number ``beat`` (1-based)."""

DEFAULT_FRACTION = 0.25
"""Beat four times per chunk limit: one late beat (a busy event loop) still lands in time."""


def _default_preliminary(elapsed_s: float, beat: int) -> dict[str, Any]:
    return {"preliminary": True, "elapsed_s": round(elapsed_s, 3), "beat": beat}


def interval_for(chunk_ms: int, fraction: float = DEFAULT_FRACTION) -> float:
    """A heartbeat interval in seconds safely below a chunk limit given in milliseconds."""
    if chunk_ms <= 0:
        raise ValueError(f"chunk_ms must be positive, got {chunk_ms}")
    if not 0 < fraction < 1:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    return chunk_ms * fraction / 1000.0


async def heartbeat(
    work: Awaitable[T] | Callable[[], Awaitable[T]],
    *,
    interval_s: float,
    preliminary: Preliminary | None = None,
) -> AsyncIterator[Any]:
    """Yield ``preliminary(elapsed, n)`` every ``interval_s`` while ``work`` runs, then its result.

    ``work`` is an awaitable (a coroutine, a task, ``asyncio.to_thread(...)`` for blocking code)
    or a callable returning one. Beats are scheduled from the start (no drift), and one is
    skipped rather than sent late when the loop fell behind by more than an interval.
    """
    if not interval_s > 0:
        raise ValueError(f"interval_s must be positive, got {interval_s}")
    make = preliminary or _default_preliminary
    awaitable = work() if callable(work) else work
    task: asyncio.Future[T] = asyncio.ensure_future(awaitable)
    started = time.monotonic()
    beat = 0
    try:
        while True:
            next_at = started + (beat + 1) * interval_s
            timeout = max(0.0, next_at - time.monotonic())
            done, _ = await asyncio.wait({task}, timeout=timeout)
            if done:
                break
            now = time.monotonic()
            # Fell behind by whole intervals (a blocked loop): resume the schedule, send one beat.
            beat = max(beat + 1, int((now - started) / interval_s))
            yield make(now - started, beat)
        result = task.result()  # raises the tool's exception, if any
    finally:
        if not task.done():
            task.cancel()
            # Let the tool run its cleanup before the abort propagates further.
            await asyncio.gather(task, return_exceptions=True)
    yield result


def with_heartbeat(
    *, interval_s: float, preliminary: Preliminary | None = None
) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, AsyncIterator[Any]]]:
    """Decorator: an async tool becomes an async generator that heartbeats (:func:`heartbeat`)."""

    def wrap(tool: Callable[P, Awaitable[T]]) -> Callable[P, AsyncIterator[Any]]:
        @functools.wraps(tool)
        async def run(*args: P.args, **kwargs: P.kwargs) -> AsyncIterator[Any]:
            async for value in heartbeat(tool(*args, **kwargs), interval_s=interval_s, preliminary=preliminary):
                yield value

        return run

    return wrap
