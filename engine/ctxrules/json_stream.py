"""``json.dumps`` in pieces, for values that hold a string too large to copy whole.

A 50 MB tool result serialised with ``json.dumps`` is a second 50 MB string, and its UTF-8 a
third copy. :func:`json_pieces` yields the same text piece by piece: containers and short
values through ``json.dumps`` itself, a long string escaped a slice at a time (JSON escapes each
character on its own, so the slices join to exactly what ``json.dumps`` writes).
:func:`write_json` and :func:`json_sha256` feed those pieces to a file or a hash as UTF-8.

One ``prepare`` writes the same messages as JSON several times: the compaction backup (the
whole input), the vault entries of removed runs, the lines of ``last_output.jsonl``. Inside
:func:`serialise_once` (the session enters it for a prepare, while no message is edited in
place), :func:`dumps_once` serialises each message object once and hands the same text out
again; :func:`list_pieces` builds a list's JSON from those texts (``json.dumps`` of a list is its
items' texts joined by ``", "``). Texts over :data:`LONG_STRING` are not kept.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from typing import Any

from ctxrules.scoped import Scoped

__all__ = [
    "LONG_STRING",
    "dumps_once",
    "dumps_sha256",
    "json_pieces",
    "json_sha256",
    "json_text",
    "json_text_canonical",
    "json_text_sorted",
    "known_value",
    "list_pieces",
    "make_json_text",
    "remember_value",
    "serialise_once",
    "write_json",
    "write_json_list",
]

LONG_STRING = 1 << 20
"""Strings longer than this are escaped a slice at a time."""

_escape: Callable[[str], str] = json.encoder.encode_basestring
_ENCODERS: dict[tuple[bool, tuple[str, str]], json.JSONEncoder] = {}


def make_json_text(
    sort_keys: bool, separators: tuple[str, str] = (", ", ": "), default: Callable[[Any], Any] | None = None
) -> Callable[[Any], str]:
    """``json.dumps(value, ensure_ascii=False, sort_keys=sort_keys)`` as one C encoder made once
    (``JSONEncoder.encode`` builds a new one on every call, and a warm turn calls it for each
    new message and the state). Made without a circular-reference check: the values are
    messages checked to a bounded depth (:mod:`ctxrules.json_limits`) and ctxrules' own state,
    and a check would keep a table shared between calls and threads."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # no C accelerator (another Python implementation): the library's way
        return json.JSONEncoder(ensure_ascii=False, sort_keys=sort_keys, separators=separators, default=default).encode
    item_separator, key_separator = separators
    fallback = json.JSONEncoder().default if default is None else default
    encoder = make(None, fallback, _escape, None, key_separator, item_separator, sort_keys, False, True)
    join = "".join

    def text(value: Any) -> str:
        return join(encoder(value, 0))

    return text


json_text: Callable[[Any], str] = make_json_text(False)
"""``json.dumps(value, ensure_ascii=False)`` (the same text), without building an encoder."""
json_text_sorted: Callable[[Any], str] = make_json_text(True)
"""``json.dumps(value, ensure_ascii=False, sort_keys=True)`` (the same text), likewise."""
json_text_canonical: Callable[[Any], str] = make_json_text(True, (",", ":"), str)
"""``json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"), default=str)``
(the same text), likewise: the form cache digests hash."""


def _encoder(sort_keys: bool = False, separators: tuple[str, str] = (", ", ": ")) -> json.JSONEncoder:
    """The encoder ``json.dumps(..., ensure_ascii=False, sort_keys=..., separators=...)`` would
    build on every call (thousands per prepare), built once."""
    key = (sort_keys, (separators[0], separators[1]))
    found = _ENCODERS.get(key)
    if found is None:
        found = _ENCODERS[key] = json.JSONEncoder(ensure_ascii=False, sort_keys=sort_keys, separators=separators)
    return found


def _has_long_string(value: Any) -> bool:
    """Whether ``value`` holds a string longer than :data:`LONG_STRING` (looked for at most 64
    levels deep). A loop over an explicit stack: it runs on every message of every prepare, and
    generators per container cost more than the walk itself."""
    if type(value) is str:
        return len(value) > LONG_STRING
    stack: list[tuple[Any, int]] = [(value, 0)]
    pop, push = stack.pop, stack.append
    while stack:
        item, depth = pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list | tuple) else None
        if children is None:
            continue
        for child in children:
            if isinstance(child, str):
                if len(child) > LONG_STRING:
                    return True
            elif depth < 64 and isinstance(child, dict | list | tuple):
                push((child, depth + 1))
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


