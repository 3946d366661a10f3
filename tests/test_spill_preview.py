"""Spill and reduce previews follow the structure of single-line JSON (what MCP tools answer
with): the skeleton within the budget, not a preview that is only the marker."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from ctxrules import Engine
from ctxrules.stages.reduce import spill_summary, text_vault_id
from ctxrules.vault import parse_markers


def mcp_search_result(min_chars: int = 138_000, seed: int = 7) -> str:
    """A GitHub-search-like MCP answer, minified on one line, at least ``min_chars`` long."""
    rnd = random.Random(seed)
    words = ["the", "compiler", "crashes", "when", "a", "match", "arm", "binds", "a", "nested", "tuple", "pattern"]
    items: list[dict[str, Any]] = []
    while True:
        i = len(items) + 1
        items.append(
            {
                "id": 1000 + i,
                "number": i,
                "title": f"Parser fails on nested match arm {i}",
                "state": rnd.choice(["open", "closed"]),
                "labels": [{"name": "bug", "color": "d73a4a"}, {"name": rnd.choice(["parser", "codegen"])}],
                "user": {"login": f"user{rnd.randint(1, 99)}", "type": "User"},
                "body": " ".join(rnd.choice(words) for _ in range(60)),
                "comments": rnd.randint(0, 40),
            }
        )
        text = json.dumps({"total_count": 4821, "incomplete_results": False, "items": items}, separators=(",", ":"))
        if len(text) >= min_chars:
            return text


@pytest.fixture
def session(tmp_path: Path) -> Any:
    return Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o")


def test_session_spill_of_minified_json_previews_its_skeleton(session: Any) -> None:
    text = mcp_search_result()
    assert "\n" not in text and len(text) > 138_000
    out = session.spill(text, kind="mcp")
    assert out.format == "json" and out.tokens_after <= 2500 and out.tokens_before > 20 * out.tokens_after
    marker_line, body = out.preview.split("\n", 1)
    marker = parse_markers(marker_line)[0]
    assert marker.kind == "json" and marker.vault_id == out.vault_id and marker.extra["source"] == "mcp"
    assert session.vault.get_text(out.vault_id) == text
    skeleton = json.loads(body)  # the preview is valid JSON
    assert skeleton["total_count"] == 4821
    first = skeleton["items"][0]
    assert first["title"] == "Parser fails on nested match arm 1" and first["user"]["login"].startswith("user")
    assert any(isinstance(x, str) and x.endswith("more items") for x in skeleton["items"])


def test_a_bigger_budget_gives_a_richer_skeleton_and_every_one_fits(session: Any) -> None:
    text = mcp_search_result()
    shown = []
    for budget in (300, 800, 2500, 6000):
        out = session.spill(text, kind="mcp", preview_tokens=budget)
        assert out.tokens_after <= budget, budget
        skeleton = json.loads(out.preview.split("\n", 1)[1])
        shown.append(sum(isinstance(x, dict) for x in skeleton["items"]))
    assert shown == sorted(shown) and shown[-1] > shown[0] >= 1


def test_one_huge_line_of_text_keeps_its_head_and_tail_characters(session: Any) -> None:
    text = "BEGIN " + "data " * 40_000 + "END-OF-LOG"
    out = session.spill(text, kind="log", preview_tokens=300)
    assert out.tokens_after <= 300 and out.format == "text"
    assert out.preview.startswith("BEGIN data") and "END-OF-LOG" in out.preview
    assert parse_markers(out.preview)[0].vault_id == out.vault_id


def test_spill_takes_bytes_and_refuses_other_types(session: Any) -> None:
    raw = b"\xff\xfe not utf-8 \n" + b"line\n" * 5000
    out = session.spill(raw, kind="hook", preview_tokens=200)
    assert session.vault.get(out.vault_id) == raw  # stored byte-identical
    assert out.tokens_after <= 200 and "\ufffd" in out.preview
    assert session.spill(b"short", kind="hook").preview == "short"
    for bad in (42, None, ["a"]):
        with pytest.raises(TypeError, match="spill\\(\\) takes the output as str or bytes, got"):
            session.spill(bad)


def test_spill_summary_of_minified_json_shows_the_item_shape(session: Any) -> None:
    text = mcp_search_result()
    summary, fmt = spill_summary(
        text, vault_id=text_vault_id(text), count=session.counter.count_text, preview_tokens=1000
    )
    assert fmt == "json" and session.counter.count_text(summary) <= 1100
    preview = json.loads(summary.splitlines()[2])
    assert preview["items"][0]["title"].startswith("Parser fails")


def test_prepare_spills_a_huge_mcp_answer_with_its_skeleton(session: Any) -> None:
    text = mcp_search_result(160_000)
    history = [
        {"role": "system", "content": "You triage issues."},
        {"role": "user", "content": "Find parser bugs."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "github_search", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": text},
        {"role": "assistant", "content": "Found them."},
        {"role": "user", "content": "Thanks, now fix the first."},
    ]
    out = session.prepare(history)
    tool = next(m for m in out.messages if m["role"] == "tool")
    assert len(tool["content"]) < 20_000
    assert '"title":"Parser fails on nested match arm 1"' in tool["content"]
