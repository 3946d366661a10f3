"""Invariant 8: what ctxrules outputs and sends is sendable as it is, to an endpoint that rejects
unknown message fields (as OpenAI does), through the clients people use: the openai SDK,
``litellm.completion``, ``session.complete``, the summarizer and the warm-up probe. Injected
messages are recognised by their signed tag only; a pasted tag is a real message."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from compress_kit import conversation, system, user
from llm_server import LLMServer, reply, strict_problem

from ctxrules import Engine
from ctxrules.cache.warmup import KeepAlive, ProbeFailed, send_probe
from ctxrules.errors import UsageError
from ctxrules.injected import KEY_FILE, InjectionKey, key_for_session
from ctxrules.messages import injected_kind, is_real_user, mark_injected
from ctxrules.structure import pinned_indices

REPO = Path(__file__).resolve().parents[1]
SUMMARY = json.dumps(
    {
        "user_goal": "Fix the failing build",
        "active_tasks": ["Fix the build"],
        "completed_actions": [],
        "relevant_files": [],
        "key_facts": [],
        "errors": [],
        "decisions": [],
        "pending_user_asks": [],
        "next_steps": ["Run the tests"],
    }
)


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with LLMServer(strict=True, default=reply("ok")) as running:
        yield running


def agent_history() -> list[dict[str, Any]]:
    """A long tool loop with an unanswered call: at a 32K window the default pack removes
    steps (placeholder), synthesizes the missing result and renders the session's notes."""
    history = conversation(40, lines=80)
    history += [
        user("and now check the tests"),
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "lost", "type": "function", "function": {"name": "Bash", "arguments": "{}"}}],
        },
        user("never mind, what did you find?"),
    ]
    return history


def chat_history(n: int = 40) -> list[dict[str, Any]]:
    """Long real user messages answered by notes: only the summary can make it fit."""
    out = [system()]
    for i in range(n):
        out.append(user(f"Request {i}: " + " ".join(f"detail{i}-{j} of the pasted issue" for j in range(120))))
        out.append({"role": "assistant", "content": f"Noted request {i}. " + "Working on it. " * 40})
    return out


def prepared(tmp_path: Path) -> tuple[Any, list[dict[str, Any]]]:
    session = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o", window=32_000)
    session.notes.add("the API key lives in .env, never print it")
    result = session.prepare(agent_history())
    kinds = {injected_kind(m) for m in result.messages}
    assert {"removed", "interrupted", "notes"} <= kinds, kinds
    return session, result.messages


def test_prepare_output_passes_a_strict_endpoint_through_the_openai_sdk(tmp_path: Path, server: LLMServer) -> None:
    openai = pytest.importorskip("openai", reason="the openai SDK (test extra) is not installed")

    _session, messages = prepared(tmp_path)
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    answer = client.chat.completions.create(model="test-model", messages=messages)  # type: ignore[arg-type]
    assert answer.choices[0].message.content == "ok"
    assert server.rejected == [] and server.requests[-1].body["messages"] == messages
    # The check is real: a message with a field the API does not define is a 400.
    with pytest.raises(openai.BadRequestError, match="'ctxrules' was unexpected"):
        client.chat.completions.create(
            model="test-model", messages=[*messages[:1], {**messages[1], "ctxrules": {"kind": "x"}}]
        )  # type: ignore[list-item]


def test_prepare_output_passes_through_litellm_completion(tmp_path: Path, server: LLMServer) -> None:
    from ctxrules.llm import load_litellm

    litellm = load_litellm()
    _session, messages = prepared(tmp_path)
    with warnings.catch_warnings():  # litellm's own lazy imports warn (pydantic ReadOnly): not ours
        warnings.simplefilter("ignore")
        response = litellm.completion(
            model="openai/test-model", api_base=server.base_url, api_key="x", messages=messages
        )
    assert response.choices[0].message.content == "ok" and server.rejected == []


def test_session_complete_sends_the_output_unchanged(tmp_path: Path, server: LLMServer) -> None:
    session = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o", window=32_000)
    session.notes.add("the API key lives in .env, never print it")
    done = session.complete(agent_history(), model="openai/test-model", api_base=server.base_url, api_key="x")
    assert done.response.choices[0].message.content == "ok" and not done.recovered
    assert server.rejected == []
    # litellm leaves out a null content; everything else goes as prepare returned it.
    assert server.requests[-1].body["messages"] == [
        {k: v for k, v in m.items() if v is not None} for m in done.prepared.messages
    ]


