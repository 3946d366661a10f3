"""The hooks through which every stage, action, filter and option schema reaches ctxrules.

Built-in behaviour is registered through these same hooks (see ``plugins.BUILTIN_PLUGINS``),
so a third-party package is a peer of the built-ins, not a special case. Third-party plugins
are found through the ``ctxrules`` entry-point group. Every hook here is a *registration* hook:
it receives a ``register`` callback and returns nothing; the host validates what is handed over
and raises a :class:`~ctxrules.plugins.PluginError` naming the plugin when it is wrong.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from collections.abc import Callable

    from ctxrules.stages.base import StageType

PROJECT_NAME = "ctxrules"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


# --- loading -------------------------------------------------------------------------------


@hookspec
def ctxrules_register_stages(register: Callable[[StageType], None]) -> None:
    """Register pipeline stage types.

    Called once, when the plugin manager is first built. Call ``register(StageType(...))`` for
    each stage type the plugin provides. A stage type carries its ``name`` (the ``use:`` value in
    a pack, e.g. ``compress.dedup``), its phase (``content``, ``integrity`` or ``finalize``), a
    factory that builds a stage from its validated ``with:`` options, and the JSON Schema those
    options must satisfy (``ctxrules validate`` checks every pack against it).

    Results are not combined: every implementation is called. Two plugins registering the same
    name is an error that names both.
    """


@hookspec
def ctxrules_register_actions(register: Callable[..., None]) -> None:
    """Register output-compressor actions (the ``steps:`` of a compressor rule).

    Called once, when the plugin manager is first built; ``register(name, factory, schema)``
    where ``factory(options)`` returns a callable that maps a list of lines to a list of lines.
    Every implementation is called; duplicate names are an error.
    """


@hookspec
def ctxrules_register_template_filters(register: Callable[[str, Callable[..., object]], None]) -> None:
    """Register Jinja filters available to prompt templates.

    Called once per template environment; ``register(name, function)``. Filters must be pure:
    the same input gives the same output in every process (assembled prompts are cached and
    snapshot-tested byte for byte). Every implementation is called; duplicate names are an error.
    """
