"""Markers whose vault item is gone (a vault cleaned by hand, a session directory copied
without it): found, re-derived, or said to be lost.

A marker promises that ``ctxrules vault get`` gives the original back. When the item is
missing, the session does not reuse an output holding such a marker: the next run computes the
output again from the history, which stores every original it still has (the vault id is the
sha256 of the bytes, so the item comes back under the same id). A marker that still points
nowhere after that came from the history itself (a tool result that held a marker), and is
replaced with a *lost* marker that says so — not a marker any more, so nothing offers to fetch it.
Signed thinking (a ``thinking`` block with its ``signature``, ``redacted_thinking``) is the
provider's, byte for byte: a marker the model wrote there is neither a marker of the session
nor replaced (a changed block fails the provider's signature check).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ctxrules.vault import Vault, parse_markers

__all__ = ["LOST_PREFIX", "lost_marker", "marker_ids", "missing", "replace_lost"]

LOST_PREFIX = "[ctxrules:lost"
_NEEDLE = "[ctxrules:elided"


def lost_marker(kind: str, count: int, ref: str) -> str:
    """``[ctxrules:lost kind=.. count=.. was=vault://..]``: what a marker becomes when its item
    is gone (deterministic: the same dangling marker always gives the same text)."""
    return f"{LOST_PREFIX} kind={kind} count={count} was={ref} reason=vault-item-missing]"


def _signed(obj: dict[Any, Any]) -> bool:
    """A block whose bytes a provider's signature covers (Anthropic's signed thinking)."""
    kind = obj.get("type")
    return (kind == "thinking" and bool(obj.get("signature"))) or kind == "redacted_thinking"


def _strings(message: Any) -> Iterable[str]:
    stack = [message]
    while stack:
        obj = stack.pop()
        if isinstance(obj, str):
            if _NEEDLE in obj:
                yield obj
        elif isinstance(obj, dict):
            if not _signed(obj):
                stack.extend(obj.values())
        elif isinstance(obj, list):
            stack.extend(obj)


def marker_ids(messages: Iterable[Any]) -> set[str]:
    """The vault ids of every marker in ``messages`` (any string field)."""
    ids: set[str] = set()
    for message in messages:
        for text in _strings(message):
            ids.update(m.vault_id for m in parse_markers(text))
    return ids


def missing(vault: Vault, ids: Iterable[str]) -> set[str]:
    """The ids of ``ids`` the vault does not hold (full ids only: a marker always has one)."""
    return vault.missing(ids)


def _replace_in(text: str, gone: set[str]) -> str:
    out: list[str] = []
    last = 0
    for marker in parse_markers(text):
        if marker.vault_id in gone:
            start, end = marker.span
            out.append(text[last:start])
            out.append(lost_marker(marker.kind, marker.count, marker.ref))
            last = end
    out.append(text[last:])
    return "".join(out)


def _replaced(obj: Any, gone: set[str]) -> Any:
    if isinstance(obj, str):
        return _replace_in(obj, gone) if _NEEDLE in obj else obj
    if isinstance(obj, dict):
        if _signed(obj):
            return obj
        new = {k: _replaced(v, gone) for k, v in obj.items()}
        return obj if all(new[k] is v for k, v in obj.items()) else new
    if isinstance(obj, list):
        items = [_replaced(v, gone) for v in obj]
        return obj if all(a is b for a, b in zip(items, obj, strict=True)) else items
    return obj


def replace_lost(messages: Sequence[Any], gone: set[str]) -> tuple[list[Any], int]:
    """``messages`` with every marker pointing at an id of ``gone`` replaced by a lost marker
    (changed messages are copies; the rest are the same objects), and how many changed."""
    out = list(messages)
    changed = 0
    for i, message in enumerate(out):
        new = _replaced(message, gone)
        if new is not message:
            out[i] = new
            changed += 1
    return out, changed
