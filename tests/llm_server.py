"""A small local OpenAI-compatible HTTP server for tests of LLM call paths.

Real HTTP on ``127.0.0.1`` with a port the OS chooses, serving ``POST /v1/chat/completions``
(and ``/chat/completions``) both as a Server-Sent-Events stream (``"stream": true``) and as one
JSON body. Each request consumes the next *scripted behaviour*; when the script is used up the
``default`` behaviour answers (a 500 unless you say otherwise), so an unexpected extra call is
visible instead of hanging.

Usage::

    from llm_server import LLMServer, reply, slow_reply, silent, http_error, context_length_error

    with LLMServer() as server:
        server.script(http_error(500), reply('{"user_goal": "..."}'))
        litellm.completion(model="openai/test", api_base=server.base_url, api_key="x", ...)
        assert len(server.requests) == 2
        assert server.requests[0].body["messages"][0]["role"] == "system"

Behaviours (frozen dataclasses; build them with the helper functions):

- :func:`reply` — the text as a completion; streamed in chunks of ``chunk_chars``
  characters, one chunk every ``interval_s`` seconds (0: as fast as possible). Good JSON,
  invalid JSON and prose are all just ``reply(text)``.
- :func:`slow_reply` — ``reply`` with a pause between chunks: slow but alive.
- :func:`silent` — a stream that sends ``prefix`` and then nothing for ``hold_s`` seconds (or
  until the server stops), then closes without ``[DONE]``; non-streaming requests just wait.
- :func:`http_error` — an HTTP error status with an OpenAI-style error body.
- :func:`context_length_error` — the 400 ``context_length_exceeded`` error providers send
  when the prompt does not fit.
- :func:`raw` — raw bytes in whatever framing (garbage, truncated JSON, a wrong content type,
  a cut-off SSE stream), ``repeat=True`` for a body that never ends (a trickle).
- :func:`stream_error` — a stream that sends ``prefix`` and then an error event (``data:
  {"error": ...}``, as OpenAI-compatible servers report a failure mid-stream).

``reply(..., usage=False)`` streams without the final usage chunk (providers that send none);
``usage={...}`` sends that usage object instead of the one counted from the text;
``usage_apart=True`` sends it in a chunk of its own with no choices, as OpenAI does.

``LLMServer(strict=True)`` checks every request's messages the way OpenAI does: a message key
its role does not define (or a tool-call key other than ``id``/``type``/``function``) is
answered with a 400 ``Additional properties are not allowed ('<key>' was unexpected) -
'messages.<n>'`` without consuming a behaviour (:attr:`LLMServer.rejected` lists them);
``allow=`` adds keys the test's caller itself passes.

Every loop is bounded: a reply ends with its text, a silent stream after ``hold_s`` (capped at
:data:`MAX_HOLD_S`), and :meth:`LLMServer.stop` wakes every waiting handler at once.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

__all__ = [
    "MAX_HOLD_S",
    "Behaviour",
    "HTTPError",
    "LLMServer",
    "Raw",
    "RecordedRequest",
    "Reply",
    "Silent",
    "context_length_error",
    "http_error",
    "raw",
    "reply",
    "silent",
    "slow_reply",
    "stream_error",
    "strict_problem",
]

MAX_HOLD_S = 60.0
"""The longest a silent behaviour holds a connection, whatever it was asked for."""

# The chat-completions message schema, per role (what OpenAI accepts; anything else is a 400).
STRICT_MESSAGE_KEYS: dict[str, frozenset[str]] = {
    "system": frozenset({"role", "content", "name"}),
    "developer": frozenset({"role", "content", "name"}),
    "user": frozenset({"role", "content", "name"}),
    "assistant": frozenset({"role", "content", "name", "tool_calls", "refusal", "audio", "function_call"}),
    "tool": frozenset({"role", "content", "tool_call_id"}),
    "function": frozenset({"role", "content", "name"}),
}
STRICT_CALL_KEYS = frozenset({"id", "type", "function"})


def strict_problem(body: dict[str, Any], allow: frozenset[str] = frozenset()) -> str | None:
    """What a strict endpoint says about ``body``'s messages (``None`` when it accepts them)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return "'messages' is a required property"
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            return f"{msg!r} is not of type 'object' - 'messages.{i}'"
        allowed = STRICT_MESSAGE_KEYS.get(str(msg.get("role")))
        if allowed is None:
            return f"{msg.get('role')!r} is not one of the roles - 'messages.{i}.role'"
        for key in msg:
            if key not in allowed and key not in allow:
                return f"Additional properties are not allowed ('{key}' was unexpected) - 'messages.{i}'"
        for j, call in enumerate(msg.get("tool_calls") or []):
            for key in call if isinstance(call, dict) else ():
                if key not in STRICT_CALL_KEYS:
                    return (
                        f"Additional properties are not allowed ('{key}' was unexpected) - "
                        f"'messages.{i}.tool_calls.{j}'"
                    )
    return None


