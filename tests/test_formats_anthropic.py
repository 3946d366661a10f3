"""The Anthropic Messages codec and validator: lossless round trips of valid requests (generated
and real), detection, clear errors, and the whole corpus through the pipeline in Anthropic form."""

from __future__ import annotations

import json
import operator
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from cli_kit import run_default
from conftest import REPO, transcript_path, transcript_paths
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from invariants import lost_contents, markers_resolve, pairing_problems

from ctxrules import Engine
from ctxrules.errors import MessagesError
from ctxrules.formats import FormatError, detect
from ctxrules.formats import anthropic as A

EPHEMERAL = {"type": "ephemeral"}


def canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


# --- a generator of valid requests -------------------------------------------------------------

# Text that is more than whitespace (Anthropic refuses a text block of whitespace alone): a
# visible character, then anything.
texts = st.builds(
    operator.add,
    st.characters(codec="utf-8", exclude_categories=("Cs", "Zs", "Zl", "Zp", "Cc")),
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=39),
)
cache = st.one_of(st.none(), st.just(EPHEMERAL), st.just({"type": "ephemeral", "ttl": "1h"}))
json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(10**12), 10**12),
        st.floats(allow_nan=False, allow_infinity=False),
        texts,
    ),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)


def with_cache(block: dict[str, Any], marker: dict[str, Any] | None) -> dict[str, Any]:
    return {**block, "cache_control": marker} if marker else block


@st.composite
def text_block(draw: st.DrawFn) -> dict[str, Any]:
    return with_cache({"type": "text", "text": draw(texts)}, draw(cache))


@st.composite
def media_block(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(["image", "image_url", "document", "document_text"]))
    if kind == "image":
        block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    elif kind == "image_url":
        block = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    elif kind == "document":
        block = {
            "type": "document",
            "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0xLjQK"},
            "title": draw(texts),
        }
    else:
        block = {
            "type": "document",
            "source": {"type": "text", "media_type": "text/plain", "data": draw(texts)},
            "citations": {"enabled": draw(st.booleans())},
        }
    return with_cache(block, draw(cache))


@st.composite
def thinking_block(draw: st.DrawFn) -> dict[str, Any]:
    if draw(st.booleans()):
        return {"type": "thinking", "thinking": draw(texts), "signature": "sig-" + draw(texts)}
    return {"type": "redacted_thinking", "data": "red-" + draw(texts)}


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    """A request Anthropic accepts: alternating turns, every tool_use answered first thing in
    the next user turn, unique ids, ≤ 4 cache breakpoints."""
    ids = iter(f"toolu_{n:04d}" for n in range(10_000))
    request: dict[str, Any] = {"model": "claude-sonnet-4-5", "max_tokens": draw(st.integers(1, 64_000))}
    if draw(st.booleans()):
        request["system"] = draw(st.one_of(texts, st.lists(text_block(), min_size=1, max_size=2)))
    if draw(st.booleans()):
        request["tools"] = [
            with_cache(
                {
                    "name": f"tool_{k}",
                    **({"description": draw(texts)} if draw(st.booleans()) else {}),
                    "input_schema": {"type": "object", "properties": {"x": {"type": "string"}}},
                },
                draw(cache),
            )
            for k in range(draw(st.integers(1, 3)))
        ]
        if draw(st.booleans()):
            request["tools"].append({"type": "web_search_20250305", "name": "web_search", "max_uses": 3})
    if draw(st.booleans()):
        request["thinking"] = {"type": "enabled", "budget_tokens": 2048}
    messages: list[dict[str, Any]] = []
    pending: list[str] = []
    for turn in range(draw(st.integers(1, 7))):
        if turn % 2 == 0:  # user
            results = [
                with_cache(
                    {
                        "type": "tool_result",
                        "tool_use_id": call_id,
                        **draw(st.sampled_from([{}, {"content": "out"}, {"content": [{"type": "text", "text": "o"}]}])),
                        **draw(st.sampled_from([{}, {"is_error": True}, {"is_error": False}])),
                    },
                    draw(cache),
                )
                for call_id in pending
            ]
            rest = draw(st.lists(st.one_of(text_block(), media_block()), max_size=2))
            if results or rest or draw(st.booleans()):
                content: Any = [*results, *rest] or [{"type": "text", "text": "go"}]
            else:
                content = draw(texts)
            messages.append({"role": "user", "content": content})
            pending = []
        else:
            if draw(st.booleans()):
                messages.append({"role": "assistant", "content": draw(texts)})
                continue
            blocks: list[dict[str, Any]] = draw(st.lists(thinking_block(), max_size=2))
            blocks += draw(st.lists(text_block(), max_size=2))
            for _ in range(draw(st.integers(0, 2))):
                call_id = next(ids)
                pending.append(call_id)
                blocks.append(
                    with_cache(
                        {
                            "type": "tool_use",
                            "id": call_id,
                            "name": "tool_0",
                            "input": draw(st.dictionaries(texts, json_values, max_size=3)),
                        },
                        draw(cache),
                    )
                )
            if draw(st.booleans()):
                blocks = draw(st.permutations(blocks))  # interleaved thinking keeps its order
            messages.append({"role": "assistant", "content": blocks or [{"type": "text", "text": "ok"}]})
    if pending:
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": c} for c in pending]})
    request["messages"] = messages
    if A._count_cache(request) > A.MAX_BREAKPOINTS:
        request = A.strip_private(_uncache(request))
    return request


