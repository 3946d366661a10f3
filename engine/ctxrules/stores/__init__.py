"""Where sessions persist: the :class:`Store` protocol and its backends (docs/stores.md).

``open_store(url)`` picks the backend by the URL's scheme through :data:`BACKENDS`, importing
its module only then, so the Redis client stays an optional extra. ``file://DIR`` (or a bare
directory) is the filesystem store rooted at DIR.
"""

from __future__ import annotations

import importlib
import os
import re
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

from ctxrules.integrations import session_name
from ctxrules.stores.base import (
    DOCS,
    SESSION_ID_RE,
    Log,
    LogChunk,
    PrepareLock,
    Store,
    StoreError,
    StoreLockTimeout,
    StoreUnavailable,
    StoreUsageError,
    Turn,
)
from ctxrules.stores.filesystem import FilesystemStore, file_path

__all__ = [
    "BACKENDS",
    "DOCS",
    "SESSION_ID_RE",
    "STORE_ENV",
    "Log",
    "LogChunk",
    "PrepareLock",
    "Store",
    "StoreError",
    "StoreLockTimeout",
    "StoreUnavailable",
    "StoreUsageError",
    "Turn",
    "file_path",
    "open_store",
    "redacted",
    "session_id_for",
    "store_and_session",
    "store_from_options",
]

STORE_ENV: Final = "CTXRULES_STORE"

BACKENDS: Final[dict[str, tuple[str, str]]] = {
    "file": ("ctxrules.stores.filesystem", "FilesystemStore"),
    "redis": ("ctxrules.stores.redis", "RedisStore"),
    "rediss": ("ctxrules.stores.redis", "RedisStore"),
    "unix": ("ctxrules.stores.redis", "RedisStore"),
}
"""URL scheme -> (module, class); the class is built with ``from_url(url)``."""


def session_id_for(raw: str) -> str:
    """The session id a URL store uses for ``raw`` (:func:`ctxrules.integrations.session_name`):
    itself when it is a plain name, else its sha256 hex."""
    return session_name(raw)


def open_store(url: str | os.PathLike[str] | Store) -> Store:
    """The store named by ``url`` (a :class:`Store` passes through). Raises :class:`UsageError`
    for a scheme no backend serves, or a backend whose extra is not installed."""
    if not isinstance(url, str | os.PathLike):
        if not isinstance(url, Store):  # a typo'd argument failed later, deep in the session
            kind = type(url).__name__
            raise StoreUsageError("CR145", f"store= takes a Store, a store URL or a directory, not {kind}")
        return url
    text = os.fspath(url)
    try:
        scheme = urlsplit(text).scheme.lower() if "://" in text else ""
    except ValueError as exc:  # `redis://[::1` (an unclosed IPv6 address)
        raise StoreUsageError("CR145", f"store URL {redacted(text)!r} does not parse: {exc}") from None
    if not scheme:
        return FilesystemStore(Path(text))
    backend = BACKENDS.get(scheme)
    if backend is None:
        known = ", ".join(f"{s}://" for s in BACKENDS)
        raise StoreUsageError("CR145", f"unknown store URL {redacted(text)!r}: the scheme must be one of {known}")
    module_name, class_name = backend
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if exc.name in ("redis", "hiredis"):
            raise StoreUsageError(
                "CR145", f'the store {redacted(text)} needs the redis client: pip install "ctxrules[redis]"'
            ) from None
        if exc.name == module_name:
            raise StoreUsageError("CR145", f"the store {redacted(text)}: this build has no {module_name}") from None
        raise
    built: Store = getattr(module, class_name).from_url(text)
    return built


def file_url(directory: str | os.PathLike[str]) -> str:
    """``file://`` URL of a directory (absolute)."""
    return Path(os.path.abspath(directory)).as_uri()


def store_from_options(store: str | None, state: str | None) -> str | None:
    """The store URL the CLI flags (``--store``, ``--state``) and ``CTXRULES_STORE`` name, or
    None for the default (``--state``'s default, ``.ctxrules`` or ``$CTXRULES_STATE``). Giving
    both flags is a usage error."""
    if store is not None and state is not None:
        raise StoreUsageError(
            "CR145", "give --store URL or --state DIR, not both (--state DIR means --store file://DIR)"
        )
    if store is not None:
        return store
    if state is not None:
        return file_url(state)
    env = os.environ.get(STORE_ENV)
    return env or None


def store_and_session(
    session_dir: str | os.PathLike[str] | None, store: Store | None, session: str | None
) -> tuple[Store, str]:
    """``(store, session key)`` for the constructors that take either a session directory (the
    filesystem store, as before) or ``store=`` and ``session=``."""
    if store is not None:
        if session is None:
            raise TypeError("store= needs session=")
        return store, session
    if session_dir is None:
        raise TypeError("give a session directory, or store= and session=")
    path = Path(session_dir)
    return FilesystemStore(path.parent), str(path)


def redacted(url: str) -> str:
    """``url`` without a password (``redis://user:secret@h`` -> ``redis://user:***@h``). A URL
    whose password the parser does not find although it holds an ``@`` after ``://`` (it does
    not parse, or a ``/`` in the password made the rest a path) loses everything between
    ``://`` and its last ``@``: a password may hold any character."""
    try:
        parts = urlsplit(url)
        password = parts.password  # reading it parses the address, which may fail too
    except ValueError:
        password = None
    else:
        if password is not None:
            netloc = parts.netloc.replace(f":{password}@", ":***@", 1)
            return parts._replace(netloc=netloc).geturl()
    if "@" in url.partition("://")[2]:
        return re.sub(r"://.*@", "://***@", url, count=1, flags=re.DOTALL)
    return url
