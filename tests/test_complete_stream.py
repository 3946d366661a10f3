"""`session.acomplete` and `stream=True` against the local HTTP server (real HTTP, SSE): the
same overflow recovery before the first chunk, an error after it raised, usage recorded from the
final usage chunk or counted when the provider sends none."""

from __future__ import annotations

import asyncio
import gc
import json
import signal
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from invariants import pairing_problems
from llm_server import LLMServer, context_length_error, raw, reply, slow_reply, stream_error

from ctxrules import Engine
from ctxrules.runtime import streaming
from ctxrules.runtime.overflow import CompletionFailed
from ctxrules.threads import STOP_SIGNALS

TEXT = "Done: the fix is in src/parser.c, the match arm now binds the tuple."
MODEL = "openai/gpt-4o"


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


def long_history(steps: int = 20) -> list[dict[str, Any]]:
    """A real-looking agent history of about 40K tokens: each step a tool call and its output."""
    out: list[dict[str, Any]] = [
        {"role": "system", "content": "You fix bugs in a C compiler."},
        {"role": "user", "content": "The parser crashes on nested match arms; fix it."},
    ]
    for i in range(steps):
        out.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{i}",
                        "type": "function",
                        "function": {"name": "bash", "arguments": json.dumps({"cmd": f"grep -rn match src/{i}.c"})},
                    }
                ],
            }
        )
        out.append(
            {
                "role": "tool",
                "tool_call_id": f"call_{i}",
                "content": "\n".join(
                    f"src/{i}.c:{n}: case MATCH_ARM_{n}: bind(tuple_{n}, pattern);" for n in range(180)
                ),
            }
        )
    out.append({"role": "user", "content": "Now apply the fix."})
    return out


@pytest.fixture
def session(tmp_path: Path) -> Any:
    return Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o", window=128000)


