"""`printable`: what would act on a terminal is shown as its escape, and nothing else changes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ctxrules.printable import printable


def test_controls_overrides_and_surrogates_become_escapes() -> None:
    assert (
        printable("a\x1b[31mb\rc\x07d\x85e\u202ef\ud800g\x7f") == "a\\x1b[31mb\\x0dc\\x07d\\x85e\\u202ef\\ud800g\\x7f"
    )
    assert printable("tab\tnew\nline") == "tab\\x09new\\x0aline"
    assert printable("tab\tnew\nline", one_line=False) == "tab\tnew\nline"


@given(st.text())
def test_the_result_holds_nothing_unsafe_and_safe_text_is_unchanged(text: str) -> None:
    out = printable(text)
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or 0xD800 <= ord(c) <= 0xDFFF for c in out)
    assert not any(c in "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069" for c in out)
    out.encode("utf-8")  # a strict UTF-8 stream takes it
    assert printable(out) == out  # escapes are themselves printable
    unsafe = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
    if not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or 0xD800 <= ord(c) <= 0xDFFF or c in unsafe for c in text):
        assert out == text
