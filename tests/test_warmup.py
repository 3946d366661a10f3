"""Warm-up and keep-alive against a local OpenAI-compatible HTTP server (real HTTP through
litellm), on a clock scaled down 1000x: 240 s of idle time take 0.24 s."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from llm_server import LLMServer, http_error, raw

from ctxrules import Engine
from ctxrules.cache.warmup import KeepAlive, Probe, probe_cost, probe_messages, send_probe

SCALE = 0.001  # 1 s of schedule = 1 ms of wall time
INTERVAL = 240.0


class FakeOpenAI(BaseHTTPRequestHandler):
    """``POST /v1/chat/completions``: records the request, answers one token with a usage that
    reports a cache hit for a prefix it has seen before."""

    calls: list[tuple[float, dict[str, Any]]]
    seen: set[str]
    lock: threading.Lock

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        prefix = json.dumps(body["messages"][:-1], sort_keys=True)
        with self.lock:
            self.calls.append((time.monotonic(), body))
            hit = prefix in self.seen
            self.seen.add(prefix)
        prompt = max(len(json.dumps(body["messages"])) // 4, 1)
        reply = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "."},
                    "finish_reason": "length",
                }
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": 1,
                "total_tokens": prompt + 1,
                "prompt_tokens_details": {"cached_tokens": prompt - 4 if hit else 0},
            },
        }
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, type[FakeOpenAI]]]:
    handler = type("Handler", (FakeOpenAI,), {"calls": [], "seen": set(), "lock": threading.Lock()})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", handler
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def request_for(base: str) -> dict[str, Any]:
    return {"api_base": base, "api_key": "sk-local-test"}


def wait_for(cond: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_probe_messages_end_with_a_user_turn() -> None:
    prefix = [{"role": "system", "content": "s"}]
    assert probe_messages(prefix)[-1] == {"role": "user", "content": "."}
    assert probe_messages([*prefix, {"role": "user", "content": "hi"}])[-1]["content"] == "hi"
    assert prefix == [{"role": "system", "content": "s"}]


def test_probe_cost_uses_the_registry_prices() -> None:
    cold = probe_cost("gpt-4o", 1000, 0, 0, 1)
    hot = probe_cost("gpt-4o", 1000, 996, 0, 1)
    assert cold is not None and hot is not None and 0 < hot < cold
    assert probe_cost("no-such-model-xyz", 10, 0, 0, 1) is None


def test_a_failing_probe_is_reported_not_raised() -> None:
    probe = send_probe(
        "openai/gpt-4o",
        [{"role": "user", "content": "x"}],
        request={"api_base": "http://127.0.0.1:9/v1", "api_key": "k", "max_retries": 0},
        timeout_s=2,
    )
    assert not probe.ok and probe.error


def test_a_failed_probe_is_one_request_not_three() -> None:
    """litellm retries a failed call twice by default: three prefixes paid for one probe, and
    three times ``timeout_s`` before a silent server's probe fails."""
    with LLMServer() as server:
        server.script(http_error(500), http_error(500), http_error(500))
        probe = send_probe(
            "openai/gpt-4o",
            [{"role": "user", "content": "x"}],
            request={"api_base": server.base_url, "api_key": "k"},
            timeout_s=5,
        )
        assert not probe.ok and probe.status == 500
        assert len(server.requests) == 1


def test_a_probe_answered_by_a_trickle_gives_up_at_its_timeout() -> None:
    """A server that sends a space every 0.2 s never lets a read time out; the probe still
    fails after ``timeout_s`` (the server would go on for a minute)."""
    with LLMServer() as server:
        server.script(raw(b" ", interval_s=0.2, repeat=True))
        started = time.monotonic()
        probe = send_probe(
            "openai/gpt-4o",
            [{"role": "user", "content": "x"}],
            request={"api_base": server.base_url, "api_key": "k"},
            timeout_s=1,
        )
        took = time.monotonic() - started
        assert not probe.ok and not probe.rejected
        assert "no complete answer within 1 s" in (probe.error or "")
        assert took < 5, took
    # The abandoned call ends with its connection (here: the server stopping).
    for thread in [t for t in threading.enumerate() if t.name == "ctxrules-probe"]:
        thread.join(10)
        assert not thread.is_alive()


def test_warm_up_sends_the_prefix_with_one_output_token(server: Any, tmp_path: Path) -> None:
    base, handler = server
    engine = Engine.load("builtin:default")
    session = engine.session(tmp_path / "s", model="gpt-4o")
    result = session.prepare(
        [
            {"role": "system", "content": engine.assemble("full", "gpt-4o")},
            {"role": "user", "content": "hello"},
        ]
    )
    probe = send_probe("openai/gpt-4o", result.messages, request={**request_for(base), **result.request})
    assert probe.ok, probe.error
    ((_, body),) = handler.calls
    assert body["max_tokens"] == 1 and body["prompt_cache_key"] == "s"
    assert body["messages"] == result.messages
    assert probe.prompt_tokens > 0 and probe.cached_tokens == 0 and probe.cost_usd and probe.cost_usd > 0


