"""Reading YAML: a position for every value, duplicate keys refused, bad shapes reported."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxrules.packs import source
from ctxrules.packs.loader import PackLoader
from ctxrules.packs.source import SourceDoc, YamlProblem, escape_token, parse_yaml


def problem(text: str) -> YamlProblem:
    with pytest.raises(YamlProblem) as info:
        parse_yaml(text, "p.yaml")
    return info.value


# -- positions ----------------------------------------------------------------------------

BLOCK = """\
apiVersion: ctxrules/v1
kind: RulePack
context:
  thresholds: {monitor: 0.4, light: 0.5}
pipeline:
  - id: pairs
    use: normalize.tool_pairs
  - {id: cache, use: cache.markers}
tools:
  exit_code:
    - 'Exit code (\\d+)'
"""


def all_pointers(value: object, pointer: str = "") -> list[str]:
    out = [pointer]
    if isinstance(value, dict):
        for k, v in value.items():
            out += all_pointers(v, f"{pointer}/{escape_token(k)}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += all_pointers(v, f"{pointer}/{i}")
    return out


def test_every_value_has_a_position() -> None:
    doc = parse_yaml(BLOCK, "p.yaml")
    for pointer in all_pointers(doc.data):
        assert pointer in doc.positions, pointer
    # and every key of a mapping has one too
    for pointer in all_pointers(doc.data):
        parent = pointer.rsplit("/", 1)[0]
        if pointer and isinstance(_at(doc, parent), dict):
            assert pointer + "#key" in doc.positions, pointer


def _at(doc: SourceDoc, pointer: str) -> object:
    value: object = doc.data
    for token in [t for t in pointer.split("/")[1:]]:
        key = token.replace("~1", "/").replace("~0", "~")
        value = value[int(key)] if isinstance(value, list) else value[key]  # type: ignore[index]
    return value


@pytest.mark.parametrize(
    ("pointer", "line", "col"),
    [
        ("", 1, 1),
        ("/apiVersion", 1, 13),
        ("/context", 4, 3),  # a block mapping starts at its first key
        ("/context/thresholds", 4, 15),  # a flow mapping starts at its brace
        ("/context/thresholds/monitor", 4, 25),
        ("/context/thresholds/light", 4, 37),
        ("/pipeline/0", 6, 5),
        ("/pipeline/0/id", 6, 9),
        ("/pipeline/0/use", 7, 10),
        ("/pipeline/1", 8, 5),
        ("/pipeline/1/use", 8, 22),
        ("/tools/exit_code/0", 11, 7),
    ],
)
def test_value_positions(pointer: str, line: int, col: int) -> None:
    doc = parse_yaml(BLOCK, "p.yaml")
    assert doc.positions[pointer] == (line, col)
    o = doc.origin(pointer)
    assert (o.file, o.line, o.col) == ("p.yaml", line, col)


@pytest.mark.parametrize(
    ("pointer", "line", "col"),
    [
        ("/context", 3, 1),
        ("/context/thresholds", 4, 3),
        ("/context/thresholds/light", 4, 30),
        ("/pipeline/0/use", 7, 5),
    ],
)
def test_key_positions(pointer: str, line: int, col: int) -> None:
    doc = parse_yaml(BLOCK, "p.yaml")
    o = doc.key_origin(pointer)
    assert (o.line, o.col) == (line, col)


def test_origin_of_an_unknown_pointer_falls_back_to_the_nearest_ancestor() -> None:
    doc = parse_yaml(BLOCK, "p.yaml")
    o = doc.origin("/pipeline/0/with/keep_last")
    assert (o.line, o.col) == (6, 5)
    assert str(o) == "p.yaml:6"
    assert doc.key_origin("/nothing/here") == doc.origin("")


def test_keys_with_slash_and_tilde_are_escaped_in_pointers() -> None:
    doc = parse_yaml("tools:\n  timeouts:\n    a/b~c: 1\n", "p.yaml")
    assert doc.positions["/tools/timeouts/a~1b~0c"] == (3, 12)


def test_multiline_scalars_start_where_they_are_written() -> None:
    doc = parse_yaml("a: |\n  one\n  two\nb: >-\n  folded\n  text\n", "p.yaml")
    assert doc.data == {"a": "one\ntwo\n", "b": "folded text"}
    assert doc.positions["/a"] == (1, 4)
    assert doc.positions["/b"] == (4, 4)


def test_yaml_11_booleans_as_keys_stay_strings() -> None:
    doc = parse_yaml("on: 1\nyes: 2\n3: 3\n", "p.yaml")
    assert doc.data == {"on": 1, "yes": 2, "3": 3}


# -- duplicate keys ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key", "line", "col", "first"),
    [
        ("a: 1\nb: 2\na: 3\n", "a", 3, 1, 1),
        ("m:\n  x: 1\n  y: 2\n  x: 3\n", "x", 4, 3, 2),
        ("m: {x: 1, y: 2, x: 3}\n", "x", 1, 17, 1),
        ("l:\n  - {id: a, id: b}\n", "id", 2, 13, 2),
        ("l:\n  - id: a\n    use: x\n    use: y\n", "use", 4, 5, 3),
        ("deep:\n  a:\n    b:\n      c: 1\n      c: 1\n", "c", 5, 7, 4),
        ('"q": 1\nq: 2\n', "q", 2, 1, 1),  # quoting does not make a different key
    ],
)
def test_duplicate_keys_are_errors(text: str, key: str, line: int, col: int, first: int) -> None:
    p = problem(text)
    assert p.code == "CR003"
    assert (p.line, p.col) == (line, col)
    assert f"duplicate key '{key}'" in p.message and f"line {first}" in p.message
    assert p.pointer.endswith("/" + key)
    assert p.hint


def test_pyyaml_alone_would_have_kept_the_last_value() -> None:
    """The reason this module exists: PyYAML drops the first value without a word."""
    assert yaml.safe_load("a: 1\na: 2\n") == {"a": 2}
    assert problem("a: 1\na: 2\n").code == "CR003"


# -- merge keys ----------------------------------------------------------------------------


def test_merge_key_with_explicit_override_is_allowed() -> None:
    text = """\
