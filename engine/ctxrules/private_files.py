"""Files and directories that only ctxrules writes: session directories and what they hold.

A session directory may sit inside a repository someone else controls, so nothing in it is
trusted to be what its name says. Every file is opened without following a symbolic link
(``O_NOFOLLOW``) and checked through its descriptor (``fstat``: a regular file, owned by this
user) before a byte is read or written; every directory below the state root must be a real
directory of this user (the state root itself may be a link, say to a larger disk). A link, a
FIFO or a device where a ctxrules file belongs is refused with :class:`UnsafePathError`, and
nothing is written through it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from ctxrules.errors import CtxrulesError

__all__ = [
    "NOFOLLOW",
    "UnsafePathError",
    "atomic_temporaries",
    "check_can_make",
    "check_dir",
    "check_dirs_below",
    "check_file",
    "ensure_dir",
    "open_private",
    "read_private",
    "write_atomic",
]

NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)
# Opening a FIFO for reading would wait for a writer; the fstat check refuses it after.
_NONBLOCK: Final = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
_LINK_ERRNOS: Final = frozenset(
    e for e in (errno.ELOOP, getattr(errno, "EMLINK", None), getattr(errno, "EFTYPE", None)) if e
)


class UnsafePathError(CtxrulesError):
    """Something that is not ctxrules' own (a link, another user's file, a FIFO) sits where a
    session file or directory belongs."""


def _owner_ok(st: os.stat_result) -> bool:
    geteuid = getattr(os, "geteuid", None)
    return geteuid is None or st.st_uid == geteuid()


def _refuse(path: Path | str, what: str) -> UnsafePathError:
    return UnsafePathError(
        f"refusing to use {path}: {what}; a session directory holds only files ctxrules "
        "created (remove it, or point --session/--state elsewhere)"
    )


def check_dir(path: Path | str) -> bool:
    """Whether ``path`` exists as a real directory of this user; raises when something else
    (a link, a file, another user's directory) is there."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(path, "it is a symbolic link")
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(path, "it is not a directory")
    if not _owner_ok(st):
        raise _refuse(path, "it belongs to another user")
    return True


def check_dirs_below(path: Path, top: Path) -> bool:
    """Whether every directory from below ``top`` down to ``path`` exists as a real directory
    of this user (:func:`check_dir`, raising for a link or anything else there); ``path`` not
    below ``top`` is checked alone. For reading what ctxrules wrote there: a link planted for
    one of them must not hand ctxrules another place's files."""
    chain: list[Path] = []
    probe = path
    while probe != top and probe != probe.parent:
        chain.append(probe)
        probe = probe.parent
    if probe != top:
        chain = [path]
    return all(check_dir(directory) for directory in reversed(chain))


def ensure_dir(path: Path, *, inside: Path | None = None) -> None:
    """Create ``path`` (mode 0700) with every missing directory between ``inside`` (default:
    the parent of ``path``, which may be anything, a link included) and it; every directory
    in that range, existing or new, must be a real directory of this user."""
    path = Path(path)
    top = Path(inside) if inside is not None else path.parent
    chain: list[Path] = []
    probe = path
    while probe != top and probe != probe.parent:
        chain.append(probe)
        probe = probe.parent
    if probe != top:  # ``path`` is not below ``inside``: check just ``path``
        chain = [path]
    try:
        top.mkdir(parents=True, exist_ok=True, mode=0o700)
    except FileExistsError:  # a file where the folder goes: say that, not "File exists"
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(top)) from None
    for directory in reversed(chain):
        if check_dir(directory):
            continue
        with contextlib.suppress(FileExistsError):  # a concurrent writer may win the race
            os.mkdir(directory, 0o700)
        check_dir(directory)


