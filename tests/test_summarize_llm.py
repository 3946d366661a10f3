"""The summarizer through litellm against a local OpenAI-compatible server (real HTTP, streaming):
a good summary, invalid JSON, a 500, replies that are valid JSON but hostile (nested deep, lone
surrogates), slow-but-alive and silent streams, the ceiling, a context-length error, the
fallback chain, the auxiliary-ratio guard, the circuit breaker, the ledger's record of each
call, and what the summarizer is sent. Limits are scaled down (inactivity 1 s where it is tested)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_server import (
    LLMServer,
    context_length_error,
    http_error,
    raw,
    reply,
    silent,
    slow_reply,
)
from test_summarize_stage import (
    KEY_VARS,
    alternation_problems,
    chat_from_corpus,
    summary_stage,
    window_for,
)

from ctxrules import Engine
from ctxrules.budget import BudgetExceeded
from ctxrules.messages import injected_kind, injected_meta, message_text
from ctxrules.redaction import default_redactor
from ctxrules.summarize import FIELDS, StreamLimits, stream_completion
from ctxrules.summarize.llm import CallFailed, ensure_litellm

GOAL = "List which of these issues touch migrations, and fix the Django enum serializer first"


def good_summary(**change: Any) -> str:
    data: dict[str, Any] = {name: [] for name in FIELDS}
    data.update(
        {
            "user_goal": GOAL,
            "active_tasks": ["Fix the Django enum serializer"],
            "completed_actions": ["Read the pasted issues: seaborn scales, pytest capfd, sphinx mocks, sympy det"],
            "relevant_files": ["django/db/migrations/serializer.py"],
            "key_facts": ["Migrations serialize Enum defaults by value, which breaks translated values"],
            "pending_user_asks": ["fix the Django enum serializer first"],
            "next_steps": [
                "Patch EnumSerializer to write Status['GOOD']",
                "Run the migrations tests",
            ],
        }
    )
    data.update(change)
    return json.dumps(data)


@pytest.fixture(autouse=True)
def no_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in KEY_VARS:
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with LLMServer() as running:
        yield running


@pytest.fixture(scope="module")
def chat() -> list[dict[str, Any]]:
    return chat_from_corpus()


class Harness:
    """A pack pointing the summarizer at the test server, a session, and prepare()."""

    def __init__(
        self,
        tmp_path: Path,
        server: LLMServer,
        chat: list[dict[str, Any]],
        *,
        budgets: dict[str, Any] | None = None,
        **summarizer: Any,
    ) -> None:
        settings = {
            "api_base": server.base_url,
            # Long enough for a loaded machine (the local server answers at once); the tests of
            # the inactivity limit itself ask for 1 s.
            "inactivity_s": 10,
            "total_s": 20,
            "fallback": "none",
            **summarizer,
        }
        pack = {
            "apiVersion": "ctxrules/v1",
            "kind": "RulePack",
            "metadata": {"name": "llm-test", "version": "1.0.0"},
            "extends": ["builtin:default"],
            "summarizer": settings,
        }
        if budgets is not None:
            pack["budgets"] = budgets
        path = tmp_path / "pack.yaml"
        path.write_text(yaml.safe_dump(pack), encoding="utf-8")
        self.engine = Engine.load(path)
        self.chat = chat
        self.window = window_for(self.engine, chat, 1.1)
        self.session = self.engine.session(tmp_path / "session", model="gpt-4o", window=self.window)
        self.server = server

    def prepare(self, clock: float = 1000.0, variant: int = 0) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        history = self.chat
        if variant:
            # A history that does not extend the last one runs the whole pipeline again (on the
            # same session state), so the stage compacts again.
            history = [
                *history[:-1],
                {**history[-1], "content": f"{history[-1]['content']} (take {variant})"},
            ]
        result = self.session.prepare(history, clock=clock)
        return result.messages, summary_stage(result.report)


def attempts(stage: dict[str, Any]) -> list[str]:
    return [a["detail"] for a in stage["actions"] if a["kind"] == "summarizer"]


def breaker(stage: dict[str, Any], model: str) -> str:
    return next(a["detail"] for a in stage["actions"] if a["kind"] == "breaker" and a["detail"].startswith(model))


def summary_of(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return next(m for m in messages if injected_kind(m) == "summary")


@pytest.mark.corpus
def test_a_good_summary_is_streamed_audited_and_injected(
    tmp_path: Path, server: LLMServer, chat: list[dict[str, Any]]
) -> None:
    server.script(reply(good_summary()))
    h = Harness(tmp_path, server, chat)
    out, stage = h.prepare()
    (request,) = server.requests
    assert request.stream and request.body["model"] == "gpt-4o-mini"  # `lite` for the gpt family
    assert request.body["max_tokens"] == 4096 and request.body["temperature"] == 0
    system, user = request.body["messages"]
    assert all(f'"{name}"' in system["content"] for name in FIELDS)
    assert "USER MESSAGES" in user["content"] and "CONVERSATION" in user["content"]
    summary = summary_of(out)
    assert injected_meta(summary)["source"] == "llm" and injected_meta(summary)["model"] == "gpt-4o-mini"
    text = message_text(summary)
    assert f"User goal: {GOAL}" in text and text.rstrip().endswith("2. Run the migrations tests\n</ctxrules:summary>")
    assert "primary gpt-4o-mini: ok" in attempts(stage)[0]
    assert breaker(stage, "gpt-4o-mini") == "gpt-4o-mini: state=closed failures=0"
    assert not any(a["kind"] == "checkpoint" for a in stage["actions"])
    assert alternation_problems(out) == []


@pytest.mark.corpus
@pytest.mark.parametrize(
    ("behaviour", "outcome", "detail"),
    [
        (
            reply("Here is the summary: the user wants the enum serializer fixed."),
            "invalid",
            "no JSON object",
        ),
        (reply('{"user_goal": "fix it", "constraints": [}'), "invalid", "invalid JSON"),
        (http_error(500), "failed", "InternalServerError"),
        (
            reply(good_summary(user_goal="Deploy the billing service to Kubernetes and rotate its TLS certs")),
            "rejected",
            "not grounded",
        ),
        (
            # Every list field unusable: dropped one by one, nothing is left to keep.
            reply(json.dumps({"user_goal": GOAL, "active_tasks": [{"task": "x"}]})),
            "rejected",
            "empty: no list field",
        ),
    ],
)
def test_a_failed_summary_falls_back_to_the_checkpoint(
    tmp_path: Path,
    server: LLMServer,
    chat: list[dict[str, Any]],
    behaviour: Any,
    outcome: str,
    detail: str,
) -> None:
    server.script(behaviour)
    h = Harness(tmp_path, server, chat)
    out, stage = h.prepare()
    assert len(server.requests) == 1  # no blind retries: the breaker and the fallback handle it
    (attempt,) = attempts(stage)
    assert f"primary gpt-4o-mini: {outcome}" in attempt and detail in attempt
    assert injected_meta(summary_of(out))["source"] == "checkpoint"
    assert breaker(stage, "gpt-4o-mini") == "gpt-4o-mini: state=closed failures=1"
    assert stage["tokens_after"] < stage["tokens_before"]  # the checkpoint still shrinks the context


@pytest.mark.corpus
def test_type_slips_are_put_right_and_a_bad_field_is_dropped_alone(
    tmp_path: Path, server: LLMServer, chat: list[dict[str, Any]]
) -> None:
    data = json.loads(good_summary())
    data["tool_state"] = "tests last run: 2 failed"  # a string where a list is expected
    data["next_steps"] = ["a", "b", "c", "d", "e", "f"]  # over the limit of 5
    data["decisions"] = [{"what": "an object where text is expected"}]
    del data["risks"]
    server.script(reply(json.dumps(data)))
    out, stage = Harness(tmp_path, server, chat).prepare()
    (attempt,) = attempts(stage)
    assert "primary gpt-4o-mini: ok" in attempt
    assert "tool_state: a string, read as a list of 1" in attempt
    assert "next_steps: kept the first 5 of 6 entries" in attempt
    assert "dropped decisions" in attempt and "risks: missing" in attempt
    summary = summary_of(out)
    assert injected_meta(summary)["source"] == "llm"
    text = message_text(summary)
    assert "tests last run: 2 failed" in text and "5. e\n</ctxrules:summary>" in text
    assert "an object where text is expected" not in text


@pytest.mark.corpus
def test_a_slow_but_alive_stream_does_not_time_out(
    tmp_path: Path, server: LLMServer, chat: list[dict[str, Any]]
) -> None:
    text = good_summary()
    # A token every 0.4 s for ~4 s in all, against a 2 s inactivity limit: a loaded machine may
    # stall a gap by over a second and still not reach the limit.
    server.script(slow_reply(text, every_s=0.4, chunk_chars=len(text) // 9 + 1))
    h = Harness(tmp_path, server, chat, inactivity_s=2)
    started = time.monotonic()
    out, stage = h.prepare()
    assert time.monotonic() - started > 3.0  # longer than the inactivity limit, yet alive
    assert injected_meta(summary_of(out))["source"] == "llm", attempts(stage)


@pytest.mark.corpus
@pytest.mark.parametrize("prefix", ["", '{"user_goal": "List which'])
def test_a_silent_stream_times_out_at_the_inactivity_limit(
    tmp_path: Path, server: LLMServer, chat: list[dict[str, Any]], prefix: str
) -> None:
    server.script(silent(prefix=prefix, hold_s=15))
    h = Harness(tmp_path, server, chat, inactivity_s=1)
    started = time.monotonic()
    out, stage = h.prepare()
    assert time.monotonic() - started < 6  # nowhere near the 15 s the server would hold
    (attempt,) = attempts(stage)
    assert "failed" in attempt and "inactivity: no token for 1 s" in attempt
    seconds = float(attempt.split(" after ")[1].split(" s")[0])
    assert 0.9 <= seconds <= 2.5
    assert injected_meta(summary_of(out))["source"] == "checkpoint"


@pytest.mark.corpus
def test_the_total_ceiling_stops_a_stream_that_never_ends(
    tmp_path: Path, server: LLMServer, chat: list[dict[str, Any]]
) -> None:
    text = good_summary()
    server.script(slow_reply(text, every_s=0.25, chunk_chars=20))  # alive, but ~minutes long
    h = Harness(tmp_path, server, chat, inactivity_s=1, total_s=2)
    out, stage = h.prepare()
    (attempt,) = attempts(stage)
    assert "total: the summarization's 2 s ceiling was reached" in attempt
    seconds = float(attempt.split(" after ")[1].split(" s")[0])
    assert 1.9 <= seconds <= 3.5
    assert injected_meta(summary_of(out))["source"] == "checkpoint"


def flood_chunk(i: int) -> bytes:
    """One SSE event of 4 KB of text; no two alike (litellm stops a stream that repeats)."""
    delta = {"content": f"{i:04d}" + "enum serializer migration " * 160}
    event = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    event["choices"] = [{"index": 0, "delta": delta, "finish_reason": None}]
    return b"data: " + json.dumps(event).encode() + b"\n\n"


@pytest.mark.corpus
def test_a_reply_that_ignores_max_tokens_is_cut_off_at_a_size_limit(
    tmp_path: Path, server: LLMServer, chat: list[dict[str, Any]]
) -> None:
    """A server streaming far past ``max_tokens`` as fast as it can: kept to the end of
    ``total_s``, it is hundreds of MB of reply in memory. It fails at once instead."""
    server.script(raw(*(flood_chunk(i) for i in range(64)), content_type="text/event-stream", repeat=True))
    h = Harness(tmp_path, server, chat, total_s=8)
    ensure_litellm()  # its first import (seconds) is no part of what is timed here
    started = time.monotonic()
    out, stage = h.prepare()
    assert time.monotonic() - started < 6
    (attempt,) = attempts(stage)
    assert "failed" in attempt and "too_long: the reply ran past 131072 characters" in attempt
    assert server.requests[0].body["max_tokens"] == 4096  # 4096 tokens x 32 characters
    assert injected_meta(summary_of(out))["source"] == "checkpoint"
    assert breaker(stage, "gpt-4o-mini") == "gpt-4o-mini: state=closed failures=1"


@pytest.mark.corpus
def test_a_compressed_reply_that_inflates_to_gigabytes_is_cut_off_at_a_byte_limit(
    tmp_path: Path, server: LLMServer, chat: list[dict[str, Any]]
) -> None:
    """gzip holding one line of gigabytes (here 256 MiB, in 256 KB): the size limit counts
    parsed text, and no text parses before the line ends, so memory grew to gigabytes while the
    clocks ran. The reply's bytes are counted as they inflate; the call fails past the line
    limit and the checkpoint summarizes."""
    import zlib

    squeeze = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = b" " * (1 << 20)
    bomb = [squeeze.compress(b"data: " + block)] + [squeeze.compress(block) for _ in range(256)] + [squeeze.flush()]
    server.script(raw(*bomb, content_type="text/event-stream", headers={"Content-Encoding": "gzip"}))
    h = Harness(tmp_path, server, chat, inactivity_s=60, total_s=120)
    started = time.monotonic()
    out, stage = h.prepare()
    assert time.monotonic() - started < 30
    (attempt,) = attempts(stage)
    assert "too_long: a line of the stream from 127.0.0.1 ran past 4 MiB" in attempt
    assert injected_meta(summary_of(out))["source"] == "checkpoint"


def test_a_chunk_litellm_cannot_parse_fails_the_call_without_a_traceback_on_stderr(
    server: LLMServer, capfd: pytest.CaptureFixture[str]
) -> None:
    """litellm logs a chunk its parser refuses as an ERROR with the pydantic traceback, on
    stderr through its own handler: ``ctxrules run`` printed it. The failure is the call's."""
    call = {"index": 0, "function": {"name": 5, "arguments": {"x": 1}}}  # a name that is no string
    event = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    event["choices"] = [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]
    server.script(raw(b"data: " + json.dumps(event).encode() + b"\n\n", content_type="text/event-stream"))
    request = {"model": "openai/gpt-4o-mini", "api_base": server.base_url, "api_key": "k", "max_retries": 0}
    with pytest.raises(CallFailed) as failed:
        stream_completion({**request, "messages": [{"role": "user", "content": "x"}]}, StreamLimits(5, 10))
    assert failed.value.kind == "error" and "MidStreamFallbackError" in str(failed.value)
    err = capfd.readouterr().err
    assert "Traceback" not in err and "LiteLLM" not in err, err


