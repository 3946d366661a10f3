"""Searching many lines at once (ctxrules.patterns.candidate_lines, and the actions' `matching`
built on it): the lines it leaves out are lines no pattern matches, whatever the pattern, so
every compressor finds exactly what searching each line finds."""

from __future__ import annotations

import random

import pytest

from ctxrules import patterns
from ctxrules.compressors.actions.common import compile_all, matching

# Patterns of every kind the joined search meets: anchors, word boundaries, classes that match
# a newline, flags, back-references, alternations; and the kinds it must not be trusted with
# (look-arounds, \A, \Z, atomic groups, possessive repeats), which go line by line.
POOL = [
    r"error",
    r"^error",
    r"error$",
    r"^$",
    r"^\s*$",
    r"\berr\b",
    r"\Berr",
    r"(?i)^warn(?:ing)?:",
    r"\s+x",
    r"x\s*$",
    r"[^a-z]+z",
    r"(?s)a.*b",
    r"a.*b",
    r"\d{2,}",
    r"(\w)\1",
    r"^(\w+) \1$",
    r"\W\W",
    r"\S+:\d+:",
    r"(?m)^b",
    r"z|^y|x$",
    r"(?<=a)b",
    r"(?<!a)b",
    r"a(?=\s)",
    r"a(?!b)",
    r"\Aab",
    r"ab\Z",
    r"(?>a\s*)$",
    r"a\s*+$",
    r"a*",
    r"(?i)ERROR|WARN:",
    r"\w+\s\w+",
    r"[\s\d]{3}",
    r"(?i)s\b",
    r"\D\d$",
]
ALPHABET = ["a", "b", "x", "y", "z", "e", "r", "o", " ", "  ", "\t", "\r", "\x0c", ":", "1", "42", "-", "warn:"]
# Joined ASCII text goes to RE2; these send it to the backtracking engine (RE2's \s differs).
OTHERS = [["é"], ["\x0b"], ["\x1c", "\x1f"], ["\u2028", "\u017f"]]


def _lines(rnd: random.Random, seed: int) -> list[str]:
    alphabet = ALPHABET if seed % 2 == 0 else ALPHABET + OTHERS[seed // 2 % len(OTHERS)]
    out = []
    for _ in range(rnd.randrange(patterns.CANDIDATES_MIN_LINES, 400)):
        out.append("".join(rnd.choice(alphabet) for _ in range(rnd.randrange(0, 8))))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_matching_finds_exactly_the_lines_a_search_of_each_line_finds(seed: int) -> None:
    rnd = random.Random(seed)
    lines = _lines(rnd, seed)
    chosen = rnd.sample(POOL, rnd.randrange(1, 4))
    matcher = compile_all(chosen)
    assert matcher is not None
    expected = [i for i, line in enumerate(lines) if matcher.search(line) is not None]
    assert list(matching(matcher, lines)) == expected
    for source in chosen:
        single = patterns.compile(source)
        found = patterns.candidate_lines([single], lines)
        hits = {i for i, line in enumerate(lines) if single.search(line) is not None}
        if found is not None:
            assert hits <= set(found), source  # never a line it matches left out


@pytest.mark.parametrize("source", [r"(?<=a)b", r"(?<!a)b", r"a(?=\s)", r"\Aab", r"ab\Z", r"(?>a\s*)$", r"a\s*+$"])
def test_patterns_that_look_past_a_line_are_searched_line_by_line(source: str) -> None:
    lines = ["ab", "a b", "b"] * 20
    assert patterns.candidate_lines([patterns.compile(source)], lines) is None


def test_a_negative_look_behind_at_a_line_start_is_not_missed() -> None:
    # Joined, the line "b" follows a newline, which `(?<!\s)` refuses; alone it follows
    # nothing. The joined search would leave it out: such patterns go line by line.
    lines = ["x"] * 40 + ["b"]
    matcher = patterns.compile(r"(?<!\s)b")
    assert list(matching(matcher, lines)) == [40]


def test_few_lines_are_searched_one_by_one() -> None:
    lines = ["error"] * (patterns.CANDIDATES_MIN_LINES - 1)
    assert patterns.candidate_lines([patterns.compile("error")], lines) is None
    assert list(matching(patterns.compile("error"), lines)) == list(range(len(lines)))


def test_a_pattern_remembered_as_timed_out_is_still_reported_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    # It is searched line by line, so its first search raises as it always did (no line is
    # left out unsearched just because the joined search found nothing).
    monkeypatch.setattr(patterns, "_PROCESS_MEMORY", patterns.Memory())
    evil = patterns.compile(r"(x+)+\d")
    state = {patterns.STATE_KEY: [evil.key]}
    lines = ["plain"] * 100
    with patterns.remembering(state):
        assert patterns.candidate_lines([evil], lines) is None
        with pytest.raises(patterns.PatternTimeout, match="earlier run"):
            list(matching(evil, lines))


def test_a_joined_search_out_of_time_falls_back_to_each_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(patterns, "CANDIDATES_TIME_LIMIT_S", 0.0)
    lines = [f"line {i} à" for i in range(200)] + ["error here"]  # not ASCII: the time-limited engine
    pattern = patterns.compile(r"\berror\b")
    assert patterns.candidate_lines([pattern], lines) is None
    assert list(matching(pattern, lines)) == [200]
    monkeypatch.setattr(patterns, "_PROCESS_MEMORY", patterns.Memory())
    assert pattern.key not in patterns._PROCESS_MEMORY.keys  # not held against the pattern


def test_the_joined_search_leaves_out_lines_that_cannot_match() -> None:
    lines = [f"2026-12-01 INFO item {i} ok" for i in range(5000)] + ["src/a.py:3: error: bad"]
    found = patterns.candidate_lines([patterns.compile(r"\berror\b"), patterns.compile(r"^\S+:\d+:")], lines)
    assert found == [5000]


def test_an_alternation_remembered_as_timed_out_is_still_reported_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    # compile_all searches its patterns as one combined pattern, remembered under its own
    # key: that key sends the lines one by one too, even though no member is remembered.
    monkeypatch.setattr(patterns, "_PROCESS_MEMORY", patterns.Memory())
    matcher = compile_all([r"\berror\b", r"^fatal:"])
    assert matcher is not None
    matcher.search("warm up")  # builds the combined pattern
    combined = matcher._matcher  # type: ignore[attr-defined]
    lines = ["plain"] * 100
    state = {patterns.STATE_KEY: [combined.key]}
    with patterns.remembering(state), pytest.raises(patterns.PatternTimeout, match="earlier run"):
        list(matching(matcher, lines))


@pytest.mark.parametrize("source", [r"\w", r"a*", r"^", r"(?s).", r"\berror\b|x"])
def test_a_pattern_matching_most_lines_is_left_to_the_lines_after_few_searches(
    source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # At most one search per line, and none beyond half of them: then every line is searched
    # on its own, which costs less than verifying that many candidates after the joined search.
    lines = [f"x error {i}" for i in range(20_000)]
    pattern = patterns.compile(source)
    real = patterns._multiline_re2(pattern.pattern, pattern.flags)
    searched: list[int] = []

    class Counting:
        def search(self, text: bytes, at: int) -> object:
            searched.append(at)
            return real.search(text, at)

    monkeypatch.setattr(patterns, "_multiline_re2", lambda source, flags: Counting())
    assert patterns.candidate_lines([pattern], lines) is None
    assert 0 < len(searched) <= len(lines) // 2 + 1
    assert searched == sorted(set(searched))  # always forward