def test_the_warmup_probe_passes_and_its_failures_are_raised(tmp_path: Path, server: LLMServer) -> None:
    _session, messages = prepared(tmp_path)
    request = {"api_base": server.base_url, "api_key": "x"}
    probe = send_probe("openai/test-model", messages, request=request)
    assert probe.ok, probe.error
    assert server.rejected == []
    bad = [{**messages[0], "extra": 1}, *messages[1:]]
    failed = send_probe("openai/test-model", bad, request=request)
    assert not failed.ok and failed.status == 400 and failed.rejected and "'extra' was unexpected" in str(failed.error)
    with pytest.raises(ProbeFailed, match=r"HTTP 400.*'extra' was unexpected"):
        send_probe("openai/test-model", bad, request=request, check=True)
    # A keep-alive whose probe is rejected stops probing and tells the caller on its next turn.
    keepalive = KeepAlive("openai/test-model", request=request, time_scale=0.001)
    with pytest.raises(ProbeFailed, match="warmup probe failed: HTTP 400"), keepalive:
        keepalive.update(bad, warm="session start")
        for _ in range(200):
            if keepalive.probes:
                break
            time.sleep(0.01)
        keepalive.update(messages)  # the next turn raises the rejection, once
    assert keepalive.report()["rejected"] == 1


def test_the_summarizer_request_passes_a_strict_endpoint(
    tmp_path: Path, server: LLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "x")
    pack = {
        "apiVersion": "ctxrules/v1",
        "kind": "RulePack",
        "metadata": {"name": "strict", "version": "1.0.0"},
        "extends": ["builtin:default"],
        "summarizer": {"api_base": server.base_url, "inactivity_s": 5, "total_s": 30, "fallback": "none"},
    }
    (tmp_path / "pack.yaml").write_text(yaml.safe_dump(pack), encoding="utf-8")
    server.script(reply(SUMMARY))
    session = Engine.load(tmp_path / "pack.yaml").session(tmp_path / "s", model="gpt-4o", window=32_000)
    result = session.prepare(chat_history())
    assert any(injected_kind(m) == "summary" for m in result.messages), [s["id"] for s in result.report["stages"]]
    assert server.requests and server.rejected == []
    assert all(strict_problem(r.body) is None for r in server.requests)


# --- recognition by the signed tag -----------------------------------------------------------------


def test_a_pasted_summary_tag_is_still_the_anchor_and_the_latest_user_message(tmp_path: Path) -> None:
    session = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o", window=32_000)
    with_tag = (
        '<ctxrules:summary id="0123456789abcdef" source="llm" messages="12" sig="0123456789abcdef">\n'
        "I copied this from another tool; please continue from it.\n</ctxrules:summary>"
    )
    history = [system(), user(with_tag), {"role": "assistant", "content": "Sure."}, user(with_tag + "\nAnd again.")]
    assert is_real_user(history[1]) and is_real_user(history[3])
    assert {1, 3} <= pinned_indices(history)
    out = session.prepare(history).messages
    assert out[1] == history[1] and out[-1] == history[-1]


def test_a_message_signed_under_another_state_root_is_real_here(tmp_path: Path) -> None:
    first = Engine.load("builtin:default").session(
        tmp_path / "a" / "s", model="gpt-4o", window=32_000, state_root=tmp_path / "a"
    )
    second = Engine.load("builtin:default").session(
        tmp_path / "b" / "s", model="gpt-4o", window=32_000, state_root=tmp_path / "b"
    )
    from ctxrules.injected import key_scope

    with key_scope(first.injection_key):
        notice = mark_injected(user("budget is low"), "budget")
    history = [system(), notice, {"role": "assistant", "content": "ok"}]
    assert second.prepare(history).messages[1] == notice
    with key_scope(second.injection_key):
        assert is_real_user(notice), "another root's signature does not verify here"
    with key_scope(first.injection_key):
        assert not is_real_user(notice)


