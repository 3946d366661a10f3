"""The filesystem store: the Store protocol over session directories, with today's layout and
guarantees (no link followed, private modes, atomic and durable writes, locks across processes),
and a state root written before sessions went behind the protocol read as it is."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import FIXTURES, REPO
from spool_kit import LIVE_ITEM, stale_spool_goes_live_one_stays

from ctxrules.errors import UsageError
from ctxrules.private_files import UnsafePathError
from ctxrules.stores import Log, StoreLockTimeout, open_store, store_from_options
from ctxrules.stores.filesystem import FilesystemStore
from ctxrules.summarize.lock import CompactionBusy
from ctxrules.vault import Vault, VaultError

MSGS = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]


def _store(tmp_path: Path) -> tuple[FilesystemStore, str]:
    store = FilesystemStore(tmp_path / "state")
    return store, store.session_key("s1")


def test_a_plain_name_is_a_directory_under_the_root_and_a_path_stays_a_path(tmp_path: Path) -> None:
    store = FilesystemStore(tmp_path)
    assert store.session_key("abc") == str(tmp_path / "abc")
    assert store.session_key("x/y") == "x/y"
    odd = "a b/../c"  # has a separator: a path, as the caller wrote it
    assert store.session_key(odd) == odd
    assert store.session_key("é" * 3) == str(tmp_path / hashlib.sha256(("é" * 3).encode()).hexdigest())


def test_turn_round_trip_and_a_tampered_output_is_a_miss(tmp_path: Path) -> None:
    store, key = _store(tmp_path)
    assert store.load_turn(key).state == {"version": 1}
    state = {"fingerprint": "f", "last": {"count": 2, "chain": "c"}}
    store.commit_turn(key, state, MSGS)
    turn = FilesystemStore(tmp_path / "state").load_turn(key)  # another process, in effect
    assert turn.output == MSGS and turn.state["last"]["output_count"] == 2
    written = Path(key, "last_output.jsonl").read_bytes()
    assert turn.state["last"]["output_digest"] == hashlib.sha256(written).hexdigest()
    # The same size, other bytes: the digest refuses it.
    out = Path(key, "last_output.jsonl")
    out.write_bytes(out.read_bytes().replace(b"hello", b"HELLO"))
    assert FilesystemStore(tmp_path / "state").load_turn(key).output is None
    for path in (Path(key, "state.json"), out):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(Path(key).stat().st_mode) == 0o700


def test_a_damaged_state_reads_as_new_with_the_reason(tmp_path: Path) -> None:
    store, key = _store(tmp_path)
    store.commit_turn(key, {"fingerprint": "f"}, MSGS)
    Path(key, "state.json").write_text('{"version": 1, "fingerprint": 7}')
    turn = FilesystemStore(tmp_path / "state").load_turn(key)
    assert "fingerprint is a int" in turn.state["recovered"] and turn.output is None


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("[1, 2]", "a JSON list, not an object"),
        ('"state"', "a JSON str, not an object"),
        ('{"version": 2, "fingerprint": "f"}', "has version 2, not 1"),
        ('{"fingerprint": "f"}', "has version None, not 1"),
    ],
)
def test_a_state_that_is_no_object_or_of_another_version_is_reset_with_the_reason(
    tmp_path: Path, text: str, reason: str
) -> None:
    # They were reset silently: the session started cold with nothing in the report to say why.
    store, key = _store(tmp_path)
    store.commit_turn(key, {"fingerprint": "f"}, MSGS)
    Path(key, "state.json").write_text(text)
    turn = FilesystemStore(tmp_path / "state").load_turn(key)
    assert reason in turn.state.get("recovered", "") and turn.output is None


def test_save_state_leaves_the_output_alone(tmp_path: Path) -> None:
    store, key = _store(tmp_path)
    store.commit_turn(key, {"fingerprint": "f"}, MSGS)
    before = Path(key, "last_output.jsonl").read_bytes()
    state = store.load_turn(key).state
    store.save_state(key, {**state, "compress": {"timed_out_patterns": ["x"]}})
    assert Path(key, "last_output.jsonl").read_bytes() == before
    turn = FilesystemStore(tmp_path / "state").load_turn(key)
    assert turn.state["compress"] == {"timed_out_patterns": ["x"]} and turn.output == MSGS


def test_blobs_are_content_addressed_verified_and_listed(tmp_path: Path) -> None:
    store, key = _store(tmp_path)
    blob = store.put_blob(key, b"abc\n")
    assert blob == hashlib.sha256(b"abc\n").hexdigest()
    assert store.put_blob(key, b"abc\n") == blob  # idempotent
    png = store.put_blob(key, b"\x89PNG", "image/png")
    assert store.get_blob(key, blob) == b"abc\n"
    assert store.blob_media_type(key, png) == "image/png" and store.blob_media_type(key, blob) is None
    assert store.blob_ids(key) == sorted([blob, png])
    assert store.blob_ids(key, blob[:12]) == [blob]
    assert store.missing_blobs(key, [blob, "0" * 64]) == {"0" * 64}
    path = Path(key, "vault", blob[:2], blob)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.write_bytes(b"abd\n")
    with pytest.raises(VaultError, match="corrupt"):
        store.get_blob(key, blob)
    assert store.put_blob(key, b"abc\n") == blob and store.get_blob(key, blob) == b"abc\n"  # a put repairs it
    # The Vault front reads any store through the same calls.
    assert Vault.of(store, key).get_lines(blob[:12], 1, 1) == b"abc\n"


def test_a_planted_vault_link_receives_nothing(tmp_path: Path) -> None:
    store, key = _store(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    Path(key).mkdir(parents=True)
    os.symlink(elsewhere, Path(key, "vault"))
    with pytest.raises(UnsafePathError, match="symbolic link"):
        store.put_blob(key, b"secret")
    assert list(elsewhere.iterdir()) == []


def test_a_vault_removed_or_linked_after_a_write_is_checked_again(tmp_path: Path) -> None:
    """The vault's directories are checked once per turn, not per write: a vault removed
    between two writes is created again, and a link planted after a turn's commit is refused."""
    store, key = _store(tmp_path)
    first = store.put_blob(key, b"one")
    shutil.rmtree(Path(key, "vault"))
    second = store.put_blob(key, b"two")
    assert store.get_blob(key, second) == b"two" and store.missing_blobs(key, [first]) == {first}
    writer = Vault.of(store, key).open_writer()
    writer.write(b"three")
    shutil.rmtree(Path(key, "vault", second[:2]))
    assert store.get_blob(key, writer.commit()) == b"three"  # the shard is made again too
    store.commit_turn(key, {}, [])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.rmtree(Path(key, "vault"))
    os.symlink(elsewhere, Path(key, "vault"))
    with pytest.raises(UnsafePathError, match="symbolic link"):
        store.put_blob(key, b"one")
    assert list(elsewhere.iterdir()) == []


