"""Compressor inline tests: ``ctxrules test --require-tests`` on the built-in rules, and what
makes a compressor test pass or fail (ctxrules.compressors.testing)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO

from ctxrules.compressors.testing import run_compressor_tests
from ctxrules.packs.loader import PackLoader
from ctxrules.packs.validated import load_pack
from ctxrules.plugins import default_registry


def test_builtin_compressor_tests_pass_and_none_is_missing(cli) -> None:  # type: ignore[no-untyped-def]
    code, out, err = cli("test", "--require-tests", str(REPO / "rules" / "compressors"))
    assert code == 0, out + err
    lines = out.splitlines()
    assert any(line.startswith("PASS compressor:pytest::") for line in lines)
    assert not any(line.startswith("FAIL") for line in lines)


def test_builtin_default_runs_every_inherited_compressor_test() -> None:
    results = run_compressor_tests(load_pack("builtin:default"), require_tests=True, registry=default_registry())
    failed = [f"{r.compressor}::{r.id}: {r.message}" for r in results if not r.passed]
    assert not failed
    rules = {r.compressor for r in results}
    assert {"git-status", "pytest", "cargo-test", "docker-build", "generic"} <= rules
    assert len(results) >= 60


def write_pack(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "pack.yaml"
    path.write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: t, version: 1.0.0}\ncompressors:\n" + body,
        encoding="utf-8",
    )
    return path


def results_of(
    path: Path, *, require_tests: bool = False, search_path: tuple[Path, ...] = ()
) -> dict[str, tuple[bool, str]]:
    pack = PackLoader(search_path).resolve(str(path))
    return {
        f"{r.compressor}::{r.id}": (r.passed, r.message)
        for r in run_compressor_tests(pack, require_tests=require_tests, registry=default_registry())
    }


LONG = "".join(f"line {i} of a long and boring output\\n" for i in range(60))


def test_a_passing_and_a_failing_expectation(tmp_path: Path) -> None:
    path = write_pack(
        tmp_path,
        f"""
  - id: cut
    match: {{argv: [tool]}}
    steps: [{{use: head, with: {{lines: 3}}}}]
    tests:
      - id: good
        input_text: "{LONG}"
        contains: ["line 2 of"]
        not_contains: ["line 40 of"]
        max_ratio: 0.5
      - {{id: bad, input_text: "{LONG}", contains: ["line 40 of"]}}
      - {{id: ratio, input_text: "{LONG}", max_ratio: 0.01}}
""",
    )
    got = results_of(path)
    assert got["cut::good"] == (True, "")
    assert got["cut::bad"][0] is False and "lacks 'line 40 of'" in got["cut::bad"][1]
    assert got["cut::ratio"][0] is False and "above max_ratio 0.01" in got["cut::ratio"][1]


def test_expected_output_with_the_vault_id(tmp_path: Path) -> None:
    text = "".join(f"row {i} with enough text to be worth eliding\\n" for i in range(1, 9))
    expected = (
        "row 1 with enough text to be worth eliding\\n"
        "[ctxrules:elided kind=lines count=7 ref=vault://{vault_id}#L2-L8]\\n"
    )
    path = write_pack(
        tmp_path,
        f"""
  - id: first
    match: {{argv: [tool]}}
    steps: [{{use: head, with: {{lines: 1}}}}]
    tests: [{{id: exact, input_text: "{text}", expected: "{expected}"}}]
""",
    )
    assert results_of(path)["first::exact"] == (True, "")


def test_a_test_of_a_shadowed_rule_fails(tmp_path: Path) -> None:
    path = write_pack(
        tmp_path,
        f"""
  - id: broad
    match: {{argv: [git]}}
    steps: [{{use: head, with: {{lines: 3}}}}]
    tests: [{{id: t, input_text: "{LONG}", command: git status}}]
  - id: narrow
    match: {{argv: [git, status]}}
    steps: [{{use: head, with: {{lines: 3}}}}]
    tests: [{{id: t, input_text: "{LONG}"}}]
""",
    )
    got = results_of(path)
    assert got["broad::t"][0] is False and "selects compressor 'narrow'" in got["broad::t"][1]
    assert got["narrow::t"] == (True, "")


def test_input_files_are_relative_to_the_declaring_pack(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "log.txt").write_text(LONG.replace("\\n", "\n"), encoding="utf-8")
    write_pack(
        tmp_path,
        """
  - id: cut
    match: {argv: [tool]}
    steps: [{use: head, with: {lines: 3}}]
    tests:
      - {id: found, input: out/log.txt, contains: ["line 0 of"]}
      - {id: missing, input: out/nope.txt}