base: &base
  monitor: 0.4
  light: 0.5
  full: 0.7
mine:
  <<: *base
  light: 0.55
"""
    doc = parse_yaml(text, "p.yaml")
    assert doc.data["mine"] == {"monitor": 0.4, "light": 0.55, "full": 0.7}
    assert doc.data == yaml.safe_load(text)
    # the overriding value is where the author wrote it, a merged one where the anchor is
    assert doc.positions["/mine/light"] == (7, 10)
    assert doc.positions["/mine/monitor"] == (2, 12)


def test_merge_of_several_maps_earlier_wins_like_yaml() -> None:
    text = "a: &a {x: 1}\nb: &b {x: 2, y: 2}\nc:\n  <<: [*a, *b]\n  z: 3\n"
    doc = parse_yaml(text, "p.yaml")
    assert doc.data == yaml.safe_load(text)
    assert doc.data["c"] == {"x": 1, "y": 2, "z": 3}
    assert doc.positions["/c/x"] == (1, 11)


def test_duplicate_explicit_keys_next_to_a_merge_key_are_still_errors() -> None:
    p = problem("a: &a {x: 1}\nb:\n  <<: *a\n  x: 2\n  x: 3\n")
    assert (p.code, p.line) == ("CR003", 5)


def test_aliases_are_expanded_with_the_anchor_position() -> None:
    doc = parse_yaml("a: &v [1, 2]\nb: *v\n", "p.yaml")
    assert doc.data == {"a": [1, 2], "b": [1, 2]}
    assert doc.positions["/b/1"] == doc.positions["/a/1"] == (1, 11)


def test_recursive_alias_is_an_error_not_a_crash() -> None:
    p = problem("a: &x {b: *x}\n")
    assert p.code == "CR001" and "alias" in p.message


def test_alias_bomb_is_refused_quickly() -> None:
    lines = ["l0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"l{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    p = problem("\n".join(lines) + "\n")
    assert p.code == "CR001" and "values" in p.message


# -- syntax, tabs, shapes ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "col", "words"),
    [
        ("a:\n\tb: 1\n", 2, 1, "indentation"),
        ("a:\n  b: 1\n  \tc: 2\n", 3, 3, "indentation"),
        ("l:\n\t- 1\n", 2, 1, "indentation"),
        ("a:\tb\n", 1, 3, "expects a space"),
    ],
)
def test_tabs(text: str, line: int, col: int, words: str) -> None:
    p = problem(text)
    assert (p.code, p.line, p.col) == ("CR001", line, col)
    assert "tab" in p.message and words in p.message
    assert p.hint and "space" in p.hint


def test_tabs_inside_values_are_fine() -> None:
    doc = parse_yaml('a: "x\\ty"\nb: "x\ty"\n# a\tcomment\n', "p.yaml")
    assert doc.data == {"a": "x\ty", "b": "x\ty"}


@pytest.mark.parametrize(
    ("text", "line", "col"),
    [
        ('a: "open\n', 1, 4),  # unclosed quote: where it opens, not the end of file
        ("a: [1, 2\n", 1, 4),
        ("a: 1\n b: 2\n", 2, 3),
        ("a: *nothing\n", 1, 4),
        ("a: !!python/object:os.system x\n", 1, 4),
        ("a: b\x07\n", 1, 5),  # a control character
    ],
)
def test_syntax_errors_have_positions(text: str, line: int, col: int) -> None:
    p = problem(text)
    assert (p.code, p.line, p.col) == ("CR001", line, col)


@pytest.mark.parametrize(
    ("text", "line", "col", "shown"),
    [
        ("a: !!python/object:os.system\n  b: 1\n", 1, 4, "'!!python/object:os.system'"),
        ("a: !!python/object/apply:os.system [echo hi]\n", 1, 4, "'!!python/object/apply:os.system'"),
        ("a:\n  - !!python/object/new:os.system {}\n", 2, 5, "'!!python/object/new:os.system'"),
        ("a: !!set {x, y}\n", 1, 4, "'!!set'"),
        ("a: !!omap [b: 1]\n", 1, 4, "'!!omap'"),
        ("a: !mine {b: 1}\n", 1, 4, "'!mine'"),
        ("!!python/object:x\na: 1\n", 1, 1, "'!!python/object:x'"),
    ],
)
def test_a_tag_on_a_mapping_or_list_is_refused_not_read_as_plain_data(
    text: str, line: int, col: int, shown: str
) -> None:
    """A tag on a scalar fails in its constructor; on a mapping or a list it was dropped and the
    value read as plain data: `!!python/object:...` looked accepted (as if it did something)."""
    p = problem(text)
    assert (p.code, p.line, p.col) == ("CR001", line, col)
    assert shown in p.message and p.hint and "remove the tag" in p.hint


def test_the_default_collection_tags_are_plain_data() -> None:
    assert parse_yaml("a: !!map {b: !!seq [1]}\n", "p.yaml").data == {"a": {"b": [1]}}


def test_too_deep_nesting_is_an_error_not_a_crash() -> None:
    p = problem("a: " + "[" * 5000 + "]" * 5000 + "\n")
    assert p.code == "CR001" and "deep" in p.message


def test_several_documents_are_refused() -> None:
    p = problem("a: 1\n---\nb: 2\n")
    assert (p.code, p.line, p.col) == ("CR002", 2, 1)
    assert "several" in p.message


@pytest.mark.parametrize(
    "tail",
    ["---\n", "---", "--- \n", "---\r\n", "---\n# generated\n", "---\n...\n", "---\n---\n", "...\n---\n"],
)
@pytest.mark.parametrize("parser", ["fast", "pure"])
def test_empty_documents_after_the_pack_are_fine(tail: str, parser: str) -> None:
    # A trailing `---` (hand-edited files, generated YAML) was CR002, "several documents".
    text = "a: 1\nb: [x]\n" + tail
    if parser == "fast":
        if not yaml.__with_libyaml__:
            pytest.skip("PyYAML without libyaml")
        doc = source._parse_fast(text, "p.yaml")
        assert doc is not None  # not left to the pure-Python parser as a problem
    else:
        doc = source._parse_pure(text, "p.yaml")
    assert doc.data == {"a": 1, "b": ["x"]}
    assert doc.positions["/b/0"] == (2, 5)


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("a: 1\n---\n---\nb: 2\n", 3),  # content after empty documents
        ("a: 1\n--- ~\n", 2),  # an explicit null is content
        ("a: 1\n--- ''\n", 2),
        ("a: 1\n--- !!null\n", 2),
        ("a: 1\n---\n# note\n- x\n", 2),
        ("---\n---\na: 1\n", 2),  # the pack is the first document
        ("a: 1  # a\ttab\n---\nb: 2\n", 2),  # a tab: the pure-Python parser from the start
    ],
)
def test_a_second_document_with_content_is_still_refused_at_its_start(text: str, line: int) -> None:
    p = problem(text)
    assert (p.code, p.line, p.col) == ("CR002", line, 1)


def test_a_single_explicit_document_is_fine() -> None:
    assert parse_yaml("---\na: 1\n...\n", "p.yaml").data == {"a": 1}


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "---\n"])
def test_empty_file_parses_to_nothing(text: str) -> None:
    doc = parse_yaml(text, "p.yaml")
    assert doc.data is None


def test_complex_keys_are_refused() -> None:
    p = problem("? [a, b]\n: 1\n")
    assert (p.code, p.line, p.col) == ("CR002", 1, 3)


@pytest.mark.parametrize(
    ("text", "code", "col"),
    [
        ("a: !!timestamp soon\n", "CR001", 4),
        ("a: !!bool maybe\n", "CR001", 4),
        ("a: !!float abc\n", "CR001", 4),
        ("a: !!int abc\n", "CR001", 4),
        ("a:\n  ? !!bool maybe\n  : 1\n", "CR001", 5),
        ("a:\n  ? " + "1" * 5000 + "\n  : 1\n", "CR104", 5),
    ],
)
def test_a_scalar_its_tag_cannot_read_is_a_located_error(text: str, code: str, col: int) -> None:
    p = problem(text)
    assert (p.code, p.col) == (code, col), p.message


def test_the_hint_names_the_explicit_tag_only_when_the_source_has_one() -> None:
    tagged = problem("a: !!timestamp 2024-02-30\n")
    resolved = problem("a: 2024-02-30\n")  # YAML reads it as a date by its shape: no tag to remove
    assert tagged.code == resolved.code == "CR001"
    assert "explicit tag" in (tagged.hint or "") and "explicit tag" not in (resolved.hint or "")
    assert "quote it" in (resolved.hint or "")


# -- through the loader: encoding, shapes ---------------------------------------------------


def _read(tmp_path: Path, content: bytes) -> list[tuple[str, int, int, str]]:
    path = tmp_path / "p.yaml"
    path.write_bytes(content)
    _, diags = PackLoader().read(path)
    return [(d.code, d.line, d.col, d.message) for d in diags]


@pytest.mark.parametrize(
    ("content", "line"),
    [
        (b"apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: t, version: 1.0.0}\n", None),
        (b"- a\n- b\n", 1),
        (b"\n\n- a\n", 3),
        (b"just text\n", 1),
        (b"42\n", 1),
        (b"", 1),
        (b"# nothing\n", 1),
    ],
)
def test_top_level_must_be_a_mapping(tmp_path: Path, content: bytes, line: int | None) -> None:
    diags = _read(tmp_path, content)
    if line is None:
        assert diags == []
    else:
        assert [(c, ln) for c, ln, _, _ in diags] == [("CR002", line)]
        assert "mapping" in diags[0][3]


def test_empty_file_says_so(tmp_path: Path) -> None:
    assert "empty" in _read(tmp_path, b"")[0][3]


def test_not_utf8_is_reported_at_the_line(tmp_path: Path) -> None:
    diags = _read(tmp_path, b"apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: caf\xe9}\n")
    assert [(c, ln) for c, ln, _, _ in diags] == [("CR001", 3)]
    assert "UTF-8" in diags[0][3]


def test_utf8_with_bom_and_non_ascii_text_is_fine(tmp_path: Path) -> None:
    content = (
        "\ufeffapiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: café, version: 1.0.0, description: 上下文}\n"
    )
    assert _read(tmp_path, content.encode("utf-8")) == []


def test_crlf_line_endings_keep_positions(tmp_path: Path) -> None:
    doc = parse_yaml("a: 1\r\nb:\r\n  c: 2\r\n", "p.yaml")
    assert doc.data == {"a": 1, "b": {"c": 2}}
    assert doc.positions["/b/c"] == (3, 6)


def test_each_file_is_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("apiVersion: ctxrules/v1\nkind: RulePack\n", encoding="utf-8")
    from ctxrules.packs import loader as loader_module

    reads: list[Path] = []
    real = loader_module.read_limited

    def counting(path: Path, *args: Any, **kwargs: Any) -> bytes:
        reads.append(path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(loader_module, "read_limited", counting)
    loader = PackLoader()
    first = loader.read(path)
    assert loader.read(tmp_path / "." / "p.yaml") is not None
    assert loader.read(path) == first
    assert len(reads) == 1


# -- agreement with PyYAML where PyYAML is right ---------------------------------------------

_keys = st.text(alphabet="abcdefghij_", min_size=1, max_size=6)
_scalars = st.one_of(
    st.integers(-(10**6), 10**6),
    st.booleans(),
    st.none(),
    st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=20),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
)
_values = st.recursive(
    _scalars,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(_keys, children, max_size=4)),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(data=st.dictionaries(_keys, _values, min_size=1, max_size=5), flow=st.booleans())
def test_same_values_as_pyyaml_and_a_position_for_each(data: dict[str, object], flow: bool) -> None:
    text = yaml.safe_dump(data, default_flow_style=flow, allow_unicode=True, sort_keys=False)
    doc = parse_yaml(text, "p.yaml")
    assert doc.data == yaml.safe_load(text)
    lines = text.splitlines()
    for pointer in all_pointers(doc.data):
        line, col = doc.positions[pointer]
        assert 1 <= line <= len(lines) and 1 <= col <= len(lines[line - 1]) + 1
    # libyaml (fast path) and the pure-Python parser agree exactly
    fast = source._parse_fast(text, "p.yaml")
    if fast is not None:
        pure = source._parse_pure(text, "p.yaml")
        assert (fast.data, fast.positions) == (pure.data, pure.positions)


# -- libyaml fast path ----------------------------------------------------------------------

needs_libyaml = pytest.mark.skipif(not yaml.__with_libyaml__, reason="PyYAML without libyaml")


@needs_libyaml
@pytest.mark.parametrize(
    "path", sorted(Path(__file__).resolve().parents[1].joinpath("rules").rglob("*.yaml")), ids=lambda p: p.name
)
def test_fast_path_reads_builtin_packs_exactly_like_the_pure_parser(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    fast = source._parse_fast(text, "p.yaml")
    assert fast is not None
    pure = source._parse_pure(text, "p.yaml")
    assert (fast.data, fast.positions) == (pure.data, pure.positions)


@needs_libyaml
@pytest.mark.parametrize(
    "text",
    [
        "a: 1\na: 2\n",
        "a:\tb\n",
        "k: v\t\n",
        "a: [1\n",
        "a: 1\n---\nb: 1\n",
        "a: b\x07\n",
        "a: &x {b: *x}\n",
        "? [a]\n: 1\n",
    ],
)
def test_fast_path_leaves_every_problem_to_the_pure_parser(text: str) -> None:
    """Tabs included: libyaml accepts 'a:<TAB>b', PyYAML does not; the answer must not depend
    on whether libyaml is installed."""
    assert source._parse_fast(text, "p.yaml") is None
    with pytest.raises(YamlProblem):
        parse_yaml(text, "p.yaml")


def test_parsing_works_without_libyaml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(yaml, "CSafeLoader", raising=False)
    doc = parse_yaml(BLOCK, "p.yaml")
    assert doc.positions["/pipeline/1/use"] == (8, 22)
    assert problem("a: 1\na: 2\n").code == "CR003"
