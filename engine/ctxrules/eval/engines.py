"""One loaded engine per pack and process (a replay opens many sessions of the same pack)."""

from __future__ import annotations

from functools import cache

from ctxrules.engine import Engine

__all__ = ["engine_for"]


@cache
def engine_for(ref: str) -> Engine:
    return Engine.load(ref)
