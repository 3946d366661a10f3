"""An MCP server (the official ``mcp`` SDK, stdio) that answers the recall tool for a session.

``ctxrules mcp --session DIR`` serves one tool, named and worded by the pack's ``recall:``
(default ``ctxrules_recall``): given the id of a ``[ctxrules:elided ...]`` marker of that
session (and optionally ``lines: "A:B"``), it returns the exact original lines, paged within the
answer budget. An MCP-capable agent (Claude Code, an IDE, any MCP client) can then read back what
ctxrules moved out of its context. The SDK is imported here only: install ``ctxrules[mcp]``.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
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
    exception group) while replies are still due; either ends the serving alike. What the
    client sends reaches the SDK through :func:`_mended_stdin`."""
    restore = _mended_stdin()
    try:
        build_server(session).run("stdio")
    except* (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        restore()


def _mended_stdin() -> Callable[[], None]:
    """Put a pipe in stdin's place, fed line by line from the real stdin with every lone
    surrogate (``"\\ud800"``: valid JSON, and what a JavaScript client sends of a string cut
    inside a character) replaced by U+FFFD. The SDK refuses such a message without answering
    it, and the client waited for its answer for ever. Returns what puts stdin back."""
    try:
        source = os.dup(0)
    except OSError:  # no stdin at all: the SDK says so itself
        return lambda: None
    saved = os.dup(0)
    read_end, write_end = os.pipe()
    os.dup2(read_end, 0)
    os.close(read_end)

    def feed() -> None:
        with (
            contextlib.suppress(OSError, ValueError),  # the server stopped reading: done
            os.fdopen(source, "rb") as given,
            os.fdopen(write_end, "wb") as out,
        ):
            for line in given:
                out.write(_mended(line))
                out.flush()

    helper_thread(feed, "ctxrules-mcp-stdin").start()

    def restore() -> None:
        os.dup2(saved, 0)
        os.close(saved)

    return restore


def _mended(line: bytes) -> bytes:
    """``line`` (one JSON-RPC message) with its lone surrogates replaced
    (:func:`ctxrules.json_limits.scan`), else as it came."""
    if b"\\u" not in line:
        return line
    try:
        found = scan(json.loads(line))
    except (ValueError, RecursionError):  # not JSON: the SDK answers what it can of it
        return line
    if not found.replaced:
        return line
    return json.dumps(found.value, ensure_ascii=False).encode("utf-8") + b"\n"