def test_a_vault_link_planted_outside_a_turn_is_refused_once_the_check_is_old(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writers outside a turn (no commit_turn) get their directories checked again too, once
    the last check is older than a moment."""
    import ctxrules.stores.filesystem as filesystem

    store, key = _store(tmp_path)
    store.put_blob(key, b"one")
    monkeypatch.setattr(filesystem, "_CHECK_S", 0.0)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.rmtree(Path(key, "vault"))
    os.symlink(elsewhere, Path(key, "vault"))
    with pytest.raises(UnsafePathError, match="symbolic link"):
        store.put_blob(key, b"two")
    assert list(elsewhere.iterdir()) == []


def test_a_spool_a_killed_writer_left_is_removed_by_the_next_write_and_a_live_ones_kept(tmp_path: Path) -> None:
    """A vault writer killed mid-write (``kill -9``, the OOM killer during ``compress`` of a huge
    output) left its spool file in the vault for good: nothing names it. The next command that
    writes the session's vault removes one untouched for an hour whose writer is gone; the spool
    of a live writer in another process, however long idle, stays and commits."""
    state, session = tmp_path / "state", str(tmp_path / "state" / "s")
    vault = Path(session) / "vault"
    item = stale_spool_goes_live_one_stays(
        store=str(state),
        session=session,
        spools=lambda: sorted(vault.glob(".tmp-*")),
        env={**os.environ, "PYTHONPATH": str(REPO / "engine")},
        cwd=tmp_path,
        compress=["--session", session],
        output="".join(f"tests/test_{i}.py::test_x PASSED\n" for i in range(3000)).encode(),
        stored=Vault.of(FilesystemStore(state), session).exists,
    )
    assert Vault.of(FilesystemStore(state), session).get(item) == LIVE_ITEM


def _in_shard(shard: str, n: int) -> list[bytes]:
    """``n`` distinct items whose ids fall in ``shard``."""
    found: list[bytes] = []
    i = 0
    while len(found) < n:
        data = b"item %d" % i
        if hashlib.sha256(data).hexdigest().startswith(shard):
            found.append(data)
        i += 1
    return found


def test_a_temporary_file_a_killed_item_write_left_in_a_shard_goes_with_the_next_write_there(tmp_path: Path) -> None:
    """An item is written to a temporary file in its shard and renamed: a writer killed
    between the two (``kill -9`` in ``put_blob``) left that file for good. The next write to
    that shard by a store object removes one untouched for an hour; a fresh one (a writer at
    work) stays, and so do those of shards the write does not touch (not listed: cheap)."""
    store, key = _store(tmp_path)
    first, second = _in_shard("ab", 2)
    [other] = _in_shard("cd", 1)
    store.put_blob(key, first)
    store.put_blob(key, other)
    vault = Path(key) / "vault"
    stale, fresh, elsewhere = vault / "ab" / ".tmp-0123", vault / "ab" / ".tmp-4567", vault / "cd" / ".tmp-89ab"
    an_hour_ago = time.time() - 3700
    for path in (stale, fresh, elsewhere):
        path.write_bytes(b"part of an item")
        path.chmod(0o600)
    for path in (stale, elsewhere):
        os.utime(path, (an_hour_ago, an_hour_ago))
    later = FilesystemStore(tmp_path / "state")  # the next command
    listed: list[str] = []
    scandir = os.scandir

    def spy(path: str) -> object:
        listed.append(os.path.relpath(path, vault))
        return scandir(path)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "scandir", spy)
        later.put_blob(key, second)
    assert not stale.exists()
    assert fresh.exists() and elsewhere.exists()
    assert sorted(listed) == [".", "ab"]
    assert later.get_blob(key, hashlib.sha256(second).hexdigest()) == second


def test_an_item_write_whose_temporary_file_was_swept_meanwhile_writes_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shard's temporary file is marked by no lock: a writer stopped for an hour between
    creating it and renaming it (SIGSTOP) finds it removed by another's sweep. Its rename
    fails and the item is written again, whole: nothing is lost or cut short."""
    import ctxrules.stores.filesystem as filesystem

    store, key = _store(tmp_path)
    replace = filesystem._replace_item
    swept: list[str] = []

    def swept_first(src: str, dst: str) -> None:
        if not swept:
            swept.append(src)
            os.unlink(src)  # the sweep of another process, while this one stood still
        replace(src, dst)

    monkeypatch.setattr(filesystem, "_replace_item", swept_first)
    blob_id = store.put_blob(key, b"an item")
    assert swept and not Path(swept[0]).exists()
    assert FilesystemStore(tmp_path / "state").get_blob(key, blob_id) == b"an item"
    assert not list((Path(key) / "vault").rglob(".tmp-*"))


def test_documents_update_under_their_lock_across_processes(tmp_path: Path) -> None:
    store, key = _store(tmp_path)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_add_notes, args=(key, w)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    notes = json.loads(store.read_doc(key, "notes") or b"{}")["notes"]
    assert sorted(n["text"] for n in notes) == sorted(f"w{w} n{i}" for w in range(4) for i in range(10))
    assert Path(key, ".notes.lock").is_file()  # the same lock file as before


def _add_notes(key: str, worker: int) -> None:
    from ctxrules.notes import SessionNotes

    notes = SessionNotes(store=FilesystemStore(Path(key).parent), session=key)
    for i in range(10):
        notes.add(f"w{worker} n{i}")


def test_update_doc_leaves_the_document_when_update_returns_none(tmp_path: Path) -> None:
    store, key = _store(tmp_path)
    store.update_doc(key, "router", lambda raw: b'{"decisions": []}')
    mtime = Path(key, "router.json").stat().st_mtime_ns
    store.update_doc(key, "router", lambda raw: None)
    assert Path(key, "router.json").stat().st_mtime_ns == mtime
    store.write_doc(key, "checkpoint", b"{}")
    assert store.read_doc(key, "checkpoint") == b"{}"
    store.write_doc(key, "checkpoint", None)
    assert store.read_doc(key, "checkpoint") is None


def test_logs_read_incrementally_and_end_a_torn_line(tmp_path: Path) -> None:
    store, key = _store(tmp_path)
    log = Log("session", key)
    store.append([log, Log("day", "2026-01-01")], {"type": "call", "n": 1})
    chunk = store.read_log(log)
    assert [json.loads(x)["n"] for x in chunk.lines] == [1]
    with open(Path(key, "ledger.jsonl"), "ab") as fh:
        fh.write(b'{"type": "call", "n"')  # a writer that died mid-line
    assert store.read_log(log, chunk.cursor).lines == []  # incomplete lines wait
    store.append([log], {"type": "call", "n": 2})
    later = store.read_log(log, chunk.cursor)
    assert [x for x in later.lines] == [b'{"type": "call", "n"', b'{"n": 2, "type": "call"}']
    assert store.read_log(log, later.cursor).lines == []
    assert store.logs("day") == [Log("day", "2026-01-01")]
    assert (tmp_path / "state" / "ledger" / "days" / "2026-01-01.jsonl").is_file()


def test_a_ledger_link_is_refused_when_read_too(tmp_path: Path) -> None:
    store, key = _store(tmp_path)
    target = tmp_path / "other.jsonl"
    target.write_text('{"type": "call"}\n')
    Path(key).mkdir(parents=True)
    os.symlink(target, Path(key, "ledger.jsonl"))
    with pytest.raises(UnsafePathError, match="symbolic link"):
        store.read_log(Log("session", key))
    with pytest.raises(UnsafePathError, match="symbolic link"):
        store.append([Log("session", key)], {"type": "call"})
    assert target.read_text() == '{"type": "call"}\n'


def test_append_once_is_check_and_append(tmp_path: Path) -> None:
    store, key = _store(tmp_path)
    log = Log("descendants", key)
    assert store.append_once(log, {"path": "a"}, key="path", limit=2) == "added"
    assert store.append_once(log, {"path": "a"}, key="path", limit=2) == "present"
    assert store.append_once(log, {"path": "b"}, key="path", limit=2) == "added"
    assert store.append_once(log, {"path": "c"}, key="path", limit=2) == "full"
    assert len(store.read_log(log).lines) == 2


def test_append_once_reads_a_line_nested_past_the_stack_as_naming_nothing(tmp_path: Path) -> None:
    """A damaged line of the descendants log raised RecursionError out of ``append_once`` (so
    out of ``session.child``)."""
    store, key = _store(tmp_path)
    log = Log("descendants", key)
    assert store.append_once(log, {"path": "a"}, key="path", limit=5) == "added"
    with open(store.log_path(log), "a") as fh:
        fh.write("[" * 100_000 + "]" * 100_000 + "\n")
    assert store.append_once(log, {"path": "a"}, key="path", limit=5) == "present"
    assert store.append_once(log, {"path": "b"}, key="path", limit=5) == "added"


def test_the_prepare_lock_waits_then_times_out_with_a_clear_error(tmp_path: Path) -> None:
    store, key = _store(tmp_path)
    Path(key).mkdir(parents=True)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from ctxrules.locks import FileLock\n"
            f"l = FileLock({str(Path(key, '.lock'))!r}); l.acquire(); print('held', flush=True); time.sleep(30)",
        ],
        env={**os.environ, "PYTHONPATH": str(REPO / "engine")},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(StoreLockTimeout, match="stayed locked"), store.prepare_lock(key, timeout=0.2):
            pass
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    with store.prepare_lock(key, timeout=5) as lock:
        lock.renew()  # a file lock is held until release: renew is a no-op