def run(coro: Any) -> Any:
    """Run ``coro`` on a loop of its own. Not ``asyncio.run``: that unsets the thread's current
    loop, and litellm's sync streaming path leaves one there (``get_event_loop``), which would
    then be collected unclosed in the middle of another test."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def content_of(chunks: list[Any]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def ledger_lines(session: Any) -> list[dict[str, Any]]:
    path = session.path / "ledger.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def test_a_stream_yields_the_chunks_and_records_the_final_usage_chunk(session: Any) -> None:
    with LLMServer() as server:
        server.script(reply(TEXT, chunk_chars=5))
        stream = session.complete(
            [{"role": "user", "content": "fix it"}], model=MODEL, stream=True, api_base=server.base_url, api_key="k"
        )
        chunks = list(stream)
        (request,) = server.requests
    assert content_of(chunks) == TEXT and stream.text == TEXT and not stream.recovered
    assert request.stream and request.body["stream_options"] == {"include_usage": True}
    assert not stream.usage_counted and stream.record is not None
    assert stream.record["tokens"]["prompt"] == 10 and stream.record["tokens"]["completion"] == len(TEXT) // 4
    assert [rec["source"] for rec in ledger_lines(session)] == ["stream"]


# litellm reads a deprecated pydantic attribute of a chunk with no choices; the sync read
# silences litellm's warnings (llm.quiet), the async one cannot (the filters are global). Not ours.
@pytest.mark.filterwarnings("ignore:Accessing the '.*' attribute on the instance is deprecated:DeprecationWarning")
def test_the_usage_chunk_ctxrules_asked_for_is_kept_from_the_caller(session: Any) -> None:
    """OpenAI sends the usage ``include_usage`` asks for in a chunk with no choices: the loop
    the docs show (``chunk.choices[0].delta``) must not meet the one ctxrules asked for; a caller
    who sets ``stream_options`` gets every chunk, as from litellm."""
    history = [{"role": "user", "content": "fix it"}]
    with LLMServer() as server:
        server.script(reply(TEXT, chunk_chars=5, usage_apart=True))
        with session.complete(history, model=MODEL, stream=True, api_base=server.base_url, api_key="k") as stream:
            printed = "".join(chunk.choices[0].delta.content or "" for chunk in stream)
        server.script(reply(TEXT, chunk_chars=5, usage_apart=True))
        asked = session.complete(
            history,
            model=MODEL,
            stream=True,
            api_base=server.base_url,
            api_key="k",
            stream_options={"include_usage": True},
        )
        chunks = list(asked)

        async def main() -> str:
            server.script(reply(TEXT, chunk_chars=5, usage_apart=True))
            astream = await session.acomplete(history, model=MODEL, stream=True, api_base=server.base_url, api_key="k")
            return "".join([chunk.choices[0].delta.content or "" async for chunk in astream])

        async_printed = run(main())
    assert printed == TEXT == async_printed and stream.record is not None and not stream.usage_counted
    assert stream.record["tokens"]["completion"] == len(TEXT) // 4
    assert content_of(chunks) == TEXT and not chunks[-1].choices and chunks[-1].usage.completion_tokens > 0
    assert [rec["source"] for rec in ledger_lines(session)] == ["stream"] * 3


def test_an_overflow_before_the_first_chunk_is_recovered(session: Any) -> None:
    history = long_history()
    with LLMServer() as server:
        server.script(context_length_error(limit=12000), reply(TEXT))
        stream = session.complete(
            history, model=MODEL, stream=True, api_base=server.base_url, api_key="k", num_retries=0
        )
        chunks = list(stream)
        first, second = server.requests
    assert content_of(chunks) == TEXT and stream.recovered
    assert stream.attempts[0]["recovery"]["window"] == 12000
    assert stream.attempts[0]["recovery"]["tokens_after"] <= 12000 and stream.attempts[1]["ok"]
    assert len(json.dumps(second.body["messages"])) < len(json.dumps(first.body["messages"]))
    assert pairing_problems(second.body["messages"]) == [] and second.stream
    assert len(ledger_lines(session)) == 1  # the failed attempt records nothing


def test_an_error_after_the_first_chunk_is_raised_not_retried(session: Any) -> None:
    with LLMServer() as server:
        server.script(
            stream_error(
                "The fix", "This model's maximum context length is 100 tokens", code="context_length_exceeded"
            ),
            reply(TEXT),
        )
        stream = session.complete(
            [{"role": "user", "content": "fix it"}],
            model=MODEL,
            stream=True,
            api_base=server.base_url,
            api_key="k",
            num_retries=0,
        )
        seen: list[Any] = []
        with pytest.raises(CompletionFailed, match=r"model stream failed after \d+ chunk"):
            for chunk in stream:
                seen.append(chunk)
        assert len(server.requests) == 1 and server.pending == 1
    assert "The fix" in content_of(seen)
    assert ledger_lines(session) == []  # a failed call records nothing


def test_a_response_litellm_cannot_convert_fails_without_a_traceback_in_the_message(session: Any) -> None:
    """litellm puts the Python traceback of its conversion failure into its message (here: a
    usage of fractional tokens); the error says what failed, not where in litellm."""
    usage = {"prompt_tokens": 10.5, "completion_tokens": 5.5, "total_tokens": 16}
    with LLMServer() as server:
        server.script(reply(TEXT, usage=usage))
        with pytest.raises(CompletionFailed, match=r"^model call failed: InternalServerError") as failed:
            session.complete(
                [{"role": "user", "content": "fix it"}],
                model=MODEL,
                api_base=server.base_url,
                api_key="k",
                max_retries=0,
            )
    message = str(failed.value)
    assert "Invalid response object" in message
    assert "Traceback" not in message and "File " not in message and "\n" not in message


def test_usage_is_counted_when_the_provider_sends_none(session: Any) -> None:
    with LLMServer() as server:
        server.script(reply(TEXT, usage=False), reply(TEXT, usage=False))
        # Asked for usage, the provider sends none: litellm counts it into a final usage chunk.
        by_litellm = session.complete(
            [{"role": "user", "content": "fix it"}], model=MODEL, stream=True, api_base=server.base_url, api_key="k"
        )
        list(by_litellm)
        # Not asked (the caller's stream_options win): no usage chunk at all; ctxrules counts.
        by_us = session.complete(
            [{"role": "user", "content": "fix it"}],
            model=MODEL,
            stream=True,
            api_base=server.base_url,
            api_key="k",
            stream_options={"include_usage": False},
        )
        list(by_us)
        sent = server.requests[1].body["messages"]
        assert "usage" not in json.dumps(server.requests[1].body.get("stream_options") or {}).replace(
            '"include_usage": false', ""
        )
    assert not by_litellm.usage_counted and by_litellm.record is not None
    assert by_litellm.record["tokens"]["completion"] > 0
    assert by_us.usage_counted and by_us.record is not None
    assert by_us.record["tokens"]["completion"] == session.counter.count_text(TEXT)
    assert by_us.record["tokens"]["prompt"] == session.counter.count_messages(sent, [])
    assert [rec["source"] for rec in ledger_lines(session)] == ["stream", "stream-counted"]


def test_a_stream_closed_early_records_what_it_received(session: Any) -> None:
    with LLMServer() as server:
        server.script(reply(TEXT * 20, chunk_chars=4))
        with session.complete(
            [{"role": "user", "content": "fix it"}], model=MODEL, stream=True, api_base=server.base_url, api_key="k"
        ) as stream:
            for n, _ in enumerate(stream):
                if n == 3:
                    break
    assert stream.finished and stream.usage_counted and stream.record is not None
    assert 0 < stream.record["tokens"]["completion"] < session.counter.count_text(TEXT * 20)


def test_acomplete_recovers_an_overflow_and_records_usage(session: Any) -> None:
    history = long_history()

    async def main() -> Any:
        with LLMServer() as server:
            server.script(context_length_error(limit=12000), reply(TEXT))
            result = await session.acomplete(history, model=MODEL, api_base=server.base_url, api_key="k", num_retries=0)
            return result, server.requests

    result, requests = run(main())
    assert result.recovered and result.response.choices[0].message.content == TEXT and len(requests) == 2
    assert result.attempts[0]["recovery"]["tokens_after"] <= 12000
    assert [rec["source"] for rec in ledger_lines(session)] == ["api"]


def test_acomplete_streams_with_the_same_recovery_and_usage(session: Any) -> None:
    history = long_history()

    async def main() -> tuple[Any, list[Any], list[Any]]:
        with LLMServer() as server:
            server.script(
                context_length_error(limit=12000),
                reply(TEXT, chunk_chars=6),
                stream_error("partial", "maximum context length is 10 tokens", code="context_length_exceeded"),
            )
            stream = await session.acomplete(
                history, model=MODEL, stream=True, api_base=server.base_url, api_key="k", num_retries=0
            )
            chunks = [c async for c in stream]
            broken = await session.acomplete(
                [{"role": "user", "content": "again"}],
                model=MODEL,
                stream=True,
                api_base=server.base_url,
                api_key="k",
                num_retries=0,
            )
            with pytest.raises(CompletionFailed, match="model stream failed after"):
                async for _ in broken:
                    pass
            return stream, chunks, server.requests

    stream, chunks, requests = run(main())
    assert content_of(chunks) == TEXT and stream.recovered and len(requests) == 3
    assert stream.record is not None and stream.record["tokens"]["completion"] == len(TEXT) // 4
    assert [rec["source"] for rec in ledger_lines(session)] == ["stream"]


@pytest.mark.parametrize("stream", [False, True])
def test_usage_the_ledger_refuses_never_costs_the_reply(session: Any, stream: bool) -> None:
    """A provider billing reasoning apart reports reasoning tokens above the completion tokens:
    usage the ledger refuses. The reply (paid for) is returned all the same, the call's tokens are
    counted into the ledger instead, and the attempt says why."""
    completion = len(TEXT) // 4
    odd = {"prompt_tokens": 10, "completion_tokens": completion, "total_tokens": 10 + completion,
           "completion_tokens_details": {"reasoning_tokens": 500}}  # fmt: skip
    with LLMServer() as server:
        server.script(reply(TEXT, chunk_chars=5, usage=odd))
        done = session.complete(
            [{"role": "user", "content": "fix it"}], model=MODEL, stream=stream, api_base=server.base_url, api_key="k"
        )
        text = content_of(list(done)) if stream else done.response.choices[0].message.content
        assert len(server.requests) == 1
    assert text == TEXT
    assert "reasoning tokens (500) exceed" in done.attempts[-1]["usage_refused"]
    (record,) = ledger_lines(session)
    assert record["source"] in ("counted", "stream-counted") and record["tokens"]["completion"] > 0


def test_a_stream_dropped_without_closing_records_what_it_received(session: Any) -> None:
    """A ``break`` with neither ``close()`` nor ``with``: the provider billed the call all the
    same, so the ledger gets what was received when the stream is collected (from a thread of
    its own, which the test waits for)."""
    with LLMServer() as server:
        server.script(reply(TEXT * 20, chunk_chars=4))
        stream = session.complete(
            [{"role": "user", "content": "fix it"}], model=MODEL, stream=True, api_base=server.base_url, api_key="k"
        )
        for n, _ in enumerate(stream):
            if n == 3:
                break
        del stream
        gc.collect()
        for worker in [t for t in threading.enumerate() if t.name == "ctxrules-stream-usage"]:
            worker.join(10)
    (record,) = ledger_lines(session)
    assert record["source"] == "stream-counted"
    assert 0 < record["tokens"]["completion"] < session.counter.count_text(TEXT * 20)


def test_a_dropped_streams_usage_thread_blocks_stop_signals_and_is_waited_for(
    session: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The thread that records a dropped stream's usage is one of ctxrules' helper threads: it
    leaves Ctrl-C and SIGTERM to the main thread (or a signal could land in it while the main
    thread waits in a read, and nothing would wake that), and it is not a daemon, so the
    process does not exit before the paid usage is written."""
    seen: list[tuple[set[int], bool]] = []
    original = streaming._StreamState._finish_dropped

    def spy(self: Any) -> None:
        seen.append((set(signal.pthread_sigmask(signal.SIG_BLOCK, [])), threading.current_thread().daemon))
        original(self)

    monkeypatch.setattr(streaming._StreamState, "_finish_dropped", spy)
    with LLMServer() as server:
        server.script(reply(TEXT * 20, chunk_chars=4))
        stream = session.complete(
            [{"role": "user", "content": "fix it"}], model=MODEL, stream=True, api_base=server.base_url, api_key="k"
        )
        next(iter(stream))
        del stream
        gc.collect()
        for worker in [t for t in threading.enumerate() if t.name == "ctxrules-stream-usage"]:
            worker.join(10)
    ((mask, daemon),) = seen
    assert mask >= STOP_SIGNALS
    assert daemon is False
    assert len(ledger_lines(session)) == 1


