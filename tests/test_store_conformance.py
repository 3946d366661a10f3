"""The Store protocol's behaviour, the same tests against every backend: the filesystem store,
the Redis store on a real ``redis-server`` (tests/redis_server.py) and on a real three-node
Redis Cluster (``cluster=yes``), and the in-memory store.

"Two workers" are two store objects on the same backend (two FilesystemStore objects on one
directory, two RedisStore clients of one server); the in-memory store has only itself.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ctxrules.stores.base import Log, Store, StoreLockTimeout
from ctxrules.summarize.lock import CompactionBusy
from ctxrules.vault import Vault, VaultError

Opener = Callable[[], Store]


@pytest.fixture(params=["file", "redis", "redis-cluster", "memory"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    opened: list[Store] = []
    if request.param == "file":
        from ctxrules.stores.filesystem import FilesystemStore

        def make() -> Store:
            store = FilesystemStore(tmp_path / "state")
            opened.append(store)
            return store

    elif request.param in ("redis", "redis-cluster"):
        from ctxrules.stores.redis import RedisStore

        if request.param == "redis":
            url = request.getfixturevalue("redis_url") + "?lock_ttl_s=2"
        else:  # three primaries: a session's keys on one node, its blobs and the ledgers on others
            url = request.getfixturevalue("redis_cluster_url") + "&lock_ttl_s=2"

        def make() -> Store:
            store = RedisStore.from_url(url)
            opened.append(store)
            return store

    else:
        from ctxrules.stores.memory import MemoryStore

        shared = MemoryStore()

        def make() -> Store:
            return shared

    yield make
    for store in opened:
        store.close()


def _messages(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} é ✓"} for i in range(start, n)]


def test_a_new_session_reads_as_new(opener: Opener) -> None:
    store = opener()
    s = store.session_key("conv-new")
    turn = store.load_turn(s)
    assert turn.state == {"version": 1}
    assert turn.output is None
    assert not store.exists(s)


def test_a_turn_committed_by_one_worker_is_read_by_another(opener: Opener) -> None:
    a, b = opener(), opener()
    s = a.session_key("conv-1")
    out = _messages(4)
    state = {"stages": {"x": {"n": 1}}, "fingerprint": "f1", "last": {"count": 4, "chain": "c"}}
    with a.prepare_lock(s):
        a.commit_turn(s, state, out)
    turn = b.load_turn(s)
    assert turn.output == out
    assert turn.state["stages"] == {"x": {"n": 1}}
    assert turn.state["last"]["output_count"] == 4
    assert b.exists(s)
    assert s in b.sessions()


def test_warm_turns_alternating_workers_keep_the_whole_output(opener: Opener) -> None:
    workers = [opener(), opener()]
    s = workers[0].session_key("conv-warm")
    out: list[dict[str, Any]] = []
    for turn_no in range(6):
        store = workers[turn_no % 2]
        with store.prepare_lock(s):
            turn = store.load_turn(s)
            base = turn.output if turn.output is not None else []
            assert base == out
            out = [*base, *_messages(2 * turn_no + 2, 2 * turn_no)]
            store.commit_turn(s, turn.state, out)
    for store in workers:
        assert store.load_turn(s).output == out


def test_output_holds_only_what_this_object_wrote(opener: Opener) -> None:
    a = opener()
    s = a.session_key("conv-holds")
    out = _messages(3)
    with a.prepare_lock(s):
        a.commit_turn(s, {}, out)
    assert a.output_holds(s, out)
    assert not a.output_holds(s, [dict(m) for m in out])  # equal, but not the same objects
    assert not a.output_holds(s, out[:2])


def test_save_state_keeps_the_output(opener: Opener) -> None:
    a = opener()
    s = a.session_key("conv-restore")
    out = _messages(2)
    with a.prepare_lock(s):
        a.commit_turn(s, {"fingerprint": "one"}, out)
    saved = a.load_turn(s).state
    with a.prepare_lock(s):
        a.commit_turn(s, {"fingerprint": "two"}, out)
        a.save_state(s, saved)
    b = opener()
    turn = b.load_turn(s)
    assert turn.state["fingerprint"] == "one"
    assert turn.output == out


def test_blobs_are_content_addressed_and_per_session(opener: Opener) -> None:
    a, b = opener(), opener()
    s1, s2 = a.session_key("conv-b1"), a.session_key("conv-b2")
    data = "a line\r\nanother ✓\n\x00bytes".encode()
    blob_id = a.put_blob(s1, data)
    assert blob_id == hashlib.sha256(data).hexdigest()
    assert a.put_blob(s1, data) == blob_id  # idempotent
    assert b.get_blob(s1, blob_id) == data
    assert b.has_blob(s1, blob_id)
    assert not b.has_blob(s2, blob_id)  # a session sees the blobs it put
    with pytest.raises(VaultError):
        b.get_blob(s2, blob_id)
    other = "0" * 64
    assert b.missing_blobs(s1, [blob_id, other]) == {other}
    # Marker ids come from any text: a prefix names no item, on every store (no error).
    assert Vault.of(b, s1).missing([blob_id, other, blob_id[:12]]) == {other, blob_id[:12]}
    media = a.put_blob(s1, b"\x89PNG...", media_type="image/png")
    assert b.blob_media_type(s1, media) == "image/png"
    assert b.blob_media_type(s1, blob_id) is None
    assert b.blob_ids(s1) == sorted([blob_id, media])
    assert b.blob_ids(s1, blob_id[:12]) == [blob_id]


def test_racing_blob_writers_agree(opener: Opener) -> None:
    stores = [opener() for _ in range(4)]
    s = stores[0].session_key("conv-race")
    data = b"x" * 100_000
    ids: list[str] = []
    threads = [threading.Thread(target=lambda st=st: ids.append(st.put_blob(s, data))) for st in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(ids)) == 1
    assert stores[0].get_blob(s, ids[0]) == data


def test_document_updates_never_lose_a_writer(opener: Opener) -> None:
    stores = [opener() for _ in range(4)]
    s = stores[0].session_key("conv-docs")

    def bump(current: bytes | None) -> bytes:
        return str(int(current or b"0") + 1).encode()

    def worker(store: Store) -> None:
        for _ in range(25):
            store.update_doc(s, "notes", bump)

    threads = [threading.Thread(target=worker, args=(st,)) for st in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert stores[0].read_doc(s, "notes") == b"100"
    stores[1].update_doc(s, "notes", lambda _cur: None)  # None: leave it
    assert stores[2].read_doc(s, "notes") == b"100"
    stores[1].write_doc(s, "checkpoint", b'{"status": "running"}')
    assert stores[3].read_doc(s, "checkpoint") == b'{"status": "running"}'
    stores[1].write_doc(s, "checkpoint", None)
    assert stores[3].read_doc(s, "checkpoint") is None


def test_logs_keep_every_record_and_read_incrementally(opener: Opener) -> None:
    stores = [opener() for _ in range(4)]
    s = stores[0].session_key("conv-logs")
    logs = (Log("session", s), Log("day", "2026-12-01"), Log("goal", "ship-it"))

    def worker(n: int, store: Store) -> None:
        for i in range(20):
            store.append(logs, {"type": "call", "id": f"{n}-{i}", "tokens": {"input": 3, "output": 1}})

    threads = [threading.Thread(target=worker, args=(n, st)) for n, st in enumerate(stores)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    reader = opener()
    for log in logs:
        chunk = reader.read_log(log)
        assert len(chunk.lines) == 80
        assert len({line for line in chunk.lines}) == 80  # whole records, none torn or doubled
        more = reader.read_log(log, chunk.cursor)
        assert more.lines == [] and not more.restarted
        stores[0].append([log], {"type": "call", "id": "late", "tokens": {"input": 1}})
        late = reader.read_log(log, more.cursor)
        assert len(late.lines) == 1 and b'"late"' in late.lines[0]
    assert Log("day", "2026-12-01") in reader.logs("day")
    assert Log("goal", "ship-it") in reader.logs("goal")


def test_the_prepare_lock_excludes_other_workers_and_times_out(opener: Opener) -> None:
    a, b = opener(), opener()
    s = a.session_key("conv-lock")
    inside: list[int] = []
    overlaps: list[int] = []

    def worker(store: Store) -> None:
        for _ in range(10):
            with store.prepare_lock(s):
                inside.append(1)
                if len(inside) > 1:
                    overlaps.append(1)
                threading.Event().wait(0.001)
                inside.pop()

    threads = [threading.Thread(target=worker, args=(st,)) for st in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == []
    if a is b:  # the in-memory store's lock is a thread lock of its own
        return
    with a.prepare_lock(s), pytest.raises(StoreLockTimeout), b.prepare_lock(s, timeout=0.2):
        pass


def test_a_busy_compaction_lock_is_not_waited_for(opener: Opener) -> None:
    a, b = opener(), opener()
    s = a.session_key("conv-compaction")
    with a.compaction_lock(s), pytest.raises(CompactionBusy), b.compaction_lock(s):
        pass
    with b.compaction_lock(s):
        pass


def test_a_secret_is_made_once_for_every_worker(opener: Opener) -> None:
    a, b = opener(), opener()
    # Secrets are hex keys (the injection key); the filesystem store refuses anything else.
    key_a, key_b = b"a1" * 16, b"b2" * 16
    first = a.secret(None, "injection-key", lambda: key_a)
    assert b.secret(None, "injection-key", lambda: key_b) == first == key_a
    s = a.session_key("conv-secret")
    assert b.secret(s, "injection-key", lambda: key_a) == a.secret(s, "injection-key", lambda: key_b) == key_a


def test_a_secret_the_store_holds_is_found_without_making_one(opener: Opener) -> None:
    """``existing_secret`` asks for a key without letting the store make one: a session's own
    key (what ``sessions import`` brings) is found, in another worker too, and a session
    without one is None. On Redis the key was made before the store was asked, so the refusal
    to make one hid every stored key: an imported session lost its key, and an export from
    Redis carried none."""
    from ctxrules.injected import existing_secret

    a, b = opener(), opener()
    s, other = a.session_key("conv-own-key"), a.session_key("conv-no-key")
    assert existing_secret(a, s) is None and existing_secret(a, None) is None
    a.secret(s, "injection.key", lambda: b"c3" * 16)
    a.secret(None, "injection.key", lambda: b"d4" * 16)
    assert existing_secret(b, s) == b"c3" * 16 and existing_secret(b, None) == b"d4" * 16
    assert existing_secret(b, other) is None


def test_append_once_checks_and_appends_under_one_lock(opener: Opener) -> None:
    stores = [opener() for _ in range(4)]
    root = stores[0].session_key("conv-root")
    log = Log("descendants", root)
    outcomes: list[str] = []

    def worker(n: int, store: Store) -> None:
        for i in range(6):
            # Every worker tries the same six children: each is added once, then the cap holds.
            outcomes.append(store.append_once(log, {"path": f"child-{i}", "by": n}, key="path", limit=5))

    threads = [threading.Thread(target=worker, args=(n, st)) for n, st in enumerate(stores)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count("added") == 5
    assert outcomes.count("full") >= 1
    lines = stores[0].read_log(log).lines
    assert len(lines) == 5