def _uncache(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _uncache(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_uncache(v) for v in value]
    return value


@given(requests())
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_valid_request_round_trips_byte_identical(request: dict[str, Any]) -> None:
    assert A.validate(request) == []
    decoded = A.decode(request)
    assert canon(A.encode(decoded.messages, decoded.tools, decoded.request)) == canon(request)
    assert detect(request) == "anthropic" or not ("system" in request or "tools" in request)


@pytest.mark.corpus
@pytest.mark.parametrize("path", transcript_paths(), ids=lambda p: p.stem)
def test_a_real_transcript_in_anthropic_form_round_trips(path: Path) -> None:
    history = json.loads(path.read_text())
    request = A.encode(history, None, {"model": "claude-sonnet-4-5", "max_tokens": 4096})
    assert A.validate(request) == [], path.name
    decoded = A.decode(request)
    assert canon(A.encode(decoded.messages, decoded.tools, decoded.request)) == canon(request)


# --- detection and errors ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_", "kind"),
    [
        ([{"role": "user", "content": "hi"}], "openai"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "openai"),
        ({"system": "s", "messages": []}, "anthropic"),
        ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a"}]}]}, "anthropic"),
        ({"messages": [], "tools": [{"name": "x", "input_schema": {}}]}, "anthropic"),
        # A block type that is not a string is no sign (and not hashable): the reader says what is wrong.
        ({"messages": [{"role": "user", "content": [{"type": ["tool_use"]}, {"type": {}}]}]}, "openai"),
    ],
)
def test_detection_follows_the_documented_signs(request_: Any, kind: str) -> None:
    assert detect(request_) == kind


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        ("text", "expected a JSON list"),
        ({"model": "m"}, "no 'messages' key"),
        ({"system": "s", "messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
        ({"system": "s", "messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        ({"system": 5, "messages": []}, "system:"),
        (
            {
                "system": "s",
                "messages": [
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "b", "input": "x"}]}
                ],
            },
            "input",
        ),
        # Which tool is not an object, not only that one is not.
        (
            {"system": "s", "messages": [{"role": "user", "content": "a"}], "tools": [{"name": "x"}, 5]},
            "tools[1]: expected an object, got int",
        ),
        (
            {"system": "s", "messages": [{"role": "user", "content": "a"}], "tools": {"name": "x"}},
            "tools: expected a list of objects, got dict",
        ),
    ],
)
def test_unreadable_requests_are_a_format_error(request_: Any, message: str) -> None:
    with pytest.raises(FormatError, match="CR141") as caught:
        A.decode(request_) if isinstance(request_, dict) and "messages" in request_ else detect(request_)
    assert message in str(caught.value)


_TOOL_USE = {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"cmd": "ls"}}


