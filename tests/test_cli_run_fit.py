"""``ctxrules run`` when the pinned messages alone cannot fit: their largest contents are
spilled (exit 0 once the output fits); when the output still does not fit, the output and the
report are written as usual and the exit code is 1 with a one-line reason."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
from cli_kit import run_default
from conftest import transcript_path

from ctxrules.resources import schema_path
from ctxrules.vault import Vault, parse_markers

REPORT_SCHEMA = json.loads(schema_path("report.v1.schema.json").read_text())


def run_cli(tmp_path: Path, history: Any, window: int = 32_000) -> subprocess.CompletedProcess[str]:
    src = tmp_path / "in.json"
    src.write_text(json.dumps(history))
    return run_default(
        src,
        "--window",
        str(window),
        "--output",
        str(tmp_path / "out.json"),
        "--report",
        str(tmp_path / "report.json"),
        "--session",
        str(tmp_path / "s"),
    )


def dense_output(tokens: int) -> str:
    """Tool output with about 1.5 characters per token (symbolic maths, like sympy prints): a
    56K-token result is only ~85K characters, under the 100K-character spill limit."""
    out, n = [], 0
    while len(out) * 22 < tokens * 1.5:
        out.append(f"-{n}*a*({n % 7}*a + {n % 5})")
        n += 1
    return " ".join(out)


def newest_step_history(output: str) -> list[dict[str, Any]]:
    call = {
        "id": "call_det",
        "type": "function",
        "function": {"name": "bash", "arguments": '{"command": "python det.py"}'},
    }
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful coding agent."},
        {"role": "user", "content": "Why does det() of this matrix fail?"},
    ]
    for i in range(6):
        history += [
            {
                "role": "assistant",
                "content": f"Looking at step {i}.",
                "tool_calls": [
                    {
                        **call,
                        "id": f"call_{i}",
                        "function": {"name": "bash", "arguments": json.dumps({"command": f"cat f{i}.py"})},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": f"call_{i}", "content": f"line {i}\n" * 200},
        ]
    history += [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_det", "content": output},
    ]
    return history


def check_spilled(tmp_path: Path, history: list[dict[str, Any]], proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    jsonschema.validate(report, REPORT_SCHEMA)
    assert report["after"]["fits"] and report["after"]["tier"] != "emergency"
    assert "reason" not in report["after"]
    out = json.loads((tmp_path / "out.json").read_text())
    newest = out[-1]
    assert newest["role"] == "tool" and newest["tool_call_id"] == history[-1]["tool_call_id"]
    [marker] = [m for m in parse_markers(newest["content"]) if m.extra.get("reason") == "spill"]
    assert Vault.for_session(tmp_path / "s").get_text(marker.vault_id) == history[-1]["content"]


def test_a_56k_token_newest_output_at_32k_is_spilled_and_the_run_fits(tmp_path: Path) -> None:
    output = dense_output(56_000)
    assert len(output) < 100_000
    history = newest_step_history(output)
    check_spilled(tmp_path, history, run_cli(tmp_path, history))


def test_the_sympy_transcript_at_32k_fits_after_the_spill(tmp_path: Path) -> None:
    path = transcript_path("minisweagent-sympy__sympy-13877.json")
    history = json.loads(path.read_text())
    proc = run_cli(tmp_path, history)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["after"]["fits"] and report["before"]["utilization"] > 2
    # The 85K-char result is under the 95,232-char spill limit at 32K but 56K tokens: the
    # emergency pass spills it, before it cuts or removes anything.
    emergency = next(s for s in report["stages"] if s["id"] == "emergency")
    assert [a["kind"] for a in emergency["actions"]][:1] == ["spill_pinned"]


def test_an_output_that_cannot_fit_is_written_and_exits_1(tmp_path: Path) -> None:
    # Tool schemas are never spilled: 400 tools with long descriptions cannot fit a 32K window.
    tools = [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": f"Tool {i}: " + "checks one more value before acting. " * 12,
                "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
            },
        }
        for i in range(400)
    ]
    history = {
        "messages": [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "go"}],
        "tools": tools,
    }
    rules = history["messages"][0]["content"]
    proc = run_cli(tmp_path, history)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ctxrules: does not fit: the output (")
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["messages"][0]["content"] == rules and len(out["tools"]) == 400
    report = json.loads((tmp_path / "report.json").read_text())
    jsonschema.validate(report, REPORT_SCHEMA)
    assert report["after"]["fits"] is False
    assert "does not fit the usable window" in report["after"]["reason"]
    assert "pinned messages alone" in report["after"]["reason"]
