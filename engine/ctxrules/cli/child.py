"""The command ``ctxrules compress`` runs: its own process group, signals forwarded to it.

The command runs in a process group of its own, so that a signal reaches everything it started
(``sh -c 'make; sleep 30'`` has ``sleep`` as a grandchild) and nothing it started outlives
ctxrules. While it runs, SIGINT, SIGTERM and SIGHUP sent to ctxrules (by a terminal's Ctrl-C, an
agent's timeout, a closed terminal) are forwarded to that group; a second one is SIGKILL, as is
the end of the command (the group is killed once the pipe is idle, or GRACE_S later while a job
that ignores the signal keeps writing). Output read before the command ended is kept, so it can
still be compressed, printed and vaulted.

A command that ends by itself keeps its background jobs (``sh -c 'server & echo started'``),
and ctxrules does not wait for them, though they hold the output pipe open. Once the command
has exited, everything it wrote is in the pipe, ahead of anything written later, and a pipe
holds at most its capacity: ctxrules reads on until the pipe has been empty for
:data:`QUIET_S` (the last lines of something the command started just before it exited), for
at most :data:`GRACE_S`, but never less than a pipe's capacity while bytes keep coming; then it
closes the pipe. A background job's later output is not read (a job writing to the closed pipe
gets SIGPIPE, as with any reader that went away): redirect it, ``server > log 2>&1 &``.

When standard input is a terminal whose foreground group is ours, the command's group gets the
terminal for as long as it runs (as a shell gives it to a job): a command that reads the terminal
is not stopped, and Ctrl-C goes straight to it. The terminal is handed back afterwards.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import IO, Any

__all__ = ["FORWARDED", "Child"]

_POSIX = hasattr(os, "killpg")
FORWARDED = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))
QUIET_S = 0.1
"""Once the command has exited by itself, the pipe staying empty this long ends the reading ..."""
GRACE_S = 1.0
"""... as does this long since the command exited, once a pipe's capacity has been read."""
_PIPE_CAPACITY = 1 << 20  # the most the pipe holds: widened to this where the system allows (_widen), else 64 KiB
_READ_BYTES = 1 << 20  # the most one read takes: what is in the pipe, up to this
_CHECK_S = 0.2  # how often the reading looks whether the command has ended


