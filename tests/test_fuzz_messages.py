"""Fuzz: message lists of random, hostile structure through ``Session.prepare`` and the real
``ctxrules run``.

Bad roles, missing or mistyped ids, junk where content or tool calls belong, lone surrogates
in strings and keys, huge integers, NaN and infinities, nesting far past any real message.
Whatever comes in: no traceback (only the handled ``CtxrulesError``, exit 2 in the CLI), no
hang (a watchdog fails the example), and a result that is valid, sendable JSON whose tool
calls pair up, with the caller's objects untouched.
"""

from __future__ import annotations

import contextlib
import copy
import json
import marshal
import os
import signal
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from cli_kit import run_default
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from invariants import pairing_problems

from ctxrules import Engine
from ctxrules.errors import CtxrulesError

EXAMPLES = int(os.environ.get("CTXRULES_PROPERTY_EXAMPLES", "60"))
WATCHDOG_S = 60  # generous: a real prepare of these takes well under a second


class Hang(Exception):
    pass


@contextlib.contextmanager
def watchdog(seconds: float) -> Iterator[None]:
    """Fail the example (instead of hanging the suite) when the body runs too long."""

    def fire(signum: int, frame: Any) -> None:
        raise Hang(f"no result after {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def nest(depth: int, leaf: Any) -> Any:
    value = leaf
    for n in range(depth):
        value = [value] if n % 2 else {"k": value}
    return value


surrogates = st.characters(categories=["Cs"])
chars = st.one_of(st.characters(), surrogates)
texts = st.text(chars, max_size=30)
leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**20), 10**20),
    st.builds(pow, st.just(10), st.just(5000)),
    st.floats(allow_nan=True, allow_infinity=True),
    texts,
)
junk = st.recursive(
    leaves,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(texts, inner, max_size=4)),
    max_leaves=15,
)
deep = st.builds(nest, st.integers(0, 1500), leaves)
anything = st.one_of(junk, junk, deep)
ids = st.one_of(st.sampled_from(["c1", "c2", "c3", ""]), anything)


@st.composite
def calls(draw: Any) -> Any:
    call: dict[str, Any] = {}
    if draw(st.booleans()):
        call["id"] = draw(ids)
    if draw(st.integers(0, 4)):
        call["type"] = "function"
    function = draw(
        st.one_of(
            st.fixed_dictionaries(
                {
                    "name": st.one_of(st.sampled_from(["Bash", "Read", "Edit"]), anything),
                    "arguments": st.one_of(st.just('{"command": "ls"}'), texts, anything),
                }
            ),
            anything,
        )
    )
    if draw(st.integers(0, 5)):
        call["function"] = function
    return call if draw(st.integers(0, 6)) else draw(anything)


@st.composite
def messages(draw: Any) -> Any:
    msg: dict[str, Any] = {}
    if draw(st.integers(0, 8)):
        msg["role"] = draw(
            st.one_of(
                st.sampled_from(["user", "assistant", "tool", "system", "developer"]),
                st.sampled_from(["", "bogus", "USER"]),
                anything,
            )
        )
    content = draw(
        st.one_of(
            texts,
            st.none(),
            st.lists(st.one_of(st.fixed_dictionaries({"type": st.just("text"), "text": texts}), anything), max_size=3),
            anything,
        )
    )
    if draw(st.integers(0, 6)):
        msg["content"] = content
    if draw(st.integers(0, 2)) == 0:
        msg["tool_calls"] = draw(st.one_of(st.lists(calls(), max_size=3), anything))
    if draw(st.integers(0, 2)) == 0:
        msg["tool_call_id"] = draw(ids)
    for _ in range(draw(st.integers(0, 2))):
        msg[draw(texts)] = draw(anything)
    return msg if draw(st.integers(0, 10)) else draw(anything)


safe_leaves = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**20), 10**20), st.floats(allow_nan=False, allow_infinity=False), texts
)
safe_junk = st.recursive(
    safe_leaves,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(texts, inner, max_size=3)),
    max_leaves=8,
)


