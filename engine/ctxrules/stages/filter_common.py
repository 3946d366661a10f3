"""Helpers shared by the filtering stages (``tool_output.filter``, ``ttl.prune``, ...).

- the ``hot_cache_bypass`` / ``bypass_below`` options and the decision they drive;
- recognizing content a ctxrules stage already shortened (it carries a marker whose vault entry
  exists), so a stage never reduces its own output again (invariant 4);
- stable digests of tool results, for state kept across calls;
- the options check every stage factory runs (the same schema ``ctxrules validate`` uses).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ctxrules.stages.cache_markers import canonical_message
from ctxrules.types import TIERS, Message, tier_rank
from ctxrules.validation import quick
from ctxrules.vault import VaultError, parse_markers

if TYPE_CHECKING:
    from ctxrules.pipeline.context import StageContext
    from ctxrules.vault import Vault

__all__ = [
    "BYPASS_PROPERTIES",
    "bypass_active",
    "check_options",
    "has_live_marker",
    "result_digest",
    "result_key",
    "tokens_saved",
]

BYPASS_PROPERTIES: dict[str, Any] = {
    "hot_cache_bypass": {
        "title": "Hot-cache bypass",
        "description": (
            "When the provider's prompt cache very likely still holds this session's prefix "
            "(a resumed session or a human-in-the-loop turn within the cache TTL), leave content "
            "that was already sent alone, so the warm cache is not broken."
        ),
        "type": "boolean",
        "default": True,
    },
    "bypass_below": {
        "title": "Bypass only below this tier",
        "description": (
            "The hot-cache bypass holds while utilization is below this tier. From it on, later "
            "stages rewrite the history anyway (priority removal starts at 'full'), so keeping "
            "the cache warm is no longer possible and reducing now is the cheaper choice."
        ),
        "enum": list(TIERS[1:]),
        "default": "full",
    },
}


def bypass_active(ctx: StageContext, options: Mapping[str, Any]) -> bool:
    """Whether already-sent content must be left alone on this run (see ``BYPASS_PROPERTIES``)."""
    if not options.get("hot_cache_bypass", True) or not ctx.cache_hot:
        return False
    below = str(options.get("bypass_below", "full"))
    return tier_rank(ctx.tier) < tier_rank(below)


def has_live_marker(text: str, vault: Vault) -> bool:
    """Whether ``text`` carries a ctxrules marker whose vault entry exists in ``vault``.

    Such content was already shortened by a stage of this session; reducing it again would
    only nest markers. A file that merely *quotes* a marker (its id is not in this vault) is
    ordinary content.
    """
    if "[ctxrules:elided" not in text:
        return False
    for marker in parse_markers(text):
        try:
            if vault.exists(marker.vault_id):
                return True
        except VaultError:
            continue
    return False


_DIGESTS: dict[int, tuple[Mapping[str, Any], Any, Any, str]] = {}


def result_digest(msg: Mapping[str, Any]) -> str:
    """A short, stable digest of a tool result (its call id and content).

    Remembered per message object (with its content and call id objects, so a message changed
    in place is digested again): the session hands the same objects back on every call."""
    content, call = msg.get("content"), msg.get("tool_call_id")
    hit = _DIGESTS.get(id(msg))
    if hit is not None and hit[0] is msg and hit[1] is content and hit[2] is call:
        return hit[3]
    digest = _result_digest(msg)
    if len(_DIGESTS) > 100_000:
        _DIGESTS.clear()
    _DIGESTS[id(msg)] = (msg, content, call, digest)
    return digest


def result_key(msg: Mapping[str, Any]) -> str:
    """What a tool result's digest is taken of before its content (its call id, else its
    name), cut at the first separator: two results whose keys differ never have the same
    digest, but for a collision of SHA-256 (the digest's seed starts with the key and a
    separator), so a result whose key no remembered result has need not be digested to know
    that it is not among them."""
    return _seed_key(msg).partition(_SEP)[0]


_SEP = "\x1f"


def _seed_key(msg: Mapping[str, Any]) -> str:
    return f"{msg.get('tool_call_id') or msg.get('name') or ''}"


def _result_digest(msg: Mapping[str, Any]) -> str:
    content = msg.get("content")
    if not isinstance(content, str):
        # Taken without the breakpoints cache.markers places: the output last on one call
        # carries one (its content a one-part list) and loses it on the next; a result sent
        # while the prompt cache was hot must still read as sent, or it is reduced afterwards
        # (a break of the cached prefix).
        content = canonical_message({"content": content})["content"]
    body = content if isinstance(content, str) else json.dumps(content, sort_keys=True, ensure_ascii=False, default=str)
    seed = f"{_seed_key(msg)}{_SEP}{body}"
    return hashlib.sha256(seed.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def tokens_saved(ctx: StageContext, old: Message, new: Message) -> int:
    """Tokens the change from ``old`` to ``new`` saves (never negative in the report)."""
    return max(0, ctx.counter.count_message(old) - ctx.counter.count_message(new))


def check_options(stage: str, schema: Mapping[str, Any], options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``options`` checked against ``schema`` with defaults filled in; ``ValueError`` otherwise.

    Packs are validated before a stage is built, but stages are also built directly (tests,
    embedding code); the message names the stage and the option like ``ctxrules validate``.
    """
    given = dict(options or {})
    errors: list[Any] = []
    if quick.for_schema(schema)(given) is not True:  # jsonschema only when the quick check is not sure
        import jsonschema  # type: ignore[import-untyped, unused-ignore]

        validator = jsonschema.Draft202012Validator(dict(schema))
        errors = sorted(validator.iter_errors(given), key=lambda e: list(e.absolute_path))
    if errors:
        err = errors[0]
        where = "/".join(str(p) for p in err.absolute_path) or "with"
        raise ValueError(f"{stage}: option {where}: {err.message}")
    out: dict[str, Any] = {}
    for key, prop in schema.get("properties", {}).items():
        if key in given:
            out[key] = given[key]
        elif isinstance(prop, Mapping) and "default" in prop:
            out[key] = prop["default"]
    return out
