"""Malformed packs: every fixture names the diagnostics it must produce, and nothing else.

Each file under ``tests/fixtures/packs/bad/`` (and each entry file under ``.../extends/``)
starts with one or more header lines::

    # expect: CR010 line 6 col 3
    # expect: CR031 line 4 col 10 file b.yaml
    # expect: warning CR085 line 12 col 17

``warning`` marks a diagnostic that is not an error (the pack stays valid); ``col`` is
optional (given where the column matters); ``file`` names the file the diagnostic
is reported in, relative to the fixture's folder (default: the fixture itself). The test runs
``ctxrules validate --format json`` on the fixture and wants exactly these diagnostics.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxrules.validation.diagnostics import CODES

REPO = Path(__file__).resolve().parents[1]
PACKS = REPO / "tests" / "fixtures" / "packs"
BAD = PACKS / "bad"
EXTENDS = PACKS / "extends"

_EXPECT = re.compile(
    rb"^# expect: (?:(?P<severity>warning) )?(?P<code>CR\d{3}) line (?P<line>\d+)"
    rb"(?: col (?P<col>\d+))?(?: file (?P<file>\S+))?\s*$"
)


@dataclass(frozen=True)
class Expected:
    severity: str
    code: str
    file: str
    line: int
    col: int | None


def expectations(path: Path) -> list[Expected]:
    """The ``# expect:`` header of a fixture (bytes: one fixture is deliberately not UTF-8)."""
    out = []
    for raw in path.read_bytes().splitlines():
        if not raw.startswith(b"# expect"):
            break
        m = _EXPECT.match(raw)
        assert m, f"{path.name}: malformed header line {raw!r}"
        target = path.parent / m["file"].decode() if m["file"] else path
        out.append(
            Expected(
                (m["severity"] or b"error").decode(),
                m["code"].decode(),
                target.relative_to(REPO).as_posix(),
                int(m["line"]),
                int(m["col"]) if m["col"] else None,
            )
        )
    return out


def fixture_files() -> list[Path]:
    bad = sorted(BAD.glob("*.yaml"))
    entries = sorted(p for p in EXTENDS.rglob("*.yaml") if expectations(p))
    return bad + entries


def _id(path: Path) -> str:
    return path.relative_to(PACKS).as_posix()


@pytest.fixture
def in_repo(monkeypatch: pytest.MonkeyPatch) -> Path:
    """Diagnostics show paths relative to the working directory: run from the repo root."""
    monkeypatch.chdir(REPO)
    return REPO


def validate_json(cli, *paths: str) -> tuple[int, dict]:  # type: ignore[no-untyped-def]
    code, out, err = cli("validate", "--format", "json", *paths)
    assert "Traceback" not in err
    return code, json.loads(out)


# -- the fixtures --------------------------------------------------------------------------


def test_there_are_enough_fixtures() -> None:
    bad = list(BAD.glob("*.yaml"))
    assert len(bad) >= 45
    assert all(expectations(p) for p in bad), "every bad fixture states what it expects"


def test_every_code_a_pack_can_trigger_has_a_fixture() -> None:
    covered = {e.code for p in fixture_files() for e in expectations(p)}
    # CR090 (a file that cannot be read) cannot live in a fixture: see test_unreadable_file;
    # nor CR101 (a FIFO, a device, a file over 1 MB): see tests/test_hostile_packs.py.
    # CR140/CR141 are found in requests, not packs (ctxrules.formats): test_formats_anthropic.py.
    # CR145-CR150 are the stores' run-time errors (a store URL, an archive, Redis, its locks, an export's key):
    # tests/test_store_*.py.
    store = {"CR145", "CR146", "CR147", "CR148", "CR149", "CR150"}
    missing = set(CODES) - covered - {"CR090", "CR101", "CR140", "CR141"} - store
    assert not missing, f"no fixture triggers {sorted(missing)}"
    assert covered <= set(CODES), f"fixtures expect unknown codes {sorted(covered - set(CODES))}"


@pytest.mark.parametrize("fixture", fixture_files(), ids=_id)
def test_fixture_gives_exactly_the_expected_diagnostics(  # type: ignore[no-untyped-def]
    cli, in_repo: Path, fixture: Path
) -> None:
    expected = expectations(fixture)
    rel = fixture.relative_to(REPO).as_posix()
    code, doc = validate_json(cli, rel)
    got = doc["diagnostics"]
    summary = [(d["code"], d["file"], d["line"], d["col"], d["message"]) for d in got]
    errors = sum(e.severity == "error" for e in expected)
    assert code == (1 if errors else 0), summary
    assert (doc["errors"], doc["warnings"]) == (errors, len(expected) - errors), summary
    assert len(got) == len(expected), summary
    for exp in expected:
        hits = [
            d
            for d in got
            if (d["severity"], d["code"], d["file"], d["line"]) == (exp.severity, exp.code, exp.file, exp.line)
        ]
        assert hits, f"expected {exp} in {summary}"
        if exp.col is not None:
            assert any(d["col"] == exp.col for d in hits), f"expected column {exp.col} in {summary}"
    for d in got:
        assert d["message"] and "\n" not in d["message"]
        assert d["line"] >= 1 and d["col"] >= 1
        assert d["pointer"] == "" or d["pointer"].startswith("/")
        assert d["code"] in CODES