""",
    )
    child = tmp_path / "child" / "pack.yaml"
    child.parent.mkdir()
    child.write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: t, version: 1.0.0}\nextends: [../pack.yaml]\n",
        encoding="utf-8",
    )
    got = results_of(child, search_path=(tmp_path,))
    assert got["cut::found"] == (True, "")
    assert got["cut::missing"][0] is False and "input file not found" in got["cut::missing"][1]


def test_require_tests_fails_a_compressor_without_tests(tmp_path: Path) -> None:
    path = write_pack(
        tmp_path,
        """
  - id: untested
    match: {argv: [tool]}
    steps: [{use: head, with: {lines: 3}}]
""",
    )
    assert results_of(path) == {}
    got = results_of(path, require_tests=True)
    assert got["untested::<missing>"][0] is False


def test_a_glob_argv_needs_a_command(tmp_path: Path) -> None:
    path = write_pack(
        tmp_path,
        f"""
  - id: any
    match: {{argv: ['*']}}
    steps: [{{use: head, with: {{lines: 3}}}}]
    tests: [{{id: t, input_text: "{LONG}"}}]
""",
    )
    passed, message = results_of(path)["any::t"]
    assert not passed and "give `command:`" in message


@pytest.mark.parametrize("flag", [[], ["--require-tests"]])
def test_cli_reports_a_failing_compressor_test(
    cli,
    tmp_path: Path,  # type: ignore[no-untyped-def]
    flag: list[str],
) -> None:
    path = write_pack(
        tmp_path,
        f"""
  - id: cut
    match: {{argv: [tool]}}
    steps: [{{use: head, with: {{lines: 3}}}}]
    tests: [{{id: bad, input_text: "{LONG}", contains: ["line 59 of"]}}]
""",
    )
    code, out, _ = cli("test", *flag, str(path))
    assert code == 1
    assert "FAIL compressor:cut::bad" in out


def test_a_failed_expected_shows_a_bounded_diff_not_the_whole_output(tmp_path: Path) -> None:
    from ctxrules.compressors.testing import DIFF_LINES

    text = "".join(f"row {i} of a long listing\\n" for i in range(3000))
    wrong = "".join(f"Row {i} of a long listing\\n" for i in range(3000))  # every line differs
    path = write_pack(
        tmp_path,
        f"""
  - id: all
    match: {{argv: [tool]}}
    steps: [{{use: head, with: {{lines: 5000}}}}]
    tests: [{{id: exact, input_text: "{text}", expected: "{wrong}"}}]
""",
    )
    passed, message = results_of(path)["all::exact"]
    assert not passed and "output differs from `expected`" in message
    assert (
        "first difference at line 1: expected 'Row 0 of a long listing\\n', got 'row 0 of a long listing\\n'" in message
    )
    assert "more diff lines" in message
    assert len(message.splitlines()) <= DIFF_LINES + 3, len(message.splitlines())


@pytest.mark.parametrize(
    ("expected", "output", "named"),
    [("a\nb", "a\nb\n", "expected 'b', got 'b\\n'"), ("a\r\nb", "a\nb", "expected 'a\\r\\n', got 'a\\n'")],
)
def test_a_difference_in_line_endings_alone_is_named(expected: str, output: str, named: str) -> None:
    from ctxrules.compressors.testing import _diff

    assert named in _diff(expected, output)


def test_a_failed_expected_on_a_long_output_is_diffed_in_bounded_time() -> None:
    """difflib's matcher is quadratic when every other line differs: 40,000 such lines (a pack
    may hold a megabyte of `expected:`) took minutes, and `ctxrules test` seemed to hang. Only the
    lines from the first difference on that the report can show are compared."""
    import subprocess
    import sys

    script = (
        "from ctxrules.compressors.testing import _diff\n"
        "n = 40000\n"
        "want = ''.join(f'line {i}\\n' for i in range(n))\n"
        "got = ''.join(f'line {i}\\n' if i % 2 else f'other {i}\\n' for i in range(n))\n"
        "print(_diff(want, got))\n"
    )
    try:
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("the diff of a long expected output did not finish in 30 s")
    assert proc.returncode == 0, proc.stderr
    assert "first difference at line 1: expected 'line 0\\n', got 'other 0\\n'" in proc.stdout
    assert "-line 0" in proc.stdout and "+other 0" in proc.stdout


def test_the_diff_of_a_late_difference_numbers_the_lines_of_the_whole_text() -> None:
    from ctxrules.compressors.testing import _diff

    same = "".join(f"line {i}\n" for i in range(30000))
    message = _diff(same + "x\n" + same, same + "y\n" + same)
    assert "first difference at line 30001: expected 'x\\n', got 'y\\n'" in message
    assert "@@ -29999,5 +29999,5 @@" in message, message
