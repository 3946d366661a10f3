"""The structure-aware reducers behind ``tool_output.filter``: JSON skeleton, tables, XML, text
head/tail, spill summary and the sub-agent handover."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from conftest import COMMAND_OUTPUTS
from filtering_kit import original_lines
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxrules.stages.reduce import (
    JsonLimits,
    detect,
    extract_handover,
    handover_text,
    reduce_lines,
    reduce_structured,
    spill_summary,
    text_vault_id,
)
from ctxrules.stages.reduce.json_skeleton import reduce_json, skeleton
from ctxrules.tokens import TokenCounter
from ctxrules.vault import Vault, parse_markers

COUNT = TokenCounter.for_tokenizer("o200k_base").count_text


def _depth(value: Any) -> int:
    """Levels of non-empty containers (an empty one is kept as is: shorter than a summary)."""
    if isinstance(value, dict) and value:
        return 1 + max(_depth(v) for v in value.values())
    if isinstance(value, list) and value:
        return 1 + max(_depth(v) for v in value)
    return 0


def _records(n: int) -> str:
    owner = {"name": "x" * 30, "deep": {"deeper": [1, 2]}}
    return json.dumps(
        {
            "total": n,
            "items": [
                {
                    "id": i,
                    "name": f"item-{i}",
                    "tags": ["a", "b", "c"],
                    "meta": {"owner": owner},
                    **{f"k{j}": j for j in range(20)},
                }
                for i in range(n)
            ],
        },
        indent=2,
    )


# --- detection ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "fmt"),
    [
        ('{"a": 1}', "json"),
        ("[1, 2, 3]", "json"),
        ('{"a": 1} trailing', "text"),
        ("<root><a>1</a></root>", "xml"),
        ('<?xml version="1.0"?><!DOCTYPE x [<!ENTITY e "boom">]><x>&e;</x>', "text"),
        ("<div><p>unclosed</div>", "text"),
        ("a,b,c\n1,2,3\n4,5,6\n7,8,9\n10,11,12\n", "csv"),
        ("a\tb\n1\t2\n3\t4\n5\t6\n7\t8\n", "csv"),
        ("Hello, world.\nThis is prose, with commas, here and there.\nAnd more.\nok\nfine, yes\n", "text"),
        ("just text\n", "text"),
    ],
)
def test_detect_tells_formats_apart(text: str, fmt: str) -> None:
    assert detect(text).format == fmt


# --- JSON skeleton --------------------------------------------------------------------------


def test_json_skeleton_respects_depth_keys_items_and_says_what_was_cut() -> None:
    value = {
        "items": [{"k": list(range(10)), **{f"f{i}": i for i in range(20)}} for i in range(9)],
        "deep": {"a": {"b": {"c": {"d": {"e": 1}}}}},
        "s": "y" * 500,
    }
    skel, elided = skeleton(value, JsonLimits(depth=4, keys=12, items=6, string_chars=200))
    assert _depth(skel) <= 4
    items = skel["items"]
    assert len(items) == 7 and items[4] == "… 3 more items"  # 4 first, marker, 2 last
    assert items[0]["…"] == "9 more keys"  # 20 f* + k = 21 keys, 12 kept
    assert len(items[0]) == 13
    assert skel["deep"]["a"]["b"] == {"c": "{…} 1 keys"}  # root, deep, a, b: four levels
    assert skel["s"].startswith("y" * 200) and skel["s"].endswith("(+300 chars)")
    assert elided > 0


def test_reduce_json_stays_valid_json_with_an_embedded_marker_resolving_to_the_original(tmp_path: Path) -> None:
    original = _records(200)
    vault = Vault(tmp_path / "v")
    vid = vault.put_text(original)
    reduced = reduce_json(
        json.loads(original), original, vault_id=vid, budget_tokens=1500, count=COUNT, limits=JsonLimits()
    )
    assert reduced is not None
    doc = json.loads(reduced.text)  # still valid JSON
    assert COUNT(reduced.text) <= 1500
    markers = parse_markers(reduced.text)
    assert len(markers) == 1 and markers[0].kind == "json" and markers[0].count == reduced.elided
    assert vault.get_text(markers[0].vault_id) == original
    assert doc["_ctxrules"].startswith("[ctxrules:elided kind=json")
    assert doc["total"] == 200  # scalars at the top survive


def test_reduce_json_tightens_limits_until_the_budget_holds() -> None:
    original = _records(300)
    loose = reduce_json(
        json.loads(original), original, vault_id="0" * 64, budget_tokens=4000, count=COUNT, limits=JsonLimits()
    )
    tight = reduce_json(
        json.loads(original), original, vault_id="0" * 64, budget_tokens=300, count=COUNT, limits=JsonLimits()
    )
    assert loose is not None and tight is not None
    assert COUNT(tight.text) <= 300 < COUNT(loose.text)
    assert tight.limits.keys < loose.limits.keys


def test_reduce_json_on_a_top_level_list_puts_the_marker_first() -> None:
    original = json.dumps([{"n": i} for i in range(500)])
    reduced = reduce_json(json.loads(original), original, vault_id="a" * 64, budget_tokens=200, count=COUNT)
    assert reduced is not None
    doc = json.loads(reduced.text)
    assert doc[0].startswith("[ctxrules:elided kind=json")
    assert "… 494 more items" in doc or any("more items" in str(x) for x in doc)


def test_reduce_json_leaves_a_document_within_limits_and_budget_alone() -> None:
    original = json.dumps({"a": [1, 2], "b": "x"})
    assert reduce_json(json.loads(original), original, vault_id="a" * 64, budget_tokens=100, count=COUNT) is None


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=300),
        lambda children: st.lists(children, max_size=12) | st.dictionaries(st.text(max_size=8), children, max_size=15),
        max_leaves=300,
    )
)
@settings(max_examples=80, deadline=None)
def test_json_skeleton_of_any_document_is_valid_json_within_the_limits(value: Any) -> None:
    limits = JsonLimits(depth=3, keys=4, items=3, string_chars=40)
    skel, _ = skeleton(value, limits)
    text = json.dumps(skel, ensure_ascii=False)
    again = json.loads(text)
    assert _depth(again) <= limits.depth

    def check(node: Any) -> None:
        if isinstance(node, dict):
            assert len(node) <= limits.keys + 1
            for child in node.values():
                check(child)
        elif isinstance(node, list):
            assert len(node) <= limits.items + 1
            for child in node:
                check(child)
        elif isinstance(node, str):
            assert len(node) <= limits.string_chars + 40

    check(again)


# --- text head and tail ----------------------------------------------------------------------


def _rebuild(reduced: str, vault: Vault) -> str:
    """Put the cut lines back from the vault, using only the markers (an independent check)."""
    out = []
    for line in original_lines(reduced):
        markers = parse_markers(line)
        whole = len(markers) == 1 and markers[0].span == (0, len(line.rstrip("\n")))
        if whole and markers[0].kind == "lines" and markers[0].lines is not None:
            out.append(vault.get_lines(markers[0].vault_id, *markers[0].lines).decode())
        else:
            out.append(line)
    return "".join(out)


def test_text_head_and_tail_cut_whole_lines_that_come_back_byte_identical(tmp_path: Path) -> None:
    original = (
        "".join(f"line {i}: {'x' * (i % 50)}\r\n" if i % 7 == 0 else f"line {i}\n" for i in range(2000))
        + "the end, no newline"
    )
    vault = Vault(tmp_path / "v")
    vid = vault.put_text(original)
    reduced = reduce_lines(original, vault_id=vid, budget_tokens=600, count=COUNT)
    assert reduced is not None and reduced.lines_elided > 1000
    assert COUNT(reduced.text) <= 600
    assert reduced.text.startswith("line 0: \r\nline 1\n")
    assert reduced.text.endswith("the end, no newline")
    ((first, last),) = reduced.ranges
    cut = "".join(original_lines(original)[first - 1 : last])
    assert vault.get_lines(vid, first, last).decode() == cut
    assert _rebuild(reduced.text, vault) == original


def test_text_keeps_more_head_than_tail_by_head_share() -> None:
    original = "".join(f"row {i}\n" for i in range(5000))
    reduced = reduce_lines(original, vault_id="b" * 64, budget_tokens=500, count=COUNT, head_share=0.75)
    assert reduced is not None
    ((first, last),) = reduced.ranges
    head, tail = first - 1, 5000 - last
    assert head > 2 * tail > 0


def test_a_long_line_is_clipped_with_a_marker_for_that_very_line(tmp_path: Path) -> None:
    lines = [f"short {i}\n" for i in range(20)] + ["L" * 20_000 + "\n"]
    lines += [f"end {i}\n" for i in range(5)]
    original = "".join(lines)
    vault = Vault(tmp_path / "v")
    vid = vault.put_text(original)
    reduced = reduce_lines(original, vault_id=vid, budget_tokens=400, count=COUNT)
    assert reduced is not None and reduced.lines_clipped >= 1
    clipped = [m for m in parse_markers(reduced.text) if m.kind == "tokens"]
    assert clipped and clipped[0].lines == (21, 21)
    assert vault.get_lines(vid, 21, 21).decode() == lines[20]


def test_a_single_huge_line_keeps_its_start_and_end(tmp_path: Path) -> None:
    original = "A" * 10_000 + "MIDDLE" + "Z" * 10_000
    reduced = reduce_lines(original, vault_id="c" * 64, budget_tokens=300, count=COUNT)
    assert reduced is not None
    assert reduced.text.startswith("A") and reduced.text.endswith("Z")
    assert "MIDDLE" not in reduced.text
    assert parse_markers(reduced.text)[0].lines == (1, 1)


def test_text_within_budget_is_not_reduced() -> None:
    assert reduce_lines("a\nb\n", vault_id="d" * 64, budget_tokens=100, count=COUNT) is None


# --- tables and XML --------------------------------------------------------------------------


def test_csv_keeps_the_header_and_first_and_last_rows(tmp_path: Path) -> None:
    original = "id,name,score\n" + "".join(f"{i},name {i},{i * 3}\n" for i in range(3000))
    vault = Vault(tmp_path / "v")
    vid = vault.put_text(original)
    reduced = reduce_structured(
        original, vault_id=vid, budget_tokens=400, count=COUNT, json_limits=JsonLimits(), head_share=0.6
    )
    assert reduced is not None and reduced.format == "csv"
    shown = reduced.text.splitlines()
    assert shown[0] == "id,name,score" and shown[1] == "0,name 0,0"
    assert shown[-1] == "2999,name 2999,8997"
    marker = next(m for m in parse_markers(reduced.text))
    assert marker.extra["format"] == "csv" and marker.extra["rows"] == "3000"
    assert marker.lines is not None
    assert vault.get_lines(vid, *marker.lines).decode().count("\n") == marker.count


def test_xml_keeps_the_tree_shape_and_stays_well_formed(tmp_path: Path) -> None:
    items = "".join(f'<item id="{i}"><name>n{i}</name><desc>{"d" * 300}</desc></item>' for i in range(400))
    meta = "<meta><a><b><c><d>deep</d></c></b></a></meta>"
    original = f'<?xml version="1.0"?><catalog version="2">{meta}{items}</catalog>'
    vault = Vault(tmp_path / "v")
    vid = vault.put_text(original)
    reduced = reduce_structured(
        original, vault_id=vid, budget_tokens=800, count=COUNT, json_limits=JsonLimits(), head_share=0.6
    )
    assert reduced is not None and reduced.format == "xml"
    root = ET.fromstring(reduced.text)  # well-formed (the leading marker is a comment)
    assert root.tag == "catalog" and root.get("version") == "2"
    assert 1 <= len(root.findall("item")) <= 6
    assert "more elements: <item> x" in reduced.text
    assert COUNT(reduced.text) <= 800
    marker = parse_markers(reduced.text)[0]
    assert vault.get_text(marker.vault_id) == original


# --- spill summary and handover --------------------------------------------------------------


def test_spill_summary_names_the_whole_and_previews_it(tmp_path: Path) -> None:
    original = _records(400)
    vid = text_vault_id(original)
    summary, fmt = spill_summary(original, vault_id=vid, count=COUNT, preview_tokens=300)
    assert fmt == "json"
    first = parse_markers(summary.splitlines()[0])[0]
    assert first.vault_id == vid and first.lines is None and first.extra["reason"] == "spill"
    assert first.count == len(original_lines(original))
    assert COUNT(summary) < 600


def test_spill_summary_of_text_has_head_and_tail(tmp_path: Path) -> None:
    original = "".join(f"log line {i}\n" for i in range(30_000))
    summary, fmt = spill_summary(original, vault_id="e" * 64, count=COUNT, preview_tokens=200)
    assert fmt == "text"
    assert "log line 0\n" in summary and "log line 29999" in summary


HANDOVER = """I finished the refactor.

