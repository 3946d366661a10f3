"""Limits on what one template render may do, counted in operations and characters.

Jinja's sandbox stops a template from reaching Python's internals, not from using all of the
machine: ``{{ 9**99999999 }}`` computes for minutes, ``{{ 'x' * 3000000000 }}`` asks for 3 GB,
two nested loops over ``range(100000)`` never end. Seconds would make the verdict depend on
the machine's load, so every limit here is a count, the same on every machine:

- :data:`MAX_OPERATIONS` operations per render: each arithmetic operator, function, method or
  filter call, ``~`` concatenation and loop iteration costs one;
- :data:`MAX_CHARS` characters (or items) for any string or sequence a template builds, and
  for the rendered output;
- :data:`MAX_INT_BITS` bits for an integer (``**`` and ``*`` are checked before computing);
- ``range`` is counted item by item (and Jinja's own cap of 100,000 items holds).

A render that would break one raises :class:`RenderLimitError` (a ``SecurityError``) before
the work is done; the assembler reports it like any render failure, located at the section.
"""

from __future__ import annotations

import contextvars
import functools
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from jinja2 import nodes
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

__all__ = ["MAX_CHARS", "MAX_INT_BITS", "MAX_OPERATIONS", "LimitedEnvironment", "RenderLimitError"]

MAX_OPERATIONS = 1_000_000
MAX_CHARS = 1_000_000
MAX_INT_BITS = 14_000  # about 4,300 decimal digits: what Python itself will print of an int


class RenderLimitError(SecurityError):
    """A template tried to do more than the render limits allow."""


_BUDGET: contextvars.ContextVar[list[int]] = contextvars.ContextVar("ctxrules_render_budget")


def _charge(n: int = 1) -> None:
    budget = _BUDGET.get(None)
    if budget is None:  # rendering outside LimitedEnvironment.render_limited: still bounded
        budget = [MAX_OPERATIONS]
        _BUDGET.set(budget)
    budget[0] -= n
    if budget[0] < 0:
        raise RenderLimitError(f"the template does more than {MAX_OPERATIONS:,} operations")


def _sized(value: Any) -> int | None:
    return len(value) if isinstance(value, str | bytes | list | tuple) else None


def _check_length(size: int, what: str) -> None:
    if size > MAX_CHARS:
        raise RenderLimitError(f"{what} would be {size:,} characters or items long; the limit is {MAX_CHARS:,}")


def _check_size(value: Any, what: str) -> Any:
    size = _sized(value)
    if size is not None:
        _check_length(size, what)
    return value


def _check_int(bits: int, what: str) -> None:
    if bits > MAX_INT_BITS:
        raise RenderLimitError(
            f"{what} would have about {int(bits * 0.30103):,} digits; the limit is {int(MAX_INT_BITS * 0.30103):,}"
        )


_WIDTH = re.compile(r"(\d{7,})")  # a width or precision of a million or more in a format string


def _check_format(fmt: object) -> None:
    if isinstance(fmt, str):
        for digits in _WIDTH.findall(fmt):
            if int(digits) > MAX_CHARS:
                raise RenderLimitError(f"a format width of {int(digits):,} is over the limit of {MAX_CHARS:,}")


def _check_args(args: Iterable[Any], kwargs: Mapping[str, Any], what: str) -> None:
    # A count or width argument (center(3e9), indent(width=...), ljust, ...) asks for that much
    # output: none may exceed what a whole render may produce.
    for value in [*args, *kwargs.values()]:
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_CHARS:
            raise RenderLimitError(f"{what} is given {value:,}; arguments are limited to {MAX_CHARS:,}")


class _Counted:
    """What a ``{% for %}`` iterates over, one operation per item."""

    def __init__(self, iterable: Iterable[Any]) -> None:
        self.iterable = iterable

    def __iter__(self) -> Iterator[Any]:
        for item in self.iterable:
            _charge()
            yield item

    def __len__(self) -> int:
        return len(self.iterable)  # type: ignore[arg-type]