def test_readers_in_several_threads_take_turns_on_one_stream(session: Any) -> None:
    """A slow stream read by four threads: each chunk reaches one of them, none sees the
    provider's generator refuse a second reader, and the usage is recorded once."""
    got: list[Any] = []
    errors: list[BaseException] = []
    with LLMServer() as server:
        server.script(slow_reply(TEXT, every_s=0.01, chunk_chars=2))
        stream = session.complete(
            [{"role": "user", "content": "fix it"}], model=MODEL, stream=True, api_base=server.base_url, api_key="k"
        )

        def read() -> None:
            try:
                got.extend(stream)
            except BaseException as exc:  # the test reports it
                errors.append(exc)

        readers = [threading.Thread(target=read) for _ in range(4)]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join(30)
    assert errors == []
    # Every chunk reached one reader, but the usage-only one ctxrules asked for (kept back).
    assert len(got) == stream.chunks - stream.withheld and stream.withheld <= 1 and stream.text == TEXT
    assert [rec["source"] for rec in ledger_lines(session)] == ["stream"]


def test_a_closed_stream_yields_nothing_more(session: Any) -> None:
    """Closed before reading: its usage is recorded (nothing received), and iterating it after
    that yields no chunk (which the record would not count)."""
    with LLMServer() as server:
        server.script(reply(TEXT, chunk_chars=4))
        stream = session.complete(
            [{"role": "user", "content": "fix it"}], model=MODEL, stream=True, api_base=server.base_url, api_key="k"
        )
        stream.close()
        assert list(stream) == []
    assert stream.text == "" and [rec["source"] for rec in ledger_lines(session)] == ["stream-counted"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_ledger_that_cannot_be_written_never_costs_the_reply(session: Any, stream: bool) -> None:
    """A file where the state root's ``ledger/`` folder belongs: the ledger write is refused
    (nothing recorded). The call was paid for: its reply is returned, the attempt says why."""
    (session.path.parent / "ledger").write_text("not a folder")
    with LLMServer() as server:
        server.script(reply(TEXT, chunk_chars=5))
        done = session.complete(
            [{"role": "user", "content": "fix it"}], model=MODEL, stream=stream, api_base=server.base_url, api_key="k"
        )
        text = content_of(list(done)) if stream else done.response.choices[0].message.content
    assert text == TEXT
    assert "is not a directory" in done.attempts[-1]["usage_error"]
    assert ledger_lines(session) == []


@pytest.mark.parametrize("usage", ["", ', "usage": null', ', "usage": {"prompt_tokens": 0, "completion_tokens": 0}'])
def test_a_reply_without_usage_is_counted_not_recorded_as_free(session: Any, usage: str) -> None:
    """A provider that sends no usage with a plain (not streamed) reply: litellm fills in zero
    tokens, which would hide a billed call from every budget. The call is counted with the
    session's tokenizer instead, as a stream without a usage chunk is."""
    body = {
        "id": "c1",
        "object": "chat.completion",
        "created": 1,
        "model": "test-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": TEXT}, "finish_reason": "stop"}],
    }
    with LLMServer() as server:
        server.script(raw(json.dumps(body)[:-1].encode() + usage.encode() + b"}"))
        done = session.complete(
            [{"role": "user", "content": "fix it"}], model=MODEL, api_base=server.base_url, api_key="k"
        )
        (request,) = server.requests
    assert done.response.choices[0].message.content == TEXT and done.attempts[-1]["usage_counted"]
    (record,) = ledger_lines(session)
    assert record["source"] == "counted"
    assert record["tokens"]["completion"] == session.counter.count_text(TEXT)
    assert record["tokens"]["prompt"] == session.counter.count_messages(request.body["messages"], [])


