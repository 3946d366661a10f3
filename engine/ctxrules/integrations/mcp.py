"""An MCP server (the official ``mcp`` SDK, stdio) that answers the recall tool for a session.

``ctxrules mcp --session DIR`` serves one tool, named and worded by the pack's ``recall:``
(default ``ctxrules_recall``): given the id of a ``[ctxrules:elided ...]`` marker of that
session (and optionally ``lines: "A:B"``), it returns the exact original lines, paged within the
answer budget. An MCP-capable agent (Claude Code, an IDE, any MCP client) can then read back what
ctxrules moved out of its context. The SDK is imported here only: install ``ctxrules[mcp]``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from ctxrules.errors import CtxrulesError
from ctxrules.recall import PARAMETERS, RecallSettings

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
    exception group) while replies are still due; either ends the serving alike."""
    try:
        build_server(session).run("stdio")
    except* (BrokenPipeError, ConnectionResetError):
        pass
