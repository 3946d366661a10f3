"""Sessions on a real ``redis-server`` through the public API and the real CLI: a restart
mid-session, an unreachable server (and ``on_error=local``), and ``ctxrules run --store``."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import load_transcript
from redis_server import RedisServer

from ctxrules import Engine
from ctxrules.errors import CtxrulesError
from ctxrules.vault import parse_markers

REPO = Path(__file__).resolve().parents[1]
NAME = "minisweagent-mwaskom__seaborn-3069.json"
CLOCK = 1_780_000_000.0
KEY = bytes(range(32))


def _cuts(history: list[dict[str, Any]], n: int) -> list[int]:
    points = [i for i, m in enumerate(history) if m.get("role") == "assistant" and i > 0]
    step = (len(points) - 1) / (n - 1)
    return [points[round(k * step)] for k in range(n)]


@pytest.fixture
def engine() -> Engine:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    return Engine.load("builtin:default")


def _markers(messages: list[dict[str, Any]]) -> set[str]:
    return {
        m.vault_id for msg in messages if isinstance(msg.get("content"), str) for m in parse_markers(msg["content"])
    }


@pytest.mark.corpus
def test_a_restart_mid_session_recomputes_from_the_full_history_and_says_so(
    engine: Engine, own_redis: RedisServer, tmp_path: Path
) -> None:
    from ctxrules.stores.filesystem import FilesystemStore
    from ctxrules.stores.redis import RedisStore

    history = load_transcript(NAME)
    cuts = _cuts(history, 4)
    RedisStore.from_url(own_redis.url).secret(None, "injection.key", lambda: KEY)
    session = engine.session("conv-restart", store=own_redis.url, model="gpt-4o", window=16_000)
    for turn, upto in enumerate(cuts[:2]):
        session.prepare(history[:upto], clock=CLOCK + 60 * turn)
    own_redis.restart()  # every key gone: state, last output, vault, ledgers
    RedisStore.from_url(own_redis.url).secret(None, "injection.key", lambda: KEY)
    after = session.prepare(history[: cuts[2]], clock=CLOCK + 120)
    assert any("no longer holds session conv-restart" in w for w in after.report["warnings"])
    assert after.report["reused_messages"] == 0  # recomputed, not reused
    # What a fresh session makes of the full history: the same context, nothing lost.
    state = tmp_path / "fresh"
    FilesystemStore(state).secret(None, "injection.key", lambda: KEY)
    fresh = engine.session("conv-fresh", store=f"file://{state}", model="gpt-4o", window=16_000)
    assert after.messages == fresh.prepare(history[: cuts[2]], clock=CLOCK + 120).messages
    # The recomputed turn's markers resolve again (the originals were stored anew).
    for vault_id in _markers(after.messages):
        assert session.vault.exists(vault_id)
    nxt = session.prepare(history[: cuts[3]], clock=CLOCK + 180)
    assert not any("no longer holds" in w for w in nxt.report["warnings"])  # said once, then warm again
    assert nxt.report["reused_messages"] > 0


def test_an_unreachable_store_is_a_clear_error_and_on_error_local_serves_the_call(
    engine: Engine, tmp_path: Path
) -> None:
    url = f"unix://{tmp_path}/down.sock"
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    session = engine.session("conv-down", store=url + "?connect_timeout_s=0.5", model="gpt-4o")
    with pytest.raises(CtxrulesError, match=rf"\[CR148\] cannot reach the Redis store {url}"):
        session.prepare(messages)
    local = engine.session("conv-down", store=url + "?on_error=local", model="gpt-4o")
    result = local.prepare(messages)
    assert result.messages == messages
    assert any("on_error=local" in w and url in w for w in result.report["warnings"])


def _ctxrules(*argv: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "engine"), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    env.pop("CTXRULES_STORE", None)
    return subprocess.run(
        [sys.executable, "-m", "ctxrules.cli.main", *argv],
        cwd=cwd,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.corpus
def test_a_marker_with_a_short_id_in_a_message_is_lost_as_on_the_filesystem(
    engine: Engine, redis_url: str, tmp_path: Path
) -> None:
    # Anyone can write a marker; a prefix id made the Redis store refuse the turn (VaultError).
    history = [{"role": "user", "content": "see [ctxrules:elided kind=lines count=3 ref=vault://abcdefabcdef]"}]
    on_redis = engine.session("conv-short", store=redis_url, model="gpt-4o").prepare(history).messages
    on_disk = engine.session(tmp_path / "s", model="gpt-4o").prepare(history).messages
    assert on_redis == on_disk
    assert "[ctxrules:lost kind=lines count=3 was=vault://abcdefabcdef" in on_redis[0]["content"]


def test_run_with_a_redis_store_through_the_cli(redis_url: str, tmp_path: Path) -> None:
    """Two ``ctxrules run --store unix://… --session ID`` processes, one turn each: the second
    reuses the first's work, and ``vault get`` from a third process returns every marker's
    original."""
    history = load_transcript(NAME)
    cuts = _cuts(history, 3)
    common = ["--pack", "builtin:default", "--model", "gpt-4o", "--window", "16000"]
    common += ["--store", redis_url, "--session", "conv-cli"]
    for i, upto in enumerate(cuts[1:]):
        (tmp_path / f"in{i}.json").write_text(json.dumps(history[:upto]))
        out = _ctxrules(
            "run", *common, "--input", f"in{i}.json", "--output", f"out{i}.json", "--report", f"r{i}.json", cwd=tmp_path
        )
        assert out.returncode == 0, out.stderr
    second = json.loads((tmp_path / "r1.json").read_text())
    assert second["reused_messages"] > 0  # the second process started from the first's turn
    assert second["session"].get("store") == redis_url
    output = json.loads((tmp_path / "out1.json").read_text())
    ids = _markers(output)
    assert ids, "the session compacted at a 16K window: there are markers"
    for vault_id in sorted(ids)[:5]:
        got = _ctxrules("vault", "get", vault_id, "--store", redis_url, "--session", "conv-cli", cwd=tmp_path)
        assert got.returncode == 0, got.stderr
        assert hashlib.sha256(got.stdout.encode()).hexdigest() == vault_id  # the exact original
    # A session that is not in the store: one line, exit 2.
    missing = _ctxrules("vault", "get", "a" * 64, "--store", redis_url, "--session", "conv-none", cwd=tmp_path)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "Traceback" not in missing.stderr


def test_a_damaged_revision_counter_resets_the_session_once_and_it_goes_on(
    engine: Engine, redis_url: str, redis_server: RedisServer
) -> None:
    """A session's ``rev`` key holding something other than a counter (an operator's SET, a
    clash of key names) is a reset session that says so, and later turns are warm again; it
    was an internal error on every later turn."""
    import redis

    from ctxrules.stores.redis import RedisStore

    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    more = [*messages, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "and now?"}]
    store = RedisStore.from_url(redis_url)
    engine.session("conv-rev", store=redis_url, model="gpt-4o").prepare(messages)
    client = redis.Redis(unix_socket_path=str(redis_server.socket))
    (rev_key,) = [k for k in client.keys("*conv-rev*") if k.endswith(b":rev")]
    client.set(rev_key, b"abc")
    session = engine.session("conv-rev", store=redis_url, model="gpt-4o")
    first = session.prepare(more)
    assert first.messages == more
    assert any("damaged revision" in w for w in first.report["warnings"]), first.report["warnings"]
    assert client.get(rev_key).isdigit()  # the commit restarted the counter
    nxt = session.prepare([*more, {"role": "assistant", "content": "done"}, {"role": "user", "content": "ok"}])
    assert nxt.report["reused_messages"] == len(more) and not nxt.report["warnings"]
    client.set(rev_key, b"1.5")
    store.save_state("conv-rev", {"version": 1})  # what `compress` does: no refused INCR either
    assert client.get(rev_key).isdigit()
    client.close()


def test_a_store_that_falls_back_in_the_middle_of_a_turn_says_so_in_the_report(
    engine: Engine, own_redis: RedisServer
) -> None:
    """on_error=local and Redis gone after the turn was read: the call is served from memory,
    and the report's warnings say so (docs/stores.md)."""
    from ctxrules.stores.redis import RedisStore

    store = RedisStore.from_url(own_redis.url + "?on_error=local")
    session = engine.session("conv-gone", store=store, model="gpt-4o")
    commit = store.commit_turn

    def dying(*args: Any, **kwargs: Any) -> Any:
        own_redis.stop()
        return commit(*args, **kwargs)

    store.commit_turn = dying  # type: ignore[method-assign]
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    result = session.prepare(messages)
    assert result.messages == messages
    assert any("on_error=local" in w and "unreachable" in w for w in result.report["warnings"])