@pytest.mark.parametrize("fixture", fixture_files(), ids=_id)
def test_fixture_text_output_points_at_the_line(  # type: ignore[no-untyped-def]
    cli, in_repo: Path, fixture: Path
) -> None:
    expected = expectations(fixture)
    code, out, err = cli("validate", fixture.relative_to(REPO).as_posix())
    assert err == ""
    for exp in expected:
        head = f"{exp.file}:{exp.line}:{exp.col or ''}"
        lines = out.splitlines()
        assert any(ln.startswith(head) and f"{exp.severity}[{exp.code}]" in ln for ln in lines), out
    errors = sum(e.severity == "error" for e in expected)
    summary = f"1 file checked: {errors} error(s), {len(expected) - errors} warning(s)"
    assert out.endswith(summary + "\n"), out
    if errors == 0:  # a warning fails only under --strict
        assert code == 0
        assert cli("validate", "--strict", fixture.relative_to(REPO).as_posix())[0] == 1


def test_the_whole_fixture_tree_validates_without_crashing(  # type: ignore[no-untyped-def]
    cli, in_repo: Path
) -> None:
    code, doc = validate_json(cli, "tests/fixtures/packs")
    assert code == 1
    # Folders are searched recursively; YAML that does not even claim to be a pack is skipped.
    assert doc["files_checked"] >= 45
    seen = {d["file"] for d in doc["diagnostics"]}
    assert any(f.startswith("tests/fixtures/packs/extends/cycle/") for f in seen)
    # A parent's problem is reported once, under the parent, even when several children use it.
    keys = [(d["code"], d["file"], d["line"], d["col"], d["message"]) for d in doc["diagnostics"]]
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize("folder", ["cycle", "order-broken-by-child"])
def test_a_problem_found_through_a_child_survives_validating_its_parent_too(  # type: ignore[no-untyped-def]
    cli, in_repo: Path, folder: str
) -> None:
    """Validating parent and child together must report what validating the child alone does."""
    where = EXTENDS / folder
    alone = set()
    for entry in sorted(p for p in where.glob("*.yaml") if expectations(p)):
        _, doc = validate_json(cli, entry.relative_to(REPO).as_posix())
        alone |= {(d["code"], d["file"], d["line"]) for d in doc["diagnostics"]}
    code, doc = validate_json(cli, where.relative_to(REPO).as_posix())
    assert code == 1
    assert {(d["code"], d["file"], d["line"]) for d in doc["diagnostics"]} == alone != set()


# -- the four things a new user gets wrong first -------------------------------------------

NEW_USER = {  # the line is the fixture's own `# expect:` header
    "cr010-typo-in-context.yaml": ("CR010", "did you mean 'thresholds'"),
    "cr001-tab-indentation.yaml": ("CR001", "tab"),
    "cr003-duplicate-nested.yaml": ("CR003", "first defined at line"),
    "cr050-threshold-above-one.yaml": ("CR050", "(0, 1)"),
}


