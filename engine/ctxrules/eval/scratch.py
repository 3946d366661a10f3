"""The folders ``ctxrules eval`` replays sessions in, and the removal of the ones killed runs
left behind.

A replay's folder is ``ctxrules-eval-<pid>-XXXXXXXX`` in a memory-backed folder (``/dev/shm``)
when the machine has a writable one, else in the system's temporary folder. It is removed when
the replay ends (normally, by an exception, or by SIGTERM/Ctrl-C unwinding it:
:mod:`ctxrules.eval.run`); while it is in use its marker file ``.held`` carries a shared lock
(:func:`ctxrules.locks.hold_shared`). A worker killed outright (SIGKILL, the OOM killer) cannot
remove its folder, and in ``/dev/shm`` it would hold memory until the next boot: every eval
run first removes the folders of that exact name pattern, of this user, whose marker no process
holds, and those without a marker whose pid is gone or that are older than
:data:`~ctxrules.stores.base.STALE_SPOOL_S` (folders of earlier versions, named
``ctxrules-eval-XXXXXXXX``).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from ctxrules import locks
from ctxrules.stores.base import STALE_SPOOL_S

__all__ = ["PREFIX", "remove_abandoned", "scratch_dir", "session_folder"]

PREFIX: Final = "ctxrules-eval-"
_MARKER: Final = ".held"
# mkdtemp's eight characters, after the pid of the process that made it (none before it had one)
_NAME: Final = re.compile(re.escape(PREFIX) + r"(?:(\d{1,10})-)?[a-z0-9_]{8}")


def scratch_dir() -> str | None:
    """Where the replayed sessions live: a memory-backed folder (``/dev/shm``) when the machine
    has a writable one, else the system's temporary folder. A replayed session is thrown away;
    fsyncing its vault items (a compacting turn writes its backup) made a long transcript's
    replay wait on the disk for most of its time, and the ms figures vary with the disk's load,
    not the pack."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None


@contextlib.contextmanager
def session_folder() -> Iterator[Path]:
    """A new folder for one replay, held while the block runs and removed when it ends."""
    with tempfile.TemporaryDirectory(prefix=f"{PREFIX}{os.getpid()}-", dir=scratch_dir()) as tmp:
        fd = os.open(os.path.join(tmp, _MARKER), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            locks.hold_shared(fd)
            yield Path(tmp)
        finally:
            os.close(fd)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # another user's: alive
        return False
    return False


def remove_abandoned(directory: str | None = None) -> int:
    """Remove the replay folders in ``directory`` (default: :func:`scratch_dir`) that killed
    runs left (module docstring); returns how many. Best effort: what cannot be looked at is
    left as it is, and a live run's folder is never touched."""
    where = directory or scratch_dir() or tempfile.gettempdir()
    try:
        with os.scandir(where) as entries:
            found = [(e.path, e.name) for e in entries if e.name.startswith(PREFIX)]
    except OSError:
        return 0
    removed = 0
    for path, name in found:
        match = _NAME.fullmatch(name)
        if match is None:
            continue
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            continue
        try:
            fd = os.open(os.path.join(path, _MARKER), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            pid = match.group(1)
            # No marker: made before it had one, or by a run killed right after making it.
            if not (time.time() - st.st_mtime > STALE_SPOOL_S or (pid is not None and _gone(int(pid)))):
                continue
        except OSError:
            continue
        else:
            try:
                if locks.held_elsewhere(fd):
                    continue
            finally:
                os.close(fd)
        shutil.rmtree(path, ignore_errors=True)
        removed += not os.path.lexists(path)
    return removed
