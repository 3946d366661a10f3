"""A server that forks workers after ``Engine.load`` while another thread is inside ctxrules: the
worker must not inherit a thread lock held by a thread it does not have (ctxrules.threads)."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from session_kit import keyed_state_root

from ctxrules import Engine

if TYPE_CHECKING:
    from ctxrules.threads import ForkSafeLock

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork"),
    # Python 3.12+ warns on any fork of a process with threads: that is the case under test.
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning"),
]

_CHILD_LIMIT_S = 60  # the child kills itself (SIGALRM) rather than hang the suite


def _history(turns: int) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful agent."}]
    for i in range(turns):
        history.append({"role": "user", "content": f"step {i}: look at file_{i}.py"})
        history.append({"role": "assistant", "content": f"file_{i}.py has {i * 7} lines of code."})
    return history


def _in_child(work: Any) -> tuple[int, bytes]:
    """Fork; the child runs ``work()`` and writes its result (bytes) to a pipe. Returns the
    child's wait status and what it wrote; a child that hangs ends by SIGALRM."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read_end)
            signal.alarm(_CHILD_LIMIT_S)
            os.write(write_end, work())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    return pid, read_end


def _collect(pid: int, read_end: int) -> tuple[int, bytes]:
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    return status, b"".join(chunks)


def test_a_worker_forked_while_a_thread_prepares_the_session_can_prepare_it(tmp_path: Path) -> None:
    """The child's first prepare of a session another thread of the parent was preparing at the
    fork ran into that thread's lock and waited forever; now it runs, from the session's last
    committed turn, and returns what a serial run returns."""
    engine = Engine.load("builtin:default")
    state = keyed_state_root(tmp_path, "fork")
    history = _history(6)
    reference = engine.session(tmp_path / "serial", model="gpt-4o", state_root=state)
    reference.prepare(history[:5], clock=1_750_000_000.0)
    expected = reference.prepare(history, clock=1_750_000_060.0).messages

    inside, go = threading.Event(), threading.Event()

    def pause(event: dict[str, Any]) -> None:
        if event.get("event") == "stage.start" and not inside.is_set():
            inside.set()
            go.wait(60)

    session = engine.session(tmp_path / "s", model="gpt-4o", state_root=state)
    session.prepare(history[:5], clock=1_750_000_000.0)
    session.on_event = pause
    worker = threading.Thread(target=session.prepare, args=(history[:3],), kwargs={"clock": 1_750_000_030.0})
    worker.start()
    assert inside.wait(30), "the prepare in the thread never started a stage"
    session.on_event = None  # the child's own prepare must not pause

    def child_turn() -> bytes:
        return json.dumps(session.prepare(history, clock=1_750_000_060.0).messages).encode()

    pid, read_end = _in_child(child_turn)
    go.set()  # the parent's turn ends (and frees the session's file lock for the child)
    worker.join(30)
    status, out = _collect(pid, read_end)
    assert os.WIFEXITED(status), f"the child did not finish (signal {os.WTERMSIG(status)})"
    assert os.WEXITSTATUS(status) == 0
    assert json.loads(out) == expected


def _hold_in_thread(lock: ForkSafeLock) -> tuple[threading.Thread, threading.Event]:
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            done.wait()

    thread = threading.Thread(target=hold)
    thread.start()
    assert held.wait(30)
    return thread, done


@pytest.mark.parametrize("taken_by", ["acquire", "with"])  # `with` has its own copy of acquire's steps
def test_a_lock_held_by_another_thread_is_free_in_the_child_and_says_so_once(taken_by: str) -> None:
    from ctxrules.threads import ForkSafeLock

    abandoned: list[int] = []
    lock = ForkSafeLock(lambda: abandoned.append(os.getpid()))
    thread, done = _hold_in_thread(lock)

    def take() -> bool:
        if taken_by == "acquire":
            got = lock.acquire(timeout=10)
            lock.release()
            return got
        with lock as got:
            return got

    def child() -> bytes:
        got = [take(), take()]  # the second holder is not told again
        return json.dumps([got, len(abandoned), lock.locked()]).encode()

    try:
        pid, read_end = _in_child(child)
    finally:
        done.set()
        thread.join(30)
    status, out = _collect(pid, read_end)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert json.loads(out) == [[True, True], 1, False]
    assert abandoned == []  # the parent's lock was handed on normally: nothing abandoned here


