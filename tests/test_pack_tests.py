"""``ctxrules test PACK``: the cases a pack's own file declares, the inherited ones only with
``--inherited``; the built-in packs' cases use only data shipped with them; and the built-in
pipeline replayed on real corpus sessions, as a user's pack of cases."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, TRANSCRIPTS

from ctxrules.packs.loader import builtin_names
from ctxrules.packs.validated import load_pack
from ctxrules.resources import rules_dir

EXAMPLE = REPO / "rules" / "examples" / "agent-session.json"


def write_pack(folder: Path, body: str, name: str = "pack.yaml") -> Path:
    path = folder / name
    # A pack reads only inside its own folder: its test input goes next to it.
    shutil.copy(EXAMPLE, folder / EXAMPLE.name)
    path.write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: mine, version: 1.0.0}\n"
        "extends: [builtin:default]\n" + body,
        encoding="utf-8",
    )
    return path


def summary(out: str) -> tuple[int, int, int]:
    m = re.search(r"^(\d+) passed, (\d+) failed(?:, (\d+) skipped)?$", out, re.M)
    assert m, out
    return int(m[1]), int(m[2]), int(m[3] or 0)


OWN_CASE = f"""\
tests:
  - id: mine-fits
    model: gpt-4o
    window: 32000
    input: ./{EXAMPLE.name}
    expect: {{fits: true}}
