"""The Jinja environment prompt templates render in.

Sandboxed (templates come from packs, which are code review material, not trusted code) and
``StrictUndefined`` (a misspelled variable is an error, never an empty string). Whitespace:
``trim_blocks`` and ``lstrip_blocks`` are on, so block tags on their own lines leave no blank
lines; a trailing newline is kept (the assembler then tidies every body, see
``ctxrules.prompts.assemble.tidy``). ``{% include "NAME" %}`` includes another section by name.

Limits: rendering is counted in operations and characters (:mod:`ctxrules.prompts.limits`), so
no template can hang or exhaust the engine, and the verdict is the same on every machine.

Determinism: an assembled prompt must be byte-identical in every process, so the two things
Jinja offers that are random by design are removed: the ``lipsum`` global and the ``random``
filter. A template that uses them fails to compile, and ``validate`` says why (CR085).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from jinja2 import BaseLoader, StrictUndefined

from ctxrules.prompts.limits import LimitedEnvironment

# Variables every template may use without declaring them in prompts.variables.
BUILTIN_VARIABLES: frozenset[str] = frozenset({"mode", "model_entry"})
# Jinja built-ins whose output changes from call to call.
RANDOM_GLOBALS: frozenset[str] = frozenset({"lipsum"})
RANDOM_FILTERS: frozenset[str] = frozenset({"random"})


def make_environment(
    loader: BaseLoader | None = None, filters: Mapping[str, Callable[..., object]] | None = None
) -> LimitedEnvironment:
    env = LimitedEnvironment(
        loader=loader,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    for name in RANDOM_GLOBALS:
        env.globals.pop(name, None)
    for name in RANDOM_FILTERS:
        env.filters.pop(name, None)
    if filters:
        env.filters.update(filters)
    env.wrap_filters()  # counted and size-checked, built-in and plugin filters alike
    return env
