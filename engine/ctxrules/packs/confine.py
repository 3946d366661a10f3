"""Where a pack may read from, and how its files are read.

A pack is review material, not trusted code: a pack from a cloned repository must not make
``ctxrules assemble`` print ``/proc/self/environ`` into a prompt. So every path a pack names
(``extends:``, a template ``file:``, ``tests[].input``, a compressor test's ``input``) is
resolved with symlinks followed, then must lie inside one of the load's *roots*:

- the folder of the pack the caller named (``builtin:`` packs: the package's rules folder),
  or the folder the caller named to ``ctxrules validate``;
- extra folders only the caller can add: ``Engine.load(ref, search_path=[...])``, the CLI's
  ``--search-path DIR``. A pack cannot widen its own roots.

Anything else is a CR100 error that names the path and the roots, never what the file holds
(it is not opened). Files are opened without blocking (a FIFO named as a pack would wait for
a writer forever) and must be regular files no larger than :data:`MAX_PACK_BYTES` (CR101).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = [
    "MAX_INPUT_BYTES",
    "MAX_PACK_BYTES",
    "FileRefused",
    "OutsideRoots",
    "check_inside",
    "file_kind",
    "make_roots",
    "read_limited",
    "read_pack_text",
]

MAX_PACK_BYTES = 1_000_000
"""Largest pack file or template file read (1 MB; the biggest built-in pack is ~20 KB)."""

MAX_INPUT_BYTES = 256 * 1024 * 1024
"""Largest test input a pack names (a message list or a captured output): the same order as
the limit on message files, since a test input is one."""


class OutsideRoots(Exception):
    """A path a pack names leads outside every root of the load (CR100)."""


class FileRefused(Exception):
    """A file that is not read: not a regular file, or over the size limit (CR101)."""


def make_roots(first: Iterable[Path], search_path: Sequence[str | os.PathLike[str]] = ()) -> tuple[Path, ...]:
    """The roots of one load, resolved (duplicates dropped, order kept)."""
    from ctxrules.resources import rules_dir

    out: list[Path] = []
    for p in [*first, *(Path(s) for s in search_path), rules_dir()]:
        try:
            real = Path(p).resolve()
        except (OSError, ValueError):
            continue
        if real not in out:
            out.append(real)
    return tuple(out)


def _shown(roots: Sequence[Path]) -> str:
    from ctxrules.resources import rules_dir

    builtin = rules_dir().resolve()
    names = [str(r) for r in roots if r != builtin]
    return ", ".join(names) if names else f"the built-in packs' folder ({builtin})"


def check_inside(roots: Sequence[Path], base: Path, rel: str, what: str) -> Path:
    """``base / rel`` with every symlink resolved, when it lies inside ``roots``; raises
    :class:`OutsideRoots` (a one-line message naming ``what`` and the roots) otherwise."""
    try:
        real = (base / rel).resolve()
    except RuntimeError as exc:  # a symlink loop (older Pythons); OSError/ValueError go up
        raise OSError(f"{exc}") from None
    if not roots or any(real == r or real.is_relative_to(r) for r in roots):
        return real
    via = "" if (base / rel).absolute() == real else f" (it leads to {real})"
    raise OutsideRoots(f"{what} {rel!r} is outside the pack's folder{via}; a pack reads only below {_shown(roots)}")


HINT = (
    "move the file into the pack's folder, or let the caller allow its folder: "
    "--search-path DIR on the command line, Engine.load(..., search_path=[DIR]) in Python"
)


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, for a message (``a FIFO``, ``a device``...)."""
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def read_limited(path: Path, limit: int = MAX_PACK_BYTES, what: str = "file", *, follow: bool = True) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes. Raises :class:`FileRefused`
    (FIFO, device, folder, too large) or ``OSError`` (also a symlink, unless ``follow``).
    Never blocks on a FIFO: it is opened with ``O_NONBLOCK`` and refused after ``fstat``."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags)
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(info.st_mode):
            raise FileRefused(f"{what} is {file_kind(info.st_mode)}, not a regular file")
        if info.st_size > limit:
            raise FileRefused(f"{what} is {info.st_size:,} bytes; the limit is {limit:,}")
        chunks: list[bytes] = []
        size = 0
        while size <= limit:  # the file may grow while we read it
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise FileRefused(f"{what} is over the limit of {limit:,} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_pack_text(
    roots: Sequence[Path], base: Path, rel: str, what: str, limit: int = MAX_PACK_BYTES
) -> tuple[str | None, Path | None, str | None, str | None]:
    """``(text, path, code, problem)`` of a UTF-8 file a pack names relative to ``base``:
    the text, or the diagnostic code (CR100 outside the roots, CR101 refused, CR084 not
    readable or not UTF-8) and a one-line problem that never quotes the file."""
    try:
        path = check_inside(roots, base, rel, what)
    except OutsideRoots as exc:
        return None, None, "CR100", str(exc)
    except (OSError, ValueError) as exc:  # a NUL byte, a name too long, ...
        return None, None, "CR084", f"{what} {rel!r} is not a usable path ({exc})"
    try:
        raw = read_limited(path, limit, what=f"{what} {rel!r}")
    except FileRefused as exc:
        return None, path, "CR101", str(exc)
    except OSError as exc:
        return None, path, "CR084", f"{what} {rel!r} cannot be read ({exc.strerror or exc})"
    try:
        return raw.decode("utf-8"), path, None, None
    except UnicodeDecodeError:
        return None, path, "CR084", f"{what} {rel!r} cannot be read (not UTF-8)"
