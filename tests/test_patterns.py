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
    # What the `regex` module reads otherwise than `re`: braces that are no counted repetition
    # (fuzzy matching there), a `[` inside a set (a POSIX class there), comments.
    "{",
    "}",
    "{e<=1}",
    "[[:alpha:]]",
    "[",
    "]",
    ":",
    "(?#[)",
]
_TEXT = st.text(alphabet="ab \nxé9_A-c{}[]:e<=1", max_size=30)


def _pattern(parts: list[str]) -> str | None:
    source = "".join(parts)
    try:
        re.compile(source)
    except (re.error, OverflowError):
        return None
    return source


@pytest.mark.filterwarnings("ignore::FutureWarning")  # `re` on `[[`: "Possible nested set"
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


@pytest.mark.parametrize(
    ("source", "text"),
    [
        ("a{e<=1}b", "axb a{e<=1}b"),  # fuzzy matching to `regex`: `axb` would match
        ("[[:alpha:]]+", "abc [:ah]"),  # a POSIX class to `regex`
        ("x{1}{e}", "x{e}"),  # `regex` refuses it
        ("(?x) a {e<=1} # [ comment {e}\n b", "a{e<=1}b"),
        ("(?#[)a{e}", "a a{e}"),
        ("a{ 1}|a{}|a{1,2", "a{ 1} a{} a{1,2"),
        ("[]{]+|[^][]+", "]{ ab[]"),
        (r"\N{EM DASH}+a{,2}", "\u2014\u2014aa"),
    ],
)
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_on_the_backtracking_engine_a_pattern_means_what_it_means_to_re(source: str, text: str) -> None:
    ours, theirs = patterns.compile(source), re.compile(source)
    for sample in (text, text + "\udc80"):  # a lone surrogate: RE2 cannot take the text
        assert [m.span() for m in ours.finditer(sample)] == [m.span() for m in theirs.finditer(sample)], sample
        assert ours.sub("<>", sample) == theirs.sub("<>", sample)
    # The joined search over many lines (on `regex`: the text is not ASCII) finds every line
    # `re` matches in (it gives up, None, when more than half of them are candidates).
    lines = [*text.split("\n"), "é", "nothing here"] * patterns.CANDIDATES_MIN_LINES
    expected = {i for i, line in enumerate(lines) if theirs.search(line)}
    candidates = patterns.candidate_lines([ours], lines)
    if candidates is None:
        assert len(expected) > len(lines) // 2
    else:
        assert expected <= set(candidates)


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_a_rewrite_for_regex_that_re_would_read_otherwise_is_not_used() -> None:
    # Under a scoped (?x) the `[` after `#` is a comment's: escaping the `[` that follows
    # as if it stood in a set would change what `re` reads, so the pattern goes as it is.
    source = "(?x:#[\n)x[ab]"
    assert patterns.regex_source(source) == source
    ours, theirs = patterns.compile(source), re.compile(source)
    assert [m.span() for m in ours.finditer("x[ab] xa\udc80")] == [m.span() for m in theirs.finditer("x[ab] xa\udc80")]


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