@pytest.mark.corpus
def test_a_context_length_error_is_retried_once_with_half_the_input(
    tmp_path: Path, server: LLMServer, chat: list[dict[str, Any]]
) -> None:
    server.script(context_length_error(), reply(good_summary()))
    h = Harness(tmp_path, server, chat)
    out, stage = h.prepare()
    first, second = server.requests
    assert len(second.body["messages"][1]["content"]) < 0.7 * len(first.body["messages"][1]["content"])
    assert "messages omitted to fit" in second.body["messages"][1]["content"]
    assert injected_meta(summary_of(out))["source"] == "llm"
    assert any("context-length error" in w for w in stage["warnings"])


@pytest.mark.corpus
def test_the_fallback_model_summarizes_when_the_light_one_fails(
    tmp_path: Path, server: LLMServer, chat: list[dict[str, Any]]
) -> None:
    server.script(http_error(503, "overloaded"), reply(good_summary()))
    h = Harness(tmp_path, server, chat, fallback="main")
    out, stage = h.prepare()
    assert [r.body["model"] for r in server.requests] == ["gpt-4o-mini", "gpt-4o"]
    assert injected_meta(summary_of(out))["model"] == "gpt-4o"
    assert "primary gpt-4o-mini: failed" in attempts(stage)[0] and "fallback gpt-4o: ok" in attempts(stage)[1]


