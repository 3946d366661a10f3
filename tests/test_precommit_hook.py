"""The shipped ``.pre-commit-hooks.yaml``, run by the real ``pre-commit`` tool in a fresh git
repository that holds what a real one does: a good pack, a bad pack, a GitHub workflow, a
docker-compose file and a dependabot file. The bad pack blocks the commit with its
diagnostics; nothing else is reported.

pre-commit builds the hook's environment from the package index (it pip-installs this
repository with its dependencies); the test skips, saying so, when the index cannot be reached.
The hook repository is a snapshot of this checkout (``checkout_kit``), so what is tested is
the working tree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from checkout_kit import git, snapshot

if shutil.which("git") is None:
    pytest.skip("needs git", allow_module_level=True)
if shutil.which("pre-commit") is None:
    pytest.skip("needs the pre-commit tool (test extra)", allow_module_level=True)

GOOD = "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: good, version: 1.0.0}\nextends: [builtin:default]\n"
BAD = (
    "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: bad, version: 1.0.0}\nextends: [builtin:default]\n"
    "context:\n  treshold: {full: 0.75}\n"
)
WORKFLOW = "name: ci\non: [push]\njobs:\n  test:\n    runs-on: ubuntu-latest\n    steps:\n      - run: make test\n"
COMPOSE = "services:\n  web:\n    image: nginx:1.27\n    ports: ['8080:80']\n"
DEPENDABOT = "version: 2\nupdates:\n  - package-ecosystem: pip\n    directory: /\n    schedule: {interval: weekly}\n"


def _index_reachable(tmp: Path) -> bool:
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(tmp), "pyyaml"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    return proc.returncode == 0


def test_the_hook_blocks_the_bad_pack_and_reports_nothing_else(tmp_path: Path) -> None:
    if not _index_reachable(tmp_path / "probe"):
        pytest.skip("pre-commit builds the hook environment from the package index, which cannot be reached")
    hook_repo, work = tmp_path / "hook", tmp_path / "work"
    hook_repo.mkdir()
    sha = snapshot(hook_repo)
    files = {
        ".pre-commit-config.yaml": f"repos:\n  - repo: {hook_repo}\n    rev: {sha}\n    hooks:\n"
        "      - id: ctxrules-validate\n",
        "packs/good.yaml": GOOD,
        "packs/bad.yaml": BAD,
        # Top-level names pre-commit passes as they are: read as options, one was a usage error
        # for the whole batch and the other an option taken silently (the pack never checked).
        "-dash.yaml": BAD,
        "--search-path=hidden.yaml": BAD,
        ".github/workflows/ci.yml": WORKFLOW,
        "docker-compose.yml": COMPOSE,
        ".github/dependabot.yml": DEPENDABOT,
    }
    for rel, text in files.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text, encoding="utf-8")
    assert git(work, "init", "-q").returncode == 0
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CTXRULES_DEBUG")}
    env["PRE_COMMIT_HOME"] = str(tmp_path / "pre-commit-home")
    env["PRE_COMMIT_COLOR"] = "never"
    proc = subprocess.run(
        ["pre-commit", "install"], cwd=work, env=env, capture_output=True, text=True, check=False, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert git(work, "add", "-A").returncode == 0

    proc = subprocess.run(
        ["git", "-c", "user.email=ci@example.com", "-c", "user.name=ci", "commit", "-m", "add"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert git(work, "rev-parse", "--verify", "HEAD").returncode != 0, "the commit was blocked"
    findings = [ln for ln in out.splitlines() if ": error[" in ln or ": warning[" in ln]
    assert sorted(findings) == sorted(
        f"{name}:6:3: error[CR010] unknown key 'treshold' in /context"
        for name in ("packs/bad.yaml", "-dash.yaml", "--search-path=hidden.yaml")
    ), out
    assert "help: did you mean 'thresholds'?" in out
    # pre-commit may split the files over several hook processes: add up their summaries
    checked = skipped = 0
    for ln in out.splitlines():
        if " checked" in ln and "error(s)" in ln:
            head = ln.split(":")[0].replace(",", "").split()
            checked += int(head[0])
            skipped += int(head[head.index("skipped") - 1]) if "skipped" in head else 0
    assert (checked, skipped) == (4, 4), out  # the four packs; the four other YAML files

    # fixed, the same commit goes through
    for name in ("packs/bad.yaml", "-dash.yaml", "--search-path=hidden.yaml"):
        (work / name).write_text(BAD.replace("treshold", "thresholds"), encoding="utf-8")
    assert git(work, "add", "-A").returncode == 0
    proc = subprocess.run(
        ["git", "-c", "user.email=ci@example.com", "-c", "user.name=ci", "commit", "-m", "add"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