# Every key of a session set to another Redis type than ctxrules writes there (a clash of key
# names, an operator's command): docs/stores.md "Damaged keys". Each was a CR148 "WRONGTYPE" on
# every later call (a wrong-typed lock: CR149 "held by another worker", after lock_timeout_s).
_WRONG_TYPES = [
    ("state", "hash"),
    ("output", "hash"),
    ("rev", "list"),
    ("meta", "string"),
    ("lock", "list"),
    ("lock", "string"),  # a string without expiry: no worker's lease, never released
    ("blobs", "string"),
    ("media", "list"),
    ("prepares", "hash"),
    ("doc:checkpoint", "list"),  # read when the session object is made, before the lock
    ("doc:notes", "hash"),
    ("log:session:records", "string"),
    ("log:session:totals", "list"),
    ("log:session:gen", "hash"),
    ("log:descendants:records", "set"),
]


def _set_wrong(client: Any, key: str, kind: str) -> None:
    client.delete(key)
    if kind == "hash":
        client.hset(key, "a", "b")
    elif kind == "list":
        client.rpush(key, "x")
    elif kind == "set":
        client.sadd(key, "x")
    else:
        client.set(key, "garbage")


def _keys_of(client: Any, pattern: str) -> dict[bytes, tuple[bytes, bytes]]:
    return {k: (client.type(k), client.dump(k)) for k in client.keys(pattern)}