@pytest.mark.parametrize(
    ("extra", "index"),
    [
        ({"tool_calls": []}, 1),
        ({"thinking_blocks": 5}, 1),
        ({"reasoning_content": "why"}, 1),
        ({A.PRIVATE: {"layout": "c"}}, 1),
        ({"tool_call_id": "toolu_1"}, 2),
    ],
    ids=["tool_calls", "thinking_blocks", "reasoning_content", "private", "tool_call_id"],
)
def test_a_message_key_the_internal_form_reads_is_a_format_error(
    engine: Engine, tmp_path: Path, extra: dict[str, Any], index: int
) -> None:
    """Keys of an Anthropic message besides role and content were spread onto the decoded
    message: an assistant turn's ``"tool_calls": []`` replaced its ``tool_use`` blocks, so the
    call and its result were gone from the output (a TypeError for ``thinking_blocks: 5``)."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "list the files"},
        {"role": "assistant", "content": [_TOOL_USE]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"}]},
    ]
    messages[index] = {**messages[index], **extra}
    session = engine.session(tmp_path / "s", model="claude-sonnet-4-5")
    (key,) = extra
    with pytest.raises(
        FormatError, match=rf"\[CR141\] messages\[{index}\]\.{key}: not a field of an Anthropic message"
    ):
        session.prepare({"model": "claude-sonnet-4-5", "max_tokens": 10, "messages": messages}, format="anthropic")


def test_a_turn_of_many_tool_results_is_encoded_in_linear_time() -> None:
    """Each result was put into its turn by a scan and a copy of the blocks already there:
    20,000 parallel calls of one assistant turn took a minute to encode. Results still go
    first in their turn, after those already there and before the turn's text."""
    n = 40_000
    calls = [{"id": f"t{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in range(n)]
    results = [{"role": "tool", "tool_call_id": f"t{i}", "content": "ok"} for i in range(n)]
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": calls},
        *results[:10],
        {"role": "user", "content": "and now?"},
        *results[10:],
    ]
    start = time.perf_counter()
    body = A.encode(messages)
    assert time.perf_counter() - start < 15  # about 0.1 s
    turn = body["messages"][2]["content"]
    assert [b["tool_use_id"] for b in turn[:n]] == [f"t{i}" for i in range(n)]
    assert turn[n:] == [{"type": "text", "text": "and now?"}] and len(body["messages"]) == 3


# --- the validator -----------------------------------------------------------------------------


def _req(*messages: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {"model": "claude-sonnet-4-5", "max_tokens": 10, **top, "messages": list(messages)}


def _nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = {"a": value}
    return value


USE = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {}}]}
RESULT = {"type": "tool_result", "tool_use_id": "t1", "content": "ok"}


@pytest.mark.parametrize(
    ("request_", "found"),
    [
        (_req({"role": "assistant", "content": "hi"}), "first message"),
        (_req({"role": "user", "content": "a"}, {"role": "user", "content": "b"}), "in a row"),
        (_req({"role": "user", "content": "a"}, USE, {"role": "user", "content": "b"}), "not answered"),
        (
            _req(
                {"role": "user", "content": "a"},
                USE,
                {"role": "user", "content": [{"type": "text", "text": "x"}, RESULT]},
            ),
            "must come first",
        ),
        (_req({"role": "user", "content": [RESULT]}), "answers no tool_use"),
        (
            _req(
                {"role": "user", "content": "a"},
                USE,
                {"role": "user", "content": [RESULT]},
                USE,
                {"role": "user", "content": [RESULT]},
            ),
            "reused",
        ),
        (
            _req(
                *[
                    {"role": r, "content": [{"type": "text", "text": "x", "cache_control": EPHEMERAL}]}
                    for r in ("user", "assistant", "user")
                ],
                system=[{"type": "text", "text": "s", "cache_control": EPHEMERAL}],
                tools=[{"name": "x", "input_schema": {}, "cache_control": EPHEMERAL}],
            ),
            "5 cache_control",
        ),
        (
            _req(
                {"role": "user", "content": "a"},
                {
                    "role": "assistant",
                    "content": [{"type": "thinking", "thinking": "t"}, {"type": "text", "text": "x"}],
                },
                {"role": "user", "content": "b"},
            ),
            "signature",
        ),
        (_req({"role": "user", "content": [{"type": "text", "text": ""}]}), "non-empty"),
        (_req({"role": "user", "content": "a", "name": "x"}), "does not accept: name"),
    ],
)
def test_the_validator_names_each_broken_rule(request_: dict[str, Any], found: str) -> None:
    problems = A.validate(request_)
    assert any(found in str(p) for p in problems), problems
    assert all(p.code == "CR140" for p in problems)


@pytest.mark.parametrize(
    ("request_", "found"),
    [
        (
            _req(
                {"role": "user", "content": "a"}, USE, {"role": "user", "content": [{**RESULT, "tool_use_id": ["t1"]}]}
            ),
            "string tool_use_id",
        ),
        (_req({"role": "user", "content": [{**RESULT, "tool_use_id": {"id": "t1"}}]}), "string tool_use_id"),
        (
            _req(
                {"role": "user", "content": "a"},
                USE,
                {"role": "user", "content": [{**RESULT, "content": [{"type": ["text"]}]}]},
            ),
            "holds only text",
        ),
        (
            _req({"role": "user", "content": "a"}, {"role": "assistant", "content": [{"type": ["thinking"]}]}),
            "string 'type'",
        ),
        # What no JSON writer takes is a problem too, not a RecursionError or a TypeError.
        (_req({"role": "user", "content": [{"type": "text", "text": "a", "x": _nested(5000)}]}), "nested deeper"),
        (_req({"role": "user", "content": "a"}, tools=[_nested(5000)]), "tools/0/a/a"),
        (_req({"role": "user", "content": "a", 1: "x"}), "a key that is not a string"),
        (
            _req({"role": "user", "content": [{"type": "text", "text": "a", "x": float("nan")}]}),
            "messages/0/content/0/x",
        ),
        (
            _req(
                {"role": "user", "content": "a"},
                {
                    "role": "assistant",
                    "content": [{"type": "thinking", "thinking": "t", "signature": "s", "n": 10**5000}],
                },
            ),
            "more than 4300 digits",
        ),
    ],
)
def test_the_validator_reports_hostile_values_as_problems(request_: dict[str, Any], found: str) -> None:
    """The validator checks requests from anywhere: a value of the wrong type is a problem it
    names, never an exception (a list as a tool_use_id or block type is not hashable)."""
    for original in (None, request_, {"messages": 5}):
        problems = A.validate(request_, original=original, preserved_thinking=True)
        assert any(found in str(p) for p in problems), problems


