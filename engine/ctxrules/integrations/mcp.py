"""An MCP server (the official ``mcp`` SDK, stdio) that answers the recall tool for a session.

``ctxrules mcp --session DIR`` serves one tool, named and worded by the pack's ``recall:``
(default ``ctxrules_recall``): given the id of a ``[ctxrules:elided ...]`` marker of that
session (and optionally ``lines: "A:B"``), it returns the exact original lines, paged within the
answer budget. An MCP-capable agent (Claude Code, an IDE, any MCP client) can then read back what
ctxrules moved out of its context. The SDK is imported here only: install ``ctxrules[mcp]``.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import math
import os
import re
import select
import socket
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from ctxrules.errors import CtxrulesError
from ctxrules.json_limits import scan
from ctxrules.recall import PARAMETERS, RecallSettings
from ctxrules.threads import helper_thread

if TYPE_CHECKING:
    from ctxrules.engine import Session
    from ctxrules.stores.base import Store

__all__ = ["build_server", "open_session", "serve"]

_EXTRA = 'the MCP server needs the official MCP SDK: pip install "ctxrules[mcp]"'


def _sdk() -> tuple[Any, Any]:
    """``(server class, tool error class)`` of the installed SDK (2.x ``MCPServer``, or 1.x
    ``FastMCP``)."""
    import importlib

    for server_module, server_name, errors_module in (
        ("mcp.server.mcpserver", "MCPServer", "mcp.server.mcpserver.exceptions"),
        ("mcp.server.fastmcp", "FastMCP", "mcp.server.fastmcp.exceptions"),
    ):
        try:
            server = getattr(importlib.import_module(server_module), server_name)
            error = importlib.import_module(errors_module).ToolError
        except (ImportError, AttributeError):
            continue
        return server, error
    raise ImportError(_EXTRA)


def open_session(
    session: str, *, store: Store | str | None = None, pack: str = "builtin:default", model: str = "gpt-4o"
) -> Session:
    """The session the server answers for: a session directory, or (``store``: a Store or a URL
    such as ``redis://host:6379/0``) a session id in that store."""
    from ctxrules.engine import Engine

    engine = Engine.load(pack)
    if store is None:
        return engine.session(Path(session), model=model)
    return engine.session(session, store=store, model=model)


def build_server(session: Session) -> Any:
    """The MCP server object for ``session`` (not started; :func:`open_session` opens one)."""
    server_cls, tool_error = _sdk()
    from pydantic import Field  # the SDK's own dependency: it builds the input schema with it

    settings = RecallSettings.from_pack(session.engine.pack.data)
    server = server_cls(name="ctxrules", instructions=settings.description)
    id_help = PARAMETERS["properties"]["id"]["description"]
    lines_help = PARAMETERS["properties"]["lines"]["description"]

    def recall(id: str, lines: str | None = None) -> str:
        arguments: dict[str, Any] = {"id": id}
        if lines:
            arguments["lines"] = lines
        try:
            return session.recall(arguments)
        except CtxrulesError as exc:  # the call, the vault or the store: the reason is the result
            raise tool_error(str(exc)) from None

    # The arguments' help goes into the tool's input schema, as session.recall_tool() gives it:
    # the SDK builds that schema from the annotations (and reads no docstring when the tool has
    # a description), so without these the model saw two bare strings named Id and Lines.
    recall.__annotations__ = {
        "id": Annotated[str, Field(description=id_help)],
        "lines": Annotated[str | None, Field(description=lines_help)],
        "return": str,
    }
    server.tool(name=settings.name, description=settings.description)(recall)
    return server


def serve(session: Session) -> None:
    """Serve the recall tool of ``session`` on stdin/stdout until the client goes away: it
    closes stdin, or stops reading, which the SDK's writer meets as a broken pipe (in an
    exception group) while replies are still due; either ends the serving alike. The SDK
    reads and writes the wire through :class:`_Wire`."""
    server = build_server(session)
    _sdk_check()  # the SDK imported here, before the wire's threads could import it at once
    wire = _Wire.open()
    try:
        server.run("stdio")
    except* (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        if wire is not None:
            wire.close()


PARSE_ERROR = -32700
"""JSON-RPC 2.0's code for a message that is not JSON (answered with ``"id": null``)."""
INVALID_REQUEST = -32600
"""JSON-RPC 2.0's code for JSON that is not a message (answered with its id, else ``null``)."""

# The longest line (one message) read from the client: a recall call is some 200 bytes, and
# MCP's largest requests (initialize's capabilities) a few kB. A longer one is answered -32600
# and skipped a block at a time: read whole, a line that never ends (`tr -d '\n' < /dev/zero`)
# held all of it in memory, several times over once decoded.
MAX_LINE_BYTES = 16 * 1024 * 1024

_END = b"\0ctxrules-mcp-end\n"  # after the SDK's last reply in the stdout pipe (JSON holds no NUL)

GIVE_UP_S = 10.0
"""How long a client that closed stdin may leave a reply untaken before it is given up on."""


def _nonblocking(fd: int) -> int:
    """A non-blocking descriptor for the pipe at ``fd`` (a new one: the flag is not set on
    the description the client and other processes share), ``fd`` closed; ``fd`` itself when
    it is not a pipe or cannot be opened again (a file: left blocking; a socket, which is
    written without waiting per call instead: :meth:`_Wire._write`)."""
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return fd
        again = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:  # no /proc (not Linux), or no reader left
        return fd
    os.close(fd)
    return again


_POLLRDHUP = getattr(select, "POLLRDHUP", 0)  # Linux


def _socket_at(fd: int) -> socket.socket | None:
    """A socket object on ``fd`` (which it owns from then on) when ``fd`` is a socket."""
    try:
        return socket.socket(fileno=fd) if stat.S_ISSOCK(os.fstat(fd).st_mode) else None
    except OSError:
        return None


class _Wire:
    """Pipes in the place of stdin and stdout, between the client and the SDK, each served by
    a helper thread:

    - what the client sends goes to the SDK line by line, with every lone surrogate
      (``"\\ud800"``: valid JSON, and what a JavaScript client sends of a string cut inside a
      character) replaced by U+FFFD: the SDK refuses such a message without answering it, and
      the client waited for its answer for ever;
    - a line that is not JSON is answered here, with JSON-RPC's parse error (``-32700``,
      ``"id": null``), and not passed on: the SDK logs it and answers nothing; so is JSON the
      SDK's own validator refuses as a message (``{"foo": 1}``, an array, a request whose
      ``params`` is not an object), with ``-32600`` and its id where it has a valid one;
    - what the SDK writes goes to the client a whole line at a time, so such an answer never
      lands inside one of the SDK's (a long one is written in pieces).

    When the client stops reading, the SDK's next write fails as it would on stdout itself
    (the pipe is closed): the serving ends. A client that closed stdin but keeps stdout open
    without reading it is given up on once no reply has moved for ``GIVE_UP_S`` (stdout a
    pipe, as MCP clients start servers, or a socket, as Node.js clients do): the replies still
    due are dropped and the serving ends. Before, the server waited for that client for ever."""

    def __init__(self, saved: tuple[int, int], client: int, end: int) -> None:
        self._saved = saved  # stdin and stdout as they were, to put back
        self._client: int | None = client  # where the answers go: the real stdout
        self._end = end  # the stdout pipe's writing end, for the mark after the SDK's last reply
        self._lock = threading.Lock()
        self._flushed = threading.Event()
        self._hung_up = threading.Event()  # the client closed stdin (or reading it failed)
        self._stdin: int | None = None  # what the client writes to (its far end closed: it hung up)
        # stdout a socket (Node.js clients start servers on socket pairs; /proc cannot open one
        # again): written with MSG_DONTWAIT, so that it too never blocks the wire for ever.
        self._socket = _socket_at(client)
        # Requests passed to the SDK and not answered yet (their ids as JSON text, counted): at
        # the end of stdin the SDK drops what it has not answered, so the end is held back until
        # these are answered (:meth:`_answered`).
        self._pending: collections.Counter[str] = collections.Counter()
        self._progress = threading.Condition()
        self._last_answer = 0.0  # when the SDK last answered one (monotonic)

    @classmethod
    def open(cls) -> _Wire | None:
        """The wire in place (None: stdin or stdout cannot be duplicated, or no pipe can be
        made: the SDK serves them, or says what is wrong, as it would without)."""
        fds: list[int] = []
        try:
            for fd in (0, 1, 0, 1):
                fds.append(os.dup(fd))
            for _ in range(2):
                fds.extend(os.pipe())
        except OSError:
            for fd in fds:
                os.close(fd)
            return None
        saved_in, saved_out, source, client, to_sdk, from_client, from_sdk, to_client = fds
        wire = cls((saved_in, saved_out), _nonblocking(client), os.dup(to_client))
        wire._stdin = source
        os.dup2(to_sdk, 0)
        os.dup2(to_client, 1)
        os.close(to_sdk)
        os.close(to_client)
        helper_thread(wire._inbound, "ctxrules-mcp-stdin", args=(source, from_client)).start()
        helper_thread(wire._outbound, "ctxrules-mcp-stdout", args=(from_sdk,)).start()
        return wire

    def close(self) -> None:
        """After the SDK is done: its last replies out (within 10 s; none when the client
        reads nothing), then stdin and stdout put back."""
        try:
            os.set_blocking(self._end, False)
            os.write(self._end, _END)
        except OSError:  # the pipe is full (the client reads nothing) or closed (it went away)
            pass
        else:
            self._flushed.wait(10)
        os.close(self._end)
        with self._lock:  # nothing goes to the client after this
            self._drop_client()
        for fd, saved in enumerate(self._saved):
            os.dup2(saved, fd)
            os.close(saved)

    def _send(self, data: bytes) -> None:
        """``data`` (whole lines) to the client, alone on the wire while it is written. On a
        non-blocking stdout a full pipe is waited on; once the client has closed stdin, a wait
        of ``GIVE_UP_S`` with nothing taken gives the client up (what is due is dropped)."""
        with self._lock:
            view = memoryview(data)
            stalled: float | None = None
            while view and self._client is not None:
                try:
                    view = view[self._write(self._client, view) :]
                    stalled = None
                    continue
                except BlockingIOError:
                    pass
                if self._hung_up.is_set() or self._stdin_closed():
                    now = time.monotonic()
                    if stalled is None:
                        stalled = now
                    elif now - stalled >= GIVE_UP_S:
                        self._drop_client()
                        break
                writable = select.poll()
                writable.register(self._client, select.POLLOUT)
                writable.poll(200)  # ms

    def _write(self, fd: int, data: memoryview) -> int:
        """Write what ``fd`` takes of ``data`` now (BlockingIOError: nothing, it is full)."""
        if self._socket is not None:
            return self._socket.send(data, socket.MSG_DONTWAIT)
        return os.write(fd, data)

    def _drop_client(self) -> None:
        """Close the client's stdout (the caller holds the lock)."""
        if self._socket is not None:
            self._socket.close()  # its descriptor is ``_client``
            self._socket = None
        elif self._client is not None:
            os.close(self._client)
        self._client = None

    def _asked(self, asked: tuple[str, bool] | None) -> None:
        """Note a request passed to the SDK (``(id, True)``), or a cancellation of one
        (``(id, False)``: MCP answers no cancelled request)."""
        if asked is None:
            return
        key, request = asked
        with self._progress:
            if request:
                self._pending[key] += 1
            elif self._pending[key] > 0:
                self._pending[key] -= 1
            self._progress.notify_all()

    def _answer(self, line: bytes) -> None:
        """Note the answer ``line`` carries, if it is one (a reply of the SDK's to a request)."""
        key = _answered_id(line)
        if key is None:
            return
        with self._progress:
            if self._pending[key] > 0:
                self._pending[key] -= 1
            self._last_answer = time.monotonic()
            self._progress.notify_all()

    def _answered(self) -> None:
        """At the end of stdin: wait until every request passed to the SDK is answered (the
        SDK cancels what is in flight when its input ends, and the client that sent its calls
        and closed stdin, ``ctxrules mcp < calls.jsonl``, never got their answers), as long as
        answers keep coming: ``GIVE_UP_S`` without one ends the wait."""
        with self._progress:
            last = time.monotonic()
            while +self._pending and not self._flushed.is_set():
                last = max(last, self._last_answer)
                left = last + GIVE_UP_S - time.monotonic()
                if left <= 0:
                    return
                self._progress.wait(min(left, 0.2))

    def _stdin_closed(self) -> bool:
        """Whether the client closed stdin, told by the pipe itself: the reading thread may be
        waiting to send an answer of its own (behind the reply that does not move) with the
        client's last lines unread."""
        fd = self._stdin
        if fd is None:
            return False
        poller = select.poll()
        # A pipe's writer gone is POLLHUP; a socket's peer that shut down its writing only
        # (Node.js's ``stdin.end()``), POLLRDHUP.
        closed = select.POLLHUP | select.POLLERR | select.POLLNVAL | _POLLRDHUP
        poller.register(fd, select.POLLIN | _POLLRDHUP)
        return any(events & closed for _, events in poller.poll(0))

    def _inbound(self, source: int, sdk: int) -> None:
        try:
            self._relay(source, sdk)
        finally:
            self._hung_up.set()

    def _relay(self, source: int, sdk: int) -> None:
        with (
            contextlib.suppress(OSError, ValueError),  # the server stopped reading: done
            os.fdopen(source, "rb") as given,
            os.fdopen(sdk, "wb") as out,
        ):
            try:
                while line := given.readline(MAX_LINE_BYTES + 1):
                    if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                        while (rest := given.readline(1 << 20)) and not rest.endswith(b"\n"):
                            pass  # the rest of the line, never held
                        with contextlib.suppress(OSError):
                            self._send(_Refused(INVALID_REQUEST, _TOO_LONG).reply())
                        continue
                    read, asked = _read_line(line)
                    if isinstance(read, _Refused):  # not passed on: answered here
                        with contextlib.suppress(OSError):  # the client stopped reading: the SDK sees it too
                            self._send(read.reply())
                        continue
                    self._asked(asked)
                    out.write(line if read is None else read)
                    out.flush()
            finally:
                self._hung_up.set()  # before stdin's descriptor is closed (its number is reused)
            self._answered()

    def _outbound(self, sdk: int) -> None:
        try:
            with os.fdopen(sdk, "rb") as replies:
                for line in replies:
                    if line.endswith(_END):
                        self._send(line[: -len(_END)])
                        break
                    try:
                        self._send(line)
                    finally:
                        self._answer(line)
        except OSError:  # the client stopped reading: the pipe closes, and the SDK's writes fail
            pass
        finally:
            self._flushed.set()


_TOO_LONG = f"Invalid Request: a message longer than {MAX_LINE_BYTES >> 20} MiB (not read)"


@dataclass(frozen=True)
class _Refused:
    """A line the client sent that does not go to the SDK: answered with JSON-RPC's ``code``."""

    code: int
    message: str
    id: str | int | float | None = None

    def reply(self) -> bytes:
        error = {"code": self.code, "message": self.message}
        return json.dumps({"jsonrpc": "2.0", "id": self.id, "error": error}).encode() + b"\n"


def _read_line(line: bytes) -> tuple[bytes | _Refused | None, tuple[str, bool] | None]:
    """What to do with ``line`` (one JSON-RPC message): ``None``, pass it on as it came;
    bytes, pass these on instead (its lone surrogates replaced, see
    :func:`ctxrules.json_limits.scan`); :class:`_Refused`, answer it. Read as the SDK reads it
    (UTF-8, a bad byte replaced); a blank line is passed on (the SDK skips it). With it, for a
    line passed on, the id of the request it makes (``(id, True)``) or cancels (``(id, False)``)
    as JSON text, else None."""
    text = line.decode("utf-8", "replace").rstrip("\r\n")
    if not text.strip():
        return None, None
    try:
        value = json.loads(text, strict=False)
    except RecursionError:  # JSON, nested past what Python reads: the SDK answers what it can
        return None, None
    except ValueError as exc:
        return _Refused(PARSE_ERROR, f"Parse error: the message is not JSON ({exc})"), None
    passed: bytes | None = None
    if "\\u" in text:
        found = scan(value)
        if found.replaced:
            passed = json.dumps(found.value, ensure_ascii=False).encode("utf-8") + b"\n"
    if _is_response(value):
        return passed, None  # a bad response from the client is not answered (JSON-RPC answers requests)
    if _is_message(passed.decode("utf-8") if passed is not None else text):
        if _bad_request_id(value):
            # The SDK reads a request whose id MCP does not allow (null, true, 5.0) as a
            # notification, and a notification gets no answer: the client waited for ever.
            why = "Invalid Request: an id must be a string or an integer"
            return _Refused(INVALID_REQUEST, why, _request_id(value)), None
        return passed, _asks(value)
    try:
        json.loads(text)  # strictly: a raw control character in a string is not JSON
    except ValueError as exc:
        return _Refused(PARSE_ERROR, f"Parse error: the message is not JSON ({exc})"), None
    except RecursionError:
        pass
    return _Refused(INVALID_REQUEST, "Invalid Request: not a JSON-RPC 2.0 message", _request_id(value)), None


def _asks(value: object) -> tuple[str, bool] | None:
    """For a message the SDK takes: the id of the request it makes, or of the one it cancels
    (``notifications/cancelled``), as JSON text."""
    if not isinstance(value, dict) or not isinstance(value.get("method"), str):
        return None
    if "id" in value:
        return json.dumps(value["id"]), True
    params = value.get("params")
    if value["method"] == "notifications/cancelled" and isinstance(params, dict) and "requestId" in params:
        found = params["requestId"]
        if isinstance(found, str) or (isinstance(found, int) and not isinstance(found, bool)):
            return json.dumps(found), False
    return None


# How the SDK starts an answer (pydantic writes the fields in order: jsonrpc, id, result|error).
_ANSWER = re.compile(rb'\{"jsonrpc":"2\.0","id":("(?:[^"\\]|\\.)*"|-?\d+),"(?:result|error)"')


def _answered_id(line: bytes) -> str | None:
    """The id (JSON text) of the request ``line`` answers, when it is an answer of the SDK's."""
    found = _ANSWER.match(line)
    if found is None:
        return None
    try:
        return json.dumps(json.loads(found.group(1)))  # one spelling for each id
    except ValueError:
        return None


def _is_response(value: object) -> bool:
    """Whether ``value`` is meant as a response (to a request of the server's): no method, a
    result or an error. One the SDK refuses is still not answered: the answer would carry the
    id of one of the server's own requests, which the client could take for its own."""
    return isinstance(value, dict) and "method" not in value and ("result" in value or "error" in value)


def _request_id(value: object) -> str | int | float | None:
    """The id of a message refused as invalid, where it has one JSON-RPC allows (a string or
    a number, else null): the client matches the answer to what it sent."""
    found = value.get("id") if isinstance(value, dict) else None
    if isinstance(found, str) or (isinstance(found, int) and not isinstance(found, bool)):
        return found
    return found if isinstance(found, float) and math.isfinite(found) else None


def _bad_request_id(value: object) -> bool:
    """Whether ``value`` is a request (a method and an id) whose id MCP refuses: only a string
    or an integer may name a request (JSON-RPC allows null and any number too)."""
    if not isinstance(value, dict) or "method" not in value or "id" not in value:
        return False
    found = value["id"]
    return not (isinstance(found, str) or (isinstance(found, int) and not isinstance(found, bool)))


def _is_message(text: str) -> bool:
    """Whether the SDK takes ``text`` for a JSON-RPC message (it validates each line so, and
    drops one it refuses without an answer). Its own validator: never a second opinion."""
    check = _sdk_check()
    if check is None:
        return True
    try:
        check(text)
    except RecursionError:  # nested past what the validator reads: the SDK's to answer
        return True
    except Exception:  # pydantic's ValidationError, or the SDK's JSON parser refusing it
        return False
    return True


@functools.cache
def _sdk_check() -> Callable[[str], object] | None:
    """How the installed SDK validates a line read from stdin: 2.x's ``jsonrpc_message_adapter``,
    1.x's ``JSONRPCMessage`` model; None when it has neither (every line is passed on)."""
    try:
        from mcp import types
    except ImportError:
        return None
    adapter = getattr(types, "jsonrpc_message_adapter", None)
    if adapter is not None:
        return functools.partial(adapter.validate_json, by_name=False)
    model = getattr(types, "JSONRPCMessage", None)
    validate = getattr(model, "model_validate_json", None)
    return validate if callable(validate) else None