## Summary of changes
- Moved the parser into `src/parser/core.py`
- Added tests in tests/test_parser.py
- [x] Updated docs/usage.md

## Next steps
1. Wire the CLI to the new parser (`src/cli/main.py:42`)
2. TODO: benchmark on large inputs

## Risks
- The old `Parser.parse` API is gone; callers in lib/legacy.py break.
Warning: Python 3.10 was not tested.

See https://example.com/docs/page.html and version 3.11.2.
"""


def test_handover_extracts_done_todo_risks_and_files() -> None:
    h = extract_handover(HANDOVER)
    assert "Moved the parser into src/parser/core.py" in h.done
    assert "Updated docs/usage.md" in h.done
    assert any("Wire the CLI" in t for t in h.todo) and any("benchmark" in t for t in h.todo)
    assert any("Parser.parse" in r for r in h.risks) and any("3.10" in r for r in h.risks)
    assert h.files[:4] == ["src/parser/core.py", "tests/test_parser.py", "docs/usage.md", "src/cli/main.py"]
    assert "lib/legacy.py" in h.files
    assert not any("example.com" in f or f.startswith("3.") for f in h.files)


def test_handover_falls_back_to_past_tense_lines_for_done() -> None:
    h = extract_handover("Fixed the flaky test in tests/a_test.go\nRan the suite: all green\nnothing else")
    assert h.done == ["Fixed the flaky test in tests/a_test.go", "Ran the suite: all green"]
    assert h.todo == [] and h.files == ["tests/a_test.go"]


def test_handover_takes_check_marked_lines_as_done() -> None:
    h = extract_handover("Notes:\n\u2705 Built the index\nplain line\n\u2714 Ran the suite\n\u2713Wrote docs/a.md\n")
    assert h.done == ["Built the index", "Ran the suite", "Wrote docs/a.md"]


# Characters that decide where a path match starts and ends: the pattern's own (word
# characters, ``@.+-/~:``, digits), spaces of several kinds (Unicode ones included) and
# punctuation around paths.
_PATH_ALPHABET = "ab.Z_9/~:@+-. \t\n\u00a0\u2003\u00e9()'\"`,;#"


@settings(max_examples=400)
@given(st.text(alphabet=_PATH_ALPHABET, max_size=120))
def test_handover_path_scan_by_dotted_word_finds_what_the_full_scan_finds(text: str) -> None:
    # _path_matches scans only the words holding a dot: it must find exactly the matches of
    # the pattern run over the whole text, at the same offsets.
    from ctxrules.stages.reduce.handover import _path_matches, _regexes

    full = [(m.span(), m.group("path")) for m in _regexes().path.finditer(text)]
    assert [(m.span(), m.group("path")) for m in _path_matches(text)] == full


def test_handover_path_scan_stays_linear_on_a_long_word_without_a_dot() -> None:
    # One 200,000-character word and no dot: the word filter tries it once, not at every offset.
    from ctxrules.stages.reduce.handover import _path_matches

    assert list(_path_matches("x" * 200_000 + " tail/of.py")) != []
    assert extract_handover("a/" * 100_000 + "b").files == []


def test_handover_text_keeps_head_tail_and_a_pointer(tmp_path: Path) -> None:
    original = HANDOVER + "".join(f"detail {i}\n" for i in range(2000))
    vid = text_vault_id(original)
    text, _h = handover_text(original, vault_id=vid, keep_tokens=300, count=COUNT)
    assert text.startswith("[ctxrules:elided kind=lines")
    assert "done:\n- Moved the parser" in text and "files: src/parser/core.py" in text
    assert "detail 1999" in text and "I finished the refactor." in text
    assert {m.vault_id for m in parse_markers(text)} == {vid}


@pytest.mark.corpus
@pytest.mark.parametrize(
    "name", ["pytest9_all_import_errors.txt", "mvn_test_fail_slice_raw.txt", "gradlew_build_failed_raw.txt"]
)
def test_real_command_outputs_reduce_within_budget(name: str, tmp_path: Path) -> None:
    original = (COMMAND_OUTPUTS / "rtk" / name).read_text()
    vault = Vault(tmp_path / "v")
    vid = vault.put_text(original)
    budget = max(200, COUNT(original) // 4)
    reduced = reduce_structured(
        original, vault_id=vid, budget_tokens=budget, count=COUNT, json_limits=JsonLimits(), head_share=0.6
    )
    if COUNT(original) <= budget:
        assert reduced is None
        return
    assert reduced is not None
    assert COUNT(reduced.text) <= budget
    for marker in parse_markers(reduced.text):
        assert marker.vault_id == vid
        if marker.lines:
            assert vault.get_lines(vid, *marker.lines)