@pytest.mark.corpus
def test_a_too_small_summarizer_yields_to_the_main_model(
    tmp_path: Path, server: LLMServer, chat: list[dict[str, Any]]
) -> None:
    server.script(reply(good_summary()))
    h = Harness(tmp_path, server, chat, fallback="main", window=2048)
    out, stage = h.prepare()
    assert [r.body["model"] for r in server.requests] == ["gpt-4o"]
    assert any("gpt-4o-mini (window 2048) is too small" in w for w in stage["warnings"])
    assert "skipped (window too small)" in attempts(stage)[0]
    assert injected_meta(summary_of(out))["source"] == "llm"


@pytest.mark.corpus
def test_a_too_small_summarizer_reads_a_trimmed_input(
    tmp_path: Path, server: LLMServer, chat: list[dict[str, Any]]
) -> None:
    server.script(reply(good_summary()))
    h = Harness(tmp_path, server, chat, on_small_window="trim", window=9000, max_output_tokens=1024)
    out, stage = h.prepare()
    (request,) = server.requests
    assert "messages omitted to fit the summarizer's window" in request.body["messages"][1]["content"]
    assert any("summarizer input trimmed to fit gpt-4o-mini's window (9000)" in w for w in stage["warnings"])
    assert injected_meta(summary_of(out))["source"] == "llm"
    assert request.body["max_tokens"] == 1024