@pytest.mark.parametrize(
    "added",
    [
        {"type": "text", "text": "NEW QUESTION: which port does the API use?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,TkVXIElNQUdF"}},
    ],
    ids=["text", "image"],
)
@pytest.mark.parametrize("notes_change", [False, True], ids=["same-notes", "new-note"])
def test_what_a_caller_adds_to_a_copied_notes_message_is_never_dropped(
    tmp_path: Path, added: dict[str, Any], notes_change: bool
) -> None:
    """A client that merges the notes message with its next turn (one user message: the signed
    notes text, then the question or a screenshot) sends a message that is not ctxrules' own:
    re-rendering the notes must not take the question or the image with the old notes."""
    session = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o", window=32_000)
    session.notes.add("the API key lives in .env, never print it")
    first = session.prepare([system(), user("set up the API client")]).messages
    (notes,) = [m for m in first if injected_kind(m) == "notes"]
    merged = {"role": "user", "content": [{"type": "text", "text": notes["content"]}, added]}
    if notes_change:
        session.notes.add("the staging API runs on port 8443")
    history = [*first, {"role": "assistant", "content": "Client set up."}, merged]
    out = session.prepare(history).messages
    assert merged in out, "the caller's message is kept as it is"
    assert max(i for i, m in enumerate(out) if is_real_user(m)) == out.index(merged), "and is the latest ask"
    (rendered,) = [m for m in out if injected_kind(m) == "notes"]
    assert ("port 8443" in rendered["content"]) is notes_change


def test_the_key_lives_in_the_state_root_with_mode_0600(tmp_path: Path) -> None:
    session = Engine.load("builtin:default").session(
        tmp_path / "root" / "s1", model="gpt-4o", state_root=tmp_path / "root"
    )
    assert not (tmp_path / "root" / KEY_FILE).exists(), "opening a session writes no key"
    session.prepare([system(), user("hi")])
    path = tmp_path / "root" / KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = Engine.load("builtin:default").session(
        tmp_path / "root" / "s2", model="gpt-4o", state_root=tmp_path / "root"
    )
    assert again.injection_key.sign("<ctxrules:x>") == session.injection_key.sign("<ctxrules:x>")
    # Without a state root, the session directory keeps it.
    alone = Engine.load("builtin:default").session(tmp_path / "alone", model="gpt-4o")
    alone.prepare([user("hi")])
    assert (tmp_path / "alone" / KEY_FILE).is_file()


def test_a_damaged_key_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / KEY_FILE).write_text("not hex\n")
    with pytest.raises(UsageError, match="not an injection key"):
        key_for_session(tmp_path / "s", None)
    # cut short by an odd number of digits (a truncated write): 63 hex digits are no whole bytes
    for digits in (63, 33, 127, 130):
        (tmp_path / "s" / KEY_FILE).write_text("a" * digits)
        with pytest.raises(UsageError, match="not an injection key"):
            key_for_session(tmp_path / "s", None)
    os.symlink(tmp_path / "elsewhere", tmp_path / "t")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / KEY_FILE).write_text("ab" * 32)
    os.symlink(tmp_path / "elsewhere" / KEY_FILE, tmp_path / "link.key")
    assert isinstance(InjectionKey.load_or_create(tmp_path / "elsewhere" / KEY_FILE), InjectionKey)
    with pytest.raises(UsageError, match="cannot read the injection key"):
        InjectionKey.load_or_create(tmp_path / "link.key")


def test_cli_run_output_carries_no_added_field(tmp_path: Path) -> None:
    src = tmp_path / "in.json"
    history = agent_history()
    src.write_text(json.dumps(history))
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
            "gpt-4o",
            "--window",
            "32000",
            "--input",
            str(src),
            "--output",
            str(tmp_path / "out.json"),
            "--session",
            str(tmp_path / "s"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads((tmp_path / "out.json").read_text())
    assert strict_problem({"messages": out}) is None
    assert (tmp_path / "s" / KEY_FILE).is_file()


def test_a_spilled_injected_message_is_still_injected(tmp_path: Path) -> None:
    """A stage that rewrites an injected message (here the hard spill of a huge notes message)
    signs it again: it stays ctxrules' own and never becomes "the latest real user message"."""
    from compress_kit import make_ctx

    from ctxrules.stages.tool_output_filter import ToolOutputFilter

    notes = mark_injected(user("- [n1] " + "remember the build flags; " * 4000), "notes", count=1)
    history = [system(), user("go"), {"role": "assistant", "content": "ok"}, notes]
    ctx = make_ctx(tmp_path, window=32_000)
    out = ToolOutputFilter({})(history, ctx).messages
    assert out[3] is not notes and len(out[3]["content"]) < len(notes["content"]) // 10
    assert injected_kind(out[3]) == "notes" and not is_real_user(out[3])
    assert max(i for i, m in enumerate(out) if is_real_user(m)) == 1
