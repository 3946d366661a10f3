"""``ctxrules validate`` prints the same bytes and exits the same way whether the quick schema
check decides or ``jsonschema`` does everything (``ctxrules.validation.quick``; issue 22).

Every fixture pack under ``tests/`` and the built-in rules are validated through the real CLI
entry point twice in one process: as shipped, and with the quick check made to answer "not
sure" everywhere (so each pack file, stage ``with:`` and compressor step goes through
``jsonschema`` as before the quick check existed). Text, JSON and SARIF output and the
exit code must match byte for byte.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ctxrules.cli.main import run
from ctxrules.plugins import default_registry
from ctxrules.validation import quick, schema

REPO = Path(__file__).resolve().parents[1]
FORMATS = ("text", "json", "sarif")


def _targets() -> list[str]:
    files = sorted(
        p.relative_to(REPO).as_posix()
        for p in (REPO / "tests").rglob("*.y*ml")
        if p.suffix in (".yaml", ".yml") and "__snapshots__" not in p.parts
    )
    folders = sorted({Path(f).parent.as_posix() for f in files})
    return [*files, *folders, "rules", "rules/default.yaml"]


TARGETS = _targets()


def _forget() -> None:
    """Drop every compiled quick check and remembered verdict, so the next run compiles anew."""
    schema._quick.cache_clear()
    quick._BY_IDENTITY.clear()
    default_registry().checked.clear()


@contextlib.contextmanager
def _never_sure(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    _forget()
    with monkeypatch.context() as m:
        m.setattr(quick, "compile_schema", lambda *a, **k: lambda _value: None)
        yield
    _forget()


def _outputs(targets: list[str], formats: tuple[str, ...]) -> dict[tuple[str, str], tuple[Any, str, str]]:
    out = {}
    for target in targets:
        for fmt in formats:
            stdout, stderr = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                try:
                    code: Any = run(["validate", "--format", fmt, target])
                except SystemExit as exc:  # argparse
                    code = ("exit", exc.code)
            out[(target, fmt)] = (code, stdout.getvalue(), stderr.getvalue())
    return out


def test_the_fixtures_cover_schema_errors_and_clean_packs() -> None:
    assert len(TARGETS) > 100
    assert "tests/fixtures/packs/bad" in TARGETS


def test_validate_output_is_the_same_with_and_without_the_quick_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("CTXRULES_LOG", raising=False)
    # Each file in JSON (it carries every field of every diagnostic); the folders, which hold
    # them all, in each format that prints more than JSON does (text: source excerpts; SARIF:
    # rule descriptions). GitHub annotations are one line per JSON diagnostic.
    files = [t for t in TARGETS if t.endswith((".yaml", ".yml"))]
    folders = [t for t in TARGETS if t not in files]
    _forget()
    quick_first = {**_outputs(files, ("json",)), **_outputs(folders, FORMATS)}
    with _never_sure(monkeypatch):
        exact = {**_outputs(files, ("json",)), **_outputs(folders, FORMATS)}
    differ = [k for k in exact if exact[k] != quick_first[k]]
    assert differ == [], f"{len(differ)} outputs differ, first: {differ[0]}"
    # The comparison saw errors of every kind the schema reports, and clean packs.
    codes = {
        c for (code, text, _) in exact.values() for c in ("CR010", "CR011", "CR012", "CR013", "CR061") if c in text
    }
    assert codes == {"CR010", "CR011", "CR012", "CR013", "CR061"}
    assert any(code == 0 for code, _, _ in exact.values())