@pytest.mark.corpus
def test_the_breaker_opens_lets_one_probe_through_and_closes(
    tmp_path: Path, server: LLMServer, chat: list[dict[str, Any]]
) -> None:
    h = Harness(tmp_path, server, chat, breaker={"failures": 2, "cooldown_s": 100})
    server.script(http_error(500), http_error(500))
    _, stage = h.prepare(clock=1000, variant=1)
    assert breaker(stage, "gpt-4o-mini") == "gpt-4o-mini: state=closed failures=1"
    _, stage = h.prepare(clock=1001, variant=2)
    assert breaker(stage, "gpt-4o-mini") == "gpt-4o-mini: state=open failures=2 retry_at=1101"
    # Open: no call at all during the cool-down; the checkpoint summarizes.
    out, stage = h.prepare(clock=1050, variant=3)
    assert len(server.requests) == 2
    assert "skipped (circuit breaker open" in attempts(stage)[0]
    assert injected_meta(summary_of(out))["source"] == "checkpoint"
    # After the cool-down: one half-open probe; it fails, the breaker opens again.
    server.script(http_error(500))
    _, stage = h.prepare(clock=1102, variant=4)
    assert len(server.requests) == 3
    assert breaker(stage, "gpt-4o-mini") == "gpt-4o-mini: state=open failures=3 retry_at=1202"
    # The next probe succeeds: closed, count reset.
    server.script(reply(good_summary()))
    out, stage = h.prepare(clock=1203, variant=5)
    assert len(server.requests) == 4
    assert breaker(stage, "gpt-4o-mini") == "gpt-4o-mini: state=closed failures=0"
    assert injected_meta(summary_of(out))["source"] == "llm"
    state = json.loads((tmp_path / "session" / "state.json").read_text())
    assert state["stages"]["summary"]["breakers"]["gpt-4o-mini"] == {
        "state": "closed",
        "failures": 0,
    }


