"""Standard output takes every character a verb prints, whatever ``PYTHONIOENCODING`` or the
locale say: ``PYTHONIOENCODING=ascii`` made ``run`` and ``explain`` end in ``internal error:
UnicodeEncodeError`` at the first non-ASCII character. A pipe or a file gets UTF-8 (the bytes
``--output FILE`` holds); a terminal keeps its encoding, a character it cannot show escaped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_kit import ENGINE

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "héllo wörld ☃"}]


def cli(*args: str, encoding: str | None = None, **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    """``ctxrules ARGS`` with ``PYTHONIOENCODING=encoding``; stdout and stderr piped unless given."""
    env = {**os.environ, "PYTHONPATH": ENGINE}
    if encoding is not None:
        env["PYTHONIOENCODING"] = encoding
    kwargs.setdefault("stdout", subprocess.PIPE)
    kwargs.setdefault("stderr", subprocess.PIPE)
    return subprocess.run([sys.executable, "-m", "ctxrules.cli.main", *args], env=env, timeout=300, **kwargs)


def _run(tmp_path: Path, *extra: str, **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    source = tmp_path / "h.json"
    source.write_text(json.dumps(MESSAGES, ensure_ascii=False), encoding="utf-8")
    args = ["run", "--pack", "builtin:default", "--model", "gpt-4o", "--input", str(source)]
    return cli(*args, "--session", str(tmp_path / "s"), *extra, **kwargs)


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_run_to_a_pipe_writes_utf8_whatever_the_io_encoding(tmp_path: Path, encoding: str) -> None:
    proc = _run(tmp_path, encoding=encoding)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.decode("utf-8"))[1]["content"] == "héllo wörld ☃"
    kept = _run(tmp_path, "--output", str(tmp_path / "out.json"), encoding=encoding)
    assert kept.returncode == 0 and (tmp_path / "out.json").read_bytes() == proc.stdout


def test_explain_to_a_pipe_with_an_ascii_io_encoding(tmp_path: Path) -> None:
    plain = cli("explain", "builtin:default", encoding="utf-8")
    ascii_ = cli("explain", "builtin:default", encoding="ascii")
    assert ascii_.returncode == 0, ascii_.stderr
    assert not plain.stdout.isascii() and ascii_.stdout == plain.stdout  # the pack has non-ASCII text


def test_a_terminal_that_cannot_show_a_character_gets_its_escape(tmp_path: Path) -> None:
    leader, follower = os.openpty()
    try:
        proc = _run(tmp_path, "--quiet", encoding="ascii", stdout=follower)
        os.close(follower)
        shown = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the terminal's other end is closed and everything is read
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(leader)
    assert proc.returncode == 0, proc.stderr
    assert b"h\\xe9llo w\\xf6rld \\u2603" in shown
