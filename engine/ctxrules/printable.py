"""Text from packs, messages and files made safe to print on a terminal.

A pack or a message may hold escape sequences (``ESC [ 2 J`` clears the screen, ``ESC ] 0 ;``
retitles the window, ``\\r`` overwrites the line), bidirectional overrides that show a line in
an order other than the one it has, or lone surrogates that a UTF-8 stream cannot encode. A
diagnostic that quotes such a value shows each of these characters as its escape instead, and so
does an HTML page (:func:`printable_html`).
"""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL and the C1 controls, the bidirectional marks, embeddings,
# overrides and isolates, and lone surrogates.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_UNSAFE_IN_A_LINE = re.compile(_UNSAFE.pattern.replace("\x00-\x08\x0b-\x1f", "\x00-\x1f"))


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, *, one_line: bool = True) -> str:
    """``text`` with every character that would act on the terminal written as its escape
    (``\\x1b``, ``\\u202e``); tabs and newlines too when ``one_line``."""
    pattern = _UNSAFE_IN_A_LINE if one_line else _UNSAFE
    return pattern.sub(_escape, text) if pattern.search(text) else text


_SURROGATE = re.compile("[\ud800-\udfff]")


def _byte_or_code(match: re.Match[str]) -> str:
    code = ord(match.group())
    # U+DC80-U+DCFF: a byte of a file name (or an argument) that is not UTF-8, as Python's
    # surrogateescape reads it; shown as that byte, the way the name is on disk.
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"


def encodable(text: str) -> str:
    """``text`` with each lone surrogate written as its escape: ``\\xff`` for a byte that
    was not UTF-8 in a file name, ``\\ud800`` for the others. UTF-8 (a JSON or SARIF
    report, an HTML page) cannot hold a lone surrogate: json.dumps writes ``"\\udcff"``,
    which strict JSON readers refuse."""
    return _SURROGATE.sub(_byte_or_code, text) if _SURROGATE.search(text) else text


def printable_html(text: str) -> str:
    """``text`` for an HTML page: markup escaped, and what :func:`printable` escapes shown as
    its escape too (tabs and newlines kept). A browser acts on a bidirectional override as a
    terminal does: one in a session id would show the rest of its line in another order."""
    from html import escape

    return escape(printable(text, one_line=False))


def shown_int(value: int) -> str:
    """``value`` for a message: as it is, or its first digits and its length when it is long
    (a pack may hold an integer of thousands of digits; a one-line error stays one line)."""
    text = str(value)
    return text if len(text) <= 24 else f"{text[:12]}... ({len(text):,} digits)"


def shown_repr(value: object, width: int = 80) -> str:
    """``repr(value)`` for a one-line message, cut to about ``width`` characters with the
    length said (a model name or a tool call given by a request may be megabytes)."""
    text = repr(value)
    if len(text) <= width:
        return text
    size = len(value) if isinstance(value, str) else len(text)  # a string's own, else its repr's
    return f"{text[: width - 20]}...({size:,} characters)"
