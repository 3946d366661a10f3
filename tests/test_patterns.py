"""ctxrules.patterns answers exactly what Python's `re` answers, on whichever engine it runs."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxrules import patterns

_PIECES = [
    "a",
    "b",
    "ab",
    ".",
    "[ab]",
    "[^a]",
    r"\d",
    r"\w",
    r"\s",
    r"\b",
    "^",
    "$",
    "x*",
    "a+",
    "b?",
    "(a|b)",
    "(?:ab)+",
    "(a)",
    "|",
    "é",
    "\n",
    "[0-9]",
    "(?i)A",
    "{2}",
    "c{1,3}",
    "(?P<k>a+)",
]
_TEXT = st.text(alphabet="ab \nxé9_A-c", max_size=30)


def _pattern(parts: list[str]) -> str | None:
    source = "".join(parts)
    try:
        re.compile(source)
    except (re.error, OverflowError):
        return None
    return source


@settings(max_examples=400, deadline=None)
@given(
    parts=st.lists(st.sampled_from(_PIECES), min_size=1, max_size=5),
    text=_TEXT,
    flags=st.sampled_from([0, re.MULTILINE, re.IGNORECASE, re.DOTALL]),
)
def test_every_operation_agrees_with_re(parts: list[str], text: str, flags: int) -> None:
    source = _pattern(parts)
    if source is None:
        return
    ours, theirs = patterns.compile(source, flags), re.compile(source, flags)

    def span(m: object) -> object:
        return None if m is None else (m.span(), m.groups())  # type: ignore[attr-defined]

    assert span(ours.search(text)) == span(theirs.search(text)), (source, ours.engine)
    assert span(ours.match(text)) == span(theirs.match(text)), (source, ours.engine)
    assert span(ours.fullmatch(text)) == span(theirs.fullmatch(text)), (source, ours.engine)
    assert [span(m) for m in ours.finditer(text)] == [span(m) for m in theirs.finditer(text)], source
    assert ours.findall(text) == theirs.findall(text), source
    assert ours.split(text) == theirs.split(text), source
    assert ours.sub("<>", text) == theirs.sub("<>", text), source
    assert ours.sub(lambda m: m.group(0).upper(), text) == theirs.sub(lambda m: m.group(0).upper(), text), source
    if theirs.groups:
        assert ours.sub(r"[\1]", text) == theirs.sub(r"[\1]", text), source


@pytest.mark.parametrize(
    ("source", "engine"),
    [
        ("error: ", "re2"),
        ("(?m)^FAIL .*$", "re2"),
        ("[0-9]+ passed", "re2"),
        ("(a+)+b", "re2"),
        (r"\d+ passed", "regex"),
        ("done$", "regex"),
        (r"\bERROR\b", "regex"),
        (r"(a)\1", "regex"),
        ("(?=x)y", "regex"),
        ("x{,5}", "regex"),
        ("[[:alpha:]]", "regex"),
        ("a{2000}", "regex"),
    ],
)
def test_a_pattern_runs_on_re2_only_where_it_means_the_same(source: str, engine: str) -> None:
    assert patterns.compile(source).engine == engine


def test_text_re2_cannot_take_goes_to_the_other_engine() -> None:
    assert patterns.compile("b").search("a\udc80b") is not None  # a lone surrogate


@pytest.mark.parametrize("source", ["x{4294967294}", "(?:a{1000}){1000}", "x{99999999999}"])
def test_patterns_too_large_to_run_in_bounded_time_are_refused(source: str) -> None:
    with pytest.raises(re.error):
        patterns.compile(source)


def test_a_timeout_is_remembered_in_the_state_and_skips_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(patterns, "MATCH_TIME_LIMIT_S", 0.05)
    monkeypatch.setattr(patterns, "_PROCESS_MEMORY", patterns.Memory())
    evil = patterns.compile(r"(x+)+\d")
    state: dict[str, object] = {}
    with patterns.remembering(state) as memory, pytest.raises(patterns.PatternTimeout, match="took longer"):
        evil.search("x" * 5000)
    assert state[patterns.STATE_KEY] == [evil.key]
    assert memory.reports and "took longer" in memory.reports[0]
    monkeypatch.setattr(patterns, "_PROCESS_MEMORY", patterns.Memory())  # a new process
    with patterns.remembering(dict(state)) as memory, pytest.raises(patterns.PatternTimeout, match="earlier run"):
        evil.search("x")  # would be instant: the memory decides, not the load
    assert "earlier run" in memory.reports[0]


@pytest.mark.parametrize(
    ("source", "nested"),
    [
        ("(a+)+$", True),
        (r"(\w+\s?)+$", True),
        (r"(.*,)+\d", True),
        (r"((ab)+c?)+\d", True),
        (r"(\d+\.)+\d", False),
        (r"^\w+(?:\.\w+)*(?:Error|Exception)\b", False),
        (r"(?:\s*,\s*\w+)+$", False),
        ("(a+)+b", False),  # RE2 runs it: linear time, no warning
    ],
)
def test_nested_quantifier_warning(source: str, nested: bool) -> None:
    assert patterns.nested_quantifier(source) is nested