def test_patterns_that_time_out_take_a_bounded_time_per_call_together(
    tmp_path: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thirty distinct slow patterns (`tools.exit_code`, tried on every tool result) each timed
    out once before being remembered, and `regex` overshoots its limit: one `prepare` took 41 s
    (170 s on a busy machine). Within one call, the patterns that time out share
    TIMEOUT_BUDGET_S: past it the others are skipped at once, said in the report, and not
    remembered as timed out (they never ran: a later call tries them). Counted, not timed."""
    from pathlib import Path

    from ctxrules import Engine

    monkeypatch.setattr(patterns, "MATCH_TIME_LIMIT_S", 0.05)
    monkeypatch.setattr(patterns, "TIMEOUT_BUDGET_S", 0.12)
    folder = Path(str(tmp_path))
    slow = [r"^(a|a)*(?=\d)(\d)" + "x?" * k for k in range(30)]
    pack = folder / "p.yaml"
    pack.write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: p, version: 1.0.0}\n"
        "extends: [builtin:default]\ntools:\n  exit_code:\n" + "".join(f"    - '{p}'\n" for p in slow),
        encoding="utf-8",
    )
    history: list[dict[str, object]] = [{"role": "user", "content": "run it"}]
    for i in range(3):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "x"}'}}
        history += [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": "a" * 40 + "!"},
        ]
    ran: list[float] = []
    timed = patterns.Pattern._timed

    def counting(self: patterns.Pattern, text: str, call: object, *args: object, **kwargs: object) -> object:
        try:
            return timed(self, text, call, *args, **kwargs)  # type: ignore[arg-type]
        except patterns.PatternTimeout as exc:
            if "took longer" in str(exc):
                ran.append(1)
            raise

    monkeypatch.setattr(patterns.Pattern, "_timed", counting)
    session = Engine.load(str(pack)).session(folder / "s", model="gpt-4o")
    report = session.prepare(history).report
    skipped = [w for w in report["warnings"] if "this call allows" in w]
    # each timeout takes MATCH_TIME_LIMIT_S at least: the budget holds a few of them
    assert 1 <= len(ran) <= 3, ran
    assert len(skipped) == len(slow) - len(ran), report["warnings"]
    remembered = session.store.load_turn(session.key, output=False).state["stages"]
    listed = [k for st in remembered.values() if isinstance(st, dict) for k in st.get(patterns.STATE_KEY, [])]
    assert len(listed) == len(ran), listed  # the skipped ones are tried again by a later call


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


# A pattern off RE2 (\b and \w are Unicode-aware in Python) and linear: only its text makes it slow.
LINEAR = r"\b\w+\d\b"
HAYSTACK = "é " * 2_000_000  # 4M characters, no word with a digit


def test_a_linear_pattern_that_timed_out_on_a_huge_text_still_searches_short_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(patterns, "MATCH_TIME_LIMIT_S", 0.001)
    pattern = patterns.compile(LINEAR)
    assert not pattern.shape.nested and pattern.engine == "regex"
    state: dict[str, object] = {}
    with patterns.remembering(state) as memory:
        with pytest.raises(patterns.PatternTimeout, match="took longer"):
            pattern.search(HAYSTACK)
        # The next message of a few words is searched as before ...
        assert pattern.search("a word42 here") is not None
        # ... and a text at least half as long as the one it timed out on is skipped at once.
        with pytest.raises(patterns.PatternTimeout, match="earlier run"):
            pattern.search(HAYSTACK[: len(HAYSTACK) // 2])
    assert state[patterns.STATE_KEY] == [f"{pattern.key}@{len(HAYSTACK) // 2}"]
    assert len(memory.reports) == 2
    # A later process reads the same memory from the state.
    with patterns.remembering(dict(state)):
        assert pattern.search("x1") is not None
        with pytest.raises(patterns.PatternTimeout, match="earlier run"):
            pattern.search(HAYSTACK)


def test_what_times_out_in_one_session_changes_nothing_for_another(monkeypatch: pytest.MonkeyPatch) -> None:
    # One process serving many sessions (a proxy): a hostile message in one session must not
    # switch a pack pattern off for the others, nor be written into their state.
    monkeypatch.setattr(patterns, "MATCH_TIME_LIMIT_S", 0.001)
    monkeypatch.setattr(patterns, "_PROCESS_MEMORY", patterns.Memory())
    evil = patterns.compile(r"(x+)+\d")  # nested: once timed out, skipped on any text
    hostile: dict[str, object] = {}
    with patterns.remembering(hostile), pytest.raises(patterns.PatternTimeout):
        evil.search("x" * 5000)
    assert hostile[patterns.STATE_KEY] == [evil.key]
    other: dict[str, object] = {}
    with patterns.remembering(other) as memory:
        assert evil.search("xx1") is not None
    assert other == {} and memory.reports == []
    assert patterns._PROCESS_MEMORY.keys == {}  # nor for code outside any session
    assert evil.search("xx1") is not None


@pytest.mark.parametrize(
    ("lists", "merged"),
    [
        ((["k"], ["k@5"]), ["k"]),  # written by an earlier version: every text
        ((["j@10"], ["j@3", "j@7"]), ["j@3"]),
        (([5, None, "x@abc", "y@", "z@-1", "w@" + "9" * 16], None), []),  # damaged entries are dropped
        (("not a list", ["a@1"]), ["a@1"]),
    ],
)
def test_remembered_entries_merge_to_the_shortest_length(lists: tuple[object, object], merged: list[str]) -> None:
    assert patterns.merged_entries(*lists) == merged


# Pieces that reach what `re`'s compiler (not its parser) refuses: look-behinds of fixed and of
# varying width, nested in groups, branches, repetitions, conditionals and other assertions.
_VERDICT_PIECES = [
    *_PIECES[:28],
    "(?<=a)",
    "(?<!ab)",
    "(?<=a|bc)",
    "(?<=a|b)",
    "(?<=a+)",
    "(?<=x{3})",
    "(?<=(?=a+)b)",
    "(?<=(?<=a*)b)",
    "(?=(?<=a?))",
    "(?:(?<!b*))",
    "(?>(?<=ab?))",
    "(a)?(?(1)(?<=a+)|b)",
    "(?<=\\1)",
    "(?<=[ab]{2})",
    "(?<=(?P<g>a))",
    "(",
    ")",
    "(?<",
    "*",
]


@pytest.mark.filterwarnings("ignore::FutureWarning")
@settings(max_examples=600, deadline=None)
@given(
    parts=st.lists(st.sampled_from(_VERDICT_PIECES), min_size=1, max_size=5),
    flags=st.sampled_from([0, re.IGNORECASE, re.VERBOSE]),
)
def test_a_pattern_is_refused_exactly_when_re_compile_refuses_it(parts: list[str], flags: int) -> None:
    # Judging a pattern no longer compiles it with `re` (neither engine that runs it is `re`):
    # the verdict, its message and the groups must still be what `re.compile` gives.
    source = "".join(parts)
    try:
        expected = re.compile(source, flags)
    except re.error as exc:
        with pytest.raises(re.error) as caught:
            patterns.Pattern(source, flags)
        assert caught.value.msg == exc.msg
        return
    try:
        judged = patterns.Pattern(source, flags)
    except patterns.PatternError:
        return  # too large or unsafe to run: refused on our own grounds, not re's
    assert judged.groups == expected.groups
    assert judged.groupindex == dict(expected.groupindex)
