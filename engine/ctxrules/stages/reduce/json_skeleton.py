"""The skeleton of a JSON document: its shape, within depth / key / item / string limits.

What is cut is said where it was cut, so the skeleton stays valid JSON and tells the model
what is missing:

- an object with more keys than allowed keeps the first ones and gets ``"…": "N more keys"``;
- a list with more items keeps its first and last items around ``"… N more items"``;
- a non-empty container below the depth limit becomes ``"{…} N keys"`` / ``"[…] N items"``
  (an empty one stays as it is: it is shorter than its summary);
- a long string keeps its start and gets ``"… (+N chars)"``.

:func:`reduce_json` embeds the marker that points to the whole original in the skeleton itself
(first key ``"_ctxrules"`` of an object, first item of a list), so the reduced output is still
one valid JSON document *and* carries a parseable marker.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from ctxrules.stages.reduce.text_lines import Count
from ctxrules.vault import format_marker

__all__ = ["JsonLimits", "JsonReduction", "parse_json_document", "reduce_json", "skeleton"]

ELIDED_KEY = "…"
MARKER_KEY = "_ctxrules"


@dataclass(frozen=True)
class JsonLimits:
    """``depth``: container levels shown (the root is level 1); ``keys`` per object; ``items``
    per list; ``string_chars`` per string value."""

    depth: int = 4
    keys: int = 12
    items: int = 6
    string_chars: int = 200

    def tighter(self) -> JsonLimits:
        """The next, stricter limits (used until the skeleton fits its budget)."""
        return JsonLimits(
            depth=max(1, self.depth - 1) if self.keys <= 6 else self.depth,
            keys=max(2, self.keys * 2 // 3),
            items=max(1, self.items * 2 // 3),
            string_chars=max(24, self.string_chars // 2),
        )


@dataclass(frozen=True)
class JsonReduction:
    text: str
    elided: int
    limits: JsonLimits


def parse_json_document(text: str) -> Any | None:
    """The parsed value when ``text`` is one JSON object or array (else ``None``)."""
    stripped = text.strip()
    if not stripped or stripped[0] not in "{[" or stripped[-1] not in "}]":
        return None
    try:
        return json.loads(stripped)
    except (ValueError, RecursionError):
        return None


class _Skeleton:
    def __init__(self, limits: JsonLimits) -> None:
        self.limits = limits
        self.elided = 0

    def value(self, value: Any, level: int) -> Any:
        if isinstance(value, dict):
            return self.mapping(value, level)
        if isinstance(value, list):
            return self.sequence(value, level)
        if isinstance(value, str) and len(value) > self.limits.string_chars:
            self.elided += 1
            keep = self.limits.string_chars
            return f"{value[:keep]}… (+{len(value) - keep} chars)"
        return value

    def mapping(self, value: dict[str, Any], level: int) -> Any:
        if level > self.limits.depth and value:
            self.elided += 1
            return f"{{…}} {len(value)} keys"
        out: dict[str, Any] = {}
        keys = list(value)
        for key in keys[: self.limits.keys]:
            out[key] = self.value(value[key], level + 1)
        more = len(keys) - self.limits.keys
        if more > 0:
            self.elided += more
            out[_free_key(value, ELIDED_KEY)] = f"{more} more keys"
        return out

    def sequence(self, value: list[Any], level: int) -> Any:
        if level > self.limits.depth and value:
            self.elided += 1
            return f"[…] {len(value)} items"
        limit = self.limits.items
        if len(value) <= limit:
            return [self.value(item, level + 1) for item in value]
        head = max(1, limit - limit // 3)
        tail = limit - head
        more = len(value) - head - tail
        self.elided += more
        kept_head = [self.value(item, level + 1) for item in value[:head]]
        kept_tail = [self.value(item, level + 1) for item in value[len(value) - tail :]]
        if not tail:
            kept_tail = []
        return [*kept_head, f"… {more} more items", *kept_tail]


def _free_key(mapping: dict[str, Any], wanted: str) -> str:
    """``wanted``, or a variant of it that the object does not use already."""
    key = wanted
    n = 1
    while key in mapping:
        n += 1
        key = f"{wanted}{n}"
    return key


def skeleton(value: Any, limits: JsonLimits) -> tuple[Any, int]:
    """The skeleton of ``value`` and how many values were elided."""
    builder = _Skeleton(limits)
    return builder.value(value, 1), builder.elided


def _dump(value: Any, pretty: bool) -> str:
    if pretty:
        return json.dumps(value, ensure_ascii=False, indent=1)
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def reduce_json(
    value: Any,
    original: str,
    *,
    vault_id: str,
    budget_tokens: int,
    count: Count,
    limits: JsonLimits | None = None,
    marker_fields: dict[str, object] | None = None,
    embed_marker: bool = True,
) -> JsonReduction | None:
    """The skeleton of ``value`` (parsed from ``original``) that fits ``budget_tokens``.

    Starts at ``limits`` (depth 4, 12 keys, 6 items by default) and tightens them until the
    skeleton fits; the strictest skeleton is returned when nothing fits. ``None`` when nothing
    had to be elided (the document is already within the limits and the budget).
    """
    if not isinstance(value, dict | list):
        return None
    current = limits or JsonLimits()
    pretty = "\n" in original.strip()
    best: JsonReduction | None = None
    for _ in range(12):
        skel, elided = skeleton(value, current)
        if elided == 0 and count(original) <= budget_tokens:
            return None
        text = _render(skel, elided, vault_id, pretty, marker_fields or {}, embed_marker)
        if pretty and count(text) > budget_tokens:
            text = _render(skel, elided, vault_id, False, marker_fields or {}, embed_marker)
        best = JsonReduction(text, elided, current)
        if count(text) <= budget_tokens:
            return best
        stricter = current.tighter()
        if stricter == current:
            break
        current = stricter
    if best is not None and best.limits.depth > 1:
        # Even the strictest key/item limits were too big: show only the top level.
        skel, elided = skeleton(value, replace(best.limits, depth=1))
        best = JsonReduction(
            _render(skel, elided, vault_id, False, marker_fields or {}, embed_marker),
            elided,
            replace(best.limits, depth=1),
        )
    return best


def _render(skel: Any, elided: int, vault_id: str, pretty: bool, fields: dict[str, object], embed_marker: bool) -> str:
    if embed_marker:
        marker = format_marker("json", elided, vault_id, lines=None, **fields)
        if isinstance(skel, dict):
            skel = {_free_key(skel, MARKER_KEY): marker, **skel}
        elif isinstance(skel, list):
            skel = [marker, *skel]
    return _dump(skel, pretty)