class _Instrument(NodeTransformer):
    """Routes loops and ``~`` through the environment's counting helpers."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = nodes.Call(
            nodes.EnvironmentAttribute("ctxrules_counted"), [node.iter], [], None, None, lineno=node.lineno
        )
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return nodes.Call(
            nodes.EnvironmentAttribute("ctxrules_concat"), [nodes.List(node.nodes)], [], None, None, lineno=node.lineno
        )


def _limited_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(func)  # keeps jinja_pass_arg (pass_context & co.)
    def call(*args: Any, **kwargs: Any) -> Any:
        _charge()
        _check_args(args[1:], kwargs, f"filter '{name}'")
        if name == "format" and args:
            _check_format(args[0])
        return _check_size(func(*args, **kwargs), f"the result of filter '{name}'")

    return call


class LimitedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox with the counted limits of this module."""

    intercepted_binops = frozenset({"+", "-", "*", "/", "//", "%", "**"})
    intercepted_unops = frozenset({"-", "+"})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.globals["range"] = self._range
        self.concat = self._concat_output  # type: ignore[method-assign]

    def wrap_filters(self) -> None:
        """Count and check every filter (call after the filters are all registered)."""
        for name, func in list(self.filters.items()):
            if not getattr(func, "_ctxrules_limited", False):
                wrapped = _limited_filter(name, func)
                wrapped._ctxrules_limited = True  # type: ignore[attr-defined]
                self.filters[name] = wrapped

    def render_limited(self, render: Callable[[], str]) -> str:
        """``render()`` with a fresh operation budget."""
        token = _BUDGET.set([MAX_OPERATIONS])
        try:
            return render()
        finally:
            _BUDGET.reset(token)

    # -- compile-time instrumentation -----------------------------------------------------
    def _generate(
        self, source: nodes.Template, name: str | None, filename: str | None, defer_init: bool = False
    ) -> str:
        return super()._generate(_Instrument().visit(source), name, filename, defer_init)

    def ctxrules_counted(self, iterable: Any) -> Any:
        return _Counted(iterable)

    def ctxrules_concat(self, parts: list[Any]) -> str:
        _charge()
        total = 0
        texts = []
        for part in parts:
            text = str(part)
            total += len(text)
            if total > MAX_CHARS:
                raise RenderLimitError(f"a '~' concatenation would be over {MAX_CHARS:,} characters")
            texts.append(text)
        return "".join(texts)

    def _concat_output(self, pieces: Iterable[str]) -> str:
        total = 0
        out = []
        for piece in pieces:
            total += len(piece)
            if total > MAX_CHARS:
                raise RenderLimitError(f"the rendered text would be over {MAX_CHARS:,} characters")
            out.append(piece)
        return "".join(out)

    def _range(self, *args: int) -> _Counted:
        _check_args(args, {}, "range")
        return _Counted(range(*args))

    # -- run-time checks ------------------------------------------------------------------
    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapped = super().wrap_str_format(value)
        if wrapped is not None:
            _check_format(value.__self__)  # before the sandbox formats: a width is an allocation
        return wrapped

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _charge()
        if operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0:
            _check_int(max(abs(left).bit_length(), 1) * right if abs(left) > 1 else 1, "a power")
        elif operator == "*":
            for seq, count in ((left, right), (right, left)):
                size = _sized(seq)
                if size is not None and isinstance(count, int):
                    _check_length(size * max(count, 0), "a repetition")
            if isinstance(left, int) and isinstance(right, int):
                _check_int(abs(left).bit_length() + abs(right).bit_length(), "a product")
        elif operator == "+":
            a, b = _sized(left), _sized(right)
            if a is not None and b is not None:
                _check_length(a + b, "a sum")
        elif operator == "%" and isinstance(left, str):
            _check_format(left)
        return super().call_binop(context, operator, left, right)

    def call_unop(self, context: Any, operator: str, arg: Any) -> Any:
        _charge()
        return super().call_unop(context, operator, arg)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        _charge()
        _check_args(args, kwargs, f"{getattr(__obj, '__name__', 'a call')}()")
        if getattr(__obj, "__name__", None) in ("format", "format_map") and isinstance(
            getattr(__obj, "__self__", None), str
        ):
            _check_format(__obj.__self__)
        return _check_size(super().call(__context, __obj, *args, **kwargs), "a call's result")
