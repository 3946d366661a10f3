"""Byte limits on the replies to ctxrules' own model calls (ctxrules.reply_limits), through litellm
against a local server (real HTTP): one huge line, a gzip bomb, compressed replies that are fine,
an encoding ctxrules does not read, and the caller's own calls left as they were."""

from __future__ import annotations

import gzip
import json
import threading
import time
import tracemalloc
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
from llm_server import LLMServer, raw

from ctxrules.llm import call_within, load_litellm
from ctxrules.reply_limits import MAX_BODY_BYTES, MAX_LINE_BYTES, ReplyRefused
from ctxrules.summarize import StreamLimits, stream_completion
from ctxrules.summarize.llm import CallFailed

MiB = 1 << 20


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with LLMServer() as running:
        yield running


def request(server: LLMServer) -> dict[str, Any]:
    return {
        "model": "openai/gpt-4o-mini",
        "api_base": server.base_url,
        "api_key": "k",
        "max_retries": 0,
        "messages": [{"role": "user", "content": "summarize"}],
    }


def sse(text: str, step: int = 7) -> bytes:
    """A well-formed chat-completion event stream whose content is ``text``."""
    out = []
    for i in range(0, len(text), step):
        event = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
        event["choices"] = [{"index": 0, "delta": {"content": text[i : i + step]}, "finish_reason": None}]
        out.append(b"data: " + json.dumps(event).encode() + b"\n\n")
    end = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    end["choices"] = [{"index": 0, "delta": {}, "finish_reason": "stop"}]
    out.append(b"data: " + json.dumps(end).encode() + b"\n\ndata: [DONE]\n\n")
    return b"".join(out)


def completion_body(text: str) -> bytes:
    return json.dumps(
        {
            "id": "c",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
    ).encode()


def test_one_endless_line_of_an_event_stream_fails_at_the_line_limit(server: LLMServer) -> None:
    """A server that streams one line and never ends it: the stream's parser buffers the line
    whole, so memory grew for as long as the clocks allowed. It fails once the line is past
    the limit, long before the clocks, as ``too_long``."""
    server.script(raw(b"data: " + b"a" * MiB, content_type="text/event-stream", repeat=True))
    started = time.monotonic()
    with pytest.raises(CallFailed) as failed:
        stream_completion(request(server), StreamLimits(30, 60))
    assert time.monotonic() - started < 20
    assert failed.value.kind == "too_long"
    assert f"a line of the stream from 127.0.0.1 ran past {MAX_LINE_BYTES // MiB} MiB" in str(failed.value)
    assert server.requests[0].headers.get("accept-encoding") == "identity"


def test_a_gzip_bomb_is_inflated_a_piece_at_a_time_and_refused_at_the_limit(server: LLMServer) -> None:
    """A few hundred KB of gzip that inflate to one 256 MiB line: inflated whole, it took
    gigabytes. Inflated in bounded pieces and counted, it is refused past the line limit having
    held a few MB at most."""
    bomb = gzip.compress(b"data: " + b" " * (256 * MiB), compresslevel=9)
    assert len(bomb) < MiB
    server.script(raw(bomb, content_type="text/event-stream", headers={"Content-Encoding": "gzip"}))
    load_litellm()
    tracemalloc.start()
    try:
        with pytest.raises(CallFailed) as failed:
            stream_completion(request(server), StreamLimits(30, 60))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert failed.value.kind == "too_long" and "ran past 4 MiB" in str(failed.value)
    assert peak < 64 * MiB, peak


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "raw deflate"])
def test_a_compressed_stream_within_the_limits_reads_as_sent(server: LLMServer, encoding: str) -> None:
    """A server that compresses although asked not to (a proxy) is read, inflated here."""
    text = "The enum serializer writes Status['GOOD']; " * 200
    body = sse(text)
    if encoding == "gzip":
        packed = gzip.compress(body)
    elif encoding == "deflate":
        packed = zlib.compress(body)
    else:
        squeeze = zlib.compressobj(wbits=-zlib.MAX_WBITS)
        packed = squeeze.compress(body) + squeeze.flush()
    # In two parts, the cut inside the compressed data, as a network delivers it.
    cut = len(packed) // 3
    header = {"Content-Encoding": encoding.split()[-1]}
    server.script(raw(packed[:cut], packed[cut:], content_type="text/event-stream", headers=header))
    result = stream_completion(request(server), StreamLimits(30, 60))
    assert result.text == text


def test_an_encoding_ctxrules_does_not_read_is_refused_as_an_error(server: LLMServer) -> None:
    server.script(raw(b"\x8b\x05\x80", content_type="text/event-stream", headers={"Content-Encoding": "br"}))
    with pytest.raises(CallFailed) as failed:
        stream_completion(request(server), StreamLimits(30, 60))
    assert failed.value.kind == "error"
    assert "encoded as br, which ctxrules does not read" in str(failed.value)


