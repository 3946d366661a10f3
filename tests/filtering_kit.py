"""Helpers for the tests of the filtering stages (thinking, media, tool output, ttl).

Builds a real :class:`StageContext` (token counter, budget, vault) so stages can be driven
directly, plus small message builders and independent checks of what a marker points to.
"""

from __future__ import annotations

import base64
import json
import re
import struct
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import structlog

from ctxrules.models import lookup_model
from ctxrules.pipeline.budget import Budget
from ctxrules.pipeline.context import StageContext
from ctxrules.plugins import default_registry
from ctxrules.tokens import TokenCounter
from ctxrules.vault import Vault

Msg = dict[str, Any]

DEFAULT_PACK = {
    "tools": {
        "roles": {
            "shell": ["Bash", "bash", "execute_bash"],
            "file_read": ["Read"],
            "file_edit": ["Edit", "Write", "str_replace_editor"],
            "subagent": ["Task", "TaskOutput"],
            "search": ["Grep"],
            "mcp": ["mcp__*"],
        },
        "exit_code": [r"Exit code:? (\d+)"],
    },
}

MARKER = re.compile(r"\[ctxrules:elided [^\]]*?ref=vault://([0-9a-f]{64})(?:#L(\d+)-L(\d+))?[^\]]*\]")


def make_ctx(
    tmp_path: Path,
    *,
    model: str = "gpt-4o",
    window: int = 128_000,
    utilization: float | None = None,
    tier: str = "below",
    cache_hot: bool = False,
    state: dict[str, Any] | None = None,
    pack: dict[str, Any] | None = None,
    protected: Iterable[int] = (),
    clock: float = 1_700_000_000.0,
    hooks: Any = None,
) -> StageContext:
    info = lookup_model(model, window=window)
    counter = TokenCounter.for_model(info)
    budget = Budget(window=window, reserve_output=8192)
    return StageContext(
        stage_id="test",
        model=info,
        counter=counter,
        budget=budget,
        vault=Vault.for_session(tmp_path / "session"),
        tools=[],
        pack=DEFAULT_PACK if pack is None else pack,
        log=structlog.get_logger(),
        tier=tier,
        utilization=0.0 if utilization is None else utilization,
        state={} if state is None else state,
        protected=set(protected),
        clock=clock,
        cache_hot=cache_hot,
        hooks=hooks,
        registry=default_registry(),
    )


def call(cid: str, name: str = "Bash", **arguments: Any) -> Msg:
    return {
        "id": cid,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments or {"command": "ls"})},
    }


def step(cid: str, output: str, name: str = "Bash", **arguments: Any) -> list[Msg]:
    """An assistant message with one call and its result."""
    return [
        {"role": "assistant", "content": None, "tool_calls": [call(cid, name, **arguments)]},
        {"role": "tool", "tool_call_id": cid, "content": output},
    ]


def user(text: str = "go on") -> Msg:
    return {"role": "user", "content": text}


def png_bytes(width: int, height: int, seed: int = 0) -> bytes:
    """A real, decodable PNG (RGB, 8 bit) built with zlib and struct."""
    raw = b"".join(b"\x00" + bytes((seed + x * 7 + y * 13) % 256 for x in range(width * 3)) for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64," + base64.b64encode(data).decode("ascii")


def text_of(msg: Msg) -> str:
    content = msg.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def marker_refs(messages: Iterable[Msg]) -> list[tuple[str, tuple[int, int] | None]]:
    """Every marker ref in the messages' text, found with an independent regex."""
    refs: list[tuple[str, tuple[int, int] | None]] = []
    for msg in messages:
        for match in MARKER.finditer(text_of(msg)):
            lines = (int(match.group(2)), int(match.group(3))) if match.group(2) else None
            refs.append((match.group(1), lines))
    return refs


def assert_markers_resolve(messages: Iterable[Msg], vault: Vault) -> int:
    """Every marker's ref exists (and its line range is inside the entry); returns how many."""
    n = 0
    for vid, lines in marker_refs(messages):
        data = vault.get(vid)
        if lines is not None:
            assert vault.get_lines(vid, *lines), (vid, lines)
        assert data or lines is None
        n += 1
    return n


def original_lines(text: str) -> list[str]:
    """Lines as the vault counts them (split after each newline), independently written."""
    out, start = [], 0
    while True:
        end = text.find("\n", start)
        if end < 0:
            if start < len(text):
                out.append(text[start:])
            return out
        out.append(text[start : end + 1])
        start = end + 1
