"""A Redis server that stops answering in the middle of a prepare (after the turn was read):
the turn fails once, within the socket timeout, instead of every stage and every compressed
output waiting its own timeout on the same dead server (docs/stores.md, "Redis unreachable")."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import pytest
from redis_server import RedisServer

from ctxrules import Engine
from ctxrules.stores.base import StoreUnavailable
from ctxrules.stores.redis import RedisStore


def _history(steps: int) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."}]
    for i in range(steps):
        call = {
            "id": f"c{i}",
            "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"cmd": f"cat f{i}"})},
        }
        output = "\n".join(f"{i}:{n} " + "data " * 12 for n in range(100))
        history += [
            {"role": "user", "content": f"step {i}"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": output},
        ]
    return [*history, {"role": "user", "content": "now fix it"}]


def test_a_server_that_stalls_mid_prepare_fails_the_turn_at_the_first_timeout(
    own_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert own_redis.proc is not None
    url = f"{own_redis.url}?socket_timeout_s=1&on_error=fail"
    session = Engine.load("builtin:default").session("stall", store=url, model="gpt-4o")
    history = _history(30)
    session.prepare(history[:20])
    stalled: list[str] = []
    timeouts: list[str] = []
    put_blob, unavailable = RedisStore.put_blob, RedisStore._unavailable

    def stalled_put(self: RedisStore, *args: Any, **kwargs: Any) -> Any:
        if not stalled:  # the first vault write: the server accepted, and now answers nothing
            stalled.append("put_blob")
            os.kill(own_redis.proc.pid, signal.SIGSTOP)  # type: ignore[union-attr]
        return put_blob(self, *args, **kwargs)

    def counted(self: RedisStore, exc: Exception) -> Any:
        timeouts.append(str(exc))
        return unavailable(self, exc)

    monkeypatch.setattr(RedisStore, "put_blob", stalled_put)
    monkeypatch.setattr(RedisStore, "_unavailable", counted)
    try:
        with pytest.raises(StoreUnavailable, match="CR148"):
            session.prepare(history)
    finally:
        os.kill(own_redis.proc.pid, signal.SIGCONT)
    # The write that met the dead server, and the lock's release: no stage and no compressed
    # output waited on it again (each did, one socket timeout apiece).
    assert stalled and len(timeouts) <= 2, timeouts
