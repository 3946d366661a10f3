"""A pack resolved and fully validated against one plugin registry.

``resolve_and_validate`` is the one path from a pack reference to a checked pack: ``Engine.load``
and ``Engine.refresh`` use it with the engine's registry, ``load_pack`` raises on its errors.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ctxrules.errors import PackError
from ctxrules.packs.loader import PackLoader, ResolvedPack
from ctxrules.plugins import Registry, default_registry
from ctxrules.validation.validate import validate_resolved


def resolve_and_validate(ref: str | Path, registry: Registry, *, loader: PackLoader | None = None) -> ResolvedPack:
    """Resolve ``ref`` (a path or ``builtin:NAME[@range]``) with its parents and attach every
    diagnostic; stage types, actions, filters and option schemas are ``registry``'s. Never raises
    for a problem of the pack: look at ``pack.ok`` / ``pack.diagnostics``."""
    loader = loader or PackLoader()
    pack = loader.resolve(str(ref))
    pack.diagnostics = validate_resolved(pack, loader, registry)
    return pack


def raise_for_errors(pack: ResolvedPack) -> ResolvedPack:
    """``pack`` when it has no errors, else a :class:`PackError` naming the first one."""
    errors = [d for d in pack.diagnostics if d.severity == "error"]
    if errors:
        first = errors[0]
        more = f" (and {len(errors) - 1} more; run `ctxrules validate`)" if len(errors) > 1 else ""
        raise PackError(
            f"{first.file}:{first.line}:{first.col}: error[{first.code}] {first.message}{more}", list(errors)
        )
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
