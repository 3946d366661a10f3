"""Templates Jinja's parser or Python's compiler cannot build, as a located template error.

Jinja parses, instruments and generates code for a template by recursion, several calls per
level of nesting, and Python compiles that code under fixed limits of its own (20 nested
loops, 100 levels of indentation, 200 open brackets). A pack is not trusted code: a template
that nests blocks, brackets, operators, filters or attributes deeper than those (or an integer
literal longer than Python reads or writes, 4,300 digits) would otherwise end in a
``RecursionError``, ``SyntaxError`` or ``ValueError`` that says nothing of the template.
:class:`TemplateBuildError` is a ``TemplateSyntaxError``, so every caller that reports a
template that does not parse reports it too, at the template line where the nesting went too
deep or the number stands.

Whether a template builds does not depend on the caller: Jinja builds it in a thread of its
own, on a fresh stack (:func:`on_a_fresh_stack`), so ``validate`` and ``run`` agree. The walks
here are loops, not recursion: they must work on trees too deep for Jinja's own
(``Node.find_all``).
"""

from __future__ import annotations

import contextvars
import re
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from jinja2 import TemplateSyntaxError, nodes

__all__ = [
    "BUILD_FAILURES",
    "TemplateBuildError",
    "find_all",
    "generated_line",
    "on_a_fresh_stack",
    "token_line",
    "tree_line",
]

# What parsing or compiling a template raises when it is too deep or a number too long.
# (IndentationError is a SyntaxError; MemoryError is what Python's parser raised for too deep
# an expression before 3.12.)
BUILD_FAILURES = (RecursionError, SyntaxError, MemoryError, ValueError)

_N = TypeVar("_N", bound=nodes.Node)
_T = TypeVar("_T")


class TemplateBuildError(TemplateSyntaxError):
    """A template too deeply nested to build, or holding an integer too long to read, at
    template line ``lineno``; ``hint`` says what to change. ``step`` names who gave up
    ("Jinja to parse", "Python to compile")."""

    def __init__(self, failure: BaseException, step: str, lineno: int, name: str | None, filename: str | None) -> None:
        hint: str | None = None
        if isinstance(failure, ValueError) and "digits" in str(failure):  # int(): Python's digit limit
            message = f"an integer in it has more digits than Python reads ({_max_digits():,})"
            hint = "write a shorter number"
        elif isinstance(failure, ValueError):
            message = f"{type(failure).__name__}: {failure}"
        else:
            detail = f" ({failure.msg})" if isinstance(failure, SyntaxError) and failure.msg else ""
            message = f"it nests blocks, brackets, operators, filters or attributes too deeply for {step}{detail}"
            hint = "nest less deeply, or split the template into sections joined with {% include %}"
        super().__init__(message, lineno, name, filename)
        self.hint = hint


def on_a_fresh_stack(build: Callable[[], _T]) -> _T:
    """``build()`` in a thread of its own, which starts with an empty stack: Jinja parses and
    compiles by recursion, so in the caller's thread whether a deeply nested template builds
    would depend on how deep the caller already is (``validate`` could pass a template that
    ``run``, a few calls deeper, cannot build). Jinja's other walks of a syntax tree
    (``jinja2.meta``) recurse as deeply and run here too."""
    results: list[_T] = []
    failures: list[BaseException] = []
    # the caller's context: the render budget, which Jinja's constant folding (it calls the
    # counted filters) spends, stays the caller's
    context = contextvars.copy_context()

    def run() -> None:
        try:
            results.append(context.run(build))
        except BaseException as exc:  # raised in the caller's thread
            failures.append(exc)

    worker = threading.Thread(target=run, name="ctxrules-template-build", daemon=True)
    worker.start()
    worker.join()
    if failures:
        raise failures[0]
    return results[0]


def find_all(tree: nodes.Node, kind: type[_N]) -> Iterator[_N]:
    """Every node of type ``kind`` below ``tree``, in template order (as ``find_all``)."""
    stack = list(reversed(list(tree.iter_child_nodes())))
    while stack:
        node = stack.pop()
        if isinstance(node, kind):
            yield node
        stack.extend(reversed(list(node.iter_child_nodes())))


def tree_line(tree: nodes.Template, failure: BaseException) -> int:
    """The template line a failure to generate code for ``tree`` is reported at: the first
    integer too long to write (a ``ValueError``), else the most deeply nested node."""
    if isinstance(failure, ValueError):
        limit = _max_digits()
        lines = [
            c.lineno
            for c in find_all(tree, nodes.Const)
            if limit and isinstance(c.value, int) and abs(c.value) >= 10**limit
        ]
        if lines:
            return min(lines)
    line, deepest = 1, -1
    stack: list[tuple[nodes.Node, int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > deepest:
            line, deepest = node.lineno, depth
        stack.extend((child, depth + 1) for child in node.iter_child_nodes())
    return line


def token_line(tokens: Iterable[tuple[int, str, str]]) -> int | None:
    """The line of the first integer literal Python cannot read among the lexer's raw
    ``tokens`` (``Lexer.tokeniter``: not yet converted, so this walk does not fail on it)."""
    for lineno, kind, text in tokens:
        if kind == "integer":
            try:
                int(text.replace("_", ""), 0)
            except ValueError:
                return lineno
    return None


_DEBUG_INFO = re.compile(r"^debug_info = '([0-9=&]*)'$", re.MULTILINE)


def generated_line(code: str, failure: BaseException) -> int:
    """The template line of the Python line ``failure`` names in Jinja's generated ``code``
    (Jinja ends it with ``debug_info``: template line = code line pairs); 1 when it names none."""
    at = getattr(failure, "lineno", None)
    found = _DEBUG_INFO.search(code)
    if not isinstance(at, int) or found is None or not found.group(1):
        return 1
    pairs = [tuple(map(int, pair.split("="))) for pair in found.group(1).split("&")]
    return next((template for template, python in reversed(pairs) if python <= at), 1)


def _max_digits() -> int:
    return sys.get_int_max_str_digits()
