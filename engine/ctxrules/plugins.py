"""The plugin manager: built-in and third-party plugins, registered through the same hooks.

Built-ins are the modules in :data:`BUILTIN_PLUGINS`; third-party plugins come from the
``ctxrules`` entry-point group. ``CTXRULES_BLOCK_PLUGINS`` (comma-separated plugin names)
keeps named third-party plugins from loading; built-ins marked essential cannot be blocked.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import stat
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib.machinery import PathFinder
from types import FunctionType, ModuleType
from typing import Any

import pluggy

from ctxrules import hookspecs
from ctxrules._version import __version__
from ctxrules.diagnostics import did_you_mean
from ctxrules.errors import CtxrulesError
from ctxrules.hookspecs import ActionType, TemplateFilter
from ctxrules.stages.base import PHASES, StageType

# Registered in this order; documented in docs/reference/api.md "Plugins".
BUILTIN_PLUGINS: tuple[str, ...] = (
    "ctxrules.stages.normalize_tool_pairs",
    "ctxrules.stages.thinking_clean",
    "ctxrules.stages.media_window",
    "ctxrules.stages.tool_output_filter",
    "ctxrules.stages.ttl_prune",
    "ctxrules.compressors.actions.text",
    "ctxrules.compressors.actions.select",
    "ctxrules.compressors.actions.structure",
    "ctxrules.stages.compress_intent",
    "ctxrules.stages.compress_dedup",
    "ctxrules.stages.compress_truncate",
    "ctxrules.stages.compress_remove",
    "ctxrules.stages.summarize_structured",
    "ctxrules.stages.compress_emergency",
    "ctxrules.stages.notes_render",
    "ctxrules.stages.reread_recent_files",
    "ctxrules.stages.cache_markers",
)
# Stage types that always run and cannot be blocked or disabled.
ESSENTIAL_PLUGINS: frozenset[str] = frozenset({"ctxrules.stages.normalize_tool_pairs"})
BLOCK_ENV = "CTXRULES_BLOCK_PLUGINS"
ENTRY_POINT_GROUP = "ctxrules"


class PluginError(CtxrulesError):
    """A plugin handed over something invalid; names the plugin and the hook."""

    def __init__(self, plugin: str, hook: str, message: str) -> None:
        super().__init__(f"plugin '{plugin}', hook {hook}: {message}")
        self.plugin = plugin
        self.hook = hook


@dataclass
class PluginInfo:
    name: str
    version: str | None
    builtin: bool
    stages: list[str] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    filters: list[str] = field(default_factory=list)


@dataclass
class Registry:
    """Everything the plugins registered, by name, with the plugin that registered it."""

    plugins: list[PluginInfo] = field(default_factory=list)
    stages: dict[str, StageType] = field(default_factory=dict)
    actions: dict[str, ActionType] = field(default_factory=dict)
    filters: dict[str, Callable[..., object]] = field(default_factory=dict)
    owner: dict[str, str] = field(default_factory=dict)
    # The manager's hook relay, for the hooks stages call while they run
    # (``ctxrules_semantic_filter``); None for a registry built by hand.
    hooks: Any = None
    # What validation found for a value checked against these plugins' schemas and factories
    # (a compressor step's options, ...), and the compiled validators: the verdicts depend on
    # the plugins and the value alone, and one `validate` run meets most values twice.
    checked: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)

    def stage(self, name: str) -> StageType:
        return self.stages[name]

    def fingerprint(self) -> str:
        """Plugin names and versions, for the session's hot-switch fingerprint."""
        return ";".join(f"{p.name}={p.version or ''}" for p in self.plugins)


def _blocked() -> set[str]:
    return {n.strip() for n in os.environ.get(BLOCK_ENV, "").split(",") if n.strip()}


class _PluginManager(pluggy.PluginManager):
    """pluggy's manager, quicker on modules: pluggy inspects every attribute of what is
    registered (``inspect.getattr_static``), and a stage module holds a hundred, its imports
    included; that was most of building the registry. A module's attribute is looked up in the
    module's own namespace (where that inspection finds it); a plain function without the
    ``@hookimpl`` mark, or anything that is no routine, is no hook, as pluggy decides; the rest
    is left to pluggy (the mark, not the name, makes a hook: ``specname=``)."""

    def parse_hookimpl_opts(self, plugin: object, name: str) -> Any:
        if isinstance(plugin, ModuleType):
            value = vars(plugin).get(name)
            if isinstance(value, FunctionType):
                if getattr(value, f"{self.project_name}_impl", None) is None:
                    return None
            elif not (inspect.isroutine(value) or isinstance(value, staticmethod | classmethod)):
                return None
        return super().parse_hookimpl_opts(plugin, name)


@cache
def _hook_names() -> frozenset[str]:
    return frozenset(n for n in dir(hookspecs) if n.startswith("ctxrules_"))