@pytest.mark.parametrize(("part", "kind"), _WRONG_TYPES)
def test_a_session_key_of_the_wrong_redis_type_resets_the_session_once_and_it_goes_on(
    engine: Engine, redis_url: str, redis_server: RedisServer, part: str, kind: str
) -> None:
    import redis

    url = redis_url + "?lock_timeout_s=2"
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    more = [*messages, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "and now?"}]
    engine.session("conv-other", store=url, model="gpt-4o").prepare(messages)
    engine.session("conv-bad", store=url, model="gpt-4o").prepare(messages)
    client = redis.Redis(unix_socket_path=str(redis_server.socket))
    other = _keys_of(client, "*{conv-other}*") | _keys_of(client, "*{secret}*")
    key = f"ctxrules:v1:{{conv-bad}}:{part}"
    _set_wrong(client, key, kind)
    session = engine.session("conv-bad", store=url, model="gpt-4o")  # a worker that never saw it
    first = session.prepare(more)
    assert first.messages == more and first.report["reused_messages"] == 0  # computed from the full history
    said = [w for w in first.report["warnings"] if "wrong Redis type" in w and "was reset" in w]
    assert said and part in said[0], first.report["warnings"]
    right = {"output": b"list", "prepares": b"list", "records": b"list", "meta": b"hash", "media": b"hash"}
    right |= {"totals": b"hash", "blobs": b"set"}
    assert client.type(key) in (b"none", right.get(part.rsplit(":", 1)[-1], b"string"))  # removed or written anew
    nxt = session.prepare([*more, {"role": "assistant", "content": "done"}, {"role": "user", "content": "ok"}])
    assert nxt.report["reused_messages"] == len(more) and not nxt.report["warnings"]  # warm again
    again = engine.session("conv-bad", store=url, model="gpt-4o").prepare(more)  # another worker: no news
    assert not again.report["warnings"]
    assert _keys_of(client, "*{conv-other}*") | _keys_of(client, "*{secret}*") == other  # untouched
    client.close()


def test_a_wrong_typed_session_key_through_the_cli_is_a_reset_turn_then_warm(
    redis_url: str, redis_server: RedisServer, tmp_path: Path
) -> None:
    """``ctxrules run --store unix://…``: a session whose output key became a hash is served
    (exit 0) with the reset in the report's warnings, and the next run is warm."""
    import redis

    history = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    for text in ("hi", "and now?", "ok", "more"):
        history.append({"role": "assistant" if len(history) % 2 == 0 else "user", "content": text})
    common = ["--pack", "builtin:default", "--model", "gpt-4o", "--store", redis_url, "--session", "conv-cli-bad"]

    def run(i: int, upto: int) -> dict[str, Any]:
        (tmp_path / f"in{i}.json").write_text(json.dumps(history[:upto]))
        out = _ctxrules(
            "run", *common, "--input", f"in{i}.json", "--output", f"out{i}.json", "--report", f"r{i}.json", cwd=tmp_path
        )
        assert out.returncode == 0, out.stderr
        assert json.loads((tmp_path / f"out{i}.json").read_text()) == history[:upto]
        report: dict[str, Any] = json.loads((tmp_path / f"r{i}.json").read_text())
        return report

    run(0, 2)
    client = redis.Redis(unix_socket_path=str(redis_server.socket))
    _set_wrong(client, "ctxrules:v1:{conv-cli-bad}:output", "hash")
    first = run(1, 4)
    assert any("output was a hash" in w and "was reset" in w for w in first["warnings"]), first["warnings"]
    assert first["reused_messages"] == 0
    assert client.type("ctxrules:v1:{conv-cli-bad}:output") == b"list"  # written anew
    nxt = run(2, 6)
    assert nxt["reused_messages"] == 4 and not nxt["warnings"]
    client.close()


