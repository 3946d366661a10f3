"""A plain (non-editable) install finds its bundled packs and schemas.

Builds the wheel from this checkout, installs it into a fresh virtual environment and runs the
installed ``ctxrules`` from a folder outside the repository, so nothing can come from the
source tree by accident. The venv sees the system site-packages for the dependencies
(no network here); ctxrules itself comes only from the wheel.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

if importlib.util.find_spec("hatchling") is None:  # the build backend, from the test extra
    if os.environ.get("CI"):
        pytest.fail("building the wheel needs hatchling, which is not installed", pytrace=False)
    pytest.skip("building the wheel needs hatchling (test extra)", allow_module_level=True)


def _run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CTXRULES_DEBUG")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env,
                          check=False, **kwargs)  # type: ignore[call-overload,no-any-return]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                 "-q", "-w", str(out), str(REPO)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [built] = out.glob("ctxrules-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The venv's bin/ folder, with the wheel installed."""
    root = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(root)
    bindir = root / ("Scripts" if os.name == "nt" else "bin")
    python = bindir / "python"
    # pip from the system site-packages, installing into the venv
    # --ignore-installed: CI has installed ctxrules in the base interpreter, which this venv
    # sees (system site-packages, for the dependencies); the wheel must still go into the venv.
    proc = _run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--ignore-installed",
                 str(wheel)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return bindir


def test_wheel_bundles_rules_and_schemas(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "ctxrules/_data/rules/default.yaml" in names
    assert "ctxrules/_data/schemas/rulepack.v1.schema.json" in names
    assert "ctxrules/cli/main.py" in names
    # every built-in pack and schema of the checkout is in the wheel
    for path in (REPO / "rules").rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            assert f"ctxrules/_data/rules/{path.relative_to(REPO / 'rules').as_posix()}" in names
    for path in (REPO / "schemas").glob("*.json"):
        assert f"ctxrules/_data/schemas/{path.name}" in names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "ctxrules = ctxrules.cli.main:main" in text


def test_installed_ctxrules_comes_from_the_venv(installed: Path, tmp_path: Path) -> None:
    proc = _run([str(installed / "python"), "-c",
                 "import ctxrules, ctxrules.resources as r; print(ctxrules.__file__); "
                 "print(r.rules_dir()); print(r.schema_path('rulepack.v1.schema.json'))"],
                cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    module, rules, schema = proc.stdout.split("\n")[:3]
    venv_root = installed.parent.resolve()
    for shown in (module, rules, schema):
        assert Path(shown).resolve().is_relative_to(venv_root), shown
        assert not Path(shown).resolve().is_relative_to(REPO), shown
    assert rules.endswith(os.path.join("_data", "rules"))


def test_installed_cli_validates_a_pack_extending_builtin_default(installed: Path,
                                                                  tmp_path: Path) -> None:
    pack = tmp_path / "my-pack.yaml"
    pack.write_text("apiVersion: ctxrules/v1\nkind: RulePack\n"
                    "metadata: {name: mine, version: 1.0.0}\n"
                    "extends: builtin:default@^1\ncontext:\n  thresholds: {full: 0.75}\n",
                    encoding="utf-8")
    ctxrules = str(installed / "ctxrules")
    proc = _run([ctxrules, "validate", "my-pack.yaml"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == "1 file checked: 0 error(s), 0 warning(s)\n"

    # and a broken one is reported with its line, through the installed schema
    pack.write_text("apiVersion: ctxrules/v1\nkind: RulePack\nextends: builtin:default\n"
                    "context:\n  treshold: {}\nmetadata: {name: mine, version: 1.0.0}\n", encoding="utf-8")
    proc = _run([ctxrules, "validate", "--format", "json", "my-pack.yaml"], cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    [d] = json.loads(proc.stdout)["diagnostics"]
    assert (d["code"], d["file"], d["line"]) == ("CR010", "my-pack.yaml", 5)


def test_installed_cli_explains_builtin_default(installed: Path, tmp_path: Path) -> None:
    proc = _run([str(installed / "ctxrules"), "explain", "builtin:default", "--origins"],
                cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith("# pack: default (files applied: builtin:")
    assert "builtin:default" in first
    assert "normalize.tool_pairs" in proc.stdout
    assert "# builtin:default:" in proc.stdout, "origins name the bundled pack, not a wheel path"


def test_installed_cli_schema_and_builtin_rules(installed: Path, tmp_path: Path) -> None:
    proc = _run([str(installed / "ctxrules"), "schema"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["$id"].endswith("rulepack.v1.schema.json")
    proc = _run([str(installed / "python"), "-c",
                 "import ctxrules.resources as r; print(r.rules_dir())"], cwd=tmp_path)
    bundled = proc.stdout.strip()
    proc = _run([str(installed / "ctxrules"), "validate", "--strict", bundled], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
