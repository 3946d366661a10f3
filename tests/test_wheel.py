"""A plain (non-editable) install finds its bundled packs and schemas.

Builds the wheel from this checkout, installs it into a fresh virtual environment and runs the
installed ``ctxrules`` from a folder outside the repository, so nothing can come from the
source tree by accident. The venv sees the system site-packages for the dependencies
(no network here); ctxrules itself comes only from the wheel. Every optional extra (test,
langchain, litellm-proxy, mcp, redis) is installed there too, so the venv carries an import guard
that makes what only the extras bring unimportable: every core verb must work on a plain
``pip install ctxrules``, and a verb that needs an extra must say which one.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]

if importlib.util.find_spec("hatchling") is None:  # the build backend, from the test extra
    if os.environ.get("CI"):
        pytest.fail("building the wheel needs hatchling, which is not installed", pytrace=False)
    pytest.skip("building the wheel needs hatchling (test extra)", allow_module_level=True)


def _run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CTXRULES_DEBUG")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env, check=False, **kwargs)  # type: ignore[call-overload,no-any-return]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(REPO)]
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [built] = out.glob("ctxrules-*.whl")
    return built


def _wheel_requirements(wheel: Path) -> tuple[list[str], list[str]]:
    """The built wheel's Requires-Dist lines and its extras' names, as pip would read them."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = archive.read(name).decode("utf-8").splitlines()
    field = {"Requires-Dist": [], "Provides-Extra": []}  # type: dict[str, list[str]]
    for line in lines:
        key, _, value = line.partition(": ")
        if key in field:
            field[key].append(value.strip())
    return field["Requires-Dist"], field["Provides-Extra"]


def _installed_closure(requirements: list[str], extras: tuple[str, ...]) -> dict[str, importlib.metadata.Distribution]:
    """Every installed distribution that pip would pull in for these requirements and extras."""
    found: dict[str, importlib.metadata.Distribution] = {}
    todo = [(text, extra) for text in requirements for extra in extras]
    while todo:
        text, extra = todo.pop()
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(requirement.name)
        if name in found:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # an optional dependency this machine lacks (a platform marker, say)
        found[name] = dist
        todo.extend((sub, wanted) for sub in dist.requires or [] for wanted in ("", *requirement.extras))
    return found


def _import_names(dist: importlib.metadata.Distribution) -> set[str]:
    """The top-level names a distribution makes importable."""
    listed = dist.read_text("top_level.txt")
    names = set(listed.split()) if listed else set()
    for file in dist.files or []:
        parts = file.parts
        if not parts or parts[0] in ("..", "__pycache__") or parts[0].endswith((".dist-info", ".egg-info", ".data")):
            continue
        if len(parts) > 1:
            names.add(parts[0])
        elif parts[0].endswith((".py", ".so", ".pyd")):
            names.add(parts[0].split(".")[0])
    return {name for name in names if name.isidentifier()}


def _only_in_extras(wheel: Path) -> tuple[str, ...]:
    """Import names that only the optional extras bring, never the core dependencies."""
    requirements, extras = _wheel_requirements(wheel)
    core = _installed_closure(requirements, ("",))
    everything = _installed_closure(requirements, ("", *extras))
    kept = set().union(*(_import_names(dist) for dist in core.values()))
    extra_only = set().union(*(_import_names(dist) for name, dist in everything.items() if name not in core))
    return tuple(sorted(extra_only - kept - set(sys.stdlib_module_names)))


# Installed as a .pth hook in the venv: from interpreter start-up on, importing what only the
# optional extras bring fails as if it were not installed (the system site-packages hold it).
TEST_EXTRAS = ("pytest", "_pytest", "syrupy", "hypothesis")
GUARD = """\
import sys

class _NoTestExtras:
    refused = frozenset({refused!r})

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.refused:
            raise ModuleNotFoundError(f"No module named {{name!r}} (refused by the test guard)", name=name)
        return None

sys.meta_path.insert(0, _NoTestExtras())
"""


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
    proc = _run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--ignore-installed", str(wheel)]
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    site = Path(proc.stdout.strip())
    refused = sorted({*TEST_EXTRAS, *_only_in_extras(wheel)})
    (site / "_ctxrules_no_test_extras.py").write_text(GUARD.format(refused=refused), encoding="utf-8")
    (site / "_ctxrules_no_test_extras.pth").write_text("import _ctxrules_no_test_extras\n", encoding="utf-8")
    return bindir


