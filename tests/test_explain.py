"""``ctxrules explain``: the resolved pack as YAML that loads back, with origins on request."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxrules.packs.loader import PackLoader
from ctxrules.packs.render import to_yaml
from ctxrules.packs.source import Origin

REPO = Path(__file__).resolve().parents[1]


def body(out: str) -> str:
    """What explain prints after its header comments."""
    return "".join(ln + "\n" for ln in out.splitlines() if not ln.startswith("#"))


def test_explain_builtin_default_loads_back(cli) -> None:  # type: ignore[no-untyped-def]
    code, out, err = cli("explain", "builtin:default")
    assert code == 0, err
    assert out.startswith("# pack: default (files applied: ")
    assert yaml.safe_load(body(out)) == PackLoader().resolve("builtin:default").data


def test_explain_origins_of_builtin_default(
    cli,
    tmp_path: Path,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # outside the checkout the bundled pack shows as builtin:default
    code, out, _ = cli("explain", "builtin:default", "--origins")
    assert code == 0
    # every line that carries a value names where it came from (the text of a literal block
    # is the value of the line that opens it)
    lines, block = [], None
    for ln in body(out).splitlines():
        indent = len(ln) - len(ln.lstrip())
        if block is not None and (not ln.strip() or indent > block):
            continue
        block = indent if re.search(r"(: |- )\|[-+]?(  #.*)?$", ln) else None
        lines.append(ln)
    tagged = [ln for ln in lines if re.search(r"  # builtin:[\w./-]+:\d+$", ln)]
    assert tagged == lines, [ln for ln in lines if ln not in tagged]
    text = (REPO / "rules" / "default.yaml").read_text(encoding="utf-8").splitlines()
    for ln in tagged:
        m = re.match(r"^\s*(?:- )?([A-Za-z_][\w-]*): .*  # builtin:default:(\d+)$", ln)
        if m and m[1] in ("apiVersion", "kind", "window", "reserve_output"):
            assert f"{m[1]}:" in text[int(m[2]) - 1], ln


def test_explain_origins_still_loads_as_yaml(
    cli,
    tmp_path: Path,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    _, with_origins, _ = cli("explain", "builtin:default", "--origins")
    _, plain, _ = cli("explain", "builtin:default")
    assert yaml.safe_load(body(with_origins)) == yaml.safe_load(body(plain))


def test_explain_model_shows_the_entry_and_its_context(
    cli,
    tmp_path: Path,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "p.yaml").write_text(
        """\
apiVersion: ctxrules/v1
kind: RulePack
metadata: {name: t, version: 1.0.0}
context:
  reserve_output: 8192
  thresholds: {monitor: 0.4, light: 0.5, full: 0.7, emergency: 0.9}
models:
  - id: openai-like
    match: ["gpt-*", "openai/*"]
  - id: claude
    match: ["claude-*", "anthropic/*"]
    context: {thresholds: {full: 0.75}, reserve_output: 16000}
""",
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("explain", "p.yaml", "--model", "anthropic/claude-sonnet-4-5")
    assert code == 0, err
    assert "# model anthropic/claude-sonnet-4-5: models entry 'claude' applies (p.yaml:10)" in out
    indented = [ln[4:] for ln in out.splitlines() if ln.startswith("#   ")]
    effective = yaml.safe_load("\n".join(indented))
    assert effective["context"]["thresholds"]["full"] == 0.75
    assert effective["context"]["thresholds"]["monitor"] == 0.4  # inherited from the pack
    assert effective["context"]["reserve_output"] == 16000
    # first match wins; the bare name matches too
    _, out, _ = cli("explain", "p.yaml", "--model", "openai/gpt-4o")
    assert "models entry 'openai-like' applies" in out
    _, out, _ = cli("explain", "p.yaml", "--model", "mistral-large")
    assert "# model mistral-large: no models: entry matches" in out


@pytest.mark.parametrize(
    ("argv", "code", "words"),
    [
        (["explain", "nope.yaml"], 2, "no such pack file"),
        (["explain", "tests"], 2, "tests is a folder, not a pack file"),
        # there, but not a regular file: said as run and validate say it, not "no such pack file"
        (["explain", "/dev/zero"], 1, "CR101] not read: the pack file is a device"),
        (["explain", "builtin:nope"], 2, "no built-in pack"),
        (["explain"], 2, "PACK"),
        (["explain", "builtin:default", "--bogus"], 2, "unrecognized"),
        (["explain", "builtin:default@^2"], 1, "CR032"),
        (["explain", "tests/fixtures/packs/bad/cr050-threshold-above-one.yaml"], 1, "CR050"),
        (["explain", "tests/fixtures/packs/bad/cr001-tab-indentation.yaml"], 1, "CR001"),
    ],
)
def test_explain_errors(
    cli,
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    code: int,  # type: ignore[no-untyped-def]
    words: str,
) -> None:
    monkeypatch.chdir(REPO)
    got, out, err = cli(*argv)
    assert got == code
    assert out == ""
    assert words in err and "Traceback" not in err


def test_explain_reports_every_error_count(
    cli,
    tmp_path: Path,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "p.yaml").write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: t, version: 1.0.0}\n"
        "context:\n  reserve_output: -1\n  tail_budget: 2\n",
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("explain", "p.yaml")
    assert code == 1
    assert err.count("\n") == 1 and "and 1 more; run `ctxrules validate`" in err


# -- the renderer ------------------------------------------------------------------------------

_text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=False),
    _text,
    st.sampled_from(
        [
            "yes",
            "no",
            "on",
            "off",
            "null",
            "~",
            "1.0",
            "0x10",
            "1e3",
            "- x",
            "a: b",
            "#c",
            "'",
            '"',
            "",
            " lead",
            "trail ",
            "&a",
            "*a",
            "!t",
            "%x",
            "@x",
            "`x",
            "a\nb",
            "a\n",
            "\n",
            "\t",
            "x\r\ny",
            "\u2028",
            "ä",
            "2001-01-01",
            "<<",
        ]
    ),
)
_keys = st.one_of(_text.filter(bool), st.sampled_from(["on", "yes", "null", "1", "a/b", "a~b", "- x", "k: v", "#"]))
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_keys, inner, max_size=4)),
    max_leaves=25,
)


@settings(max_examples=400, deadline=None)
@given(data=st.dictionaries(_keys, _values, min_size=1, max_size=5))
def test_rendered_yaml_loads_back_to_the_same_data(data: dict[str, object]) -> None:
    assert yaml.safe_load(to_yaml(data)) == data


@settings(max_examples=200, deadline=None)
@given(data=st.dictionaries(_keys, _values, min_size=1, max_size=5))
def test_origin_comments_do_not_change_the_data(data: dict[str, object]) -> None:
    origins: dict[str, Origin] = {}

    def walk(value: object, pointer: str) -> None:
        origins[pointer] = Origin("some file.yaml", 7, 3)
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{pointer}/{str(k).replace('~', '~0').replace('/', '~1')}")
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, f"{pointer}/{i}")

    walk(data, "")
    assert yaml.safe_load(to_yaml(data, origins)) == data


def test_rendering_keeps_key_order_and_block_style() -> None:
    text = to_yaml({"b": 1, "a": {"y": [1, {"k": "v"}], "x": "multi\nline\n"}})
    assert text == "b: 1\na:\n  y:\n    - 1\n    - k: v\n  x: |\n    multi\n    line\n"
