"""Property tests: the invariants of docs/reference/concepts.md hold after `prepare` with every built-in pack, on
generated conversations with random roles, parallel calls, reused ids, orphans, unanswered
calls, huge outputs and images."""

from __future__ import annotations

import base64
import copy
import json
import os
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from invariants import added_fields, id_problems, lost_contents, markers_resolve, pairing_problems, pinned_of

from ctxrules import Engine

BUILTIN_PACKS = ["builtin:default"]


def png(width: int, height: int, seed: int) -> str:
    raw = b"".join(b"\x00" + bytes((seed + x + y) % 256 for x in range(width * 3)) for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    data = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )
    return "data:image/png;base64," + base64.b64encode(data).decode()


TOOLS = ["Bash", "Read", "Edit", "Grep", "Task", "execute_bash", "str_replace_editor", "mcp__x__fetch"]
words = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=60)


@st.composite
def outputs(draw: Any) -> str:
    kind = draw(st.sampled_from(["short", "lines", "json", "huge", "error"]))
    if kind == "short":
        return draw(words)
    if kind == "lines":
        n = draw(st.integers(1, 800))
        return "\n".join(f"{i}: {draw(st.sampled_from(['ok', 'warning: x', 'src/a.py:3 E']))}" for i in range(n))
    if kind == "json":
        n = draw(st.integers(1, 300))
        items = ",".join(f'{{"id": {i}, "name": "item{i}", "tags": ["a", "b"]}}' for i in range(n))
        return '{"items": [' + items + "]}"
    if kind == "huge":
        return ("x" * 99 + "\n") * draw(st.integers(500, 1300))
    return 'Traceback (most recent call last):\n  File "src/x.py", line 3\nValueError: bad\nExit code 1'


@st.composite
def conversations(draw: Any) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    if draw(st.booleans()):
        msgs.append({"role": "system", "content": "You are an agent. " + draw(words)})
    msgs.append({"role": "user", "content": "Please fix src/app.py " + draw(words)})
    id_pool = [f"call_{i}" for i in range(draw(st.integers(1, 6)))]
    for _ in range(draw(st.integers(1, 14))):
        kind = draw(st.sampled_from(["step", "step", "step", "user", "orphan", "reply", "image"]))
        if kind == "user":
            msgs.append({"role": "user", "content": draw(words) or "go on"})
        elif kind == "reply":
            msgs.append({"role": "assistant", "content": draw(words) or "ok", "x_unknown": {"keep": [1, 2]}})
        elif kind == "orphan":
            msgs.append(
                {"role": "tool", "tool_call_id": draw(st.sampled_from([*id_pool, "ghost"])), "content": draw(words)}
            )
        elif kind == "image":
            msgs.append(
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "see this"},
                        {"type": "image_url", "image_url": {"url": png(8, 8, len(msgs))}},
                    ],
                }
            )
        else:
            n = draw(st.integers(1, 3))
            ids = [draw(st.sampled_from(id_pool)) for _ in range(n)]
            calls = [
                {
                    "id": cid,
                    "type": "function",
                    "function": {
                        "name": draw(st.sampled_from(TOOLS)),
                        "arguments": draw(
                            st.sampled_from(
                                ['{"command": "pytest -q"}', '{"file_path": "src/app.py"}', "not json", "{}"]
                            )
                        ),
                    },
                }
                for cid in ids
            ]
            msgs.append(
                {"role": "assistant", "content": draw(st.sampled_from([None, "", "working"])), "tool_calls": calls}
            )
            answered = draw(st.lists(st.sampled_from(ids), max_size=n + 1)) if draw(st.booleans()) else ids
            for cid in answered:
                msgs.append({"role": "tool", "tool_call_id": cid, "content": draw(outputs())})
    return msgs


@pytest.fixture(scope="module")
def engines() -> dict[str, Engine]:
    return {ref: Engine.load(ref) for ref in BUILTIN_PACKS}


@pytest.mark.parametrize("ref", BUILTIN_PACKS)
@settings(
    max_examples=int(os.environ.get("CTXRULES_PROPERTY_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(history=conversations(), window=st.sampled_from([12000, 20000, 64000]))
def test_invariants_hold_for_generated_conversations(
    engines: dict[str, Engine],
    ref: str,
    tmp_path_factory: pytest.TempPathFactory,
    history: list[dict[str, Any]],
    window: int,
) -> None:
    engine = engines[ref]
    session = engine.session(Path(tmp_path_factory.mktemp("s")), model="gpt-4o", window=window)
    frozen = copy.deepcopy(history)
    result = session.prepare(history)
    out = result.messages
    # 5: the caller's objects are untouched.
    assert history == frozen
    # 1: valid pairing; 7: unique ids, JSON arguments; 8: no field ctxrules adds.
    assert pairing_problems(out) == []
    assert id_problems(out) == []
    assert added_fields(frozen, out) == []
    # 2: pinned messages survive unchanged (a hard spill over spill_chars is the one exception).
    spill = 100_000
    for m in pinned_of(frozen):
        text = m.get("content") if isinstance(m.get("content"), str) else ""
        if m.get("role") == "tool" and frozen.count(m) > 1:
            continue  # an identical duplicate result may legitimately be the one dropped
        if len(text) <= spill and not _repaired(m, frozen):
            assert m in out, f"pinned message lost or changed: {str(m)[:200]}"
    # 3: nothing lost; every marker resolves.
    assert lost_contents(frozen, out, session.vault) == []
    assert markers_resolve(out, session.vault) == []
    # 4: the pipeline changes nothing on its own output (same session state and clock).
    again = session.prepare(copy.deepcopy(out))
    assert again.messages == out, (_ran(result.report), _ran(again.report))


def _ran(report: dict[str, Any]) -> list[tuple[Any, ...]]:
    """What each stage did, for the failure message of invariant 4."""
    return [report["before"]["tokens"], report["before"]["tier"]] + [
        (s["id"], s["tokens_before"], s["tokens_after"], [a["kind"] for a in s["actions"]][:4])
        for s in report["stages"]
        if s["ran"] and (s["actions"] or s["tokens_before"] != s["tokens_after"])
    ]


def _repaired(m: dict[str, Any], history: list[dict[str, Any]]) -> bool:
    """Pinned messages the pair repair may legitimately change: orphan/duplicate/renamed
    results and assistant messages with unanswered, id-less or reused-id calls, or arguments
    that are not JSON."""
    if m.get("role") == "tool":
        return True
    if m.get("role") == "assistant" and m.get("tool_calls"):
        ids = [c.get("id") for c in m["tool_calls"]]
        start = history.index(m) + 1
        block = []
        while start < len(history) and history[start].get("role") == "tool":
            block.append(history[start].get("tool_call_id"))
            start += 1
        earlier = {c.get("id") for h in history[: history.index(m)] for c in h.get("tool_calls") or []}
        return (
            sorted(block) != sorted(ids)
            or len(set(ids)) != len(ids)
            or bool(earlier & set(ids))
            or not all(_is_json(c["function"].get("arguments")) for c in m["tool_calls"])
        )
    return False


def _is_json(text: Any) -> bool:
    if not isinstance(text, str):
        return True
    try:
        json.loads(text)
    except ValueError:
        return False
    return True