@st.composite
def plausible(draw: Any) -> dict[str, Any]:
    """A message of the right shape with hostile values where they are allowed: surrogates
    in text and keys, ids missing, reused or unknown, arguments that are not JSON."""
    role = draw(st.sampled_from(["user", "assistant", "assistant", "tool", "system"]))
    msg: dict[str, Any] = {"role": role}
    if role == "assistant" and draw(st.booleans()):
        msg["content"] = draw(st.one_of(st.none(), texts))
        n = draw(st.integers(1, 3))
        msg["tool_calls"] = [
            {
                **({"id": draw(st.sampled_from(["c1", "c2", "c3", "c1"]))} if draw(st.integers(0, 5)) else {}),
                "type": "function",
                "function": {
                    "name": draw(st.sampled_from(["Bash", "Read", "Edit", "mcp__x__y"])),
                    "arguments": draw(st.one_of(st.just('{"command": "ls"}'), texts)),
                },
            }
            for _ in range(n)
        ]
    elif role == "tool":
        msg["tool_call_id"] = draw(st.sampled_from(["c1", "c2", "c3", "ghost"]))
        msg["content"] = draw(st.one_of(texts, st.text(max_size=3000)))
    else:
        msg["content"] = draw(
            st.one_of(
                texts, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": texts}), min_size=1, max_size=2)
            )
        )
    if draw(st.integers(0, 3)) == 0:
        msg[draw(texts)] = draw(safe_junk)
    return msg


# Half the histories hold only well-shaped messages (they reach the pipeline); the others mix
# in anything at all (they mostly stop at validation, which must say why in one line).
histories = st.one_of(st.lists(plausible(), max_size=10), st.lists(st.one_of(plausible(), messages()), max_size=10))


def check_output(out: list[dict[str, Any]]) -> None:
    # Sendable: strict JSON (no NaN), encodable as UTF-8 (no lone surrogate), pairs valid.
    json.dumps(out, ensure_ascii=False, allow_nan=False).encode("utf-8")
    assert pairing_problems(out) == []


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.load("builtin:default")


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)
@given(history=histories, window=st.sampled_from([12000, 16000, 128000]))
def test_prepare_never_crashes_or_hangs(
    engine: Engine, tmp_path_factory: pytest.TempPathFactory, history: list[Any], window: int
) -> None:
    session = engine.session(tmp_path_factory.mktemp("s"), model="gpt-4o", window=window)
    # marshal (version 2: no back-references, which depend on refcounts), not ==: NaN is
    # unequal to itself, and repr refuses a 5,000-digit integer.
    before = marshal.dumps(history, 2)
    with watchdog(WATCHDOG_S):
        try:
            result = session.prepare(history)
        except CtxrulesError as exc:
            assert str(exc) and "\n" not in str(exc)  # a one-line message
            event(f"rejected: {type(exc).__name__}")
            return
        event("prepared")
        check_output(result.messages)
        again = session.prepare(copy.deepcopy(history))  # a warm turn on the same input
        check_output(again.messages)
    assert marshal.dumps(history, 2) == before  # the caller's objects are untouched


def _raw_json(value: Any) -> bytes:
    """JSON text for ``value`` as a hostile client writes it: NaN, Infinity, \\ud800 escapes,
    integers of any length."""
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        with watchdog(WATCHDOG_S):
            return _dump(value).encode("ascii")
    finally:
        sys.set_int_max_str_digits(limit)


def _dump(value: Any) -> str:
    # Iterative enough for the depths above: json.dumps itself recurses (and would fail first).
    out: list[str] = []
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, _Raw):
            out.append(item.text)
        elif isinstance(item, dict):
            out.append("{")
            parts: list[Any] = []
            for n, (k, v) in enumerate(item.items()):
                parts += [_Raw(("," if n else "") + json.dumps(str(k)) + ":"), v]
            stack += [_Raw("}"), *reversed(parts)]
        elif isinstance(item, list):
            out.append("[")
            parts = []
            for n, v in enumerate(item):
                parts += ([_Raw(",")] if n else []) + [v]
            stack += [_Raw("]"), *reversed(parts)]
        else:
            out.append(json.dumps(item))  # NaN/Infinity as Python writes them; \\udxxx escapes
    return "".join(out)


class _Raw:
    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


@settings(
    max_examples=max(8, EXAMPLES // 4),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)
@given(history=st.one_of(histories, anything, st.fixed_dictionaries({"messages": histories})))
def test_ctxrules_run_never_prints_a_traceback(tmp_path_factory: pytest.TempPathFactory, history: Any) -> None:
    tmp = tmp_path_factory.mktemp("cli")
    (tmp / "in.json").write_bytes(_raw_json(history))
    proc = run_default(
        tmp / "in.json", "--window", "12000", "--state", str(tmp / "state"), text=False, timeout=WATCHDOG_S * 2
    )
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode in (0, 2), err
    assert "Traceback" not in err and "internal error" not in err, err
    if proc.returncode == 2:
        assert proc.stdout == b"" and err.startswith("ctxrules: ")
        return
    out = json.loads(proc.stdout.decode("utf-8"))  # strict UTF-8, and JSON
    check_output(out["messages"] if isinstance(out, dict) else out)