def test_the_compaction_lock_is_taken_without_waiting(tmp_path: Path) -> None:
    store, key = _store(tmp_path)
    seen: list[str] = []
    with store.compaction_lock(key):
        worker = threading.Thread(target=lambda: _try_compaction(store, key, seen))
        worker.start()
        worker.join(10)
    assert seen == ["busy"]


def _try_compaction(store: FilesystemStore, key: str, seen: list[str]) -> None:
    try:
        with store.compaction_lock(key):
            seen.append("got it")
    except CompactionBusy:
        seen.append("busy")


def test_a_secret_is_made_once_and_a_link_is_refused(tmp_path: Path) -> None:
    store, _key = _store(tmp_path)
    first = store.secret(None, "injection.key", lambda: b"\x01" * 32)
    assert store.secret(None, "injection.key", lambda: b"\x02" * 32) == first
    assert (tmp_path / "state" / "injection.key").read_text() == "01" * 32 + "\n"
    other = FilesystemStore(tmp_path / "o")
    (tmp_path / "o").mkdir()
    os.symlink(tmp_path / "state" / "injection.key", tmp_path / "o" / "injection.key")
    with pytest.raises(UsageError, match="symbolic link"):
        other.secret(None, "injection.key", lambda: b"\x03" * 32)


def test_a_secret_being_created_is_never_read_half_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first prepares of two sessions under one new state root (two threads of a server,
    two workers) both ask for the injection key. The key file was created empty and written
    after: the second asker, reading in between, failed with "not an injection key ... delete
    it". Here the second asks at that very point (when the first opens the file to write it):
    both get one key."""
    root = tmp_path / "state"
    creator, other = FilesystemStore(root), FilesystemStore(root)
    real_fdopen = os.fdopen
    asked: list[bytes] = []
    first_open = [True]

    def fdopen_then_ask(fd: int, *args: object, **kwargs: object) -> object:
        handle = real_fdopen(fd, *args, **kwargs)  # type: ignore[call-overload]
        if first_open.pop() if first_open else False:
            # The first creator is about to write its key: the other one asks now.
            asked.append(other.secret(None, "injection.key", lambda: b"\x02" * 32))
        return handle

    monkeypatch.setattr(os, "fdopen", fdopen_then_ask)
    first = creator.secret(None, "injection.key", lambda: b"\x01" * 32)
    monkeypatch.undo()
    assert asked == [first]
    assert FilesystemStore(root).secret(None, "injection.key", lambda: b"\x03" * 32) == first
    assert sorted(p.name for p in root.iterdir()) == ["injection.key"]  # no spare file left


def test_sessions_lists_every_session_directory_children_too(tmp_path: Path) -> None:
    store = FilesystemStore(tmp_path)
    for name in ("a", "b/sub/child"):
        store.commit_turn(str(tmp_path / name), {}, MSGS)
    store.append([Log("day", "2026-01-01")], {"type": "call"})  # ledger/ is not a session
    assert store.sessions() == [str(tmp_path / "a"), str(tmp_path / "b/sub/child")]
    assert store.exists(str(tmp_path / "a")) and not store.exists(str(tmp_path / "zz"))


def test_store_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(open_store(f"file://{tmp_path}"), FilesystemStore)
    assert open_store(f"file://{tmp_path}").root == tmp_path  # type: ignore[attr-defined]
    assert open_store(str(tmp_path)).root == tmp_path  # type: ignore[attr-defined]
    with pytest.raises(UsageError, match="unknown store URL 'ftp://u:\\*\\*\\*@h/x'"):
        open_store("ftp://u:pw@h/x")
    with pytest.raises(UsageError, match="not both"):
        store_from_options("file:///x", "/y")
    monkeypatch.setenv("CTXRULES_STORE", "file:///from-env")
    assert store_from_options(None, None) == "file:///from-env"
    assert store_from_options(None, str(tmp_path)) == tmp_path.as_uri()


# --- a state root written before the Store -------------------------------------------------------


def test_a_state_root_written_by_the_previous_code_is_read_as_it_is(tmp_path: Path) -> None:
    from ctxrules.budget.tracker import SessionLedger
    from ctxrules.dangling import marker_ids
    from ctxrules.engine import Engine
    from ctxrules.notes import load_notes
    from ctxrules.tracker import load_tracked

    src = FIXTURES / "sessions" / "v1"
    shutil.copytree(src / "state", tmp_path / "state")
    os.chmod(tmp_path / "state", 0o700)
    key = str(tmp_path / "state" / "s1")
    _as_written_in_place(Path(key))
    store = FilesystemStore(tmp_path / "state")
    turn = store.load_turn(key)
    assert "recovered" not in turn.state
    expected = [json.loads(line) for line in Path(key, "last_output.jsonl").read_text().splitlines()]
    assert turn.output == expected
    ids = marker_ids(expected)
    assert ids and store.missing_blobs(key, sorted(ids)) == set()
    for blob in ids:
        assert hashlib.sha256(store.get_blob(key, blob)).hexdigest() == blob
    assert [n.text for n in load_notes(Path(key))] == ["tests live in tests/unit"]
    assert [t.path for t in load_tracked(Path(key))] == ["/tmp/example.py"]
    ledger = SessionLedger(Path(key), "s1", state_root=tmp_path / "state")
    assert ledger.status(now=1764547300.0).totals.calls == 1
    assert ledger.day_entries(1764547300.0)[0][0].tokens.prompt == 1000
    # The session goes on: a new prepare over the same history, markers resolvable.
    history = json.loads((src / "history.json").read_text())
    session = Engine.load("builtin:default").session(Path(key), model="gpt-4o", window=20000)
    out = session.prepare([*history, {"role": "assistant", "content": "next"}]).messages
    vault = Vault.for_session(Path(key))
    assert all(vault.exists(i) for i in marker_ids(out))
    assert session.notes.list()[0].tags == ("testing",)


def _as_written_in_place(session: Path) -> None:
    """A checkout copies files to new inodes; the state names its output file by inode and size
    (plus the sha256 the new code checks): point it at the copy, as if written here."""
    state_file = session / "state.json"
    state = json.loads(state_file.read_text())
    st = (session / "last_output.jsonl").stat()
    state["last"]["output_file"] = [st.st_ino, st.st_size]
    state_file.write_text(json.dumps(state))
    for path in session.rglob("*"):
        os.chmod(path, 0o700 if path.is_dir() else 0o600)


@pytest.mark.parametrize("kind", ["file", "memory"])
def test_a_blob_written_in_pieces(tmp_path: Path, kind: str) -> None:
    from ctxrules.stores.memory import MemoryStore

    store = FilesystemStore(tmp_path / "state") if kind == "file" else MemoryStore()
    key = store.session_key("s1")
    vault = Vault.of(store, key)
    writer = vault.open_writer()
    for part in (b"one\n", b"two\n", b"three\n"):
        writer.write(part)
    assert Path(writer.path).read_bytes() == b"one\ntwo\nthree\n" and writer.size == 14
    assert stat.S_IMODE(os.stat(writer.path).st_mode) == 0o600
    blob = writer.commit()
    assert blob == hashlib.sha256(b"one\ntwo\nthree\n").hexdigest() == writer.vault_id
    assert vault.get(blob) == b"one\ntwo\nthree\n"
    writer.discard()  # harmless after commit
    dropped = vault.open_writer()
    dropped.write(b"never stored")
    dropped.discard()
    assert not Path(dropped.path).exists() and vault.list_ids() == [blob]
    text = "é" * ((1 << 20) + 5)  # over the slice size: encoded and hashed in slices
    long_id = vault.put_text(text)
    assert long_id == hashlib.sha256(text.encode()).hexdigest() and vault.get_text(long_id) == text
    assert vault.put_text(text) == long_id


@pytest.mark.corpus
def test_a_prepare_fsyncs_every_vault_item_before_it_saves_the_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The vault items of a turn are fsynced together (files, then their directories), and
    all of them before the output that names them is saved; the backup before the compaction."""
    from conftest import TRANSCRIPTS

    from ctxrules import Engine
    from ctxrules.session_store import SessionStore

    events: list[int | str] = []  # inodes fsynced (a rename keeps it), and "SAVE"
    real_fsync, real_save = os.fsync, SessionStore.save

    def fsync(fd: int) -> None:
        events.append(os.fstat(fd).st_ino)
        real_fsync(fd)

    def save(self: SessionStore, state: dict[str, object], output: list[dict[str, object]]) -> None:
        events.append("SAVE")
        real_save(self, state, output)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(SessionStore, "save", save)
    history = json.loads((TRANSCRIPTS / "claudecode-ae4a77f8.json").read_text())
    session = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o", window=32_000)
    result = session.prepare(history)
    assert len(result.report["vault_items"]) > 10
    vault = tmp_path / "s" / "vault"
    items = {p.stat().st_ino for p in vault.glob("*/*") if p.is_file()}
    shards = {p.stat().st_ino for p in vault.iterdir() if p.is_dir()}
    saved = events.index("SAVE")
    before = set(events[:saved])
    assert items and items <= before  # every item, before the output naming it
    assert shards <= before  # the directories holding them too (the renames)
    assert len(events) - 1 >= len(items) + len(shards)