def test_keep_alive_schedule_on_a_scaled_clock(server: Any) -> None:
    base, handler = server
    from ctxrules.cache.warmup import load_litellm

    load_litellm()  # the import takes seconds: keep it out of the measured schedule
    prefix = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Start."},
    ]
    ka = KeepAlive(
        "openai/gpt-4o",
        request=request_for(base),
        interval_s=INTERVAL,
        time_scale=SCALE,
        max_idle_s=10_000,
    )
    with ka:
        ka.update(prefix, warm="session start")
        wait_for(lambda: len(ka.probes) >= 4)  # the warm-up, then 3 keep-alives
        with ka.active():  # a call in flight pauses the keep-alive
            paused_at = len(ka.probes)
            time.sleep(3 * INTERVAL * SCALE)
            assert len(ka.probes) == paused_at
            # Read before the call ends, when the idle timer restarts: read just after, a
            # descheduled thread gets a later time (here a millisecond is a scaled second) and
            # sees the next keep-alive come "early".
            resumed = time.monotonic()
        wait_for(lambda: len(ka.probes) >= paused_at + 1)
        first_after = handler.calls[-1][0]
    ka_stopped = len(ka.probes)
    time.sleep(3 * INTERVAL * SCALE)
    assert len(ka.probes) == ka_stopped, "stop() ends the keep-alive"
    assert ka._thread is not None and not ka._thread.is_alive()

    probes = ka.probes
    assert [p.kind for p in probes[:4]] == ["warmup", "keepalive", "keepalive", "keepalive"]
    assert all(p.ok for p in probes), [p.error for p in probes]
    gaps = [b.at - a.at for a, b in itertools.pairwise(probes[:4])]
    # Each keep-alive comes one interval (240 s, scaled) after the previous probe; the tolerance
    # covers one HTTP round trip on the scaled clock.
    for gap in gaps:
        assert INTERVAL <= gap <= INTERVAL + 120, gaps
    assert (first_after - resumed) / SCALE >= INTERVAL - 1
    assert all(body["max_tokens"] == 1 for _, body in handler.calls)
    report = ka.report()
    assert report["warmups"] == 1 and report["keepalives"] == len(probes) - 1 and report["failed"] == 0
    assert report["cost_usd"] is not None and report["cost_usd"] > 0
    # The keep-alives hit the cache the warm-up wrote: they are cheaper.
    assert probes[1].cached_tokens > 0 and probes[1].cost_usd is not None and probes[0].cost_usd is not None
    assert probes[1].cost_usd < probes[0].cost_usd


def test_after_prepare_warms_at_start_and_after_compaction(server: Any) -> None:
    base, handler = server
    sent: list[Probe] = []

    def record(model: str, messages: Any, tools: Any, **kw: Any) -> Probe:
        probe = send_probe(model, messages, tools, **kw)
        sent.append(probe)
        return probe

    class Result:
        def __init__(self, messages: list[dict[str, Any]], saved: int) -> None:
            self.messages, self.tools, self.request = messages, [], {"prompt_cache_key": "k1"}
            self.report = {
                "stages": [
                    {
                        "id": "dedup",
                        "phase": "content",
                        "ran": True,
                        "tokens_saved": saved,
                        "actions": [],
                    }
                ]
            }

    ka = KeepAlive(
        "openai/gpt-4o",
        request=request_for(base),
        interval_s=INTERVAL,
        time_scale=SCALE * 100,
        send=record,
    )
    with ka:
        ka.after_prepare(Result([{"role": "user", "content": "a"}], 0))
        wait_for(lambda: len(sent) == 1)
        ka.after_prepare(Result([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], 0))
        ka.after_prepare(Result([{"role": "user", "content": "summary"}], 500))
        wait_for(lambda: len(sent) == 2)
    assert [p.reason for p in sent] == ["session start", "after compaction"]
    assert handler.calls[-1][1]["messages"][0]["content"] == "summary"
    assert all(body["prompt_cache_key"] == "k1" for _, body in handler.calls)


def test_a_warm_up_the_real_call_overtakes_is_not_sent_after_it() -> None:
    """docs/prompts.md: ``after_prepare(result)`` then ``with ka.active(): completion(...)``.
    The warm-up waited while the call ran and went out after it, paying again for the prefix the
    call had just written to the cache."""
    sent: list[str] = []

    def record(model: str, messages: Any, tools: Any, *, kind: str, reason: str, **kw: Any) -> Probe:
        sent.append(f"{kind}:{reason}")
        return Probe(kind=kind, reason=reason, at=0.0, ok=True, latency_s=0.0)

    prefix = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Start."}]
    ka = KeepAlive("openai/gpt-4o", send=record, interval_s=float("inf"))
    ka.update(prefix, warm="session start")
    with ka.active():
        pass  # the real call: it sends the prefix and writes it to the cache
    with ka:  # the probe thread runs from here on
        time.sleep(0.5)
    assert sent == []
    ka = KeepAlive("openai/gpt-4o", send=record, interval_s=float("inf"))
    with ka:
        ka.update(prefix, warm="session start")  # no call follows: the warm-up goes out
        wait_for(lambda: sent == ["warmup:session start"])


