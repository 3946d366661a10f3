"""Background title helper: a short title for a conversation from its first message, locally.

Titles are a background task whose tokens buy nothing, so the text is denoised first: fenced
and indented code blocks, URLs, HTML/XML tags and entities, Markdown decoration are removed,
keeping the natural language. :func:`clean_for_title` returns that text (what a caller would
send to a model, if it wants a model-written title); :func:`title` makes the title itself from
it — the first sentence, cut at a word boundary — and never calls a model. When nothing is left
(the user only pasted code, a link or markup), a fixed local fallback is returned: zero tokens.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping
from typing import Any

from ctxrules.messages import message_text

__all__ = ["FALLBACK_TITLES", "clean_for_title", "title"]

FALLBACK_TITLES: dict[str, str] = {
    "code": "Code snippet",
    "link": "Shared link",
    "markup": "Markup snippet",
    "empty": "New conversation",
}
"""What :func:`title` returns when nothing but code, links or markup was sent."""

_FENCED = re.compile(r"(?ms)^[ \t]*(```|~~~)[^\n]*\n.*?(?:^[ \t]*\1[ \t]*$|\Z)")
_INLINE_FENCE = re.compile(r"```.*?```", re.S)
_INDENTED = re.compile(r"(?m)(?:^(?: {4}|\t).*\n?){2,}")
_URL = re.compile(r"(?i)\b(?:https?|ftp|file)://\S+|\bwww\.\S+")
_TAG = re.compile(r"</?[A-Za-z][\w:.-]*(?:\s[^<>]*)?/?>|<!--.*?-->|<!DOCTYPE[^>]*>", re.S)
_MD = re.compile(r"(?m)^\s{0,3}(?:#{1,6}\s+|>\s?|[-*+]\s+|\d+[.)]\s+)|[*_~]{1,3}(?=\S)|(?<=\S)[*_~]{1,3}")
_BACKTICK = re.compile(r"`([^`\n]*)`")
_MD_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")


def _text_of(first_message: str | Mapping[str, Any]) -> str:
    if isinstance(first_message, str):
        return first_message
    return message_text(first_message)


def _strip(text: str) -> tuple[str, set[str]]:
    removed: set[str] = set()

    def gone(kind: str) -> str:
        removed.add(kind)
        return " "

    text = _FENCED.sub(lambda _m: gone("code"), text)
    text = _INLINE_FENCE.sub(lambda _m: gone("code"), text)
    text = _INDENTED.sub(lambda _m: gone("code"), text)
    text = _MD_LINK.sub(lambda m: m.group(1) if m.group(1).strip() else gone("link"), text)
    text = _URL.sub(lambda _m: gone("link"), text)
    text = _TAG.sub(lambda _m: gone("markup"), text)
    text = html.unescape(text)
    text = _TAG.sub(lambda _m: gone("markup"), text)  # entities that decoded into tags
    text = _BACKTICK.sub(lambda m: m.group(1), text)
    text = _MD.sub("", text)
    return text, removed


def clean_for_title(first_message: str | Mapping[str, Any], *, max_chars: int = 500) -> str:
    """The first message without code, URLs, HTML and Markdown, whitespace collapsed, cut to
    ``max_chars`` (O(length) regex passes; nothing is sent anywhere)."""
    text, _removed = _strip(_text_of(first_message)[: max_chars * 20])
    flat = " ".join(text.split())
    return flat[:max_chars]


def title(first_message: str | Mapping[str, Any], *, max_chars: int = 60) -> str:
    """A title for a conversation from its first message (a string or a chat message).

    The first sentence of the denoised text, cut at a word boundary to ``max_chars`` (with an
    ellipsis). When nothing readable is left, a fallback from :data:`FALLBACK_TITLES`.
    """
    raw = _text_of(first_message)
    text, removed = _strip(raw[: max(max_chars, 100) * 50])
    # Something readable needs a letter (or a CJK character): punctuation left over from a
    # stripped snippet is not a title.
    lines = [" ".join(line.split()) for line in text.splitlines() if re.search(r"[^\W\d_]", line)]
    if not lines:
        for kind in ("code", "link", "markup"):
            if kind in removed:
                return FALLBACK_TITLES[kind]
        return FALLBACK_TITLES["empty"]
    first = re.sub(r"\s+([,.:;!?])", r"\1", lines[0])
    sentence = re.split(r"(?<=[.!?])\s+|(?<=[\u3002\uff01\uff1f])", first, maxsplit=1)[0].strip()
    sentence = sentence.rstrip(" .,:;!?\u3002\uff0c\uff1a\uff1b") or first  # CJK punctuation too
    if len(sentence) <= max_chars:
        return sentence
    cut = sentence[: max_chars - 1]
    space = cut.rfind(" ")
    if space >= max_chars // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:-") + "…"