def _check_hook_names(plugin: object, name: str) -> None:
    # pluggy only notices decorated functions; a misspelled hook (`ctxrules_register_stage`)
    # would otherwise be silently ignored and the plugin would seem to do nothing.
    known = _hook_names()
    for attr in dir(plugin):
        if attr.startswith("ctxrules_") and attr not in known and callable(getattr(plugin, attr)):
            hint = did_you_mean(attr, known)
            raise PluginError(name, attr, "no such hook" + (f"; {hint}" if hint else ""))


def _dist_version(module: object) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    top = getattr(module, "__name__", "").split(".")[0]
    try:
        return version(top)
    except (PackageNotFoundError, ValueError):
        return getattr(module, "__version__", None)


def build_plugin_manager(
    extra: list[tuple[str, object]] | None = None, *, entry_points: bool = True
) -> tuple[pluggy.PluginManager, list[PluginInfo]]:
    """A plugin manager with the built-ins, entry-point plugins and ``extra`` (name, plugin)."""
    pm = _PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    infos: list[PluginInfo] = []
    blocked = _blocked()
    for modname in BUILTIN_PLUGINS:
        if modname in blocked and modname not in ESSENTIAL_PLUGINS:
            continue
        module: ModuleType = importlib.import_module(modname)
        _register(pm, modname, module)
        infos.append(PluginInfo(modname, __version__, True))
    if entry_points:
        for ep in _installed_entry_points():
            if ep.name in blocked:
                continue
            try:
                plugin = ep.load()
            except Exception as exc:  # a broken third-party plugin must name itself
                raise PluginError(ep.name, "load", f"cannot import {ep.value}: {exc}") from exc
            _register(pm, ep.name, plugin)
            infos.append(PluginInfo(ep.name, _dist_version(plugin), False))
    for name, plugin in extra or []:
        _register(pm, name, plugin)
        infos.append(PluginInfo(name, _dist_version(plugin), False))
    return pm, infos


def _installed_entry_points() -> list[Any]:
    """The ``ctxrules`` entry points of the installed distributions, by name: what
    ``importlib.metadata.entry_points(group=...)`` gives (the first distribution of each name
    on ``sys.path``), except that an ``entry_points.txt`` that is not a regular file is not
    read. Under ``python -m`` the current folder is on ``sys.path``, and a FIFO there named
    like a distribution's entry points would hang the read forever."""
    if not _may_declare_plugins():
        return []
    from importlib.metadata import distributions

    found: list[Any] = []
    seen: set[str] = set()
    for dist in distributions():
        # The key importlib.metadata's own entry_points() tells distributions apart by.
        name = getattr(dist, "_normalized_name", None)
        if isinstance(name, str):
            if name in seen:
                continue
            seen.add(name)
        if _entry_points_readable(dist):
            found.extend(ep for ep in dist.entry_points if ep.group == ENTRY_POINT_GROUP)
    return sorted(found, key=lambda e: e.name)


def _entry_points_readable(dist: Any) -> bool:
    """Whether reading ``dist``'s entry points cannot block: its ``entry_points.txt`` is a
    regular file, or absent. A distribution that is not a folder on disk (a zip, another
    finder's) is read as importlib.metadata reads it."""
    folder = getattr(dist, "_path", None)
    if not isinstance(folder, os.PathLike | str) or not os.path.isdir(folder):
        return True
    try:
        return stat.S_ISREG(os.stat(os.path.join(folder, "entry_points.txt")).st_mode)
    except OSError:
        return True  # no entry points: importlib.metadata reads none either


_GROUP_HEADER = re.compile(rb"^[ \t]*\[[ \t]*" + re.escape(ENTRY_POINT_GROUP.encode()) + rb"[ \t]*\][ \t]*\r?$", re.M)


def _may_declare_plugins() -> bool:
    """Whether an installed distribution may declare a ``ctxrules`` entry point.

    A look at the ``entry_points.txt`` of each ``*.dist-info`` / ``*.egg-info`` folder in the
    ``sys.path`` folders, which is where importlib.metadata finds distributions: importing it
    and letting it read every distribution's metadata was a tenth of ``ctxrules validate``, on
    a machine where no plugin is installed. What this look cannot see into (a zip file on
    ``sys.path``, a distribution finder other than the standard one) counts as "maybe", and
    importlib.metadata decides.
    """
    if any(hasattr(f, "find_distributions") and f is not PathFinder for f in sys.meta_path):
        return True
    for entry in sys.path:
        if not isinstance(entry, str):
            return True  # not a folder name this look can read
        folder = entry or "."
        egg = folder.lower().rstrip("/\\").endswith(".egg")  # an egg folder: its EGG-INFO counts
        try:
            with os.scandir(folder) as found:
                infos = [e.path for e in found if _is_info(e.name.lower(), egg) and e.is_dir()]
        except NotADirectoryError:
            return True  # a zip (or an egg) on sys.path
        except OSError:
            continue  # a folder that does not exist: nothing is installed there
        if any(map(_declares, infos)):
            return True
    return False


