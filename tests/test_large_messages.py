"""A message far larger than the window: counted by a bound past the window (never tokenized
to its end), spilled whole to the vault, and previewed without splitting it into lines."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from ctxrules.engine import Engine
from ctxrules.models import lookup_model
from ctxrules.stages.reduce import PARSE_CHARS, spill_summary, text_vault_id
from ctxrules.stages.reduce.text_lines import LineIndex, text_lines
from ctxrules.tokens import TokenCounter, token_ceiling
from ctxrules.vault import Vault, parse_markers


def _log(lines: int) -> str:
    return "".join(f"2026-12-01T10:00:00Z INFO worker[{i % 8}] item {i} status=ok\n" for i in range(lines))


@pytest.fixture
def counter() -> TokenCounter:
    return TokenCounter(lookup_model("gpt-4o").tokenizer)  # a private instance: its own memo


def test_a_text_over_the_ceiling_counts_an_upper_bound_and_one_under_it_its_exact_count(
    counter: TokenCounter,
) -> None:
    text = _log(60_000)  # ~3.5 MB, about a million tokens
    exact = counter.count_text(text)
    part = text[:100_000]  # over CHUNK_CHARS, under the ceiling
    exact_part = counter.count_text(part)
    with token_ceiling(50_000):
        bound = counter.count_text(text)
        assert counter.count_text(part) == exact_part
    assert bound >= exact > 50_000
    assert bound <= len(text.encode())  # what the rest counts is its byte length
    with token_ceiling(10 * exact):  # a window it fits: exact again
        assert counter.count_text(text) == exact


def test_a_bound_is_remembered_for_its_ceiling_only(counter: TokenCounter) -> None:
    message = {"role": "tool", "tool_call_id": "c", "content": _log(60_000)}
    exact = counter.count_message(message)
    counter.clear_memo()
    with token_ceiling(50_000):
        bound = counter.count_message(message)
        assert counter.count_message(message) == bound
    assert bound > exact
    assert counter.count_message(message) == exact  # outside the scope: the exact count


def test_only_about_a_window_of_the_text_is_tokenized(counter: TokenCounter) -> None:
    seen: list[int] = []
    counter.count_text("warm up")
    backend = counter._count_batch
    assert backend is not None

    def recording(texts: list[str]) -> list[int]:
        seen.append(sum(map(len, texts)))
        return backend(texts)

    counter._count_batch = recording
    text = _log(200_000)  # ~12 MB
    with token_ceiling(32_000):
        counter.count_text(text)
    assert sum(seen) < 3 * 1024 * 1024  # a 1 MB group or two past 32K tokens, not 12 MB


@pytest.mark.parametrize(
    "text", ["", "a", "a\n", "a\n\nb", "x\r\ny\r\n", "\n\n\n", "line\n" * 10 + "tail", "é\u2028z\nq"]
)
def test_line_index_is_text_lines(text: str) -> None:
    index = LineIndex(text)
    assert list(index) == text_lines(text)
    assert len(index) == len(text_lines(text))
    if len(index):
        assert index[-1] == text_lines(text)[-1]
        assert index[1:3] == text_lines(text)[1:3]


def test_a_huge_json_document_is_previewed_by_its_ends_not_parsed(counter: TokenCounter) -> None:
    items = [{"id": i, "name": f"item {i}", "tags": ["a", "b"]} for i in range(PARSE_CHARS // 40)]
    text = json.dumps(items, separators=(",", ":"))
    assert len(text) > PARSE_CHARS
    preview, fmt = spill_summary(
        text, vault_id=text_vault_id(text), count=counter.count_text, preview_tokens=2500, what="tool output"
    )
    assert fmt == "json"
    assert preview.splitlines()[0].endswith("format=json]")
    assert '{"id":0,' in preview and f'"item {len(items) - 1}"' in preview
    assert counter.count_text(preview) <= 2600


def test_a_50_mb_class_tool_result_is_spilled_whole_and_resolves(tmp_path: Path) -> None:
    content = _log(200_000)  # ~12 MB: over any gpt-4o window
    messages = [
        {"role": "user", "content": "Run the job."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "Bash", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": content},
        {"role": "user", "content": "What failed?"},
    ]
    engine = Engine.load("builtin:default")
    session = engine.session(tmp_path / "s", model="gpt-4o", window=32_000)
    result = session.prepare(messages)
    spilled = result.messages[2]["content"]
    assert len(spilled) < 20_000
    marker = parse_markers(spilled)[0]
    assert Vault.for_session(tmp_path / "s").get_text(marker.vault_id) == content
    assert result.report["after"]["fits"]
    # the compaction backup holds the input byte for byte as json.dumps writes it
    backup = hashlib.sha256(json.dumps(messages, ensure_ascii=False).encode()).hexdigest()
    assert backup in Vault.for_session(tmp_path / "s").list_ids()