def test_no_probes_after_max_idle(server: Any) -> None:
    base, _ = server
    ka = KeepAlive(
        "openai/gpt-4o",
        request=request_for(base),
        interval_s=INTERVAL,
        time_scale=SCALE,
        max_idle_s=2.5 * INTERVAL,
    )
    with ka:
        ka.update([{"role": "user", "content": "x"}])
        time.sleep(6 * INTERVAL * SCALE)
    assert len(ka.probes) == 2  # at 240 and 480; at 720 the session has been idle too long


@pytest.mark.parametrize(
    "settings",
    [
        {"interval_s": float("nan")},
        {"time_scale": float("nan")},
        {"time_scale": float("inf")},
        {"max_idle_s": -1.0},
        {"max_idle_s": float("nan")},
        {"timeout_s": 0.0},
        {"timeout_s": float("nan")},
        {"timeout_s": float("inf")},
    ],
)
def test_settings_that_make_no_schedule_are_refused(settings: dict[str, float]) -> None:
    """NaN compares false with everything: a NaN time scale made every probe due at once (a
    storm of paid probes), a NaN or negative limit meant nothing. Refused when made."""
    with pytest.raises(ValueError, match=next(iter(settings))):
        KeepAlive("openai/gpt-4o", **settings)  # type: ignore[arg-type]


def test_an_infinite_interval_sends_warm_ups_and_no_keep_alives(server: Any) -> None:
    """``interval_s=inf``: no idle probes. The wait for one was past what a lock can wait and
    killed the thread (OverflowError), so the next warm-up was never sent."""
    base, _ = server
    ka = KeepAlive("openai/gpt-4o", request=request_for(base), interval_s=float("inf"), time_scale=SCALE)
    with ka:
        ka.update([{"role": "user", "content": "x"}], warm="session start")
        wait_for(lambda: len(ka.probes) == 1)
        time.sleep(0.2)
        ka.update([{"role": "user", "content": "summary"}], warm="after compaction")
        wait_for(lambda: len(ka.probes) == 2)
        time.sleep(0.2)
    assert [p.kind for p in ka.probes] == ["warmup", "warmup"]


def probe_reply(usage: dict[str, int] | None = None) -> dict[str, Any]:
    """A chat completion as a provider answers a probe (one token, cut at max_tokens); without
    ``usage`` when none is given, as some providers and proxies answer."""
    body: dict[str, Any] = {
        "id": "c1",
        "object": "chat.completion",
        "created": 0,
        "model": "gpt-4o",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "length"}],
    }
    if usage is not None:
        body["usage"] = usage
    return body


def test_a_probe_whose_provider_sends_no_usage_is_counted_in_the_ledger(tmp_path: Path) -> None:
    """A provider (or proxy) that answers without ``usage``: litellm fills in zeros, and the
    probe, a call billed like any other, went into the ledger as free (0 tokens, 0 USD). Its
    prefix is counted with the model's tokenizer instead, as ``session.complete`` counts such a
    reply (``source`` ``warmup-counted``)."""
    from ctxrules.models import lookup_model
    from ctxrules.tokens import TokenCounter

    session = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o")
    prefix = [{"role": "system", "content": "You fix bugs. " * 300}, {"role": "user", "content": "hi"}]
    with LLMServer() as server:
        server.script(raw(json.dumps(probe_reply()).encode()))
        probe = send_probe("openai/gpt-4o", prefix, request=request_for(server.base_url), ledger=session.ledger)
        assert len(server.requests) == 1
    counter = TokenCounter.for_model(lookup_model("gpt-4o"))
    expected = counter.count_messages(probe_messages(prefix))
    assert expected > 1000
    assert probe.ok and probe.prompt_tokens == expected and probe.completion_tokens == counter.count_text("ok")
    assert probe.cost_usd is not None and probe.cost_usd > 0
    (record,) = [json.loads(line) for line in (session.path / "ledger.jsonl").read_text().splitlines()]
    assert record["source"] == "warmup-counted"
    assert record["tokens"]["prompt"] == expected and record["usd"]["total"] > 0
    assert session.ledger.status().totals.cost.total == record["usd"]["total"]


def test_a_sent_probe_whose_usage_the_ledger_cannot_take_is_no_failed_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The provider answered (and billed) the probe; the ledger then failed to take its usage (a
    full disk). Reporting the probe as failed made a keep-alive send it again, paying twice for
    what it reported as never done: the probe is ok and says why its usage is missing."""
    session = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o")

    def full_disk(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(session.ledger, "record", full_disk)
    usage = {"prompt_tokens": 1200, "completion_tokens": 1, "total_tokens": 1201}
    with LLMServer() as server:
        server.script(raw(json.dumps(probe_reply(usage)).encode()))
        probe = send_probe(
            "openai/gpt-4o",
            [{"role": "user", "content": "x"}],
            request=request_for(server.base_url),
            ledger=session.ledger,
            check=True,
        )
        assert len(server.requests) == 1
    assert probe.ok and probe.error is None and probe.prompt_tokens == 1200
    assert probe.usage_error is not None and "No space left on device" in probe.usage_error
