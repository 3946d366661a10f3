"""`session.complete`: real HTTP against a local OpenAI-compatible server that answers the first
request with a context-length error; the emergency pass shrinks the prompt and the retry works."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import transcript_path
from invariants import pairing_problems
from llm_server import LLMServer, context_length_error, http_error, raw, reply

from ctxrules import Engine
from ctxrules.runtime.overflow import CompletionFailed, is_overflow, limit_from


@pytest.mark.corpus
def test_overflow_is_recovered_once_and_retried(tmp_path: Path) -> None:
    source = transcript_path("openhands-ponylang__ponyc-4588.json")
    history = json.loads(source.read_text())
    session = Engine.load("builtin:default").session(tmp_path / "s", model="openai/gpt-4o", window=128000)
    with LLMServer() as server:
        server.script(context_length_error(limit=12000), reply("Done: the fix is in src/libponyc/expr/match.c"))
        result = session.complete(history, api_base=server.base_url, api_key="test-key", model="openai/gpt-4o")
        first, second = server.requests
    assert result.recovered and result.response.choices[0].message.content.startswith("Done")
    assert result.attempts[0]["recovery"]["window"] == 12000
    assert result.attempts[0]["recovery"]["tokens_after"] <= 12000
    sent_again = second.body["messages"]
    assert len(json.dumps(sent_again)) < len(json.dumps(first.body["messages"]))
    assert pairing_problems(sent_again) == []
    # The human anchor and the latest request are still there, word for word.
    anchor = next(m for m in history if m["role"] == "user")
    assert any(m.get("content") == anchor["content"] for m in sent_again)
    assert not any("ctxrules" in m for m in sent_again)  # our metadata key never goes on the wire


def test_other_errors_are_not_retried(tmp_path: Path) -> None:
    session = Engine.load("builtin:default").session(tmp_path / "s", model="openai/gpt-4o")
    with LLMServer() as server:
        server.script(http_error(400, "invalid tool schema"))
        with pytest.raises(CompletionFailed, match="invalid tool schema"):
            session.complete([{"role": "user", "content": "hi"}], api_base=server.base_url, api_key="k", num_retries=0)
        assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("message", "limit"),
    [
        ("This model's maximum context length is 128,000 tokens. However, you requested 130000", 128000),
        ("prompt is too long: 210000 tokens > 200000 maximum", 200000),
        ("Input is too long for requested model. The context window is 8192 tokens", 8192),
    ],
)
def test_limits_are_read_from_provider_messages(message: str, limit: int) -> None:
    exc = RuntimeError(message)
    assert is_overflow(exc) and limit_from(exc) == limit


def _long_history(steps: int = 40) -> list[dict[str, object]]:
    history: list[dict[str, object]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing build."},
    ]
    for i in range(steps):
        call = {
            "id": f"c{i}",
            "type": "function",
            "function": {"name": "Read", "arguments": json.dumps({"path": f"src/mod{i}.py"})},
        }
        history.append({"role": "assistant", "content": f"Reading module {i}.", "tool_calls": [call]})
        body = "\n".join(f"def function_{i}_{j}(value):  # line {j} of module {i}" for j in range(60))
        history.append({"role": "tool", "tool_call_id": f"c{i}", "content": body})
    history.append({"role": "user", "content": "What did you find?"})
    return history


def _pack(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "pack.yaml"
    path.write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: o, version: 1.0.0}\n"
        "extends: builtin:default\n" + body,
        encoding="utf-8",
    )
    return path


def _recovered_tokens(tmp_path: Path, pack: Path, name: str) -> int:
    session = Engine.load(pack).session(tmp_path / name, model="openai/gpt-4o", window=128000)
    with LLMServer() as server:
        server.script(context_length_error(limit=9000), reply("ok"))
        result = session.complete(_long_history(), api_base=server.base_url, api_key="k", model="openai/gpt-4o")
    assert result.recovered
    tokens: int = result.attempts[0]["recovery"]["tokens_after"]
    return tokens


def test_the_recovery_uses_the_packs_own_emergency_options(tmp_path: Path) -> None:
    # The pack's `with:` reaches the recovery: a lower target tier leaves less behind.
    lax = _pack(tmp_path, "pipeline:\n  - {id: emergency, with: {target: full}}\n")
    strict = tmp_path / "strict"
    strict.mkdir()
    strict_pack = _pack(strict, "pipeline:\n  - {id: emergency, with: {target: monitor}}\n")
    assert _recovered_tokens(tmp_path, strict_pack, "strict") < _recovered_tokens(tmp_path, lax, "lax")


def test_a_blocked_emergency_plugin_means_no_recovery(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # CTXRULES_BLOCK_PLUGINS is honoured: no fresh, hard-coded emergency pass behind its back.
    monkeypatch.setenv("CTXRULES_BLOCK_PLUGINS", "ctxrules.stages.compress_emergency")
    pack = _pack(tmp_path, "pipeline:\n  - {id: emergency, enabled: false}\n")

    class Nothing:
        """No hooks: only here so that Engine.load builds a registry under the block list."""

    engine = Engine.load(pack, plugins=[("nothing", Nothing())])
    assert "compress.emergency" not in engine.registry.stages
    session = engine.session(tmp_path / "s", model="openai/gpt-4o", window=128000)
    with LLMServer() as server:
        server.script(context_length_error(limit=9000), reply("ok"))
        with pytest.raises(CompletionFailed, match="maximum context length"):
            session.complete(
                _long_history(), api_base=server.base_url, api_key="k", model="openai/gpt-4o", num_retries=0
            )
        assert len(server.requests) == 1


def test_a_limit_the_prompt_fits_by_our_count_still_shrinks_it(tmp_path: Path) -> None:
    """The provider counts the prompt above its limit where the session's tokenizer counts it
    well within (another tokenizer, images). A pass at that limit would cut nothing and the
    retry would be refused alike: it aims at 80 % of what was sent instead."""
    session = Engine.load("builtin:default").session(tmp_path / "s", model="openai/gpt-4o", window=128000)
    history = _long_history()
    tokens = session.counter.count_messages(session.prepare(history).messages, [])
    with LLMServer() as server:
        server.script(context_length_error(limit=2 * tokens), reply("ok"))
        result = session.complete(history, api_base=server.base_url, api_key="k", model="openai/gpt-4o")
        first, second = server.requests
    recovery = result.attempts[0]["recovery"]
    assert result.recovered and recovery["window"] == int(tokens * 0.8)
    assert recovery["tokens_after"] < recovery["window"]
    assert len(json.dumps(second.body["messages"])) < len(json.dumps(first.body["messages"]))
    assert pairing_problems(second.body["messages"]) == []


def test_a_prompt_the_recovery_cannot_shrink_is_not_sent_again(tmp_path: Path) -> None:
    """Only pinned messages (the system prompt and the one user request): the emergency pass
    cannot cut anything, so the same request is not sent again to be refused again."""
    session = Engine.load("builtin:default").session(tmp_path / "s", model="openai/gpt-4o", window=128000)
    history = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Fix it."}]
    with LLMServer() as server:
        server.script(context_length_error(limit=5), reply("ok"))
        with pytest.raises(CompletionFailed, match=r"could not make the \d+-token prompt smaller: not retried"):
            session.complete(history, api_base=server.base_url, api_key="k", model="openai/gpt-4o", num_retries=0)
        assert len(server.requests) == 1 and server.pending == 1


def test_an_overflow_after_the_recovery_says_the_recovery_ran(tmp_path: Path) -> None:
    """The retry is refused too: the error says the recovery ran and how far it shrank the
    prompt, where the provider's text alone ("maximum context length is N") reads the same as
    a first refusal."""
    session = Engine.load("builtin:default").session(tmp_path / "s", model="openai/gpt-4o", window=128000)
    with LLMServer() as server:
        server.script(context_length_error(limit=9000), context_length_error(limit=9000), reply("ok"))
        with pytest.raises(
            CompletionFailed, match=r"^model call failed after the overflow recovery \(\d+ -> \d+ tokens\): "
        ):
            session.complete(
                _long_history(), api_base=server.base_url, api_key="k", model="openai/gpt-4o", num_retries=0
            )
        assert len(server.requests) == 2 and server.pending == 1


@pytest.mark.parametrize("limit", [1, 2, 3])
def test_a_limit_of_a_token_or_three_is_an_error_not_a_crash(tmp_path: Path, limit: int) -> None:
    """A provider (or proxy) whose overflow error names a limit of 1 token: the emergency pass
    reserved all of it for the output, and the session's budget divided by its zero usable
    tokens (``ZeroDivisionError`` out of ``complete``). The pass runs and the error stands."""
    session = Engine.load("builtin:default").session(tmp_path / "s", model="openai/gpt-4o", window=128000)
    history = [
        {"role": "user", "content": "hello " * 50},
        {"role": "assistant", "content": "ok " * 50},
        {"role": "user", "content": "next"},
    ]
    with LLMServer() as server:
        server.script(context_length_error(limit=limit), reply("fine"))
        with pytest.raises(CompletionFailed, match=f"maximum context length is {limit} tokens"):
            session.complete(history, api_base=server.base_url, api_key="k", model="openai/gpt-4o", num_retries=0)


def test_a_run_of_digits_in_the_providers_error_is_read_in_one_pass() -> None:
    """The limit pattern ``\\d[\\d,]* tokens? > N`` tried every digit of a long run as a start
    and ran to the run's end each time: quadratic in the provider's text (100,000 digits in a
    400's message held ``complete`` for 40 s, a megabyte for hours, after the HTTP call had
    returned). Run in a child given a minute, which the quadratic search would take hours past."""
    import subprocess
    import sys

    from conftest import REPO

    code = (
        "from ctxrules.runtime.overflow import limit_from\n"
        "text = 'prompt is too long: ' + '7' * 1_000_000 + ' and 1,234 tokens > 1,000 maximum'\n"
        "print(limit_from(RuntimeError(text)), limit_from(RuntimeError('7' * 15_000 + ' tokens > 12 maximum')))\n"
    )
    env = {"PYTHONPATH": str(REPO / "engine"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    # (the first names its limit past the text searched: a provider's comes in its first line)
    assert done.stdout.split() == ["None", "12"]


def test_the_message_litellm_returned_is_taken_back_in_the_next_history(tmp_path: Path) -> None:
    """The natural agent loop, ``history.append(done.response.choices[0].message)`` (a litellm
    ``Message``, tool calls included) then the tool's result: the next ``complete`` refused it
    ("message 1: expected an object, got Message"), where ``integrations.litellm.completion``
    took the same history."""
    session = Engine.load("builtin:default").session(tmp_path / "s", model="openai/gpt-4o", window=128000)
    call = {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    asked = {
        "id": "c",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-4o",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }
    with LLMServer() as server:
        server.script(raw(json.dumps(asked).encode()), reply("two files"))
        history: list[Any] = [{"role": "user", "content": "list the files"}]
        options = {"api_base": server.base_url, "api_key": "k", "model": "openai/gpt-4o", "num_retries": 0}
        done = session.complete(history, **options)
        message = done.response.choices[0].message
        assert not isinstance(message, dict) and message.tool_calls
        history += [message, {"role": "tool", "tool_call_id": "call_1", "content": "a.py b.py"}]
        again = session.complete(history, **options)
        assert again.response.choices[0].message.content == "two files"
        sent = server.requests[1].body["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool"]
    assert sent[1]["tool_calls"][0]["id"] == "call_1" and pairing_problems(sent) == []
