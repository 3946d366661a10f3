"""The heartbeat helper, with real asyncio timing.

``StreamRuntime`` plays the agent runtime of the seed: a chunk timer armed when the tool starts
and re-armed by every value the tool yields, a step timer armed once, and an abort that
cancels the tool when either fires. The seed's numbers are scaled down 10x: chunk 120 s ->
12 s, step 300 s -> 30 s, heartbeat every 3 s; the long tool runs 13 s, just past the chunk
limit. The heartbeating tool and the plain one run side by side, so the module takes ~13 s.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from ctxrules.heartbeat import heartbeat, interval_for, with_heartbeat
from ctxrules.timeouts import TimeoutPolicy

SCALE = 10
CHUNK_S = 120 / SCALE
STEP_S = 300 / SCALE
TOOL_S = 130 / SCALE
BEAT_S = interval_for(int(CHUNK_S * 1000))  # a quarter of the chunk limit: 3 s


class ChunkTimeout(Exception):
    pass


@dataclass
class StreamRuntime:
    chunk_s: float
    step_s: float
    values: list[Any] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)

    async def run(self, tool: Any) -> Any:
        """Drain an async-iterable tool like the runtime does; the last value is the result."""
        last = time.monotonic()
        async with asyncio.timeout(self.step_s):
            while True:
                try:
                    value = await asyncio.wait_for(anext(tool), timeout=self.chunk_s)
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    await tool.aclose()
                    raise ChunkTimeout(f"Chunk timeout of {self.chunk_s * 1000:.0f}ms exceeded") from None
                now = time.monotonic()
                self.gaps.append(now - last)
                last = now
                self.values.append(value)
        return self.values[-1]


@dataclass
class SlowShell:
    """A shell tool whose command takes ``seconds`` and prints nothing the stream can see."""

    seconds: float
    cancelled: bool = False
    finished: bool = False

    async def __call__(self, command: str) -> dict[str, Any]:
        try:
            await asyncio.sleep(self.seconds)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        self.finished = True
        return {"exitCode": 0, "result": f"ran {command}", "executionTime": self.seconds}


async def _plain(tool: SlowShell) -> Any:
    yield await tool("make build")  # an ordinary async tool: one value, at the end


def shell_preliminary(elapsed: float, beat: int) -> dict[str, Any]:
    return {"exitCode": -1, "result": "", "executionTime": round(elapsed, 3)}


def test_heartbeat_keeps_a_scaled_chunk_timer_from_firing() -> None:
    async def main() -> tuple[Any, Any]:
        beating, plain = SlowShell(TOOL_S), SlowShell(TOOL_S)
        rt_beat, rt_plain = StreamRuntime(CHUNK_S, STEP_S), StreamRuntime(CHUNK_S, STEP_S)
        wrapped = heartbeat(beating("make build"), interval_s=BEAT_S, preliminary=shell_preliminary)
        started = time.monotonic()
        results = await asyncio.gather(rt_beat.run(wrapped), rt_plain.run(_plain(plain)), return_exceptions=True)
        elapsed = time.monotonic() - started
        return (results, (beating, plain, rt_beat, rt_plain, elapsed))

    results, (beating, plain, rt_beat, _rt_plain, elapsed) = asyncio.run(main())
    final, failure = results
    # Without a heartbeat the 13 s command dies at the 12 s chunk limit, and is aborted.
    assert isinstance(failure, ChunkTimeout) and "Chunk timeout of 12000ms" in str(failure)
    assert plain.cancelled and not plain.finished
    # With one it completes: the full result is the last value, every earlier one is minimal.
    assert beating.finished and not beating.cancelled
    assert final == {"exitCode": 0, "result": "ran make build", "executionTime": TOOL_S}
    preliminaries = rt_beat.values[:-1]
    assert len(preliminaries) == int(TOOL_S // BEAT_S)  # 4 beats at 3, 6, 9, 12 s
    assert all(p["exitCode"] == -1 and p["result"] == "" for p in preliminaries)
    assert [p["executionTime"] for p in preliminaries] == pytest.approx(
        [BEAT_S * (i + 1) for i in range(len(preliminaries))], abs=0.5
    )
    # No silence ever came near the chunk limit.
    assert max(rt_beat.gaps) < CHUNK_S * 0.5
    assert elapsed < STEP_S


def test_the_policy_gives_the_interval() -> None:
    p = TimeoutPolicy.from_pack({"timeouts": {"chunk_ms": 120_000}})
    assert p is not None and p.chunk_ms is not None
    assert interval_for(p.chunk_ms) == 30.0
    with pytest.raises(ValueError):
        interval_for(0)


def test_errors_propagate_after_the_beats() -> None:
    async def failing() -> None:
        await asyncio.sleep(0.25)
        raise RuntimeError("exit 2")

    async def main() -> list[Any]:
        seen: list[Any] = []
        with pytest.raises(RuntimeError, match="exit 2"):
            async for v in heartbeat(failing, interval_s=0.1):
                seen.append(v)
        return seen

    seen = asyncio.run(main())
    assert [v["beat"] for v in seen] == [1, 2]


def test_closing_the_iterator_cancels_the_tool() -> None:
    tool = SlowShell(5.0)

    async def main() -> None:
        it = heartbeat(tool("sleep"), interval_s=0.05)
        assert (await anext(it))["preliminary"] is True
        await it.aclose()

    asyncio.run(main())
    assert tool.cancelled


def test_decorator_and_a_fast_tool_yield_only_the_result() -> None:
    @with_heartbeat(interval_s=0.05)
    async def add(a: int, b: int) -> int:
        await asyncio.sleep(0.12)
        return a + b

    async def fast() -> str:
        return "done"

    async def main() -> tuple[list[Any], list[Any]]:
        slow = [v async for v in add(2, 3)]
        quick = [v async for v in heartbeat(fast(), interval_s=1.0)]
        return slow, quick

    slow, quick = asyncio.run(main())
    assert slow[-1] == 5 and [v["beat"] for v in slow[:-1]] == [1, 2]
    assert quick == ["done"]
    assert add.__name__ == "add"


def test_a_blocked_loop_skips_beats_instead_of_bursting() -> None:
    async def main() -> list[Any]:
        async def work() -> str:
            time.sleep(0.35)  # blocks the event loop for several intervals
            await asyncio.sleep(0.05)
            return "ok"

        return [v async for v in heartbeat(work(), interval_s=0.1)]

    values = asyncio.run(main())
    assert values[-1] == "ok"
    beats = [v["beat"] for v in values[:-1]]
    assert beats == sorted(set(beats)) and len(beats) <= 2
