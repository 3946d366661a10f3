"""The pytest plugin as a pack author uses it: a throwaway project in a temp dir, run with a
fresh pytest process, snapshots written, a prompt change caught as a text diff, refreshed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import pytest

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
    installed = any(ep.value == "ctxrules.testing.pytest_plugin" for ep in entry_points(group="pytest11"))
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


def throwaway_project(tmp_path: Path) -> Path:
    """A pack author's project: the pack, its prompt template, the snapshot tests, pytest.ini."""
    project = tmp_path / "acme"
    (project / "prompts").mkdir(parents=True)
    (project / "pack.yaml").write_text(PACK, encoding="utf-8")
    (project / "prompts" / "house.md.j2").write_text("Write British English.\n", encoding="utf-8")
    (project / "test_prompts.py").write_text(TESTS, encoding="utf-8")
    (project / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    return project


def test_plugin_in_a_throwaway_project(tmp_path: Path) -> None:
    project = throwaway_project(tmp_path)

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
    assert "Write British English." in changed.stdout and "Write American English." in changed.stdout
    assert "6 failed" in changed.stdout  # the lean prompt of every entry

    refreshed = run_pytest(project, "--snapshot-update")
    assert refreshed.returncode == 0, refreshed.stdout
    assert (
        "Write American English."
        in (project / "__snapshots__" / "test_prompts" / "test_prompt[lean-no-entry].txt").read_text()
    )
    assert run_pytest(project).returncode == 0


def test_a_snapshot_is_data_never_a_doctest(tmp_path: Path) -> None:
    """Snapshot files are named test_<test>[...].txt, which pytest's doctest plugin collects by
    default: a prompt holding a `>>>` line ran it as Python on the next pytest (here: it would
    write a file), and a snapshot that is not UTF-8 stopped the run at collection."""
    project = throwaway_project(tmp_path)
    marker = tmp_path / "ran"
    (project / "prompts" / "house.md.j2").write_text(
        f"Answer like a Python REPL:\n>>> __import__('pathlib').Path({str(marker)!r}).write_text('x')\n1\n",
        encoding="utf-8",
    )
    first = run_pytest(project, "--snapshot-update")
    assert first.returncode == 0, first.stdout + first.stderr
    again = run_pytest(project)
    assert again.returncode == 0 and "25 passed" in again.stdout, again.stdout + again.stderr
    assert not marker.exists(), "a line of a stored prompt ran"
    snap = project / "__snapshots__" / "test_prompts" / "test_prompt[lean-llama].txt"
    snap.write_bytes(b"\xff\xfe\x00not text")
    damaged = run_pytest(project)
    assert damaged.returncode == 1 and "1 failed, 24 passed" in damaged.stdout, damaged.stdout + damaged.stderr


def test_a_project_inside_a_folder_named_like_snapshots_is_still_collected(tmp_path: Path) -> None:
    """Only snapshot folders below the rootdir are passed over, not a project kept in one."""
    project = throwaway_project(tmp_path / "__snapshots__")
    first = run_pytest(project, "--snapshot-update")
    assert first.returncode == 0 and "25 passed" in first.stdout, first.stdout + first.stderr


def test_a_broken_pack_under_snapshot_update_deletes_no_snapshot(tmp_path: Path) -> None:
    """A typo in the pack makes the prompt tests fail to collect; syrupy took their snapshots
    for unused ones and ``--snapshot-update`` deleted every one of them."""
    project = throwaway_project(tmp_path)
    (project / "test_other.py").write_text("def test_other(snapshot):\n    assert 1 == snapshot\n", encoding="utf-8")
    first = run_pytest(project, "--snapshot-update")
    assert first.returncode == 0, first.stdout + first.stderr
    before = sorted(p.name for p in (project / "__snapshots__").rglob("*.*"))
    assert len([n for n in before if n.endswith(".txt")]) == 24, before
    broken = PACK.replace("lean: [identity, house_style]", "lean: [identity, nope]")
    (project / "pack.yaml").write_text(broken, encoding="utf-8")
    for args in (["--snapshot-update"], ["--snapshot-update", "test_other.py"], []):
        result = run_pytest(project, *args)
        assert sorted(p.name for p in (project / "__snapshots__").rglob("*.*")) == before, args
    assert "cannot load pack pack.yaml" in result.stdout + result.stderr


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


def test_prompt_snapshot_without_syrupy_says_to_install_it(tmp_path: Path) -> None:
    """syrupy is not a dependency of ctxrules (docs/prompts.md: a project that has ctxrules,
    pytest and syrupy): without its plugin, the docs' snapshot test failed with pytest's
    "fixture 'snapshot' not found", naming neither syrupy nor what to install."""
    project = throwaway_project(tmp_path)
    result = run_pytest(project, "-p", "no:syrupy", "-k", "lean-llama")
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "1 error" in out and "fixture 'snapshot' not found" not in out, out
    assert "prompt_snapshot fixture needs syrupy's pytest plugin" in out and "pip install syrupy" in out, out


def test_no_entry_is_the_assemblers_name_for_no_entry() -> None:
    from ctxrules.prompts import assemble
    from ctxrules.testing import pytest_plugin

    assert pytest_plugin.NO_ENTRY == assemble.NO_ENTRY


# -- the docs/prompts.md example, exactly as written ------------------------------------------

pytest_plugins = ["pytester"]

USER_PACK = """\
apiVersion: ctxrules/v1
kind: RulePack
metadata: {name: acme, version: 1.0.0}
extends: [builtin:default]
prompts:
  sections:
    review_rules: {tag: review_rules, template: "Review the diff; never push."}
  modes:
    review: [identity, review_rules]
"""


def docs_example() -> str:
    """The Python block of docs/prompts.md's "Snapshot tests" section."""
    text = (REPO / "docs" / "prompts.md").read_text(encoding="utf-8")
    section = text.split("## Snapshot tests (pytest plugin)", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_docs_example_snapshots_the_users_pack_from_any_folder(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO / "engine"))
    example = docs_example()
    assert 'prompt_cases("pack.yaml")' in example
    pytester.makeini("[pytest]\n")
    (pytester.path / "pack.yaml").write_text(USER_PACK, encoding="utf-8")
    tests = pytester.mkdir("tests")
    (tests / "test_prompts.py").write_text(example, encoding="utf-8")

    first = pytester.runpytest_subprocess(*_plugin_args(), "-p", "no:cacheprovider", "--snapshot-update")
    assert first.ret == 0, first.stdout.str()
    snaps = tests / "__snapshots__" / "test_prompts"
    review = (snaps / "test_prompt[review-no-entry].txt").read_text(encoding="utf-8")
    assert "<review_rules>\nReview the diff; never push.\n</review_rules>" in review, "the user's own mode"
    full = (snaps / "test_prompt[full-claude].txt").read_text(encoding="utf-8")
    assert "<execution_discipline>" in full
    # five modes (the built-in four and review) x (four built-in entries + no entry)
    assert len(list(snaps.glob("*.txt"))) == 5 * 5

    # started from the tests folder, the same pack and the same snapshots
    monkeypatch.chdir(tests)
    again = pytester.runpytest_subprocess(*_plugin_args(), "-p", "no:cacheprovider")
    assert again.ret == 0, again.stdout.str()
    again.assert_outcomes(passed=25)

    # a change to the user's pack is a failing diff, not a silent pass on builtin:default
    monkeypatch.chdir(pytester.path)
    (pytester.path / "pack.yaml").write_text(USER_PACK.replace("never push", "never force-push"), encoding="utf-8")
    changed = pytester.runpytest_subprocess(*_plugin_args(), "-p", "no:cacheprovider")
    assert changed.ret == 1
    changed.assert_outcomes(passed=20, failed=5)
    assert "never force-push" in changed.stdout.str()


COLLIDING_MODES = """\
apiVersion: ctxrules/v1
kind: RulePack
metadata: {name: modes, version: 1.0.0}
prompts:
  sections:
    one: {tag: one, template: "One."}
    two: {tag: two, template: "Two."}
  modes:
    plain: [one]
    "a/b": [one]
    ab: [two]
    "x:y": [one]
    Lean: [one]
    lean: [two]
    "caf\\u00e9": [one]
    "cafxe9": [two]
models:
  - {id: b-c, match: ["b-*"]}
  - {id: c, match: ["c-*"]}
"""


def test_prompt_cases_give_every_case_its_own_snapshot_file(tmp_path: Path) -> None:
    """syrupy names a snapshot file after the test id with `/\\:*?"<>|` and controls removed,
    and pytest writes `é` as `\\xe9`: modes `a/b` and `ab` (or `café` and `cafxe9`, or `Lean`
    and `lean` on a case-insensitive file system, or mode `a-b` with entry `c` and mode `a` with
    entry `b-c`) shared one file, and the snapshot test of one of them failed for good. Ids that
    would collide carry a digest of their mode and entry; the others are as before."""
    from ctxrules.testing.pytest_plugin import prompt_cases
    from ctxrules.testing.snapshot import PromptSnapshotExtension

    pack = COLLIDING_MODES.replace("plain: [one]", "plain: [one]\n    a-b: [one]\n    a: [two]")
    (tmp_path / "pack.yaml").write_text(pack, encoding="utf-8")
    cases = prompt_cases("pack.yaml", rootdir=tmp_path)
    ids = [c.id for c in cases]
    assert len(cases) == 10 * 3
    assert "plain-no-entry" in ids and "plain-b-c" in ids  # names that collide with none: unchanged
    files = [
        PromptSnapshotExtension._sanitize_filename(
            f"test_prompt[{i}]".encode("unicode_escape").decode("ascii") if not i.isascii() else f"test_prompt[{i}]"
        ).casefold()
        for i in ids
    ]
    assert len(set(files)) == len(files), sorted(files)
