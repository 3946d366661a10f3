"""The Redis store through the real CLI (``python -m ctxrules.cli.main`` in a subprocess, as a
user runs it) against a real ``redis-server``: moving a session between Redis and the
filesystem with ``sessions export``/``import`` and back, byte for byte; one-line errors."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from redis_server import RedisServer
from spool_kit import LIVE_ITEM, stale_spool_goes_live_one_stays

from ctxrules.stores.base import Log

REPO = Path(__file__).resolve().parents[1]


def ctxrules(*argv: str, cwd: Path, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "engine"), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    env.pop("CTXRULES_STORE", None)
    return subprocess.run(
        [sys.executable, "-m", "ctxrules.cli.main", *argv],
        cwd=cwd,
        env=env,
        input=stdin.decode() if stdin is not None else None,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _vault(store: Any, session: str) -> dict[str, bytes]:
    return {blob_id: store.get_blob(session, blob_id) for blob_id in store.blob_ids(session)}


def _populate(url: str) -> dict[str, bytes]:
    from ctxrules.stores.redis import RedisStore

    store = RedisStore.from_url(url)
    s = "conv-move"
    blobs = [
        "line one\r\nline two\n\ttabbed ✓ ünïcode\n".encode(),
        bytes(range(256)) * 40,  # binary, every byte value
        b"",  # the empty blob
    ]
    for data in blobs[:2] + blobs[2:]:
        store.put_blob(s, data)
    store.put_blob(s, b"\x89PNG\r\n\x1a\n" + b"\x00" * 64, media_type="image/png")
    out = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    with store.prepare_lock(s):
        store.commit_turn(s, {"fingerprint": "fp", "stages": {"a": {"n": 1}}}, out)
    store.write_doc(s, "notes", json.dumps({"version": 1, "next": 2, "notes": [{"id": "n1", "text": "x"}]}).encode())
    store.append([Log("session", s)], {"type": "call", "id": "c1", "ts": 1.0, "tokens": {"input": 9}})
    vault = _vault(store, s)
    store.close()
    return vault


def test_a_session_moves_from_redis_to_the_filesystem_and_back_byte_for_byte(
    redis_server: RedisServer, redis_url: str, tmp_path: Path
) -> None:
    from ctxrules.injected import existing_secret
    from ctxrules.stores.filesystem import FilesystemStore
    from ctxrules.stores.redis import RedisStore

    original = _populate(redis_url)
    assert len(original) == 4
    key = b"e5" * 16  # the key the session's injected messages are signed with
    RedisStore.from_url(redis_url).secret(None, "injection.key", lambda: key)
    out = ctxrules("sessions", "export", "conv-move", "--store", redis_url, "--to", "a.jsonl", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "4 vault item(s)" in out.stderr
    records = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert [base64.b64decode(r["data"]) for r in records if r.get("kind") == "secret"] == [key]
    state = tmp_path / "state"
    got = ctxrules("sessions", "import", "a.jsonl", "--store", f"file://{state}", cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    fs = FilesystemStore(state)
    [session_dir] = fs.sessions()
    assert _vault(fs, session_dir) == original
    # The bytes on disk are the bytes Redis held, each named by its sha256.
    for blob_id, data in original.items():
        assert hashlib.sha256(data).hexdigest() == blob_id
    assert fs.blob_media_type(session_dir, hashlib.sha256(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64).hexdigest()) == (
        "image/png"
    )
    assert fs.load_turn(session_dir).output == [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi"},
    ]
    # And back into Redis, as another session id.
    back = ctxrules("sessions", "export", session_dir, "--state", str(state), "--to", "b.jsonl", cwd=tmp_path)
    assert back.returncode == 0, back.stderr
    again = ctxrules("sessions", "import", "b.jsonl", "--store", redis_url, "--session", "conv-back", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    store = RedisStore.from_url(redis_url)
    assert _vault(store, "conv-back") == original
    turn = store.load_turn("conv-back")
    assert turn.output == [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    assert turn.state["fingerprint"] == "fp"
    assert store.read_doc("conv-back", "notes") == store.read_doc("conv-move", "notes")
    assert len(store.read_log(Log("session", "conv-back")).lines) == 1
    assert existing_secret(store, "conv-back") == key  # it signs as it did before the moves
    store.close()


def test_an_unreachable_store_is_one_line_and_exit_2(tmp_path: Path) -> None:
    url = f"unix://{tmp_path}/no-redis.sock"
    out = ctxrules("sessions", "scan", "--store", url + "?connect_timeout_s=0.5", cwd=tmp_path)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr
    assert "[CR148]" in lines[0] and url in lines[0]


def test_a_bad_store_option_is_one_line_and_exit_2(tmp_path: Path) -> None:
    out = ctxrules("sessions", "scan", "--store", "redis://localhost:6379/0?ttl=5", cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "[CR148]" in out.stderr and "unknown option 'ttl'" in out.stderr


_COMPACTING_WORKER = r"""
import json, sys, time
from ctxrules.runtime import checkpoint
from ctxrules.stores.redis import RedisStore

