"""``--store URL`` and ``--state DIR`` for every verb that touches a session or the vault.

``--state DIR`` is ``--store file://DIR``; giving both is a usage error (exit 2). Without either,
``$CTXRULES_STORE`` names the store, else the filesystem store in ``$CTXRULES_STATE`` or
``.ctxrules``. With the filesystem store ``--session`` names a session directory (as it always
has); with any other store it names a session id (``[A-Za-z0-9._-]{1,128}`` as it is, anything
else by its sha256).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, TypeGuard

from ctxrules.errors import UsageError
from ctxrules.integrations import session_name
from ctxrules.session_store import state_root_from_env
from ctxrules.stores import Store, open_store, store_from_options
from ctxrules.stores.filesystem import FilesystemStore, own_folder

__all__ = [
    "add_store_options",
    "check_session_dir",
    "kept_places",
    "named_store",
    "session_key",
    "store_of",
]

STORE_HELP = (
    "where sessions live: file://DIR, redis://HOST:PORT/DB, rediss://..., unix:///PATH "
    "(default: $CTXRULES_STORE, else the --state directory)"
)
STATE_HELP = "state root directory; the same as --store file://DIR (default: .ctxrules or $CTXRULES_STATE)"


def add_store_options(p: argparse.ArgumentParser, *, state_help: str = STATE_HELP) -> None:
    """Add ``--store URL`` and ``--state DIR``."""
    p.add_argument("--store", metavar="URL", help=STORE_HELP)
    p.add_argument("--state", metavar="DIR", help=state_help)


def store_of(args: argparse.Namespace) -> Store:
    """The store the options name (a usage error for both flags, an unknown scheme, a missing
    client library)."""
    url = store_from_options(getattr(args, "store", None), getattr(args, "state", None))
    store = FilesystemStore(state_root_from_env()) if url is None else open_store(url)
    # A filesystem store whose root is there but is not a folder (`--state afile`,
    # CTXRULES_STATE=/etc/passwd) can keep no session, key or ledger: every verb refuses it
    # before anything is read or made (`sessions import` made the session all the same, and
    # `compress` went through or not depending on the output's size).
    if isinstance(store, FilesystemStore) and store.root.exists() and not store.root.is_dir():
        raise UsageError(f"{store.root}: the state root is not a directory (give --state DIR)")
    return store


def named_store(args: argparse.Namespace) -> Store | None:
    """The store the options or ``$CTXRULES_STORE`` name, or None when nothing names one (then a
    session directory keeps its day and goal ledgers in its parent, as always)."""
    url = store_from_options(getattr(args, "store", None), getattr(args, "state", None))
    return open_store(url) if url is not None else None


def is_filesystem(store: Store) -> TypeGuard[FilesystemStore]:
    return isinstance(store, FilesystemStore)


def session_key(store: Store, name: str | None) -> str:
    """The session ``--session`` names (default: ``default``): a directory for the filesystem
    store (as given, relative to the current directory; the default is ``STATE/default``), a
    session id for the others, by the rule the integrations name a request's session with
    (:func:`ctxrules.integrations.session_name`): ``--session vault`` is the session a proxy
    request naming ``vault`` made, not the store's own ``vault`` (before, the two differed for
    the store's own names and for ids starting with a dot)."""
    if isinstance(store, FilesystemStore):
        if not name:
            return str(store.root / "default")
        check_session_dir(name, store.root)
        return str(Path(name))
    return store.session_key(session_name(name or "default"))


def check_session_dir(name: str, root: Path | None = None) -> None:
    """A usage error (exit 2) when the session directory ``--session`` names is, or lies in, a
    folder ctxrules keeps for a session or a state root (``root``: the store's), such as another
    session's ``vault/``: a session made there would mix its files with that folder's, and be
    listed, exported or removed with it. The state root itself is refused too: it holds the
    ledgers and the signing key of every session, and a session there is none of its sessions
    (``sessions scan`` and ``export`` never list it)."""
    if root is not None and Path(name).resolve() == Path(root).resolve():
        raise UsageError(
            f"--session {name}: that is the state root, where ctxrules keeps the ledgers and the "
            f"signing key of every session; name a directory in it, such as {Path(root) / 'default'}"
        )
    found = own_folder(name, root)
    if found is not None:
        folder, what = found
        raise UsageError(
            f"--session {name}: {folder} is where ctxrules keeps {what} of {folder.parent}, not a "
            "session directory; name a directory outside it"
        )


def describe_store(store: Store) -> Any:
    """How a summary line names the store: its directory, or its URL."""
    return store.root if isinstance(store, FilesystemStore) else store.url


def kept_places(store: Store | None, session: str | None) -> list[Path]:
    """What the filesystem store keeps for ``session`` (``--session``; None: the default one)
    that an output file must not be written over: the session directory, and in its state root
    (the store's; without ``--store``/``--state``, the session's parent, as ``run`` has it) the
    signing key, the ledgers and the router's reports. ``store``: the one the options name, None
    for none. Nothing for other stores (their files are not the caller's to name)."""
    if store is not None and not isinstance(store, FilesystemStore):
        return []
    root = store.root if store is not None else (Path(session).parent if session else state_root_from_env())
    directory = Path(session) if session else root / "default"
    return [directory, root / "injection.key", root / "ledger", root / "router"]
