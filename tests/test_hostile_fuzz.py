"""Fuzzing packs from a hostile grammar: validate, assemble, compress and run never raise a
traceback and never hang.

Patterns mix nested quantifiers, backreferences, lookarounds, huge counts and anchors; templates
mix big arithmetic, huge repetitions, long and nested ranges, ``~`` doubling and sections that
include each other. Every example goes through the CLI's own entry (``ctxrules.cli.main.run``,
in-process for speed: a handled error comes back as an exit code, anything else is raised).
A watchdog fails an example that takes too long (``signal.alarm`` for Python code, and
``faulthandler`` as a backstop that ends the run, with every thread's stack, if C code hangs).
"""

from __future__ import annotations

import faulthandler
import json
import signal
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxrules import patterns

WATCHDOG_S = 120


class Hang(Exception):
    pass


@contextmanager
def watchdog(seconds: int = WATCHDOG_S) -> Iterator[None]:
    def expire(signum: int, frame: Any) -> None:
        raise Hang(f"no answer after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    faulthandler.dump_traceback_later(seconds * 2, exit=True, file=sys.__stderr__)
    try:
        yield
    finally:
        signal.alarm(0)
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGALRM, previous)


# -- the hostile grammar ----------------------------------------------------------------------

_ATOMS = st.sampled_from(["a", "b", ".", r"\d", r"\w", r"\s", "[ab]", "[^b]", r"\b", "x", "(a|aa)", "(a|a)"])
_QUANTIFIERS = st.sampled_from(["", "+", "*", "?", "{2,}", "{0,9999}", "{1000}", "{99999}", "+?", "*+", "{4294967294}"])


def _regex() -> st.SearchStrategy[str]:
    leaf = st.builds(lambda a, q: a + q, _ATOMS, _QUANTIFIERS)

    def grow(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            st.builds(lambda a, q: f"({a}){q}", inner, _QUANTIFIERS),
            st.builds(lambda a, q: f"(?:{a}){q}", inner, _QUANTIFIERS),
            st.builds(lambda a, b: a + b, inner, inner),
            st.builds(lambda a, b: f"{a}|{b}", inner, inner),
            st.builds(lambda a: f"(?=(a{a}))", inner),
            st.builds(lambda a: f"({a})\\1", inner),
        )

    return st.builds(
        lambda body, tail: body + tail,
        st.recursive(leaf, grow, max_leaves=8),
        st.sampled_from(["", "$", r"\Z", "b", "c$"]),
    )


_NUMBERS = st.sampled_from([3, 99, 9999, 100000, 99999999, 3000000000])
_EXPRESSIONS = st.one_of(
    st.builds(lambda a, b: f"{a}**{b}", _NUMBERS, _NUMBERS),
    st.builds(lambda n: f"'x' * {n}", _NUMBERS),
    st.builds(lambda n: f"(range(10)|list) * {n}", _NUMBERS),
    st.builds(lambda n: f"'x'|center({n})", _NUMBERS),
    st.builds(lambda n: f"'%{n}d' % 1", _NUMBERS),
    st.builds(lambda n: f"'{{:{n}}}'.format(1)", _NUMBERS),
    st.just("mode ~ mode"),
)


def _template() -> st.SearchStrategy[str]:
    leaf = st.one_of(
        st.builds(lambda e: "{{ " + e + " }}", _EXPRESSIONS),
        st.just("text "),
        st.sampled_from(['{% include "a" %}', '{% include "b" %}']),
    )

    def grow(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            st.builds(lambda n, body: f"{{% for i in range({n}) %}}{body}{{% endfor %}}", _NUMBERS, inner),
            st.builds(lambda a, b: a + b, inner, inner),
            st.builds(
                lambda n: (
                    "{% set ns = namespace(x='ab') %}{% for i in range(" + str(n) + ") %}"
                    "{% set ns.x = ns.x ~ ns.x %}{% endfor %}{{ ns.x|length }}"
                ),
                _NUMBERS,
            ),
            st.builds(lambda body: "{% macro f(n) %}" + body + "{{ f(n) }}{% endmacro %}{{ f(1) }}", inner),
        )

    return st.recursive(leaf, grow, max_leaves=4)


def _pack(regex: str, template_a: str, template_b: str) -> str:
    q = json.dumps  # JSON strings are YAML double-quoted strings
    exit_code = q("(" + regex + ")" + r"(\d+)")
    return f"""apiVersion: ctxrules/v1
kind: RulePack
metadata: {{name: fuzz, version: 1.0.0}}
extends: builtin:default
tools:
  exit_code: [{exit_code}]
priorities:
  - {{id: fuzz, match: {{contains: {q(regex)}}}, priority: critical}}
redaction:
  patterns:
    - {{id: fuzz, regex: {q(regex)}}}
compressors:
  - id: fuzz-drop
    match: {{argv: [tool]}}
    steps:
      - use: drop
        with: {{patterns: [{q(regex)}]}}
      - use: short_circuit
        with: {{when: {q(regex)}, message: done, unless: ['zzz']}}
prompts:
  sections:
    a: {{tag: a, template: {q(template_a)}}}
    b: {{tag: b, template: {q(template_b)}}}
  modes:
    fuzz: [a, b]
"""


OUTPUT = ("a" * 3000 + "b\n") * 3 + "exit 1\n"


def _cli(*argv: str) -> int:
    from ctxrules.cli.main import run

    try:
        return run(list(argv))
    except SystemExit as exc:  # argparse
        return int(exc.code or 0)


@pytest.fixture(autouse=True)
def _short_time_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    # The same mechanism with a tenth of the limit: an exponential pattern still times out
    # long before it would end, and the fuzzing stays quick.
    monkeypatch.setattr(patterns, "MATCH_TIME_LIMIT_S", 0.1)


@settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)
@given(regex=_regex(), template_a=_template(), template_b=_template())
def test_no_hostile_pack_tracebacks_or_hangs(
    capsys: pytest.CaptureFixture[str], regex: str, template_a: str, template_b: str
) -> None:
    with tempfile.TemporaryDirectory(prefix="ctxrules-fuzz-") as tmp:
        root = Path(tmp)
        pack = root / "p.yaml"
        pack.write_text(_pack(regex, template_a, template_b), encoding="utf-8")
        (root / "out.txt").write_text(OUTPUT, encoding="utf-8")
        call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "tool"}'}}
        (root / "msgs.json").write_text(
            json.dumps(
                [
                    {"role": "user", "content": "a" * 3000 + "b"},
                    {"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "c1", "content": OUTPUT},
                ]
            ),
            encoding="utf-8",
        )
        with watchdog():
            codes = [
                _cli("validate", str(pack)),
                _cli("assemble", "--pack", str(pack), "--mode", "fuzz", "--model", "gpt-4o"),
                _cli(
                    "compress",
                    "--pack",
                    str(pack),
                    "--command",
                    "tool",
                    "--input",
                    str(root / "out.txt"),
                    "--session",
                    str(root / "s"),
                ),
                _cli(
                    "run",
                    "--pack",
                    str(pack),
                    "--model",
                    "gpt-4o",
                    "--input",
                    str(root / "msgs.json"),
                    "--session",
                    str(root / "s"),
                    "--output",
                    str(root / "o.json"),
                ),
            ]
        out, err = capsys.readouterr()
        assert all(code in (0, 1, 2) for code in codes), (codes, err)
        assert "Traceback" not in out + err
        for line in err.splitlines():  # every message is one line, naming ctxrules
            assert line.startswith(("ctxrules:", " ", "p.yaml", str(pack))) or not line.strip(), line
