"""Printing on standard output, one way for every verb (docs/reference/cli.md).

Verbs print through :func:`write_stdout` (or :func:`stdout_writer`),
so a standard output that cannot take it is handled alike: closed (``>&-``) or a failed write
(a full disk, a descriptor open only for reading) is :class:`OutputError`, exit 2 with one
line; a reader that went away (``EPIPE``: ``| head -1``) stays :class:`BrokenPipeError`, which
the entry point ends with exit 0, as any Unix filter does. Imported by the entry point: only the standard
library and :mod:`ctxrules.errors`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Iterator
from typing import Any

from ctxrules.errors import CtxrulesError

STDOUT_CLOSED = "standard output is closed: there is nowhere to print the output"


class OutputError(CtxrulesError):
    """Standard output cannot take what the verb prints: closed, or a write failed (exit 2)."""

    exit_code = 2


def write_stdout(text: str) -> None:
    """Print ``text`` on standard output (see the module docstring for a failure)."""
    with printing():
        _stdout().write(text)


class _Writer:
    """Standard output as a stream for code that takes one (``write`` only), its failures
    those of :func:`write_stdout`."""

    def __init__(self, binary: bool) -> None:
        self._binary = binary

    def write(self, data: Any) -> int:
        with printing():
            stream: Any = _stdout().buffer if self._binary else _stdout()
            return int(stream.write(data))

    def flush(self) -> None:
        flush_stdout()


def stdout_writer(*, binary: bool = False) -> Any:
    """Standard output as a stream with :func:`write_stdout`'s failures (a text one, or ``binary``)."""
    return _Writer(binary)


def flush_stdout() -> None:
    """Send what is buffered for standard output (the entry point does, before it exits: a
    write that fails there still gets its exit code, not an error at interpreter exit)."""
    if sys.stdout is None:
        return
    with printing():
        sys.stdout.flush()


def require_stdout() -> None:
    """:class:`OutputError` now when standard output is closed or open only for reading: for
    a verb that would otherwise act first and fail to say so after (``usage add`` records a
    call; a retry after exit 2 would record it twice)."""
    if sys.stdout is None:
        raise OutputError(STDOUT_CLOSED)
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError):  # not a file (tests capture it): it takes anything
        return
    try:
        os.write(fd, b"")  # a closed or read-only descriptor refuses even nothing (EBADF)
    except OSError as exc:
        if exc.errno == errno.EBADF:
            raise OutputError(STDOUT_CLOSED) from None


@contextlib.contextmanager
def printing() -> Iterator[None]:
    """Writes to standard output within: a closed one or a failed write is :class:`OutputError`;
    ``EPIPE`` stays :class:`BrokenPipeError`. Either way what is still buffered for it goes to
    the null device (the exit-time flush would fail again)."""
    try:
        yield
    except BrokenPipeError:
        silence_stdout()
        raise
    except OSError as exc:
        silence_stdout()
        if exc.errno == errno.EBADF:
            raise OutputError(STDOUT_CLOSED) from None
        raise OutputError(f"cannot write to standard output: {exc.strerror or exc}") from None


def utf8_stdout() -> None:
    """Standard output in an encoding that takes every character a verb prints, whatever the
    locale or ``PYTHONIOENCODING`` say (``ascii`` made ``run`` and ``explain`` end in an
    internal UnicodeEncodeError at the first non-ASCII character). A file or a pipe gets UTF-8,
    the bytes ``--output FILE`` holds and JSON's own encoding; a terminal keeps its encoding,
    a character it cannot show written as its escape (it is read there, not parsed)."""
    stream = sys.stdout
    reconfigure = getattr(stream, "reconfigure", None)
    if stream is None or reconfigure is None or (stream.encoding or "").lower().replace("-", "") == "utf8":
        return
    try:
        terminal = stream.isatty()
    except (OSError, ValueError):
        return
    with contextlib.suppress(OSError, ValueError, LookupError):
        reconfigure(errors="backslashreplace") if terminal else reconfigure(encoding="utf-8")


class _UnreadStderr:
    """Standard error for the CLI, for when nobody reads it any more (a closed pipe: ``2>&1 |
    head -1``, a harness that went away): the write that finds it so sends the descriptor to the
    null device and goes on, so the verb keeps its exit code. Without it, argparse's usage
    message raised BrokenPipeError, taken for standard output's reader leaving (exit 0, not 2),
    and every other error message raised again while it was being reported (exit 1)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except BrokenPipeError:
            _to_null(self._stream)
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            _to_null(self._stream)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _to_null(stream: Any) -> None:
    """``stream``'s descriptor becomes the null device; what its buffer holds goes there."""
    with contextlib.suppress(OSError, AttributeError, ValueError), open(os.devnull, "wb") as devnull:
        os.dup2(devnull.fileno(), stream.fileno())
    with contextlib.suppress(OSError, ValueError):
        stream.flush()


def tolerate_unread_stderr() -> None:
    """Wrap ``sys.stderr`` in :class:`_UnreadStderr` (once)."""
    if sys.stderr is not None and not isinstance(sys.stderr, _UnreadStderr):
        sys.stderr = _UnreadStderr(sys.stderr)


def silence_stdout() -> None:
    """Standard output becomes the null device (after a failed write: nothing more can go there)."""
    if sys.stdout is None:
        return
    with contextlib.suppress(OSError, AttributeError, ValueError), open(os.devnull, "wb") as devnull:
        os.dup2(devnull.fileno(), sys.stdout.fileno())


def _stdout() -> Any:
    if sys.stdout is None:  # the process started with its descriptor 1 closed (`>&-`)
        raise OutputError(STDOUT_CLOSED)
    return sys.stdout
