"""Malformed message data is a clear error (exit 2), never an internal error; lone surrogates
are repaired with a warning; a full disk during a run keeps the conversation.

Each input is fed to the real CLI (``ctxrules run``) or to ``Session.prepare``.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cli_kit import run_default

from ctxrules import Engine, MessagesError
from ctxrules.errors import CtxrulesError
from ctxrules.formats import anthropic as A
from ctxrules.json_limits import MAX_DEPTH, MAX_INPUT_BYTES

BASE = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]


def run_cli(
    tmp_path: Path,
    raw: bytes | None = None,
    *,
    path: Path | None = None,
    state: Path | None = None,
    preexec: Any = None,
) -> subprocess.CompletedProcess[bytes]:
    if path is None:
        path = tmp_path / "in.json"
        assert raw is not None
        path.write_bytes(raw)
    return run_default(path, "--state", str(state or tmp_path / "state"), text=False, preexec_fn=preexec)


def assert_clean_error(proc: subprocess.CompletedProcess[bytes], *needles: str) -> str:
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 2, err
    assert "internal error" not in err and "Traceback" not in err
    assert err.count("\n") == 1, err  # one line
    for needle in needles:
        assert needle in err, err
    assert proc.stdout == b""
    return err


@pytest.mark.parametrize(
    ("raw", "needles"),
    [
        (b'[{"role": "user", "content": "x", "n": NaN}]', ["in.json: /0/n: NaN is not valid JSON"]),
        (b'{"messages": [{"role": "user", "content": "x"}], "t": [Infinity]}', ["/t/0: Infinity"]),
        (b'[{"role": "user", "content": "x", "n": -Infinity}]', ["/0/n: -Infinity"]),
        (b'[{"role": "user", "content": "x", "n": 1e400}]', ["/0/n: inf is not a finite number"]),
        (b'[{"role": "user", "content": "x", "n": ' + b"9" * 5000 + b"}]", ["more than 4300 digits"]),
        (
            b'[{"role": "user", "content": "x", "a": ' + b"[" * 900 + b"]" * 900 + b"}]",
            ["/0/a/0/0", "nested deeper than 100 levels"],
        ),
        (b"[" * 100_000 + b"]" * 100_000, ["in.json:1:101: invalid input: nested too deep (more than 100 levels)"]),
    ],
    ids=["nan", "infinity-in-tools", "minus-infinity", "overflowing-float", "5000-digits", "900-deep", "100000-deep"],
)
def test_malformed_json_is_a_located_error(tmp_path: Path, raw: bytes, needles: list[str]) -> None:
    assert_clean_error(run_cli(tmp_path, raw), *needles)


def test_a_message_file_over_the_limit_is_refused_before_it_is_read(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    with open(big, "wb") as fh:  # sparse: no 256 MB written
        fh.truncate(MAX_INPUT_BYTES + 1)
    assert_clean_error(run_cli(tmp_path, path=big), "big.json", "over the 256 MiB limit")


def test_a_lone_surrogate_is_replaced_with_a_warning_naming_where(tmp_path: Path) -> None:
    raw = b'[{"role": "user", "content": "a\\ud800b"}, {"role": "assistant", "content": "ok", "\\udc00k": 1}]'
    proc = run_cli(tmp_path, raw)
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert "/0/content: a lone surrogate was replaced with U+FFFD" in err
    assert "/1/\ufffd(U+DC00)k: a lone surrogate" in err  # the key as it is now
    out = json.loads(proc.stdout.decode("utf-8"))  # valid UTF-8 all through
    assert out[0]["content"] == "a\ufffdb" and "\ufffd(U+DC00)k" in out[1]


def test_the_surrogate_warning_shows_control_characters_in_a_key_as_escapes(tmp_path: Path) -> None:
    """The warning quotes the key where it found the surrogate: a key holding an escape sequence
    (a tool's JSON output pasted in a message) must not retitle the terminal or reorder the line."""
    raw = b'[{"role": "user", "content": "x", "k\\u001b]0;owned\\u0007\\u202e\\nz": "\\ud800"}]'
    proc = run_cli(tmp_path, raw)
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert "/0/k\\x1b]0;owned\\x07\\u202e\\x0az: a lone surrogate was replaced with U+FFFD" in err, err
    assert not any(c in err for c in "\x1b\x07\u202e") and err.count("\n") == 1
    assert json.loads(proc.stdout)[0]["k\x1b]0;owned\x07\u202e\nz"] == "\ufffd"


def test_the_api_repairs_surrogates_warns_once_and_keeps_reusing(tmp_path: Path) -> None:
    session = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o")
    history = [{"role": "user", "content": "a\ud800b"}, {"role": "assistant", "content": "ok"}]
    first = session.prepare(history)
    assert first.messages[0]["content"] == "a\ufffdb"
    assert history[0]["content"] == "a\ud800b"  # the caller's message is not edited
    assert first.report["warnings"] == ["message 0 (user): a lone surrogate in /content was replaced with U+FFFD"]
    grown = [*history, {"role": "user", "content": "next"}]
    second = session.prepare(grown)
    assert second.report["reused_messages"] == len(history)
    assert second.report["warnings"] == []
    json.dumps(second.messages, ensure_ascii=False).encode("utf-8")  # encodable


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({"role": "user", "content": "x", "score": float("nan")}, r"message 2 \(user\): /score: nan"),
        ({"role": "user", "content": "x", "n": 10**5000}, r"/n: an integer of more than 4300 digits"),
        (
            {"role": "user", "content": [{"type": "text", "text": "x", "d": json.loads("[" * 300 + "]" * 300)}]},
            r"/content/0/d/0/.*nested deeper than 100 levels",
        ),
    ],
)
def test_the_api_rejects_unwritable_data_naming_the_field(tmp_path: Path, bad: dict[str, Any], match: str) -> None:
    session = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o")
    with pytest.raises(MessagesError, match=match):
        session.prepare([*BASE, bad])