def test_the_validator_checks_signed_thinking_against_the_original() -> None:
    think = {"type": "thinking", "thinking": "plan", "signature": "sig"}
    original = _req(
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": [think, {"type": "text", "text": "x"}]},
        {"role": "user", "content": "b"},
        {"role": "assistant", "content": [{**think, "signature": "sig2"}, {"type": "text", "text": "y"}]},
        {"role": "user", "content": "c"},
    )
    assert A.validate(original, original=original, preserved_thinking=True) == []
    edited = json.loads(json.dumps(original))
    edited["messages"][3]["content"][0]["thinking"] = "changed"
    assert any("edited" in str(p) for p in A.validate(edited, original=original))
    assert any("latest assistant turn" in str(p) for p in A.validate(edited, original=original))
    prefix = json.loads(json.dumps(original))
    prefix["messages"][2]["content"] = "b, shortened"
    assert A.validate(prefix, original=original) == []
    assert any("prefix changed" in str(p) for p in A.validate(prefix, original=original, preserved_thinking=True))


# --- through the pipeline ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.load("builtin:default")


@pytest.mark.slow
@pytest.mark.corpus
@pytest.mark.parametrize("path", transcript_paths(), ids=lambda p: p.stem)
def test_the_corpus_in_anthropic_form_stays_valid_at_32k(engine: Engine, path: Path, tmp_path: Path) -> None:
    history = json.loads(path.read_text())
    request = A.encode(history, None, {"model": "claude-sonnet-4-5", "max_tokens": 4096})
    session = engine.session(tmp_path / "s", model="claude-sonnet-4-5", window=32_000)
    result = session.prepare(request, format="anthropic")
    assert A.validate(result.body, original=request) == [], path.name
    # The same invariants as in OpenAI form, on the internal messages the body was made from.
    assert pairing_problems(result.messages) == []
    assert markers_resolve(result.messages, session.vault) == []
    assert lost_contents(A.decode(request).messages, result.messages, session.vault) == []
    assert not any(s.get("error") for s in result.report["stages"]), result.report["stages"]
    assert A.PRIVATE not in json.dumps(result.body) + json.dumps(result.messages)
    # Idempotent: the output again, in the same session, changes nothing.
    again = session.prepare(result.body, format="anthropic")
    assert canon(again.body) == canon(result.body)


def test_a_long_anthropic_request_is_compacted_like_its_openai_form(engine: Engine, tmp_path: Path) -> None:
    """The issue's case: a 485-message session in Anthropic form at 32K came out with tool_use
    removed and its tool_result left behind; now it is compacted and valid."""
    path = transcript_path("claudecode-ae4a77f8.json")
    history = json.loads(path.read_text())
    request = A.encode(history, None, {"model": "claude-sonnet-4-5", "max_tokens": 4096})
    result = engine.session(tmp_path / "a", model="claude-sonnet-4-5", window=32_000).prepare(
        request, format="anthropic"
    )
    openai = engine.session(tmp_path / "o", model="claude-sonnet-4-5", window=32_000).prepare(history)
    assert A.validate(result.body) == []
    assert result.report["after"]["fits"] and result.report["before"]["tokens"] > 100_000
    # Both forms are compacted by the same stages to below compress.remove's target tier
    # (light). Where each stops differs by a unit or so: a user turn of several text blocks is
    # several messages in the internal form, so the units the stages take are not the same.
    tiers = ["below", "monitor", "light", "full", "emergency"]
    for report in (result.report, openai.report):
        assert tiers.index(report["after"]["tier"]) < tiers.index("light"), report["after"]
    kinds = {s["id"] for s in result.report["stages"] if s["tokens_before"] != s["tokens_after"]}
    assert kinds == {s["id"] for s in openai.report["stages"] if s["tokens_before"] != s["tokens_after"]}


