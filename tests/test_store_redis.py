"""What only the Redis store does, against Debian's real ``redis-server`` (tests/redis_server.py):
the key layout and Cluster hash tags, TTLs, fenced commits, atomic ledger totals, leases that
outlive a killed worker, and the faults (restart, unreachable, on_error=local)."""

from __future__ import annotations

import itertools
import json
import math
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis_server import RedisServer

from ctxrules.stores.base import Log, StoreError, StoreUnavailable

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def raw(redis_url: str) -> Iterator[Any]:
    import redis

    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def _store(url: str, **options: Any) -> Any:
    from ctxrules.stores.redis import RedisStore

    return RedisStore.from_url(url, **options)


def _crc16(data: bytes) -> int:
    """CRC16-XMODEM, Redis Cluster's key hash (computed here, not by the code under test)."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def _slot(key: bytes) -> int:
    start = key.find(b"{")
    if start >= 0:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            key = key[start + 1 : end]
    return _crc16(key) % 16384


def _turn(store: Any, session: str, output: list[dict[str, Any]], records: Any = ()) -> None:
    with store.prepare_lock(session):
        state = store.load_turn(session).state
        store.commit_turn(session, state, output, records=records)


def test_every_key_is_namespaced_and_a_session_lives_in_one_cluster_slot(redis_url: str, raw: Any) -> None:
    store = _store(redis_url)
    s = "conv-layout"
    call = {"type": "call", "tokens": {"input": 5}, "usd": {"input": 0.5}}
    _turn(store, s, [{"role": "user", "content": "hi"}], [((Log("session", s), Log("day", "2026-12-01")), call)])
    blob = store.put_blob(s, b"bytes", media_type="text/plain")
    store.write_doc(s, "notes", b"{}")
    store.secret(None, "injection-key", lambda: b"ab" * 16)
    with store.compaction_lock(s):
        pass
    keys = sorted(raw.keys("*"))
    assert keys and all(k.startswith(b"ctxrules:v1:") for k in keys)
    session_keys = [k for k in keys if k.startswith(b"ctxrules:v1:{conv-layout}:")]
    assert {_slot(k) for k in session_keys} == {_slot(b"conv-layout")}
    assert {b"state", b"output", b"rev", b"blobs", b"media", b"meta", b"prepares", b"doc:notes"} <= {
        k.split(b"}:", 1)[1] for k in session_keys
    }
    assert f"ctxrules:v1:blob:{blob}".encode() in keys
    day = [k for k in keys if b"{log:day:2026-12-01}" in k]
    assert len({_slot(k) for k in day}) == 1 and len(day) == 3  # records, totals, generation
    assert not raw.exists("ctxrules:v1:{conv-layout}:lock")  # released
    store.close()


def test_a_session_named_secret_is_listed_beside_the_store_wide_secrets(redis_url: str) -> None:
    # "secret" is a plain session id (a thread id as it is), and its keys share the hash tag of
    # the store-wide secrets; sessions() used to skip that tag, so the session was never listed
    # (nor searched by `vault get` without --session, nor scanned for checkpoints).
    store = _store(redis_url)
    store.secret(None, "injection.key", lambda: b"ab" * 16)
    assert store.sessions() == []  # the store-wide secret alone is no session
    _turn(store, "secret", [{"role": "user", "content": "hi"}])
    _turn(store, "conv-a", [{"role": "user", "content": "hi"}])
    assert store.sessions() == ["conv-a", "secret"]
    assert store.secret(None, "injection.key", lambda: b"cd" * 16) == b"ab" * 16  # untouched
    store.close()


def test_workers_agree_on_the_injection_key_after_the_server_lost_it(
    redis_url: str, raw: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A server restarted without persistence has lost the store-wide key. A worker that kept
    # signing with its copy forever, while a worker started after the restart made a new key,
    # no longer recognised the other's injected tags (notes and summaries injected twice).
    from ctxrules.stores import redis as redis_store

    first = _store(redis_url)
    key = first.secret(None, "injection.key", lambda: b"ab" * 16)
    raw.flushall()  # the restart
    monkeypatch.setattr(redis_store, "_SECRET_CHECK_S", 0.0)  # the check is due
    assert first.secret(None, "injection.key", lambda: b"xx" * 16) == key  # put back, not remade
    second = _store(redis_url)
    assert second.secret(None, "injection.key", lambda: b"cd" * 16) == key
    # A key another worker put there first is adopted.
    raw.set("ctxrules:v1:{secret}:injection.key", b"ef" * 16)
    assert first.secret(None, "injection.key", lambda: b"xx" * 16) == b"ef" * 16
    first.close()
    second.close()


def test_keys_planted_under_the_prefix_that_are_not_utf8_are_no_sessions_or_ledgers(redis_url: str, raw: Any) -> None:
    # Redis keys are bytes; ctxrules writes only UTF-8 ones. A foreign key under the prefix that
    # is not UTF-8 made sessions() and logs() raise UnicodeDecodeError: `ctxrules vault get`
    # without --session was an "internal error".
    store = _store(redis_url)
    call = {"type": "call", "tokens": {"input": 5}}
    logs = (Log("session", "conv-real"), Log("day", "2026-12-01"))
    _turn(store, "conv-real", [{"role": "user", "content": "hi"}], [(logs, call)])
    raw.set(b"ctxrules:v1:{\xff\xfe}:meta", b"x")
    raw.set(b"ctxrules:v1:{\xff}:log:session:records", b"x")
    raw.set(b"ctxrules:v1:{log:day:\xff}:log:records", b"x")
    assert store.sessions() == ["conv-real"]
    assert store.logs("session") == [Log("session", "conv-real")]
    assert store.logs("day") == [Log("day", "2026-12-01")]
    store.close()


def test_members_of_a_sessions_blob_set_that_name_no_item_read_as_absent(redis_url: str, raw: Any) -> None:
    """A member of ``{S}:blobs`` that is not UTF-8 made `sessions export` and `vault get PREFIX`
    an internal error (UnicodeDecodeError); one that is no vault id (`../../etc/passwd`) or
    names an item that is gone made `sessions export` refuse the whole session. They read as
    absent: the items that are there are listed and exported."""
    import io

    from ctxrules.stores.archive import export_session

    store = _store(redis_url)
    session = "conv-stray"
    _turn(store, session, [{"role": "user", "content": "hi"}])
    kept = store.put_blob(session, b"an item that is there")
    gone = "ab" * 32
    for member in (b"\xff", b"../../etc/passwd", gone.encode()):
        raw.sadd(f"ctxrules:v1:{{{session}}}:blobs", member)
    assert store.blob_ids(session) == sorted([kept, gone])
    assert store.blob_ids(session, kept[:12]) == [kept]
    out = io.BytesIO()
    counts = export_session(store, session, out)
    assert counts["blobs"] == 1 and kept in out.getvalue().decode() and gone not in out.getvalue().decode()
    _turn(store, session, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])
    store.close()


def test_ttls_are_refreshed_on_use_and_blobs_outlive_their_sessions(redis_url: str, raw: Any) -> None:
    store = _store(redis_url + "?ttl_s=100")
    s = "conv-ttl"
    blob = store.put_blob(s, b"original output")
    _turn(store, s, [{"role": "user", "content": "x"}])
    for part in ("state", "output", "rev", "blobs", "meta"):
        ttl = raw.pttl(f"ctxrules:v1:{{{s}}}:{part}")
        assert 95_000 < ttl <= 100_000, part
    blob_ttl = raw.ttl(f"ctxrules:v1:blob:{blob}")
    assert blob_ttl > 100  # twice the session's
    # A session key about to expire gets its full TTL back at the next commit.
    raw.pexpire(f"ctxrules:v1:{{{s}}}:state", 2000)
    # And a blob whose TTL fell below the session's is pushed out again when the upkeep is due.
    raw.expire(f"ctxrules:v1:blob:{blob}", 5)
    raw.hset(f"ctxrules:v1:{{{s}}}:meta", "blobs_extended", "0")
    _turn(store, s, [{"role": "user", "content": "y"}])
    assert raw.pttl(f"ctxrules:v1:{{{s}}}:state") > 95_000
    assert raw.ttl(f"ctxrules:v1:blob:{blob}") >= 100
    # Reading a blob never shortens its TTL (EXPIRE GT) but does push it out.
    raw.expire(f"ctxrules:v1:blob:{blob}", 7)
    assert store.get_blob(s, blob) == b"original output"
    assert raw.ttl(f"ctxrules:v1:blob:{blob}") > 100
    store.close()


@pytest.mark.parametrize(
    ("text", "reason"), [(b"[1, 2]", "a JSON list, not an object"), (b'{"version": 9}', "has version 9")]
)
def test_a_stored_state_that_is_no_object_or_of_another_version_is_reset_with_the_reason(
    redis_url: str, raw: Any, text: bytes, reason: str
) -> None:
    store = _store(redis_url)
    s = "conv-version"
    _turn(store, s, [{"role": "user", "content": "x"}])
    raw.set(f"ctxrules:v1:{{{s}}}:state", text, keepttl=True)
    state = _store(redis_url).load_turn(s).state
    assert reason in state.get("recovered", "")
    store.close()


def test_garbage_in_keys_of_the_right_type_is_read_as_absent(redis_url: str, raw: Any) -> None:
    """A blob upkeep time that is not a number, prepare records that are not ``start end
    holder``: values ctxrules never writes, in keys of the type it writes. They read as
    absent (the upkeep runs and rewrites its time; the record is skipped), never a
    ValueError out of a turn."""
    store = _store(redis_url + "?ttl_s=100")
    s = "conv-garbage"
    blob = store.put_blob(s, b"kept")
    _turn(store, s, [{"role": "user", "content": "x"}])
    raw.hset(f"ctxrules:v1:{{{s}}}:meta", "blobs_extended", "not a time")
    raw.expire(f"ctxrules:v1:blob:{blob}", 5)
    raw.lpush(f"ctxrules:v1:{{{s}}}:prepares", "junk", "1.0 nan x", "\xff\xfe")
    _turn(store, s, [{"role": "user", "content": "y"}])
    assert raw.ttl(f"ctxrules:v1:blob:{blob}") >= 100  # the upkeep ran
    assert float(raw.hget(f"ctxrules:v1:{{{s}}}:meta", "blobs_extended")) > 0
    held = store.prepares(s)
    assert held and all(math.isfinite(a) and math.isfinite(b) for a, b, _ in held)
    store.close()


def test_an_output_changed_behind_the_store_is_a_cache_miss(redis_url: str, raw: Any) -> None:
    a = _store(redis_url)
    s = "conv-tamper"
    out = [{"role": "user", "content": "the real text"}]
    _turn(a, s, out)
    raw.lset(f"ctxrules:v1:{{{s}}}:output", 0, json.dumps({"role": "user", "content": "injected"}))
    b = _store(redis_url)
    turn = b.load_turn(s)
    assert turn.output is None  # never text the session did not write
    assert turn.state["last"]["output_count"] == 1
    a.close()
    b.close()


def test_a_corrupt_blob_is_reported_not_returned(redis_url: str, raw: Any) -> None:
    from ctxrules.vault import VaultError

    store = _store(redis_url)
    blob = store.put_blob("conv-corrupt", b"good bytes")
    raw.set(f"ctxrules:v1:blob:{blob}", b"evil bytes")
    with pytest.raises(VaultError, match="corrupt"):
        store.get_blob("conv-corrupt", blob)
    store.close()


def test_a_worker_that_lost_its_lease_cannot_overwrite_the_turn(redis_url: str, raw: Any) -> None:
    slow, fast = _store(redis_url), _store(redis_url)
    s = "conv-fence"
    with slow.prepare_lock(s):
        state = slow.load_turn(s).state
        # The lease runs out (a paused process: simulated by dropping the key) and another
        # worker takes the lock and commits.
        raw.delete(f"ctxrules:v1:{{{s}}}:lock")
        with fast.prepare_lock(s):
            fast.commit_turn(s, fast.load_turn(s).state, [{"role": "user", "content": "fast"}])
            with pytest.raises(StoreError, match=r"\[CR149\]"):
                slow.commit_turn(s, state, [{"role": "user", "content": "slow"}])
    assert _store(redis_url).load_turn(s).output == [{"role": "user", "content": "fast"}]


def _append_calls(url: str, worker: int, n: int) -> None:
    store = _store(url)
    for i in range(n):
        usd = {"input": 0.001 * (worker + 1), "output": 0.0003 * i}
        record = {"type": "call", "id": f"{worker}-{i}", "tokens": {"input": 100 + i, "output": worker}, "usd": usd}
        store.append([Log("session", "conv-money"), Log("day", "2026-12-01"), Log("goal", "g")], record)
    store.close()


def test_ledger_totals_are_atomic_counters_that_add_up_exactly(redis_url: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append_calls, args=(redis_url, w, 40)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    store = _store(redis_url)
    for log in (Log("session", "conv-money"), Log("day", "2026-12-01"), Log("goal", "g")):
        records = [json.loads(line) for line in store.read_log(log).lines]
        assert len(records) == 160 and len({r["id"] for r in records}) == 160
        totals = store.totals(log)
        assert totals["calls"] == 160
        assert totals["tokens.input"] == sum(r["tokens"]["input"] for r in records)
        assert totals["tokens.output"] == sum(r["tokens"]["output"] for r in records)
        for part in ("input", "output"):
            assert math.isclose(totals[f"usd.{part}"], math.fsum(r["usd"][part] for r in records), abs_tol=1e-9)
    # A reset record restarts the totals; the records stay.
    store.append([Log("day", "2026-12-01")], {"type": "reset", "ts": time.time()})
    assert store.totals(Log("day", "2026-12-01")) == {}
    assert len(store.read_log(Log("day", "2026-12-01")).lines) == 161
    store.close()


def test_totals_holding_a_non_number_are_a_damaged_ledger_not_a_failed_call(redis_url: str, raw: Any) -> None:
    """A totals field that is not a number (written by hand, or by a bug): HINCRBY refused it, so
    every append raised CR148 after its record had gone in, and totals() raised ValueError. The
    totals are removed and count again from the next record, like totals of the wrong type."""
    store = _store(redis_url)
    session, day = Log("session", "conv-n"), Log("day", "2026-12-01")
    call = {"type": "call", "id": "a", "tokens": {"input": 5}, "usd": {"input": 0.5}}
    store.append([session, day], call)
    raw.hset("ctxrules:v1:{conv-n}:log:session:totals", "calls", "garbage")
    raw.hset("ctxrules:v1:{log:day:2026-12-01}:log:totals", "usd.input", "lots")
    store.append([session, day], {**call, "id": "b"})
    for log in (session, day):
        assert len(store.read_log(log).lines) == 2  # each record once
        assert store.totals(log) == {}  # removed with the record that found them
    store.append([session, day], {**call, "id": "c"})
    assert store.totals(day) == {"calls": 1, "tokens.input": 5, "usd.input": 0.5}
    raw.hset("ctxrules:v1:{conv-n}:log:session:totals", "tokens.input", "1.5")
    assert store.totals(session) == {}
    assert raw.exists("ctxrules:v1:{conv-n}:log:session:totals") == 0
    store.close()


def _prepares(url: str, worker: int, n: int) -> None:
    store = _store(url)
    for i in range(n):
        with store.prepare_lock("conv-serial"):
            turn = store.load_turn("conv-serial")
            out = [*(turn.output or []), {"role": "user", "content": f"{worker}-{i}"}]
            time.sleep(0.002)
            store.commit_turn("conv-serial", turn.state, out)
    store.close()


def test_prepares_of_one_session_never_overlap_across_processes(redis_url: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_prepares, args=(redis_url, w, 15)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    store = _store(redis_url)
    holds = store.prepares("conv-serial")
    assert len(holds) == 60
    assert len({h[2] for h in holds}) == 4  # four holders
    for (_, end, _), (start, _, _) in itertools.pairwise(holds):
        assert end <= start  # in the server's clock: each hold ends before the next begins
    out = store.load_turn("conv-serial").output
    assert out is not None and len(out) == 60  # no turn lost to a race
    store.close()


_HOLDER = """
import sys, time
from ctxrules.stores.redis import RedisStore
store = RedisStore.from_url(sys.argv[1])
lock = store.prepare_lock("conv-killed")
lock.__enter__()
print("held", flush=True)
time.sleep(600)
"""


def test_a_worker_killed_holding_the_lock_frees_it_within_the_lease(redis_url: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "engine")}
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, redis_url + "?lock_ttl_s=1"], stdout=subprocess.PIPE, env=env
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"held"
        store = _store(redis_url)
        # Alive, its lease is renewed: the lock stays held longer than the lease.
        from ctxrules.stores.base import StoreLockTimeout

        with pytest.raises(StoreLockTimeout, match=r"\[CR149\]"), store.prepare_lock("conv-killed", timeout=1.5):
            pass
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        started = time.monotonic()
        with store.prepare_lock("conv-killed", timeout=5):
            waited = time.monotonic() - started
        assert waited < 1.5  # the dead worker's lease ran out within lock_ttl_s
        store.close()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()


def test_a_restarted_server_costs_a_recompute_and_says_so(own_redis: RedisServer) -> None:
    store = _store(own_redis.url)
    s = "conv-restart"
    _turn(store, s, [{"role": "user", "content": "one"}])
    blob = store.put_blob(s, b"kept by the caller? no: by the store")
    own_redis.restart()
    turn = store.load_turn(s)
    assert turn.state == {"version": 1} and turn.output is None
    assert any("no longer holds session conv-restart" in n for n in turn.notes)
    assert not store.has_blob(s, blob)
    _turn(store, s, [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}])
    assert len(_store(own_redis.url).load_turn(s).output or []) == 2
    store.close()


def test_an_unreachable_server_is_a_clear_error_naming_the_url(tmp_path: Path) -> None:
    from ctxrules.stores.redis import RedisStore

    missing = RedisStore.from_url(f"unix://{tmp_path}/none.sock?connect_timeout_s=0.5")
    with pytest.raises(StoreUnavailable, match=rf"\[CR148\] cannot reach the Redis store unix://{tmp_path}/none.sock"):
        missing.load_turn("x")
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    refused = RedisStore.from_url(f"redis://user:hunter2@127.0.0.1:{port}/0")
    with pytest.raises(StoreUnavailable) as info:
        refused.load_turn("x")
    assert f"redis://user:***@127.0.0.1:{port}/0" in str(info.value) and "hunter2" not in str(info.value)


def test_a_server_that_never_answers_fails_within_the_timeout() -> None:
    from ctxrules.stores.redis import RedisStore

    # Accepts connections (the kernel does, backlog) but never answers a command.
    mute = socket.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen(8)
    try:
        store = RedisStore.from_url(f"redis://127.0.0.1:{mute.getsockname()[1]}/0?socket_timeout_s=0.5")
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match=r"\[CR148\].*no answer within 0.5s"):
            store.load_turn("x")
        assert time.monotonic() - started < 2.0
    finally:
        mute.close()


def test_on_error_local_serves_the_call_from_memory_and_says_so(own_redis: RedisServer) -> None:
    store = _store(own_redis.url + "?on_error=local&connect_timeout_s=0.5")
    own_redis.stop()
    # A call as a prepare makes it: the lock, the turn, the vault, the commit, the release.
    with store.prepare_lock("conv-local"):
        turn = store.load_turn("conv-local")
        assert any("on_error=local" in n and own_redis.url in n for n in turn.notes)
        blob = store.put_blob("conv-local", b"in memory")
        assert store.get_blob("conv-local", blob) == b"in memory"
        store.commit_turn("conv-local", turn.state, [{"role": "user", "content": "served anyway"}])
    # The next call tries Redis again; back up, it is served from Redis (and nothing was kept).
    own_redis.start()
    with store.prepare_lock("conv-local"):
        again = store.load_turn("conv-local")
        assert again.notes == [] and again.output is None
        store.commit_turn("conv-local", again.state, [{"role": "user", "content": "on redis"}])
    assert _store(own_redis.url).load_turn("conv-local").output == [{"role": "user", "content": "on redis"}]
    store.close()


def test_without_on_error_local_an_unreachable_lock_is_cr148(own_redis: RedisServer) -> None:
    store = _store(own_redis.url + "?connect_timeout_s=0.5")
    own_redis.stop()
    with pytest.raises(StoreUnavailable, match=r"\[CR148\]"), store.prepare_lock("conv-down"):
        pass
    assert store._active == 0  # a failed acquire leaves no call open
    store.close()


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("ttl_s=abc", "ttl_s='abc'"),
        ("ttl_s=0", "ttl_s must be a number of seconds above 0"),
        ("on_error=maybe", "on_error must be 'fail' or 'local'"),
        ("colour=blue", "unknown option 'colour'"),
        # Infinite or huge numbers of seconds: Redis takes no such expiry and the socket no
        # such timeout; they were an OverflowError traceback at the first command.
        ("ttl_s=inf", "ttl_s must be a number of seconds above 0 and at most 315360000, got inf"),
        ("log_ttl_s=inf", "log_ttl_s must be a number of seconds (0 or more) and at most 315360000"),
        ("lock_ttl_s=1e300", "lock_ttl_s must be a number of seconds above 0 and at most 315360000"),
        ("socket_timeout_s=inf", "socket_timeout_s must be"),
        ("connect_timeout_s=1e400", "connect_timeout_s must be"),
        ("lock_timeout_s=nan", "lock_timeout_s must be"),
    ],
)
def test_bad_url_options_are_one_line_errors(query: str, message: str) -> None:
    from ctxrules.stores import open_store

    with pytest.raises(StoreError, match=r"\[CR148\]") as info:
        open_store(f"redis://127.0.0.1:1/0?{query}")
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("db", ["abc", "3x", "-1", "1/2"])
def test_a_database_that_is_not_a_number_is_refused(db: str) -> None:
    """The client took `redis://host/abc` for db 0: a typo wrote into another database."""
    from ctxrules.stores import open_store

    with pytest.raises(StoreError, match=r"\[CR148\] .* the database in .* is not a number"):
        open_store(f"redis://127.0.0.1:1/{db}")


def test_the_lease_is_renewed_while_a_long_holder_runs(redis_url: str, raw: Any) -> None:
    store = _store(redis_url + "?lock_ttl_s=0.3")
    with store.prepare_lock("conv-long") as lock:
        time.sleep(1.0)  # three leases
        assert raw.get("ctxrules:v1:{conv-long}:lock") is not None
        lock.renew()  # explicit renewal at a step boundary works too
    assert raw.get("ctxrules:v1:{conv-long}:lock") is None
    renewer = store._renewer
    assert renewer is not None and renewer.thread.is_alive()
    store.close()
    assert not renewer.thread.is_alive()  # a closed store stops its renewer thread


def test_a_prepare_reads_turn_notes_and_ledgers_in_the_round_trip_that_takes_its_lock(redis_url: str) -> None:
    """What a prepare reads right after taking the lock comes with the lock; what this worker
    writes meanwhile is read back as written, and what other workers append is seen by the
    next prepare."""
    store, other = _store(redis_url), _store(redis_url)
    s, day = "conv-prefetch", Log("day", "2026-12-01")
    _turn(store, s, [{"role": "user", "content": "one"}])
    other.append([day], {"type": "call", "id": "a", "tokens": {"prompt": 1}})
    cursor = store.read_log(day).cursor
    other.write_doc(s, "notes", b"v1")
    import redis.connection as rc

    sent: list[int] = []
    original = rc.AbstractConnection.send_packed_command

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(1)
        return original(self, *args, **kwargs)

    rc.AbstractConnection.send_packed_command = counting  # type: ignore[method-assign]
    try:
        with store.prepare_lock(s):
            after_lock = len(sent)
            turn = store.load_turn(s, output=False)
            assert store.read_doc(s, "notes") == b"v1"
            assert store.read_log(day, cursor).lines == []
            assert len(sent) == after_lock  # all three came with the lock
            other.append([day], {"type": "call", "id": "b", "tokens": {"prompt": 2}})
            store.write_doc(s, "notes", b"v2")
            assert store.read_doc(s, "notes") == b"v2"  # this worker's own write, read back
            store.commit_turn(s, turn.state, [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}])
    finally:
        rc.AbstractConnection.send_packed_command = original  # type: ignore[method-assign]
    with store.prepare_lock(s):
        chunk = store.read_log(day, cursor)
        assert [json.loads(line)["id"] for line in chunk.lines] == ["b"]  # the next prepare sees it
    store.close()
    other.close()


def _wrong(client: Any, key: str, kind: str = "hash") -> None:
    client.delete(key)
    if kind == "hash":
        client.hset(key, "a", "b")
    elif kind == "list":
        client.rpush(key, "x")
    else:
        client.set(key, "garbage")


@pytest.mark.parametrize("where", ["server", "cluster"])
def test_wrong_typed_keys_are_repaired_on_every_path_and_only_the_damaged_ones(
    where: str, request: pytest.FixtureRequest
) -> None:
    """docs/stores.md "Damaged keys", on the store: the turn under the lock (a Cluster takes it
    with a script of its own), the reads and writes outside it (a document, the vault, a secret,
    ``save_state``), and the ledgers; another session's keys and the other ledgers stay."""
    import redis

    if where == "server":
        url = request.getfixturevalue("redis_url")
        client: Any = redis.Redis.from_url(url)
    else:
        url = request.getfixturevalue("redis_cluster_url")
        client = redis.RedisCluster.from_url(url.split("?", 1)[0])
    store = _store(url)
    day, goal = Log("day", "2026-12-01"), Log("goal", "g")
    call = {"type": "call", "id": "a", "tokens": {"input": 1}}
    for s in ("conv-a", "conv-b"):
        _turn(store, s, [{"role": "user", "content": "one"}], [((Log("session", s), day, goal), call)])
    bystander = {k: client.dump(k) for s in ("conv-b", "log:goal:g") for k in client.keys(f"ctxrules:v1:{{{s}}}:*")}

    # Under the lock: the commit's append and the rev check would refuse; the turn says why.
    _wrong(client, "ctxrules:v1:{conv-a}:output")
    _wrong(client, "ctxrules:v1:{conv-a}:log:session:gen", "list")
    fresh = _store(url)
    with fresh.prepare_lock("conv-a"):
        turn = fresh.load_turn("conv-a")
        assert (
            "output was a hash" in turn.state["recovered"] and "log:session:gen was a list" in turn.state["recovered"]
        )
        assert turn.output is None
        fresh.commit_turn("conv-a", turn.state, [{"role": "user", "content": "two"}])
    assert fresh.load_turn("conv-a").output == [{"role": "user", "content": "two"}]

    # Outside the lock: each read or write repairs the session, which the next load reports.
    for part, use in [
        ("doc:notes", lambda st: st.read_doc("conv-a", "notes")),
        ("doc:router", lambda st: st.update_doc("conv-a", "router", lambda old: b"x")),
        ("blobs", lambda st: st.blob_ids("conv-a")),
        ("media", lambda st: st.put_blob("conv-a", b"data", "text/plain")),
        ("secret:injection.key", lambda st: st.secret("conv-a", "injection.key", lambda: b"k" * 32)),
        ("rev", lambda st: st.load_turn("conv-a")),
        ("prepares", lambda st: st.prepares("conv-a")),
    ]:
        _wrong(client, f"ctxrules:v1:{{conv-a}}:{part}", "list" if part in ("meta", "media") else "hash")
        other = _store(url)
        use(other)
        assert f"{part} was a " in other.load_turn("conv-a").state.get("recovered", ""), part
        other.close()
    assert store.secret("conv-a", "injection.key", lambda: b"j" * 32) == b"k" * 32
    _wrong(client, "ctxrules:v1:{conv-a}:meta", "list")
    store.save_state("conv-a", {"version": 1, "compress": {}})  # what `compress` writes: it stands
    assert client.type("ctxrules:v1:{conv-a}:meta") == b"hash"
    assert store.load_turn("conv-a").state == {"version": 1, "compress": {}}

    # A damaged day ledger: the record goes to a fresh one, every other ledger gets it once.
    _wrong(client, "ctxrules:v1:{log:day:2026-12-01}:log:records", "string")
    store.append([Log("session", "conv-a"), day], call)
    assert len(store.read_log(day).lines) == 1 and store.totals(day) == {"calls": 1, "tokens.input": 1}
    assert len(store.read_log(Log("session", "conv-a")).lines) == 2
    _wrong(client, "ctxrules:v1:{log:day:2026-12-01}:log:gen", "hash")
    _wrong(client, "ctxrules:v1:{log:day:2026-12-01}:log:totals", "list")
    assert len(store.read_log(day).lines) == 1 and store.totals(day) == {}
    _wrong(client, "ctxrules:v1:{conv-a}:log:descendants:records", "hash")
    assert store.append_once(Log("descendants", "conv-a"), {"path": "x"}, key="path", limit=5) == "added"
    assert {k: client.dump(k) for k in bystander} == bystander
    store.close()
    fresh.close()
    client.close()
