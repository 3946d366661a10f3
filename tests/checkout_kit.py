"""A copy of this checkout as a fresh clone would have it: the files git tracks plus new files
that are not ignored (so uncommitted work is what gets tested), committed in a new repository.
Nothing outside the repository comes along: no corpus, no ``../`` neighbours."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def git(cwd: Path, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            "git",
            "-c",
            "user.email=ci@example.com",
            "-c",
            "user.name=ci",
            "-c",
            "init.defaultBranch=main",
            "-c",
            "commit.gpgsign=false",
            *argv,
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )


def snapshot(dest: Path) -> str:
    """Copy the checkout into ``dest`` (a new git repository) and commit it; the commit's sha."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for rel in filter(None, listed):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    for argv in (("init", "-q"), ("add", "-A"), ("commit", "-qm", "snapshot")):
        proc = git(dest, *argv)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return git(dest, "rev-parse", "HEAD").stdout.strip()
