"""What a terminal shows of a command's output: its text without control sequences, and the
last state of a line it redrew with carriage returns.

The rules (docs/compressors.md, "Terminal control sequences"):

- CSI (colours, cursor moves; ``ESC [`` or 8-bit ``0x9b``) and the other escapes
  (``ESC ( B``, ``ESC 7``, ``ESC =``, ...) are removed.
- Control *strings* are removed with their bodies: OSC (titles, links; ``ESC ]`` / ``0x9d``),
  DCS (sixel images, tmux passthrough; ``ESC P`` / ``0x90``), SOS (``ESC X`` / ``0x98``), PM
  (``ESC ^`` / ``0x9e``) and APC (kitty graphics; ``ESC _`` / ``0x9f``). A string ends at ST
  (``ESC \\`` or ``0x9c``), or BEL for OSC, even lines later (a terminal shows nothing of
  the lines in between). One that never gets there (a truncated image, a stray byte) ends
  where a terminal abandons it (CAN, SUB, another escape) when that is on the same line, and
  otherwise at the end of its line: a terminal would hide everything up to the next escape,
  perhaps the rest of the output, but a model must not lose the lines after a stray byte.
- 8-bit C1 controls (``0x80``-``0x9f``) are read as the escapes they stand for (``0x9b`` is
  ``ESC [``); the others are removed. They arrive as those code points (the UTF-8 a terminal
  reads as C1); a raw byte ``0x9b`` is not UTF-8, is decoded as U+FFFD and stays, as a
  terminal in UTF-8 mode shows it.

Every pattern is linear: a string's body is a run of characters that cannot end it, so no
match backtracks over more than the text up to the next ESC, and each starts with ESC.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence

__all__ = ["ESCAPES", "redrawn", "strip_escapes", "without_escapes"]

ESCAPES = re.compile(
    r"\x1b(?:"
    # DCS, SOS, PM, APC closed by ST, across lines if need be.
    r"[PX^_][^\x18\x1a\x1b]*\x1b\\"
    # OSC closed by BEL or ST.
    r"|\][^\x07\x18\x1a\x1b]*(?:\x07|\x1b\\)"
    # A string never closed: to CAN or SUB (removed too), to an escape, or to the end of its line.
    r"|[]PX^_][^\x18\x1a\x1b\n]*[\x18\x1a]?"
    # CSI, its final byte optional (a sequence cut short).
    r"|\[[0-?]*[ -/]*[@-~]?"
    # Every other escape: intermediates and a final byte (ESC ( B, ESC 7, a lone ESC \).
    r"|[ -/]*[0-~]?"
    r")"
)
"""Terminal control sequences in their 7-bit form (see the module's rules). Every one starts
with ESC, which lets the regex engine skip to the next ESC at once."""

_C1 = re.compile(r"[\x80-\x9f]")
_SEVEN_BIT = {chr(code): "" for code in range(0x80, 0xA0)} | {
    "\x90": "\x1bP",
    "\x98": "\x1bX",
    "\x9b": "\x1b[",
    "\x9c": "\x1b\\",
    "\x9d": "\x1b]",
    "\x9e": "\x1b^",
    "\x9f": "\x1b_",
}
"""8-bit C1 controls as the escapes they stand for (as a terminal reads them); others removed."""


def _seven_bit(text: str) -> str:
    # A regex, not str.translate: translate looks up every character of a non-ASCII text.
    return _C1.sub(lambda m: _SEVEN_BIT[m.group()], text) if not text.isascii() else text


def without_escapes(text: str) -> str:
    """``text`` (one line) without its terminal control sequences (the same object when it
    has none)."""
    text = _seven_bit(text)
    return ESCAPES.sub("", text) if "\x1b" in text else text


def strip_escapes(lines: Sequence[str]) -> list[tuple[str, int, int]]:
    """``lines`` without their control sequences, as ``(text, first, last)``: the text and the
    indexes of the lines it comes from. A control string that spans lines makes one line of
    the text before it and the text after it, as a terminal shows them."""
    joined = "\n".join(lines)
    if joined.count("\n") != len(lines) - 1:  # a line holds a newline itself: line by line
        return [(without_escapes(line), i, i) for i, line in enumerate(lines)]
    if not joined.isascii() and _C1.search(joined):
        lines = [_seven_bit(line) for line in lines]
        joined = "\n".join(lines)
    text = ESCAPES.sub("", joined) if "\x1b" in joined else joined
    if text is joined:
        return [(line, i, i) for i, line in enumerate(lines)]
    out = text.split("\n")
    if len(out) == len(lines):
        return [(line, i, i) for i, line in enumerate(out)]
    # Some strings spanned lines (rare): find them to know which lines joined.
    starts: list[int] = []
    offset = 0
    for line in lines:
        starts.append(offset)
        offset += len(line) + 1
    joins = bytearray(len(lines))  # joins[i]: line i continues on the line after it
    for match in ESCAPES.finditer(joined):
        if joined.find("\n", match.start(), match.end()) != -1:
            first = bisect.bisect_right(starts, match.start()) - 1
            last = bisect.bisect_right(starts, match.end() - 1) - 1
            joins[first:last] = b"\x01" * (last - first)
    result: list[tuple[str, int, int]] = []
    first = 0
    for piece in out:
        last = first
        while joins[last]:
            last += 1
        result.append((piece, first, last))
        first = last + 1
    return result


def redrawn(text: str) -> str:
    """What is left of a line redrawn with carriage returns: its last part with text in it.

    A progress bar's last state is the part after its last ``\\r``; parts that are blank (a
    line cleared with spaces, ``\\r\\r`` from a pseudo-terminal) are not a state, and a line
    whose only carriage returns end it (CRLF) is left as it is. What a terminal would show of
    ``"downloading 10%\\rdone"`` (``"donenloading 10%"``) is no text anyone wrote: ``"done"``
    is kept.
    """
    body = text.rstrip("\r")
    if "\r" not in body:
        return text
    for part in reversed(body.split("\r")):
        if part.strip():
            return part
    return ""
