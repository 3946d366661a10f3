"""Pack patterns with named groups run on every regex backend, and empty matches hide nothing.

ctxrules.patterns runs a pack's regex on RE2 where RE2 means the same as Python's ``re``. An RE2
match answers ``group("name")`` but takes only a group's number in ``span``/``start``/``end``:
the redaction ``secret`` group and the compressor ``group`` action's ``key`` must work on it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ctxrules.patterns import compile as patterns_compile
from ctxrules.redaction import redactor_for


def _on_re2(pattern: str) -> bool:
    return getattr(patterns_compile(pattern), "_re2", None) is not None


def _redactor(regex: str, **extra: Any) -> Any:
    return redactor_for({"redaction": {"defaults": False, "patterns": [{"id": "p", "regex": regex, **extra}]}})


def test_a_secret_group_on_an_re2_pattern_masks_only_the_secret() -> None:
    regex = "TOKEN=(?P<secret>[A-Za-z0-9]+)"
    assert _on_re2(regex), "the case needs a pattern that runs on RE2"
    r = _redactor(regex)
    out = r.redact("before TOKEN=abc123 after")
    assert out.text == "before TOKEN=[REDACTED:p] after"
    assert out.counts == {"p": 1}
    [finding] = r.findings("before TOKEN=abc123 after")
    assert (finding.start, finding.end, finding.text) == (13, 19, "abc123")


def test_a_secret_group_that_did_not_take_part_masks_the_whole_match() -> None:
    r = _redactor("KEY(?:=(?P<secret>[a-z]+))?!")
    assert r("x KEY! y") == "x [REDACTED:p] y"
    assert r("x KEY=abc! y") == "x KEY=[REDACTED:p]! y"


@pytest.mark.parametrize("regex", ["", "x*", r"\b", "(?=a)", "$", "(?P<secret>)abc", "a(?P<secret>b?)c"])
def test_an_empty_match_leaves_the_text_as_it_was(regex: str) -> None:
    r = _redactor(regex)
    text = "abc abc and ac"
    out = r.redact(text)
    if regex == "a(?P<secret>b?)c":
        # "abc" has a secret to hide; "ac" has an empty one
        assert out.text == "a[REDACTED:p]c a[REDACTED:p]c and ac"
        assert out.counts == {"p": 2}
    else:
        assert out.text == text and out.counts == {}
    assert all(f.end > f.start for f in r.findings(text))


def test_the_group_action_with_only_a_key_group_runs_on_re2(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    pattern = "^(?P<key>[a-z/]+[.]py):"
    assert _on_re2(pattern)
    pack = tmp_path / "pack.yaml"
    pack.write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: t, version: 1.0.0}\n"
        "compressors:\n"
        "  - id: lint\n"
        "    match: {argv: ['mylint']}\n"
        "    steps:\n"
        f"      - {{use: group, with: {{pattern: '{pattern}'}}}}\n",
        encoding="utf-8",
    )
    captured = tmp_path / "out.txt"
    captured.write_text("src/a.py:3: bad\nsrc/a.py:9: worse\nsrc/b.py:1: odd\nsrc/a.py:12: more\n", encoding="utf-8")
    code, out, err = cli(
        "compress", "--pack", str(pack), "--command", "mylint src", "--input", str(captured),
        "--session", str(tmp_path / "s"),
    )  # fmt: skip
    assert code == 0, err
    assert "Traceback" not in err
    lines = out.splitlines()
    assert "src/a.py" in lines
    # the key is cut out of each grouped line, the rest of the line stays
    assert [line.strip() for line in lines[lines.index("src/a.py") + 1 :][:3]] == [":3: bad", ":9: worse", ":12: more"]
    assert "src/b.py:1: odd" in lines
