"""The litellm hook in the SDK (async deployment hook, the sync wrapper) and its rules: session
ids, stateless calls, idempotence, refusals and ctxrules' own failures."""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before litellm is imported: no network

import asyncio
import hashlib
import importlib
import json
import re
import sys
from pathlib import Path
from typing import Any

import litellm
import pytest
from conftest import transcript_path
from invariants import pairing_problems
from proxy_kit import FakeUpstream

from ctxrules.errors import UsageError
from ctxrules.formats import anthropic as A
from ctxrules.integrations import session_name
from ctxrules.integrations.litellm import ContextHook, completion
from ctxrules.models import UnknownModelError
from ctxrules.stores.filesystem import FilesystemStore

# litellm's own pydantic models warn while they build (its code, not ours).
pytestmark = pytest.mark.filterwarnings("ignore:Items? .* using the `ReadOnly` qualifier:UserWarning")


@pytest.fixture
def upstream() -> Any:
    with FakeUpstream() as server:
        yield server


def long_history() -> list[dict[str, Any]]:
    path = transcript_path("claudecode-4d5611e5.json")
    return json.loads(path.read_text())


def pack(tmp_path: Path, extra: str) -> str:
    path = tmp_path / "pack.yaml"
    path.write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: t, version: 1.0.0}\n"
        f"extends: [builtin:default]\n{extra}"
    )
    return str(path)


@pytest.mark.parametrize(
    ("raw", "name"),
    [
        ("run-42", "run-42"),
        ("a.b_c-D9", "a.b_c-D9"),
        ("x" * 128, "x" * 128),
        ("x" * 129, hashlib.sha256(b"x" * 129).hexdigest()),
        ("a/b", hashlib.sha256(b"a/b").hexdigest()),
        ("..", hashlib.sha256(b"..").hexdigest()),
        ("", hashlib.sha256(b"").hexdigest()),
        # The store's own names, and hidden names: a session "vault" wrote its state into the
        # shared vault folder and was missing from every listing.
        *((n, hashlib.sha256(n.encode()).hexdigest()) for n in ("vault", "Ledger", "router", "KEYS", "stateless")),
        (".stateless", hashlib.sha256(b".stateless").hexdigest()),
        (".x", hashlib.sha256(b".x").hexdigest()),
        ("vaults", "vaults"),
    ],
)
def test_session_ids_are_used_as_they_are_or_hashed(raw: str, name: str) -> None:
    assert session_name(raw) == name


def test_the_async_sdk_hook_compacts_what_reaches_the_provider(tmp_path: Path, upstream: FakeUpstream) -> None:
    hook = ContextHook("builtin:default", tmp_path / "state", window=32_000)
    history = long_history()

    async def call() -> Any:
        litellm.callbacks = [hook]
        try:
            answer = await litellm.acompletion(
                model="openai/gpt-4o",
                api_base=f"{upstream.url}/v1",
                api_key="sk-x",
                messages=history,
                litellm_session_id="sdk-1",
            )
            ledger = tmp_path / "state" / "sdk-1"
            for _ in range(100):  # litellm logs success in a background task
                if (ledger / "ledger.jsonl").is_file():
                    break
                await asyncio.sleep(0.05)
            return answer
        finally:
            litellm.callbacks = []

    answer = asyncio.run(call())
    assert answer.choices[0].message.content == "ok"
    sent = upstream.requests[-1][1]["messages"]
    assert len(sent) < len(history) / 2 and pairing_problems(sent) == []
    assert hook.stats["prepared"] == 1
    assert (tmp_path / "state" / "sdk-1" / "state.json").is_file()  # no API key in the SDK: no namespace
    # The success callback recorded the call's usage in the session's ledger (budgets see it).
    entries = hook._session(tmp_path / "state" / "sdk-1", "openai/gpt-4o").ledger.root_entries()
    assert [e.tokens.prompt for e in entries] == [1]


def test_the_sync_wrapper_prepares_before_litellm_completion(tmp_path: Path, upstream: FakeUpstream) -> None:
    hook = ContextHook("builtin:default", tmp_path / "state", window=32_000)
    history = long_history()
    answer = completion(
        model="openai/gpt-4o",
        api_base=f"{upstream.url}/v1",
        api_key="sk-x",
        messages=history,
        metadata={"session_id": "sync-1"},
        hook=hook,
    )
    assert answer.choices[0].message.content == "ok"
    assert len(upstream.requests[-1][1]["messages"]) < len(history) / 2
    assert (tmp_path / "state" / "sync-1" / "state.json").is_file()