def write_json_list(write: Callable[[bytes], Any], values: Iterable[Any]) -> None:
    """:func:`write_json` of a list, its items serialised through :func:`dumps_once`."""
    for data in _utf8(list_pieces(values)):
        write(data)


def json_sha256(value: Any, **options: Any) -> str:
    """sha256 hex of the UTF-8 of ``json.dumps(value, ensure_ascii=False, **options)``."""
    if not _has_long_string(value):  # the common case, without the pieces' generators
        text = json_text(value) if not options else _encoder(**options).encode(value)
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    digest = hashlib.sha256()
    for data in _utf8(json_pieces(value, **options)):
        digest.update(data)
    return digest.hexdigest()


class _Scope:
    __slots__ = ("texts", "values")

    def __init__(self) -> None:
        # id(object) -> (the object, its JSON); holding the object keeps its id from being reused.
        self.texts: dict[int, tuple[Any, str]] = {}
        # the id of a text made in the scope -> the value it was made of (remember_value)
        self.values: dict[str, Any] = {}


_ONCE: ContextVar[_Scope | None] = ContextVar("ctxrules_serialise_once", default=None)


def serialise_once() -> Scoped[_Scope | None]:
    """Within this scope :func:`dumps_once` serialises each object once. For code that does not
    edit the objects it serialises while inside (a session's ``prepare``); the texts are
    dropped when the scope ends."""
    return Scoped(_ONCE, _Scope())


def remember_value(text_id: str, value: Any) -> None:
    """Inside :func:`serialise_once`: ``value`` is what the text ``text_id`` names (a vault
    entry made of it in this scope), so that :func:`known_value` hands it back instead of the
    text being read and parsed again in the same scope."""
    scope = _ONCE.get()
    if scope is not None:
        scope.values[text_id] = value


def known_value(text_id: str) -> Any | None:
    """The value :func:`remember_value` recorded for ``text_id`` in this scope, else None."""
    scope = _ONCE.get()
    return scope.values.get(text_id) if scope is not None else None


def _known_text(value: Any) -> str | None:
    """The text :func:`dumps_once` made for this very object in this scope (it keeps only texts
    of at most :data:`LONG_STRING` characters, so a value it knows holds no long string)."""
    scope = _ONCE.get()
    if scope is None:
        return None
    hit = scope.texts.get(id(value))
    return hit[1] if hit is not None and hit[0] is value else None


def dumps_once(value: Any) -> str:
    """``json.dumps(value, ensure_ascii=False)``; inside :func:`serialise_once`, the text made
    for this very object earlier in the scope."""
    scope = _ONCE.get()
    if scope is None:
        return json.dumps(value, ensure_ascii=False)
    memo = scope.texts
    hit = memo.get(id(value))
    if hit is not None and hit[0] is value:
        return hit[1]
    text = json_text(value)
    if len(text) <= LONG_STRING:
        memo[id(value)] = (value, text)
    return text


def dumps_sha256(value: Any) -> str:
    """sha256 hex of the UTF-8 of ``json.dumps(value, ensure_ascii=False)``: inside
    :func:`serialise_once`, of the text :func:`dumps_once` makes (or made: the compaction backup
    serialises the history first), so a digest of a message costs no serialisation of its own."""
    text = _known_text(value)
    if text is None:
        if _has_long_string(value):
            digest = hashlib.sha256()
            for data in _utf8(json_pieces(value)):
                digest.update(data)
            return digest.hexdigest()
        text = dumps_once(value)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def list_pieces(values: Iterable[Any]) -> Iterator[str]:
    """The pieces of ``json.dumps(list(values), ensure_ascii=False)``: each item through
    :func:`dumps_once`, or piece by piece (:func:`json_pieces`) when it holds a long string."""
    yield "["
    for index, value in enumerate(values):
        if index:
            yield ", "
        known = _known_text(value)
        if known is not None:
            yield known
        elif _has_long_string(value):
            yield from _pieces(value, False, (", ", ": "))
        else:
            yield dumps_once(value)
    yield "]"
