"""The docs stay true: every diagnostic code, CLI verb, top-level pack key and built-in stage
type is documented in the reference pages under docs/reference/, and the README's Quick start
is what CI runs."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterator

from conftest import REPO

from ctxrules.cli.main import VERBS, build_parser
from ctxrules.plugins import default_registry
from ctxrules.validation.diagnostics import CODES

README = (REPO / "README.md").read_text()
REFERENCE_DIR = REPO / "docs" / "reference"
CODES_PAGE = (REFERENCE_DIR / "codes.md").read_text()
CLI_PAGE = (REFERENCE_DIR / "cli.md").read_text()
PACK_PAGE = (REFERENCE_DIR / "pack.md").read_text()
STAGES_PAGE = (REFERENCE_DIR / "stages.md").read_text()


def test_every_diagnostic_code_is_in_the_reference() -> None:
    documented = set(re.findall(r"^\| (CR\d{3}) \|", CODES_PAGE, re.M))
    assert documented == set(CODES)


def test_every_verb_is_in_the_reference() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "verb")
    verbs = set(sub.choices)  # type: ignore[attr-defined]
    assert len(verbs) == len(VERBS)
    for verb in verbs:
        assert f"`ctxrules {verb}" in CLI_PAGE, verb


def _long_options(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[str, str]]:
    """``(verb path, --option)`` for every long option of every verb and sub-verb."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _long_options(sub, (*path, name))
        elif path:
            for option in action.option_strings:
                if option.startswith("--") and option != "--help":
                    yield " ".join(path), option


def test_every_option_of_every_verb_is_in_its_row_of_the_reference() -> None:
    """The reference is the page that lists every verb: a user reading a verb's row saw neither
    `run --touched` nor `compress --model` nor `eval --judge`, which the verbs take."""
    rows = [line for line in CLI_PAGE.splitlines() if line.startswith("| `ctxrules ")]
    # One sentence documents --search-path for all the verbs that load a pack.
    search_path = re.search(r"Every verb that loads a pack \(([^)]*)\)\s+takes `--search-path DIR`", CLI_PAGE)
    assert search_path is not None
    missing = []
    for verb, option in _long_options(build_parser()):
        top = verb.split()[0]
        if option == "--search-path" and f"`{top}`" in search_path.group(1):
            continue
        if not any(row.startswith(f"| `ctxrules {top}") and option in row for row in rows):
            missing.append(f"{verb} {option}")
    assert not missing, missing


def test_every_top_level_pack_key_is_in_the_reference() -> None:
    schema = json.loads((REPO / "schemas" / "rulepack.v1.schema.json").read_text())
    for key in schema["properties"]:
        if key != "$schema":
            assert f"`{key}`" in PACK_PAGE, key


def test_every_builtin_stage_type_is_in_the_reference() -> None:
    for name, st in default_registry().stages.items():
        assert f"`{name}`" in STAGES_PAGE, name
        assert st.description, name


def test_quick_start_has_two_commands_and_ci_runs_the_second_verbatim() -> None:
    section = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```sh\n(.+?)\n```", section, re.S)
    assert len(commands) == 2 and all("\n" not in c for c in commands)
    ci = (REPO / ".ci" / "run").read_text()
    assert commands[1] in ci.splitlines()
    assert "rules/examples/agent-session.json" in commands[0]


def test_builtin_packs_and_readme_examples_carry_the_schema_modeline() -> None:
    for pack in (p for p in (REPO / "rules").rglob("*.yaml") if "fixtures" not in p.parts):
        assert pack.read_text().startswith("# yaml-language-server: $schema="), pack
    assert "# yaml-language-server: $schema=" in README


def test_the_assemble_json_keys_are_the_documented_ones(cli) -> None:  # type: ignore[no-untyped-def]
    """docs/prompts.md named an `entry` key that `assemble --format json` does not write (it is
    `models_entry`) and left out half of those it does."""
    row = next(
        line for line in (REPO / "docs" / "prompts.md").read_text().splitlines() if line.startswith("| `--format`")
    )
    documented = set(re.findall(r"`([a-z_0-9]+)`", row.split("with `--matrix`")[0])) - {
        "text",
        "json",
        "--format",
        "origin",
    }
    documented.add("text")
    code, out, _ = cli("assemble", "--mode", "lean", "--model", "gpt-4o", "--format", "json")
    assert code == 0
    assert set(json.loads(out)) == documented
    code, out, _ = cli("assemble", "--matrix", "--mode", "lean", "--format", "json")
    assert code == 0 and set(json.loads(out)) == {"pack", "prompts"}