def _declares(info: str) -> bool:
    """Whether the metadata folder ``info`` has an ``entry_points.txt`` naming the group. Opened
    without blocking and read only when it is a regular file: ``sys.path`` holds the current
    folder under ``python -m``, and a repository can hold a FIFO named like one, which would
    hang the read forever."""
    try:
        fd = os.open(os.path.join(info, "entry_points.txt"), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return False  # no entry points
    with os.fdopen(fd, "rb") as fh:
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return False  # a FIFO or a device: not a distribution's metadata
            return _GROUP_HEADER.search(fh.read()) is not None
        except OSError:
            return False


def _is_info(name: str, in_egg: bool) -> bool:
    """Whether a folder named ``name`` (lower case) holds a distribution's metadata."""
    return name.endswith((".dist-info", ".egg-info")) or (in_egg and name == "egg-info")


def _register(pm: pluggy.PluginManager, name: str, plugin: object) -> None:
    _check_hook_names(plugin, name)
    try:
        pm.register(plugin, name=name)
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(name, "register", str(exc)) from exc
    except ValueError as exc:
        raise PluginError(name, "register", str(exc)) from exc


def collect(pm: pluggy.PluginManager, infos: list[PluginInfo]) -> Registry:
    """Call every registration hook and validate what each plugin hands over."""
    reg = Registry(plugins=infos, hooks=pm.hook)
    by_name = {i.name: i for i in infos}
    for impl in pm.hook.ctxrules_register_stages.get_hookimpls():
        owner = impl.plugin_name
        impl.function(register=lambda st, _o=owner: _add_stage(reg, by_name[_o], st))
    for impl in pm.hook.ctxrules_register_actions.get_hookimpls():
        owner = impl.plugin_name
        impl.function(register=lambda *a, _o=owner, **k: _add_action(reg, by_name[_o], *a, **k))
    for impl in pm.hook.ctxrules_register_template_filters.get_hookimpls():
        owner = impl.plugin_name
        impl.function(register=lambda *a, _o=owner: _add_filter(reg, by_name[_o], *a))
    return reg


def _claim(reg: Registry, info: PluginInfo, kind: str, name: str, hook: str) -> None:
    key = f"{kind}:{name}"
    if key in reg.owner:
        raise PluginError(info.name, hook, f"{kind} '{name}' is already registered by '{reg.owner[key]}'")
    reg.owner[key] = info.name


def _add_stage(reg: Registry, info: PluginInfo, st: object) -> None:
    hook = "ctxrules_register_stages"
    if not isinstance(st, StageType):
        raise PluginError(info.name, hook, f"register() takes a StageType, got {type(st).__name__}")
    if not st.name or "." not in st.name:
        raise PluginError(info.name, hook, f"stage name '{st.name}' must look like 'group.name'")
    if st.phase not in PHASES:
        raise PluginError(info.name, hook, f"stage '{st.name}' has phase {st.phase!r}; valid: {', '.join(PHASES)}")
    if not callable(st.factory):
        raise PluginError(info.name, hook, f"stage '{st.name}' factory is not callable")
    _check_schema(info, hook, st.name, st.options_schema)
    _claim(reg, info, "stage", st.name, hook)
    reg.stages[st.name] = st
    info.stages.append(st.name)


def _add_action(
    reg: Registry,
    info: PluginInfo,
    name: Any,
    factory: Any = None,
    schema: Mapping[str, Any] | None = None,
    description: str = "",
) -> None:
    hook = "ctxrules_register_actions"
    if isinstance(name, ActionType):  # the one-object form every registration hook takes
        name, factory, schema, description = name.name, name.factory, name.options_schema, name.description
    if not isinstance(name, str) or not callable(factory):
        raise PluginError(info.name, hook, "register(ActionType(name, factory, options_schema, description))")
    schema = schema or {"type": "object", "additionalProperties": False, "properties": {}}
    _check_schema(info, hook, name, schema)
    _claim(reg, info, "action", name, hook)
    reg.actions[name] = ActionType(name, factory, schema, description)
    info.actions.append(name)


def _add_filter(reg: Registry, info: PluginInfo, name: Any, fn: Any = None) -> None:
    hook = "ctxrules_register_template_filters"
    if isinstance(name, TemplateFilter):  # the one-object form every registration hook takes
        name, fn = name.name, name.function
    if not isinstance(name, str) or not callable(fn):
        raise PluginError(info.name, hook, "register(TemplateFilter(name, function))")
    _claim(reg, info, "filter", name, hook)
    reg.filters[name] = fn
    info.filters.append(name)


def _check_schema(info: PluginInfo, hook: str, name: str, schema: Any) -> None:
    if not isinstance(schema, Mapping):
        raise PluginError(info.name, hook, f"'{name}' options schema must be a mapping")
    if info.builtin:
        # Ours, checked by the test suite (tests/test_plugins.py): checking the meta-schema of
        # thirty schemas on every start cost a quarter of `ctxrules validate`.
        return
    import jsonschema

    try:
        jsonschema.Draft202012Validator.check_schema(dict(schema))
    except jsonschema.SchemaError as exc:
        raise PluginError(info.name, hook, f"'{name}' options schema is invalid: {exc.message}") from exc


@cache
def default_registry() -> Registry:
    """The process-wide registry (built-ins plus installed plugins); built once."""
    pm, infos = build_plugin_manager()
    return collect(pm, infos)
