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
from ctxrules.integrations.litellm import ContextHook
from ctxrules.stores import open_store
from ctxrules.stores.base import StoreError, StoreUnavailable
from ctxrules.stores.redis import RedisStore
from ctxrules.vault import parse_markers


def _history(steps: int, tag: str = "") -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."}]
    for i in range(steps):
        call = {
            "id": f"c{i}",
            "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"cmd": f"cat f{i}"})},
        }
        output = "\n".join(f"{tag}{i}:{n} " + "data " * 12 for n in range(100))
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


def test_a_lock_taken_while_the_server_stalled_is_taken_back_by_the_next_call(own_redis: RedisServer) -> None:
    """The server stops answering while it takes the prepare lock: the call falls back to memory
    (on_error=local), and the server, once it answers again, sets the lock it was asked for — with
    nobody working under it or releasing it. The worker's next call takes that lock back at once,
    where it waited out the lease (lock_ttl_s) and, with a shorter lock_timeout_s, failed (CR149)."""
    assert own_redis.proc is not None
    url = f"{own_redis.url}?socket_timeout_s=1&on_error=local&lock_ttl_s=60&lock_timeout_s=2"
    session = Engine.load("builtin:default").session("stall-lock", store=url, model="gpt-4o")
    history = _history(30)
    session.prepare(history[:20])
    os.kill(own_redis.proc.pid, signal.SIGSTOP)
    try:
        stalled = session.prepare(history[:26])
    finally:
        os.kill(own_redis.proc.pid, signal.SIGCONT)
    assert any("in-memory store" in w for w in stalled.report["warnings"]), stalled.report["warnings"]
    again = session.prepare(history)
    assert not any("in-memory store" in w for w in again.report["warnings"]), again.report["warnings"]


def test_a_lock_whose_release_met_a_stalled_server_is_taken_back_by_the_next_call(
    own_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn that fails because the server stopped answering cannot release its lock: the
    worker's next call takes it back rather than waiting out its lease."""
    assert own_redis.proc is not None
    url = f"{own_redis.url}?socket_timeout_s=1&on_error=fail&lock_ttl_s=60&lock_timeout_s=2"
    session = Engine.load("builtin:default").session("stall-release", store=url, model="gpt-4o")
    history = _history(30)
    session.prepare(history[:20])
    put_blob = RedisStore.put_blob
    stalled: list[str] = []

    def stalled_put(self: RedisStore, *args: Any, **kwargs: Any) -> Any:
        if not stalled:
            stalled.append("put_blob")
            os.kill(own_redis.proc.pid, signal.SIGSTOP)  # type: ignore[union-attr]
        return put_blob(self, *args, **kwargs)

    monkeypatch.setattr(RedisStore, "put_blob", stalled_put)
    try:
        with pytest.raises(StoreUnavailable, match="CR148"):
            session.prepare(history)
    finally:
        os.kill(own_redis.proc.pid, signal.SIGCONT)
    monkeypatch.setattr(RedisStore, "put_blob", put_blob)
    result = session.prepare(history)  # was CR149: the lock stayed held for its 60 s lease
    assert result.messages[-1] == history[-1]


def test_a_server_restarted_mid_turn_is_said_so_not_blamed_on_another_worker(
    own_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restart without persistence between the lock and the commit takes the lock (and the
    vault items the turn wrote) along: the turn is not saved, and the message said another
    worker held the lock — there is none. The next turn recomputes and says why."""
    url = f"{own_redis.url}?on_error=fail"
    session = Engine.load("builtin:default").session("restart-mid", store=url, model="gpt-4o", window=16000)
    history = _history(30)
    session.prepare(history[:20])
    put_blob = RedisStore.put_blob
    restarted: list[str] = []

    def restarting_put(self: RedisStore, *args: Any, **kwargs: Any) -> Any:
        if not restarted:
            restarted.append("put_blob")
            own_redis.restart()
        return put_blob(self, *args, **kwargs)

    monkeypatch.setattr(RedisStore, "put_blob", restarting_put)
    with pytest.raises(StoreError, match="CR149") as caught:
        session.prepare(history)
    assert restarted
    assert "restarted" in str(caught.value) and "another worker" not in str(caught.value)
    monkeypatch.setattr(RedisStore, "put_blob", put_blob)
    again = session.prepare(history)
    assert any("recomputed from the full history" in w for w in again.report["warnings"])


def test_a_stateless_call_after_redis_came_back_keeps_its_vault_in_redis(own_redis: RedisServer) -> None:
    """The litellm hook's stateless calls (no session id) take no prepare lock, so nothing
    marked the start of a call for the store's fallback (on_error=local). One stateless call
    met Redis down and was served from memory, as documented; the calls after Redis came back
    wrote what they elided to that memory too, for ever: their markers named vault items no
    other worker, and no ``vault get``, could read."""
    url = f"{own_redis.url}?on_error=local&connect_timeout_s=0.5"
    hook = ContextHook("builtin:default", store=url, window=16000)
    own_redis.stop()
    down = hook.process({"model": "gpt-4o", "messages": _history(30, "down ")}, "openai")
    assert len(json.dumps(down["messages"])) < len(json.dumps(_history(30, "down ")))  # served from memory
    own_redis.start()
    out = hook.process({"model": "gpt-4o", "messages": _history(30, "up ")}, "openai")
    ids = {m.vault_id for msg in out["messages"] for m in parse_markers(str(msg.get("content") or ""))}
    assert ids
    other_worker = open_store(own_redis.url)
    stateless = other_worker.session_key("stateless")
    for vault_id in ids:
        assert other_worker.get_blob(stateless, vault_id)
