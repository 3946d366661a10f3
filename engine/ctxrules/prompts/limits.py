"""Limits on what one template render may do, counted in operations and characters.

Jinja's sandbox stops a template from reaching Python's internals, not from using all of the
machine: ``{{ 9**99999999 }}`` computes for minutes, ``{{ 'x' * 3000000000 }}`` asks for 3 GB,
two nested loops over ``range(100000)`` never end. Seconds would make the verdict depend on
the machine's load, so every limit here is a count, the same on every machine:

- :data:`MAX_OPERATIONS` operations per render: each arithmetic operator, function, method or
  filter call, ``~`` concatenation, loop iteration, include and import costs one;
- :data:`MAX_CHARS` characters (or items) for any string or sequence a template builds, and
  for the rendered output; operations that multiply their input (``replace``, ``join``,
  ``indent``, ``wordwrap``, ``expandtabs``, ``translate``, ``format`` and ``%``, ``tojson``,
  ``sum``, writing out a list) are checked *before* they run, on a bound computed from their
  arguments, so no single step allocates more than that;
- :data:`MAX_TOTAL_CHARS` characters for all the strings and sequences one render builds
  together (a loop that keeps a million-character string per iteration stops there);
- :data:`MAX_READ` characters (or items) for all the strings, sequences and mappings its
  filters, calls and membership tests (``in``, ``is in``) are given: one operation may scan a
  million of them (``s|wordcount``,
  ``l|sort``, ``s.count(x)``, ``x in s``), and a million such operations would run for hours;
- :data:`MAX_INT_BITS` bits for an integer (``**`` and ``*`` are checked before computing);
- ``range`` is counted item by item (and Jinja's own cap of 100,000 items holds).

A render that would break one raises :class:`RenderLimitError` (a ``SecurityError``) before
the work is done; the assembler reports it like any render failure, located at the section.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import CodeType
from typing import Any

from jinja2 import Undefined, nodes
from jinja2.exceptions import SecurityError
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

from ctxrules.prompts.building import (
    BUILD_FAILURES,
    TemplateBuildError,
    generated_line,
    on_a_fresh_stack,
    token_line,
    tree_line,
)

__all__ = [
    "MAX_CHARS",
    "MAX_INT_BITS",
    "MAX_OPERATIONS",
    "MAX_READ",
    "MAX_TOTAL_CHARS",
    "MAX_TRIAL_OPERATIONS",
    "MAX_TRIAL_RENDERS",
    "LimitedEnvironment",
    "RenderLimitError",
    "render_budget",
    "trial_spending",
]

MAX_OPERATIONS = 1_000_000
MAX_CHARS = 1_000_000
MAX_INT_BITS = 14_000  # about 4,300 decimal digits: what Python itself will print of an int
MAX_TOTAL_CHARS = 100 * MAX_CHARS
MAX_READ = 10 * MAX_CHARS
# The trial render of a pack (every prompt mode for every models: entry, in `validate` and when
# a pack is loaded): each prompt has its own budget, so without a bound of their own a pack of
# a thousand modes and a thousand entries would take hours to check.
MAX_TRIAL_RENDERS = 10_000
MAX_TRIAL_OPERATIONS = 20 * MAX_OPERATIONS


class RenderLimitError(SecurityError):
    """A template tried to do more than the render limits allow."""


_BUDGET: contextvars.ContextVar[list[int]] = contextvars.ContextVar("ctxrules_render_budget")
# The budget the renders inside a render_budget() share (one assembled prompt).
_SCOPE: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("ctxrules_render_scope", default=None)
# The operations the prompts rendered inside a trial_spending() used, together.
_TRIAL: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("ctxrules_render_trial", default=None)


def _fresh_budget() -> list[int]:
    """Operations, characters built and characters read left to one render."""
    return [MAX_OPERATIONS, MAX_TOTAL_CHARS, MAX_READ]


def _budget() -> list[int]:
    budget = _BUDGET.get(None)
    if budget is None:  # rendering outside LimitedEnvironment.render_limited: still bounded
        budget = _fresh_budget()
        _BUDGET.set(budget)
    return budget


def _charge(n: int = 1) -> None:
    budget = _budget()
    budget[0] -= n
    if budget[0] < 0:
        raise RenderLimitError(f"the template does more than {MAX_OPERATIONS:,} operations")


def _spend(size: int) -> None:
    """Count ``size`` characters (or items) a render built against :data:`MAX_TOTAL_CHARS`."""
    budget = _budget()
    budget[1] -= size
    if budget[1] < 0:
        raise RenderLimitError(f"the template builds more than {MAX_TOTAL_CHARS:,} characters or items in all")


def _read(*values: Any) -> None:
    """Count the strings, sequences and mappings among ``values`` against :data:`MAX_READ`
    characters (or items) read: what a filter, call or membership test is given it may scan."""
    size = sum(len(v) for v in values if isinstance(v, str | bytes | list | tuple | dict | set | frozenset))
    if size:
        budget = _budget()
        budget[2] -= size
        if budget[2] < 0:
            raise RenderLimitError(
                f"the template reads more than {MAX_READ:,} characters or items in all "
                "(filters, calls and `in` over long strings, lists or mappings)"
            )


def _sized(value: Any) -> int | None:
    return len(value) if isinstance(value, str | bytes | list | tuple) else None


def _check_length(size: int, what: str) -> None:
    if size > MAX_CHARS:
        raise RenderLimitError(f"{what} would be {size:,} characters or items long; the limit is {MAX_CHARS:,}")


def _check_size(value: Any, what: str) -> Any:
    size = _sized(value)
    if size is not None:
        _check_length(size, what)
        _spend(size)
    return value


def _weight(value: Any, limit: int = MAX_CHARS) -> int:
    """About how many characters ``str(value)`` has (strings, numbers, and containers of them),
    counted without building it; stops counting once past ``limit``."""
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str | bytes):
            total += len(item)
        elif isinstance(item, bool) or item is None:
            total += 5
        elif isinstance(item, int):
            total += int(item.bit_length() * 0.30103) + 2
        elif isinstance(item, list | tuple | set | frozenset):
            total += 2 * len(item) + 2  # brackets, separators
            if total <= limit:
                stack.extend(item)
        elif isinstance(item, dict):
            total += 4 * len(item) + 2
            if total <= limit:
                stack.extend(item.keys())
                stack.extend(item.values())
        else:
            total += 24  # a float, an undefined, a Markup-free object: a short text
        if total > limit:
            return total
    return total


def _bound(name: str, value: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], method: bool) -> int | None:
    """An upper bound of the size of ``name(value, *args, **kwargs)`` (a filter, or with
    ``method`` a method of the string ``value``) for the operations whose result can be much
    larger than their input; None for the rest (their result is checked after)."""

    def arg(i: int, key: str, default: Any) -> Any:
        return args[i] if len(args) > i else kwargs.get(key, default)

    if name == "replace" and isinstance(value, str):
        old, new, count = str(arg(0, "old", "")), str(arg(1, "new", "")), arg(2, "count", None)
        times = value.count(old) if old else len(value) + 1
        if isinstance(count, int) and count >= 0:
            times = min(times, count)
        return len(value) + times * max(0, len(new) - len(old))
    if name == "join":
        sep, items = (value, arg(0, "iterable", ())) if method else (str(arg(0, "d", "")), value)
        if isinstance(items, str):
            return len(items) * (1 + len(sep))
        if isinstance(items, list | tuple):
            return _weight(items, MAX_CHARS + 1) + len(sep) * max(0, len(items) - 1)
        return None
    if name == "indent" and isinstance(value, str):
        width = arg(0, "width", 4)
        pad = len(width) if isinstance(width, str) else width if isinstance(width, int) else 4
        return len(value) + max(0, pad) * (value.count("\n") + 1)
    if name == "wordwrap" and isinstance(value, str):
        wrap = arg(3, "wrapstring", None)
        return len(value) * (1 + (len(wrap) if isinstance(wrap, str) else 1)) + 1
    if name == "expandtabs" and isinstance(value, str):
        size = arg(0, "tabsize", 8)
        return len(value) + value.count("\t") * (size if isinstance(size, int) else 8)
    if name == "translate" and isinstance(value, str):
        table = arg(0, "table", {})
        texts = [v for v in table.values() if isinstance(v, str)] if isinstance(table, dict) else []
        return len(value) * max(1, *map(len, texts))
    if name in ("format", "format_map") and isinstance(value, str):
        # A filter `format` is printf-style; the method `str.format` uses braces.
        widest = max((_weight(a, MAX_CHARS + 1) for a in [*args, *kwargs.values()]), default=0)
        return len(value) + (value.count("%") + value.count("{")) * widest
    if name in ("tojson", "pprint", "string"):
        indent = arg(0, "indent", None) if name == "tojson" else None
        depth_pad = indent if isinstance(indent, int) and indent > 0 else 0
        weight = _weight(value, MAX_CHARS + 1)
        return weight * (1 + depth_pad) if depth_pad else weight
    if name == "sum" and isinstance(value, list | tuple):
        return sum(len(v) for v in value if isinstance(v, list | tuple | str))
    return None


def _check_bound(
    name: str, value: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], what: str, *, method: bool = False
) -> None:
    bound = _bound(name, value, args, kwargs, method)
    if bound is not None:
        _check_length(bound, what)


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


def _finalize(value: Any) -> Any:
    """Every ``{{ ... }}`` value before it is written out: a list of a million references to
    a million-character string is small, its text is not; and only values whose text is the
    same in every process (a method or an object prints its memory address, a set its
    hash-seeded order), so an assembled prompt stays byte-identical."""
    if not isinstance(value, str):
        _check_length(_weight(value, MAX_CHARS + 1), "a value written out")
        odd = _unstable(value)
        if odd is not None:
            raise TypeError(
                f"a {{{{ ... }}}} writes out a {odd}, whose text differs between processes; "
                "write a value (a call missing its '()'?)"
            )
    return value


_STABLE = (str, int, float, bool, type(None), Undefined)


def _unstable(value: Any) -> str | None:
    """The type name of the first value in ``value`` (lists, tuples, dicts walked) whose text
    is not the same in every process; None when there is none."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, _STABLE):
            continue
        if isinstance(item, list | tuple):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        else:
            return type(item).__name__
    return None


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


