"""A Redis server that stops answering in the middle of a prepare (after the turn was read):
the turn fails once, within the socket timeout, instead of every stage and every compressed
output waiting its own timeout on the same dead server (docs/stores.md, "Redis unreachable")."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from cli_kit import cli
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


class _SilentServer:
    """A TCP server that accepts every connection and never answers (a server stopped dead, or
    a proxy in front of one): each connection a client opens is counted."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            self.held.append(conn)  # read nothing, answer nothing, close nothing

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def _messages_file(tmp_path: Path) -> Path:
    path = tmp_path / "messages.json"
    path.write_text(json.dumps(_history(4)))
    return path


def test_run_against_a_server_that_never_answers_asks_it_once(tmp_path: Path) -> None:
    """`ctxrules run` on a store that accepts and never answers: making the session reads its
    budget link and its checkpoint, then the prepare takes its lock. The first of them that
    gets no answer is the only one that waits: one connection, one socket timeout, then CR148
    and exit 2 (each waited its own timeout, three in a row, docs/stores.md)."""
    server = _SilentServer()
    try:
        url = f"redis://127.0.0.1:{server.port}/0?socket_timeout_s=1&connect_timeout_s=1"
        done = cli("run", "--pack", "builtin:default", "--model", "gpt-4o", "--input", str(_messages_file(tmp_path)),
                   "--store", url, "--session", "silent", timeout=60)  # fmt: skip
    finally:
        server.close()
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "[CR148]" in lines[0] and "no answer within 1s" in lines[0], done.stderr
    assert server.connections == 1, server.connections


def test_run_against_a_stopped_redis_server_waits_one_socket_timeout(own_redis: RedisServer, tmp_path: Path) -> None:
    """The same with the real server, stopped (SIGSTOP) after it served one turn: the kernel
    still accepts connections for it, nothing answers. The run ends within one socket timeout
    (5 s) and its own start-up (well under a second timeout); it took three timeouts."""
    assert own_redis.proc is not None
    url = f"{own_redis.url}?socket_timeout_s=5"
    source = _messages_file(tmp_path)
    first = cli("run", "--pack", "builtin:default", "--model", "gpt-4o", "--input", str(source), "--store", url,
                "--session", "stopped", timeout=120)  # fmt: skip
    assert first.returncode == 0, first.stderr
    os.kill(own_redis.proc.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        done = cli("run", "--pack", "builtin:default", "--model", "gpt-4o", "--input", str(source), "--store", url,
                   "--session", "stopped", timeout=120)  # fmt: skip
        took = time.monotonic() - started
    finally:
        os.kill(own_redis.proc.pid, signal.SIGCONT)
    assert done.returncode == 2 and "[CR148]" in done.stderr, done.stderr
    assert took < 2 * 5, f"{took:.1f} s: more than one socket timeout waited"
    # The server answers again: the next run uses it (the memory of the silence was that call's).
    again = cli("run", "--pack", "builtin:default", "--model", "gpt-4o", "--input", str(source), "--store", url,
                "--session", "stopped", timeout=120)  # fmt: skip
    assert again.returncode == 0, again.stderr


def test_a_store_that_went_silent_is_asked_again_once_its_time_is_over(own_redis: RedisServer) -> None:
    """An agent that made its session while the server was stopped, and prepares later, once
    the server answers again: the prepare uses the server (the silence at the session's making
    holds for one socket timeout, not for good)."""
    assert own_redis.proc is not None
    url = f"{own_redis.url}?socket_timeout_s=0.5&on_error=fail"
    engine = Engine.load("builtin:default")
    engine.session("later", store=url, model="gpt-4o").prepare(_history(3))
    os.kill(own_redis.proc.pid, signal.SIGSTOP)
    try:
        session = engine.session("later", store=url, model="gpt-4o")  # reads time out, no raise
        with pytest.raises(StoreUnavailable, match="CR148"):
            session.prepare(_history(4))  # right after: the same call as the user runs it
    finally:
        os.kill(own_redis.proc.pid, signal.SIGCONT)
    time.sleep(0.6)
    result = session.prepare(_history(4))
    assert result.messages[-1] == _history(4)[-1]
