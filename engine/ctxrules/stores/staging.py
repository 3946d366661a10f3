"""A new session directory made all at once (:meth:`FilesystemStore.creating
<ctxrules.stores.filesystem.FilesystemStore.creating>`, for ``sessions import``).

The session is written in a staging folder beside it, ``.<name>.importing-XXXXXXXX`` (mode
0700, hidden: the store lists no dot folder as a session), then renamed to ``<name>`` in one
step. The writer holds the folder's marker file ``.importing`` (a shared lock,
:func:`ctxrules.locks.hold_shared`) until then; a folder of that exact name pattern whose
marker no process holds was left by a writer killed mid-import, and the next staging of the
same session removes it (one without a marker when it is older than
:data:`~ctxrules.stores.base.STALE_SPOOL_S`: a writer killed between making it and its marker).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

from ctxrules.private_files import UnsafePathError, open_private
from ctxrules.stores.base import STALE_SPOOL_S, SessionExists

__all__ = ["MARKER", "is_staging", "staged_dir"]

MARKER: Final = ".importing"
_INFIX: Final = ".importing-"
# Moved last when entries go in one by one: what makes a folder read as a session.
_LAST: Final = ("last_output.jsonl", "state.json")


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile(re.escape(f".{name}{_INFIX}") + r"[a-z0-9_]{8}")  # mkdtemp's eight characters


_ANY: Final = re.compile(r"\..+" + re.escape(_INFIX) + r"[a-z0-9_]{8}")


def is_staging(name: str) -> bool:
    """Whether the folder name ``name`` is a staging folder's (no session's, whatever it holds)."""
    return _ANY.fullmatch(name) is not None


def _remove_abandoned(parent: Path, name: str) -> None:
    """Remove the staging folders of ``name`` in ``parent`` that killed writers left (module
    docstring). Best effort: what cannot be looked at is left as it is."""
    pattern = _pattern(name)
    try:
        with os.scandir(parent) as entries:
            found = [e.path for e in entries if pattern.fullmatch(e.name) and e.is_dir(follow_symlinks=False)]
    except OSError:
        return
    for path in found:
        try:
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
                continue
            fd = open_private(os.path.join(path, MARKER), os.O_RDONLY)
        except FileNotFoundError:
            if time.time() - st.st_mtime > STALE_SPOOL_S:
                shutil.rmtree(path, ignore_errors=True)
            continue
        except (OSError, UnsafePathError):
            continue
        try:
            from ctxrules import locks  # here: the verbs that only read sessions import no lock module

            if not locks.held_elsewhere(fd):
                shutil.rmtree(path, ignore_errors=True)
        finally:
            os.close(fd)


@contextlib.contextmanager
def staged_dir(target: Path, exists: Callable[[], bool]) -> Iterator[Path]:
    """A staging folder for the new session directory ``target``, renamed to it when the block
    ends normally, removed when it raises. ``exists``: whether ``target`` is a session now
    (:class:`SessionExists` then, before the block and at its end)."""
    if exists():
        raise SessionExists(f"{target} exists already")
    if target.is_symlink():
        # The rename would fail naming the staging folder, which the user never named.
        raise NotADirectoryError(errno.ENOTDIR, "a symbolic link, which a session is not written through", str(target))
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    except FileExistsError:  # a file where a folder of the path goes (mkdir's word for it)
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(target)) from None
    _remove_abandoned(parent, target.name)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}{_INFIX}", dir=parent))
    fd = -1
    try:
        fd = open_private(staging / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        from ctxrules import locks

        locks.hold_shared(fd)
        yield staging
        _publish(staging, target, exists)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        if fd >= 0:
            os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(target / MARKER)
    _sync_dir(parent)


def _publish(staging: Path, target: Path, exists: Callable[[], bool]) -> None:
    """Rename ``staging`` to ``target``: in one step when ``target`` is not there or is an
    empty folder; into a folder that holds other files (not a session's), an entry at a time,
    the ones that make it a session last."""
    if exists():
        raise SessionExists(f"{target} exists already")
    try:
        os.rename(staging, target)
        return
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not target.is_dir() or target.is_symlink():
            raise
    names = sorted(os.listdir(staging), key=lambda n: (n in _LAST, _LAST.index(n) if n in _LAST else 0, n))
    for name in names:
        if name == MARKER:
            continue
        if os.path.lexists(target / name):
            if name.endswith(".lock"):
                continue  # a lock file the folder had (a prepare that wrote nothing)
            raise SessionExists(f"{target} exists already (it holds {name})")
        os.rename(staging / name, target / name)
    shutil.rmtree(staging, ignore_errors=True)


def _sync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable (best effort: not every system opens a folder)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
