"""The hooks through which every stage, action, filter and option schema reaches ctxrules.

Built-in behaviour is registered through these same hooks (see ``plugins.BUILTIN_PLUGINS``),
so a third-party package is a peer of the built-ins, not a special case. Third-party plugins
are found through the ``ctxrules`` entry-point group. The *loading* hooks are registration
hooks: they receive a ``register`` callback and return nothing; the host validates what is
handed over and raises a :class:`~ctxrules.plugins.PluginError` naming the plugin when it is
wrong. The *pipeline* hooks are called while a stage runs and return a value.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from collections.abc import Callable

    from ctxrules.pipeline.context import StageContext
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


# --- pipeline ------------------------------------------------------------------------------


@hookspec(firstresult=True)
def ctxrules_semantic_filter(text: str, budget_tokens: int, ctx: StageContext) -> str | None:
    """Shorten a large unstructured tool output to about ``budget_tokens`` tokens by meaning.

    Called by ``tool_output.filter`` only when its option ``semantic_filter: true`` is set, for a
    plain-text output (not JSON, XML or a table) that level (b) must reduce. ``text`` is the
    whole output; ``ctx`` is the stage's context (``ctx.counter`` counts tokens, ``ctx.model``
    names the session's model; do not touch ``ctx.state``). Return the shortened text, or
    ``None`` to decline. The stage stores the original in the vault and puts a marker before
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
    ``text`` is the message being routed, ``tier`` the tier the rules chose (``simple``,
    ``standard`` or ``reasoning``), ``score`` their score and ``reasons`` the ids of the rules
    that matched. Return one of the three tier names to use instead, or ``None`` to keep the
    rules' tier. Anything else, or an exception, is ignored (and noted in the decision's
    reasons): routing never fails because a judge did. Momentum, the regeneration floor and
    privacy routing are applied after the judge.

    Stops at the first non-None result (``firstresult=True``). Nothing implements this hook by
    default: routing is deterministic without it.
    """

