"""``schemas/rulepack.v1.schema.json`` is what ``ctxrules schema`` prints for the built-in
plugins: every built-in stage's and compressor action's options with their defaults, so an
editor that uses the file completes ``with:`` and flags a typo there. Checked with the real
``check-jsonschema`` tool, as an editor or a CI job would use the file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ctxrules.plugins import default_registry
from ctxrules.stages.base import options_schema_for
from ctxrules.validation.full_schema import dumps, full_schema, strip_registry

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "schemas" / "rulepack.v1.schema.json"
REGENERATE = "python -m ctxrules.cli.main schema > schemas/rulepack.v1.schema.json"


def _schema_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "engine")}
    return subprocess.run(
        [sys.executable, "-m", "ctxrules.cli.main", "schema", *argv],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=120,
    )


def test_the_file_is_what_ctxrules_schema_prints_for_the_builtins() -> None:
    registry = default_registry()
    assert all(p.builtin for p in registry.plugins), "only the built-in plugins are installed here"
    proc = _schema_cli()
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == SCHEMA.read_text(encoding="utf-8"), f"the schema file is stale: run `{REGENERATE}`"
    assert dumps(full_schema(registry)) == proc.stdout


def test_regenerating_keeps_the_hand_written_part() -> None:
    on_disk = json.loads(SCHEMA.read_text(encoding="utf-8"))
    again = full_schema()
    assert strip_registry(again) == strip_registry(on_disk)
    assert dumps(full_schema()) == dumps(again)  # idempotent


def test_every_builtin_stage_and_action_is_in_the_file_with_its_options_and_defaults() -> None:
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    registry = default_registry()
    stage = schema["$defs"]["stage"]
    step = schema["$defs"]["compressor"]["properties"]["steps"]["items"]
    assert stage["properties"]["use"]["enum"] == sorted(registry.stages)
    assert step["properties"]["use"]["enum"] == sorted(registry.actions)
    stages = {b["if"]["properties"]["use"]["const"]: b["then"]["properties"]["with"] for b in stage["allOf"]}
    actions = {b["if"]["properties"]["use"]["const"]: b["then"]["properties"]["with"] for b in step["allOf"]}
    assert set(stages) == set(registry.stages) and set(actions) == set(registry.actions)
    for name, st in registry.stages.items():
        options = options_schema_for(st)
        assert set(stages[name].get("properties", {})) == set(options.get("properties", {})), name
        for key, prop in options.get("properties", {}).items():
            if "default" in prop:
                assert stages[name]["properties"][key]["default"] == prop["default"], (name, key)
    # spot checks of defaults that matter to authors (stage and action option defaults)
    assert stages["compress.truncate"]["properties"]["head_tokens"]["default"] == 300
    assert actions["context"]["properties"]["before"]["default"] == 2
    assert actions["squeeze_blank"]["properties"]["max_run"]["default"] == 1
    with_defaults = sum("default" in p for a in actions.values() for p in a.get("properties", {}).values())
    assert with_defaults >= 20


def _check_jsonschema() -> str:
    exe = shutil.which("check-jsonschema")
    if exe is None:
        pytest.skip("needs check-jsonschema (test extra)")
    return exe


def test_the_file_is_a_valid_draft_2020_12_schema() -> None:
    proc = subprocess.run(
        [_check_jsonschema(), "--check-metaschema", str(SCHEMA)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_builtin_packs_pass_and_a_typo_in_with_fails_against_the_file(tmp_path: Path) -> None:
    exe = _check_jsonschema()
    packs = [REPO / "rules" / "default.yaml", *sorted((REPO / "rules" / "compressors").glob("*.yaml"))]
    proc = subprocess.run(
        [exe, "--schemafile", str(SCHEMA), *map(str, packs)], capture_output=True, text=True, check=False, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    typo = tmp_path / "typo.yaml"
    typo.write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: t, version: 1.0.0}\n"
        "pipeline:\n  - {id: pairs, use: normalize.tool_pairs, with: {unanswerd: remove}}\n"
        "compressors:\n  - {id: c, match: {argv: [x]}, steps: [{use: max_lines, with: {max: 3, mx: 3}}]}\n",
        encoding="utf-8",
    )
    proc = subprocess.run(
        [exe, "--schemafile", str(SCHEMA), str(typo)], capture_output=True, text=True, check=False, timeout=300
    )
    assert proc.returncode == 1, proc.stdout
    assert "'unanswerd' was unexpected" in proc.stdout and "'mx' was unexpected" in proc.stdout


def test_schema_path_names_the_copy_an_editor_can_use() -> None:
    proc = _schema_cli("--path")
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).read_text(encoding="utf-8") == SCHEMA.read_text(encoding="utf-8")
