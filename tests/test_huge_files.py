"""Files of gigabytes where ctxrules reads (a vault item, a session archive), whole or damaged:
read a block at a time, damage refused in one line with exit 2 before anything is printed or
written, and the peak memory of the process far below the file's size.

The huge files are sparse (``os.truncate``): gigabytes claimed, no disk used, cheap to read.
The peak memory is the child's ``ru_maxrss``, taken by a wrapper process of its own so that
no other child of the test run counts.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from cli_kit import ENGINE

from ctxrules.stores.filesystem import FilesystemStore
from ctxrules.vault import Vault

MB = 1 << 20
PEAK_BOUND = 200 * MB

# Runs the command given and prints the peak resident size of its process, in bytes (Linux
# counts ru_maxrss in KiB, macOS in bytes).
_PEAK = (
    "import resource, subprocess, sys\n"
    "proc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)\n"
    "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
    "print(proc.returncode, peak * (1 if sys.platform == 'darwin' else 1024))\n"
    "sys.stdout.write(proc.stderr)\n"
)


def ctxrules_peak(*argv: str, cwd: Path) -> tuple[int, int, str]:
    """(exit code, peak RSS in bytes, stderr) of ``ctxrules ARGV``, its stdout discarded."""
    proc = subprocess.run(
        [sys.executable, "-c", _PEAK, sys.executable, "-m", "ctxrules.cli.main", *argv],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": ENGINE},
        capture_output=True,
        text=True,
        timeout=600,
    )
    first, _, stderr = proc.stdout.partition("\n")
    code, peak = first.split()
    return int(code), int(peak), stderr


def _zeros_id(size: int) -> str:
    digest, block = hashlib.sha256(), bytes(MB)
    for _ in range(size // MB):
        digest.update(block)
    return digest.hexdigest()


def test_vault_get_refuses_a_damaged_item_of_gigabytes_in_bounded_memory(tmp_path: Path) -> None:
    """An item damaged to claim 4 GiB (a sparse file) was read whole before its digest was
    checked: gigabytes of memory, or the OOM killer. It is checked a block at a time now."""
    session = tmp_path / "state" / "s"
    item = Vault.of(FilesystemStore(tmp_path / "state"), str(session)).put_text("line\n" * 1000)
    path = session / "vault" / item[:2] / item
    os.truncate(path, 4 << 30)
    for ident in (item, f"vault://{item[:12]}#L2-L3"):
        code, peak, stderr = ctxrules_peak("vault", "get", ident, "--session", str(session), cwd=tmp_path)
        assert code == 2, stderr
        assert stderr.startswith(f"ctxrules: error: vault entry {item} is corrupt: its content hashes to ")
        assert stderr.endswith(f" ({path})\n") and stderr.count("\n") == 1
        assert peak < PEAK_BOUND, f"peak RSS {peak / MB:.0f} MB"


def test_vault_get_prints_an_item_of_a_gigabyte_in_bounded_memory(tmp_path: Path) -> None:
    """An intact item larger than memory allows (``compress`` of a huge output) was held whole
    by ``vault get``: now it is copied a block at a time, a line range too."""
    session = tmp_path / "state" / "s"
    vault = Vault.of(FilesystemStore(tmp_path / "state"), str(session))
    size = 1 << 30
    item = _zeros_id(size)
    writer = vault.open_writer()
    writer.write(b"")
    writer.discard()
    (session / "vault" / item[:2]).mkdir(mode=0o700)
    path = session / "vault" / item[:2] / item
    path.touch(mode=0o600)
    os.truncate(path, size)  # a gigabyte of zeros, named by its sha256: an intact item
    code, peak, stderr = ctxrules_peak("vault", "get", item[:12], "--session", str(session), cwd=tmp_path)
    assert (code, stderr) == (0, "")
    assert peak < PEAK_BOUND, f"peak RSS {peak / MB:.0f} MB"
    code, peak, stderr = ctxrules_peak("vault", "get", item, "--lines", "1:1", "--session", str(session), cwd=tmp_path)
    assert (code, stderr) == (0, "")
    assert peak < PEAK_BOUND, f"peak RSS {peak / MB:.0f} MB"


def test_reading_a_damaged_item_of_gigabytes_through_the_api_is_bounded_too(tmp_path: Path) -> None:
    """``Vault.get`` (recall, ``sessions export``) checks an item larger than 64 MiB a block
    at a time before reading it whole: a damaged one claiming 4 GiB is refused, not held."""
    session = tmp_path / "state" / "s"
    item = Vault.of(FilesystemStore(tmp_path / "state"), str(session)).put_text("line\n" * 1000)
    os.truncate(session / "vault" / item[:2] / item, 4 << 30)
    probe = (
        "import sys\nfrom ctxrules.vault import Vault, VaultError\n"
        "try:\n    Vault.for_session(sys.argv[1]).get(sys.argv[2])\n"
        "except VaultError as exc:\n    sys.exit(str(exc))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", _PEAK, sys.executable, "-c", probe, str(session), item],
        env={**os.environ, "PYTHONPATH": ENGINE},
        capture_output=True,
        text=True,
        timeout=600,
    )
    first, _, stderr = proc.stdout.partition("\n")
    code, peak = map(int, first.split())
    assert code == 1 and f"vault entry {item} is corrupt" in stderr, stderr
    assert peak < PEAK_BOUND, f"peak RSS {peak / MB:.0f} MB"