@dataclass(frozen=True)
class Reply:
    """Answer with ``text`` (see :func:`reply`)."""

    text: str
    chunk_chars: int = 8
    interval_s: float = 0.0
    finish_reason: str = "stop"
    usage: bool | dict[str, Any] = True
    usage_apart: bool = False


@dataclass(frozen=True)
class Silent:
    """Send ``prefix`` (streaming), then nothing for ``hold_s`` seconds (see :func:`silent`)."""

    prefix: str = ""
    hold_s: float = 10.0


@dataclass(frozen=True)
class HTTPError:
    """Answer with HTTP ``status`` and an OpenAI-style error body (see :func:`http_error`)."""

    status: int = 500
    message: str = "internal server error"
    type: str = "server_error"
    code: str | None = None


@dataclass(frozen=True)
class Raw:
    """Answer with raw bytes (see :func:`raw`): whatever a broken server or proxy might send."""

    body: tuple[bytes, ...] = ()
    status: int = 200
    content_type: str = "application/json"
    interval_s: float = 0.0
    repeat: bool = False
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class StreamError:
    """Stream ``prefix``, then an error event (see :func:`stream_error`)."""

    prefix: str = "partial"
    message: str = "internal server error"
    code: str | None = None


Behaviour = Reply | Silent | HTTPError | StreamError | Raw


def reply(
    text: str,
    *,
    chunk_chars: int = 8,
    finish_reason: str = "stop",
    usage: bool | dict[str, Any] = True,
    usage_apart: bool = False,
) -> Reply:
    """A completion whose content is ``text``, streamed ``chunk_chars`` characters at a time;
    ``usage=False``: the stream ends without a usage chunk; a dict: the usage sent;
    ``usage_apart``: the usage comes in a chunk of its own with no choices, after the one that
    says ``finish_reason`` (as OpenAI streams it for ``include_usage``)."""
    return Reply(
        text, chunk_chars=max(1, chunk_chars), finish_reason=finish_reason, usage=usage, usage_apart=usage_apart
    )


def stream_error(
    prefix: str = "partial", message: str = "internal server error", *, code: str | None = None
) -> StreamError:
    """A stream that sends ``prefix`` as content, then ``{"error": {"message", "code"}}``.
    A non-streaming request gets the error as an HTTP 500."""
    return StreamError(prefix, message, code)


def slow_reply(text: str, *, every_s: float, chunk_chars: int = 8) -> Reply:
    """Like :func:`reply`, one chunk every ``every_s`` seconds: slow, but alive."""
    return Reply(text, chunk_chars=max(1, chunk_chars), interval_s=max(0.0, every_s))


def silent(*, prefix: str = "", hold_s: float = 10.0) -> Silent:
    """A stream that goes quiet after ``prefix`` for ``hold_s`` seconds (≤ :data:`MAX_HOLD_S`)."""
    return Silent(prefix, min(max(0.0, hold_s), MAX_HOLD_S))


def http_error(
    status: int = 500,
    message: str = "internal server error",
    *,
    type: str = "server_error",
    code: str | None = None,
) -> HTTPError:
    """An HTTP error with ``{"error": {"message", "type", "code"}}``."""
    return HTTPError(status, message, type, code)


def raw(
    *parts: bytes,
    status: int = 200,
    content_type: str = "application/json",
    interval_s: float = 0.0,
    repeat: bool = False,
    headers: dict[str, str] | None = None,
) -> Raw:
    """Send ``parts`` as the body (HTTP/1.1 chunked, one part per chunk, ``interval_s`` apart),
    whatever the request asked for: garbage, truncated JSON, a wrong content type, an SSE
    stream that is cut off. ``repeat`` sends the parts again and again until :data:`MAX_HOLD_S`
    or :meth:`LLMServer.stop` (a stream that never ends); ``headers`` are sent as well (a
    ``Content-Encoding`` the request did not ask for)."""
    return Raw(tuple(parts), status, content_type, interval_s, repeat, tuple((headers or {}).items()))


