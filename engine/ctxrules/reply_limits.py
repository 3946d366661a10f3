"""Byte limits on the HTTP replies to the model calls ctxrules makes on its own.

The summarizer, the eval judge, the router's judge and the cache probes call a model the pack
names, through litellm, at an address the pack (or a flag) gives. The time limits of those
calls hold whatever the server does, but bytes are another matter: a server that answers with
one 200 MB line, or 3 MB of gzip that inflates to gigabytes, fills memory while the limits
tick, and the text a failed call reports (200 MB of it) keeps litellm busy long after the call
was given up. So, inside :func:`capped` (which :func:`ctxrules.llm.own_call` enters), every
reply is read through a meter:

- a call that streams (the summarizer's): a reply framed in lines (an event stream, NDJSON) may
  hold at most :data:`MAX_LINE_BYTES` in one line (one event) and :data:`MAX_STREAM_BYTES` in
  all; a reply in another binary framing (Bedrock's event stream), :data:`MAX_STREAM_BYTES`; a
  plain body (a server that ignored ``stream``), :data:`MAX_BODY_BYTES`, kept for
  :func:`plain_reply`;
- a call that does not stream (a judge, a probe): at most :data:`MAX_BODY_BYTES`, whatever the
  reply says it is;
- the request asks for no compression (``Accept-Encoding: identity``); a server that compresses
  anyway with gzip or deflate is inflated here, a bounded piece at a time, and the limits count
  the inflated bytes; any other encoding is refused.

Past a limit the read fails with :class:`ReplyRefused`, which :func:`capped` raises in place of
whatever litellm made of it. So does the next read of a call its caller has given up on
(``capped(cancel=event)``, the event set): a server that keeps a connection alive with a
comment every few seconds kept the abandoned call's thread reading (each read well within the
socket's timeout) for as long as it liked, and a process that ended meanwhile could freeze in
the interpreter's teardown. The meter is a wrapper around ``httpx.HTTPTransport.
handle_request`` (the transport under litellm's and the OpenAI client's synchronous calls),
installed on first use; it acts only in a thread inside :func:`capped` and hands every other
request (the caller's own model calls) to httpx untouched.
"""

from __future__ import annotations

import contextlib
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import httpx

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_LINE_BYTES",
    "MAX_STREAM_BYTES",
    "ReplyRefused",
    "capped",
    "plain_reply",
    "reading_until",
]

MAX_BODY_BYTES = 4 << 20
"""The largest reply read whole (a JSON completion): a judge's answer or a probe's is a few KB."""
MAX_LINE_BYTES = 4 << 20
"""The longest line of a stream framed in lines: one chunk of a streamed reply is a few hundred bytes."""
MAX_STREAM_BYTES = 256 << 20
"""All of one stream: a summary of 131,072 characters streams in about 10 MB."""
_PIECE = 64 << 10  # inflated at most this much at a time
# Content types of streams framed in lines (one event or object per line).
_LINE_FRAMED = frozenset(
    {"text/event-stream", "application/x-ndjson", "application/ndjson", "application/jsonl", "application/json-seq"}
)

_STATE = threading.local()
_INSTALL = threading.Lock()
_installed = False


class ReplyRefused(Exception):
    """A reply to one of ctxrules' own model calls was refused while it was read: ``kind`` is
    ``too_long`` (past a byte limit) or ``error`` (an encoding ctxrules does not read)."""

    def __init__(self, message: str, *, kind: str = "too_long") -> None:
        super().__init__(message)
        self.kind = kind


def _mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB"