@pytest.mark.parametrize("name", sorted(NEW_USER))
def test_new_user_mistake_gives_one_clear_diagnostic(name: str) -> None:
    """Through the real entry point in a fresh process, as a user runs it."""
    code_expected, words = NEW_USER[name]
    [expected] = expectations(BAD / name)
    line = expected.line
    env = {**os.environ, "PYTHONPATH": str(REPO / "engine")}
    env.pop("CTXRULES_DEBUG", None)
    rel = f"tests/fixtures/packs/bad/{name}"
    proc = subprocess.run(
        [sys.executable, "-m", "ctxrules.cli.main", "validate", rel],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr == ""
    finding = re.compile(r"^\S+:\d+:\d+: (error|warning)\[")
    findings = [ln for ln in proc.stdout.splitlines() if finding.match(ln)]
    assert len(findings) == 1, proc.stdout
    assert findings[0].startswith(f"{rel}:{line}:")
    assert f"error[{code_expected}]" in findings[0]
    assert words in proc.stdout
    # The excerpt shows the offending line with a caret under it.
    assert re.search(rf"^\s*{line} \| ", proc.stdout, re.M)
    assert re.search(r"^\s+\^$", proc.stdout, re.M)


# -- files that cannot be read ----------------------------------------------------------------


def test_unreadable_file(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CR090: tests run as root, where chmod 000 still reads; simulate the OS refusing."""
    pack = tmp_path / "locked.yaml"
    pack.write_text("apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: t, version: 1.0.0}\n", encoding="utf-8")
    from ctxrules.packs import loader

    real_read = loader.read_limited

    def refuse(path: Path, *args: Any, **kwargs: Any) -> bytes:
        if path.name == "locked.yaml":
            raise PermissionError(13, "Permission denied", str(path))
        return real_read(path, *args, **kwargs)

    monkeypatch.setattr(loader, "read_limited", refuse)
    monkeypatch.chdir(tmp_path)
    code, doc = validate_json(cli, "locked.yaml")
    assert code == 1
    [d] = doc["diagnostics"]
    assert (d["code"], d["file"], d["line"]) == ("CR090", "locked.yaml", 1)
    assert "Permission denied" in d["message"]


def test_unreadable_parent_is_reported(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "locked.yaml").write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: t, version: 1.0.0}\n", encoding="utf-8"
    )
    (tmp_path / "child.yaml").write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nextends: ./locked.yaml\nmetadata: {name: t, version: 1.0.0}\n",
        encoding="utf-8",
    )
    from ctxrules.packs import loader

    real_read = loader.read_limited

    def refuse(path: Path, *args: Any, **kwargs: Any) -> bytes:
        if path.name == "locked.yaml":
            raise PermissionError(13, "Permission denied", str(path))
        return real_read(path, *args, **kwargs)

    monkeypatch.setattr(loader, "read_limited", refuse)
    monkeypatch.chdir(tmp_path)
    code, doc = validate_json(cli, "child.yaml")
    assert code == 1
    assert [d["code"] for d in doc["diagnostics"]] == ["CR090"]


def test_loader_reports_a_directory_as_unreadable(tmp_path: Path) -> None:
    from ctxrules.packs.loader import PackLoader

    folder = tmp_path / "x.yaml"
    folder.mkdir()
    doc, diags = PackLoader().read(folder)
    assert doc is None
    assert [d.code for d in diags] == ["CR090"]


def test_extends_naming_a_directory_is_not_found(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "parent.yaml").mkdir()
    (tmp_path / "child.yaml").write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nextends: ./parent.yaml\nmetadata: {name: t, version: 1.0.0}\n",
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path)
    code, doc = validate_json(cli, "child.yaml")
    assert code == 1
    assert [(d["code"], d["line"]) for d in doc["diagnostics"]] == [("CR030", 3)]


# -- no traceback, whatever the pack --------------------------------------------------------

_SOURCES = [(REPO / "rules" / "default.yaml").read_text(encoding="utf-8")] + [
    p.read_bytes().decode("utf-8", errors="replace") for p in sorted(BAD.glob("*.yaml")) if p.stat().st_size < 4000
]
_SNIPPETS = [
    "\t",
    ":",
    "- ",
    "{",
    "}",
    "[",
    "]",
    "'",
    '"',
    "&a ",
    "*a",
    "<<: ",
    "---\n",
    "\n  ",
    "!!",
    "%",
    "@",
    "?",
    "|",
    ">",
    "\\",
    "\x00",
    "null",
    "1.5",
    "-1",
    "id: pairs\n",
    "enabled: false\n",
    "~",
    "2001-01-01",
    ".inf",
    "1e400",
    "extends: builtin:default\n",
    "{% include 'x' %}",
    "{{ y }}",
    "before: pairs\n",
    "with: {a: 1}\n",
]
_EDITS = st.lists(st.tuples(st.floats(0, 1), st.integers(0, 12), st.sampled_from(_SNIPPETS)), min_size=1, max_size=4)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(base=st.sampled_from(_SOURCES), edits=_EDITS)
def test_mangled_packs_never_crash(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path, base: str, edits: list[tuple[float, int, str]]
) -> None:
    text = base
    for where, cut, insert in edits:
        at = int(where * len(text))
        text = text[:at] + insert + text[at + cut :]
    path = tmp_path / "mangled.yaml"
    path.write_text(text, encoding="utf-8")
    code, out, err = cli("validate", "--format", "json", str(path))
    assert code in (0, 1), err
    doc = json.loads(out)
    assert (code == 1) == (doc["errors"] > 0)
    # explain either prints the pack or refuses it with one line
    code, out, err = cli("explain", "--origins", str(path))
    assert code in (0, 1) and "Traceback" not in err
    for d in doc["diagnostics"]:
        assert d["code"] in CODES and d["line"] >= 1 and d["col"] >= 1