def test_a_lock_the_forking_thread_holds_stays_its_own_in_the_child() -> None:
    from ctxrules.threads import ForkSafeLock

    abandoned: list[int] = []
    lock = ForkSafeLock(lambda: abandoned.append(1))

    def child() -> bytes:
        others_wait = not lock.acquire(blocking=False)  # still held, by this very thread
        lock.release()
        return json.dumps([others_wait, lock.acquire(timeout=10), len(abandoned)]).encode()

    with lock:
        pid, read_end = _in_child(child)
    status, out = _collect(pid, read_end)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert json.loads(out) == [True, True, 0]


def test_a_worker_forked_while_a_thread_opens_a_session_of_an_integration_opens_it_itself() -> None:
    """OpenSessions (the litellm hook's and LangChain middleware's open sessions): the child
    asking for a session a vanished thread of the parent was opening waited for that opening
    forever; it opens the session itself."""
    from ctxrules.integrations import OpenSessions

    sessions: OpenSessions[str] = OpenSessions(4)
    inside, go = threading.Event(), threading.Event()

    def slow_open() -> str:
        inside.set()
        go.wait(60)
        return "opened by the parent"

    thread = threading.Thread(target=sessions.get, args=("conversation", slow_open))
    thread.start()
    try:
        assert inside.wait(30)
        pid, read_end = _in_child(lambda: sessions.get("conversation", lambda: "opened by the child").encode())
    finally:
        go.set()
        thread.join(30)
    status, out = _collect(pid, read_end)
    assert os.WIFEXITED(status), f"the child did not finish (signal {os.WTERMSIG(status)})"
    assert out == b"opened by the child"
    assert sessions.get("conversation", lambda: "reopened") == "opened by the parent"


def test_a_keepalive_started_before_a_fork_probes_in_the_child() -> None:
    """Its probing thread is not in a forked child: the child's warm-up was never sent (nor
    any keep-alive), silently. The child gets a probing thread of its own."""
    from ctxrules.cache.warmup import KeepAlive, Probe

    sent: list[tuple[int, str]] = []
    probed = threading.Event()

    def send(model: str, messages: Any, tools: Any, **kw: Any) -> Probe:
        sent.append((os.getpid(), kw["reason"]))
        probed.set()
        return Probe(kind=kw["kind"], reason=kw["reason"], at=0.0, ok=True, latency_s=0.0)

    keepalive = KeepAlive("gpt-4o", send=send, interval_s=3600, max_idle_s=None, raise_rejections=False)
    with keepalive:
        keepalive.update([{"role": "user", "content": "hi"}], warm="session start")
        assert probed.wait(30)

        def child() -> bytes:
            probed.clear()
            keepalive.update([{"role": "user", "content": "hi again"}], warm="child start")
            probed.wait(30)
            keepalive.stop()
            return json.dumps([reason for pid, reason in sent if pid == os.getpid()]).encode()

        pid, read_end = _in_child(child)
        status, out = _collect(pid, read_end)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert json.loads(out) == ["child start"]