class _Meter:
    """Counts the bytes of one reply (inflated, when the server compressed it) and refuses the
    one past a limit; records the refusal for :func:`capped` (litellm rewraps the exception)."""

    def __init__(self, host: str, what: str, total: int, line: int | None, cancel: threading.Event | None) -> None:
        self.host = host
        self.what = what
        self.max_total = total
        self.max_line = line
        self.cancel = cancel
        self.kept: bytearray | None = None
        self.total = 0
        self.line = 0

    def count(self, data: bytes) -> None:
        if self.cancel is not None and self.cancel.is_set():
            self.refuse(f"the call to {self.host} was given up", kind="error")
        self.total += len(data)
        if self.max_line is not None:
            end = data.rfind(b"\n")
            self.line = self.line + len(data) if end < 0 else len(data) - end - 1
            if self.line > self.max_line:
                self.refuse(f"a line of {self.what} ran past {_mib(self.max_line)}")
        if self.total > self.max_total:
            self.refuse(f"{self.what} ran past {_mib(self.max_total)}")
        if self.kept is not None:
            self.kept += data

    def refuse(self, message: str, kind: str = "too_long") -> None:
        refused = ReplyRefused(message, kind=kind)
        _STATE.refused = refused
        raise refused


class _Inflate:
    """gzip or deflate, inflated at most :data:`_PIECE` bytes at a time."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        self.zlib_header = True
        self._new()

    def _new(self) -> None:
        if self.encoding == "gzip":
            wbits = 16 + zlib.MAX_WBITS
        else:  # deflate: zlib-wrapped as the RFC says, or raw as some servers send it
            wbits = zlib.MAX_WBITS if self.zlib_header else -zlib.MAX_WBITS
        self.obj = zlib.decompressobj(wbits)
        self.started = False

    def pieces(self, data: bytes) -> Iterator[bytes]:
        try:
            out = self.obj.decompress(data, _PIECE)
        except zlib.error:
            if self.encoding != "deflate" or self.started or not self.zlib_header:
                raise
            self.zlib_header = False
            self._new()
            out = self.obj.decompress(data, _PIECE)
        self.started = True
        while True:
            if out:
                yield out
            if not self.obj.unconsumed_tail:
                return
            out = self.obj.decompress(self.obj.unconsumed_tail, _PIECE)


def _metered(response: httpx.Response, request: httpx.Request) -> httpx.Response:
    """``response`` with its body read through a :class:`_Meter` (inflated when compressed)."""
    host = request.url.host or "the server"
    kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
    cancel = getattr(_STATE, "cancel", None)
    if not getattr(_STATE, "streaming", False):
        meter = _Meter(host, f"the reply from {host}", MAX_BODY_BYTES, None, cancel)
    elif kind in _LINE_FRAMED:
        meter = _Meter(host, f"the stream from {host}", MAX_STREAM_BYTES, MAX_LINE_BYTES, cancel)
    elif kind == "application/json" or kind.startswith("text/") or not kind:
        meter = _Meter(host, f"the reply from {host}", MAX_BODY_BYTES, None, cancel)
        meter.kept = bytearray()
        _STATE.plain = (kind or "untyped", meter.kept)
    else:
        meter = _Meter(host, f"the stream from {host}", MAX_STREAM_BYTES, None, cancel)
    encodings = [e.strip().lower() for e in response.headers.get("content-encoding", "").split(",") if e.strip()]
    encodings = [e for e in encodings if e != "identity"]
    inflate: _Inflate | None = None
    if encodings:
        if len(encodings) > 1 or encodings[0] not in ("gzip", "deflate"):
            response.close()
            meter.refuse(
                f"the reply from {host} is encoded as {', '.join(encodings)}, which ctxrules does not read "
                "(it asked for no encoding)",
                kind="error",
            )
        inflate = _Inflate(encodings[0])

    def body(inner: Iterable[bytes]) -> Iterator[bytes]:
        for data in inner:
            for piece in (data,) if inflate is None else inflate.pieces(data):
                meter.count(piece)
                yield piece

    if inflate is not None:  # what httpx would inflate again, and a length the body no longer has
        response.headers.pop("content-encoding", None)
        response.headers.pop("content-length", None)
    return _rewrap(response, body)


def _rewrap(response: httpx.Response, body: Callable[[Iterable[bytes]], Iterator[bytes]]) -> httpx.Response:
    """``response`` (changed in place, before anything reads it) with its body read through
    ``body``."""
    import httpx

    if not isinstance(response.stream, httpx.SyncByteStream):  # a synchronous transport's always is
        return response
    inner: httpx.SyncByteStream = response.stream

    class Stream(httpx.SyncByteStream):
        def __iter__(self) -> Iterator[bytes]:
            return body(inner)

        def close(self) -> None:
            inner.close()

    response.stream = Stream()
    return response


def _timed(response: httpx.Response, request: httpx.Request) -> httpx.Response:
    """``response`` with its body failing at the first bytes read past :func:`reading_until`'s
    time (the time of the thread that reads, when it reads: a stream's reader moves it on)."""
    import httpx

    def body(inner: Iterable[bytes]) -> Iterator[bytes]:
        for data in inner:
            until = getattr(_STATE, "until", None)
            if until is not None and time.monotonic() > until:
                raise httpx.ReadTimeout(
                    "the server kept the connection open past the caller's timeout without answering",
                    request=request,
                )
            yield data

    return _rewrap(response, body)


def _install() -> None:
    """Wrap ``httpx.HTTPTransport.handle_request`` once per process (no-op without httpx)."""
    global _installed
    with _INSTALL:
        if _installed:
            return
        _installed = True
        try:
            import httpx
        except ImportError:  # pragma: no cover - litellm depends on httpx
            return
        original = httpx.HTTPTransport.handle_request

        def handle_request(self: httpx.HTTPTransport, request: httpx.Request) -> httpx.Response:
            if not getattr(_STATE, "depth", 0):
                if getattr(_STATE, "until", None) is None:
                    return original(self, request)
                return _timed(original(self, request), request)
            request.headers["Accept-Encoding"] = "identity"
            _STATE.refused = None  # a retry that gets a reply within the limits is no refusal
            _STATE.plain = None
            response = original(self, request)
            return _metered(response, request)

        handle_request.__wrapped__ = original  # type: ignore[attr-defined]
        httpx.HTTPTransport.handle_request = handle_request  # type: ignore[method-assign]


@contextlib.contextmanager
def capped(cancel: threading.Event | None = None, *, streaming: bool = False) -> Iterator[None]:
    """Read every HTTP reply this thread receives within the block through the byte limits; a
    refused reply leaves the block as :class:`ReplyRefused`, whatever exception (or none, when
    a stream reader swallowed it) litellm made of it. Once ``cancel`` is set (by the caller who
    gave the call up), the next bytes received end the read the same way. ``streaming``: the
    call asked for a stream (the limits of a stream apply, and a plain reply is kept for
    :func:`plain_reply`: the stream's reader finds no event in it)."""
    _install()
    depth = getattr(_STATE, "depth", 0)
    outer_cancel = getattr(_STATE, "cancel", None)
    outer_streaming = getattr(_STATE, "streaming", False)
    if not depth:
        _STATE.refused = None
        _STATE.plain = None
    if cancel is not None:
        _STATE.cancel = cancel
    if streaming:
        _STATE.streaming = True
    _STATE.depth = depth + 1
    try:
        yield
    except ReplyRefused:
        raise
    except Exception as exc:
        refused = _STATE.refused if not depth else None
        if refused is not None:
            raise ReplyRefused(str(refused), kind=refused.kind) from exc
        raise
    else:
        refused = _STATE.refused if not depth else None
        if refused is not None:
            raise ReplyRefused(str(refused), kind=refused.kind)
    finally:
        _STATE.depth = depth
        _STATE.cancel = outer_cancel
        _STATE.streaming = outer_streaming


@contextlib.contextmanager
def reading_until(when: float | None) -> Iterator[None]:
    """Within the block, a reply this thread reads (outside :func:`capped`: the caller's own
    model call) fails as ``httpx.ReadTimeout`` at the first bytes that arrive after ``when``
    (``time.monotonic()``; ``None``: no time). httpx's ``timeout`` bounds each read, so a server
    that sends a byte (or a keep-alive comment) now and then never lets it expire."""
    _install()
    outer = getattr(_STATE, "until", None)
    _STATE.until = when
    try:
        yield
    finally:
        _STATE.until = outer


def plain_reply() -> tuple[str, bytes] | None:
    """(content type, body) of the last reply this thread received inside
    ``capped(streaming=True)`` that was a plain body: a server that ignored ``stream`` and
    answered with one JSON completion (``None``: there was none)."""
    plain = getattr(_STATE, "plain", None)
    return None if plain is None else (plain[0], bytes(plain[1]))
