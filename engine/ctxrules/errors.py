"""Errors the CLI reports as one line, without a traceback.

Anything that is not a :class:`CtxrulesError` is a bug and propagates, with one exception the
CLI's entry point makes (``ctxrules.cli.main.run``): an ``OSError`` that names a path (a name too
long, a folder below a file, a full or read-only disk) is the system refusing that path, reported
in one line naming it, exit 2.
"""

from __future__ import annotations


class CtxrulesError(Exception):
    """A handled error: the message is meant for the user as it is."""

    exit_code = 2


class UsageError(CtxrulesError):
    """The user asked for something that cannot be done (bad option, missing file)."""

    exit_code = 2


class PackError(CtxrulesError):
    """A rule pack could not be loaded; carries the diagnostics that say why."""

    exit_code = 1

    def __init__(self, message: str, diagnostics: list[object] | None = None) -> None:
        super().__init__(message)
        self.diagnostics = diagnostics or []


class PackNotFound(PackError):
    """The pack the caller named is not there (no such file, no such built-in pack): a usage
    error for the command line, as a missing path is for ``validate``. A pack that names a
    missing parent is a :class:`PackError` (CR030)."""

    exit_code = 2


class MessagesError(CtxrulesError):
    """The message list is malformed in a way no stage can repair."""

    exit_code = 2


class CompletionFailed(CtxrulesError):
    """A model call through ``session.complete``/``acomplete`` failed (after the one overflow
    recovery, when the error was an overflow)."""

    exit_code = 2
