"""ctxrules.json_stream writes exactly what json.dumps writes, without the whole text at once."""

from __future__ import annotations

import contextlib
import hashlib
import json
import tracemalloc
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ctxrules.json_stream as json_stream
from ctxrules.json_stream import (
    dumps_once,
    dumps_sha256,
    json_pieces,
    json_sha256,
    json_text_canonical,
    list_pieces,
    serialise_once,
    write_json,
    write_json_list,
)

TEXT = st.text(alphabet=st.sampled_from(["a", '"', "\\", "\n", "\x00", "é", "\ud800", "😀", "\t", "\x1f", " "]))
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=20,
)
OPTIONS: list[dict[str, Any]] = [{}, {"sort_keys": True, "separators": (",", ":")}]


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_pieces_join_to_json_dumps(value: Any) -> None:
    original = json_stream.LONG_STRING
    json_stream.LONG_STRING = 4  # every longer string goes slice by slice
    try:
        for options in OPTIONS:
            expected = json.dumps(value, ensure_ascii=False, **options)
            assert "".join(json_pieces(value, **options)) == expected
            data = expected.encode("utf-8", "surrogatepass")
            assert json_sha256(value, **options) == hashlib.sha256(data).hexdigest()
            written: list[bytes] = []
            write_json(written.append, value, **options)
            assert b"".join(written) == data
    finally:
        json_stream.LONG_STRING = original


def test_dict_keys_json_dumps_converts_are_left_to_it() -> None:
    value = {"content": "x" * (json_stream.LONG_STRING + 10), "n": {1: "a", None: 2}}
    assert "".join(json_pieces(value)) == json.dumps(value, ensure_ascii=False)


@pytest.mark.parametrize("sort_keys", [False, True])
def test_a_long_string_is_never_copied_whole(sort_keys: bool) -> None:
    message = {"role": "tool", "tool_call_id": "c1", "content": 'line "x"\n' * 3_000_000}  # 27 MB
    expected = hashlib.sha256(json.dumps(message, ensure_ascii=False, sort_keys=sort_keys).encode()).hexdigest()
    tracemalloc.start()
    try:
        got = json_sha256(message, sort_keys=sort_keys)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got == expected
    assert peak < 16 * 1024 * 1024  # slices of 1 MiB (escaped, then UTF-8), not 27 MB copies


@settings(max_examples=200, deadline=None)
@given(st.lists(JSON, max_size=5))
def test_a_list_from_its_items_texts_is_json_dumps_of_the_list(values: list[Any]) -> None:
    original = json_stream.LONG_STRING
    json_stream.LONG_STRING = 4  # items with a longer string go piece by piece
    try:
        expected = json.dumps(values, ensure_ascii=False)
        for scope in (serialise_once, contextlib.nullcontext):
            with scope():
                assert "".join(list_pieces(values)) == expected
                assert "".join(list_pieces(values)) == expected  # the kept texts again
                written: list[bytes] = []
                write_json_list(written.append, values)
                assert b"".join(written) == expected.encode("utf-8", "surrogatepass")
    finally:
        json_stream.LONG_STRING = original


def test_dumps_once_serialises_an_object_once_per_scope() -> None:
    message = {"role": "user", "content": "hello"}
    with serialise_once():
        first = dumps_once(message)
        assert dumps_once(message) is first  # kept for the scope
        assert dumps_once(dict(message)) == first and dumps_once(dict(message)) is not first
    assert dumps_once(message) == first and dumps_once(message) is not first  # dropped after it
    with serialise_once():
        long = {"content": "x" * (json_stream.LONG_STRING + 1)}
        assert dumps_once(long) is not dumps_once(long)  # long texts are not kept


@settings(max_examples=200, deadline=None)
@given(JSON)
def test_dumps_sha256_is_the_digest_of_json_dumps(value: Any) -> None:
    expected = hashlib.sha256(json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")).hexdigest()
    assert dumps_sha256(value) == expected
    with serialise_once():
        assert dumps_sha256(value) == expected
        assert dumps_sha256(value) == expected  # from the text kept for the scope


def test_dumps_sha256_hashes_a_long_string_in_slices() -> None:
    value = {"content": 'é"' * (json_stream.LONG_STRING // 2 + 7)}
    expected = hashlib.sha256(json.dumps(value, ensure_ascii=False).encode("utf-8")).hexdigest()
    with serialise_once():
        assert dumps_sha256(value) == expected
        assert json_stream._known_text(value) is None  # not kept: the long text was never made whole


def _holds_long_string(value: Any, depth: int = 0) -> bool:
    """The definition: a string longer than LONG_STRING in a container at most 64 levels down."""
    if isinstance(value, str):
        return len(value) > json_stream.LONG_STRING
    if depth > 64:
        return False
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list | tuple) else ()
    return any(_holds_long_string(v, depth + 1) for v in children)


@settings(max_examples=300, deadline=None)
@given(JSON, st.integers(min_value=0, max_value=70))
def test_the_long_string_check_follows_its_definition(value: Any, depth: int) -> None:
    original = json_stream.LONG_STRING
    json_stream.LONG_STRING = 2  # short texts count as long: both answers occur
    try:
        nested: Any = value
        for _ in range(depth):
            nested = [nested]
        assert json_stream._has_long_string(nested) == _holds_long_string(nested)
    finally:
        json_stream.LONG_STRING = original


@pytest.mark.parametrize("depth", range(60, 70))
@pytest.mark.parametrize("container", [lambda v: [v], lambda v: {"k": v}], ids=["list", "dict"])
def test_the_long_string_check_at_its_depth_limit(depth: int, container: Any) -> None:
    nested: Any = "x" * (json_stream.LONG_STRING + 1)
    for _ in range(depth):
        nested = container(nested)
    assert json_stream._has_long_string(nested) == _holds_long_string(nested) == (depth <= 65)


class _Opaque:
    def __str__(self) -> str:
        return "opaque \u00e9"


@settings(max_examples=300, deadline=None)
@given(st.recursive(JSON, lambda inner: st.lists(inner, max_size=3).map(tuple) | st.builds(_Opaque), max_leaves=8))
def test_the_canonical_text_is_what_json_dumps_writes(value: Any) -> None:
    # Cache digests hash this text: another byte would change every stored digest.
    expected = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    assert json_text_canonical(value) == expected