def test_a_day_ledger_of_the_wrong_type_starts_anew_and_no_record_is_counted_twice(
    engine: Engine, redis_url: str, redis_server: RedisServer
) -> None:
    """A shared ledger key of the wrong type is a damaged ledger: the record goes to a fresh one
    (the session's ledger, appended in the same transaction, gets it once), and a read of one
    skips what it held; no session is reset for it."""
    import redis

    from ctxrules.stores.base import Log
    from ctxrules.stores.redis import RedisStore

    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    session = engine.session("conv-day", store=redis_url, model="gpt-4o")
    session.prepare(messages)
    session.record_usage({"prompt_tokens": 900, "completion_tokens": 200})
    client = redis.Redis(unix_socket_path=str(redis_server.socket))
    (records,) = client.keys("ctxrules:v1:{log:day:*}:log:records")
    day = records.decode().split("{log:day:", 1)[1].split("}", 1)[0]
    own = "ctxrules:v1:{conv-day}:log:session:records"
    turn = _keys_of(client, "*{conv-day}:[sor]*")  # state, output, rev
    _set_wrong(client, records.decode(), "string")
    session.record_usage({"prompt_tokens": 100, "completion_tokens": 20})
    assert client.llen(own) == 2  # once, not again after the repair
    assert client.type(records) == b"list" and client.llen(records) == 1  # a fresh ledger, this record
    store = RedisStore.from_url(redis_url)
    assert store.totals(Log("day", day))["calls"] == 1
    _set_wrong(client, records.decode(), "hash")
    assert store.read_log(Log("day", day)).lines == []  # what the damaged key held: skipped
    assert client.type(records) == b"none"
    _set_wrong(client, records.decode()[: -len("records")] + "totals", "list")
    assert store.totals(Log("day", day)) == {}
    nxt = session.prepare([*messages, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "go"}])
    assert not nxt.report["warnings"] and nxt.report["reused_messages"] == len(messages)
    assert turn.keys() <= _keys_of(client, "*{conv-day}:[sor]*").keys()
    store.close()
    client.close()


@pytest.mark.parametrize(
    ("key", "kind"),
    [
        ("ctxrules:v1:{secret}:injection.key", "short"),
        ("ctxrules:v1:{secret}:injection.key", "list"),
        ("ctxrules:v1:{conv-key}:secret:injection.key", "short"),
    ],
)
def test_a_damaged_injection_key_is_a_cr148_naming_the_key_not_a_traceback(
    engine: Engine, redis_url: str, redis_server: RedisServer, tmp_path: Path, key: str, kind: str
) -> None:
    """An injection key someone else wrote (a value too short to be a key, or the store-wide
    key of another Redis type) was a ValueError traceback, or a CR148 that named no key. It is
    refused as the filesystem store refuses a damaged key file: the key named, and how to go on
    (nothing is guessed: the key verifies what the session's history holds)."""
    import redis

    client = redis.Redis(unix_socket_path=str(redis_server.socket))
    if kind == "short":
        client.set(key, b"x")
    else:
        _set_wrong(client, key, kind)
    messages = [{"role": "user", "content": "hello"}]
    with pytest.raises(CtxrulesError, match=r"\[CR148\]") as info:
        engine.session("conv-key", store=redis_url, model="gpt-4o").prepare(messages)
    assert key in str(info.value) and "delete it" in str(info.value), str(info.value)
    (tmp_path / "in.json").write_text(json.dumps(messages))
    common = ["--pack", "builtin:default", "--model", "gpt-4o", "--store", redis_url, "--session", "conv-key"]
    out = _ctxrules("run", *common, "--input", "in.json", "--output", "out.json", cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr and key in out.stderr, out.stderr
    client.delete(key)  # as the message says: a new key is made and the session goes on
    assert engine.session("conv-key", store=redis_url, model="gpt-4o").prepare(messages).messages == messages
    client.close()