@pytest.mark.parametrize(
    ("options", "error", "said"),
    [
        ({"window": 0}, UsageError, "window must be a positive integer, not 0"),
        ({"window": "128000"}, UsageError, "window must be a positive integer, not '128000'"),
        ({"window": True}, UsageError, "window must be a positive integer, not True"),
        ({"model": "not-a-model-ctxrules-knows"}, UnknownModelError, "unknown model 'not-a-model-ctxrules-knows'"),
        ({"model": "gpt\u202e4o"}, UsageError, "holds a character no model name has"),
    ],
)
def test_a_window_or_model_no_request_can_use_is_refused_at_start_up(
    tmp_path: Path, options: dict[str, Any], error: type[Exception], said: str
) -> None:
    """Accepted when the hook was made (the proxy started), they failed every request after: a
    warning each, or a 500 each with on_error="reject"."""
    with pytest.raises(error, match=re.escape(said)):
        ContextHook("builtin:default", tmp_path / "state", **options)
    assert not (tmp_path / "state").exists()


def test_an_empty_state_is_refused_not_read_as_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ContextHook(pack, "")`` (an unset variable) wrote the key file and a session directory
    per session id into the proxy's working directory."""
    from ctxrules.errors import UsageError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match=re.escape("state must not be empty (None is the default)")):
        ContextHook("builtin:default", "")
    assert list(tmp_path.iterdir()) == []


def test_a_model_only_a_pack_entry_without_a_window_matches_is_refused_at_start_up(tmp_path: Path) -> None:
    """The entry matched, so the model passed for known, and every request failed to size it."""
    entries = "models:\n  - {id: mine, match: ['my-own-*'], context: {reserve_output: 4096}}\n"
    with pytest.raises(UnknownModelError, match="unknown model 'my-own-x'"):
        ContextHook(pack(tmp_path, entries), tmp_path / "state", model="my-own-x")
    sized = "models:\n  - {id: mine, match: ['my-own-*'], context: {window: 50000}}\n"
    hook = ContextHook(pack(tmp_path, sized), tmp_path / "state", model="my-own-x")
    hook.process({"model": "a", "messages": [{"role": "user", "content": "hi"}], "litellm_session_id": "s"}, "openai")
    assert hook.stats["prepared"] == 1


def test_a_model_the_registry_does_not_know_is_taken_with_a_window(tmp_path: Path) -> None:
    hook = ContextHook("builtin:default", tmp_path / "state", model="my-own-model", window=32_000)
    hook.process(
        {"model": "alias", "messages": [{"role": "user", "content": "hi"}], "litellm_session_id": "s"}, "openai"
    )
    assert hook.stats["prepared"] == 1


def test_its_own_output_passes_unchanged_without_a_state_write(tmp_path: Path) -> None:
    hook = ContextHook("builtin:default", tmp_path / "state", window=32_000)
    data = {"model": "gpt-4o", "messages": long_history(), "litellm_session_id": "idem"}
    out = hook.process(data, "openai", api_key="key-1")
    state = next((tmp_path / "state" / "keys").glob("*/idem/state.json"))
    before = (state.stat().st_mtime_ns, state.read_bytes())
    again = hook.process(out, "openai", api_key="key-1")
    assert again is out
    assert (state.stat().st_mtime_ns, state.read_bytes()) == before
    assert hook.stats == {"prepared": 1, "unchanged": 1, "passed": 0, "failed": 0}


@pytest.mark.parametrize(
    ("session", "key"),
    [("other", "key-1"), ("idem", "key-2"), (None, "key-1")],
    ids=["another-session", "another-api-key", "stateless"],
)
def test_its_output_sent_for_another_session_is_prepared_there(tmp_path: Path, session: str | None, key: str) -> None:
    """The digest of what the hook produced ignored the session: another conversation (or the
    same id under another key) whose request equalled that output (the same first message)
    went on as "unchanged" — its session kept no turn and its budget was never checked."""
    hook = ContextHook("builtin:default", tmp_path / "state", window=32_000)
    first = [{"role": "user", "content": "Summarize the README please."}]
    out = hook.process({"model": "gpt-4o", "messages": first, "litellm_session_id": "idem"}, "openai", api_key="key-1")
    assert hook.process(out, "openai", api_key="key-1") is out  # its own session: still unchanged
    other = {k: v for k, v in out.items() if k != "litellm_session_id"}
    if session is not None:
        other["litellm_session_id"] = session
    hook.process(other, "openai", api_key=key)
    assert hook.stats == {"prepared": 2, "unchanged": 1, "passed": 0, "failed": 0}
    if session is not None:
        tenant = hashlib.sha256(key.encode()).hexdigest()[:16]
        assert (tmp_path / "state" / "keys" / tenant / session / "state.json").is_file()