def test_cli_run_auto_detects_anthropic_and_answers_in_it(tmp_path: Path) -> None:
    path = transcript_path("claudecode-ae4a77f8.json")
    request = A.encode(json.loads(path.read_text()), None, {"model": "claude-sonnet-4-5", "max_tokens": 4096})
    src, out = tmp_path / "in.json", tmp_path / "out.json"
    src.write_text(json.dumps(request))
    proc = run_default(
        src, "--window", "32000", "--output", str(out), "--session", str(tmp_path / "s"), model="claude-sonnet-4-5"
    )
    assert proc.returncode == 0, proc.stderr
    body = json.loads(out.read_text())
    assert body["model"] == "claude-sonnet-4-5" and body["max_tokens"] == 4096
    assert A.validate(body) == []
    assert len(body["messages"]) < len(request["messages"])


@pytest.mark.parametrize(
    ("argv", "payload", "message"),
    [
        (["--format", "auto"], {"system": "s", "messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
        (["--format", "anthropic"], [{"role": "user", "content": "x"}], "is a JSON object"),
        (["--format", "openai"], {"system": "s", "messages": [{"role": "user", "content": "x"}]}, "use --format"),
        (["--format", "auto"], {"model": "x"}, "neither OpenAI nor Anthropic"),
    ],
)
def test_cli_run_refuses_what_it_cannot_read(tmp_path: Path, argv: list[str], payload: Any, message: str) -> None:
    src = tmp_path / "in.json"
    src.write_text(json.dumps(payload))
    env = {**os.environ, "PYTHONPATH": str(REPO / "engine")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ctxrules.cli.main",
            "run",
            "--pack",
            "builtin:default",
            "--model",
            "claude-sonnet-4-5",
            "--input",
            str(src),
            "--session",
            str(tmp_path / "s"),
            *argv,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and str(src) in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""
    assert not (tmp_path / "s").exists()  # nothing was half-done


def test_preserved_thinking_pin_keeps_every_signed_prefix(tmp_path: Path) -> None:
    """thinking.clean's preserved_thinking: pin — no stage changes what comes before the newest
    signed thinking, so the request validates under the preserved-thinking rule; the default
    (drop) compacts that prefix."""
    path = transcript_path("claudecode-ae4a77f8.json")
    history = json.loads(path.read_text())
    assistants = [i for i, m in enumerate(history) if m["role"] == "assistant"]
    signed = assistants[len(assistants) // 2]
    history[signed] = {
        **history[signed],
        "thinking_blocks": [{"type": "thinking", "thinking": "plan", "signature": "sig-mid"}],
    }
    request = A.encode(history, None, {"model": "claude-sonnet-4-5", "max_tokens": 4096})
    pack = tmp_path / "pin.yaml"
    pack.write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: pin, version: 1.0.0}\n"
        "extends: [builtin:default]\npipeline:\n  - {id: thinking, with: {preserved_thinking: pin}}\n"
    )
    pinned = (
        Engine.load(pack)
        .session(tmp_path / "p", model="claude-sonnet-4-5", window=200_000)
        .prepare(request, format="anthropic")
    )
    assert A.validate(pinned.body, original=request, preserved_thinking=True) == []
    kept = next(
        i
        for i, m in enumerate(pinned.body["messages"])
        if any(b.get("signature") == "sig-mid" for b in m["content"] if isinstance(m["content"], list))
    )
    assert A._canon(pinned.body["messages"][:kept]) == A._canon(request["messages"][:kept])
    dropped = (
        Engine.load("builtin:default")
        .session(tmp_path / "d", model="claude-sonnet-4-5", window=200_000)
        .prepare(request, format="anthropic")
    )
    assert pinned.report["after"]["tokens"] > dropped.report["after"]["tokens"]


def test_empty_text_blocks_of_a_callers_request_are_not_sent(tmp_path: Path) -> None:
    """What the encoder guarantees holds for a caller's request too: its empty text blocks (in
    the system, a turn, a tool result) and the turns they leave empty are dropped, a breakpoint
    on one moves to the block before it, and the result passes the validator."""
    cache = {"type": "ephemeral"}
    request = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 1024,
        "system": [{"type": "text", "text": ""}, {"type": "text", "text": "be brief"}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": ""}, {"type": "text", "text": "list files"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "ok"},
                    {"type": "text", "text": "", "cache_control": cache},
                    {"type": "tool_use", "id": "t1", "name": "sh", "input": {"cmd": "ls"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": ""}]},
                    {"type": "text", "text": "and?"},
                ],
            },
            {"role": "assistant", "content": []},
            {"role": "user", "content": "go on"},
        ],
    }
    assert A.validate(request) != []  # the input itself would be refused
    src, out = tmp_path / "in.json", tmp_path / "out.json"
    src.write_text(json.dumps(request))
    proc = run_default(src, "--output", str(out), "--session", str(tmp_path / "s"), model="claude-sonnet-4-5")
    assert proc.returncode == 0, proc.stderr
    body = json.loads(out.read_text())
    assert A.validate(body) == [], A.validate(body)
    assert body["system"] == [{"type": "text", "text": "be brief"}]
    turns = body["messages"]
    assert [t["role"] for t in turns] == ["user", "assistant", "user"]
    assert turns[1]["content"][0] == {"type": "text", "text": "ok", "cache_control": cache}
    texts = [b.get("text") for b in turns[2]["content"] if b.get("type") == "text"]
    assert texts == ["and?", "go on"]  # the empty assistant turn is gone: its neighbours are one turn


@pytest.mark.parametrize(
    "turns",
    [
        [{"role": "user", "content": ""}],
        [{"role": "user", "content": []}],
        [
            {"role": "user", "content": [{"type": "text", "text": ""}]},
            {"role": "assistant", "content": [{"type": "text", "text": ""}]},
            {"role": "user", "content": [{"type": "text", "text": ""}]},
        ],
        [{"role": "user", "content": []}, {"role": "assistant", "content": []}],
    ],
    ids=["empty-string", "empty-list", "empty-blocks", "ends-with-assistant"],
)
def test_a_request_whose_turns_are_all_empty_is_not_sent_as_given(tmp_path: Path, turns: list[dict[str, Any]]) -> None:
    """Every turn empty: the turns were "left as given", empty blocks and all, a request
    Anthropic refuses (and the validator here too). The turns are dropped as when any is not
    empty, and the short user turn keeps the request from being left without messages."""
    request = {"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": turns}
    assert A.validate(request) != []
    assert _run_as_anthropic(tmp_path, request)["messages"] == [{"role": "user", "content": A.OPENING_TEXT}]


def _run_as_anthropic(tmp_path: Path, request: dict[str, Any]) -> Any:
    """The body ``ctxrules run --format anthropic`` writes for ``request``, checked valid.
    (`--format anthropic`: nothing in these requests is Anthropic's alone, and auto reads them
    as OpenAI messages, where an empty content is fine.)"""
    src, out = tmp_path / "in.json", tmp_path / "out.json"
    src.write_text(json.dumps(request))
    argv = ("--format", "anthropic", "--output", str(out), "--session", str(tmp_path / "s"))
    proc = run_default(src, *argv, model="claude-sonnet-4-5")
    assert proc.returncode == 0, proc.stderr
    body = json.loads(out.read_text())
    assert A.validate(body) == [], A.validate(body)
    return body


def test_whitespace_only_text_is_not_sent(tmp_path: Path) -> None:
    """A text block of whitespace alone (a reply that was only a newline, kept in the history)
    passed: Anthropic refuses it ("text content blocks must contain non-whitespace text"), on
    every turn after, since the history sends it back. It is dropped as an empty one is."""
    request = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 100,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "list files"}, {"type": "text", "text": " \n"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "\n"}, {"type": "text", "text": "a.py"}]},
            {"role": "user", "content": "  "},
            {"role": "assistant", "content": [{"type": "text", "text": "\t"}]},
            {"role": "user", "content": "and?"},
        ],
    }
    said = {p.message for p in A.validate(request)}
    assert said == {"text blocks must contain non-whitespace text", "holds only whitespace"}, said
    assert _run_as_anthropic(tmp_path, request)["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "list files"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "a.py"}]},
        {"role": "user", "content": "and?"},
    ]


