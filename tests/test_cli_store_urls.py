"""A store named badly (`--store URL`, `CTXRULES_STORE`, `CTXRULES_STATE`) is a usage error
naming it (CR145; `compress -- CMD` exits 125 and does not run CMD), never an internal error,
and never the current directory taken for a state root."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cli_kit import cli


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("redis://[::1", "does not parse"),  # an unclosed IPv6 address: ValueError from urlsplit
        ("redis://user:secret@[::1", "does not parse"),
        ("file://%00", "names no folder"),  # a NUL byte: ValueError at the first open
        ("file://", "names no folder"),  # file://$UNSET: was the current directory
        ("file://%20", "names no folder"),
    ],
)
def test_a_store_url_that_names_nothing_usable_is_cr145(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str, words: str
) -> None:
    _no_ctxrules_env(monkeypatch)
    monkeypatch.setenv("CTXRULES_STORE", url)
    for argv, code in ((["usage", "show", "--store", url], 2), (["compress", "--", "touch", "ran"], 125)):
        proc = cli(*argv, cwd=tmp_path)
        assert proc.returncode == code, proc.stderr
        assert "internal error" not in proc.stderr and "[CR145]" in proc.stderr and words in proc.stderr, proc.stderr
        assert "secret" not in proc.stderr
    assert not list(tmp_path.iterdir()), "something was written (or CMD ran) in the current directory"


def test_an_empty_ctxrules_state_is_the_default_root_not_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`CTXRULES_STATE=$UNSET ctxrules run ...` made ./default a session, its key in the
    current directory; empty counts as unset, as for CTXRULES_STORE and CTXRULES_LOG."""
    (tmp_path / "in.json").write_text(json.dumps([{"role": "user", "content": "hi"}]))
    _no_ctxrules_env(monkeypatch)
    monkeypatch.setenv("CTXRULES_STATE", "")
    proc = cli(
        "run", "--pack", "builtin:default", "--model", "gpt-4o", "--input", "in.json", "--output", "o.json",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / ".ctxrules" / "default" / "state.json").is_file()
    assert not (tmp_path / "default").exists()


def _no_ctxrules_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [k for k in os.environ if k.startswith("CTXRULES_") and k != "CTXRULES_CORPUS"]:
        monkeypatch.delenv(name)


def test_a_password_the_url_parser_misreads_is_not_shown() -> None:
    # A `/` in the password makes the rest a path and the password's start a port: the message
    # quoted both.
    proc = cli("usage", "show", "--store", "redis://user:se/cret@[::1")
    assert proc.returncode == 2, proc.stderr
    assert "se/cret" not in proc.stderr and "'se'" not in proc.stderr and "cret" not in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