def test_its_own_messages_with_other_tools_are_prepared(tmp_path: Path) -> None:
    # The digest of what the hook produced covered the messages only: the same messages with
    # tools the hook never saw went on unprepared (tools neither checked nor normalized).
    hook = ContextHook("builtin:default", tmp_path / "state", window=32_000)
    data = {"model": "gpt-4o", "messages": long_history(), "litellm_session_id": "tools"}
    out = hook.process(data, "openai", api_key="key-1")
    tool = {"type": "function", "function": {"name": "Read", "parameters": {"type": "object", "properties": {}}}}
    again = hook.process({**out, "tools": [tool]}, "openai", api_key="key-1")
    assert again is not out and again["tools"] == [tool]
    assert hook.stats == {"prepared": 2, "unchanged": 0, "passed": 0, "failed": 0}


def test_a_request_nested_past_the_stack_goes_on_unchanged(tmp_path: Path) -> None:
    """A message nested ~5,000 levels deep (valid JSON): ctxrules cannot take it (MessagesError)
    and with on_error "pass" the request goes on as given; the hook's own digest of it must not
    be what fails (it raised RecursionError outside the guard, and the request was lost)."""
    deep: Any = "x"
    for _ in range(5000):
        deep = [deep]
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok", "extra": deep}]
    hook = ContextHook("builtin:default", tmp_path / "state", window=32_000)
    data = {"model": "gpt-4o", "messages": messages, "litellm_session_id": "deep"}
    assert hook.process(data, "openai") is data
    assert hook.stats["failed"] == 1
    reply = completion(hook, model="gpt-4o", messages=messages, mock_response="fine")
    assert reply.choices[0].message.content == "fine"


def test_stateless_calls_keep_no_session_in_a_redis_store(redis_url: str) -> None:
    """Without a session id nothing of the conversation stays in the shared store but the
    vault items its markers name; a later stateless request holding those markers (and the
    injected messages the first call made) is read as such: the markers resolve, the
    injected messages are recognised (signed with the store's key), not taken for the user's."""
    import redis

    from ctxrules.dangling import LOST_PREFIX, marker_ids
    from ctxrules.injected import InjectionKey
    from ctxrules.messages import is_injected, message_text
    from ctxrules.stores.redis import RedisStore
    from ctxrules.vault import Vault

    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    hook = ContextHook("builtin:default", store=redis_url, window=32_000)
    out = hook.process({"model": "gpt-4o", "messages": long_history()}, "openai")
    assert len(out["messages"]) < len(long_history()) / 2
    ids = marker_ids(out["messages"])
    assert ids
    store = RedisStore.from_url(redis_url)
    assert store.sessions() in ([], ["stateless"])  # the shared vault's name, nothing else
    assert Vault.of(store, store.session_key("stateless")).missing(ids) == set()
    # Only vault items (with their upkeep) and the store's key: no state, output or ledger.
    left = {key.decode() for key in client.keys("*") if not key.decode().startswith("ctxrules:v1:blob:")}
    assert left <= {
        "ctxrules:v1:{secret}:injection.key",
        "ctxrules:v1:{stateless}:blobs",
        "ctxrules:v1:{stateless}:meta",
    }
    assert set(client.hkeys("ctxrules:v1:{stateless}:meta")) <= {b"blobs_extended", b"used"}
    again = hook.process(
        {"model": "gpt-4o", "messages": [*out["messages"], {"role": "user", "content": "go on"}]}, "openai"
    )
    assert LOST_PREFIX not in json.dumps(again["messages"])
    # Signed with the store's key, as every worker of the store signs.
    key = InjectionKey(store.secret(None, "injection.key", lambda: b""))
    injected = [m for m in out["messages"] if is_injected(m)]
    assert injected and all(key.verified(message_text(m)) is not None for m in injected)


