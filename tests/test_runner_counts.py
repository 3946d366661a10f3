"""The runner counts only what a stage replaced: the per-stage token figures of the report
must be the ones a full count of each stage's output gives, whatever the stage changed (a few
messages, the system message, the length of the list)."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest

from ctxrules import Engine
from ctxrules.hookspecs import hookimpl
from ctxrules.messages import replace_text
from ctxrules.stages.base import StageOutcome, StageType
from ctxrules.tokens import TokenCounter

OUTPUTS: dict[str, list[dict[str, Any]]] = {}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "Bash",
            "description": "Run a command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


class Editor:
    """A content stage that edits the list in one of several ways and keeps what it made."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.mode = options["mode"]
        self.tag = options.get("tag", self.mode)

    def __call__(self, messages: Any, ctx: Any) -> StageOutcome:
        out = list(messages)
        if self.mode == "shorten-tools":
            out = [replace_text(m, "short") if m.get("role") == "tool" else m for m in out]
        elif self.mode == "longer-system":
            out[0] = {**out[0], "content": out[0]["content"] + " and be thorough about it."}
        elif self.mode == "demote-system":  # same length, but no system message any more
            out[0] = {**out[0], "role": "user"}
        elif self.mode == "drop-system":
            out = out[1:]
        elif self.mode == "append":
            out.append({"role": "assistant", "content": "one more thing to say at the end"})
        OUTPUTS[self.tag] = out
        return StageOutcome(out)


def _plugin() -> Any:
    schema = {
        "type": "object",
        "additionalProperties": False,
        "properties": {"mode": {"type": "string"}, "tag": {"type": "string"}},
    }

    @hookimpl
    def ctxrules_register_stages(register: Any) -> None:
        register(StageType("test.edit", "content", Editor, schema))

    return types.SimpleNamespace(ctxrules_register_stages=ctxrules_register_stages)


def _history() -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You are careful."},
        {"role": "user", "content": "List the files, then read the README."},
    ]
    for i in range(4):
        msgs.append(
            {
                "role": "assistant",
                "content": f"Step {i}.",
                "tool_calls": [
                    {"id": f"c{i}", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "ls"}'}}
                ],
            }
        )
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"file_{i}.txt\n" * 40})
    return msgs


@pytest.mark.parametrize("mode", ["shorten-tools", "longer-system", "demote-system", "drop-system", "append"])
def test_each_stage_figure_is_a_full_count_of_its_output(tmp_path: Path, mode: str) -> None:
    (tmp_path / "pack.yaml").write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: t, version: 1.0.0}\npipeline:\n"
        f"  - {{id: first, use: test.edit, with: {{mode: {mode}, tag: first}}}}\n"
        "  - {id: second, use: test.edit, with: {mode: shorten-tools, tag: second}}\n",
        encoding="utf-8",
    )
    engine = Engine.load(tmp_path / "pack.yaml", plugins=[("test", _plugin())])
    result = engine.session(tmp_path / "s", model="gpt-4o", window=400_000).prepare(_history(), tools=TOOLS)
    counter = TokenCounter.for_tokenizer("o200k_base")
    stages = {s["id"]: s for s in result.report["stages"]}
    for tag in ("first", "second"):
        assert stages[tag]["tokens_after"] == counter.count_messages(OUTPUTS[tag], TOOLS), tag
    assert stages["second"]["tokens_before"] == stages["first"]["tokens_after"]
    assert result.report["after"]["tokens"] == counter.count_messages(result.messages, TOOLS)
