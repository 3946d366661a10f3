"""``json.dumps`` in pieces, for values that hold a string too large to copy whole.

A 50 MB tool result serialised with ``json.dumps`` is a second 50 MB string, and its UTF-8 a
third copy. :func:`json_pieces` yields the same text piece by piece: containers and short
values through ``json.dumps`` itself, a long string escaped a slice at a time (JSON escapes each
character on its own, so the slices join to exactly what ``json.dumps`` writes).
:func:`write_json` and :func:`json_sha256` feed those pieces to a file or a hash as UTF-8.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["LONG_STRING", "json_pieces", "json_sha256", "write_json"]

LONG_STRING = 1 << 20
"""Strings longer than this are escaped a slice at a time."""

_escape: Callable[[str], str] = json.encoder.encode_basestring


def _has_long_string(value: Any, depth: int = 0) -> bool:
    if isinstance(value, str):
        return len(value) > LONG_STRING
    if depth > 64:
        return False
    if isinstance(value, dict):
        return any(_has_long_string(v, depth + 1) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_has_long_string(v, depth + 1) for v in value)
    return False


def json_pieces(value: Any, *, sort_keys: bool = False, separators: tuple[str, str] = (", ", ": ")) -> Iterator[str]:
    """The pieces of ``json.dumps(value, ensure_ascii=False, sort_keys=..., separators=...)``."""
    if not _has_long_string(value):
        yield json.dumps(value, ensure_ascii=False, sort_keys=sort_keys, separators=separators)
        return
    yield from _pieces(value, sort_keys, separators)


def _pieces(value: Any, sort_keys: bool, separators: tuple[str, str]) -> Iterator[str]:
    item_sep, key_sep = separators
    if isinstance(value, str):
        if len(value) <= LONG_STRING:
            yield _escape(value)
            return
        yield '"'
        for start in range(0, len(value), LONG_STRING):
            yield _escape(value[start : start + LONG_STRING])[1:-1]
        yield '"'
    elif isinstance(value, dict) and all(isinstance(k, str) for k in value):
        items = sorted(value.items()) if sort_keys else value.items()
        yield "{"
        for index, (key, item) in enumerate(items):
            yield (item_sep if index else "") + _escape(key) + key_sep
            yield from _pieces(item, sort_keys, separators)
        yield "}"
    elif isinstance(value, list | tuple):
        yield "["
        for index, item in enumerate(value):
            if index:
                yield item_sep
            yield from _pieces(item, sort_keys, separators)
        yield "]"
    else:  # numbers, booleans, null, dicts with keys json.dumps converts: its own text
        yield json.dumps(value, ensure_ascii=False, sort_keys=sort_keys, separators=separators)


def _utf8(pieces: Iterator[str]) -> Iterator[bytes]:
    """The pieces as UTF-8 (lone surrogates kept, as the vault stores them), in ~1 MiB runs."""
    pending: list[str] = []
    size = 0
    for piece in pieces:
        pending.append(piece)
        size += len(piece)
        if size >= LONG_STRING:
            yield "".join(pending).encode("utf-8", "surrogatepass")
            pending, size = [], 0
    if pending:
        yield "".join(pending).encode("utf-8", "surrogatepass")


def write_json(write: Callable[[bytes], Any], value: Any, **options: Any) -> None:
    """``write`` the UTF-8 of ``json.dumps(value, ensure_ascii=False, **options)`` in pieces."""
    for data in _utf8(json_pieces(value, **options)):
        write(data)


def json_sha256(value: Any, **options: Any) -> str:
    """sha256 hex of the UTF-8 of ``json.dumps(value, ensure_ascii=False, **options)``."""
    digest = hashlib.sha256()
    for data in _utf8(json_pieces(value, **options)):
        digest.update(data)
    return digest.hexdigest()
