"""Sessions through the engine on every store: the same outputs as a session directory, two
Session objects (two workers) alternating on one session, notes, touched files, recall, usage,
sub-agents and the integrations' ``store=``, on the memory store and on a real redis-server."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from ctxrules.engine import Engine
from ctxrules.errors import UsageError
from ctxrules.resources import schema_path
from ctxrules.stores import Store, open_store
from ctxrules.stores.filesystem import FilesystemStore
from ctxrules.stores.memory import MemoryStore

KEY = b"\x07" * 32  # one injection key everywhere, so signed tags compare equal


def turns(n: int) -> list[list[dict[str, Any]]]:
    """Histories of ``n`` turns (append-only), each adding a large tool output."""
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing tests."},
    ]
    out = []
    for t in range(n):
        body = "\n".join(
            f"t{t} line {i}: FAILED tests/test_{i % 17}.py::case_{i} - assert {i} == {i + t}" for i in range(1500)
        )
        history = [
            *history,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"c{t}",
                        "type": "function",
                        "function": {"name": "bash", "arguments": '{"command": "pytest"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": f"c{t}", "content": body},
            {"role": "user", "content": f"and now turn {t}"},
        ]
        out.append(history)
    return out


@pytest.fixture(params=["memory", "redis"])
def make_store(request: pytest.FixtureRequest) -> Iterator[Callable[[], Store]]:
    """A factory of store objects over one backend (each call: another worker's connection)."""
    if request.param == "memory":
        shared = MemoryStore()
        yield lambda: shared
        return
    url = request.getfixturevalue("redis_url")
    made: list[Store] = []

    def make() -> Store:
        made.append(open_store(url))
        return made[-1]

    yield make
    for store in made:
        store.close()


def _file_outputs(tmp_path: Path, histories: list[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    engine = Engine.load("builtin:default")
    root = tmp_path / "state"
    FilesystemStore(root).secret(None, "injection.key", lambda: KEY)
    session = engine.session(root / "conv-1", model="gpt-4o", window=20000, state_root=root)
    return [session.prepare(h, clock=1000.0 + i).messages for i, h in enumerate(histories)]


def test_a_store_session_gives_the_outputs_of_a_session_directory(
    tmp_path: Path, make_store: Callable[[], Store]
) -> None:
    histories = turns(3)
    expected = _file_outputs(tmp_path, histories)
    store = make_store()
    store.secret(None, "injection.key", lambda: KEY)
    engine = Engine.load("builtin:default")
    session = engine.session("conv-1", store=store, model="gpt-4o", window=20000)
    got = [session.prepare(h, clock=1000.0 + i).messages for i, h in enumerate(histories)]
    assert got == expected
    assert any("vault://" in json.dumps(m) for m in got[-1])  # something was moved out
    # A new process (a new Session on the store) reads the session back, markers resolvable.
    again = engine.session("conv-1", store=make_store(), model="gpt-4o", window=20000)
    assert again.last_output() == expected[-1]
    from ctxrules.dangling import marker_ids

    ids = marker_ids(expected[-1])
    assert ids and all(again.vault.exists(i) for i in ids)
    report = again.prepare([*histories[-1], {"role": "assistant", "content": "ok"}], clock=2000.0).report
    assert report["session"]["store"] == store.url and report["session"]["key"] == "conv-1"
    jsonschema.validate(report, json.loads(schema_path("report.v1.schema.json").read_text()))
    from ctxrules.cli.tables import read_back_command

    assert read_back_command(report, "ab" * 32).endswith(f"--store {store.url} --session conv-1")


class _Spy:
    """A store whose ``load_turn`` is ``load_turn``; everything else is ``store``'s."""

    def __init__(self, store: Store, load_turn: Callable[..., Any]) -> None:
        self._store, self.load_turn = store, load_turn

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def test_two_workers_alternating_on_one_session_match_one_worker(
    tmp_path: Path, make_store: Callable[[], Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    histories = turns(4)
    expected = _file_outputs(tmp_path, histories)
    engine = Engine.load("builtin:default")
    seed = make_store()
    seed.secret(None, "injection.key", lambda: KEY)
    workers = [engine.session("conv-2", store=make_store(), model="gpt-4o", window=20000) for _ in range(2)]
    reads: list[int] = []
    for n, worker in enumerate(workers):
        real = worker.store.load_turn

        def counted(session: str, *, output: bool = True, _real: Any = real, _n: int = n) -> Any:
            if output:
                reads.append(_n)
            return _real(session, output=output)

        monkeypatch.setattr(worker, "store", _Spy(worker.store, counted))
    # Turn t on worker t % 2: each worker's copy in memory is stale every other turn.
    got = [workers[i % 2].prepare(h, clock=1000.0 + i).messages for i, h in enumerate(histories)]
    assert got == expected
    # From the second turn on, each worker took the other's last output from the store instead
    # of its own stale copy.
    assert reads == [1, 0, 1]


def test_notes_touched_files_recall_usage_and_sub_agents_live_in_the_store(
    tmp_path: Path, make_store: Callable[[], Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # nothing may appear in the working directory
    store = make_store()
    engine = Engine.load("builtin:default")
    a = engine.session("conv-3", store=store, model="gpt-4o", window=20000)
    a.notes.add("the tests live in tests/unit", tags=("testing",))
    a.touch("/src/app.py")
    out = a.prepare(turns(1)[0]).messages
    a.record_usage({"prompt_tokens": 1200, "completion_tokens": 30})
    child = a.child("helper")
    child.record_usage({"prompt_tokens": 100, "completion_tokens": 5})
    b = engine.session("conv-3", store=make_store(), model="gpt-4o", window=20000)  # another worker
    assert [n.text for n in b.notes.list()] == ["the tests live in tests/unit"]
    from ctxrules.tracker import load_tracked

    assert [t.path for t in load_tracked(store=b.store, session=b.key)] == ["/src/app.py"]
    status = b.ledger.status()
    assert status.totals.calls == 2 and status.totals.tokens.prompt == 1300  # the child counts in its root
    ref = next(part[:64] for part in json.dumps(out).split("vault://")[1:])
    answer = b.recall({"id": ref})
    assert "FAILED tests/test_" in answer
    assert list(tmp_path.iterdir()) == []


def test_store_with_state_root_is_a_usage_error(tmp_path: Path) -> None:
    engine = Engine.load("builtin:default")
    with pytest.raises(UsageError, match="not both"):
        engine.session("x", store=MemoryStore(), state_root=tmp_path, model="gpt-4o")


def test_a_file_url_store_keeps_sessions_as_directories_under_it(tmp_path: Path) -> None:
    engine = Engine.load("builtin:default")
    session = engine.session("conv-4", store=f"file://{tmp_path}/st", model="gpt-4o", window=20000)
    session.prepare(turns(1)[0])
    assert (tmp_path / "st" / "conv-4" / "state.json").is_file()
    assert (tmp_path / "st" / "injection.key").is_file()  # the store's key, shared by its sessions
    odd = engine.session("a b/c", store=f"file://{tmp_path}/st", model="gpt-4o")  # a path stays a path
    assert odd.key == "a b/c"


def test_two_litellm_hooks_on_one_store_act_as_one(make_store: Callable[[], Store]) -> None:
    from ctxrules.integrations.litellm import ContextHook

    seed = make_store()
    seed.secret(None, "injection.key", lambda: KEY)
    hooks = [ContextHook("builtin:default", store=make_store(), window=20000) for _ in range(2)]
    single = ContextHook("builtin:default", store=MemoryStore(), window=20000)
    single.store.secret(None, "injection.key", lambda: KEY)
    for t, history in enumerate(turns(3)):
        data = {"model": "gpt-4o", "messages": history, "litellm_session_id": "chat-9"}
        alone = single.process(json.loads(json.dumps(data)), "openai")
        replicated = hooks[t % 2].process(json.loads(json.dumps(data)), "openai")
        assert replicated["messages"] == alone["messages"]
    with pytest.raises(ValueError, match="not both"):
        ContextHook("builtin:default", "dir", store=MemoryStore())


def test_a_litellm_hook_on_a_file_url_is_the_hook_on_that_directory(tmp_path: Path) -> None:
    from ctxrules.integrations.litellm import ContextHook

    FilesystemStore(tmp_path / "st").secret(None, "injection.key", lambda: KEY)
    by_url = ContextHook("builtin:default", store=f"file://{tmp_path}/st", window=20000)
    by_dir = ContextHook("builtin:default", str(tmp_path / "st2"), window=20000)
    FilesystemStore(tmp_path / "st2").secret(None, "injection.key", lambda: KEY)
    data = {"model": "gpt-4o", "messages": turns(1)[0], "litellm_session_id": "chat-1"}
    a = by_url.process(json.loads(json.dumps(data)), "openai")
    b = by_dir.process(json.loads(json.dumps(data)), "openai")
    assert a["messages"] == b["messages"]
    assert (tmp_path / "st" / "chat-1" / "state.json").is_file() and not Path(".ctxrules", "chat-1").exists()


def test_the_langchain_middleware_takes_a_store() -> None:
    pytest.importorskip("langchain")
    from ctxrules.integrations.langchain import CtxrulesMiddleware

    store = MemoryStore()
    mw = CtxrulesMiddleware(model="gpt-4o", store=store, window=20000)
    session = mw.session_for("thread/with spaces")
    assert session.store is store and len(session.key) == 64  # not an id as it is: its sha256
    assert mw.session_for("t-1").key == "t-1"
