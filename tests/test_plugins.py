"""The plugin manager: built-ins through the same hooks, validation of what plugins register,
blocking, misspelled hooks, and the `plugins` / `schema` verbs."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest

from ctxrules import plugins
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


def test_a_plugin_module_is_read_as_pluggy_reads_it() -> None:
    # The manager looks a module's attributes up in its namespace rather than through pluggy's
    # inspection: a hook under another name (`specname`) still counts, and nothing else in the
    # module (a module-level __getattr__, an object that is no function) is called or taken.
    module = types.ModuleType("acme_plugin")

    @hookimpl(specname="ctxrules_register_stages")
    def stages_of_acme(register: Any) -> None:
        register(_stage_type())

    asked: list[str] = []

    def module_getattr(name: str) -> Any:
        asked.append(name)
        raise AttributeError(name)

    module.stages_of_acme = stages_of_acme  # type: ignore[attr-defined]
    module.__version__ = "1.0"  # type: ignore[attr-defined]
    module.__getattr__ = module_getattr  # type: ignore[method-assign]
    module.settings = types.SimpleNamespace(ctxrules_impl={"wrapper": True})  # type: ignore[attr-defined]
    reg = _registry(("acme", module))
    assert "acme.noop" in reg.stages
    assert next(p for p in reg.plugins if p.name == "acme").stages == ["acme.noop"]
    assert asked == []


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
    monkeypatch.setattr(plugins, "_installed_entry_points", lambda: [ep])  # no real distribution declares it
    pm, infos = build_plugin_manager()
    assert "acme.ep" in collect(pm, infos).stages
    monkeypatch.setenv("CTXRULES_BLOCK_PLUGINS", "acme")
    pm, infos = build_plugin_manager()
    assert "acme.ep" not in collect(pm, infos).stages


def test_broken_entry_point_names_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata as md

    ep = md.EntryPoint(name="broken", value="no_such_module_xyz", group="ctxrules")
    monkeypatch.setattr(plugins, "_installed_entry_points", lambda: [ep])
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


def _install(folder: Path, name: str, entry_points: str) -> None:
    """A distribution as pip leaves it: ``NAME-0.dist-info`` with METADATA and entry points."""
    info = folder / f"{name}-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0\n", encoding="utf-8")
    (info / "entry_points.txt").write_text(entry_points, encoding="utf-8")


def test_an_installed_distribution_declaring_the_group_is_seen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    _install(tmp_path, "other", "[console_scripts]\nother = other:main\n\n[pytest11]\nctxrules = x\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    before = plugins._may_declare_plugins()
    (tmp_path / "acme_dist_plugin.py").write_text(
        "from ctxrules.hookspecs import hookimpl\nfrom ctxrules.stages.base import StageOutcome, StageType\n"
        "@hookimpl\ndef ctxrules_register_stages(register):\n"
        "    register(StageType('acme.dist', 'content', lambda o: (lambda m, c: StageOutcome(list(m)))))\n",
        encoding="utf-8",
    )
    _install(tmp_path, "acme", "[console_scripts]\nacme = acme:main\n\n[ctxrules]\nacme = acme_dist_plugin\n")
    assert plugins._may_declare_plugins()
    pm, infos = build_plugin_manager()
    assert "acme.dist" in collect(pm, infos).stages
    assert [i.name for i in infos if not i.builtin] == ["acme"]
    # "no" only where importlib.metadata finds no declaration either (the other distribution
    # names ctxrules only as a pytest plugin)
    assert before or not any(_declares(p) for p in sys.path[1:])


def _declares(folder: str) -> bool:
    """What importlib.metadata itself says about ``folder``."""
    from importlib.metadata import distributions

    return any(ep.group == "ctxrules" for d in distributions(path=[folder]) for ep in d.entry_points)


def test_validate_without_plugins_installed_reads_no_distribution_metadata(tmp_path: Path) -> None:
    """With no distribution declaring the group, the CLI does not import importlib.metadata
    (its import and scan were a tenth of `ctxrules validate`); with one, the plugin loads."""
    import os
    import subprocess
    import sys

    engine = str(Path(__file__).resolve().parents[1] / "engine")
    probe = (
        "import contextlib, io, sys\nfrom ctxrules.cli.main import run\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n    code = run(['validate', sys.argv[1]])\n"
        "from ctxrules.plugins import default_registry\n"
        "acme = sorted(s for s in default_registry().stages if s.startswith('acme'))\n"
        "print(code, 'importlib.metadata' in sys.modules, acme)\n"
    )
    pack = tmp_path / "p.yaml"
    pack.write_text("apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: p, version: 1.0.0}\n", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": engine}
    if any(_declares(p) for p in sys.path if p):
        pytest.skip("a distribution on this interpreter's path declares a ctxrules plugin")
    out = subprocess.run([sys.executable, "-c", probe, str(pack)], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "False", "[]"]
    plugin_dir = tmp_path / "site"
    plugin_dir.mkdir()
    (plugin_dir / "acme_dist_plugin.py").write_text(
        "from ctxrules.hookspecs import hookimpl\nfrom ctxrules.stages.base import StageOutcome, StageType\n"
        "@hookimpl\ndef ctxrules_register_stages(register):\n"
        "    register(StageType('acme.dist', 'content', lambda o: (lambda m, c: StageOutcome(list(m)))))\n",
        encoding="utf-8",
    )
    _install(plugin_dir, "acme", "[ctxrules]\nacme = acme_dist_plugin\n")
    env["PYTHONPATH"] = os.pathsep.join([engine, str(plugin_dir)])
    out = subprocess.run([sys.executable, "-c", probe, str(pack)], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "True", "['acme.dist']"]


@pytest.mark.parametrize("layout", ["egg folder", "egg-info", "zip"])
def test_the_quick_look_never_misses_what_importlib_metadata_finds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    import sys
    import zipfile

    text = "[ctxrules]\nacme = acme_plugin\n"
    if layout == "egg folder":
        entry = tmp_path / "acme-0-py3.egg"
        (entry / "EGG-INFO").mkdir(parents=True)
        (entry / "EGG-INFO" / "PKG-INFO").write_text("Metadata-Version: 1.1\nName: acme\nVersion: 0\n")
        (entry / "EGG-INFO" / "entry_points.txt").write_text(text)
    elif layout == "egg-info":
        entry = tmp_path
        (entry / "acme.egg-info").mkdir()
        (entry / "acme.egg-info" / "PKG-INFO").write_text("Metadata-Version: 1.1\nName: acme\nVersion: 0\n")
        (entry / "acme.egg-info" / "entry_points.txt").write_text(text)
    else:
        entry = tmp_path / "site.zip"
        with zipfile.ZipFile(entry, "w") as zf:
            zf.writestr("acme-0.dist-info/METADATA", "Metadata-Version: 2.1\nName: acme\nVersion: 0\n")
            zf.writestr("acme-0.dist-info/entry_points.txt", text)
    monkeypatch.setattr(sys, "path", [str(entry), *(p for p in sys.path if p)])
    assert _declares(str(entry))  # importlib.metadata finds the declaration ...
    assert plugins._may_declare_plugins()  # ... and so the quick look says "maybe"
