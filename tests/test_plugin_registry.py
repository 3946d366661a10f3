"""A plugin handed to ``Engine.load(path, plugins=[...])`` is a peer of the built-ins on every
path: validation, prompt assembly, the pipeline (compressor actions) and option schemas.
Each scenario goes through the public API only."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from ctxrules import (
    ActionType,
    Engine,
    PackError,
    StageContext,
    StageOutcome,
    StageType,
    TemplateFilter,
    hookimpl,
)


def _pack(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "pack.yaml"
    path.write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: acme, version: 1.0.0}\n" + textwrap.dedent(body),
        encoding="utf-8",
    )
    return path


class Shout:
    """A template-filter plugin: the filter hook runs when a pack is validated and when its
    prompts are assembled, each time with the engine's registry."""

    calls = 0

    @hookimpl
    def ctxrules_register_template_filters(self, register: Callable[[str, Callable[..., object]], None]) -> None:
        Shout.calls += 1
        register(TemplateFilter("shout", lambda value: f"{value}".upper() + "!"))


def test_a_plugin_template_filter_validates_and_renders(tmp_path: Path) -> None:
    pack = _pack(
        tmp_path,
        """
        prompts:
          variables:
            name: {default: ada}
          sections:
            hello: {template: "Hello {{ name | shout }}"}
          modes:
            main: [hello]
        """,
    )
    with pytest.raises(PackError, match=r"CR080.*'shout'"):
        Engine.load(pack)  # without the plugin, the filter does not exist
    before = Shout.calls
    engine = Engine.load(pack, plugins=[("acme", Shout())])
    assert "Hello ADA!" in engine.assemble("main", "gpt-4o")
    assert "Hello GRACE!" in engine.assemble("main", "gpt-4o", {"name": "grace"})
    # As its docstring says: called once, when the registry was built (validation and both
    # assemblies used what it registered then).
    assert Shout.calls == before + 1


class Whisper:
    """Another plugin with a filter of the same name that renders otherwise."""

    @hookimpl
    def ctxrules_register_template_filters(self, register: Callable[[str, Callable[..., object]], None]) -> None:
        register(TemplateFilter("shout", lambda value: f"{value}".lower() + "..."))


def test_prompts_built_with_one_registry_are_not_used_for_another_at_its_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The prompt set of a pack was cached by the registry's id without keeping the registry
    # alive. Every object here gets the same id, as a registry built where a collected one
    # was would.
    import ctxrules.prompts.assemble as assemble_module
    from ctxrules.plugins import build_plugin_manager, collect

    monkeypatch.setattr(assemble_module, "id", lambda obj: 1, raising=False)
    pack = _pack(
        tmp_path,
        """
        prompts:
          sections:
            hello: {template: "Hello {{ 'Ada' | shout }}"}
          modes:
            main: [hello]
        """,
    )
    engine = Engine.load(pack, plugins=[("acme", Shout())])
    assert "Hello ADA!" in assemble_module.assemble(engine.pack, mode="main", registry=engine.registry).text
    other = collect(*build_plugin_manager([("hush", Whisper())], entry_points=False))
    assert "Hello ada..." in assemble_module.assemble(engine.pack, mode="main", registry=other).text


class FirstLines:
    """A compressor-action plugin: keep the first ``keep`` lines (its schema gives the default)."""

    @hookimpl
    def ctxrules_register_actions(self, register: Callable[..., None]) -> None:
        def factory(options: Mapping[str, Any]) -> Callable[[list[str]], list[str]]:
            keep = int(options["keep"])
            return lambda lines: lines[:keep]

        register(
            ActionType(
                "acme_first",
                factory,
                {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"keep": {"type": "integer", "minimum": 1, "default": 3}},
                },
                "keep the first lines",
            )
        )


def _shell_history(output: str) -> list[dict[str, Any]]:
    call = {"id": "c1", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "acme-tool build"}'}}
    return [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "build it"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": output},
        {"role": "assistant", "content": "Built."},  # the newest step is pinned; the build is not
        {"role": "user", "content": "and now?"},
    ]


def test_a_plugin_compressor_action_runs_in_prepare(tmp_path: Path) -> None:
    pack = _pack(
        tmp_path,
        """
        tools:
          roles: {shell: [Bash]}
        pipeline:
          - id: outputs
            use: tool_output.filter
        compressors:
          - id: acme
            match: {argv: [acme-tool]}
            steps:
              - {use: acme_first, with: {keep: 2}}
        """,
    )
    with pytest.raises(PackError, match="acme_first"):
        Engine.load(pack)  # unknown action without the plugin
    engine = Engine.load(pack, plugins=[("acme", FirstLines())])
    output = "\n".join(f"step {i}: compiled module number {i} of the acme build" for i in range(400))
    session = engine.session(tmp_path / "s", model="gpt-4o")
    result = session.prepare(_shell_history(output))
    sent = result.messages[3]["content"]
    assert sent.startswith("step 0: compiled module number 0 of the acme build\nstep 1:")
    assert "step 2:" not in sent.split("[ctxrules:")[0]
    assert "ref=vault://" in sent  # the rest is in the vault, not lost
    outputs = next(s for s in result.report["stages"] if s["id"] == "outputs")
    assert outputs["tokens_saved"] > 0
    assert not any("unknown action" in w for w in result.report["warnings"] + outputs.get("warnings", []))


class Limited:
    def __init__(self, options: Mapping[str, Any]) -> None:
        self.limit = options.get("limit", 10)

    def __call__(self, messages: Any, ctx: StageContext) -> StageOutcome:
        return StageOutcome(messages=list(messages))


class LimitedPlugin:
    @hookimpl
    def ctxrules_register_stages(self, register: Callable[[StageType], None]) -> None:
        register(
            StageType(
                name="acme.limited",
                phase="content",
                factory=Limited,
                options_schema={
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"limit": {"type": "integer", "minimum": 1}},
                },
            )
        )


def test_a_plugin_stage_with_a_bad_option_is_cr061_not_cr060(tmp_path: Path) -> None:
    pack = _pack(
        tmp_path,
        """
        pipeline:
          - id: mine
            use: acme.limited
            with: {limit: 0}
        """,
    )
    with pytest.raises(PackError) as err:
        Engine.load(pack, plugins=[("acme", LimitedPlugin())])
    assert "CR061" in str(err.value) and "CR060" not in str(err.value)
    assert [d.code for d in err.value.diagnostics] == ["CR061"]
    good = _pack(
        tmp_path,
        """
        pipeline:
          - id: mine
            use: acme.limited
            with: {limit: 5}
        """,
    )
    engine = Engine.load(good, plugins=[("acme", LimitedPlugin())])
    assert engine.plan[0].type.name == "acme.limited"
