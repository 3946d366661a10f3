"""Is our standard output read by another command of a shell pipeline?

``ctxrules compress -- git log | grep fix`` must hand ``grep`` the real lines, not a
compressed summary, while an agent that runs ``ctxrules compress -- pytest`` and reads the
result through a pipe must get the compressed output. Both see a pipe on standard output; they
differ in *who reads it*.

Definition (docs/compressors.md "Pipelines"): the command is **part of a pipeline** when
standard output is a pipe (or FIFO) and some process that is not an ancestor of ctxrules holds
the pipe open for reading: in ``a | b`` the shell starts ``b`` next to ``a``, whereas an agent
that captures a command's output is one of its ancestors. A terminal, a regular file or
``/dev/null`` is never a pipeline. Where ``/proc`` is not available (macOS, Windows) this
cannot be told apart and the output is compressed.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["stdout_feeds_pipeline"]

_PROC = Path("/proc")


def _ancestors(pid: int) -> set[int]:
    seen: set[int] = set()
    while pid > 1 and pid not in seen:
        seen.add(pid)
        try:
            text = (_PROC / str(pid) / "stat").read_text(encoding="ascii", errors="replace")
        except OSError:
            break
        # The command name (field 2) is in parentheses and may contain spaces or ')'.
        fields = text[text.rfind(")") + 2 :].split()
        try:
            pid = int(fields[1])
        except (IndexError, ValueError):
            break
    return seen


def _reads(pid: str, fd: str) -> bool:
    try:
        info = (_PROC / pid / "fdinfo" / fd).read_text(encoding="ascii", errors="replace")
    except OSError:
        return False
    for line in info.splitlines():
        if line.startswith("flags:"):
            flags = int(line.split()[1], 8)
            return (flags & os.O_ACCMODE) in (os.O_RDONLY, os.O_RDWR)
    return False


def stdout_feeds_pipeline(fd: int = 1) -> bool:
    """Whether ``fd`` is a pipe that a non-ancestor process reads (see the module docstring)."""
    try:
        info = os.fstat(fd)
    except OSError:
        return False
    if not stat.S_ISFIFO(info.st_mode) or not _PROC.is_dir():
        return False
    target = f"pipe:[{info.st_ino}]"
    me = os.getpid()
    family = _ancestors(me)
    try:
        pids = [p for p in os.listdir(_PROC) if p.isdigit()]
    except OSError:
        return False
    for pid in pids:
        if int(pid) in family:
            continue
        try:
            fds = os.listdir(_PROC / pid / "fd")
        except OSError:
            continue  # another user's process, or gone
        for entry in fds:
            try:
                link = os.readlink(_PROC / pid / "fd" / entry)
            except OSError:
                continue
            if link == target and _reads(pid, entry):
                return True
    return False