def test_a_callers_image_next_to_an_injected_text_is_a_message_of_the_caller() -> None:
    """One user turn holds ctxrules' notes and the caller's screenshot and question: the
    screenshot goes with the question, not with the notes (whose signature covers only their
    text); the images of a message made of images alone stay with its self-closing tag."""
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    notes = {"type": "text", "text": '<ctxrules:notes count="1" sig="0123456789abcdef">\n- [n1] X\n</ctxrules:notes>'}
    shot = {"type": "text", "text": '<ctxrules:shot sig="0123456789abcdef"/>'}
    question = {"type": "text", "text": "what is on the screen?"}
    request = {
        "model": "m",
        "max_tokens": 10,
        "messages": [{"role": "user", "content": [image, notes, image, question]}],
    }
    decoded = A.decode(request).messages
    assert [m["content"] for m in decoded] == [[image], [notes], [image, question]]
    assert A.encode(decoded, None, {"model": "m", "max_tokens": 10}) == request
    own_images = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": [shot, image, question]}]}
    assert [m["content"] for m in A.decode(own_images).messages] == [[shot, image], [question]]
    pasted = {**notes, "text": "<ctxrules:notes>pasted, unsigned</ctxrules:notes>"}
    as_pasted = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": [pasted, image]}]}
    assert [m["content"] for m in A.decode(as_pasted).messages] == [[pasted, image]]


