"""A pack resolved and fully validated against one plugin registry.

``resolve_and_validate`` is the one path from a pack reference to a checked pack: ``Engine.load``
and ``Engine.refresh`` use it with the engine's registry, ``load_pack`` raises on its errors.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ctxrules.errors import PackError, PackNotFound
from ctxrules.packs.loader import PackLoader, ResolvedPack
from ctxrules.plugins import Registry, default_registry
from ctxrules.threads import ForkSafeLock
from ctxrules.validation.validate import validate_resolved


def resolve_and_validate(ref: str | Path, registry: Registry, *, loader: PackLoader | None = None) -> ResolvedPack:
    """Resolve ``ref`` (a path or ``builtin:NAME[@range]``) with its parents and attach every
    diagnostic; stage types, actions, filters and option schemas are ``registry``'s. Never raises
    for a problem of the pack: look at ``pack.ok`` / ``pack.diagnostics``."""
    loader = loader or PackLoader()
    key = _cache_key(ref, loader, registry)
    if key is not None:
        cached = _CACHE.get(key)
        if cached is not None and cached.registry is registry and _tree_stamps(cached.pack.roots) == cached.stamps:
            return _copy(cached.pack)
    pack = loader.resolve(str(ref))
    pack.diagnostics = validate_resolved(pack, loader, registry)
    if key is not None:
        stamps = _tree_stamps(pack.roots)
        if stamps is not None and _settled(stamps):
            with _CACHE_LOCK:
                _CACHE.pop(key, None)
                _CACHE[key] = _Cached(registry, stamps, _copy(pack))
                while len(_CACHE) > _CACHE_SIZE:
                    del _CACHE[next(iter(_CACHE))]
    return pack


# -- the per-process cache -------------------------------------------------------------------
# A process that loads the same pack again (a proxy or an application opening an engine per
# request, `Engine.load` in a loop) reuses the resolved, validated pack while no file below the
# pack's roots changed: confinement (ctxrules.packs.confine) keeps everything validation reads
# (the pack files, their parents, templates, test inputs) below those roots, so their stamps
# (path, mtime, size, ctime, inode) decide. A file written in the last seconds is not trusted to have been
# read whole (the stamp may not move on a second write within the file system's time
# granularity): such a load is not cached. Roots with more than _SCAN_LIMIT entries are not
# cached either (the scan would cost what it saves).

_CACHE_SIZE = 16
_SCAN_LIMIT = 2_000
_SETTLE_NS = 2_000_000_000


_Stamp = tuple[str, int, int, int, int]


@dataclasses.dataclass(frozen=True)
class _Cached:
    registry: Registry
    stamps: tuple[_Stamp, ...]
    pack: ResolvedPack


_CACHE: dict[tuple[Any, ...], _Cached] = {}
_CACHE_LOCK = ForkSafeLock()


def _cache_key(ref: str | Path, loader: PackLoader, registry: Registry) -> tuple[Any, ...] | None:
    if not loader.fresh:
        return None  # a loader that read files already hands those (possibly older) copies on
    try:
        cwd = os.getcwd()  # relative references and the file names diagnostics show
    except OSError:
        return None
    return (str(ref), cwd, loader.search_path, id(registry), registry.fingerprint())


def _tree_stamps(roots: Sequence[Path]) -> tuple[_Stamp, ...] | None:
    """(path, mtime_ns, size, ctime_ns, inode) of every entry below ``roots``, sorted; None when
    too many. The change time and the inode too: a file rewritten to the same size with its
    mtime kept (``cp -p``, ``tar x``, ``rsync -t``) or replaced by another such file moves them."""
    out: list[_Stamp] = []
    pending = [str(r) for r in roots]
    while pending:
        folder = pending.pop()
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    out.append((entry.path, st.st_mtime_ns, st.st_size, st.st_ctime_ns, st.st_ino))
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(entry.path)
                    if len(out) > _SCAN_LIMIT:
                        return None
        except OSError:
            out.append((folder, -1, -1, -1, -1))
    return tuple(sorted(out))


def _settled(stamps: tuple[_Stamp, ...]) -> bool:
    newest = max((stamp[1] for stamp in stamps), default=0)  # the mtime: what a write sets
    return time.time_ns() - newest > _SETTLE_NS


def _copy(pack: ResolvedPack) -> ResolvedPack:
    """A pack of its own for each caller: ``data`` and the lists are new (callers may edit
    them); the origin tree and the parsed documents are shared (nothing writes to them)."""
    return dataclasses.replace(
        pack,
        data=_clone(pack.data),
        files=list(pack.files),
        diagnostics=list(pack.diagnostics),
        disabled={k: list(v) for k, v in pack.disabled.items()},
        docs=dict(pack.docs),
        real_paths=dict(pack.real_paths),
        disabled_at={k: dict(v) for k, v in pack.disabled_at.items()},
    )


def _clone(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clone(v) for v in value]
    return value


def raise_for_errors(pack: ResolvedPack) -> ResolvedPack:
    """``pack`` when it has no errors, else a :class:`PackError` naming the first one."""
    errors = [d for d in pack.diagnostics if d.severity == "error"]
    if errors:
        first = errors[0]
        more = f" (and {len(errors) - 1} more; run `ctxrules validate`)" if len(errors) > 1 else ""
        # Nothing was read: the reference itself names no pack.
        kind = PackNotFound if not pack.files and first.code == "CR030" else PackError
        raise kind(f"{first.file}:{first.line}:{first.col}: error[{first.code}] {first.message}{more}", list(errors))
    return pack


def load_pack(
    ref: str | Path,
    *,
    loader: PackLoader | None = None,
    registry: Registry | None = None,
    search_path: Sequence[str | os.PathLike[str]] = (),
) -> ResolvedPack:
    """Resolve and fully validate a pack; raises :class:`PackError` when it has errors.

    ``registry``: the plugins the pack may use; without it, the installed ones (this function
    is an entry point, like ``Engine.load``). ``search_path``: folders besides the pack's own
    that it may read from (ctxrules.packs.confine)."""
    return raise_for_errors(
        resolve_and_validate(
            ref, registry if registry is not None else default_registry(), loader=loader or PackLoader(search_path)
        )
    )
