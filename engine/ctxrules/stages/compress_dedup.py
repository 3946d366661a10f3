"""``compress.dedup``: older copies of a repeated tool output become a marker.

Agents run the same command or read the same file again and again; only the newest copy is
worth its tokens. Tool results whose text is identical — or near-identical: equal once ANSI
colour codes, trailing whitespace, blank lines, timestamps and durations are normalized — are
grouped; the newest copy stays, every older eligible copy is replaced by one marker line that
points at the vault and names the call whose result is the newer copy::

    [ctxrules:elided kind=lines count=120 ref=vault://<id> duplicate_of=call_abc]

Priority-aware like every ``compress.*`` stage (standard copies first, important last,
critical/protected/pinned/tail never) and stops as soon as utilization is below ``target``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ctxrules.hookspecs import hookimpl
from ctxrules.message_memo import MessageMemo
from ctxrules.messages import message_text, replace_text
from ctxrules.stages.base import StageOutcome, StageType, unchanged
from ctxrules.stages.compress_common import (
    GUARD_OPTIONS,
    Edit,
    ThrashGuard,
    View,
    apply_edits,
    line_count,
    text_id,
)
from ctxrules.text_memo import TextMemo
from ctxrules.vault import format_marker

if TYPE_CHECKING:
    from ctxrules.pipeline.context import StageContext

_RESULT_ROLES = frozenset({"tool", "function"})
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_TIMESTAMP = re.compile(
    r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?\b"
    r"|\b\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?\b"
)
_DURATION = re.compile(r"\b\d+(?:\.\d+)?\s?(?:ms|s|sec|secs|seconds)\b")
_SPACES = re.compile(r"[ \t]+")


def normalized_digest(text: str, *, normalize: bool = True) -> str:
    """The digest two outputs share when they are duplicates (exact, or near-identical)."""
    if not normalize:  # the digest is the work: nothing to remember
        return _normalized_digest(text, False)
    # Remembered per text: a session at a compacting tier asks again on every turn.
    return _DIGESTS.get(text, True, lambda t: _normalized_digest(t, True))


_DIGESTS: TextMemo[str] = TextMemo(4096)
# In front of it, per message object: a warm turn asks again of the same messages, and a memo
# keyed by text hashes a long one whole on every lookup.
_BY_MESSAGE: MessageMemo[str | None] = MessageMemo()


def _message_digest(msg: Mapping[str, Any], normalize: bool) -> str | None:
    """:func:`normalized_digest` of the message's text; None when the text is blank."""
    return _BY_MESSAGE.get(msg, normalize, lambda m: _text_digest(message_text(m), normalize))


def _text_digest(text: str, normalize: bool) -> str | None:
    return normalized_digest(text, normalize=normalize) if text.strip() else None


def _normalized_digest(text: str, normalize: bool) -> str:
    if normalize:
        text = _ANSI.sub("", text.replace("\r\n", "\n"))
        text = _TIMESTAMP.sub("<time>", text)
        text = _DURATION.sub("<duration>", text)
        lines = (_SPACES.sub(" ", line).strip() for line in text.split("\n"))
        text = "\n".join(line for line in lines if line)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class Dedup:
    """The configured stage; see the module docstring."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.min_tokens = int(options.get("min_tokens", 100))
        self.normalize = bool(options.get("normalize", True))
        self.guard = ThrashGuard.from_options(options)

    def __call__(self, messages: Sequence[dict[str, Any]], ctx: StageContext) -> StageOutcome:
        view = View.build(messages, ctx)
        if view.below(view.total, ctx.target, ctx):
            return StageOutcome(messages=unchanged(messages))
        edits = list(self._plan(view, ctx))
        saved = sum(e.saved for e in edits)
        go, actions, warnings = self.guard.check(saved, ctx, "dedup")
        if not go:
            return StageOutcome(messages=unchanged(messages), actions=actions, warnings=warnings)
        out, actions = apply_edits(messages, edits, ctx)
        return StageOutcome(messages=out, actions=actions)

    def _plan(self, view: View, ctx: StageContext) -> list[Edit]:
        newest: dict[str, int] = {}
        digest_of: dict[int, str] = {}
        copies: list[int] = []
        for index, msg in enumerate(view.messages):
            if msg.get("role") not in _RESULT_ROLES or view.counts[index] < self.min_tokens:
                continue
            digest = _message_digest(msg, self.normalize)
            if digest is None:
                continue
            if digest in newest:
                copies.append(newest[digest])
            newest[digest] = index
            digest_of[index] = digest
        # Every index recorded as "newest" before a later copy replaced it is an older copy.
        candidates = sorted((i for i in copies if view.eligible(i)), key=view.order_key)
        total = view.total
        edits: list[Edit] = []
        for index in candidates:
            if view.below(total, ctx.target, ctx):
                break
            msg = view.messages[index]
            text = message_text(msg)
            keeper = view.messages[newest[digest_of[index]]]
            same_as = keeper.get("tool_call_id") or "a newer result"
            marker = format_marker("lines", line_count(text), text_id(text), duplicate_of=same_as)
            new = replace_text(msg, marker)
            saved = view.counts[index] - ctx.counter.count_message(new)
            if saved <= 0:
                continue
            total -= saved
            exact = "identical" if text == message_text(keeper) else "near-identical"
            edits.append(
                Edit(index, new, saved, [text], "dedup", f"message {index}: {exact} to the newer result of {same_as}")
            )
        return edits


STAGE_TYPE = StageType(
    name="compress.dedup",
    phase="content",
    hysteresis=True,
    factory=Dedup,
    description="Replaces older copies of identical or near-identical tool outputs by a marker "
    "that points at the vault and names the newer copy.",
    options_schema={
        "type": "object",
        "title": "compress.dedup options",
        "description": "Which repeated tool outputs count as duplicates, and when a cycle is worth it.",
        "additionalProperties": False,
        "properties": {
            "min_tokens": {
                "title": "Minimum size (tokens)",
                "description": "Tool results smaller than this are never deduplicated: the "
                "marker would cost about as much.",
                "type": "integer",
                "minimum": 1,
                "default": 100,
            },
            "normalize": {
                "title": "Near-identical matching",
                "description": "Compare outputs after removing ANSI codes, trailing and repeated "
                "whitespace, blank lines, timestamps and durations; false "
                "compares exact text only.",
                "type": "boolean",
                "default": True,
            },
            **GUARD_OPTIONS,
        },
    },
)


@hookimpl
def ctxrules_register_stages(register: Callable[[StageType], None]) -> None:
    register(STAGE_TYPE)
