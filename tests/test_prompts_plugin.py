"""The pytest plugin as a pack author uses it: a throwaway project in a temp dir, run with a
fresh pytest process, snapshots written, a prompt change caught as a text diff, refreshed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PACK = """\
apiVersion: ctxrules/v1
kind: RulePack
metadata: {name: acme, version: 1.0.0}
extends: [builtin:default]
prompts:
  sections:
    house_style: {tag: house_style, file: prompts/house.md.j2}
  modes:
    lean: [identity, house_style]
models:
  - id: llama
    match: ["llama-*"]
    discipline: {template: "Answer briefly."}
"""

TESTS = """\
import pytest
from ctxrules.testing.pytest_plugin import prompt_cases


@pytest.mark.parametrize(("mode", "entry"), prompt_cases("pack.yaml"))
def test_prompt(mode, entry, assemble_prompt, prompt_snapshot):
    assert assemble_prompt(mode, entry=entry) == prompt_snapshot


def test_fixture_pack_is_configured(ctxrules_pack):
    assert ctxrules_pack.name == "acme"
"""


def _plugin_args() -> list[str]:
    installed = any(
        ep.value == "ctxrules.testing.pytest_plugin" for ep in entry_points(group="pytest11")
    )
    # From a source checkout the entry point is not installed: load the plugin by module name.
    return [] if installed else ["-p", "ctxrules.testing.pytest_plugin"]


def run_pytest(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "engine"), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            *_plugin_args(),
            "--ctxrules-pack",
            "pack.yaml",
            *args,
        ],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_plugin_in_a_throwaway_project(tmp_path: Path) -> None:
    project = tmp_path / "acme"
    (project / "prompts").mkdir(parents=True)
    (project / "pack.yaml").write_text(PACK, encoding="utf-8")
    (project / "prompts" / "house.md.j2").write_text("Write British English.\n", encoding="utf-8")
    (project / "test_prompts.py").write_text(TESTS, encoding="utf-8")
    (project / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")

    first = run_pytest(project, "--snapshot-update")
    assert first.returncode == 0, first.stdout + first.stderr
    snaps = sorted((project / "__snapshots__" / "test_prompts").glob("*.txt"))
    # 4 modes x (4 built-in entries + llama + no entry)
    assert len(snaps) == 4 * 6, [p.name for p in snaps]
    lean = (project / "__snapshots__" / "test_prompts" / "test_prompt[lean-llama].txt").read_text()
    assert lean.endswith(
        "<house_style>\nWrite British English.\n</house_style>\n\n"
        "<execution_discipline>\nAnswer briefly.\n</execution_discipline>\n"
    )

    again = run_pytest(project)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "25 passed" in again.stdout

    (project / "prompts" / "house.md.j2").write_text("Write American English.\n", encoding="utf-8")
    changed = run_pytest(project)
    assert changed.returncode == 1
    assert (
        "Write British English." in changed.stdout and "Write American English." in changed.stdout
    )
    assert "6 failed" in changed.stdout  # the lean prompt of every entry

    refreshed = run_pytest(project, "--snapshot-update")
    assert refreshed.returncode == 0, refreshed.stdout
    assert (
        "Write American English."
        in (
            project / "__snapshots__" / "test_prompts" / "test_prompt[lean-no-entry].txt"
        ).read_text()
    )
    assert run_pytest(project).returncode == 0


def test_plugin_reports_a_broken_pack_without_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "pack.yaml").write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: t, version: 1.0.0}\nprompts: {modes: {m: [nope]}}\n"
    )
    (tmp_path / "test_x.py").write_text(
        textwrap.dedent("""\
        def test_x(assemble_prompt):
            assemble_prompt("m", "gpt-4o")
    """)
    )
    result = run_pytest(tmp_path)
    assert result.returncode != 0
    out = result.stdout + result.stderr
    assert "cannot load pack pack.yaml" in out and "CR082" in out


def test_no_entry_is_the_assemblers_name_for_no_entry() -> None:
    from ctxrules.prompts import assemble
    from ctxrules.testing import pytest_plugin

    assert pytest_plugin.NO_ENTRY == assemble.NO_ENTRY