def test_health_is_red_while_the_breaker_is_open_even_on_turns_that_do_not_summarize(
    tmp_path: Path, server: LLMServer, chat: list[dict[str, Any]]
) -> None:
    h = Harness(tmp_path, server, chat, breaker={"failures": 1, "cooldown_s": 100})
    server.script(http_error(500))
    first = h.session.prepare(h.chat, clock=1000)
    assert first.report["health"]["state"] == "red"
    assert "the summarizer's circuit breaker is open (summary/gpt-4o-mini)" in first.report["health"]["reasons"]
    # The next turn only appends and fits: no summary runs, and the breaker is still open.
    grown = [*h.chat, {"role": "user", "content": "and now?"}]
    second = h.session.prepare(grown, clock=1010)
    assert not summary_stage(second.report)["ran"]
    assert second.report["health"]["state"] == "red"
    # A successful probe after the cool-down closes it: health follows.
    server.script(reply(good_summary()))
    third = h.prepare(clock=1200, variant=1)
    assert breaker(third[1], "gpt-4o-mini") == "gpt-4o-mini: state=closed failures=0"
    fourth = h.session.prepare(
        [
            *h.chat[:-1],
            {**h.chat[-1], "content": f"{h.chat[-1]['content']} (take 1)"},
            {"role": "user", "content": "ok"},
        ],
        clock=1201,
    )
    assert not any("circuit breaker" in r for r in fourth.report["health"]["reasons"])


