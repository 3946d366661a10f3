"""Which ``models:`` entry applies to a model: the first whose globs match."""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any


def name_candidates(model: str, provider: str | None = None) -> list[str]:
    """The bare and the provider-prefixed forms of ``model`` (``openai/gpt-4o`` ↔ ``gpt-4o``)."""
    bare = model.rsplit("/", 1)[-1]
    out = [model, bare]
    if provider:
        out.append(f"{provider}/{bare}")
    return list(dict.fromkeys(out))


def select_model_entry(
    data: dict[str, Any], model: str, provider: str | None = None
) -> tuple[int, dict[str, Any]] | None:
    """(index, entry) of the first ``models:`` entry matching ``model``, or None."""
    names = name_candidates(model, provider)
    for i, entry in enumerate(data.get("models") or []):
        if not isinstance(entry, dict):
            continue
        globs = entry.get("match") or []
        if any(fnmatchcase(n, g) for g in globs if isinstance(g, str) for n in names):
            return i, entry
    return None


def effective_context(data: dict[str, Any], entry: dict[str, Any] | None) -> dict[str, Any]:
    """The pack's ``context:`` with the model entry's ``context:`` merged over it."""

    def deep(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        out = dict(a)
        for k, v in b.items():
            out[k] = deep(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        return out

    base = data.get("context") if isinstance(data.get("context"), dict) else {}
    own = entry.get("context") if entry and isinstance(entry.get("context"), dict) else {}
    return deep(base or {}, own or {})
