"""Recognizing an append-only history, so the next turn reuses the last compaction.

The caller passes the full history on every call. When the new history starts with the one the
session saw last, the pipeline runs on *the previous output* plus the appended messages: the
compaction is not redone, and the prefix the provider caches stays byte-identical. Invariant 4
(the pipeline changes nothing on its own output) makes this equal to a fresh run's decisions.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any


def freeze(value: Any) -> Any:
    """A hashable, order-insensitive (for dicts) form of a JSON-like value. Strings are kept as
    they are: Python caches their hashes, so re-keying an unchanged message is cheap."""
    if isinstance(value, Mapping):
        return tuple(sorted((k, freeze(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    return value


def message_keys(messages: Sequence[Mapping[str, Any]]) -> list[Any]:
    return [freeze(m) for m in messages]


def message_digest(message: Mapping[str, Any]) -> str:
    """A stable digest of a message across processes (canonical JSON, sha256)."""
    data = json.dumps(message, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(data.encode("utf-8")).hexdigest()


def common_prefix(old: Sequence[Any], new: Sequence[Any]) -> bool:
    """Whether ``new`` starts with all of ``old``."""
    n = len(old)
    return n <= len(new) and all(a == b for a, b in zip(old, new[:n], strict=True))
