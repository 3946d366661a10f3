"""End to end through a REAL litellm proxy (``litellm --config``) with ctxrules' hook, in front
of a fake upstream that records what reaches it."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import transcript_path
from invariants import pairing_problems
from proxy_kit import FakeUpstream, missing_proxy_modules, post, running_proxy, write_config

from ctxrules.formats import anthropic as A

pytestmark = pytest.mark.skipif(
    bool(missing_proxy_modules()),
    reason=f'the litellm proxy needs {", ".join(missing_proxy_modules())}: pip install "ctxrules[litellm-proxy]"',
)

HOOK = """\
from ctxrules.integrations.litellm import ContextHook

hook = ContextHook({pack!r}, {state!r}, window=32000)
"""
PACK = """\
apiVersion: ctxrules/v1
kind: RulePack
metadata: {name: proxy-test, version: 1.0.0}
extends: [builtin:default]
guards: {max_request_tokens: 400000}
budgets: {session: {tokens: 2500}}
"""
# Keys OpenAI's chat API defines on a message (what may travel on the wire).
OPENAI_KEYS = {"role", "content", "name", "tool_calls", "tool_call_id", "refusal", "cache_control"}


def transcript(name: str) -> list[dict[str, Any]]:
    path = transcript_path(name)
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Any:
    transcript_path("claudecode-ae4a77f8")  # the proxy's tests replay the corpus: skip without it
    folder = tmp_path_factory.mktemp("proxy")
    (folder / "pack.yaml").write_text(PACK)
    state = folder / "state"
    with FakeUpstream(usage_tokens=1000) as upstream:
        config = write_config(folder, upstream.url, hook=HOOK.format(pack=str(folder / "pack.yaml"), state=str(state)))
        with running_proxy(config) as base:
            yield base, upstream, state


def log_since(state: Path, start: int) -> str:
    return (state.parent / "proxy.log").read_text(errors="replace")[start:]


def log_size(state: Path) -> int:
    return len((state.parent / "proxy.log").read_text(errors="replace"))


def received(upstream: FakeUpstream, path_end: str, marker: str) -> dict[str, Any]:
    needle = json.dumps(marker)[1:-1]
    hits = [body for path, body in upstream.requests if path.endswith(path_end) and needle in json.dumps(body)]
    assert len(hits) == 1, [p for p, _ in upstream.requests]
    return hits[0]


def wire_clean(messages: list[dict[str, Any]]) -> list[str]:
    allowed = set(OPENAI_KEYS)
    # Injected messages still carry the metadata key while the engine defines it; the change
    # that makes the output wire-clean removes the key, and this check is strict again.
    import ctxrules.messages

    if getattr(ctxrules.messages, "INJECTED_KEY", None):
        allowed.add(ctxrules.messages.INJECTED_KEY)
    return [f"message {i}: {sorted(set(m) - allowed)}" for i, m in enumerate(messages) if set(m) - allowed]


def test_chat_completions_reach_the_upstream_compacted(proxy: Any) -> None:
    base, upstream, state = proxy
    history = transcript("claudecode-ae4a77f8.json")
    tag = "chat-long-1"
    start = log_size(state)
    status, answer = post(
        base, "/v1/chat/completions", {"model": "gpt-4o", "messages": history}, headers={"x-litellm-trace-id": tag}
    )
    assert status == 200, answer
    body = received(upstream, "/chat/completions", history[1]["content"][:200])
    sent = body["messages"]
    assert len(sent) < len(history) / 4
    assert pairing_problems(sent) == []
    assert wire_clean(sent) == []
    assert "_ctxrules" not in json.dumps(body)
    sessions = list((state / "keys").glob(f"*/{tag}"))
    assert len(sessions) == 1 and (sessions[0] / "vault").is_dir()
    # The pre-call hook compacted it once; the deployment hook then saw ctxrules' own output
    # and let it pass without a second run or a state write.
    log = log_since(state, start)
    assert log.count("litellm.prepared") == 1 and tag in log
    assert log.count("litellm.unchanged") >= 1


def test_messages_to_an_openai_model_are_compacted_once(proxy: Any) -> None:
    """/v1/messages routed to an OpenAI model: the deployment hook fires with
    anthropic_messages (ctxrules' output: unchanged) and then with aresponses (passed)."""
    base, upstream, state = proxy
    history = transcript("claudecode-subagent-afc096d.json")
    request = A.encode(history, None, {"model": "gpt-4o", "max_tokens": 1024})
    start = log_size(state)
    status, answer = post(
        base,
        "/v1/messages",
        {**request, "metadata": {"session_id": "to openai #1"}},
        headers={"anthropic-version": "2023-06-01"},
    )
    assert status == 200, answer
    body = received(upstream, "/responses", history[0]["content"][:200])
    assert len(json.dumps(body)) < 0.75 * len(json.dumps(request))
    log = log_since(state, start)
    assert log.count("litellm.prepared") == 1, log[-3000:]
    assert "call_type=aresponses" in log
    # An id outside [A-Za-z0-9._-] names its session by its sha256.
    import hashlib

    assert list((state / "keys").glob(f"*/{hashlib.sha256(b'to openai #1').hexdigest()}"))


def test_messages_reach_the_upstream_compacted_and_valid(proxy: Any) -> None:
    base, upstream, _state = proxy
    history = transcript("claudecode-4d5611e5.json")
    request = A.encode(history, None, {"model": "claude-sonnet-4-5", "max_tokens": 1024})
    status, answer = post(
        base,
        "/v1/messages",
        {**request, "litellm_session_id": "messages-long-1"},
        headers={"anthropic-version": "2023-06-01"},
    )
    assert status == 200, answer
    body = received(upstream, "/messages", history[0]["content"][:200])
    assert len(body["messages"]) < len(request["messages"]) / 4
    sendable = {k: v for k, v in body.items() if k in ("system", "messages", "tools")}
    assert A.validate(sendable) == []
    assert "_ctxrules" not in json.dumps(body)


def test_two_sessions_in_parallel_stay_apart(proxy: Any) -> None:
    base, upstream, state = proxy
    first, second = transcript("claudecode-8463c716.json"), transcript("claudecode-fa812bfe.json")
    results: dict[str, int] = {}

    def send(name: str, history: list[dict[str, Any]]) -> None:
        results[name] = post(
            base, "/v1/chat/completions", {"model": "gpt-4o", "messages": history, "litellm_session_id": name}
        )[0]

    threads = [
        threading.Thread(target=send, args=("par-a", first)),
        threading.Thread(target=send, args=("par-b", second)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert results == {"par-a": 200, "par-b": 200}
    a = received(upstream, "/chat/completions", first[0]["content"][:200])
    b = received(upstream, "/chat/completions", second[0]["content"][:200])
    assert second[0]["content"][:200] not in json.dumps(a) and first[0]["content"][:200] not in json.dumps(b)
    assert pairing_problems(a["messages"]) == [] and pairing_problems(b["messages"]) == []
    for name in ("par-a", "par-b"):
        assert len(list((state / "keys").glob(f"*/{name}/state.json"))) == 1


def test_the_same_request_again_is_not_compacted_twice(proxy: Any) -> None:
    """Both hooks fire per request; a history extended by one turn reuses the session."""
    base, upstream, _state = proxy
    history = transcript("claudecode-258c7280.json")
    status, _ = post(
        base, "/v1/chat/completions", {"model": "gpt-4o", "messages": history, "litellm_session_id": "again"}
    )
    assert status == 200
    first = received(upstream, "/chat/completions", history[0]["content"][:200])
    longer = [*history, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "and now?"}]
    status, _ = post(
        base, "/v1/chat/completions", {"model": "gpt-4o", "messages": longer, "litellm_session_id": "again"}
    )
    assert status == 200
    hits = [b for p, b in upstream.requests if history[0]["content"][:200] in json.dumps(b)]
    assert len(hits) == 2
    # The second output extends the first: the prefix stayed stable for the provider's cache.
    assert hits[1]["messages"][: len(first["messages"]) - 2] == first["messages"][: len(first["messages"]) - 2]


def test_a_request_over_the_gateway_guard_is_a_400_with_ctxrules_message(proxy: Any) -> None:
    base, upstream, _state = proxy
    before = len(upstream.requests)
    huge = [{"role": "user", "content": "word " * 600_000}]
    status, answer = post(base, "/v1/chat/completions", {"model": "gpt-4o", "messages": huge})
    assert status == 400, answer
    assert "gateway guard" in json.dumps(answer)
    assert len(upstream.requests) == before  # never sent


def test_other_endpoints_pass_through(proxy: Any, tmp_path: Path) -> None:
    base, upstream, _state = proxy
    status, _answer = post(base, "/v1/embeddings", {"model": "gpt-4o", "input": "hello"})
    # The fake upstream answers embeddings with a chat body; what matters is that the hook let
    # the call through to it untouched.
    assert any(p.endswith("/embeddings") and b.get("input") in ("hello", ["hello"]) for p, b in upstream.requests), (
        status,
        [p for p, _ in upstream.requests],
    )


def test_an_exceeded_session_budget_is_a_429(proxy: Any) -> None:
    """The hook records each call's usage (1,000 prompt tokens from the fake upstream) in the
    session's ledger; the pack's 2,500-token session budget then refuses the fourth call."""
    base, upstream, state = proxy
    statuses = []
    for turn in range(4):
        status, answer = post(
            base,
            "/v1/chat/completions",
            {
                "model": "gpt-4o",
                "litellm_session_id": "budget",
                "messages": [{"role": "user", "content": f"turn {turn}"}],
            },
        )
        statuses.append(status)
        # litellm runs success callbacks after the response is sent: wait for the record.
        deadline = time.monotonic() + 30
        while status == 200 and time.monotonic() < deadline:
            ledgers = list((state / "keys").glob("*/budget/ledger.jsonl"))
            if ledgers and len(ledgers[0].read_text().splitlines()) > turn:
                break
            time.sleep(0.05)
    assert statuses == [200, 200, 200, 429], answer
    assert "budget exceeded" in json.dumps(answer)
    assert not any("turn 3" in json.dumps(b) for _, b in upstream.requests)


# A proxy whose hook has neither model= nor window=: the request's model name alone decides.
ALIAS_HOOK = """\
from ctxrules.integrations.litellm import ContextHook

hook = ContextHook("builtin:default", {state!r}, on_error="reject")
"""
ALIASES = (
    ("my-fast", "openai/gpt-4o"),
    # One name, two deployments: their windows are 200K and 128K.
    ("pair", "anthropic/claude-sonnet-4-5"),
    ("pair", "openai/gpt-4o"),
    ("mystery", "openai/not-a-model-ctxrules-knows"),
)


@pytest.fixture(scope="module")
def alias_proxy(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp("alias-proxy")
    state = folder / "state"
    with FakeUpstream() as upstream:
        config = write_config(folder, upstream.url, hook=ALIAS_HOOK.format(state=str(state)), aliases=ALIASES)
        with running_proxy(config) as base:
            yield base, upstream, state


def session_model(state: Path, session: str) -> str:
    (path,) = (state / "keys").glob(f"*/{session}/state.json")
    model: str = json.loads(path.read_text())["fingerprint_parts"]["model"]
    return model


@pytest.mark.parametrize(
    ("alias", "models"),
    [("my-fast", {"openai/gpt-4o"}), ("pair", {"openai/gpt-4o", "anthropic/claude-sonnet-4-5"})],
)
def test_a_model_name_ctxrules_does_not_know_is_read_as_its_deployments_model(
    alias_proxy: Any, alias: str, models: set[str]
) -> None:
    """The pre-call hook took the proxy's ``model_name`` for a model: an alias failed every
    request (a 500 with on_error=reject, a warning with pass). It is now read as the router
    reads it; a group of several models is prepared by the deployment hook, for the model
    the router picked."""
    base, _upstream, state = alias_proxy
    start = log_size(state)
    body = {"model": alias, "messages": [{"role": "user", "content": f"hello {alias}"}], "litellm_session_id": alias}
    status, answer = post(base, "/v1/chat/completions", body)
    assert status == 200, answer
    assert session_model(state, alias) in models
    assert "litellm.error" not in log_since(state, start)


def test_a_model_name_whose_deployments_ctxrules_does_not_know_names_the_deployments_model(alias_proxy: Any) -> None:
    """Left to the deployment hook, which sees the model the router picked: the error names
    that model (what to give ``model=`` or ``window=`` for), not the proxy's alias."""
    base, upstream, _state = alias_proxy
    before = len(upstream.requests)
    body = {"model": "mystery", "messages": [{"role": "user", "content": "hello"}], "litellm_session_id": "mystery"}
    status, answer = post(base, "/v1/chat/completions", body)
    assert status == 500, answer
    assert "unknown model 'openai/not-a-model-ctxrules-knows'" in json.dumps(answer)
    assert len(upstream.requests) == before  # on_error=reject: never sent


def test_two_sessions_opening_with_the_same_request_are_both_prepared(alias_proxy: Any) -> None:
    """The second session's request equalled the first one's output: it went on as that output
    ("unchanged", in both hooks), and the second session kept no turn at all."""
    base, _upstream, state = alias_proxy
    for session in ("first-of-two", "second-of-two"):
        body = {
            "model": "gpt-4o",
            "messages": [{"role": "user", "content": "Same opening."}],
            "litellm_session_id": session,
        }
        status, answer = post(base, "/v1/chat/completions", body)
        assert status == 200, answer
        assert session_model(state, session) == "gpt-4o"  # prepared by the pre-call hook


# A proxy that lets a login's session token in, counts the model lookups of its hook, and falls
# back from a deployment that fails to one of another provider.
LOGIN_HOOK = """\
from pathlib import Path

import ctxrules.integrations.sizing
from ctxrules.integrations.litellm import ContextHook
from litellm.proxy._types import LiteLLM_UserTable
from litellm.proxy.auth.auth_checks import ExperimentalUIJWTToken

# What `litellm-proxy login` hands a user: a session token, new at each login, whose key alias
# names the user.
user = LiteLLM_UserTable(user_id="alice", user_role="proxy_admin")
Path("login-token").write_text(ExperimentalUIJWTToken.get_cli_jwt_auth_token(user))

looked_up = ctxrules.integrations.sizing.lookup_model


def counted(name, **options):
    with open("lookups", "a") as out:
        out.write(name + "\\n")
    return looked_up(name, **options)


ctxrules.integrations.sizing.lookup_model = counted
hook = ContextHook("builtin:default", {state!r})
"""
LOGIN_ALIASES = (
    ("counted-alias", "openai/gpt-4o"),
    ("failing-gpt", "openai/gpt-4o", {"mock_response": "litellm.InternalServerError"}),
    ("backup-claude", "anthropic/claude-sonnet-4-5"),
)


@pytest.fixture(scope="module")
def login_proxy(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp("login-proxy")
    state = folder / "state"
    with FakeUpstream() as upstream:
        config = write_config(
            folder,
            upstream.url,
            hook=LOGIN_HOOK.format(state=str(state)),
            aliases=LOGIN_ALIASES,
            router_settings={"fallbacks": [{"failing-gpt": ["backup-claude"]}], "num_retries": 0},
        )
        # Login tokens are sealed with the salt key (else the master key).
        with running_proxy(config, env_extra={"LITELLM_SALT_KEY": "sk-ctxrules-test-salt"}) as base:
            yield base, upstream, state


def test_a_login_session_tokens_request_lands_in_one_session(login_proxy: Any) -> None:
    """A login's token and its key alias differ: the pre-call hook keyed the session on the
    token, the deployment hook on the alias (litellm's ``user_api_key_hash`` for a login), so
    the request was prepared a second time, in a second session."""
    base, _upstream, state = login_proxy
    token = (state.parent / "login-token").read_text()
    start = log_size(state)
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hello"}], "litellm_session_id": "login-1"}
    status, answer = post(base, "/v1/chat/completions", body, headers={"Authorization": f"Bearer {token}"})
    assert status == 200, answer
    (session,) = (path.parent for path in (state / "keys").glob("*/login-1/state.json"))
    log = log_since(state, start)
    assert log.count("litellm.prepared") == 1 and log.count("litellm.unchanged") >= 1, log[-3000:]
    # The call's usage is counted in that session too (litellm records it after the response).
    deadline = time.monotonic() + 30
    while not (session / "ledger.jsonl").is_file() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (session / "ledger.jsonl").is_file()


def test_an_alias_ctxrules_does_not_know_is_looked_up_once(login_proxy: Any) -> None:
    """Each request looked the alias up in the model registry again, and failed again (some 4 ms,
    its close matches, per request)."""
    base, _upstream, state = login_proxy
    for turn in range(3):
        body = {"model": "counted-alias", "messages": [{"role": "user", "content": f"turn {turn}"}]}
        status, answer = post(base, "/v1/chat/completions", {**body, "litellm_session_id": "counted"})
        assert status == 200, answer
    assert session_model(state, "counted") == "openai/gpt-4o"  # read as its deployment's model
    lookups = (state.parent / "lookups").read_text().splitlines()
    assert lookups.count("counted-alias") == 1, lookups


def test_a_fallback_to_another_provider_is_prepared_for_that_model(login_proxy: Any) -> None:
    """The pre-call hook prepared the request for the group's model (gpt-4o); its deployment
    failed and the router sent that output on to Claude as it was (gpt-4o's window, no cache
    breakpoints), the deployment hook taking it for its own output. Claude gets what a request
    sent to Claude directly gets."""
    base, upstream, _state = login_proxy
    rules = "Answer briefly and cite the file you read. " * 300
    messages = [{"role": "system", "content": rules}, {"role": "user", "content": "Which test fails? " * 200}]
    bodies = []
    for group in ("failing-gpt", "backup-claude"):
        before = len(upstream.requests)
        status, answer = post(
            base, "/v1/chat/completions", {"model": group, "messages": messages, "litellm_session_id": f"to-{group}"}
        )
        assert status == 200, answer
        ((path, body),) = upstream.requests[before:]  # the failing deployment is litellm's mock
        assert path.endswith("/messages")
        bodies.append({k: body.get(k) for k in ("system", "messages")})
    by_fallback, direct = bodies
    assert "cache_control" in json.dumps(direct)  # what Claude's preparation adds
    assert by_fallback == direct