def _reading(expr: nodes.Expr) -> nodes.Expr:
    """``expr`` passed through the environment's read counter."""
    return nodes.Call(nodes.EnvironmentAttribute("ctxrules_read"), [expr], [], None, None, lineno=expr.lineno)


class _Instrument(NodeTransformer):
    """Routes loops, ``~``, comparisons, tests, includes and imports through the environment's
    counting helpers."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = nodes.Call(
            nodes.EnvironmentAttribute("ctxrules_counted"), [node.iter], [], None, None, lineno=node.lineno
        )
        return node

    def visit_Compare(self, node: nodes.Compare) -> nodes.Node:
        # Membership scans its container: both sides of `in` / `not in` are counted as read.
        # Other comparisons look at a value once (or compare memory) and stay uncounted.
        self.generic_visit(node)
        sides: list[nodes.Compare | nodes.Operand] = [node, *node.ops]
        read: set[int] = set()
        for k, operand in enumerate(node.ops):
            if operand.op in ("in", "notin"):
                read.update((k, k + 1))  # the operands left and right of it
        for k in sorted(read):
            sides[k].expr = _reading(sides[k].expr)
        return node

    def visit_Test(self, node: nodes.Test) -> nodes.Node:
        self.generic_visit(node)
        if node.name == "in":  # `x is in s`: the one test that scans what it is given
            node.node = _reading(node.node)
            node.args = [_reading(a) for a in node.args]
        return node

    def visit_Include(self, node: nodes.Include) -> nodes.Node:
        return self._rendering(node)

    def visit_Import(self, node: nodes.Import) -> nodes.Node:
        return self._rendering(node)

    def visit_FromImport(self, node: nodes.FromImport) -> nodes.Node:
        return self._rendering(node)

    def visit_Extends(self, node: nodes.Extends) -> nodes.Node:
        return self._rendering(node)

    def _rendering(self, node: nodes.Include | nodes.Import | nodes.FromImport | nodes.Extends) -> nodes.Node:
        # Each include or import renders a template: sections that include two others each
        # render 2**n templates that may write nothing and call nothing.
        self.generic_visit(node)
        node.template = nodes.Call(
            nodes.EnvironmentAttribute("ctxrules_rendering"), [node.template], [], None, None, lineno=node.lineno
        )
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return nodes.Call(
            nodes.EnvironmentAttribute("ctxrules_concat"), [nodes.List(node.nodes)], [], None, None, lineno=node.lineno
        )


def _limited_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    # pass_context, pass_eval_context and pass_environment filters get that object first.
    skip = 2 if getattr(func, "jinja_pass_arg", None) is not None else 1

    @functools.wraps(func)  # keeps jinja_pass_arg (pass_context & co.)
    def call(*args: Any, **kwargs: Any) -> Any:
        _charge()
        _check_args(args[skip:], kwargs, f"filter '{name}'")
        _read(*args[skip - 1 :], *kwargs.values())
        if len(args) >= skip:
            value = args[skip - 1]
            if name in ("join", "sum") and not isinstance(value, list | tuple | str | dict):
                # A generator (map, select): its items are needed to bound the result.
                value = _check_size(list(_Counted(value)), f"the input of filter '{name}'")
                args = (*args[: skip - 1], value, *args[skip:])
            if name == "format":
                _check_format(value)
            _check_bound(name, value, args[skip:], kwargs, f"the result of filter '{name}'")
        return _check_size(func(*args, **kwargs), f"the result of filter '{name}'")

    return call


@contextlib.contextmanager
def render_budget() -> Iterator[None]:
    """One budget for every :meth:`LimitedEnvironment.render_limited` inside: the sections of
    one prompt share it, so a mode that lists a costly section ten thousand times stops at the
    limits of one render."""
    budget = _fresh_budget()
    token = _SCOPE.set(budget)
    try:
        yield
    finally:
        _SCOPE.reset(token)
        spent = _TRIAL.get()
        if spent is not None:
            spent[0] += MAX_OPERATIONS - max(budget[0], 0)


@contextlib.contextmanager
def trial_spending() -> Iterator[list[int]]:
    """A one-item list that counts the operations of every prompt rendered (each inside its
    own :func:`render_budget`) within: what a trial render checks against
    :data:`MAX_TRIAL_OPERATIONS`."""
    spent = [0]
    token = _TRIAL.set(spent)
    try:
        yield spent
    finally:
        _TRIAL.reset(token)


class LimitedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox with the counted limits of this module."""

    intercepted_binops = frozenset({"+", "-", "*", "/", "//", "%", "**"})
    intercepted_unops = frozenset({"-", "+"})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("finalize", _finalize)
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
        """``render()`` (one operation) with a fresh budget, or inside :func:`render_budget`
        with the budget all its renders share."""
        scope = _SCOPE.get()
        token = _BUDGET.set(scope if scope is not None else _fresh_budget())
        try:
            _charge()
            return render()
        finally:
            _BUDGET.reset(token)

    # -- building: a template too deep to build is a TemplateBuildError (building.py) ------
    def parse(self, *args: Any, **kwargs: Any) -> Any:
        return on_a_fresh_stack(functools.partial(super().parse, *args, **kwargs))

    def compile(self, *args: Any, **kwargs: Any) -> Any:
        return on_a_fresh_stack(functools.partial(super().compile, *args, **kwargs))

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        parser = None
        try:
            parser = Parser(self, source, name, filename)
            return parser.parse()
        except BUILD_FAILURES as exc:
            # the token the parser stood on when it gave up: where the nesting went too deep;
            # a number too long is found by lexing again (the parser stands on the token before)
            line = parser.stream.current.lineno if parser is not None else 1
            if isinstance(exc, ValueError):
                line = token_line(self.lexer.tokeniter(source, name, filename)) or line
            raise TemplateBuildError(exc, "Jinja to parse", line, name, filename) from None

    def _generate(
        self, source: nodes.Template, name: str | None, filename: str | None, defer_init: bool = False
    ) -> str:
        try:
            return super()._generate(_Instrument().visit(source), name, filename, defer_init)
        except BUILD_FAILURES as exc:
            raise TemplateBuildError(exc, "Jinja to compile", tree_line(source, exc), name, filename) from None

    def _compile(self, source: str, filename: str) -> CodeType:
        try:
            return super()._compile(source, filename)
        except BUILD_FAILURES as exc:
            line = generated_line(source, exc)
            raise TemplateBuildError(exc, "Python to compile", line, None, filename) from None

    def ctxrules_counted(self, iterable: Any) -> Any:
        return _Counted(iterable)

    def ctxrules_rendering(self, template: Any) -> Any:
        _charge()
        return template

    def ctxrules_read(self, value: Any) -> Any:
        _read(value)
        return value

    def ctxrules_concat(self, parts: list[Any]) -> str:
        _charge()
        total = 0
        texts = []
        for part in parts:
            _check_length(total + _weight(part, MAX_CHARS + 1), "a '~' concatenation")
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
        _spend(total)
        return "".join(out)

    def _range(self, *args: int) -> _Counted:
        _check_args(args, {}, "range")
        return _Counted(range(*args))

    # -- run-time checks ------------------------------------------------------------------
    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        fmt, name = value.__self__, value.__name__
        _check_format(fmt)  # before the sandbox formats: a width is an allocation

        def checked(*args: Any, **kwargs: Any) -> str:
            # "{0}" * 300,000 formatting a long text is a small call with a huge result.
            _check_bound(name, fmt, args, kwargs, f"the result of str.{name}()", method=True)
            return wrapped(*args, **kwargs)

        return checked

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
            _check_length(len(left) + left.count("%") * _weight(right, MAX_CHARS + 1), "a '%' format")
        return _check_size(super().call_binop(context, operator, left, right), f"a '{operator}' result")

    def call_unop(self, context: Any, operator: str, arg: Any) -> Any:
        _charge()
        return super().call_unop(context, operator, arg)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(__obj, "__func__", None) in _PASS_THROUGH:
            # The counters the instrumented code calls around a value: they count what they
            # must themselves, and the value they hand back is the template's own (an int of a
            # million is a context window, not a call's argument to bound). Jinja's own
            # keywords (_loop_vars, _block_vars) are not theirs.
            return __obj(*args)
        _charge()
        _check_args(args, kwargs, f"{getattr(__obj, '__name__', 'a call')}()")
        owner = getattr(__obj, "__self__", None)
        _read(owner, *args, *kwargs.values())
        if isinstance(owner, str):
            name = getattr(__obj, "__name__", "")
            if name in ("format", "format_map"):
                _check_format(owner)
            if name == "join" and args and not isinstance(args[0], list | tuple | str | dict):
                args = (_check_size(list(_Counted(args[0])), "the input of str.join()"), *args[1:])
            _check_bound(name, owner, args, kwargs, f"the result of str.{name}()", method=True)
        return _check_size(super().call(__context, __obj, *args, **kwargs), "a call's result")


# Helpers the instrumented templates call that pass a value through (see LimitedEnvironment.call).
_PASS_THROUGH = (LimitedEnvironment.ctxrules_read, LimitedEnvironment.ctxrules_rendering)
