"""A context variable set for the duration of a ``with`` block, as a small class.

Several scopes are entered around every ``prepare`` (trusted message objects, the token
ceiling, serialise-once, the injection key). As generator-based context managers each cost
the generator machinery on entry and exit, a measurable part of a warm turn; this is the same
set-then-reset as a plain object.
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from typing import Generic, TypeVar

__all__ = ["Scoped"]

T = TypeVar("T")


class Scoped(Generic[T]):
    """``with Scoped(var, value) as v:`` sets ``var`` to ``value`` (``v``) inside the block and
    restores the previous value after it, also when the block raises. One use per object."""

    __slots__ = ("_token", "_value", "_var")

    def __init__(self, var: ContextVar[T], value: T) -> None:
        self._var, self._value = var, value
        self._token: Token[T] | None = None

    def __enter__(self) -> T:
        self._token = self._var.set(self._value)
        return self._value

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            self._var.reset(self._token)
            self._token = None
