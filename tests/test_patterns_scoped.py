"""Flags set for a group's own scope (``(?x: ...)``, ``(?i: ...)``, ``(?-m: ...)``) mean to a
pack pattern what they mean to ``re``, as flags of the whole pattern do. Such groups are
also what ``ctxrules`` makes of a ``(?i)`` or ``(?x)`` pattern when it joins a list of
patterns (``drop``, ``keep``, ``protect``, ...) into one alternation."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
from cli_kit import cli

from ctxrules import patterns

HEAD = "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: scoped, version: 1.0.0}\n"
# Catastrophic on a backtracking engine under case folding (`\b` keeps it off RE2): the
# rounds of `[A-Z][a-z]+` are told apart by their capital only when case matters.
CAMEL_WORDS = r"\b(?:[A-Z][a-z]+)+Error"


def _pack(folder: Path, body: str) -> Path:
    path = folder / "p.yaml"
    path.write_text(HEAD + textwrap.dedent(body), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("pattern", "warned"),
    [
        (rf"(?i){CAMEL_WORDS}", True),  # the flag for the whole pattern: warned before too
        (rf"(?i:{CAMEL_WORDS})", True),  # the same flag for the group alone: was not warned
        (r"\b(?i:(?:[A-Z][a-z]+)+)Error", True),
        (rf"(?i)(?-i:{CAMEL_WORDS})", False),  # case matters again inside: was warned
        (CAMEL_WORDS, False),
    ],
)
def test_validate_judges_nested_repetition_with_the_flags_of_its_group(
    tmp_path: Path, pattern: str, warned: bool
) -> None:
    _pack(tmp_path, f"priorities:\n  - {{id: camel, match: {{contains: '{pattern}'}}, priority: critical}}\n")
    proc = cli("validate", "p.yaml", cwd=tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert ("warning[CR102]" in proc.stdout) is warned, proc.stdout
    if warned:  # and it is as slow as the warning says, on `re` itself
        assert patterns.nested_quantifier(pattern)


def test_a_comment_of_a_verbose_pattern_in_a_list_does_not_change_the_other_patterns(tmp_path: Path) -> None:
    """A list of patterns is searched as one alternation, where a ``(?x)`` pattern becomes a
    ``(?x:...)`` group. The ``[`` in its comment was read as opening a set, so the ``{`` of
    the next pattern went to the backtracking engine as its fuzzy-matching syntax: ``^Step
    {i}`` (the text ``Step {i}`` to ``re``) then matched every line starting with ``Step``, and
    the drop step dropped lines no pattern of it matches."""
    _pack(
        tmp_path,
        r"""
        compressors:
          - id: noise
            match: {argv: [tool]}
            steps:
              - use: drop
                with:
                  patterns:
                    - |
                      (?x) ^ \s* \d+ % \s   # progress bars like "12% [=====>"
                    - '^Step {i}'
        """,
    )
    assert cli("validate", "p.yaml", cwd=tmp_path).returncode == 0
    lines = []
    for k in range(300):  # most lines match: every line is searched with the alternation
        lines += ["Step {i} of n", f" {k % 100}% [==>", f" {k % 100}% [===>", f"Step {k} of 300"]
    (tmp_path / "out.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    proc = cli(
        "compress", "--pack", "p.yaml", "--command", "tool", "--input", "out.txt", "--state", "state", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    kept = [line for line in proc.stdout.splitlines() if not line.startswith("[ctxrules:")]
    assert kept == [f"Step {k} of 300" for k in range(300)]


@pytest.mark.parametrize(
    ("source", "text"),
    [
        ("(?x: a # [ comment\n b{e<=1} )", "ab{e<=1} abx ab"),  # a comment's `[` opened a set
        ("(?x:a #[\n)[[:alpha:]]", "a[ ab"),
        ("(?x)(?-x:a#b)x{e<=1}", "a#bx{e<=1} a#by"),  # no comment where (?x) is cleared
        ("(?x: (?: a # ( [\n ) b{e} )", "ab{e} ab"),  # a comment's `(` opens no group
    ],
)
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_scoped_verbose_groups_mean_to_the_backtracking_engine_what_they_mean_to_re(source: str, text: str) -> None:
    ours, theirs = patterns.compile(source), re.compile(source)
    assert ours.engine == "regex"
    assert [m.span() for m in ours.finditer(text)] == [m.span() for m in theirs.finditer(text)]


def test_a_dollar_where_a_group_clears_multiline_stays_off_re2() -> None:
    """RE2's ``$`` without ``(?m)`` is the end of the text only; Python's also matches before
    a final newline. The pattern's ``(?m)`` let RE2 run it, while its group cleared it."""
    source = "(?m)^ok (?-m:done$)"
    ours, theirs = patterns.compile(source), re.compile(source)
    for text in ("ok done\n", "ok done", "ok done\nmore"):
        assert bool(ours.search(text)) == bool(theirs.search(text)), text


def test_lines_searched_joined_are_not_searched_so_where_a_group_clears_multiline() -> None:
    """The lines are searched joined by newlines with ``^``/``$`` at every newline; inside a
    ``(?-m:...)`` group they are the ends of the joined text, and lines were missed."""
    pattern = patterns.compile(r"(?-m:^\d+ failed$)")
    lines = ["3 failed", "all good", "é"] * patterns.CANDIDATES_MIN_LINES
    expected = {i for i, line in enumerate(lines) if re.search(pattern.pattern, line)}
    candidates = patterns.candidate_lines([pattern], lines)
    assert candidates is None or expected <= set(candidates)
