"""`session.record_usage` takes what the SDKs hand back: litellm's ModelResponse and Usage, the
openai and anthropic SDKs' responses, usage objects and streaming chunks, and plain dicts.

The openai and litellm objects come from real HTTP calls to the local test server; the anthropic
ones are built with the anthropic SDK's own types from the bodies its API sends."""

from __future__ import annotations

import asyncio
import types
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from llm_server import LLMServer, reply

from ctxrules import Engine
from ctxrules.budget.usage import parse_usage
from ctxrules.errors import UsageError

openai = pytest.importorskip("openai", reason="the openai SDK is in the test extra")
anthropic = pytest.importorskip("anthropic", reason="the anthropic SDK is in the test extra")

TEXT = "The fix is in src/main.c, line 42."
COMPLETION = len(TEXT) // 4  # what tests/llm_server.py reports


@pytest.fixture(autouse=True)
def close_litellms_stray_loop() -> Iterator[None]:
    """litellm's sync call path asks for the thread's event loop (``asyncio.get_event_loop``),
    which makes one in the main thread and never closes it; a later ``asyncio.run`` elsewhere
    in the suite drops it and it is collected unclosed (a ResourceWarning in an unrelated test).
    Close it here, after each test of this module."""
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            loop = asyncio.get_event_loop_policy().get_event_loop()
        except RuntimeError:
            return
    if not loop.is_running() and not loop.is_closed():
        loop.close()
    asyncio.set_event_loop(None)


def session(tmp_path: Path) -> Any:
    return Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o")


def test_openai_sdk_response_usage_and_last_stream_chunk_are_recorded(tmp_path: Path) -> None:
    s = session(tmp_path)
    with LLMServer() as server:
        server.script(reply(TEXT), reply(TEXT))
        client = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        resp = client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
        chunks = list(
            client.chat.completions.create(
                model="gpt-4o",
                messages=[{"role": "user", "content": "hi"}],
                stream=True,
                stream_options={"include_usage": True},
            )
        )
    whole = s.record_usage(resp)
    usage_only = s.record_usage(resp.usage)
    last = s.record_usage(chunks[-1])
    for rec in (whole, usage_only, last):
        assert rec is not None
        assert rec["tokens"]["prompt"] == 10 and rec["tokens"]["completion"] == COMPLETION
        assert rec["usd"]["total"] > 0
    # A chunk before the last one carries no usage: the error says which chunk to record.
    with pytest.raises(UsageError, match="only the stream's last chunk"):
        s.record_usage(chunks[1])
    assert len(s.ledger.own.entries()) == 3


def test_litellm_model_response_usage_and_stream_chunk_are_recorded(tmp_path: Path) -> None:
    from ctxrules.llm import load_litellm, quiet

    litellm = load_litellm()
    s = session(tmp_path)
    with LLMServer() as server, quiet():
        server.script(reply(TEXT), reply(TEXT))
        resp = litellm.completion(
            model="openai/gpt-4o", api_base=server.base_url, api_key="k", messages=[{"role": "user", "content": "hi"}]
        )
        chunks = list(
            litellm.completion(
                model="openai/gpt-4o",
                api_base=server.base_url,
                api_key="k",
                messages=[{"role": "user", "content": "hi"}],
                stream=True,
                stream_options={"include_usage": True},
            )
        )
    assert type(resp).__name__ == "ModelResponse" and type(resp.usage).__name__ == "Usage"
    with_usage = [c for c in chunks if getattr(c, "usage", None) is not None]
    assert with_usage, "litellm passes the final usage chunk through"
    for obj in (resp, resp.usage, with_usage[-1]):
        rec = s.record_usage(obj, model="gpt-4o")
        assert rec is not None and rec["tokens"]["prompt"] == 10 and rec["tokens"]["completion"] == COMPLETION


def test_anthropic_message_usage_and_stream_events_are_recorded(tmp_path: Path) -> None:
    s = session(tmp_path)
    usage = {"input_tokens": 100, "output_tokens": 40, "cache_read_input_tokens": 900, "cache_creation_input_tokens": 0}
    message = anthropic.types.Message.model_validate(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5",
            "content": [{"type": "text", "text": TEXT}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": usage,
        }
    )
    start = anthropic.types.RawMessageStartEvent.model_validate(
        {"type": "message_start", "message": {**message.model_dump(), "usage": {**usage, "output_tokens": 1}}}
    )
    delta = anthropic.types.RawMessageDeltaEvent.model_validate(
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": 40},
        }
    )
    for obj in (message, message.usage):
        rec = s.record_usage(obj, model="claude-sonnet-4-5")
        assert rec is not None
        # Anthropic counts cached tokens apart; ctxrules' prompt includes them.
        assert rec["tokens"] == {
            "prompt": 1000,
            "completion": 40,
            "cached": 900,
            "cache_write": 0,
            "reasoning": 0,
            "citation": 0,
            "total": 1040,
        }
    assert parse_usage(start).prompt == 1000
    assert parse_usage(delta).completion == 40


def test_objects_without_model_dump_are_read_by_attribute(tmp_path: Path) -> None:
    s = session(tmp_path)
    usage = types.SimpleNamespace(
        prompt_tokens=120,
        completion_tokens=30,
        total_tokens=150,
        prompt_tokens_details=types.SimpleNamespace(cached_tokens=100),
    )
    response = types.SimpleNamespace(id="r1", usage=usage)
    for obj in (usage, response):
        rec = s.record_usage(obj)
        assert rec is not None and rec["tokens"]["prompt"] == 120 and rec["tokens"]["cached"] == 100


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("12 tokens", "got a string"),
        (42, "got int"),
        ([1, 2], "got a list"),
        (None, "got null"),
        (object(), "no usage, prompt_tokens or input_tokens attribute"),
        ({"prompt_tokens": -3}, "must be a whole number >= 0"),
        (types.SimpleNamespace(prompt_tokens="many"), "must be a whole number >= 0"),
        ({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 50}}, "exceed the prompt tokens"),
    ],
)
def test_bad_values_are_a_clear_usage_error(tmp_path: Path, value: Any, words: str) -> None:
    s = session(tmp_path)
    with pytest.raises(UsageError, match=words):
        s.record_usage(value)
    assert s.ledger.own.entries() == []


def test_a_broken_sdk_object_is_a_usage_error_naming_it(tmp_path: Path) -> None:
    class Broken:
        def model_dump(self) -> dict[str, Any]:
            raise RuntimeError("serializer blew up")

    with pytest.raises(UsageError, match=r"Broken: model_dump\(\) failed: RuntimeError"):
        session(tmp_path).record_usage(Broken())
