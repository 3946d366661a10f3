"""A vault item written in pieces by a writer killed mid-write (``kill -9``, the OOM killer
during ``compress`` of a huge output) leaves its spool file; the next write, in any process,
must remove it once untouched for an hour, and keep a live writer's spool however long idle.
The same check for every store that spools (the filesystem vault, the Redis store's files in
the temporary directory)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

# argv: STORE SESSION KIND; "killed" dies with its spool open, "live" prints the spool's path,
# waits for a line on stdin, then commits and prints the item's id.
WRITER = (
    "import os, signal, sys\nfrom ctxrules.stores import open_store\nfrom ctxrules.vault import Vault\n"
    "writer = Vault.of(open_store(sys.argv[1]), sys.argv[2]).open_writer()\n"
    "writer.write(sys.argv[3].encode() * 100_000)\n"
    "if sys.argv[3] == 'killed':\n    os.kill(os.getpid(), signal.SIGKILL)\n"
    "print(writer.path, flush=True)\nsys.stdin.readline()\nprint(writer.commit(), flush=True)\n"
)
LIVE_ITEM = b"live" * 100_000  # what the live writer commits


def stale_spool_goes_live_one_stays(
    *,
    store: str,
    session: str,
    spools: Callable[[], list[Path]],
    env: dict[str, str],
    cwd: Path,
    compress: Sequence[str],
    output: bytes,
    stored: Callable[[str], bool],
) -> str:
    """Leave a killed writer's spool and a live writer's, both an hour old; run
    ``ctxrules compress ... --input out.txt`` with ``compress`` (its session and store
    options), whose output ``output`` goes to the vault (``stored(sha256)`` says it did):
    the killed writer's spool must be gone and the live one's left. Returns the id the live
    writer then commits."""
    import hashlib
    import os

    argv = [sys.executable, "-c", WRITER, store, session]
    killed = subprocess.run([*argv, "killed"], env=env, capture_output=True, timeout=120, check=False)
    assert killed.returncode == -9, killed.stderr
    [left] = spools()
    live = subprocess.Popen([*argv, "live"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert live.stdout is not None and live.stdin is not None
        spool = Path(live.stdout.readline().strip())
        an_hour_ago = time.time() - 3700
        for path in (left, spool):
            os.utime(path, (an_hour_ago, an_hour_ago))
        (cwd / "out.txt").write_bytes(output)
        proc = subprocess.run(
            [sys.executable, "-m", "ctxrules.cli.main", "compress", "--always", "--command", "pytest",
             "--input", "out.txt", *compress],
            cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert stored(hashlib.sha256(output).hexdigest())  # it wrote
        assert not left.exists()
        assert spools() == [spool]
        live.stdin.write("\n")
        live.stdin.flush()
        return live.stdout.readline().strip()
    finally:
        live.kill()
        live.communicate()
