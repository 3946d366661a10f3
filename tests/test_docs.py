"""The docs stay true: every diagnostic code, CLI verb, top-level pack key and built-in stage
type is documented in the reference pages under docs/reference/, and the README's Quick start
is what CI runs."""

from __future__ import annotations

import json
import re

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
