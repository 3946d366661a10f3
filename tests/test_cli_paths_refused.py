"""A path the system refuses (a name longer than the file system takes, a session "directory"
below a file, a symbolic link loop) is one line naming it and exit 2, in every verb that meets
it: the user's path, not a bug of ctxrules ("internal error ... this is a bug" said otherwise)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_kit import ENGINE, cli

LONG = "a" * 300  # over NAME_MAX (255) of every common file system: ENAMETOOLONG


def _history(tmp_path: Path) -> str:
    source = tmp_path / "h.json"
    source.write_text(json.dumps([{"role": "user", "content": "hi"}]), encoding="utf-8")
    return str(source)


def _verbs(tmp_path: Path, session: str) -> dict[str, list[str]]:
    """Verbs that open ``session`` (or read the path ``session``)."""
    model = ["--model", "gpt-4o"]
    return {
        "run": ["run", "--pack", "builtin:default", *model, "--input", _history(tmp_path), "--session", session],
        "vault get": ["vault", "get", "0123456789abcdef", "--session", session],
        "usage show": ["usage", "show", "--session", session],
        "sessions export": ["sessions", "export", session, "--to", "-", "--state", str(tmp_path / "st")],
        "mcp": ["mcp", "--session", session],
        "validate": ["validate", session],
        "eval": ["eval", "--pack", "builtin:default", *model, session],
    }


def _one_line_naming(proc: object, shown: str) -> None:
    stderr = proc.stderr  # type: ignore[attr-defined]
    assert proc.returncode == 2, (proc.returncode, stderr)  # type: ignore[attr-defined]
    assert "internal error" not in stderr and "Traceback" not in stderr, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ctxrules: error: ") and shown in lines[0], stderr


@pytest.mark.parametrize("verb", ["run", "vault get", "usage show", "sessions export", "mcp", "validate", "eval"])
def test_a_name_too_long_for_the_file_system_is_one_line(tmp_path: Path, verb: str) -> None:
    proc = cli(*_verbs(tmp_path, LONG)[verb], cwd=tmp_path, stdin=subprocess.DEVNULL)
    _one_line_naming(proc, LONG)
    assert os.strerror(36) in proc.stderr  # ENAMETOOLONG: says why, not only where


def test_a_session_below_a_file_is_one_line(tmp_path: Path) -> None:
    proc = cli(*_verbs(tmp_path, "h.json/s")["run"], cwd=tmp_path)
    _one_line_naming(proc, "h.json/s")
    assert not (tmp_path / "h.json").is_dir()


@pytest.mark.parametrize("verb", ["run", "usage show", "sessions export"])
def test_a_session_that_is_a_link_loop_is_one_line(tmp_path: Path, verb: str) -> None:
    (tmp_path / "loop1").symlink_to("loop2")
    (tmp_path / "loop2").symlink_to("loop1")
    proc = cli(*_verbs(tmp_path, "loop1")[verb], cwd=tmp_path)
    _one_line_naming(proc, "loop1")
    assert "symbolic links" in proc.stderr


def test_a_byte_that_is_not_utf8_is_shown_as_that_byte(tmp_path: Path) -> None:
    session = os.fsdecode(b"\xff/") + LONG
    proc = cli(*_verbs(tmp_path, session)["run"], cwd=tmp_path)
    _one_line_naming(proc, "\\xff/" + LONG)


@pytest.mark.parametrize("session", ["h.json/s", LONG])
def test_import_names_the_session_path_not_the_archive(tmp_path: Path, session: str) -> None:
    """`sessions import A --session h.json/s` said `A: cannot read: Not a directory`: the
    archive was fine, the session path was not."""
    made = cli(*_verbs(tmp_path, str(tmp_path / "s1"))["run"], cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    exported = cli("sessions", "export", str(tmp_path / "s1"), "--to", "a.ctxs", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    proc = cli("sessions", "import", "a.ctxs", "--session", session, cwd=tmp_path)
    _one_line_naming(proc, session)
    assert "a.ctxs" not in proc.stderr and "cannot read" not in proc.stderr


def test_a_vault_below_a_file_says_not_a_directory(tmp_path: Path) -> None:
    """`compress --session h.json/s` with an output that spills to the vault said `[Errno 17]
    File exists: 'h.json'` (mkdir's word for a file in the way). Filter mode, like proxy mode,
    then prints what it read unchanged (standard input is not lost) and warns, exit 0."""
    _history(tmp_path)
    big = b"".join(b"line %d\n" % i for i in range(1_500_000))  # past the 8 MiB held in memory
    argv = ["compress", "--session", "h.json/s", "--command", "seq", "--input", "-"]
    proc = subprocess.run(
        [sys.executable, "-m", "ctxrules.cli.main", *argv],
        input=big, capture_output=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": ENGINE}, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (
        proc.stderr.decode() == "ctxrules: warning: output not compressed: "
        "cannot write to the vault at h.json/s/vault: h.json: Not a directory\n"
    )
    assert proc.stdout == big