def test_a_whole_reply_past_the_body_limit_is_refused_for_own_calls_only(server: LLMServer) -> None:
    """The same 5 MiB completion: a call ctxrules makes on its own (call_within, as the eval
    judge and the cache probes call) refuses it; the caller's own litellm call, made in the same
    process afterwards, reads it whole and asks for whatever encoding httpx asks for."""
    big = completion_body("x" * (MAX_BODY_BYTES + MiB))
    litellm = load_litellm()
    kwargs = {**request(server), "timeout": 30}
    server.script(raw(big), raw(big))
    with pytest.raises(ReplyRefused) as refused:
        call_within(litellm.completion, kwargs, 30, name="ctxrules-test-call")
    assert str(refused.value) == "the reply from 127.0.0.1 ran past 4 MiB"
    response = litellm.completion(**kwargs)
    assert len(response.choices[0].message.content) == MAX_BODY_BYTES + MiB
    own, theirs = server.requests
    assert own.headers.get("accept-encoding") == "identity"
    assert theirs.headers.get("accept-encoding") != "identity"


def test_a_reply_within_the_limits_is_read_by_own_calls(server: LLMServer) -> None:
    litellm = load_litellm()
    server.script(raw(completion_body("the answer")))
    response = call_within(litellm.completion, {**request(server), "timeout": 30}, 30, name="ctxrules-test-call")
    assert response.choices[0].message.content == "the answer"


def _alive(name: str) -> bool:
    return any(t.name == name and t.is_alive() for t in threading.enumerate())


def _ends(name: str, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while _alive(name) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(name)


def test_a_call_given_up_on_ends_at_the_next_bytes_it_receives(server: LLMServer) -> None:
    """A judge endpoint trickling a space every 0.2 s: call_within gives up at its timeout, and
    the abandoned thread went on reading until the server stopped (a minute here, for ever
    elsewhere). It ends at the next bytes instead."""
    litellm = load_litellm()
    server.script(raw(b" ", interval_s=0.2, repeat=True))
    with pytest.raises(TimeoutError):
        call_within(litellm.completion, {**request(server), "timeout": 30}, 1, name="ctxrules-test-trickle")
    assert _ends("ctxrules-test-trickle", 5), "the abandoned call still reads the trickle"


def test_a_stream_given_up_on_ends_its_reader_at_the_next_keep_alive(server: LLMServer) -> None:
    """An event stream that sends a keep-alive comment every 0.2 s and never a token: the
    inactivity limit fails the call, and the stream's reader thread (litellm skips comments,
    so it never sees a chunk to stop at) ends within a few comments, not when the server
    stops: the stream is closed and the next bytes end the read."""
    server.script(raw(b": keep-alive\n\n", content_type="text/event-stream", interval_s=0.2, repeat=True))
    with pytest.raises(CallFailed) as failed:
        stream_completion(request(server), StreamLimits(1, 30))
    assert failed.value.kind == "inactivity"
    assert _ends("ctxrules-summarizer-stream", 5), "the abandoned stream reader still reads"


def test_a_server_that_ignores_stream_and_sends_one_completion_is_read(server: LLMServer) -> None:
    """A server (or proxy) that answers a streaming request with one JSON completion: the
    stream's reader finds no event in it, and the call failed as an empty reply."""
    text = '{"user_goal": "fix the enum serializer"}'
    server.script(raw(completion_body(text), content_type="application/json"))
    result = stream_completion(request(server), StreamLimits(30, 60))
    assert result.text == text and result.finish_reason == "stop"
    assert server.requests[0].body["stream"] is True


def test_a_plain_body_that_holds_no_completion_says_what_the_server_sent(server: LLMServer) -> None:
    server.script(raw(b'{"status": "queued"}', content_type="application/json"))
    with pytest.raises(CallFailed) as failed:
        stream_completion(request(server), StreamLimits(30, 60))
    assert failed.value.kind == "error"
    assert str(failed.value) == (
        "the server answered with one application/json body that holds no completion, not an event "
        """stream: '{"status": "queued"}'"""
    )


def test_an_ndjson_stream_has_the_line_limit_of_an_event_stream(server: LLMServer) -> None:
    """Streams framed in lines other than server-sent events (NDJSON, as Ollama's own API
    streams) are held to the same line limit."""
    server.script(raw(b'{"message": "' + b"a" * MiB, content_type="application/x-ndjson", repeat=True))
    with pytest.raises(CallFailed) as failed:
        stream_completion(request(server), StreamLimits(30, 60))
    assert failed.value.kind == "too_long"
    assert str(failed.value) == "a line of the stream from 127.0.0.1 ran past 4 MiB"


def test_a_stream_in_a_binary_framing_is_not_held_to_the_line_limit(server: LLMServer) -> None:
    """A binary event stream (Bedrock's) has no lines: 6 MiB without a newline is no refusal
    (what litellm makes of the bytes is its own error)."""
    server.script(raw(*([b"\x00\x01" * (MiB // 2)] * 6), content_type="application/vnd.amazon.eventstream"))
    with pytest.raises(CallFailed) as failed:
        stream_completion(request(server), StreamLimits(30, 60))
    assert failed.value.kind != "too_long" and "ran past" not in str(failed.value)


def test_a_call_that_does_not_stream_reads_at_most_the_body_limit_whatever_the_type(server: LLMServer) -> None:
    """A judge endpoint answering with what it calls an event stream, 200 MB in one line: a
    call that did not ask for a stream is held to the limit of one body."""
    litellm = load_litellm()
    server.script(raw(b"x" * MiB, content_type="text/event-stream", repeat=True))
    with pytest.raises(ReplyRefused) as refused:
        call_within(litellm.completion, {**request(server), "timeout": 30}, 30, name="ctxrules-test-call")
    assert str(refused.value) == "the reply from 127.0.0.1 ran past 4 MiB"
