"""The plugin manager: built-ins through the same hooks, validation of what plugins register,
blocking, misspelled hooks, and the `plugins` / `schema` verbs."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest

from ctxrules.hookspecs import hookimpl
from ctxrules.plugins import PluginError, build_plugin_manager, collect, default_registry
from ctxrules.stages.base import StageOutcome, StageType


def _stage_type(name: str = "acme.noop", **kw: Any) -> StageType:
    return StageType(
        name=name,
        phase=kw.pop("phase", "content"),
        factory=lambda opts: lambda msgs, ctx: StageOutcome(list(msgs)),
        **kw,
    )


def _plugin(*stage_types: StageType) -> types.SimpleNamespace:
    @hookimpl
    def ctxrules_register_stages(register: Any) -> None:
        for st in stage_types:
            register(st)

    return types.SimpleNamespace(ctxrules_register_stages=ctxrules_register_stages, __name__="acme")


def _registry(*plugins: tuple[str, object]) -> Any:
    pm, infos = build_plugin_manager(list(plugins), entry_points=False)
    return collect(pm, infos)


def test_builtin_stages_are_registered_through_the_hooks() -> None:
    reg = default_registry()
    assert "normalize.tool_pairs" in reg.stages
    assert reg.stages["normalize.tool_pairs"].essential
    owner = reg.owner["stage:normalize.tool_pairs"]
    assert any(p.name == owner and p.builtin for p in reg.plugins)


def test_third_party_stage_is_a_peer_of_the_builtins() -> None:
    reg = _registry(("acme", _plugin(_stage_type())))
    assert "acme.noop" in reg.stages
    info = next(p for p in reg.plugins if p.name == "acme")
    assert info.stages == ["acme.noop"] and not info.builtin


def test_two_plugins_registering_one_name_is_an_error_naming_both() -> None:
    with pytest.raises(PluginError, match=r"plugin 'other'.*already registered by 'acme'"):
        _registry(("acme", _plugin(_stage_type())), ("other", _plugin(_stage_type())))


@pytest.mark.parametrize(
    ("st", "message"),
    [
        (_stage_type("nodot"), "must look like 'group.name'"),
        (_stage_type(phase="later"), "phase 'later'"),
        (_stage_type(options_schema={"type": "objekt"}), "options schema is invalid"),
    ],
)
def test_invalid_registrations_name_plugin_and_hook(st: StageType, message: str) -> None:
    with pytest.raises(PluginError, match=rf"plugin 'acme', hook ctxrules_register_stages: .*{message}"):
        _registry(("acme", _plugin(st)))


def test_register_rejects_something_that_is_not_a_stage_type() -> None:
    @hookimpl
    def ctxrules_register_stages(register: Any) -> None:
        register({"name": "acme.x"})

    plugin = types.SimpleNamespace(ctxrules_register_stages=ctxrules_register_stages)
    with pytest.raises(PluginError, match="takes a StageType, got dict"):
        _registry(("acme", plugin))


def test_misspelled_hook_is_an_error_at_load() -> None:
    def ctxrules_register_stage(register: Any) -> None:  # missing the final s
        pass

    plugin = types.SimpleNamespace(ctxrules_register_stage=ctxrules_register_stage)
    with pytest.raises(PluginError, match=r"no such hook; did you mean 'ctxrules_register_stages'"):
        _registry(("acme", plugin))


def test_decorated_unknown_hook_is_rejected_by_pluggy_too() -> None:
    @hookimpl
    def ctxrules_unknown(register: Any) -> None:
        pass

    with pytest.raises(PluginError, match="acme"):
        _registry(("acme", types.SimpleNamespace(ctxrules_unknown=ctxrules_unknown)))


def test_essential_plugins_cannot_be_blocked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTXRULES_BLOCK_PLUGINS", "ctxrules.stages.normalize_tool_pairs")
    pm, infos = build_plugin_manager(entry_points=False)
    reg = collect(pm, infos)
    assert "normalize.tool_pairs" in reg.stages


def test_entry_point_plugins_are_loaded_and_can_be_blocked(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata as md
    import sys

    module = types.ModuleType("acme_plugin")
    module.ctxrules_register_stages = _plugin(_stage_type("acme.ep")).ctxrules_register_stages  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "acme_plugin", module)
    ep = md.EntryPoint(name="acme", value="acme_plugin", group="ctxrules")
    real = md.entry_points
    monkeypatch.setattr(md, "entry_points", lambda **kw: [ep] if kw.get("group") == "ctxrules" else real(**kw))
    pm, infos = build_plugin_manager()
    assert "acme.ep" in collect(pm, infos).stages
    monkeypatch.setenv("CTXRULES_BLOCK_PLUGINS", "acme")
    pm, infos = build_plugin_manager()
    assert "acme.ep" not in collect(pm, infos).stages


def test_broken_entry_point_names_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata as md

    ep = md.EntryPoint(name="broken", value="no_such_module_xyz", group="ctxrules")
    monkeypatch.setattr(md, "entry_points", lambda **kw: [ep])
    with pytest.raises(PluginError, match=r"plugin 'broken', hook load: cannot import no_such_module_xyz"):
        build_plugin_manager()


def test_plugins_verb_prints_json(cli: Any) -> None:
    code, out, _ = cli("plugins", "--all")
    assert code == 0
    data = json.loads(out)
    assert any("normalize.tool_pairs" in p["stages"] for p in data)
    code, out, _ = cli("plugins")
    assert code == 0 and all(not p["builtin"] for p in json.loads(out))


def test_schema_verb_fills_in_stage_options(cli: Any) -> None:
    import jsonschema

    code, out, _ = cli("schema")
    assert code == 0
    schema = json.loads(out)
    jsonschema.Draft202012Validator.check_schema(schema)
    stage = schema["$defs"]["stage"]
    assert "normalize.tool_pairs" in stage["properties"]["use"]["enum"]
    pairs = next(c for c in stage["allOf"] if c["if"]["properties"]["use"]["const"] == "normalize.tool_pairs")
    assert "unanswered" in pairs["then"]["properties"]["with"]["properties"]


def test_builtin_stage_types_live_in_modules_named_after_them() -> None:
    # `group.name` is found in `ctxrules/stages/group_name.py`: a pack key leads to its code.
    import inspect

    for name, st in default_registry().stages.items():
        module = inspect.getmodule(st.factory) if callable(st.factory) else None
        path = Path(inspect.getfile(module)) if module else None
        assert path is not None and path.name == name.replace(".", "_") + ".py", (name, path)


def test_every_builtin_options_schema_is_a_valid_json_schema() -> None:
    # Registration skips the meta-schema check for built-in plugins (start-up time): this test
    # is that check. A third-party plugin's schema is still checked when it registers.
    import jsonschema

    reg = default_registry()
    schemas = {f"stage {n}": st.options_schema for n, st in reg.stages.items()}
    schemas |= {f"action {n}": a.options_schema for n, a in reg.actions.items()}
    assert len(schemas) > 20
    for name, schema in schemas.items():
        try:
            jsonschema.Draft202012Validator.check_schema(dict(schema))
        except jsonschema.SchemaError as exc:  # pragma: no cover - the failure message
            pytest.fail(f"{name}: {exc.message}")