def context_length_error(limit: int = 8192) -> HTTPError:
    """The 400 error an OpenAI-compatible server sends when the prompt is too long."""
    return HTTPError(
        400,
        f"This model's maximum context length is {limit} tokens. However, your messages "
        f"resulted in {limit * 2} tokens. Please reduce the length of the messages.",
        "invalid_request_error",
        "context_length_exceeded",
    )


@dataclass
class RecordedRequest:
    """One request the server received: its path, its parsed JSON body, the behaviour used and
    the request headers (names lower-cased)."""

    path: str
    body: dict[str, Any]
    behaviour: Behaviour
    headers: dict[str, str] = field(default_factory=dict)
    received_at: float = field(default_factory=time.monotonic)

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))


class LLMServer:
    """The server; a context manager that starts on enter and stops on exit.

    ``model`` is the model name reported in responses. ``default`` answers requests once the
    script is used up. Thread-safe: tests may script and read ``requests`` while calls run.
    """

    def __init__(
        self,
        *,
        model: str = "test-model",
        default: Behaviour | None = None,
        strict: bool = False,
        allow: frozenset[str] = frozenset(),
    ) -> None:
        self.model = model
        self.strict = strict
        self.allow = allow
        self._rejected: list[tuple[dict[str, Any], str]] = []
        self.default: Behaviour = default or http_error(500, "no scripted behaviour left")
        self._script: deque[Behaviour] = deque()
        self._requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> LLMServer:
        if self._httpd is not None:
            return self
        handler = _make_handler(self)
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        httpd.daemon_threads = True
        self._httpd = httpd
        self._stopping.clear()
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="llm-test-server",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; silent handlers wake up and close their connections."""
        self._stopping.set()
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> LLMServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- scripting ----------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("the server is not running")
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        """The OpenAI-style API base, e.g. ``http://127.0.0.1:54321/v1``."""
        return f"http://127.0.0.1:{self.port}/v1"

    def script(self, *behaviours: Behaviour) -> LLMServer:
        """Append behaviours; each request consumes one, in order."""
        with self._lock:
            self._script.extend(behaviours)
        return self

    def clear(self) -> None:
        """Forget the remaining script and the recorded requests."""
        with self._lock:
            self._script.clear()
            self._requests.clear()

    @property
    def requests(self) -> list[RecordedRequest]:
        """The chat-completion requests received so far (a copy)."""
        with self._lock:
            return list(self._requests)

    @property
    def rejected(self) -> list[tuple[dict[str, Any], str]]:
        """``(body, message)`` of the requests the strict check answered with a 400 (a copy)."""
        with self._lock:
            return list(self._rejected)

    def _reject(self, body: dict[str, Any], message: str) -> None:
        with self._lock:
            self._rejected.append((body, message))

    @property
    def pending(self) -> int:
        """Scripted behaviours not used yet."""
        with self._lock:
            return len(self._script)

    def _next(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> Behaviour:
        with self._lock:
            behaviour = self._script.popleft() if self._script else self.default
            self._requests.append(RecordedRequest(path, body, behaviour, headers))
            return behaviour


def _make_handler(server: LLMServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep test output clean

        def do_GET(self) -> None:
            if self.path.rstrip("/").endswith("/models"):
                self._json(200, {"object": "list", "data": [{"id": server.model, "object": "model"}]})
            else:
                self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                return
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                self._json(400, {"error": {"message": "body is not JSON", "type": "invalid_request_error"}})
                return
            if not isinstance(body, dict):
                body = {"_raw": body}
            headers = {k.lower(): v for k, v in self.headers.items()}
            problem = strict_problem(body, server.allow) if server.strict else None
            if problem is not None:
                server._reject(body, problem)
                self._json(
                    400,
                    {"error": {"message": problem, "type": "invalid_request_error", "code": None, "param": "messages"}},
                )
                return
            behaviour = server._next(self.path, body, headers)
            stream = bool(body.get("stream"))
            try:
                if isinstance(behaviour, HTTPError):
                    self._json(
                        behaviour.status,
                        {
                            "error": {
                                "message": behaviour.message,
                                "type": behaviour.type,
                                "code": behaviour.code,
                                "param": None,
                            }
                        },
                    )
                elif isinstance(behaviour, Raw):
                    self._raw(behaviour)
                elif isinstance(behaviour, Silent):
                    self._silent(behaviour, stream)
                elif isinstance(behaviour, StreamError):
                    self._stream_error(behaviour, stream)
                elif stream:
                    self._stream(behaviour)
                else:
                    self._complete(behaviour)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (e.g. its inactivity timeout): nothing to answer

        # --- responses ------------------------------------------------------------------------

        def _json(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
            self.close_connection = True

        def _complete(self, behaviour: Reply) -> None:
            if behaviour.interval_s:
                # A slow non-streaming reply takes as long as its stream would have.
                chunks = max(1, -(-len(behaviour.text) // behaviour.chunk_chars))
                server._stopping.wait(min(chunks * behaviour.interval_s, MAX_HOLD_S))
            self._json(
                200,
                {
                    "id": "chatcmpl-test",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": server.model,
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": behaviour.finish_reason,
                            "message": {"role": "assistant", "content": behaviour.text},
                        }
                    ],
                    "usage": _usage_of(behaviour),
                },
            )

        def _start_stream(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True

        def _event(self, payload: dict[str, Any] | str) -> None:
            text = payload if isinstance(payload, str) else json.dumps(payload)
            data = f"data: {text}\n\n".encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def _end_stream(self) -> None:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def _delta(self, content: str | None, finish: str | None = None, role: bool = False) -> dict[str, Any]:
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if content is not None:
                delta["content"] = content
            return {
                "id": "chatcmpl-test",
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": server.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }

        def _stream(self, behaviour: Reply) -> None:
            self._start_stream()
            self._event(self._delta("", role=True))
            text = behaviour.text
            for start in range(0, len(text), behaviour.chunk_chars):
                if behaviour.interval_s and server._stopping.wait(behaviour.interval_s):
                    return
                self._event(self._delta(text[start : start + behaviour.chunk_chars]))
            final = self._delta(None, behaviour.finish_reason)
            if behaviour.usage and not behaviour.usage_apart:
                final["usage"] = _usage_of(behaviour)
            self._event(final)
            if behaviour.usage and behaviour.usage_apart:
                self._event({**self._delta(None), "choices": [], "usage": _usage_of(behaviour)})
            self._event("[DONE]")
            self._end_stream()

        def _raw(self, behaviour: Raw) -> None:
            self.send_response(behaviour.status)
            self.send_header("Content-Type", behaviour.content_type)
            for name, value in behaviour.headers:
                self.send_header(name, value)
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            ends = time.monotonic() + MAX_HOLD_S
            while True:
                for part in behaviour.body:
                    if behaviour.interval_s and server._stopping.wait(behaviour.interval_s):
                        return
                    if server._stopping.is_set() or time.monotonic() > ends:
                        return
                    if part:
                        self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
                        self.wfile.flush()
                if not behaviour.repeat:
                    break
            self._end_stream()

        def _stream_error(self, behaviour: StreamError, stream: bool) -> None:
            error = {"message": behaviour.message, "type": "server_error", "code": behaviour.code}
            if not stream:
                self._json(500, {"error": error})
                return
            self._start_stream()
            self._event(self._delta("", role=True))
            self._event(self._delta(behaviour.prefix))
            self._event({"error": error})
            self._end_stream()

        def _silent(self, behaviour: Silent, stream: bool) -> None:
            if stream:
                self._start_stream()
                self._event(self._delta("", role=True))
                if behaviour.prefix:
                    self._event(self._delta(behaviour.prefix))
            server._stopping.wait(min(behaviour.hold_s, MAX_HOLD_S))
            if stream:
                self._end_stream()  # closes without a final chunk or [DONE]
            # Non-streaming: close without any response.

    return Handler


def _usage(text: str) -> dict[str, int]:
    completion = max(1, len(text) // 4)
    return {"prompt_tokens": 10, "completion_tokens": completion, "total_tokens": 10 + completion}


def _usage_of(behaviour: Reply) -> dict[str, Any]:
    return behaviour.usage if isinstance(behaviour.usage, dict) else _usage(behaviour.text)