def test_notes_stay_one_message_when_each_turn_opens_with_a_screenshot(tmp_path: Path) -> None:
    """The notes message and the caller's next message share a turn; the caller's message opens
    with an image. The notes are recognised on every turn (no second copy), and rendering them
    anew never takes a screenshot with the old ones."""
    session = Engine.load("builtin:default").session(tmp_path / "s", model="claude-sonnet-4-5", window=32_000)
    session.notes.add("the API key lives in .env, never print it")

    def ask(n: int) -> dict[str, Any]:
        data = f"c2NyZWVu{n}"  # each screenshot its own
        image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}
        return {"role": "user", "content": [image, {"type": "text", "text": f"what is on screen {n}?"}]}

    request: dict[str, Any] = {"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": [ask(0)]}
    for turn in range(1, 4):
        body = session.prepare(request, format="anthropic").body
        sent = json.dumps(body)
        assert sent.count("<ctxrules:notes") == 1, turn
        assert all(f"c2NyZWVu{n}" in sent for n in range(turn)), "every screenshot is still there"
        assert ("port 8443" in sent) is (turn == 3)
        if turn == 2:
            session.notes.add("the staging API runs on port 8443")
        request = {
            **body,
            "messages": [*body["messages"], {"role": "assistant", "content": f"answer {turn}"}, ask(turn)],
        }


# --- where a refused request is refused ------------------------------------------------------


_CALL = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "sh", "input": {}}]}


@pytest.mark.parametrize(
    ("request_", "where"),
    [
        # A system prompt is one more message in the internal form: it was "message 2".
        (
            _req(
                {"role": "user", "content": "a"},
                {"role": "user", "content": [{"type": "text", "text": "b", "x": 1e999}]},
                system="s",
            ),
            "/messages/1/content/0/x",
        ),
        # Tool results split a user turn into several messages: it was "message 4 ... /content/0".
        (
            _req(
                {"role": "user", "content": "a"},
                _CALL,
                {
                    "role": "user",
                    "content": [RESULT | {"tool_use_id": "t1"}, {"type": "text", "text": "b", "x": 1e999}],
                },
            ),
            "/messages/2/content/1/x",
        ),
        (
            _req(
                {"role": "user", "content": "a"},
                _CALL,
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": [{"type": "text", "text": "o", "x": 10**5000}],
                        }
                    ],
                },
            ),
            "/messages/2/content/0/content/0/x",
        ),
        # Thinking blocks are "thinking_blocks" and a tool_use's extra keys ride on the codec's
        # private key in the internal form: neither is a name the caller wrote.
        (
            _req(
                {"role": "user", "content": "a"},
                {
                    "role": "assistant",
                    "content": [{"type": "thinking", "thinking": "t", "signature": "s", "x": float("nan")}],
                },
            ),
            "/messages/1/content/0/x",
        ),
        (
            _req(
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": [{**_CALL["content"][0], "caller": _nested(150)}]},
                {"role": "user", "content": [RESULT]},
            ),
            "/messages/1/content/0/caller/a/a",
        ),
        # A tool schema the request's nesting limit admits but the internal form nests one
        # level deeper (function.parameters) than the limit.
        (_req({"role": "user", "content": "a"}, tools=[{"name": "x", "input_schema": _nested(99)}]), "/input_schema/a"),
        (
            _req(
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"},
                {"role": "user", "content": [{"type": "image_url"}]},
                system="s",
            ),
            "messages[2].content[0]",
        ),
    ],
)
def test_a_refused_request_names_the_place_in_the_request(
    engine: Engine, tmp_path: Path, request_: dict[str, Any], where: str
) -> None:
    """A request ctxrules refuses is refused naming the place in the request as sent: not an
    index or a field of the internal form the request was decoded into."""
    session = engine.session(tmp_path / "s", model="claude-sonnet-4-5")
    with pytest.raises(MessagesError) as caught:
        session.prepare(request_, format="anthropic")
    message = str(caught.value)
    assert where in message, message
    for internal in ("message 2", "message 3", "message 4", "tool_calls", "thinking_blocks", A.PRIVATE, "/function/"):
        assert internal not in message, message


