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


class VaultError(CtxrulesError):
    """A vault id is malformed, unknown, ambiguous, or its content is corrupt (also
    ``ctxrules.vault.VaultError`` and ``ctxrules.stores.VaultError``)."""


# The stores' errors (also ctxrules.stores.StoreError, ...): here, so that what catches one
# does not import the store package.
class StoreError(CtxrulesError):
    """A store cannot do what was asked (a bad URL, a damaged record, an unsafe path)."""


class StoreUsageError(UsageError):
    """A store named wrongly (``[CR145]``: an unknown URL scheme, ``--store`` with ``--state``,
    options a ``file://`` store does not take, a backend whose extra is missing), a session
    archive that cannot be imported (``[CR146]``), or a session that is not in the store
    (``[CR147]``). Exit code 2."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"[{code}] {message}")
        self.code = code


class StoreUnavailable(StoreError):
    """The store cannot be reached (a network store down, a connect timeout); the message names
    the URL (without its password)."""


class SessionExists(StoreError):
    """:meth:`Store.creating` found the session there already (made before the block, or by
    another writer during it): nothing of the block's writes was kept."""


class StoreLockTimeout(StoreError):
    """The prepare lock of a session stayed held by another worker for the whole wait."""


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