class Child:
    """``Child(argv, capture=True)`` starts the command; :meth:`run` forwards signals while
    it reads its output (stderr merged into stdout) and waits for it."""

    def __init__(self, argv: list[str], *, capture: bool) -> None:
        self.signal: int | None = None  # the first signal forwarded
        self._killed = False
        self.proc: subprocess.Popen[bytes] | None = None
        # The handlers go in before the command starts: a signal in between is not lost, and
        # the command starts with the default action for each (an exec resets a caught signal,
        # while an ignored one, as a shell's background job has for SIGINT, would stay ignored
        # and make the forwarded signal a no-op).
        self._previous = {signum: signal.signal(signum, self._forward) for signum in FORWARDED}
        try:
            # process_group=0: the command leads a new group whose id is its pid.
            group: dict[str, Any] = {"process_group": 0} if _POSIX else {}
            self.proc = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE if capture else None,
                stderr=subprocess.STDOUT if capture else None,
                **group,
            )
        except BaseException:
            self._restore()
            raise
        self._tty = _foreground_tty() if _POSIX else None
        if self._tty is not None:
            _set_foreground(self._tty, self.proc.pid)
        if self.signal is not None:  # arrived while the command was starting
            self._send(self.signal)

    def run(self, on_chunk: Callable[[bytes], None] | None = None) -> tuple[bytes, int]:
        """(everything the command wrote, its return code: negative for a signal)."""
        chunks: list[bytes] = []

        def sink(chunk: bytes) -> None:
            chunks.append(chunk)
            if on_chunk is not None:
                on_chunk(chunk)

        code = self.run_into(sink)
        return b"".join(chunks), code

    def run_into(self, sink: Callable[[bytes], None]) -> int:
        """Hand each piece of the output to ``sink`` as it comes (nothing is held here);
        the command's return code (negative for a signal)."""
        assert self.proc is not None
        try:
            if self.proc.stdout is not None:
                for chunk in self._chunks(self.proc.stdout):
                    sink(chunk)
            code = self._wait()
        finally:
            if self.proc.returncode is None:  # ctxrules itself failed: take the group along
                self._kill()
                self.proc.wait()
            self._finish()
            self._restore()
        return code

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    # --- internals ---------------------------------------------------------------------

    def _chunks(self, stream: IO[bytes]) -> Iterator[bytes]:
        assert self.proc is not None
        fd = stream.fileno()
        if not _POSIX:
            while piece := os.read(fd, _READ_BYTES):
                yield piece
            stream.close()
            return
        # A bigger pipe and reads that take whatever is there: a fast command (`cat` of a big
        # log) is read in a few large pieces instead of thousands of 64 KiB ones. Reads do not
        # block: an empty pipe is waited on with select, which wakes up now and then.
        _widen(fd)
        os.set_blocking(fd, False)
        check = time.monotonic() + _CHECK_S
        ended_at: float | None = None  # when the command was seen ended after a forwarded signal
        while True:
            try:
                chunk = os.read(fd, _READ_BYTES)
            except BlockingIOError:
                # The pipe is empty. A command that has ended by itself wrote everything it
                # will: read what a job it left writes just after, not what it writes later.
                if self.signal is None and self.proc.poll() is not None:
                    yield from _rest(fd)
                    stream.close()
                    return
                ready = bool(select.select([fd], [], [], _CHECK_S)[0])
            else:
                if not chunk:
                    stream.close()
                    return
                yield chunk
                now = time.monotonic()
                if now < check:
                    continue
                check = now + _CHECK_S
                ready = True
            # Something the command left running may keep the pipe open (or keep writing).
            # Once the command itself has ended: by itself, read what it wrote and leave its
            # background jobs be; after a forwarded signal, end them once the pipe is idle, or
            # GRACE_S later when a job that ignores the signal keeps writing.
            if self.proc.poll() is None:
                continue
            if self.signal is None:
                yield from _rest(fd)
                stream.close()
                return
            now = time.monotonic()
            ended_at = now if ended_at is None else ended_at
            if not ready or now - ended_at >= GRACE_S:
                self._kill()
            if now - ended_at >= 2 * GRACE_S:  # held open by a process that left the group
                stream.close()
                return

    def _wait(self) -> int:
        assert self.proc is not None
        while True:
            try:
                return self.proc.wait(timeout=0.2 if self.signal is not None else None)
            except subprocess.TimeoutExpired:
                continue

    def _kill(self) -> None:
        self._killed = True
        self._send(getattr(signal, "SIGKILL", signal.SIGTERM))

    def _send(self, signum: int) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if _POSIX:
                os.killpg(self.proc.pid, signum)
            else:  # no process groups to signal: the command alone
                self.proc.send_signal(signum)

    def _forward(self, signum: int, frame: FrameType | None) -> None:
        if self.signal is not None:
            self._kill()  # the second signal: do not wait any longer
            return
        self.signal = signum
        self._send(signum)

    def _finish(self) -> None:
        # Whatever the command left in its group (a daemon it started with &) ends with it
        # when it was signalled; a command that ended by itself keeps its background jobs.
        if self.signal is not None and not self._killed:
            self._kill()
        if self._tty is not None:
            _set_foreground(self._tty, os.getpgrp())
            self._tty = None


def _widen(fd: int) -> None:
    """Let the pipe hold :data:`_PIPE_CAPACITY` bytes where the system allows it (Linux; a
    pipe's default is 64 KiB): fewer, larger reads, and fewer stops of a fast writer."""
    if not sys.platform.startswith("linux"):
        return
    import fcntl

    with contextlib.suppress(OSError):  # above pipe-max-size, or out of the user's pipe pages
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), _PIPE_CAPACITY)


def _rest(fd: int) -> Iterator[bytes]:
    """What is left in the pipe of a command that has exited: everything it wrote (at most a
    pipe's capacity, ahead of later writes), and what comes while the pipe is not quiet for
    QUIET_S, up to GRACE_S (see the module's docstring)."""
    owed = _PIPE_CAPACITY  # an upper bound: reading a little more of a busy job is harmless
    end = time.monotonic() + GRACE_S
    while owed > 0 or time.monotonic() < end:
        ready, _, _ = select.select([fd], [], [], QUIET_S)
        if not ready:
            return
        try:
            chunk = os.read(fd, _READ_BYTES)
        except BlockingIOError:  # nothing after all (the pipe does not block): wait again
            continue
        if not chunk:
            return
        owed -= len(chunk)
        yield chunk


def _foreground_tty() -> int | None:
    """The fd of standard input when it is a terminal whose foreground group is ours."""
    try:
        fd = sys.stdin.fileno()
        if os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp():
            return fd
    except (OSError, ValueError, AttributeError):
        pass
    return None


def _set_foreground(fd: int, pgid: int) -> None:
    # A background group that calls tcsetpgrp gets SIGTTOU: ignore it for the call.
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        with contextlib.suppress(OSError):
            os.tcsetpgrp(fd, pgid)
    finally:
        signal.signal(signal.SIGTTOU, old)