def _read_only_mount(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def check_can_make(path: Path, *, inside: Path | None = None) -> None:
    """Raise what :func:`ensure_dir` would meet making ``path`` (same ``inside``), without
    making anything: a command that must change nothing when it fails checks every folder it
    will write in first. The system's refusal of the path (below a file: ``ENOTDIR``; a name
    too long; a link loop), a file where the folder goes, a missing folder whose parent cannot
    be written in (``EACCES``), and a link or a stranger's folder :func:`check_dir` refuses."""
    path = Path(path)
    probe = path
    while True:
        try:
            st = os.stat(probe)
            break
        except FileNotFoundError:
            if probe == probe.parent:
                return  # nothing of the path exists (a root that is not mounted): mkdir says
            probe = probe.parent
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(probe))
    if probe != path and not os.access(probe, os.W_OK | os.X_OK):
        if _read_only_mount(probe):  # access() fails alike for a mode that refuses and for this
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(probe))
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(probe))
    top = Path(inside) if inside is not None else path.parent
    if top not in path.parents:  # as ensure_dir: ``path`` alone is checked
        if probe == path:
            check_dir(path)
        return
    directory = probe
    while top in directory.parents:  # the folders ensure_dir checks: those below ``inside``
        check_dir(directory)
        directory = directory.parent


def check_file(path: Path | str, fd: int) -> os.stat_result:
    """``fstat`` of an open ``fd``: a regular file of this user, else :class:`UnsafePathError`."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(path, "it is not a regular file")
    if not _owner_ok(st):
        raise _refuse(path, "it belongs to another user")
    return st


def open_private(path: Path | str, flags: int, mode: int = 0o600) -> int:
    """``os.open`` that refuses a link and anything but this user's regular file."""
    try:
        fd = os.open(path, flags | NOFOLLOW | _NONBLOCK | _CLOEXEC, mode)
    except OSError as exc:
        if exc.errno in _LINK_ERRNOS:
            raise _refuse(path, "it is a symbolic link") from None
        raise
    try:
        check_file(path, fd)
        if _NONBLOCK:
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_private(path: Path, *, limit: int | None = None) -> bytes:
    """The bytes of ``path`` (through :func:`open_private`); ``FileNotFoundError`` propagates.
    ``limit``: read at most that many bytes."""
    fd = open_private(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as fh:
        return fh.read() if limit is None else fh.read(limit)


def atomic_temporaries(names: Iterable[str]) -> re.Pattern[str]:
    """The names :func:`write_atomic` gives its temporary files for the files ``names``
    (``.NAME.`` and :func:`tempfile.mkstemp`'s eight random characters, ``.tmp``): what a
    writer killed between creating one and renaming it leaves, for
    :func:`ctxrules.stores.base.remove_stale_spools` to match whole. No other name: a session
    directory may be a folder of the user's, whose own hidden ``.tmp`` files are not ours."""
    alternatives = "|".join(map(re.escape, sorted(names)))
    return re.compile(rf"\.(?:{alternatives})\.[a-z0-9_]{{8}}\.tmp")


def write_atomic(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` so readers see the old or the new file, never a mix: a
    temporary file in the same directory, renamed over it. ``durable`` also survives a power
    loss (fsync); caches that can be rebuilt skip that cost. A link at ``path`` is refused
    (the rename would replace the link, not write through it, but it is not ours to remove).

    A temporary file untouched for an hour is taken for one a killed writer left, and the
    next writer of the session removes it (:func:`atomic_temporaries`); a writer stopped that
    long (``SIGSTOP``, a suspended machine) whose file went finds it gone at the rename and
    writes it once more, so nothing is lost."""
    path = Path(path)
    ensure_dir(path.parent)
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISLNK(os.lstat(path).st_mode):
            raise _refuse(path, "it is a symbolic link")
    for attempt in range(2):
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                if durable:
                    os.fsync(fh.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)
        except FileNotFoundError:
            # Removed as a killed writer's before the rename (see above): once more, unless
            # the directory itself went (the next mkstemp says so).
            if attempt or os.path.lexists(tmp):
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            continue
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return
