"""The built-in compressor actions, one by one, on small inputs (provenance included)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ctxrules.compressors.lines import Line, Lines, RunInfo, source_range
from ctxrules.plugins import default_registry


def lines_of(*texts: str, failed: bool = False) -> Lines:
    run = RunInfo("cmd", ("cmd",), 1 if failed else 0, failed, len(texts))
    return Lines([Line(t, (i, i)) for i, t in enumerate(texts, 1)], run)


def act(name: str, given: Lines, **options: Any) -> list[str]:
    action = default_registry().actions[name]
    return list(action.configure(options)(given))


def srcs(out: list[str]) -> list[tuple[int, int] | None]:
    return [source_range(line) for line in out]


def test_every_builtin_action_is_registered_with_a_described_schema() -> None:
    actions = default_registry().actions
    expected = {
        "strip_ansi",
        "drop",
        "keep",
        "replace",
        "collapse_repeats",
        "collapse_progress",
        "squeeze_blank",
        "context",
        "head",
        "tail",
        "max_lines",
        "limit_blocks",
        "short_circuit",
        "group",
        "json",
    }
    assert expected <= set(actions)
    for name in expected:
        schema = actions[name].options_schema
        assert actions[name].description
        for prop, spec in schema.get("properties", {}).items():
            assert spec.get("title") and spec.get("description"), f"{name}.{prop}"


def test_strip_ansi_removes_escapes_and_resolves_redraws() -> None:
    out = act(
        "strip_ansi",
        lines_of(
            "\x1b[31mFAILED\x1b[0m x",
            "\x1b]8;;http://x\x07link\x1b]8;;\x07",
            "10%\r50%\r100% done",
            "plain",
        ),
    )
    assert out == ["FAILED x", "link", "100% done", "plain"]
    assert srcs(out) == [(1, 1), (2, 2), (3, 3), (4, 4)]


def test_an_unchanged_line_is_the_same_object() -> None:
    lines = lines_of("plain")
    assert act("strip_ansi", lines)[0] is lines[0]


def test_drop_and_keep() -> None:
    lines = lines_of("a ok", "b FAILED", "c ok", "ERROR d")
    assert act("drop", lines, patterns=[" ok$"]) == ["b FAILED", "ERROR d"]
    assert act("keep", lines, patterns=["FAILED", "(?i)^error"]) == ["b FAILED", "ERROR d"]


def test_replace_keeps_provenance_and_checks_groups() -> None:
    out = act(
        "replace",
        lines_of("commit 0123456789abcdef0123"),
        pattern=r"^commit (\w{7})\w+",
        **{"with": r"commit \1"},
    )
    assert out == ["commit 0123456"] and srcs(out) == [(1, 1)]
    with pytest.raises(ValueError, match="group"):
        act("replace", lines_of("x"), pattern="x", **{"with": r"\2"})


def test_collapse_repeats_folds_identical_runs_over_their_whole_range() -> None:
    out = act("collapse_repeats", lines_of("a", "same", "same", "same", "b"))
    assert out == ["a", "same (x3)", "b"]
    assert srcs(out) == [(1, 1), (2, 4), (5, 5)]


def test_collapse_repeats_with_ignore_stands_only_for_the_first_line() -> None:
    out = act("collapse_repeats", lines_of("row 1", "row 2", "row 3", "end"), ignore=r"\d+")
    assert out == ["row 1 (x3)", "end"]
    assert srcs(out) == [(1, 1), (4, 4)]  # rows 2-3 were not identical: the engine marks them


def test_collapse_repeats_never_claims_lines_it_does_not_show() -> None:
    kept = [Line("x", (1, 1)), Line("x", (5, 5))]  # an earlier step dropped lines 2-4
    lines = Lines(kept, RunInfo("c", ("c",), 0, False, 5))
    out = act("collapse_repeats", lines)
    assert srcs(out) == [(1, 1)]


def test_collapse_progress_keeps_the_last_state() -> None:
    out = act(
        "collapse_progress",
        lines_of(
            "Collecting rich",
            "   ━━━━━━━━━━━━━━━━━━ 0.1/2.4 MB 1.0 MB/s eta 0:00:03",
            "   ━━━━━━━━━━━━━━━━━━ 2.4/2.4 MB 3.0 MB/s eta 0:00:00",
            "Installing",
            "Progress: resolved 1, reused 0, downloaded 0, added 0",
            "Progress: resolved 9, reused 0, downloaded 9, added 9, done",
        ),
    )
    assert out == [
        "Collecting rich",
        "   ━━━━━━━━━━━━━━━━━━ 2.4/2.4 MB 3.0 MB/s eta 0:00:00",
        "Installing",
        "Progress: resolved 1, reused 0, downloaded 0, added 0",
        "Progress: resolved 9, reused 0, downloaded 9, added 9, done",
    ]


def test_squeeze_blank() -> None:
    out = act("squeeze_blank", lines_of("", "a  ", "", "", "", "b", ""))
    assert out == ["a", "", "b"]
    assert act("squeeze_blank", lines_of("a", "", "b"), max_run=0) == ["a", "b"]


def test_context_keeps_matches_from_the_middle_with_their_surroundings() -> None:
    texts = [f"line {i}" for i in range(1, 41)]
    texts[19] = "FAILED test_x"
    out = act("context", lines_of(*texts), patterns=["FAILED"], before=1, after=1, head=2, tail=2)
    assert out == ["line 1", "line 2", "line 19", "FAILED test_x", "line 21", "line 39", "line 40"]


def test_context_when_nothing_matches() -> None:
    lines = lines_of("a", "b", "c", "d")
    assert act("context", lines, patterns=["x"]) == ["a", "b", "c", "d"]
    assert act("context", lines, patterns=["x"], if_none="drop", head=1) == ["a"]
    assert act(
        "context",
        lines_of("x1", "a", "x2", "b", "x3"),
        patterns=["x"],
        before=0,
        after=0,
        max_matches=2,
    ) == ["x1", "x2"]


def test_head_and_tail() -> None:
    lines = lines_of("1", "2", "3", "4")
    assert act("head", lines, lines=2) == ["1", "2"]
    assert act("tail", lines, lines=2) == ["3", "4"]
    assert act("tail", lines, lines=0) == []


def test_max_lines_keeps_protected_lines_from_the_middle() -> None:
    texts = [f"ok {i}" for i in range(100)]
    texts[50] = "error: the real problem"
    out = act("max_lines", lines_of(*texts), max=10)
    assert len(out) == 10
    assert "error: the real problem" in out
    assert out[0] == "ok 0" and out[-1] == "ok 99"


def test_max_lines_leaves_short_outputs_alone() -> None:
    lines = lines_of("a", "b")
    assert act("max_lines", lines, max=5) == ["a", "b"]


def test_limit_blocks_caps_each_block_and_keeps_protected_lines() -> None:
    texts = [
        "preamble",
        "diff --git a/big b/big",
        *[f"+{i}" for i in range(50)],
        "@@ -90 +90 @@",
        "+tail",
        "diff --git a/small b/small",
        "+one",
    ]
    out = act("limit_blocks", lines_of(*texts), start="^diff --git ", max=5, tail=1, protect=["^@@ "])
    assert out == [
        "preamble",
        "diff --git a/big b/big",
        "+0",
        "+1",
        "+2",
        "@@ -90 +90 @@",
        "+tail",
        "diff --git a/small b/small",
        "+one",
    ]


def test_short_circuit_summarizes_success_only() -> None:
    texts = ["....", "== 12 passed in 0.3s =="]
    out = act(
        "short_circuit",
        lines_of(*texts),
        when=r"(?P<n>\d+) passed in (?P<t>\S+)",
        message="ok: {n} passed in {t}",
    )
    assert out == ["ok: 12 passed in 0.3s"] and srcs(out) == [None]
    assert act("short_circuit", lines_of(*texts, failed=True), when="passed", message="ok") == texts
    assert act("short_circuit", lines_of("12 passed", "1 error"), when="passed", message="ok") == [
        "12 passed",
        "1 error",
    ]
    with pytest.raises(ValueError, match="named groups"):
        act("short_circuit", lines_of("x"), when="x", message="{missing}")


def test_group_writes_the_key_once() -> None:
    out = act(
        "group",
        lines_of("a.py:1: error: x", "b.py:2: error: y", "a.py:9: note: z", "Found 3"),
        pattern=r"^(?P<key>[^:]+\.py):(?P<rest>\d+: .*)$",
    )
    assert out == ["a.py", "  1: error: x", "  9: note: z", "b.py:2: error: y", "Found 3"]
    assert srcs(out) == [None, (1, 1), (3, 3), (2, 2), (4, 4)]
    with pytest.raises(ValueError, match="'key'"):
        act("group", lines_of("x"), pattern="(x)")


def test_json_compacts_without_touching_values() -> None:
    doc = '{\n  "price": 1.10,\n  "big": 12345678901234567890,\n  "s": "a  b\\n",\n  "l": [1, 2]\n}'
    out = act("json", lines_of(*doc.split("\n")))
    assert out == ['{"price":1.10,"big":12345678901234567890,"s":"a  b\\n","l":[1,2]}']
    assert srcs(out) == [(1, 6)]
    assert json.loads(out[0]) == json.loads(doc)


def test_json_ndjson_and_non_json() -> None:
    out = act("json", lines_of('{"a": 1, "b": [1, 2]}', "not json {", "[1, 2]"))
    assert out == ['{"a":1,"b":[1,2]}', "not json {", "[1,2]"]
    lines = lines_of("{ broken", "}")
    assert act("json", lines) == ["{ broken", "}"]
