"""ctxrules: a declarative rules engine for the context of LLM agents."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ctxrules._version import __version__
from ctxrules.errors import CtxrulesError, MessagesError, PackError, UsageError

if TYPE_CHECKING:
    from ctxrules.engine import Engine, Session
    from ctxrules.results import PrepareResult

__all__ = [
    "CtxrulesError",
    "Engine",
    "MessagesError",
    "PackError",
    "PrepareResult",
    "Session",
    "UsageError",
    "__version__",
]


def __getattr__(name: str) -> Any:
    # The engine pulls in the plugin manager and stages; keep `import ctxrules` cheap.
    if name in ("Engine", "Session", "PrepareResult"):
        from ctxrules import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'ctxrules' has no attribute {name!r}")