url, history = sys.argv[1], json.loads(sys.argv[2])
store = RedisStore.from_url(url)
with store.prepare_lock("conv-cut"):
    turn = store.load_turn("conv-cut")
    store.commit_turn("conv-cut", {"fingerprint": "before"}, history[:2])
with store.prepare_lock("conv-cut"):
    turn = store.load_turn("conv-cut")
    # As Session.prepare does before a compaction: the appended messages backed up in the vault,
    # the first two being the last output, then the checkpoint.
    backup = store.put_blob("conv-cut", json.dumps(history[2:]).encode())
    checkpoint.begin("conv-cut", backup=backup, state=turn.state, messages=len(history), clock=1.0,
                     prefix=2, store=store)
    print("compacting", flush=True)
    time.sleep(600)
"""


def test_a_compaction_cut_short_on_a_worker_is_found_and_resumed_through_the_cli(
    redis_url: str, tmp_path: Path
) -> None:
    """A worker SIGKILLed while compacting (holding the lock) leaves a ``running`` checkpoint;
    ``sessions scan --store URL`` finds it once its writer is gone, ``sessions resume`` puts the
    state from before back and prints the messages the compaction started from."""
    from ctxrules.runtime import checkpoint
    from ctxrules.stores.redis import RedisStore

    history = [{"role": "user", "content": f"message {i} ✓"} for i in range(6)]
    env = {**os.environ, "PYTHONPATH": str(REPO / "engine")}
    url = redis_url + "?lock_ttl_s=1"
    with subprocess.Popen(
        [sys.executable, "-c", _COMPACTING_WORKER, url, json.dumps(history)], stdout=subprocess.PIPE, env=env
    ) as worker:
        assert worker.stdout is not None and worker.stdout.readline().strip() == b"compacting"
        scan = ctxrules("sessions", "scan", "--store", url, cwd=tmp_path)
        assert scan.returncode == 0 and "0 interrupted session(s)" in scan.stdout  # still running
        worker.kill()
        worker.wait(30)
    scan = ctxrules("sessions", "scan", "--store", url, cwd=tmp_path)
    assert scan.returncode == 0, scan.stderr
    assert f"{redis_url}#conv-cut\t" in scan.stdout and "1 interrupted session(s)" in scan.stdout
    assert "after the first 2 messages" in scan.stdout
    resumed = ctxrules("sessions", "resume", "conv-cut", "--store", url, cwd=tmp_path)  # waits out the lease
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout) == history
    store = RedisStore.from_url(redis_url)
    assert store.load_turn("conv-cut").state["fingerprint"] == "before"
    assert checkpoint.check("conv-cut", store=store) is None
    scan = ctxrules("sessions", "scan", "--store", url, cwd=tmp_path)
    assert "0 interrupted session(s)" in scan.stdout
    store.close()


def test_a_checkpoint_from_another_host_counts_as_cut_short_only_when_the_lock_is_free(redis_url: str) -> None:
    from ctxrules.runtime import checkpoint
    from ctxrules.stores.redis import RedisStore

    store = RedisStore.from_url(redis_url + "?lock_ttl_s=1")
    doc = {"status": "running", "pid": 4242, "host": "worker-7.elsewhere", "backup": "0" * 64, "prefix": 0}
    store.write_doc("conv-remote", "checkpoint", json.dumps(doc).encode())
    other = RedisStore.from_url(redis_url + "?lock_ttl_s=1")
    with other.prepare_lock("conv-remote"):  # the remote worker, alive: it holds the lock
        assert checkpoint.check("conv-remote", store=store) is None
    hit = checkpoint.check("conv-remote", store=store)
    assert hit is not None and "worker-7.elsewhere" in hit.reason
    store.close()
    other.close()


def test_the_deployment_example_runs_two_workers_on_one_session(redis_url: str, tmp_path: Path) -> None:
    """examples/redis-workers/run.py as its README runs it (here against the test's server)."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "engine"), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    run = subprocess.run(
        [sys.executable, str(REPO / "examples" / "redis-workers" / "run.py"), "--redis", redis_url, "--turns", "4"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    rows = [line.split() for line in run.stdout.splitlines() if line.split() and line.split()[0].isdigit()]
    assert [int(r[0]) for r in rows] == [0, 1, 2, 3]
    assert len({r[1] for r in rows}) == 2  # two worker processes took turns
    assert rows[1][1] != rows[0][1] and rows[2][1] == rows[0][1]
    assert "ledger: 4 calls" in run.stdout and "by 2 workers, 0 overlapping" in run.stdout


def _example(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "engine"), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    return subprocess.run(
        [sys.executable, str(REPO / "examples" / "redis-workers" / "run.py"), *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_deployment_example_says_in_one_line_what_is_wrong(tmp_path: Path) -> None:
    """The README's commands with a mistake in them: an unreachable or non-Redis --redis made each
    worker die with a traceback while the parent waited 300 s for its answer, then raised one
    more; --turns 0 with a transcript divided by zero; a missing transcript was a traceback."""
    (tmp_path / "report.json").write_text('{"version": 1}', encoding="utf-8")
    (tmp_path / "none.json").write_text('[{"role": "user", "content": "hi"}]', encoding="utf-8")
    cases = [
        (("--redis", "redis://127.0.0.1:1/0", "--turns", "2"), "[CR148] cannot reach the Redis store"),
        (("--redis", "bogus://x", "--turns", "2"), "[CR145]"),
        (("--redis", f"file://{tmp_path}", "--turns", "2"), "--redis takes a Redis URL"),
        (("--turns", "0", "--transcript", "none.json"), "argument --turns: not a positive whole number: '0'"),
        (("--transcript", "missing.json"), "cannot read the transcript missing.json"),
        (("--transcript", "report.json"), "report.json is not a transcript"),
        (("--transcript", "none.json"), "none.json holds no assistant message"),
    ]
    for argv, message in cases:
        run = _example(*argv, cwd=tmp_path)
        assert run.returncode == 2, (argv, run.stderr)
        assert message in run.stderr and "Traceback" not in run.stderr, (argv, run.stderr)
        assert run.stdout == "", argv


def test_the_deployment_example_ends_when_a_worker_fails(redis_url: str, tmp_path: Path) -> None:
    """A turn a worker cannot serve (here a message ctxrules refuses) ended that worker with a
    traceback, and the demo waited 300 s for the answer; now it ends at once, in one line."""
    transcript = tmp_path / "bad.json"
    transcript.write_text(
        json.dumps(
            [{"role": "user", "content": "x"}, {"role": 5, "content": "z"}, {"role": "assistant", "content": "y"}]
        ),
        encoding="utf-8",
    )
    run = _example("--redis", redis_url, "--transcript", str(transcript), cwd=tmp_path)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "'role' must be a string" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and "leaked" not in run.stderr, run.stderr


def test_usage_add_on_redis_lands_in_every_ledger_or_in_none(own_redis: RedisServer, tmp_path: Path) -> None:
    """As on the filesystem (test_usage_cli): a server that refuses the append (out of memory)
    leaves no ledger with the call, so the retry counts it once in each. One transaction for
    the three ledgers makes it so; this keeps it so."""
    import redis

    url = own_redis.url
    add = ("usage", "add", "--store", url, "--session", "conv-u", "--goal", "g", "--model", "gpt-4o", "--prompt", "9")
    client = redis.Redis(unix_socket_path=str(own_redis.socket))

    def lengths() -> dict[str, int]:
        return {k.decode().split("{", 1)[1].split("}", 1)[0]: client.llen(k) for k in client.keys("*:records")}

    assert ctxrules(*add, cwd=tmp_path).returncode == 0
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", 1)
    refused = ctxrules(*add, cwd=tmp_path)
    client.config_set("maxmemory", 0)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert sorted(lengths().values()) == [1, 1, 1]  # the first call alone, in each
    assert ctxrules(*add, cwd=tmp_path).returncode == 0
    assert sorted(lengths().values()) == [2, 2, 2]
    client.close()


def test_a_command_a_full_server_refuses_is_named_without_its_arguments(own_redis: RedisServer) -> None:
    """redis-py quotes the start of a pipeline command that failed (its keys, the first bytes
    of the value: conversation text) in its error, and that text went into the StoreError, the
    CLI's message and the hook's logs. The command is named by its name alone now."""
    import redis

    from ctxrules.stores import StoreError
    from ctxrules.stores.redis import RedisStore
    from ctxrules.vault import Vault

    store = RedisStore.from_url(own_redis.url)
    client = redis.Redis(unix_socket_path=str(own_redis.socket))
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", 1)
    try:
        with pytest.raises(StoreError) as caught:
            Vault.of(store, store.session_key("private")).put_bytes(b"my bank PIN is 4711 " * 10)
    finally:
        client.config_set("maxmemory", 0)
        client.close()
    message = str(caught.value)
    assert "maxmemory" in message, message
    assert "PIN" not in message and "private" not in message, message


def test_a_spool_a_killed_writer_left_in_the_temporary_directory_goes_with_the_next_writer(
    redis_url: str, tmp_path: Path
) -> None:
    """The Redis store spools an item written in pieces (``compress`` of a large output) to
    ``ctxrules-blob-*`` in the system's temporary directory and stores it whole on commit: a
    writer killed mid-write (``kill -9``, the OOM killer) left that file for good. The next
    writer, in any process, removes one untouched for an hour whose writer is gone; a live
    writer's spool, however long idle, stays and commits."""
    from ctxrules.stores.redis import RedisStore
    from ctxrules.vault import Vault

    spools = tmp_path / "tmp"
    spools.mkdir(mode=0o700)
    env = {**os.environ, "PYTHONPATH": str(REPO / "engine"), "TMPDIR": str(spools)}
    env.pop("CTXRULES_STORE", None)
    store = RedisStore.from_url(redis_url)
    item = stale_spool_goes_live_one_stays(
        store=redis_url,
        session="spooled",
        spools=lambda: sorted(spools.glob("ctxrules-blob-*")),
        env=env,
        cwd=tmp_path,
        compress=["--session", "spooled", "--store", redis_url],
        # Past the 8 MiB compress keeps in memory: spooled.
        output="".join(f"tests/test_{i}.py::test_x PASSED\n" for i in range(300_000)).encode(),
        stored=Vault.of(store, "spooled").exists,
    )
    assert Vault.of(store, "spooled").get(item) == LIVE_ITEM
    assert list(spools.iterdir()) == []


@pytest.mark.parametrize("name", ["vault", "Stateless", ".hidden", "conv-7"])
def test_every_verb_names_a_redis_session_as_the_integrations_do(redis_url: str, tmp_path: Path, name: str) -> None:
    # `run --session vault --store redis://...` wrote the session `vault` as it is, while the
    # docs (and the integrations, for a request naming `vault`) use its sha256: the session a
    # proxy request made was not the one `sessions export vault` looked for, and `run` and the
    # other verbs could disagree. Every verb now maps the name once, by the integrations' rule.
    from ctxrules.integrations import session_name
    from ctxrules.stores.redis import RedisStore

    (tmp_path / "m.json").write_text(json.dumps([{"role": "user", "content": "hello"}]))
    made = ctxrules("run", "--pack", "builtin:default", "--model", "gpt-4o", "--input", "m.json",
                    "--store", redis_url, "--session", name, "--output", "out.json", cwd=tmp_path)  # fmt: skip
    assert made.returncode == 0, made.stderr
    key = session_name(name)
    assert (key == name) == (name == "conv-7")
    assert RedisStore.from_url(redis_url).exists(key)
    exported = ctxrules("sessions", "export", name, "--store", redis_url, "--to", "s.ctxs", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    assert f"#{key}:" in exported.stderr
    shown = ctxrules("usage", "show", "--store", redis_url, "--session", name, "--format", "json", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["session"]["path"].endswith(f"#{key}")
