"""A folder ctxrules must write in that is on a read-only mount is named as such ("Read-only
file system"), not as "Permission denied", which sends a user (often root) to look at modes."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from cli_kit import cli

from ctxrules import private_files


def test_check_can_make_tells_a_read_only_mount_from_a_refusing_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(private_files.os, "access", lambda *a, **k: False)
    for read_only, code in ((True, errno.EROFS), (False, errno.EACCES)):
        flags = os.ST_RDONLY if read_only else 0
        monkeypatch.setattr(private_files.os, "statvfs", lambda p, f=flags: SimpleNamespace(f_flag=f))
        with pytest.raises(OSError) as caught:
            private_files.check_can_make(tmp_path / "ledger" / "days")
        assert caught.value.errno == code and caught.value.filename == str(tmp_path)


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path/ro``: a read-only bind mount of ``tmp_path/src`` (needs root and mount)."""
    src, ro = tmp_path / "src", tmp_path / "ro"
    (src / "s1").mkdir(parents=True)
    ro.mkdir()
    mount = shutil.which("mount")
    if mount is None or os.geteuid() != 0:
        pytest.skip("needs root and mount(8) to make a read-only bind mount")
    done: list[Any] = []
    try:
        for argv in ([mount, "--bind", str(src), str(ro)], [mount, "-o", "remount,bind,ro", str(ro)]):
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
            if proc.returncode != 0:
                pytest.skip(f"cannot make a read-only bind mount here: {proc.stderr.strip()}")
            done.append(argv)
        yield ro
    finally:
        if done:
            subprocess.run(["umount", str(ro)], capture_output=True, timeout=30)


def test_usage_add_on_a_read_only_state_root_says_so(read_only: Path) -> None:
    proc = cli(
        "usage", "add", "--model", "gpt-4o", "--prompt", "10", "--completion", "5",
        "--state", str(read_only), "--session", str(read_only / "s1"),
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"ctxrules: error: {read_only}: Read-only file system"