def _limit_file_size(limit: int) -> Any:
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_a_full_disk_during_a_warm_turn_keeps_the_conversation(tmp_path: Path) -> None:
    """RLIMIT_FSIZE makes every write past a size fail, as a full disk does: the turn that
    hits it is a clear error, and the next run gives what a cold run of its input gives."""
    first = json.dumps(BASE).encode()
    assert run_cli(tmp_path, first).returncode == 0
    out_file = tmp_path / "state" / "default" / "last_output.jsonl"
    grown = json.dumps([*BASE, {"role": "user", "content": "x" * 20_000}]).encode()
    proc = run_cli(tmp_path, grown, preexec=_limit_file_size(out_file.stat().st_size + 100))
    assert_clean_error(proc, "cannot write the session", "the messages were not changed")
    again = run_cli(tmp_path, grown)
    assert again.returncode == 0, again.stderr
    cold = run_cli(tmp_path, grown, state=tmp_path / "fresh")
    assert json.loads(again.stdout) == json.loads(cold.stdout)


def test_a_state_write_cut_short_reads_as_a_cache_miss(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    session = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o")
    session.prepare(BASE)
    real_pwrite = os.pwrite

    def half_then_enospc(fd: int, data: Any, offset: int) -> int:
        if offset == 0 and len(data) > 8:  # write half of the new state, then the disk is full
            real_pwrite(fd, bytes(data[: len(data) // 2]), offset)
        raise OSError(28, "No space left on device")

    grown = [*BASE, {"role": "user", "content": "more"}]
    monkeypatch.setattr(os, "pwrite", half_then_enospc)
    with pytest.raises(CtxrulesError, match="No space left on device; the messages were not changed"):
        session.prepare(grown)
    monkeypatch.setattr(os, "pwrite", real_pwrite)
    assert (tmp_path / "s" / "state.json").read_bytes() == b""  # no torn state behind
    fresh = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o")
    result = fresh.prepare(grown)
    cold = Engine.load("builtin:default").session(tmp_path / "cold", model="gpt-4o").prepare(grown)
    assert result.messages == cold.messages
    assert session.prepare(grown).messages == cold.messages  # the failed session object recovers


# -- tool definitions are data from outside too ------------------------------------------------


def _deep_schema(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


def _openai_tool(parameters: dict[str, Any], description: str = "Run a command.") -> dict[str, Any]:
    return {"type": "function", "function": {"name": "bash", "description": description, "parameters": parameters}}


def _anthropic_tool(schema: dict[str, Any], description: str = "Run a command.") -> dict[str, Any]:
    return {"name": "bash", "description": description, "input_schema": schema}


HOSTILE_SCHEMAS = [
    ({"type": "number", "maximum": float("nan")}, r"tool 0 \(bash\): .*/maximum: nan is not a finite number"),
    ({"type": "number", "minimum": float("-inf")}, r"tool 0 \(bash\): .*/minimum: -inf is not a finite number"),
    ({"type": "integer", "maximum": 10**5000}, r"tool 0 \(bash\): .*/maximum: an integer of more than 4300 digits"),
    (_deep_schema(1200), r"tool 0 \(bash\): .*/properties/x/.*nested deeper than 100 levels"),
]


@pytest.mark.parametrize(("schema", "match"), HOSTILE_SCHEMAS, ids=["nan", "-inf", "5000-digits", "1200-deep"])
@pytest.mark.parametrize("shape", ["openai-argument", "openai-body", "anthropic-body", "anthropic-argument"])
def test_the_api_rejects_unwritable_tools_naming_the_tool(
    tmp_path: Path, schema: dict[str, Any], match: str, shape: str
) -> None:
    session = Engine.load("builtin:default").session(tmp_path / "s", model="claude-sonnet-4-5")
    if shape.startswith("anthropic"):  # the internal form nests deeper: the limit is lower
        match = match.replace("100 levels", f"{MAX_DEPTH - A.DEEPER} levels")
    with pytest.raises(MessagesError, match=match):
        if shape == "openai-argument":
            session.prepare(BASE, tools=[_openai_tool(schema)])
        elif shape == "openai-body":
            session.prepare({"messages": BASE, "tools": [_openai_tool(schema)]})
        else:
            body = {"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": [BASE[0]]}
            if shape == "anthropic-body":
                session.prepare({**body, "tools": [_anthropic_tool(schema)]}, format="anthropic")
            else:
                session.prepare(body, tools=[_anthropic_tool(schema)], format="anthropic")
    assert not (tmp_path / "s" / "state.json").exists(), "refused before any stage ran"


@pytest.mark.parametrize("shape", ["openai", "anthropic"])
def test_the_api_repairs_surrogates_in_tools_with_a_warning(tmp_path: Path, shape: str) -> None:
    session = Engine.load("builtin:default").session(tmp_path / "s", model="claude-sonnet-4-5")
    schema = {"type": "object", "properties": {"pa\udc00th": {"type": "string", "description": "a file \ud800"}}}
    if shape == "openai":
        tools = [_openai_tool(schema, "Run \ud83d a command.")]
        result = session.prepare(BASE, tools=tools)
        out = result.tools[0]["function"]
        assert tools[0]["function"]["description"] == "Run \ud83d a command."  # the caller's is not edited
        prefix = "/function"
        props = out["parameters"]["properties"]
    else:
        body = {"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": [BASE[0]]}
        tools = [_anthropic_tool(schema, "Run \ud83d a command.")]
        result = session.prepare({**body, "tools": tools}, format="anthropic")
        out = result.body["tools"][0]
        prefix = ""
        props = out["input_schema"]["properties"]
    assert out["description"] == "Run \ufffd a command."
    assert props == {"pa\ufffd(U+DC00)th": {"type": "string", "description": "a file \ufffd"}}
    schema_key = "parameters" if shape == "openai" else "input_schema"
    (warning,) = [w for w in result.report["warnings"] if "surrogate" in w]
    assert warning.startswith("tool 0 (bash): a lone surrogate in "), warning
    for field in (f"{prefix}/description", f"{prefix}/{schema_key}/properties/pa\ufffd(U+DC00)th/description"):
        assert field in warning, warning
    json.dumps(result.body, ensure_ascii=False).encode("utf-8")  # encodable all through
    # The same tools on the next call: no new warning (as for an unchanged message).
    grown = [*BASE, {"role": "user", "content": "next"}]
    if shape == "openai":
        again = session.prepare(grown, tools=tools)
        assert not [w for w in again.report["warnings"] if "surrogate" in w]


@pytest.mark.parametrize(
    ("raw", "needles"),
    [
        (
            b'{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": '
            b'{"name": "bash", "parameters": {"type": "number", "maximum": NaN}}}]}',
            ["in.json: /tools/0/function/parameters/maximum: NaN is not valid JSON"],
        ),
        (
            b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tools": [{"name": '
            b'"bash", "input_schema": {"type": "integer", "maximum": ' + b"9" * 5000 + b"}}]}",
            ["in.json: invalid input: an integer literal of more than 4300 digits"],
        ),
        (
            json.dumps({"messages": BASE, "tools": [_openai_tool(_deep_schema(150))]}).encode(),
            ["in.json: /tools/0/function/parameters/properties/", "nested deeper than 100 levels"],
        ),
    ],
    ids=["nan", "5000-digits", "150-deep"],
)
def test_the_cli_rejects_unwritable_tools(tmp_path: Path, raw: bytes, needles: list[str]) -> None:
    assert_clean_error(run_cli(tmp_path, raw), *needles)


def test_the_cli_repairs_a_surrogate_in_a_tool_naming_the_field(tmp_path: Path) -> None:
    raw = (
        b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tools": [{"name": '
        b'"bash", "description": "Run \\ud800 it", "input_schema": {"type": "object"}}]}'
    )
    proc = run_cli(tmp_path, raw)
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert "in.json: /tools/0/description: a lone surrogate was replaced with U+FFFD" in err
    assert json.loads(proc.stdout.decode("utf-8"))["tools"][0]["description"] == "Run \ufffd it"


def _anthropic_call(tool_input: Any, **top: Any) -> dict[str, Any]:
    use = {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": tool_input}
    return {
        "model": "claude-sonnet-4-5",
        "max_tokens": 100,
        **top,
        "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [use]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]},
        ],
    }


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (_anthropic_call({"n": float("nan")}), r"request /messages/1/content/0/input/n: nan is not a finite number"),
        (_anthropic_call(_deep_schema(1200)), r"request /messages/1/content/0/input/.*nested deeper than 98 levels"),
        (_anthropic_call({"n": 10**5000}), r"input/n: an integer of more than 4300 digits"),
        (_anthropic_call({}, temperature=float("inf")), r"request /temperature: inf is not a finite number"),
    ],
    ids=["nan-in-tool-input", "1200-deep-input", "5000-digits", "inf-temperature"],
)
def test_an_anthropic_body_is_checked_before_it_is_decoded(tmp_path: Path, body: dict[str, Any], match: str) -> None:
    session = Engine.load("builtin:default").session(tmp_path / "s", model="claude-sonnet-4-5")
    with pytest.raises(MessagesError, match=match):
        session.prepare(body, format="anthropic")


_USE = {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {}}
_RESULT = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}


@pytest.mark.parametrize(
    ("messages", "needle"),
    [
        ([], "messages: an Anthropic request needs at least one message"),
        (
            [{"role": "user", "content": [{"type": "text", "text": "go"}, _USE]}],
            "messages[0].content[1]: a tool_use block in a user turn",
        ),
        (
            [{"role": "user", "content": "go"}, {"role": "assistant", "content": [_USE, _RESULT]}],
            "messages[1].content[1]: a tool_result block in an assistant turn",
        ),
    ],
    ids=["no-messages", "tool-use-from-the-user", "tool-result-from-the-assistant"],
)
def test_an_anthropic_body_anthropic_would_refuse_is_cr141_not_passed_through(
    tmp_path: Path, messages: list[dict[str, Any]], needle: str
) -> None:
    """Blocks on the wrong side of the conversation (and no message at all) cannot be read as
    a conversation: exit 2 with CR141 naming the block, before any session is opened, instead
    of an output that fails ``anthropic.validate`` and that the provider refuses."""
    body = {"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": messages}
    path = tmp_path / "in.json"
    path.write_text(json.dumps(body))
    # --format anthropic: with `auto` an empty list reads as an (empty) OpenAI conversation.
    proc = run_default(path, "--format", "anthropic", "--state", str(tmp_path / "state"), text=False)
    err = assert_clean_error(proc, "[CR141]", needle)
    assert "in.json" in err and not (tmp_path / "state").exists()


def test_an_anthropic_body_with_surrogates_is_repaired_naming_the_message(tmp_path: Path) -> None:
    session = Engine.load("builtin:default").session(tmp_path / "s", model="claude-sonnet-4-5")
    body = _anthropic_call({"pa\ud800th": "a\udc00b"}, system="be \ud83d brief")
    result = session.prepare(body, format="anthropic")
    warnings = result.report["warnings"]
    assert "message 1: a lone surrogate in /content/0/input/pa\ufffd(U+D800)th was replaced with U+FFFD" in warnings
    assert "request field /system: a lone surrogate was replaced with U+FFFD" in warnings
    assert result.body["messages"][1]["content"][0]["input"] == {"pa\ufffd(U+D800)th": "a\ufffdb"}
    assert result.body["system"] == "be \ufffd brief"
    json.dumps(result.body, ensure_ascii=False).encode("utf-8")


@pytest.mark.parametrize(
    "value",
    [
        {"role": "user", "content": "fine é 😀"},
        {"role": "user", "content": "\ud800"},
        {"role": "user", "content": [{"type": "text", "text": "x", "\udc00": 1}]},
        {"role": "tool", "content": 10**4400},
        {"role": "tool", "content": float("nan")},
        {"role": "tool", "content": [True, None, 1.5, -3, {"a": [[]]}]},
        {"role": "tool", "content": "x", "deep": json.loads("[" * 120 + "]" * 120)},
    ],
)
def test_the_quick_check_agrees_with_the_scan(value: dict[str, Any]) -> None:
    """json_limits.is_plain (the common case, no paths built) is True only when scan finds
    nothing to reject or repair."""
    from ctxrules.json_limits import is_plain, scan

    found = scan(value)
    clean = not found.problems and not found.replaced
    assert is_plain(value) == clean


@pytest.mark.parametrize("depth", [990, 5000])
def test_json_text_nested_past_pythons_limit_fails_no_stage(tmp_path: Path, depth: int) -> None:
    """Strings holding JSON nested deeper than Python's recursion limit (arguments, a tool's
    output, both parsed by stages) are plain strings to the message checks; every stage must
    still run (json.loads raises RecursionError there, not ValueError), and the output pairs."""
    deep = "[" * depth + "]" * depth
    messages = [
        {"role": "user", "content": "check"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "Bash", "arguments": deep}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": deep},
        {"role": "tool", "tool_call_id": "orphan", "content": "no call"},
        {"role": "user", "content": "next"},
    ]
    result = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o", window=16_000).prepare(messages)
    failed = [s["id"] for s in result.report["stages"] if s.get("error")]
    assert failed == [], result.report["warnings"]
    arguments = result.messages[1]["tool_calls"][0]["function"]["arguments"]
    assert "ctxrules_invalid_arguments" in json.loads(arguments)
    assert [m.get("tool_call_id") for m in result.messages if m["role"] == "tool"] == ["c1"]


def test_ids_and_keys_that_differ_only_in_lone_surrogates_stay_distinct(tmp_path: Path) -> None:
    """U+FFFD alone would make "x\\ud800" and "x\\udc00" one id: the results would then be
    paired with the wrong calls (by order), and two such keys of one object would merge."""
    raw = (
        '[{"role": "user", "content": "hi"}, {"role": "assistant", "content": null, "tool_calls": ['
        '{"id": "x\\ud800", "type": "function", "function": {"name": "f", "arguments": "{}"}},'
        '{"id": "x\\udc00", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},'
        '{"role": "tool", "tool_call_id": "x\\udc00", "content": "result of g"},'
        '{"role": "tool", "tool_call_id": "x\\ud800", "content": "result of f"},'
        '{"role": "user", "content": "text \\ud800", "meta": {"\\ud800": 1, "\\udc00": 2, "\\ufffd": 3}}]'
    )
    proc = run_cli(tmp_path, raw.encode())
    assert proc.returncode == 0, proc.stderr.decode()
    cli_out = json.loads(proc.stdout)
    api_out = (
        Engine.load("builtin:default")
        .session(tmp_path / "api", model="gpt-4o", window=32_000)
        .prepare(json.loads(raw))
        .messages
    )
    for out in (cli_out, api_out):
        name_of = {c["id"]: c["function"]["name"] for c in out[1]["tool_calls"]}
        assert len(name_of) == 2
        answers = {name_of[m["tool_call_id"]]: m["content"] for m in out if m["role"] == "tool"}
        assert answers == {"f": "result of f", "g": "result of g"}
        assert sorted(out[4]["meta"].values()) == [1, 2, 3]
        assert out[4]["content"] == "text \ufffd"  # text keeps the plain replacement
