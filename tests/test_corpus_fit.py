"""The issue's corpus check: for every real transcript at 32K, 64K and 128K windows (reserve
8192), the output of ``ctxrules run --pack builtin:default`` fits under the emergency threshold
whenever the pinned messages fit; the last user message and the newest tool results are
intact; every removed text comes back byte-identical through the vault; the report shows the
tokens each stage saved."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from compress_kit import MARKER, expand, recovers, text_of
from conftest import REPO, TRANSCRIPTS, transcript_paths
from invariants import pairing_problems

from ctxrules import Engine
from ctxrules.injected import key_for_session
from ctxrules.messages import is_injected, is_real_user
from ctxrules.pipeline.budget import Budget
from ctxrules.stages.compress_common import make_placeholder
from ctxrules.structure import pinned_indices
from ctxrules.tokens import TokenCounter
from ctxrules.vault import Vault

Msg = dict[str, Any]
WINDOWS = (32_000, 64_000, 128_000)


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.load("builtin:default")


def pinned_floor(messages: list[Msg], counter: TokenCounter, tools: list[Any]) -> int:
    """The smallest context the pipeline may produce: the pinned messages, with one
    placeholder in each gap between them (see compress.emergency's guarantee)."""
    pins = sorted(pinned_indices(messages))
    placeholder, _ = make_placeholder(messages[:1], vault=None)
    gaps = sum(1 for a, b in zip([-1, *pins], [*pins, len(messages)], strict=True) if b - a > 1)
    return counter.count_messages([messages[i] for i in pins], tools) + gaps * (counter.count_message(placeholder) + 30)


def arguments_recover(orig: Msg, new: Msg, vault: Any) -> bool:
    """Tool-call arguments: every string value comes back from the vault."""

    def walk(a: Any, b: Any) -> bool:
        if isinstance(a, str) and isinstance(b, str):
            return recovers(a, b, vault)
        if isinstance(a, dict) and isinstance(b, dict):
            return a.keys() == b.keys() and all(walk(a[k], b[k]) for k in a)
        if isinstance(a, list) and isinstance(b, list):
            return len(a) == len(b) and all(walk(x, y) for x, y in zip(a, b, strict=True))
        return bool(a == b)

    old_calls, new_calls = orig.get("tool_calls") or [], new.get("tool_calls") or []
    if [c.get("id") for c in old_calls] != [c.get("id") for c in new_calls]:
        return False
    for a, b in zip(old_calls, new_calls, strict=True):
        ra, rb = a["function"]["arguments"], b["function"]["arguments"]
        if ra != rb and not walk(json.loads(ra), json.loads(rb)):
            return False
    return True


def lost(history: list[Msg], output: list[Msg], vault: Any) -> list[str]:
    """Input messages that do not come back from the output and the vault."""
    expanded = [m for m in expand(output, vault) if not (is_injected(m) and m.get("role") == "user")]
    problems: list[str] = []
    j = 0
    for i, orig in enumerate(history):
        # Skip what the pipeline added (synthesized results of unanswered calls).
        while j < len(expanded) and is_injected(expanded[j]) and expanded[j] != orig:
            j += 1
        if j >= len(expanded):
            problems.append(f"message {i}: missing")
            continue
        new = expanded[j]
        j += 1
        if new == orig:
            continue
        if new.get("role") != orig.get("role"):
            problems.append(f"message {i}: role {orig.get('role')} became {new.get('role')}")
        elif not recovers(text_of(orig), text_of(new), vault):
            problems.append(f"message {i}: text does not come back")
        elif not arguments_recover(orig, new, vault):
            problems.append(f"message {i}: tool-call arguments do not come back")
    return problems


def newest_step_intact(
    history: list[Msg], output: list[Msg], vault: Any, spill_chars: int, spilled_pins: int = 0
) -> None:
    last_user = max(i for i, m in enumerate(history) if is_real_user(m))
    out_user = max(i for i, m in enumerate(output) if is_real_user(m))
    assert output[out_user] == history[last_user]
    newest = max(i for i, m in enumerate(history) if m["role"] == "assistant")
    ids = {c["id"] for c in history[newest].get("tool_calls") or []}
    results = {
        m["tool_call_id"]: m for m in history[newest + 1 :] if m["role"] == "tool" and m.get("tool_call_id") in ids
    }
    out_results = {m["tool_call_id"]: m for m in output if m["role"] == "tool" and m.get("tool_call_id") in ids}
    for cid, orig in results.items():
        got = out_results[cid]
        if got != orig:
            # the exceptions to pinning: a single content over the spill limit (spill_chars,
            # or the usable window at 4 chars/token), or a pinned content the emergency
            # pass spilled because the pins alone did not fit.
            assert len(text_of(orig)) > spill_chars or spilled_pins, cid
            assert recovers(text_of(orig), text_of(got), vault), cid


def check_run(history: list[Msg], result: Any, session: Any, pack: dict[str, Any]) -> None:
    budget: Budget = session.budget
    out = result.messages
    report = result.report
    assert pairing_problems(out) == []
    assert lost(history, out, session.vault) == []
    options = next((p.get("with", {}) for p in pack["pipeline"] if p.get("use") == "tool_output.filter"), {})
    spill = min(options.get("spill_chars") or 100_000, int(options.get("spill_window_share", 1.0) * budget.usable * 4))
    spilled_pins = sum(a["kind"] == "spill_pinned" for s in report["stages"] for a in s["actions"])
    newest_step_intact(history, out, session.vault, spill, spilled_pins)
    # The report: tokens saved per stage, adding up to the whole saving.
    stages = report["stages"]
    for s in stages:
        assert s["tokens_saved"] == s["tokens_before"] - s["tokens_after"]
    whole = report["before"]["tokens"] - report["after"]["tokens"]
    assert sum(s["tokens_saved"] for s in stages) == whole
    # The guarantee.
    tokens = session.counter.count_messages(out, result.tools)
    floor = pinned_floor(out, session.counter, result.tools)
    over = budget.utilization(tokens) >= budget.thresholds["emergency"]
    if budget.utilization(floor) < budget.thresholds["emergency"]:
        assert not over, (tokens, floor, budget.tokens_at("emergency"))
    if over:
        assert any("pinned messages alone" in w for w in report["warnings"]), report["warnings"]


@pytest.mark.corpus
@pytest.mark.parametrize("path", transcript_paths(), ids=lambda p: p.stem)
def test_fits_at_every_window(engine: Engine, path: Path, tmp_path: Path) -> None:
    history = json.loads(path.read_text())
    for window in WINDOWS:
        session = engine.session(tmp_path / f"w{window}", model="gpt-4o", window=window)
        assert session.budget.reserve_output == 8192
        result = session.prepare(history)
        check_run(history, result, session, engine.pack.data)


@pytest.mark.corpus
def test_estimated_tokenizer_with_its_safety_margin(engine: Engine, tmp_path: Path) -> None:
    """A Claude model: counts are estimates, raised by the safety margin, and still fit."""
    history = json.loads((TRANSCRIPTS / "claudecode-ae4a77f8.json").read_text())
    session = engine.session(tmp_path / "c", model="claude-sonnet-4-5", window=32_000)
    assert session.budget.safety_margin > 0
    result = session.prepare(history)
    check_run(history, result, session, engine.pack.data)
    assert result.report["after"]["utilization"] < 0.9


@pytest.mark.corpus
def test_real_cli_run_and_vault_get_give_back_every_removed_text(tmp_path: Path) -> None:
    src = TRANSCRIPTS / "claudecode-ae4a77f8.json"
    history = json.loads(src.read_text())
    env = {**os.environ, "PYTHONPATH": str(REPO / "engine")}
    out, report, session = tmp_path / "out.json", tmp_path / "report.json", tmp_path / "s"

    def ctxrules(*argv: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [sys.executable, "-m", "ctxrules.cli.main", *argv], capture_output=True, env=env, timeout=300, check=False
        )

    proc = ctxrules(
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
        str(out),
        "--report",
        str(report),
        "--session",
        str(session),
    )
    assert proc.returncode == 0, proc.stderr.decode()
    messages = json.loads(out.read_text())
    data = json.loads(report.read_text())
    assert data["after"]["utilization"] < 0.9 and data["after"]["fits"]
    saved = {s["id"]: s["tokens_saved"] for s in data["stages"]}
    assert saved["remove"] > 0 and saved["truncate"] > 0
    vault = Vault.for_session(session)
    key_for_session(session, None)  # the run's key: this process now recognises its tags
    assert lost(history, messages, vault) == []
    # What `vault get` prints is exactly what the vault holds (lines too), for each kind of
    # marker in the output: removed steps (JSON of the messages), cuts, dedups, filters.
    sample: dict[str, str] = {}
    for msg in messages:
        for match in MARKER.finditer(text_of(msg)):
            kind = match.group(0).split("kind=", 1)[1].split()[0]
            ranged = "#L" in match.group(0)
            sample.setdefault(f"{kind}{ranged}", match.group(0))
    assert any(k.startswith("message") for k in sample) and any(k.endswith("True") for k in sample)
    for marker in sample.values():
        ref = marker.split("ref=vault://", 1)[1].split()[0].rstrip("]")
        vid, _, lines = ref.partition("#")
        argv = ["vault", "get", vid[:16], "--session", str(session)]
        expected = vault.get(vid)
        if lines:
            a, b = (int(x) for x in lines[1:].split("-L"))
            argv += ["--lines", f"{a}:{b}"]
            expected = vault.get_lines(vid, a, b)
        got = ctxrules(*argv)
        assert got.returncode == 0, got.stderr.decode()
        assert got.stdout == expected
        if "kind=message" in marker:
            removed = json.loads(got.stdout)
            ids = {m.get("tool_call_id") for m in history if m["role"] == "tool"}
            answered = {m.get("tool_call_id") for m in removed if m["role"] == "tool"}
            assert removed and answered <= ids