def test_tasks_reading_one_async_stream_take_turns(session: Any) -> None:
    """Three tasks on one slow async stream: each chunk reaches one of them, none sees the
    provider's async generator refuse a second reader, and the usage is recorded once."""

    async def main() -> tuple[Any, list[Any]]:
        got: list[Any] = []

        with LLMServer() as server:
            server.script(slow_reply(TEXT, every_s=0.01, chunk_chars=2))
            stream = await session.acomplete(
                [{"role": "user", "content": "fix it"}], model=MODEL, stream=True, api_base=server.base_url, api_key="k"
            )

            async def read() -> None:
                async for chunk in stream:
                    got.append(chunk)

            await asyncio.gather(read(), read(), read())
        return stream, got

    stream, got = run(main())
    # Every chunk reached one reader, but the usage-only one ctxrules asked for (kept back).
    assert len(got) == stream.chunks - stream.withheld and stream.withheld <= 1 and stream.text == TEXT
    assert [rec["source"] for rec in ledger_lines(session)] == ["stream"]


def _one_chunk_then_keep_alive() -> Any:
    """An event stream with one content chunk, then only keep-alive comments, for a minute."""
    event = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    event["choices"] = [{"index": 0, "delta": {"role": "assistant", "content": "Working"}, "finish_reason": None}]
    first = b"data: " + json.dumps(event).encode() + b"\n\n"
    return raw(first, *([b": keep-alive\n\n"] * 300), content_type="text/event-stream", interval_s=0.2)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_body_trickled_for_ever_ends_at_the_callers_timeout(session: Any, mode: str) -> None:
    """A server that sends a space every 0.2 s and never a whole answer: ``timeout=`` bounds
    each read, so ``complete(timeout=1)`` waited for as long as the server liked. The caller's
    timeout bounds the whole answer."""
    import time

    with LLMServer() as server:
        server.script(*[raw(b" ", interval_s=0.2, repeat=True)] * 3)
        kwargs = {"model": MODEL, "api_base": server.base_url, "api_key": "k", "timeout": 1, "num_retries": 0}
        started = time.monotonic()
        with pytest.raises(CompletionFailed) as failed:
            if mode == "sync":
                session.complete([{"role": "user", "content": "fix it"}], **kwargs)
            else:
                run(session.acomplete([{"role": "user", "content": "fix it"}], **kwargs))
        took = time.monotonic() - started
    assert took < 20, took  # the server would trickle for a minute
    assert "timeout" in str(failed.value).lower() or "timed out" in str(failed.value).lower(), failed.value
    assert ledger_lines(session) == []


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_stream_of_keep_alives_ends_at_the_callers_timeout_from_the_last_chunk(session: Any, mode: str) -> None:
    """One chunk, then a keep-alive comment every 0.2 s: no read ever timed out, and the caller
    iterating the stream waited for a minute. With ``timeout=1`` the wait for the next chunk
    ends after about a second, as an error after the first chunk."""
    import time

    with LLMServer() as server:
        server.script(_one_chunk_then_keep_alive())
        kwargs = {"model": MODEL, "api_base": server.base_url, "api_key": "k", "timeout": 1, "num_retries": 0}
        started = time.monotonic()
        got: list[Any] = []
        with pytest.raises(CompletionFailed):
            if mode == "sync":
                for chunk in session.complete([{"role": "user", "content": "fix it"}], stream=True, **kwargs):
                    got.append(chunk)
            else:

                async def read() -> None:
                    stream = await session.acomplete([{"role": "user", "content": "fix it"}], stream=True, **kwargs)
                    async for chunk in stream:
                        got.append(chunk)

                run(read())
        took = time.monotonic() - started
    assert content_of(got) == "Working"
    assert took < 20, took


def test_a_stream_slower_than_the_timeout_in_all_but_quicker_per_chunk_is_read_whole(session: Any) -> None:
    """The timeout runs from chunk to chunk, not over the whole stream: a reply that takes
    three times the timeout in all, a chunk every fifth of it, is read to its end."""
    with LLMServer() as server:
        server.script(slow_reply(TEXT, every_s=0.2, chunk_chars=5))  # ~14 chunks, ~3 s in all
        stream = session.complete(
            [{"role": "user", "content": "fix it"}],
            model=MODEL,
            stream=True,
            api_base=server.base_url,
            api_key="k",
            timeout=1,
        )
        assert content_of(list(stream)) == TEXT