def test_a_repaired_surrogate_is_noted_at_its_place_in_the_request(engine: Engine, tmp_path: Path) -> None:
    request = _req(
        {"role": "user", "content": "a"},
        _CALL,
        {"role": "user", "content": [RESULT, {"type": "text", "text": "b\ud800"}]},
        system="s",
    )
    result = engine.session(tmp_path / "s", model="claude-sonnet-4-5").prepare(request, format="anthropic")
    assert "message 2: a lone surrogate in /content/1/text was replaced with U+FFFD" in result.report["warnings"]
    assert result.body["messages"][2]["content"][1]["text"] == "b\ufffd"


def test_a_last_user_turn_the_pipeline_empties_does_not_turn_the_reply_into_a_prefill(
    engine: Engine, tmp_path: Path
) -> None:
    """A last user turn holding only a tool result that answers no call: the result is dropped
    (and kept in the vault). The request then ended with the assistant turn, which Anthropic
    reads as a prefill the model continues, not as a turn to answer; and a request of nothing
    but that turn became one without messages, which Anthropic refuses."""
    orphan = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "gone", "content": "out"}]}
    session = engine.session(tmp_path / "s", model="claude-sonnet-4-5")
    body = session.prepare(
        _req({"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, orphan), format="anthropic"
    ).body
    assert [t["role"] for t in body["messages"]] == ["user", "assistant", "user"]
    assert body["messages"][1]["content"] == "b" and A.validate(body) == []
    alone = engine.session(tmp_path / "t", model="claude-sonnet-4-5").prepare(_req(orphan), format="anthropic")
    assert alone.body["messages"] == [{"role": "user", "content": A.OPENING_TEXT}]
    assert next(a["kind"] for s in alone.report["stages"] for a in s["actions"]) == "orphan_dropped"
    # A request that ends with an assistant turn is a prefill the caller meant: left as it is.
    prefill = _req({"role": "user", "content": "a"}, {"role": "assistant", "content": "The answer is"})
    out = engine.session(tmp_path / "u", model="claude-sonnet-4-5").prepare(prefill, format="anthropic").body
    assert out["messages"][-1] == {"role": "assistant", "content": "The answer is"}


def _steps_request(steps: int) -> dict[str, Any]:
    """An Anthropic request of an agent's ``steps`` tool steps (about 500 tokens each)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Find why the build of src/app.c fails."}]
    for i in range(steps):
        messages.append(
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": f"tu_{i}", "name": "bash", "input": {"cmd": f"make {i}"}}],
            }
        )
        output = "".join(f"step {i} line {n}: cc -c src/mod_{n}.c -o build/mod_{n}.o ok\n" for n in range(40))
        messages.append(
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"tu_{i}", "content": output}]}
        )
    return {"model": "claude-sonnet-4-5", "max_tokens": 1024, "system": "You are a build agent.", "messages": messages}


def test_an_agent_that_appends_to_the_last_body_gets_the_requests_its_own_history_gets(tmp_path: Path) -> None:
    """docs/reference/api.md: a history that extends the last output (`result.body`) is reused
    and gets the requests the agent's own history gets. After a compaction the removal
    placeholder shared a user turn with the ask, came back as a text block instead of a string,
    and the turn ran cold: the breakpoints of the call before were then read as the caller's own
    and piled up."""
    engine = Engine.load("builtin:default")
    own = engine.session(tmp_path / "own", model="claude-sonnet-4-5", window=20_000)
    kept = engine.session(tmp_path / "kept", model="claude-sonnet-4-5", window=20_000)
    full = _steps_request(60)
    body: dict[str, Any] | None = None
    compacted = 0
    for k in range(5, 121, 2):  # before each assistant turn: k user/assistant messages
        history = {**full, "messages": full["messages"][:k]}
        mine = own.prepare(json.loads(json.dumps(history)), format="anthropic", clock=1.8e9 + k)
        # The last body, then what happened since (the assistant's reply, the results).
        sent = history if body is None else {**body, "messages": [*body["messages"], *full["messages"][k - 2 : k]]}
        theirs = kept.prepare(json.loads(json.dumps(sent)), format="anthropic", clock=1.8e9 + k)
        # (each session signs what it injects with its own key)
        unsigned = [re.sub(r'sig=\\"[0-9a-f]{16}\\"', "", canon(r.body["messages"])) for r in (theirs, mine)]
        assert unsigned[0] == unsigned[1], k
        if body is not None:
            assert theirs.report["reused_messages"] > 0, k
        compacted += any(s["id"] == "remove" and s["actions"] for s in mine.report["stages"])
        body = theirs.body
    assert compacted, "no turn compacted: the test needs the placeholder in the body"