@pytest.mark.corpus
def test_the_summarizer_is_sent_no_secrets_and_what_it_echoes_is_masked(
    tmp_path: Path, server: LLMServer, chat: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    secrets = ["sk-proj-4fGh7Jk2Lm9Np3Qr6St8Uv1Wx5Yz0AbCdEfGhIjKl", "jane.doe@acme-corp.com"]
    planted = [dict(m) for m in chat]
    planted[2] = {
        **planted[2],
        "content": f"{planted[2]['content']}\nMy key: {secrets[0]}, mail {secrets[1]}",
    }
    # A model that copies a secret it was shown (or knew) into the summary.
    server.script(reply(good_summary(key_facts=[f"The user's address is {secrets[1]}"])))
    monkeypatch.setenv("CTXRULES_TEST_KEY", "sk-test-123")
    h = Harness(tmp_path, server, planted, api_key_env="CTXRULES_TEST_KEY")
    h.chat = planted
    out, _stage = h.prepare()
    (request,) = server.requests
    assert request.headers.get("authorization") == "Bearer sk-test-123"
    body = json.dumps(request.body)
    assert all(secret not in body for secret in secrets)
    text = message_text(summary_of(out))
    assert all(secret not in text for secret in secrets) and "[REDACTED:email]" in text
    assert default_redactor().findings(text) == []
    state_text = (tmp_path / "session" / "state.json").read_text()
    assert all(secret not in state_text for secret in secrets)


# Valid JSON that Python cannot walk: nested past the recursion limit (the parser's), and nested
# less deep than that but deep enough that redaction, which recurses, would hit it.
NESTED_2000 = '{"user_goal": "x", "key_facts": ' + "[" * 2000 + "]" * 2000 + "}"
NESTED_600 = good_summary(key_facts=["NESTED"]).replace('"NESTED"', "[" * 600 + "]" * 600)


@pytest.mark.corpus
@pytest.mark.parametrize("text", [NESTED_2000, NESTED_600], ids=["nested-2000", "redaction-would-recurse"])
def test_a_reply_nested_deep_is_invalid_and_the_checkpoint_summarizes(
    tmp_path: Path, server: LLMServer, chat: list[dict[str, Any]], text: str
) -> None:
    h = Harness(tmp_path, server, chat)
    for turn in (1, 2):  # the second with the stage's saved state, which no reply may reset
        server.script(reply(text, chunk_chars=4096))
        out, stage = h.prepare(clock=1000 + turn, variant=turn)
        assert len(server.requests) == turn  # one call per attempt: the stage is not run again
        assert "error" not in stage
        (attempt,) = attempts(stage)
        assert "primary gpt-4o-mini: invalid" in attempt and "nested deeper than 8 levels" in attempt
        assert breaker(stage, "gpt-4o-mini") == f"gpt-4o-mini: state=closed failures={turn}"
        assert injected_meta(summary_of(out))["source"] == "checkpoint"
        assert stage["tokens_after"] < stage["tokens_before"]


@pytest.mark.corpus
@pytest.mark.parametrize("text", [NESTED_2000, NESTED_600], ids=["nested-2000", "redaction-would-recurse"])
def test_a_reply_nested_deep_moves_on_to_the_next_model(
    tmp_path: Path, server: LLMServer, chat: list[dict[str, Any]], text: str
) -> None:
    server.script(reply(text, chunk_chars=4096), reply(good_summary()))
    h = Harness(tmp_path, server, chat, fallback="main")
    out, stage = h.prepare()
    assert [r.body["model"] for r in server.requests] == ["gpt-4o-mini", "gpt-4o"]
    assert "error" not in stage
    first, second = attempts(stage)
    assert "primary gpt-4o-mini: invalid" in first and "fallback gpt-4o: ok" in second
    assert breaker(stage, "gpt-4o-mini") == "gpt-4o-mini: state=closed failures=1"
    assert injected_meta(summary_of(out))["model"] == "gpt-4o"


@pytest.mark.corpus
def test_a_lone_surrogate_in_a_reply_is_replaced_as_in_messages(
    tmp_path: Path, server: LLMServer, chat: list[dict[str, Any]]
) -> None:
    # "\ud800" is valid JSON text but no UTF-8: the summary's id, the state and the output
    # encode it. Replaced with U+FFFD, as message validation does, and noted.
    text = good_summary(key_facts=["LONE"]).replace('"LONE"', '"Enum defaults \\ud800 by value"')
    h = Harness(tmp_path, server, chat)
    for turn in (1, 2):
        server.script(reply(text))
        out, stage = h.prepare(clock=1000 + turn, variant=turn)
        assert len(server.requests) == turn and "error" not in stage
        (attempt,) = attempts(stage)
        assert "primary gpt-4o-mini: ok" in attempt
        assert "a lone surrogate in /key_facts/0 was replaced with U+FFFD" in attempt
        summary = summary_of(out)
        assert injected_meta(summary)["source"] == "llm"
        assert "Enum defaults \ufffd by value" in message_text(summary)
        message_text(summary).encode("utf-8")
    state = json.loads((tmp_path / "session" / "state.json").read_text(encoding="utf-8"))
    (kept,) = [f for f in state["stages"]["summary"]["summaries"][-1]["summary"]["key_facts"] if "Enum defaults" in f]
    assert kept == "Enum defaults \ufffd by value"


def ledger_records(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "session" / "ledger.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.corpus
def test_each_summarizer_call_is_recorded_in_the_ledger_and_counts_in_the_budget(
    tmp_path: Path, server: LLMServer, chat: list[dict[str, Any]]
) -> None:
    text = good_summary()
    # The primary fails (records nothing: a failed call), the fallback delivers with usage.
    server.script(http_error(500), reply(text))
    h = Harness(tmp_path, server, chat, fallback="main", budgets={"session": {"tokens": 100}})
    out, stage = h.prepare()
    assert all(r.body["stream_options"] == {"include_usage": True} for r in server.requests)
    assert "primary gpt-4o-mini: failed" in attempts(stage)[0]
    assert injected_meta(summary_of(out))["model"] == "gpt-4o"
    (record,) = ledger_records(tmp_path)
    assert record["source"] == "summarizer" and record["model"] == "openai/gpt-4o"
    completion = len(text) // 4  # what the test server reports
    assert record["tokens"]["prompt"] == 10 and record["tokens"]["completion"] == completion
    assert record["usd"]["total"] > 0
    # The budget sees it at the next check: the summary that spent it is kept, the next turn refused.
    assert h.session.ledger.status().level.label == "exceeded"
    with pytest.raises(BudgetExceeded):
        h.prepare(clock=1001, variant=1)
    assert len(server.requests) == 2


@pytest.mark.corpus
def test_the_call_of_a_refused_reply_is_recorded_too(
    tmp_path: Path, server: LLMServer, chat: list[dict[str, Any]]
) -> None:
    # The tokens of a reply that is refused (invalid, rejected) were spent all the same.
    text = good_summary()
    server.script(reply(NESTED_2000, chunk_chars=4096), reply(text))
    h = Harness(tmp_path, server, chat, fallback="main")
    out, stage = h.prepare()
    assert injected_meta(summary_of(out))["model"] == "gpt-4o"
    first, second = ledger_records(tmp_path)
    assert (first["model"], first["tokens"]["completion"]) == ("openai/gpt-4o-mini", len(NESTED_2000) // 4)
    assert (second["model"], second["tokens"]["completion"]) == ("openai/gpt-4o", len(text) // 4)
    assert {first["source"], second["source"]} == {"summarizer"}
    assert not any("not recorded" in w for w in stage.get("warnings", []))


@pytest.mark.corpus
def test_usage_the_ledger_refuses_is_a_warning_not_a_lost_summary(
    tmp_path: Path, server: LLMServer, chat: list[dict[str, Any]]
) -> None:
    # Reasoning above completion: the ledger refuses the counts (UsageError), the summary stays.
    odd = {
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "total_tokens": 15,
        "completion_tokens_details": {"reasoning_tokens": 50},
    }
    server.script(reply(good_summary(), usage=odd))
    h = Harness(tmp_path, server, chat)
    out, stage = h.prepare()
    assert len(server.requests) == 1 and "error" not in stage
    assert injected_meta(summary_of(out))["source"] == "llm"
    assert "primary gpt-4o-mini: ok" in attempts(stage)[0]
    assert ledger_records(tmp_path) == []
    (warning,) = [w for w in stage.get("warnings", []) if "not recorded" in w]
    assert warning.startswith("the usage of gpt-4o-mini's summarizer call was not recorded: UsageError: ")