"""


def test_a_pack_runs_only_the_cases_its_own_file_declares(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pack = write_pack(tmp_path, OWN_CASE)
    code, out, _ = cli("test", str(pack))
    assert code == 0, out
    assert summary(out) == (1, 0, 0), out
    assert [ln.split(" ")[1] for ln in out.splitlines()[:-1]] == ["mine::mine-fits"]


def test_inherited_adds_the_parents_cases_and_compressor_tests(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pack = write_pack(tmp_path, OWN_CASE)
    _, builtin_out, _ = cli("test", "--inherited", "builtin:default")
    code, out, _ = cli("test", "--inherited", str(pack))
    assert code == 0, out
    inherited = summary(builtin_out)[0]
    assert inherited > 50, builtin_out  # the built-in cases and every bundled compressor's tests
    assert summary(out) == (inherited + 1, 0, 0)
    assert "compressor:git-status::" in out


def test_a_case_the_child_overrides_is_its_own(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pack = write_pack(tmp_path, "tests:\n  - {id: example-fits-at-16k, model: gpt-4o-mini}\n")
    code, out, _ = cli("test", str(pack))
    assert code == 0, out
    assert summary(out) == (1, 0, 0)
    assert "::example-fits-at-16k" in out


def test_a_pack_without_own_cases_runs_none_and_require_tests_says_so(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pack = write_pack(tmp_path, "context: {reserve_output: 8000}\n")
    code, out, _ = cli("test", str(pack))
    assert (code, summary(out)) == (0, (0, 0, 0)), out
    code, out, _ = cli("test", "--require-tests", str(pack))
    assert code == 1 and "declares no tests" in out


def test_a_folder_lets_its_packs_read_anywhere_in_it_as_validate_does(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # rules/team/child.yaml extends ../base.yaml and reads ../agent-session.json: `validate rules`
    # accepts that, so `test rules` (and `test --require-tests rules/` in CI) must too.
    rules = tmp_path / "rules"
    (rules / "team").mkdir(parents=True)
    write_pack(rules, OWN_CASE, name="base.yaml")
    (rules / "team" / "child.yaml").write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: child, version: 1.0.0}\n"
        "extends: [../base.yaml]\n" + OWN_CASE.replace("input: ./", "input: ../"),
        encoding="utf-8",
    )
    assert cli("validate", str(rules))[0] == 0
    code, out, _ = cli("test", "--require-tests", str(rules))
    assert (code, summary(out)) == (0, (2, 0, 0)), out
    # Named by itself, a pack still reads only below its own folder (and --search-path).
    code, out, _ = cli("test", str(rules / "team" / "child.yaml"))
    assert code == 1 and "CR100" in out, out


def test_an_unreadable_input_is_named_with_where_it_breaks(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # Read as `run --input` reads a message file: the failure named neither the file (a case may
    # name two: input and tools) nor, for a duplicate key, anything at all (the last one won).
    body = "tests:\n" + "".join(
        f"  - {{id: {name}, model: gpt-4o, input: ./{name}.json, expect: {{fits: true}}}}\n"
        for name in ("truncated", "twice", "latin1")
    )
    pack = write_pack(tmp_path, body)
    (tmp_path / "truncated.json").write_text('[\n  {"role": "user", "content": "hi"}\n', encoding="utf-8")
    (tmp_path / "twice.json").write_text('[{"role": "user", "content": "a", "content": "b"}]', encoding="utf-8")
    (tmp_path / "latin1.json").write_bytes(b'[{"role": "user", "content": "caf\xe9"}]')
    code, out, _ = cli("test", str(pack))
    assert (code, summary(out)) == (1, (0, 3, 0)), out
    lines = {ln.split("::")[1].split(" ")[0]: ln for ln in out.splitlines()[:-1]}
    assert f"{tmp_path / 'truncated.json'}:3:1: invalid JSON" in lines["truncated"], out
    assert f'{tmp_path / "twice.json"}: /0: the key "content" appears twice' in lines["twice"], out
    assert f"{tmp_path / 'latin1.json'}: not UTF-8 (byte 33)" in lines["latin1"], out
    # Said as `run --input` says it: no Python exception name in front.
    assert "Error" not in out, out


def test_each_case_is_one_line_whatever_its_input_name_holds(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # An input named "a\nb" printed its newline raw: the case's line broke in two, and a
    # line-by-line reader of the output (CI annotations) lost the second half.
    pack = write_pack(tmp_path, 'tests:\n  - {id: nl, model: gpt-4o, input: "a\\nb\\u001b[2J", expect: {fits: true}}\n')
    code, out, _ = cli("test", str(pack))
    assert (code, summary(out)) == (1, (0, 1, 0)), out
    first, last = out.splitlines()
    assert first.startswith("FAIL ") and "input not found: " in first and first.endswith("a\\x0ab\\x1b[2J"), out
    assert last == "0 passed, 1 failed", out


def test_an_input_that_is_a_folder_is_named_without_a_python_exception(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # It was "IsADirectoryError: [Errno 21] Is a directory: ...".
    pack = write_pack(tmp_path, "tests:\n  - {id: folder, model: gpt-4o, input: ./inputs, expect: {fits: true}}\n")
    (tmp_path / "inputs").mkdir()
    code, out, _ = cli("test", str(pack))
    assert (code, summary(out)) == (1, (0, 1, 0)), out
    assert f"{tmp_path / 'inputs'}: cannot read: Is a directory" in out and "Error" not in out, out


@pytest.mark.parametrize("name", builtin_names())
def test_builtin_cases_use_only_data_inside_the_installed_package(name: str) -> None:
    pack = load_pack(f"builtin:{name}")
    root = rules_dir().resolve()
    origins = pack.origins()
    inputs = [(f"/tests/{i}", c.get("input")) for i, c in enumerate(pack.data.get("tests") or [])]
    for ci, comp in enumerate(pack.data.get("compressors") or []):
        inputs += [(f"/compressors/{ci}/tests/{ti}", t.get("input")) for ti, t in enumerate(comp.get("tests") or [])]
    for pointer, rel in inputs:
        if rel is None:
            continue
        base = pack.real_paths[origins[pointer].file].parent
        target = (base / rel).resolve()
        assert target.is_relative_to(root) and target.is_file(), f"builtin:{name} {pointer}: {rel}"


# -- the built-in pipeline on real sessions (the corpus) -------------------------------------
# These were cases of builtin:default; they need data the package does not ship, so they are a
# user-style pack of cases here, run through the installed entry point.

CORPUS_CASES = [
    {
        "id": "long-claude-code-session-at-32k",
        "model": "gpt-4o",
        "window": 32000,
        "input": "claudecode-ae4a77f8.json",  # 485 messages, ~122K tokens
        "expect": {
            "fits": True,
            "tier": "emergency",
            "stages_ran": ["ttl", "truncate", "remove"],
            "contains": ["Work on bead spotter-4te", "continue implementation"],
        },
    },
    {
        "id": "autonomous-swe-agent-at-32k",
        "model": "gpt-4o",
        "window": 32000,
        "input": "minisweagent-django__django-13925.json",  # one long autonomous exchange
        "expect": {"fits": True, "contains": ["models.W042 is raised on inherited manually"]},
    },
    {
        "id": "claude-estimates-at-64k",
        "model": "claude-sonnet-4-5",
        "window": 64000,
        "input": "claudecode-fa812bfe.json",  # estimated counts with a safety margin
        "expect": {"fits": True},
    },
]


@pytest.mark.corpus
def test_builtin_default_compacts_real_sessions(tmp_path: Path) -> None:
    cases = [{**c, "input": str(TRANSCRIPTS / c["input"])} for c in CORPUS_CASES]
    pack = write_pack(tmp_path, "tests: " + json.dumps(cases) + "\n")
    env = {**os.environ, "PYTHONPATH": str(REPO / "engine")}
    # The corpus is outside the pack's folder: the caller names it as a search path.
    proc = subprocess.run(
        [sys.executable, "-m", "ctxrules.cli.main", "test", str(pack), "--search-path", str(TRANSCRIPTS)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert summary(proc.stdout) == (3, 0, 0), proc.stdout