def test_the_venv_cannot_import_the_test_extras(installed: Path, tmp_path: Path) -> None:
    # what the optional extras bring, where this machine has it installed
    brought = ("redis", "langchain", "langgraph", "mcp", "fastapi", "uvicorn")
    optional = [name for name in brought if importlib.util.find_spec(name)]
    for name in (*TEST_EXTRAS, *optional):
        proc = _run([str(installed / "python"), "-c", f"import {name}"], cwd=tmp_path)
        assert proc.returncode == 1 and "ModuleNotFoundError" in proc.stderr, (name, proc.stderr)
    proc = _run([str(installed / "python"), "-c", "import yaml, jsonschema, jinja2"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr  # the runtime dependencies are still there


def _cli(installed: Path, cwd: Path, *argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    proc = _run([str(installed / "ctxrules"), *argv], cwd=cwd, input=stdin)
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    return proc


def test_every_verb_works_without_the_test_extras(installed: Path, tmp_path: Path) -> None:
    # A pack reads only inside its own folder: the input goes next to it, as a user's would.
    example = tmp_path / "agent-session.json"
    shutil.copy(REPO / "rules" / "examples" / "agent-session.json", example)
    pack = tmp_path / "pack.yaml"
    pack.write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: mine, version: 1.0.0}\n"
        "extends: [builtin:default]\n"
        "tests:\n  - {id: fits, model: gpt-4o, window: 32000, input: ./agent-session.json, "
        "expect: {fits: true}}\n",
        encoding="utf-8",
    )
    ok = {
        "validate": ["validate", "pack.yaml"],
        "explain": ["explain", "pack.yaml"],
        "assemble": ["assemble", "--pack", "builtin:default", "--mode", "full", "--model", "gpt-4o"],
        "test": ["test", "pack.yaml"],
        "schema": ["schema"],
        "plugins": ["plugins", "--all"],
    }
    for verb, argv in ok.items():
        proc = _cli(installed, tmp_path, *argv)
        assert proc.returncode == 0, (verb, proc.stdout, proc.stderr)
        assert proc.stdout.strip(), verb
    assert "<identity>" in _cli(installed, tmp_path, *ok["assemble"]).stdout
    assert _cli(installed, tmp_path, *ok["test"]).stdout.endswith("1 passed, 0 failed\n")

    # run: the Quick start command, at a window small enough that outputs go to the vault
    proc = _cli(
        installed,
        tmp_path,
        "run",
        "--pack",
        "builtin:default",
        "--model",
        "gpt-4o",
        "--window",
        "16000",
        "--input",
        str(example),
        "--output",
        "out.json",
        "--report",
        "report.json",
        "--session",
        "sess",
        "--explain",
    )
    assert proc.returncode == 0, proc.stderr
    out = (tmp_path / "out.json").read_text(encoding="utf-8")
    ref = re.search(r"vault://([0-9a-f]{12,})", out)
    assert ref, "the 16K run moves an output to the vault"
    proc = _cli(installed, tmp_path, "vault", "get", ref[1], "--session", "sess")
    assert proc.returncode == 0 and proc.stdout, proc.stderr
    assert proc.stdout in example.read_text(encoding="utf-8") or json.dumps(proc.stdout)[1:-1] in example.read_text(
        encoding="utf-8"
    )
    proc = _cli(installed, tmp_path, "report", "report.json")
    assert proc.returncode == 0 and "outputs" in proc.stdout, proc.stderr
    proc = _cli(installed, tmp_path, "report", "report.json", "--html", "report.html")
    assert proc.returncode == 0 and (tmp_path / "report.html").stat().st_size > 1000, proc.stderr

    # compress: filter mode on a captured pytest run, and wrapping a real command
    failures = REPO / "rules" / "compressors" / "fixtures" / "pytest" / "failures.txt"
    proc = _cli(
        installed,
        tmp_path,
        "compress",
        "--command",
        "pytest",
        "--exit-code",
        "1",
        "--input",
        str(failures),
        "--session",
        "sess",
    )
    assert proc.returncode == 0 and "FAILED" in proc.stdout, proc.stderr
    proc = _cli(installed, tmp_path, "compress", "--session", "sess", "--", sys.executable, "-c", "print('hi')")
    assert proc.returncode == 0 and "hi" in proc.stdout, proc.stderr


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
    proc = _run(
        [
            str(installed / "python"),
            "-c",
            "import ctxrules, ctxrules.resources as r; print(ctxrules.__file__); "
            "print(r.rules_dir()); print(r.schema_path('rulepack.v1.schema.json'))",
        ],
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    module, rules, schema = proc.stdout.split("\n")[:3]
    venv_root = installed.parent.resolve()
    for shown in (module, rules, schema):
        assert Path(shown).resolve().is_relative_to(venv_root), shown
        assert not Path(shown).resolve().is_relative_to(REPO), shown
    assert rules.endswith(os.path.join("_data", "rules"))


def test_installed_cli_validates_a_pack_extending_builtin_default(installed: Path, tmp_path: Path) -> None:
    pack = tmp_path / "my-pack.yaml"
    pack.write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\n"
        "metadata: {name: mine, version: 1.0.0}\n"
        "extends: builtin:default@^1\ncontext:\n  thresholds: {full: 0.75}\n",
        encoding="utf-8",
    )
    ctxrules = str(installed / "ctxrules")
    proc = _run([ctxrules, "validate", "my-pack.yaml"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == "1 file checked: 0 error(s), 0 warning(s)\n"

    # and a broken one is reported with its line, through the installed schema
    pack.write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nextends: builtin:default\n"
        "context:\n  treshold: {}\nmetadata: {name: mine, version: 1.0.0}\n",
        encoding="utf-8",
    )
    proc = _run([ctxrules, "validate", "--format", "json", "my-pack.yaml"], cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    [d] = json.loads(proc.stdout)["diagnostics"]
    assert (d["code"], d["file"], d["line"]) == ("CR010", "my-pack.yaml", 5)


def test_installed_cli_explains_builtin_default(installed: Path, tmp_path: Path) -> None:
    proc = _run([str(installed / "ctxrules"), "explain", "builtin:default", "--origins"], cwd=tmp_path)
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
    proc = _run([str(installed / "python"), "-c", "import ctxrules.resources as r; print(r.rules_dir())"], cwd=tmp_path)
    bundled = proc.stdout.strip()
    proc = _run([str(installed / "ctxrules"), "validate", "--strict", bundled], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_verbs_that_need_an_extra_name_it(installed: Path, tmp_path: Path) -> None:
    # the session exists, so what is missing is only the extra
    example = tmp_path / "agent-session.json"
    shutil.copy(REPO / "rules" / "examples" / "agent-session.json", example)
    proc = _cli(
        installed, tmp_path, "run", "--pack", "builtin:default", "--model", "gpt-4o", "--input", str(example),
        "--output", "out.json", "--session", "sess",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    proc = _cli(installed, tmp_path, "mcp", "--session", "sess")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert 'pip install "ctxrules[mcp]"' in proc.stderr, proc.stderr
    proc = _cli(installed, tmp_path, "sessions", "scan", "--store", "redis://localhost:1/0")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert 'pip install "ctxrules[redis]"' in proc.stderr and "CR145" in proc.stderr, proc.stderr
    for module, extra in (("ctxrules.integrations.langchain", "langchain"), ("ctxrules.integrations.mcp", "mcp")):
        proc = _run([str(installed / "python"), "-c", f"import {module}"], cwd=tmp_path)
        shown = proc.stdout + proc.stderr
        assert proc.returncode == 0 or f"ctxrules[{extra}]" in shown, (module, shown)