def test_a_turn_storing_more_items_than_it_keeps_descriptors_for_fsyncs_each_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Items past the descriptors a turn keeps open are fsynced by path: each one exactly once
    before the scope ends, and no descriptor is left open."""
    from ctxrules.stores import filesystem

    synced: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.fstat(fd).st_ino)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    store = FilesystemStore(tmp_path)
    session = str(tmp_path / "s")
    os.mkdir(session, 0o700)
    open_before = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    ids = []
    with store.durable_at_commit(session):
        for i in range(filesystem._KEPT_FDS + 40):
            ids.append(store.put_blob(session, f"item {i}".encode()))
        assert not synced  # nothing fsynced before the scope ends
    files = {os.stat(store._blob_path(session, i)).st_ino for i in ids}
    assert sorted(n for n in synced if n in files) == sorted(files)  # each file once
    if open_before is not None:
        assert len(os.listdir("/proc/self/fd")) == open_before
    assert all(store.get_blob(session, i) == f"item {n}".encode() for n, i in enumerate(ids))


def test_a_damaged_item_in_an_existing_shard_is_written_again(tmp_path: Path) -> None:
    store = FilesystemStore(tmp_path)
    session = str(tmp_path / "s")
    os.mkdir(session, 0o700)
    blob = store.put_blob(session, b"original bytes")
    path = store._blob_path(session, blob)
    os.chmod(path, 0o600)
    path.write_bytes(b"origin")  # cut short by a crash before the turn's fsync
    store._forget_checks(session)  # a later turn
    assert store.put_blob(session, b"original bytes") == blob
    assert path.read_bytes() == b"original bytes"


def test_a_copied_session_directory_stays_warm_and_recalls(tmp_path: Path) -> None:
    """`cp -r` or a restored backup gives every file a new inode; the last output is still
    the session's (its digest says so): the next turn reuses it, and recall answers."""
    import shutil
    from typing import Any

    from ctxrules import Engine
    from ctxrules.vault import parse_markers

    def log(n: int) -> str:
        return "".join(f"line {i:04d} of job {n}: value={(i * 7919) % 10007}\n" for i in range(1, 1201))

    history: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "Run the jobs."},
    ]
    for n in (1, 2, 3):
        call = {
            "id": f"c{n}",
            "type": "function",
            "function": {"name": "Bash", "arguments": f'{{"command": "job {n}"}}'},
        }
        history += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{n}", "content": log(n)},
        ]
    history.append({"role": "user", "content": "What did job 1 print on line 500?"})
    engine = Engine.load("builtin:default")
    first = engine.session(tmp_path / "a", model="gpt-4o", window=200_000).prepare(history).messages
    markers = [m for msg in first if isinstance(msg.get("content"), str) for m in parse_markers(msg["content"])]
    assert markers, "the long output was elided"
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    copy = engine.session(tmp_path / "b", model="gpt-4o", window=200_000)
    original = copy.vault.get(markers[0].vault_id).decode().splitlines(keepends=True)
    assert copy.recall({"id": markers[0].vault_id, "lines": "5"}) == original[4]
    nxt = copy.prepare([*history, {"role": "assistant", "content": "It said so."}])
    assert nxt.report["reused_messages"] == len(history)