def test_two_api_keys_never_share_a_session(tmp_path: Path) -> None:
    hook = ContextHook("builtin:default", tmp_path / "state", window=32_000)
    for key in ("key-a", "key-b"):
        hook.process(
            {"model": "gpt-4o", "messages": [{"role": "user", "content": key}], "litellm_session_id": "same"},
            "openai",
            api_key=key,
        )
    assert len(list((tmp_path / "state" / "keys").glob("*/same/state.json"))) == 2


def test_without_a_session_id_nothing_but_the_shared_vault_is_kept(tmp_path: Path) -> None:
    hook = ContextHook("builtin:default", tmp_path / "state", window=32_000)
    out = hook.process({"model": "gpt-4o", "messages": long_history()}, "openai")
    assert len(out["messages"]) < len(long_history()) / 2
    assert not list((tmp_path / "state").rglob("state.json"))
    assert list((tmp_path / "state" / ".stateless").iterdir()) == []
    vault = tmp_path / "state" / "vault"
    assert vault.is_dir() and any(p.is_file() for p in vault.rglob("*"))


@pytest.mark.parametrize(("planted", "request_extra"), [("keys", {"litellm_session_id": "s"}), (".stateless", {})])
def test_a_link_planted_below_the_state_root_receives_no_session(
    tmp_path: Path, planted: str, request_extra: dict[str, Any]
) -> None:
    """``keys/`` (sessions of callers with an API key) and ``.stateless/`` are folders of the
    state root: a link planted for either is refused, and no conversation is written through it."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / planted).symlink_to(elsewhere)
    hook = ContextHook("builtin:default", tmp_path / "state", on_error="reject")
    data = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], **request_extra}
    with pytest.raises(litellm.InternalServerError, match="symbolic link"):
        hook.process(data, "openai", api_key="key-a")
    assert list(elsewhere.iterdir()) == []


def test_a_session_named_like_the_stores_own_folders_gets_a_folder_of_its_own(tmp_path: Path) -> None:
    hook = ContextHook("builtin:default", tmp_path / "state", window=32_000)
    for name in ("vault", ".stateless"):
        hook.process({"model": "gpt-4o", "messages": long_history(), "litellm_session_id": name}, "openai")
        state = tmp_path / "state" / hashlib.sha256(name.encode()).hexdigest() / "state.json"
        assert state.is_file()
    assert not (tmp_path / "state" / "vault" / "state.json").exists()
    assert not (tmp_path / "state" / ".stateless" / "state.json").exists()
    listed = set(FilesystemStore(tmp_path / "state").sessions())
    assert {str(tmp_path / "state" / hashlib.sha256(n.encode()).hexdigest()) for n in ("vault", ".stateless")} <= listed


def test_an_integer_session_id_names_a_session(tmp_path: Path) -> None:
    hook = ContextHook("builtin:default", tmp_path / "state", window=32_000)
    hook.process({"model": "gpt-4o", "messages": long_history(), "metadata": {"session_id": 42}}, "openai")
    assert (tmp_path / "state" / "42" / "state.json").is_file()
    hook.process({"model": "gpt-4o", "messages": long_history(), "metadata": {"session_id": True}}, "openai")
    assert sorted(p.parent.name for p in (tmp_path / "state").rglob("state.json")) == ["42"]


def test_anthropic_requests_come_back_in_anthropic_form(tmp_path: Path) -> None:
    hook = ContextHook("builtin:default", tmp_path / "state", window=32_000)
    request = A.encode(long_history(), None, {"model": "claude-sonnet-4-5", "max_tokens": 100})
    out = hook.process({**request, "litellm_session_id": "anth"}, "anthropic")
    assert out["model"] == "claude-sonnet-4-5" and out["litellm_session_id"] == "anth"
    assert A.validate({k: out[k] for k in ("messages", "system") if k in out}) == []
    assert len(out["messages"]) < len(request["messages"]) / 4


def test_other_call_types_pass_through(tmp_path: Path) -> None:
    hook = ContextHook("builtin:default", tmp_path / "state")
    data = {"model": "gpt-4o", "input": "hello"}
    assert asyncio.run(hook.async_pre_call_deployment_hook(data, "aembedding")) is data
    assert hook.stats["passed"] == 1


def test_the_proxy_hook_is_defined_on_the_class_itself() -> None:
    # litellm's proxy only dispatches async_pre_call_hook when vars(cls) has it.
    assert "async_pre_call_hook" in vars(ContextHook)
    assert "async_pre_call_deployment_hook" in vars(ContextHook)


def test_the_gateway_guard_is_a_bad_request(tmp_path: Path) -> None:
    hook = ContextHook(pack(tmp_path, "guards: {max_request_tokens: 1000}\n"), tmp_path / "state")
    with pytest.raises(litellm.BadRequestError, match="gateway guard") as caught:
        hook.process({"model": "gpt-4o", "messages": [{"role": "user", "content": "word " * 5000}]}, "openai")
    assert caught.value.status_code == 400


def test_an_exceeded_budget_is_a_rate_limit(tmp_path: Path) -> None:
    hook = ContextHook(pack(tmp_path, "budgets: {session: {tokens: 100}}\n"), tmp_path / "state")
    hook._session(tmp_path / "state" / "spent", "gpt-4o").record_usage({"prompt_tokens": 500, "completion_tokens": 1})
    with pytest.raises(litellm.RateLimitError, match="budget exceeded") as caught:
        hook.process(
            {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "litellm_session_id": "spent"},
            "openai",
        )
    assert caught.value.status_code == 429


def test_a_failure_of_ctxrules_passes_the_request_on_or_rejects_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    data = {"model": "not-a-model-ctxrules-knows", "messages": [{"role": "user", "content": "hi"}]}
    passing = ContextHook("builtin:default", tmp_path / "state")
    assert passing.process(data, "openai") is data
    assert passing.stats["failed"] == 1
    # The warning goes to stderr, or to the standard logging module when that is set up (as
    # pytest does).
    assert "on_error: pass" in capsys.readouterr().err + caplog.text
    rejecting = ContextHook("builtin:default", tmp_path / "state", on_error="reject")
    with pytest.raises(litellm.InternalServerError, match="ctxrules failed"):
        rejecting.process(data, "openai")


def test_a_request_naming_a_megabyte_model_is_said_in_a_short_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """A request whose model is 2 MB long: the warning of on_error="pass" logged all of it on
    every request, and the 500 of "reject" sent it back whole."""
    data = {"model": "gpt-4o" + "x" * 2_000_000, "messages": [{"role": "user", "content": "hi"}]}
    passing = ContextHook("builtin:default", tmp_path / "state")
    assert passing.process(data, "openai") is data
    logged = capsys.readouterr().err + caplog.text
    assert "unknown model 'gpt-4oxxx" in logged and "(2,000,006 characters)" in logged, logged[:500]
    assert len(logged) < 2_000, len(logged)
    rejecting = ContextHook("builtin:default", tmp_path / "state", on_error="reject")
    with pytest.raises(litellm.InternalServerError) as caught:
        rejecting.process(data, "openai")
    assert "(2,000,006 characters)" in str(caught.value) and len(str(caught.value)) < 2_000


def test_a_refused_usage_record_or_request_leaves_no_session_directory(tmp_path: Path) -> None:
    """Usage without a model, without token counts or without a body, and requests for a model
    ctxrules cannot size: each is refused (a warning; the call goes on), and each left an empty
    session directory behind."""
    state = tmp_path / "state"
    hook = ContextHook("builtin:default", state)
    counts = {"usage": {"prompt_tokens": 10, "completion_tokens": 5}}
    hook.log_success_event({"litellm_session_id": "no-model"}, counts, None, None)
    hook.log_success_event({"litellm_session_id": "no-usage", "model": "gpt-4o"}, {"id": "x"}, None, None)
    hook.log_success_event({"litellm_session_id": "no-body", "model": "gpt-4o"}, None, None, None)
    for sid, model in (("unknown-model", "not-a-model-ctxrules-knows"), ("empty-model", "")):
        data = {"model": model, "messages": [{"role": "user", "content": "hi"}], "litellm_session_id": sid}
        assert hook.process(data, "openai") is data
    assert not state.exists() or sorted(p.name for p in state.iterdir()) == []
    hook.log_success_event({"litellm_session_id": "ok", "model": "gpt-4o"}, counts, None, None)
    assert (state / "ok" / "ledger.jsonl").is_file()


def test_a_missing_litellm_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "litellm.integrations.custom_logger", None)
    monkeypatch.delitem(sys.modules, "ctxrules.integrations.litellm")
    with pytest.raises(ImportError, match=r'pip install "ctxrules\[litellm-proxy\]"'):
        importlib.import_module("ctxrules.integrations.litellm")


def test_the_async_sdk_messages_call_without_a_system_prompt_is_compacted(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    """litellm's ``anthropic.messages.acreate`` hands the hook every parameter it has, unset
    ones as None (``system=None``, ``tools=None``): None is "not given", not a malformed system
    prompt. It was read as one, so every such call failed in ctxrules and went out uncompacted."""
    hook = ContextHook("builtin:default", tmp_path / "state", window=32_000)
    history = [m for m in long_history() if m["role"] != "system"]
    request = A.encode(history, None, {})

    async def call() -> Any:
        litellm.callbacks = [hook]
        try:
            answer = await litellm.anthropic.messages.acreate(
                model="anthropic/claude-sonnet-4-5",
                max_tokens=100,
                messages=request["messages"],
                api_base=upstream.url,
                api_key="sk-x",
                litellm_session_id="messages-1",
            )
            for _ in range(100):  # litellm logs success in a background task
                if (tmp_path / "state" / "messages-1" / "ledger.jsonl").is_file():
                    break
                await asyncio.sleep(0.05)
            return answer
        finally:
            litellm.callbacks = []

    asyncio.run(call())
    sent = upstream.requests[-1][1]
    assert hook.stats["failed"] == 0 and hook.stats["prepared"] == 1
    assert "system" not in sent and "tools" not in sent
    assert len(sent["messages"]) < len(request["messages"]) / 4
    assert A.validate(sent) == []


@pytest.mark.parametrize(
    ("kind", "data", "where"),
    [
        ("openai", {"model": "gpt-4o", "messages": [{"role": "user", "content": 5}]}, "message 0 (user): 'content'"),
        (
            "anthropic",
            {
                "model": "claude-sonnet-4-5",
                "max_tokens": 10,
                "messages": [{"role": "user", "content": [{"text": "x"}]}],
            },
            "messages[0].content[0]",
        ),
        (
            "anthropic",
            {
                "model": "claude-sonnet-4-5",
                "max_tokens": 10,
                "messages": [{"role": "user", "content": [{"type": "text", "text": "x", "x": float("nan")}]}],
            },
            "request /messages/0/content/0/x",
        ),
        (
            # An id Python cannot write out in decimal: str() raised a ValueError (a 500).
            "openai",
            {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "metadata": {"session_id": 10**5000}},
            "session_id: an integer of more than 4300 digits",
        ),
        # What completion() (the sync wrapper, which has no hook to filter its calls) handed on:
        # no messages at all, or None, was a KeyError or a TypeError of ctxrules (a 500).
        ("openai", {"model": "gpt-4o"}, "expected a JSON list of chat messages"),
        ("openai", {"model": "gpt-4o", "messages": None}, "got null"),
    ],
)
def test_a_malformed_request_rejected_is_a_bad_request_not_a_server_error(
    tmp_path: Path, kind: Any, data: dict[str, Any], where: str
) -> None:
    """With on_error="reject", a request ctxrules cannot read is the caller's error (400, with
    where it is malformed), not ctxrules failing (a 500 clients and the Router retry); with
    "pass" it goes on as given, for the provider to refuse."""
    rejecting = ContextHook("builtin:default", tmp_path / "state", on_error="reject")
    with pytest.raises(litellm.BadRequestError, match="ctxrules: ") as caught:
        rejecting.process(data, kind)
    assert caught.value.status_code == 400 and where in str(caught.value)
    assert ContextHook("builtin:default", tmp_path / "state").process(data, kind) is data


def test_a_script_that_ends_right_after_its_async_call_still_records_the_usage(tmp_path: Path) -> None:
    """``asyncio.run(main())`` and exit, as a user's script does: litellm's success logging
    then runs while the interpreter shuts down, when no thread can be started. The hook's
    hand-off to a thread failed there with a traceback on stderr, and the call's usage never
    reached the session ledger (budgets counted less than was spent)."""
    import subprocess
    import textwrap

    script = tmp_path / "agent.py"
    script.write_text(
        textwrap.dedent(
            """\
            import asyncio, os
            import litellm
            from ctxrules.integrations.litellm import ContextHook

            litellm.callbacks = [ContextHook(pack="builtin:default", state=os.path.abspath("state"))]

            async def main():
                r = await litellm.acompletion(
                    model="gpt-4o", messages=[{"role": "user", "content": "hi"}],
                    mock_response="hello", metadata={"session_id": "s1"},
                )
                print(r.choices[0].message.content)

            asyncio.run(main())
            """
        ),
        encoding="utf-8",
    )
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "hello", done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    (ledger,) = (tmp_path / "state").glob("*/ledger.jsonl")
    (record,) = [json.loads(line) for line in ledger.read_text(encoding="utf-8").splitlines()]
    assert record["model"] == "gpt-4o" and record["tokens"]["completion"] > 0


def test_the_sync_wrapper_prepares_litellms_own_message_objects(tmp_path: Path, upstream: FakeUpstream) -> None:
    """The SDK continues a conversation with the response's message object itself (and its tool
    calls as objects), and litellm.completion takes them: the sync wrapper read one as "not an
    object" and the request went on unprepared, or was refused with on_error="reject". (The
    async hooks get dicts: litellm converts the objects before it calls them.)"""
    call = {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    reply = litellm.Message(role="assistant", content=None, tool_calls=[call])
    said = litellm.Message(role="assistant", content="two files")
    history: list[Any] = [
        {"role": "user", "content": "list the files"},
        reply,
        {"role": "tool", "tool_call_id": "call_1", "content": "a.txt\nb.txt"},
        said,
        {"role": "user", "content": "and again"},
        {"role": "assistant", "content": None, "tool_calls": reply.tool_calls},
        {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
    ]
    hook = ContextHook("builtin:default", tmp_path / "state", on_error="reject")
    completion(model="openai/gpt-4o", api_base=f"{upstream.url}/v1", api_key="sk-x", messages=history, hook=hook)
    assert hook.stats["prepared"] == 1 and hook.stats["failed"] == 0
    sent = upstream.requests[-1][1]["messages"]
    assert pairing_problems(sent) == []
    # (litellm itself leaves the null content of a tool-call message out of what it sends)
    assert {k: v for k, v in sent[1].items() if v is not None} == {"role": "assistant", "tool_calls": [call]}
    assert sent[3] == {"role": "assistant", "content": "two files"}
    # The call id used twice is told apart in the call and its result, as for dicts.
    assert [c["id"] for c in sent[5]["tool_calls"]] == [sent[6]["tool_call_id"]] == ["call_1_2"]


def test_a_store_that_cannot_be_reached_is_named_as_the_documented_error(tmp_path: Path) -> None:
    """The 500 of on_error="reject" (and the warning of "pass") named the Redis store's private
    class, ``_Unreachable``; it is the documented ``StoreUnavailable`` (CR148)."""
    url = f"unix://{tmp_path}/down.sock?connect_timeout_s=0.5"
    data = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "litellm_session_id": "s"}
    rejecting = ContextHook("builtin:default", store=url, on_error="reject")
    with pytest.raises(litellm.InternalServerError) as caught:
        rejecting.process(data, "openai")
    assert "ctxrules failed: StoreUnavailable: [CR148] cannot reach the Redis store" in str(caught.value)


def test_a_call_the_store_failed_is_not_tried_again_by_its_deployment_hook(tmp_path: Path) -> None:
    """The proxy runs the pre-call hook, then the deployment hook (with the deployment's model
    name), on one call (one ``litellm_call_id``). A store that failed the first failed the second
    again: twice the socket or lock timeout (up to 2 x lock_timeout_s for a busy session) and
    two warnings, before the call went on unchanged all the same. A new call is tried anew."""
    from types import SimpleNamespace

    url = f"unix://{tmp_path}/down.sock?connect_timeout_s=0.5"
    hook = ContextHook("builtin:default", store=url)
    messages = [{"role": "user", "content": "hi"}]

    async def one_call(call_id: str) -> None:
        data = {"model": "gpt-4o", "messages": messages, "litellm_session_id": "s", "litellm_call_id": call_id}
        assert await hook.async_pre_call_hook(SimpleNamespace(token="k"), None, data, "acompletion") is data
        deployment = {**data, "model": "openai/gpt-4o", "metadata": {"user_api_key_hash": "k"}}
        assert await hook.async_pre_call_deployment_hook(deployment, "acompletion") is deployment

    asyncio.run(one_call("call-1"))
    assert hook.stats["failed"] == 1 and hook.stats["passed"] == 1
    asyncio.run(one_call("call-2"))
    assert hook.stats["failed"] == 2


def fallback_history() -> list[dict[str, Any]]:
    """A conversation long enough for the provider's cache markers (the prefix is cached from
    1,024 tokens on)."""
    rules = "Answer briefly and cite the file you read. " * 300
    return [
        {"role": "system", "content": rules},
        {"role": "user", "content": "Which test fails, and why? " * 200},
    ]


def test_a_router_fallback_to_another_provider_is_prepared_for_that_model(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    """The first deployment (gpt-4o) fails and the Router falls back to Claude: the request the
    hook had prepared for gpt-4o (no cache breakpoints, gpt-4o's window) went to Claude as it
    was, taken for an output of this hook. It is prepared for Claude, as a call that went to
    Claude first is."""

    def router(fallback: bool) -> Any:
        gpt = {"model": "openai/gpt-4o", "api_base": f"{upstream.url}/v1", "api_key": "sk-x"}
        if fallback:
            gpt["mock_response"] = "litellm.InternalServerError"
        claude = {"model": "anthropic/claude-sonnet-4-5", "api_base": upstream.url, "api_key": "sk-x"}
        return litellm.Router(
            model_list=[
                {"model_name": "primary", "litellm_params": gpt},
                {"model_name": "backup", "litellm_params": claude},
            ],
            fallbacks=[{"primary": ["backup"]}],
            num_retries=0,
        )

    async def call(group: str, hook: ContextHook, fallback: bool) -> Any:
        litellm.callbacks = [hook]
        try:
            return await router(fallback).acompletion(model=group, messages=fallback_history(), litellm_session_id="fb")
        finally:
            litellm.callbacks = []

    hook = ContextHook("builtin:default", tmp_path / "state")
    answer = asyncio.run(call("primary", hook, fallback=True))
    assert answer.choices[0].message.content == "ok"
    assert [path for path, _ in upstream.requests] == ["/v1/messages"]  # gpt-4o's call was the mock's
    asyncio.run(call("backup", ContextHook("builtin:default", tmp_path / "direct"), fallback=False))
    (_, by_fallback), (_, direct) = upstream.requests
    assert "cache_control" in json.dumps(direct["messages"])  # what Claude's preparation adds
    assert {k: by_fallback.get(k) for k in ("system", "messages")} == {k: direct.get(k) for k in ("system", "messages")}
    assert hook.stats["prepared"] == 2 and hook.stats["unchanged"] == 0, hook.stats


@pytest.mark.parametrize(
    ("router_options", "request_options", "left"),
    [
        ({"default_fallbacks": ["claude"]}, {}, True),  # a "*" entry: every group's
        ({"context_window_fallbacks": [{"gpt": ["claude"]}]}, {}, True),
        ({"fallbacks": [{"gpt": ["gpt-too"]}, {"gpt-too": ["claude"]}]}, {}, True),  # followed in turn
        ({}, {"fallbacks": ["claude"]}, True),  # the request's own
        ({"fallbacks": [{"gpt": ["gpt-too"]}]}, {}, False),  # the same model: prepared at once
        ({"fallbacks": [{"claude": ["gpt"]}]}, {}, False),  # another group's
    ],
)
def test_the_proxys_pre_call_hook_leaves_a_group_whose_fallbacks_serve_another_model(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    router_options: dict[str, Any],
    request_options: dict[str, Any],
    left: bool,
) -> None:
    """Prepared for the group's model, the request went on to the fallback's as it was."""
    from types import SimpleNamespace

    deployments = [("gpt", "openai/gpt-4o"), ("gpt-too", "openai/gpt-4o"), ("claude", "anthropic/claude-sonnet-4-5")]
    router = litellm.Router(
        model_list=[{"model_name": n, "litellm_params": {"model": m}} for n, m in deployments], **router_options
    )
    monkeypatch.setitem(sys.modules, "litellm.proxy.proxy_server", SimpleNamespace(llm_router=router))
    hook = ContextHook("builtin:default", tmp_path / "state")
    data = {"model": "gpt", "messages": [{"role": "user", "content": "hi"}], "litellm_session_id": "s"}
    out = hook.process({**data, **request_options}, "openai", proxy=True)
    assert hook.stats == {"prepared": 0 if left else 1, "unchanged": 0, "passed": 1 if left else 0, "failed": 0}
    assert (out == {**data, **request_options}) is left