# A worker of a Redis store: a thread holds one session's prepare lock, the main thread forks a
# child that takes a lock of its own, and the parent dies (SIGKILL) holding the first.
_FORKED_HOLDER = """
import os, signal, sys, threading, time
from ctxrules.stores.redis import RedisStore

store = RedisStore.from_url(sys.argv[1])
held = threading.Event()

def hold():
    with store.prepare_lock("parent-held"):
        held.set()
        time.sleep(600)

threading.Thread(target=hold, daemon=True).start()
assert held.wait(30)
read_end, write_end = os.pipe()
if os.fork() == 0:
    signal.alarm(60)
    with store.prepare_lock("child-own", timeout=10):
        print("child", os.getpid(), flush=True)
        os.write(write_end, b"x")
        time.sleep(30)
    os._exit(0)
assert os.read(read_end, 1) == b"x"  # the child holds its lock: its renewer runs
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_child_forked_while_a_redis_lock_is_held_does_not_keep_it_alive(redis_url: str) -> None:
    """The child's lease renewer (a thread of its own, started by its own lock) renewed every
    lease the store object knew, the parent's too: the parent died holding a session's lock,
    and the lock stayed held as long as the child lived, every worker waiting on it in vain.
    The child renews its own leases only; the dead parent's runs out within lock_ttl_s."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    from ctxrules.stores.base import StoreLockTimeout
    from ctxrules.stores.redis import RedisStore

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "engine")}
    holder = subprocess.Popen(
        [sys.executable, "-W", "ignore", "-c", _FORKED_HOLDER, redis_url + "?lock_ttl_s=0.5"],
        stdout=subprocess.PIPE,
        env=env,
    )
    child = 0
    try:
        assert holder.stdout is not None
        line = holder.stdout.readline().split()
        assert line[:1] == [b"child"], line
        child = int(line[1])
        holder.wait(30)  # the parent is dead, its lock no longer renewed by it
        store = RedisStore.from_url(redis_url)
        started = time.monotonic()
        try:
            with store.prepare_lock("parent-held", timeout=3):
                waited = time.monotonic() - started
        except StoreLockTimeout:
            pytest.fail("the parent's lock stayed held while its forked child lived")
        assert waited < 1.5
        store.close()
    finally:
        if child:
            os.kill(child, signal.SIGKILL)
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()


def test_a_child_forked_while_a_thread_uses_a_redis_store_can_use_it(redis_url: str) -> None:
    """The store's thread lock (taken by every call, and by its lease renewer every third of a
    lease) was copied held into a child forked meanwhile: the child's first call hung."""
    from ctxrules.stores.redis import RedisStore

    store = RedisStore.from_url(redis_url)
    with store.prepare_lock("warm"):
        pass
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with store._lock:  # what a call of another thread holds for a moment
            held.set()
            done.wait()

    thread = threading.Thread(target=hold)
    thread.start()
    assert held.wait(30)

    def child() -> bytes:
        with store.prepare_lock("in-child", timeout=5):
            store.save_state("in-child", {"turn": 1})
        return b"ok"

    try:
        pid, read_end = _in_child(child)
    finally:
        done.set()
        thread.join(30)
    status, out = _collect(pid, read_end)
    assert os.WIFEXITED(status), f"the child did not finish (signal {os.WTERMSIG(status)})"
    assert out == b"ok"
    store.close()


def test_a_child_forked_inside_a_redis_prepare_neither_frees_nor_writes_under_the_parents_lock(
    redis_url: str,
) -> None:
    """The forking thread goes on in the child inside the parent's prepare: its end released
    the parent's lock (the same token) under the parent's call, and a turn it committed went
    in as if it held the lock. The lock stays the parent's: the child's turn is refused."""
    import redis

    from ctxrules.stores.base import StoreError
    from ctxrules.stores.redis import RedisStore

    store = RedisStore.from_url(redis_url)
    raw = redis.Redis.from_url(redis_url)
    with store.prepare_lock("forked-inside") as lock:
        state = store.load_turn("forked-inside").state

        def child() -> bytes:
            try:
                store.commit_turn("forked-inside", state, [{"role": "user", "content": "the child's"}])
                said = "committed"
            except StoreError as exc:
                said = str(exc)
            lock.__exit__(None, None, None)
            return said.encode()

        pid, read_end = _in_child(child)
        status, out = _collect(pid, read_end)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        assert b"the turn was not saved" in out, out
        assert raw.exists("ctxrules:v1:{forked-inside}:lock")  # still the parent's
        store.commit_turn("forked-inside", state, [{"role": "user", "content": "the parent's"}])
    assert store.load_turn("forked-inside").output == [{"role": "user", "content": "the parent's"}]
    raw.close()
    store.close()
