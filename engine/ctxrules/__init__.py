"""ctxrules: a declarative rules engine for the context of LLM agents.

The stable API: ``Engine`` / ``Session`` / ``PrepareResult`` to run packs, and for plugin
authors ``hookimpl``, ``StageType``, ``StageOutcome``, ``Action``, ``StageContext``,
``Message``, and ``ActionType`` and ``TemplateFilter`` (the objects the three registration hooks
take) (docs/architecture.md "Writing a stage"). They are imported on first use, so
``import ctxrules`` stays cheap.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

from ctxrules._version import __version__
from ctxrules.errors import CtxrulesError, MessagesError, PackError, UsageError

# litellm imported after ctxrules (by the caller, or by ctxrules for a model call) reads the model
# map its wheel ships instead of fetching one from the internet on import (offline: seconds of
# retries). A value the caller set is kept (``False`` lets litellm fetch the live map).
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

if TYPE_CHECKING:
    from ctxrules.engine import Engine, Session
    from ctxrules.hookspecs import ActionType, TemplateFilter, hookimpl
    from ctxrules.pipeline.context import StageContext
    from ctxrules.results import PrepareResult
    from ctxrules.stages.base import Action, StageOutcome, StageType
    from ctxrules.types import Message

__all__ = [
    "Action",
    "ActionType",
    "CtxrulesError",
    "Engine",
    "Message",
    "MessagesError",
    "PackError",
    "PrepareResult",
    "Session",
    "StageContext",
    "StageOutcome",
    "StageType",
    "TemplateFilter",
    "UsageError",
    "__version__",
    "hookimpl",
]

# Name -> the module that defines it. The engine pulls in the plugin manager and the stages,
# the stage context the pipeline's budget: none of it is loaded until a name is asked for.
_LAZY: dict[str, str] = {
    "Engine": "ctxrules.engine",
    "Session": "ctxrules.engine",
    "PrepareResult": "ctxrules.results",
    "hookimpl": "ctxrules.hookspecs",
    "StageType": "ctxrules.stages.base",
    "StageOutcome": "ctxrules.stages.base",
    "Action": "ctxrules.stages.base",
    "StageContext": "ctxrules.pipeline.context",
    "ActionType": "ctxrules.hookspecs",
    "TemplateFilter": "ctxrules.hookspecs",
    "Message": "ctxrules.types",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ctxrules' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