def test_a_vault_that_cannot_be_made_is_named_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only session directory: the error named the vault twice (``vault at V: V:
    Read-only file system``)."""
    import errno

    import ctxrules.stores.filesystem as filesystem

    store, key = _store(tmp_path)
    vault = store.vault_dir(key)

    def read_only(path: Path, *, inside: Path | None = None) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    monkeypatch.setattr(filesystem, "ensure_dir", read_only)
    with pytest.raises(VaultError) as caught:
        store.open_blob_writer(key)
    assert str(caught.value) == f"cannot write to the vault at {vault}: Read-only file system"


def test_a_session_on_a_read_only_file_system_exports_and_a_run_says_why_it_cannot(tmp_path: Path) -> None:
    """A session on a backup mounted read-only: ``sessions export`` failed at the prepare lock
    (``cannot lock .../.lock: Read-only file system``), so the session could not be moved off
    it. No process can change such a session: the export takes no lock; a run still fails,
    naming the read-only file system. Needs root, to mount a file system of its own."""
    mount = tmp_path / "mnt"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)]).returncode:
        pytest.skip("mounting a file system needs root")
    try:
        env = {**os.environ, "PYTHONPATH": str(REPO / "engine")}

        def cli(*argv: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "ctxrules.cli.main", *argv],
                input=stdin,
                capture_output=True,
                text=True,
                env=env,
                cwd=tmp_path,
                timeout=300,
            )

        state = mount / "state"
        run = ["run", "--pack", "builtin:default", "--model", "gpt-4o", "--state", str(state), "--quiet"]
        assert cli(*run, stdin=json.dumps(MSGS)).returncode == 0
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        done = cli("sessions", "export", str(state / "default"), "--state", str(state), "--to", str(tmp_path / "a"))
        assert done.returncode == 0, done.stderr
        assert json.loads((tmp_path / "a").read_text().splitlines()[1])["kind"] == "turn"
        done = cli(*run, stdin=json.dumps([*MSGS, {"role": "user", "content": "more"}]))
        assert done.returncode == 2 and "Read-only file system" in done.stderr
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_a_new_session_on_a_read_only_file_system_is_a_session_io_error(tmp_path: Path) -> None:
    """``prepare`` on a session directory that must be made on a read-only file system raised
    a bare ``OSError`` from making the directory (before the turn's own writes, which say
    :class:`SessionIOError`): a caller catching ``CtxrulesError``, as the integrations' users
    do, let it through. Needs root, to mount a file system of its own."""
    from ctxrules.engine import Engine, SessionIOError
    from ctxrules.errors import CtxrulesError

    mount = tmp_path / "mnt"
    mount.mkdir()
    mounted = (
        os.geteuid() == 0
        and not subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,ro", "tmpfs", str(mount)]).returncode
    )
    if not mounted:
        pytest.skip("mounting a file system needs root")
    try:
        session = Engine.load("builtin:default").session(mount / "state" / "new", model="gpt-4o", window=200_000)
        with pytest.raises(SessionIOError) as caught:
            session.prepare(MSGS)
        assert isinstance(caught.value, CtxrulesError)
        assert str(caught.value) == (
            f"cannot write the session {mount / 'state' / 'new'}: Read-only file system; the messages were not "
            "changed, and the next run starts from them"
        )
    finally:
        subprocess.run(["umount", str(mount)], check=False)
