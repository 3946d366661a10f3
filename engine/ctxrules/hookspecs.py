"""The hooks through which every stage, action, filter and option schema reaches ctxrules.

Built-in behaviour is registered through these same hooks (see ``plugins.BUILTIN_PLUGINS``),
so a third-party package is a peer of the built-ins, not a special case. Third-party plugins
are found through the ``ctxrules`` entry-point group. The *loading* hooks are registration
hooks of one shape: each receives a ``register`` callback that takes one object — a
:class:`~ctxrules.StageType`, an :class:`~ctxrules.ActionType` or a
:class:`~ctxrules.TemplateFilter` — and returns nothing. The host validates what is handed over
and raises a :class:`~ctxrules.plugins.PluginError` naming the plugin when it is wrong. Every
implementation of a loading hook is called once, when a plugin registry is built: for
``Engine.load(path, plugins=[...])``, or on the first use of the installed plugins (the CLI,
``Engine.load`` without ``plugins=``). The *pipeline* hooks are called while a stage runs and
return a value.

A plugin imports what it needs from the top level::

    from ctxrules import hookimpl, StageType, StageOutcome, StageContext, Message
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from ctxrules.pipeline.context import StageContext
    from ctxrules.stages.base import StageType

__all__ = ["PROJECT_NAME", "ActionType", "TemplateFilter", "hookimpl", "hookspec"]

PROJECT_NAME = "ctxrules"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


# --- what the registration hooks take (StageType is in ctxrules.stages.base) ----------------


@dataclass(frozen=True)
class ActionType:
    """A compressor action as registered: ``factory(options)`` returns ``lines -> lines``."""

    name: str
    factory: Callable[[Mapping[str, Any]], Callable[[list[str]], list[str]]]
    options_schema: Mapping[str, Any]
    description: str = ""

    def configure(self, options: Mapping[str, Any]) -> Callable[[list[str]], list[str]]:
        """The action for a step's ``with:`` ``options``: each option it leaves out is set to
        the ``default`` the options schema declares (the one place defaults are written)."""
        return self.factory(with_defaults(self.options_schema, options))


def with_defaults(schema: Mapping[str, Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` plus the declared ``default`` of each top-level property they leave out."""
    out = dict(options)
    properties = schema.get("properties")
    for key, spec in properties.items() if isinstance(properties, Mapping) else ():
        if key not in out and isinstance(spec, Mapping) and "default" in spec:
            out[key] = copy.deepcopy(spec["default"])  # a mutable default is never shared
    return out


@dataclass(frozen=True)
class TemplateFilter:
    """A Jinja filter as registered: ``{{ value | name }}`` calls ``function(value, ...)``."""

    name: str
    function: Callable[..., object]


# --- loading -------------------------------------------------------------------------------


@hookspec
def ctxrules_register_stages(register: Callable[[StageType], None]) -> None:
    """Register pipeline stage types.

    Called once per plugin registry (see the module docstring). A stage type carries its
    ``name`` (the ``use:`` value in a pack, e.g. ``compress.dedup``), its phase (``content``,
    ``integrity`` or ``finalize``), a factory that builds a stage from its validated ``with:``
    options, and the JSON Schema those options must satisfy (``ctxrules validate`` checks every
    pack against it, and builds the stage once to check how the options go together).

    :param register: call ``register(StageType(...))`` once for each stage type the plugin
        provides.

    Results are not combined: every implementation is called. Two plugins registering the same
    name is an error that names both.
    """


@hookspec
def ctxrules_register_actions(register: Callable[[ActionType], None]) -> None:
    """Register output-compressor actions (the ``steps:`` of a compressor rule).

    Called once per plugin registry (see the module docstring). An action carries its ``name``
    (the ``use:`` of a step), a ``factory(options)`` that returns a callable mapping a list of
    lines to a list of lines, and the JSON Schema of its ``with:`` options: declare each
    option's default there (``"default": ...``), as stage options do; the factory receives the
    options with those defaults filled in.

    :param register: call ``register(ActionType(name, factory, options_schema, description))``
        once for each action. (The older positional form ``register(name, factory, schema,
        description)`` is still accepted.)

    Every implementation is called; duplicate names are an error.
    """


@hookspec
def ctxrules_register_template_filters(register: Callable[[TemplateFilter], None]) -> None:
    """Register Jinja filters available to prompt templates.

    Called once per plugin registry (see the module docstring) — not per template or per
    assembly: the filters registered then are the ones ``ctxrules validate`` knows (a template
    using another filter is CR080) and the ones every prompt of an engine built with that
    registry is assembled with. Filters must be pure: the same input gives the same output in
    every process (assembled prompts are cached and snapshot-tested byte for byte).

    :param register: call ``register(TemplateFilter(name, function))`` once for each filter.
        (The older positional form ``register(name, function)`` is still accepted.)

    Every implementation is called; duplicate names are an error.
    """


# --- pipeline ------------------------------------------------------------------------------


@hookspec(firstresult=True)
def ctxrules_semantic_filter(text: str, budget_tokens: int, ctx: StageContext) -> str | None:
    """Shorten a large unstructured tool output to about ``budget_tokens`` tokens by meaning.

    Called by ``tool_output.filter`` only when its option ``semantic_filter: true`` is set, for a
    plain-text output (not JSON, XML or a table) that level (b) must reduce.

    :param text: the whole output.
    :param budget_tokens: the size to reach, in tokens of the session's model.
    :param ctx: the stage's context (``ctx.counter`` counts tokens, ``ctx.model`` names the
        session's model; do not touch ``ctx.state``).
    :return: the shortened text, or ``None`` to decline.

    The stage stores the original in the vault and puts a marker before
    what is returned; a result that is not a string, is empty or is over the budget is ignored
    and the structure-aware reduction is used instead, as it is when the plugin raises.

    Stops at the first non-None result (``firstresult=True``). Nothing implements this hook by
    default: ctxrules works offline without it.
    """


# --- routing -------------------------------------------------------------------------------


@hookspec(firstresult=True)
def ctxrules_route_judge(text: str, tier: str, score: float, reasons: list[str]) -> str | None:
    """Second opinion on a routing decision: the optional LLM judge of the complexity router.

    Called by ``ctxrules.budget.router`` only when the pack sets ``router.judge.enabled: true``
    and the rule score lies within ``router.judge.band`` of a tier cutoff (the ambiguous cases).

    :param text: the message being routed.
    :param tier: the tier the rules chose (``simple``, ``standard`` or ``reasoning``).
    :param score: the rules' score.
    :param reasons: the ids of the rules that matched.
    :return: one of the three tier names to use instead, or ``None`` to keep the rules' tier.

    Anything else, or an exception, is ignored (and noted in the decision's
    reasons): routing never fails because a judge did. A judge that has not returned after
    ``router.judge.timeout_s`` seconds (default 10) is given up the same way: it runs on a
    helper thread (:func:`ctxrules.llm.call_within`), which is left to end on its own. Momentum,
    the regeneration floor and privacy routing are applied after the judge.

    Stops at the first non-None result (``firstresult=True``). Nothing implements this hook by
    default: routing is deterministic without it.
    """
