"""Token counting: agreement with litellm.token_counter, memo, images, offline loading."""

from __future__ import annotations

import base64
import copy
import json
import os
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from conftest import TRANSCRIPTS, transcript_paths

from ctxrules.errors import CtxrulesError
from ctxrules.models import lookup_model
from ctxrules.tokens import (
    ANTHROPIC_MAX_IMAGE_TOKENS,
    CHUNK_CHARS,
    OPAQUE_MEDIA_TOKENS,
    OPENAI_UNKNOWN_IMAGE_TOKENS,
    TokenCounter,
    anthropic_image_tokens,
    image_size,
    image_size_from_url,
    openai_image_tokens,
    render_openai_functions,
)

REPO = Path(__file__).resolve().parents[1]
ENGINE = REPO / "engine"

TRANSCRIPT_FILES = transcript_paths()

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "Bash",
            "description": "Executes a bash command in a persistent shell session.",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "The command to execute"},
                    "timeout": {"type": "number", "description": "Optional timeout in ms"},
                    "run_in_background": {"type": "boolean"},
                },
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "Read",
            "description": "Reads a file from the local filesystem.",
            "parameters": {
                "type": "object",
                "properties": {
                    "file_path": {"type": "string", "description": "Absolute path"},
                    "offset": {"type": "integer"},
                    "limit": {"type": "integer"},
                },
                "required": ["file_path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "Edit",
            "description": "Performs exact string replacements in files.",
            "parameters": {
                "type": "object",
                "properties": {
                    "file_path": {"type": "string"},
                    "old_string": {"type": "string", "description": "The text to replace"},
                    "new_string": {"type": "string"},
                    "replace_all": {"type": "boolean", "description": "Replace every match"},
                },
                "required": ["file_path", "old_string", "new_string"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "Grep",
            "description": "Searches file contents with ripgrep.",
            "parameters": {
                "type": "object",
                "properties": {
                    "pattern": {"type": "string"},
                    "output_mode": {
                        "type": "string",
                        "enum": ["content", "files_with_matches", "count"],
                    },
                    "glob": {"type": "string"},
                    "-n": {"type": "boolean"},
                },
                "required": ["pattern"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "TodoWrite",
            "description": "Create and manage a structured task list.",
            "parameters": {
                "type": "object",
                "properties": {
                    "todos": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "content": {"type": "string"},
                                "status": {
                                    "type": "string",
                                    "enum": ["pending", "in_progress", "completed"],
                                },
                                "priority": {"type": "integer", "enum": [1, 2, 3]},
                            },
                            "required": ["content", "status"],
                        },
                    }
                },
                "required": ["todos"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "ExitPlanMode",
            "description": "Leave plan mode.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
]


def load(path: Path) -> list[dict[str, Any]]:
    data = json.loads(path.read_text("utf-8"))
    assert isinstance(data, list)
    return data


@pytest.fixture(scope="module")
def litellm() -> Iterator[ModuleType]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        import litellm as module

        yield module


def run_python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PYTHONPATH": str(ENGINE), **(env or {})}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ, check=False)


# --------------------------------------------------------------------------- tiny images


def png_bytes(width: int, height: int) -> bytes:
    """A valid 1-bit grayscale PNG (all black)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    row = b"\x00" + b"\x00" * ((width + 7) // 8)
    pixels = zlib.compress(row * height, 9)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def jpeg_bytes(width: int, height: int) -> bytes:
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    dqt = b"\xff\xdb" + struct.pack(">H", 67) + b"\x00" + bytes(64)
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, height, width, 3) + bytes(9)
    return b"\xff\xd8" + app0 + dqt + b"\xff" + sof + b"\xff\xda\x00\x02" + b"\xff\xd9"


def gif_bytes(width: int, height: int) -> bytes:
    return b"GIF89a" + struct.pack("<HH", width, height) + b"\x00\x00\x00" + b";"


def webp_bytes(width: int, height: int, kind: str) -> bytes:
    if kind == "VP8X":
        body = b"\x00\x00\x00\x00" + (width - 1).to_bytes(3, "little")
        body += (height - 1).to_bytes(3, "little")
    elif kind == "VP8L":
        bits = (width - 1) | ((height - 1) << 14)
        body = b"\x2f" + bits.to_bytes(4, "little") + b"\x00"
    else:
        body = b"\x00\x00\x00" + b"\x9d\x01\x2a" + struct.pack("<HH", width, height)
    chunk = kind.encode().ljust(4) + struct.pack("<I", len(body)) + body
    return b"RIFF" + struct.pack("<I", 4 + len(chunk)) + b"WEBP" + chunk


def data_url(data: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64," + base64.b64encode(data).decode()


def image_message(url: str, detail: str | None = None) -> dict[str, Any]:
    image: dict[str, Any] = {"url": url}
    if detail is not None:
        image["detail"] = detail
    return {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": image},
        ],
    }


# --------------------------------------------------------------------------- litellm agreement


@pytest.mark.corpus
@pytest.mark.parametrize("model", ["gpt-4o", "gpt-4"])
@pytest.mark.parametrize("path", TRANSCRIPT_FILES, ids=lambda p: p.stem)
def test_corpus_agrees_with_litellm(path: Path, model: str, litellm: ModuleType) -> None:
    messages = load(path)
    counter = TokenCounter.for_model(lookup_model(model))
    assert not counter.is_estimate and counter.safety_margin == 0.0
    ours = counter.count_messages(messages)
    reference = litellm.token_counter(model=model, messages=messages)
    assert abs(ours - reference) / reference < 0.01, (ours, reference)

    ours_tools = counter.count_messages(messages, tools=TOOLS)
    reference_tools = litellm.token_counter(model=model, messages=messages, tools=TOOLS)
    assert abs(ours_tools - reference_tools) / reference_tools < 0.01
    assert ours_tools - ours == reference_tools - reference  # schema accounting is the same


@pytest.mark.corpus
def test_corpus_is_present() -> None:
    assert len(TRANSCRIPT_FILES) >= 20


@pytest.mark.parametrize("model", ["gpt-4o", "gpt-4"])
def test_short_messages_agree_exactly(model: str, litellm: ModuleType) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful coding agent."},
        {"role": "user", "content": "Fix the failing test, please.", "name": "alice"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "The test fails on import; look at conftest first.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "Bash", "arguments": '{"command": "pytest -x"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "Read", "arguments": '{"file_path": "/a/b.py"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "1 failed\nExit code 1"},
        {"role": "tool", "tool_call_id": "call_2", "content": "import os\nprint(os.sep)\n"},
        {"role": "assistant", "content": [{"type": "text", "text": "Found it: a typo."}]},
    ]
    counter = TokenCounter.for_model(lookup_model(model))
    assert counter.count_messages(messages) == litellm.token_counter(model=model, messages=messages)
    for with_system in (messages, messages[1:]):
        expected = litellm.token_counter(model=model, messages=with_system, tools=TOOLS)
        assert counter.count_messages(with_system, tools=TOOLS) == expected


def test_tool_schema_discount_for_system_message() -> None:
    counter = TokenCounter.for_tokenizer("o200k_base")
    alone = counter.count_tools(TOOLS)
    assert counter.count_tools(TOOLS, has_system_message=True) == alone - 4
    assert counter.count_tools([]) == 0
    assert counter.count_tools(None) == 0


def test_openai_function_rendering() -> None:
    text = render_openai_functions([TOOLS[0]["function"], TOOLS[5]["function"]])
    assert text.startswith("namespace functions {\n\n// Executes a bash command")
    assert "type Bash = (_: {\n// The command to execute\ncommand: string," in text
    assert "timeout?: number," in text
    assert "type ExitPlanMode = () => any;" in text
    assert text.endswith("} // namespace functions")
    nested = render_openai_functions([TOOLS[4]["function"]])
    assert 'status: "pending" | "in_progress" | "completed",' in nested
    assert "todos: {\n" in nested and "}[]," in nested


def test_anthropic_shaped_tools_are_counted() -> None:
    anthropic_tools = [
        {
            "name": t["function"]["name"],
            "description": t["function"]["description"],
            "input_schema": t["function"]["parameters"],
        }
        for t in TOOLS
    ]
    for tokenizer in ("o200k_base", "anthropic", "deepseek"):
        counter = TokenCounter.for_tokenizer(tokenizer)  # type: ignore[arg-type]
        assert counter.count_tools(anthropic_tools) == counter.count_tools(TOOLS)


# --------------------------------------------------------------------------- memo


@pytest.mark.corpus
def test_memo_serves_unchanged_messages() -> None:
    counter = TokenCounter("o200k_base")
    messages = load(TRANSCRIPTS / "claudecode-ae4a77f8.json")
    first = counter.count_messages(messages)
    assert counter.memo_misses == len(messages)
    assert counter.memo_hits == 0
    tokenized = counter.texts_tokenized

    assert counter.count_messages(messages) == first
    assert counter.memo_misses == len(messages)
    assert counter.memo_hits == len(messages)
    assert counter.texts_tokenized == tokenized

    # equal messages that are different objects (re-read from disk) are hits too
    assert counter.count_messages(load(TRANSCRIPTS / "claudecode-ae4a77f8.json")) == first
    assert counter.texts_tokenized == tokenized

    extra = {"role": "user", "content": "Now run the whole test suite."}
    longer = [*messages, extra]
    assert counter.count_messages(longer) == first + counter.count_message(extra)
    assert counter.memo_misses == len(messages) + 1
    assert counter.texts_tokenized == tokenized + 2  # the new message's role and content only


def test_fields_that_do_not_count_keep_the_memo() -> None:
    counter = TokenCounter("cl100k_base")
    message: dict[str, Any] = {
        "role": "user",
        "content": [{"type": "text", "text": "Summarize the diff."}],
    }
    base = counter.count_message(message)
    decorated = copy.deepcopy(message)
    decorated["content"][0]["cache_control"] = {"type": "ephemeral"}
    decorated["metadata"] = {"ctxrules": {"kind": "summary", "refs": ["a", {"b": [1, 2.5]}]}}
    decorated["unknown_list"] = [{"x": {"y": [True, None]}}]
    misses = counter.memo_misses
    assert counter.count_message(decorated) == base
    assert counter.memo_misses == misses

    changed = copy.deepcopy(decorated)
    changed["content"][0]["text"] = "Summarize the diff in detail."
    assert counter.count_message(changed) > base
    assert counter.memo_misses == misses + 1


def test_exotic_shapes_are_counted_without_errors() -> None:
    counter = TokenCounter("o200k_base")
    message = {
        "role": "assistant",
        "content": [
            {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls -la"}},
            {
                "type": "tool_result",
                "tool_use_id": "t1",
                "content": [{"type": "text", "text": "ok"}],
            },
            {"type": "custom", "payload": {"nested": ["alpha", {"deep": "beta"}]}},
            "a bare string part",
        ],
        "tool_calls": [{"id": "c1", "function": {"name": "Bash", "arguments": {"cmd": "ls"}}}],
        "function_call": {"name": "legacy", "arguments": '{"a": 1}'},
        "weird": {1, 2},  # not JSON at all: falls back to a repr-based key, still not counted
    }
    first = counter.count_message(message)
    assert first > 20
    assert counter.count_message(message) == first
    assert counter.memo_hits == 1


@pytest.mark.parametrize("tokenizer", ["o200k_base", "anthropic"])
@pytest.mark.parametrize(
    "part",
    [
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "PAYLOAD"}},
        {"type": "input_audio", "input_audio": {"data": "PAYLOAD", "format": "wav"}},
        {"type": "file", "file": {"file_data": "data:application/pdf;base64,PAYLOAD"}},  # as before
    ],
    ids=["anthropic-base64-document", "input-audio", "data-url"],
)
def test_an_inline_base64_payload_counts_flat_not_as_text(tokenizer: str, part: dict[str, Any]) -> None:
    """A PDF sent as an Anthropic base64 document (or audio as an ``input_audio`` part) is a
    payload, as a ``data:`` URL is: its base64 was tokenized as text (the document's whole
    source as JSON, after 32 hops between two helpers), so a 1 MB PDF counted 700,000 tokens,
    "did not fit" any window, and the emergency pass emptied the conversation around it."""
    counter = TokenCounter(tokenizer)
    payload = base64.b64encode(bytes(range(256)) * 3000).decode()  # 1 MB of base64
    filled = json.loads(json.dumps(part).replace("PAYLOAD", payload))
    count = counter.count_message({"role": "user", "content": [filled]})
    assert OPAQUE_MEDIA_TOKENS <= count < OPAQUE_MEDIA_TOKENS + 30


@pytest.mark.parametrize("tokenizer", ["o200k_base", "anthropic"])
def test_a_custom_tool_calls_input_counts_like_function_arguments(tokenizer: str) -> None:
    """An OpenAI custom tool's call (``{"type": "custom", "custom": {"name", "input"}}``) sends its
    free-form ``input``: it counted 0, so a history of patches far over the window was reported
    as fitting, nothing was compacted and the provider refused the request."""
    counter = TokenCounter(tokenizer)
    patch = "".join(f"+line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(500))

    def call(kind: str, value: str) -> dict[str, Any]:
        inner = (
            {"name": "apply_patch", "input": value} if kind == "custom" else {"name": "apply_patch", "arguments": value}
        )
        return {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": kind, kind: inner}]}

    empty = counter.count_message(call("custom", ""))
    assert counter.count_message(call("custom", patch)) - empty == counter.count_text(patch)
    assert counter.count_message(call("custom", patch)) == counter.count_message(call("function", patch))


@pytest.mark.parametrize("tokenizer", ["o200k_base", "anthropic"])
def test_a_documents_text_source_counts_its_text(tokenizer: str) -> None:
    """An Anthropic document with a plain-text source (``{"type": "text", "media_type":
    "text/plain", "data": ...}``) is the text itself to the model. Its source has a ``type`` of
    ``text`` but no ``text`` field: it counted 0, so a 100K-token document looked like a short
    message and nothing was compacted before the provider refused the request."""
    counter = TokenCounter(tokenizer)
    text = "".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(500))
    as_text = {"role": "user", "content": [{"type": "text", "text": text}]}
    source = {"type": "text", "media_type": "text/plain", "data": text}
    as_document = {"role": "user", "content": [{"type": "document", "source": source, "title": "notes"}]}
    in_result = {"role": "tool", "tool_call_id": "t1", "content": [{"type": "document", "source": source}]}
    floor = counter.count_message(as_text)
    assert counter.count_message(as_document) >= floor
    assert counter.count_message(in_result) >= floor
    # A text part is counted by its text alone, as before.
    assert counter.count_message({**as_text, "content": [{"type": "text", "text": text, "data": text}]}) == floor


def test_reasoning_and_thinking_blocks_count() -> None:
    counter = TokenCounter("o200k_base")
    plain = {"role": "assistant", "content": "Done."}
    thought = "First check the imports, then the fixtures, then rerun the test."
    with_reasoning = {**plain, "reasoning_content": thought}
    with_blocks = {**plain, "thinking_blocks": [{"type": "thinking", "thinking": thought}]}
    redacted = {**plain, "thinking_blocks": [{"type": "redacted_thinking", "data": "abc"}]}
    base = counter.count_message(plain)
    assert counter.count_message(with_reasoning) == base + counter.count_text(thought)
    assert counter.count_message(with_blocks) == base + counter.count_text(thought)
    assert counter.count_message(redacted) == base


def test_thinking_held_in_both_fields_counts_once() -> None:
    """litellm returns Anthropic thinking as ``thinking_blocks`` *and* their texts joined in
    ``reasoning_content``: the provider gets the text once, so it is counted once."""
    counter = TokenCounter("o200k_base")
    parts = ["First check the imports. " * 40, "Then rerun the failing test. " * 40]
    blocks = [{"type": "thinking", "thinking": t, "signature": f"sig{i}"} for i, t in enumerate(parts)]
    only_blocks = {"role": "assistant", "content": "Done.", "thinking_blocks": blocks}
    thinking = sum(counter.count_text(t) for t in parts)
    base = counter.count_message({"role": "assistant", "content": "Done."})
    assert counter.count_message(only_blocks) == base + thinking
    for joined in ("".join(parts), "\n".join(parts), "\n\n".join(parts)):
        assert counter.count_message({**only_blocks, "reasoning_content": joined}) == base + thinking
    # Thinking parts in the content are the same text too.
    in_content = {
        "role": "assistant",
        "reasoning_content": "".join(parts),
        "content": [*blocks, {"type": "text", "text": "Done."}],
    }
    assert counter.count_message(in_content) < base + 2 * thinking
    # Reasoning that says something else is counted on its own.
    other = "A different summary of the reasoning."
    assert counter.count_message({**only_blocks, "reasoning_content": other}) == (
        base + thinking + counter.count_text(other)
    )


def test_non_object_message_is_an_error() -> None:
    with pytest.raises(CtxrulesError):
        TokenCounter.for_tokenizer("o200k_base").count_messages(["not a message"])  # type: ignore[list-item]


# --------------------------------------------------------------------------- text


@pytest.mark.corpus
def test_long_text_is_counted_exactly() -> None:
    import tiktoken

    counter = TokenCounter.for_tokenizer("o200k_base")
    text = "\n".join(m["content"] for m in load(TRANSCRIPTS / "claudecode-ae4a77f8.json") if m["content"])
    assert len(text) > 10 * CHUNK_CHARS
    assert counter.count_text(text) == len(tiktoken.get_encoding("o200k_base").encode_ordinary(text))


@pytest.mark.corpus
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_a_batch_counts_the_same_on_any_number_of_threads(workers: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Short texts and the pieces of long ones share one batch, split between the calling
    thread and helpers: every text's count is its own tokenizer count whatever the split."""
    import tiktoken

    from ctxrules import tokens

    monkeypatch.setattr(tokens, "_WORKERS", workers)
    counter = TokenCounter("o200k_base")  # its own memo-less instance: nothing shared with others
    counter.count_text("x")  # points tiktoken at the tokenizer file litellm ships
    encoding = tiktoken.get_encoding("o200k_base")
    history = load(TRANSCRIPTS / "claudecode-4d5611e5.json")
    texts = [m["content"] for m in history if isinstance(m.get("content"), str) and m["content"]]
    texts.append("\n".join(texts[:40]))  # longer than CHUNK_CHARS: counted in pieces
    assert sum(map(len, texts)) > 4 * tokens._PARALLEL_CHARS and max(map(len, texts)) > CHUNK_CHARS
    assert counter._batch(texts) == [len(encoding.encode_ordinary(t)) for t in texts]


def test_a_text_repeated_in_a_batch_is_tokenized_once_and_counted_each_time() -> None:
    import tiktoken

    counter = TokenCounter("o200k_base")
    counter.count_text("x")
    encode = tiktoken.get_encoding("o200k_base").encode_ordinary
    long_text = "line of output\n" * 2_000  # over CHUNK_CHARS: counted in pieces
    texts = ["tool", "same output", "assistant", long_text, "tool", "same output", long_text, "other"] * 3
    before = counter.texts_tokenized
    assert counter._batch(texts) == [len(encode(t)) for t in texts]
    assert counter.texts_tokenized - before == 5  # the distinct texts, not the 24 asked


def test_a_repeated_text_over_the_ceiling_is_a_bound_at_each_place() -> None:
    from ctxrules import tokens
    from ctxrules.tokens import token_ceiling

    counter = TokenCounter("o200k_base")
    huge = "word " * (tokens.GROUP_CHARS // 4)  # longer than a group: it may stop at the ceiling
    messages = [
        {"role": "tool", "tool_call_id": f"c{i}", "content": huge if i % 2 else f"small {i}"} for i in range(12)
    ]
    with token_ceiling(1_000):
        counts, bounded = counter._count_each_bounded(messages)
    assert bounded == {i for i in range(12) if i % 2}
    with token_ceiling(1_000):
        assert counter.count_each(messages) == counts  # the bounds are remembered per ceiling
    exact = counter.count_each([messages[1]])[0]  # outside the ceiling: tokenized to its end
    assert counts[1] == counts[3] > exact  # the same upper bound at each place it occurs


def test_a_helper_thread_that_fails_leaves_the_error_to_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    from ctxrules import tokens

    monkeypatch.setattr(tokens, "_WORKERS", 2)
    texts = [f"text {i} " * 400 for i in range(100)]

    def encode(text: str) -> list[int]:
        if text.startswith("text 99 "):
            raise ValueError("bad text")
        return [0] * len(text.split())

    with pytest.raises(ValueError, match="bad text"):
        tokens._in_parallel(encode, texts)
    assert tokens._in_parallel(lambda t: [0] * len(t.split()), texts) == [800] * 100


def test_pathological_text_stays_fast() -> None:
    counter = TokenCounter.for_tokenizer("cl100k_base")
    start = time.perf_counter()
    assert counter.count_text("a" * 400_000) > 0
    assert counter.count_text("=" * 400_000) > 0
    assert time.perf_counter() - start < 5.0


def test_special_token_text_is_plain_text() -> None:
    counter = TokenCounter.for_tokenizer("o200k_base")
    assert counter.count_text("<|endoftext|>") > 1


# --------------------------------------------------------------------------- estimates


@pytest.mark.parametrize("tokenizer", ["anthropic", "deepseek", "approx"])
def test_estimates_are_labelled(tokenizer: Any) -> None:
    counter = TokenCounter.for_tokenizer(tokenizer)
    assert counter.is_estimate
    assert counter.safety_margin > 0
    assert counter.padded(1000) == round(1000 * (1 + counter.safety_margin))
    assert counter.padded(1000) > 1000


@pytest.mark.parametrize("tokenizer", ["anthropic", "deepseek"])
def test_hf_counts_are_those_of_the_tokenizers_encode(tokenizer: str) -> None:
    """The HF backends count through the tokenizer's batch call without offsets: every count,
    of short texts one at a time and of a large batch, is what its plain ``encode`` gives."""
    from tokenizers import Tokenizer

    from ctxrules.tokens import _HF_FILES, _backend, tokenizer_dir

    reference = Tokenizer.from_file(str(tokenizer_dir() / _HF_FILES[tokenizer]))
    short = [
        "",
        " ",
        "tool",
        "Next I will check item 17.",
        json.dumps({"command": "ls -la /tmp", "timeout": 30}),
        "file_17.txt\n" * 20,
        "caf\u00e9 \u2014 \u4f60\u597d\u4e16\u754c \U0001f600 \ufb01 \u212b",  # NFKC folds some of these
        "\t\tindented\r\n\x00control",
        "<|endoftext|> <think> [INST]",
    ]
    # Over the batch thresholds (more than 8 texts, 50,000 characters, 1,000 on average).
    large = [f"line {i}: " + "x = compute(y) + 1 # a comment\n" * (150 + i) for i in range(12)]
    count = _backend(tokenizer)
    for texts in (short, large):
        expected = [len(reference.encode(t, add_special_tokens=False)) for t in texts]
        assert count(texts) == expected


def test_exact_counters_are_not_padded() -> None:
    counter = TokenCounter.for_model(lookup_model("gpt-4o"))
    assert counter.padded(1234) == 1234


def test_counters_are_shared_per_tokenizer() -> None:
    one = TokenCounter.for_model(lookup_model("claude-sonnet-4-5"))
    two = TokenCounter.for_model(lookup_model("anthropic/claude-haiku-4-5-20251001"))
    assert one is two
    assert one.tokenizer == "anthropic"
    assert TokenCounter.for_model(lookup_model("deepseek-chat")).tokenizer == "deepseek"
    assert TokenCounter.for_model(lookup_model("gemini-2.5-pro")).tokenizer == "approx"


@pytest.mark.corpus
@pytest.mark.parametrize("path", TRANSCRIPT_FILES, ids=lambda p: p.stem)
def test_estimates_are_plausible(path: Path) -> None:
    messages = load(path)
    reference = TokenCounter.for_tokenizer("cl100k_base").count_messages(messages)
    for tokenizer in ("anthropic", "deepseek"):
        estimate = TokenCounter.for_tokenizer(tokenizer).count_messages(messages)  # type: ignore[arg-type]
        assert 0.65 * reference <= estimate <= 1.35 * reference, (tokenizer, estimate, reference)
    approx = TokenCounter.for_tokenizer("approx").count_messages(messages)
    assert approx == reference


# --------------------------------------------------------------------------- images


def test_image_headers_are_parsed() -> None:
    assert image_size(png_bytes(37, 19)) == (37, 19)
    assert image_size(jpeg_bytes(640, 480)) == (640, 480)
    assert image_size(gif_bytes(300, 200)) == (300, 200)
    for kind in ("VP8X", "VP8L", "VP8 "):
        assert image_size(webp_bytes(1000, 700, kind)) == (1000, 700), kind
    assert image_size(b"not an image at all") is None
    assert image_size(b"\x89PNG\r\n\x1a\n") is None
    assert image_size(b"\xff\xd8\xff\xe0\x00") is None


def test_image_size_from_data_urls() -> None:
    assert image_size_from_url(data_url(png_bytes(800, 600))) == (800, 600)
    assert image_size_from_url(data_url(jpeg_bytes(64, 32), "image/jpeg")) == (64, 32)
    assert image_size_from_url("https://example.com/cat.png") is None
    assert image_size_from_url("data:image/png,notbase64") is None
    assert image_size_from_url("data:image/png;base64,!!!!") is None


@pytest.mark.parametrize(
    ("size", "detail", "expected"),
    [
        ((512, 512), "auto", 85 + 170),
        ((512, 512), "low", 85),
        ((1024, 1024), "high", 85 + 170 * 4),  # -> 768x768
        ((4096, 2048), "auto", 85 + 170 * 6),  # -> 2048x1024 -> 1536x768
        ((100, 5000), "high", 85 + 170 * 4),  # -> 40x2048: short side already small
        ((513, 100), "auto", 85 + 170 * 2),
        (None, "auto", OPENAI_UNKNOWN_IMAGE_TOKENS),
        (None, "low", 85),
    ],
)
def test_openai_tile_rule(size: tuple[int, int] | None, detail: str, expected: int) -> None:
    assert openai_image_tokens(size, detail) == expected


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        ((200, 100), 27),  # 20000 / 750 = 26.7
        ((1000, 1000), 1334),
        ((1568, 700), 1464),
        ((4000, 3000), ANTHROPIC_MAX_IMAGE_TOKENS),  # scaled, then capped
        (None, ANTHROPIC_MAX_IMAGE_TOKENS),
    ],
)
def test_anthropic_pixel_rule(size: tuple[int, int] | None, expected: int) -> None:
    assert anthropic_image_tokens(size) == expected


def test_image_parts_in_messages() -> None:
    openai = TokenCounter.for_tokenizer("o200k_base")
    claude = TokenCounter.for_tokenizer("anthropic")
    url = data_url(png_bytes(1024, 1024))
    text_only = {"role": "user", "content": [{"type": "text", "text": "What is in this picture?"}]}
    assert openai.count_message(image_message(url)) == openai.count_message(text_only) + 765
    assert openai.count_message(image_message(url, "low")) == openai.count_message(text_only) + 85
    remote = image_message("https://example.com/cat.png")
    assert openai.count_message(remote) == openai.count_message(text_only) + 1445
    assert claude.count_message(image_message(url)) == claude.count_message(text_only) + 1399
    anthropic_part = {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is in this picture?"},
            {
                "type": "image",
                "source": {
                    "type": "base64",
                    "media_type": "image/png",
                    "data": base64.b64encode(png_bytes(1024, 1024)).decode(),
                },
            },
        ],
    }
    assert claude.count_message(anthropic_part) == claude.count_message(image_message(url))


@pytest.mark.parametrize("size", [(512, 512), (1024, 1024), (4096, 2048), (300, 700)])
def test_image_tokens_agree_with_litellm(size: tuple[int, int], litellm: ModuleType) -> None:
    message = image_message(data_url(png_bytes(*size)))
    counter = TokenCounter.for_model(lookup_model("gpt-4o"))
    expected = litellm.token_counter(model="gpt-4o", messages=[message])
    assert counter.count_messages([message]) == expected


# --------------------------------------------------------------------------- offline, lazy


def test_importing_tokens_is_cheap() -> None:
    code = (
        "import sys, ctxrules.tokens\n"
        "print(sorted(m for m in ('tiktoken', 'tokenizers', 'litellm') if m in sys.modules))"
    )
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


OFFLINE = """
import socket, sys, os

def refuse(*args, **kwargs):
    raise OSError("network access attempted")

socket.socket.connect = refuse
socket.create_connection = refuse
socket.getaddrinfo = refuse

from ctxrules.models import lookup_model
from ctxrules.tokens import TokenCounter, tokenizer_dir

msgs = [{"role": "user", "content": "hello offline world"}]
for model in ("gpt-4o", "gpt-4", "claude-sonnet-4-5", "deepseek-chat", "gemini-2.5-pro"):
    counter = TokenCounter.for_model(lookup_model(model))
    assert counter.count_messages(msgs) > 5, model
assert os.environ["TIKTOKEN_CACHE_DIR"] == str(tokenizer_dir())
assert "litellm" not in sys.modules
print("ok")
"""


def test_counts_work_without_network() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TIKTOKEN_CACHE_DIR"}
    done = subprocess.run(
        [sys.executable, "-c", OFFLINE],
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": str(ENGINE)},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_foreign_tiktoken_cache_dir_is_not_a_download(tmp_path: Path) -> None:
    code = (
        "from ctxrules.errors import CtxrulesError\n"
        "from ctxrules.tokens import TokenCounter\n"
        "try:\n"
        "    TokenCounter.for_tokenizer('o200k_base').count_text('hi')\n"
        "except CtxrulesError as e:\n"
        "    print('error:', e)\n"
    )
    done = run_python(code, {"TIKTOKEN_CACHE_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("error: TIKTOKEN_CACHE_DIR=")
    assert "never downloads" in done.stdout


def test_counts_by_object_inside_the_trusted_scope_and_by_content_outside() -> None:
    from ctxrules import structure
    from ctxrules.tokens import trusted_objects

    counter = TokenCounter.for_tokenizer("o200k_base")
    msg: dict[str, Any] = {"role": "user", "content": [{"type": "text", "text": "hello there"}]}
    with trusted_objects():
        first = counter.count_each([msg])[0]
        hits = counter.memo_hits
        assert counter.count_each([msg]) == [first] and counter.memo_hits == hits + 1
        msg["content"] = [{"type": "text", "text": "hello there, and much more text than before"}]
        grown = counter.count_each([msg])[0]  # a new content object is noticed
        assert grown > first
        msg["content"][0]["text"] = "hi"  # an edit inside it is not, until forget()
        assert counter.count_each([msg]) == [grown]
        structure.forget()
        shrunk = counter.count_each([msg])[0]
        assert shrunk < first
    msg["content"][0]["text"] = "hello there"  # outside the scope: counted by content
    assert counter.count_each([msg]) == [first]
