"""The Jinja environment prompt templates render in.

Sandboxed (templates come from packs, which are code review material, not trusted code) and
``StrictUndefined`` (a misspelled variable is an error, never an empty string). Whitespace:
``trim_blocks`` and ``lstrip_blocks`` are on, so block tags on their own lines leave no blank
lines; a trailing newline is kept. ``{% include "NAME" %}`` includes another section by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from jinja2 import BaseLoader, StrictUndefined
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Variables every template may use without declaring them in prompts.variables.
BUILTIN_VARIABLES: frozenset[str] = frozenset({"mode", "model_entry"})


def make_environment(loader: BaseLoader | None = None,
                     filters: Mapping[str, Callable[..., object]] | None = None) -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        loader=loader,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    if filters:
        env.filters.update(filters)
    return env
