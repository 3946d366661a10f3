"""The recall tool: the agent reads back what ctxrules moved out of its context.

Every elision leaves a marker ``[ctxrules:elided kind=... count=N ref=vault://ID#La-Lb]``. The
recall tool takes such an ``id`` (a full vault id, a unique prefix of at least 12 hex digits,
or the marker's ``vault://ID#La-Lb``), optionally ``lines: "A:B"`` (1-based, inclusive), and
answers with the **exact original lines**, as many as fit the answer budget; when more remain, the
answer ends with a marker for the next page. Only ids that this session's markers reference are
answered (the markers of the last output, and the markers inside the items those reference):
a recall can never read any other vault item. A span of removed messages is answered one message
per line (the exact JSON of each), so ``lines`` counts messages there.

The pack's ``recall:`` key words the tool (``name``, ``description``) and sets the answer budget
(``budget_tokens``). Results of the tool have the ``file_read`` role, so ctxrules never reduces a
recalled output again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ctxrules.errors import CtxrulesError, UsageError
from ctxrules.messages import message_text
from ctxrules.printable import shown_repr
from ctxrules.toolroles import RECALL_TOOL
from ctxrules.vault import MIN_PREFIX, Vault, VaultError, parse_markers

__all__ = [
    "DEFAULT_BUDGET_TOKENS",
    "DEFAULT_DESCRIPTION",
    "DEFAULT_NAME",
    "RecallError",
    "RecallSettings",
    "answer_recall",
    "referenced_ids",
    "tool_definition",
]

DEFAULT_NAME = RECALL_TOOL
DEFAULT_DESCRIPTION = (
    "Read back content that was moved out of this conversation to save space. Markers such as "
    "[ctxrules:elided kind=lines count=120 ref=vault://3f2a...#L10-L129] show where; pass the "
    'ref\'s id (and, to read only part of it, lines as "A:B") to get the exact original text. '
    "A long answer ends with a marker for the next page."
)
DEFAULT_BUDGET_TOKENS = 4000
_NESTING = 3  # markers inside recalled items are followed this deep
# Line numbers of at most 18 digits: a longer one is refused as malformed (int() would
# refuse more than 4,300 digits with an error no caller expects). Matched against the stripped
# text: a leading or trailing \s* next to the optional digits would backtrack in cubic time on
# a long run of spaces (a hostile call would hold the server for hours).
_LINES = re.compile(r"(\d{0,18})\s*(?::\s*(\d{0,18}))?")
_REF = re.compile(r"^(?:vault://)?([0-9a-fA-F]+)(?:#L(\d{1,18})-L(\d{1,18}))?$")


class RecallError(CtxrulesError):
    """A recall call that cannot be answered (unknown id, bad lines); the message says why."""


@dataclass(frozen=True)
class RecallSettings:
    """The pack's ``recall:`` section."""

    name: str = DEFAULT_NAME
    description: str = DEFAULT_DESCRIPTION
    budget_tokens: int = DEFAULT_BUDGET_TOKENS

    @classmethod
    def from_pack(cls, pack: Mapping[str, Any]) -> RecallSettings:
        raw = pack.get("recall") or {}
        return cls(
            name=str(raw.get("name", DEFAULT_NAME)),
            description=str(raw.get("description", DEFAULT_DESCRIPTION)),
            budget_tokens=int(raw.get("budget_tokens", DEFAULT_BUDGET_TOKENS)),
        )


PARAMETERS: Mapping[str, Any] = {
    "type": "object",
    "properties": {
        "id": {
            "type": "string",
            "description": "The vault id of a [ctxrules:elided ...] marker's ref (vault://ID or "
            "ID; a prefix of 12 or more hex digits is enough).",
        },
        "lines": {
            "type": "string",
            "description": 'Which lines to read, "A:B" (1-based, inclusive; "A:" to the end). '
            "Default: the marker's own range, else from the first line.",
        },
    },
    "required": ["id"],
    "additionalProperties": False,
}


def tool_definition(settings: RecallSettings, fmt: str = "openai") -> dict[str, Any]:
    """The tool's definition for the OpenAI (``openai``) or Anthropic (``anthropic``) API."""
    if fmt == "openai":
        return {
            "type": "function",
            "function": {
                "name": settings.name,
                "description": settings.description,
                "parameters": json.loads(json.dumps(PARAMETERS)),
            },
        }
    if fmt == "anthropic":
        return {
            "name": settings.name,
            "description": settings.description,
            "input_schema": json.loads(json.dumps(PARAMETERS)),
        }
    raise UsageError(f"unknown tool format {fmt!r}: use 'openai' or 'anthropic'")


def _texts(messages: Iterable[Mapping[str, Any]]) -> Iterable[str]:
    for msg in messages:
        yield message_text(msg)
        for call in msg.get("tool_calls") or []:
            fn = call.get("function") if isinstance(call, Mapping) else None
            args = fn.get("arguments") if isinstance(fn, Mapping) else None
            if isinstance(args, str):
                yield args


def referenced_ids(messages: Iterable[Mapping[str, Any]], vault: Vault) -> set[str]:
    """The vault ids the markers in ``messages`` reference, and those referenced from inside
    those items (a step archived, then removed, points at the archived form)."""
    found: set[str] = set()
    frontier = {m.vault_id for text in _texts(messages) if "[ctxrules:" in text for m in parse_markers(text)}
    for _ in range(_NESTING):
        frontier -= found
        if not frontier:
            break
        found |= frontier
        nested: set[str] = set()
        for vid in frontier:
            try:
                data = vault.get(vid)
            except VaultError:
                continue
            if b"[ctxrules:" in data:
                nested |= {m.vault_id for text in _item_texts(data) for m in parse_markers(text)}
        frontier = nested
    return found


def _item_texts(data: bytes) -> Iterable[str]:
    """The texts of a vault item whose markers count: the item itself, and when it is JSON (a
    span of removed messages, a message's content parts) each string in it, decoded: a marker
    with a quoted field (``duplicate_of="a newer result"``) is ``\\"``-escaped in the JSON text
    and parses only once decoded."""
    text = data.decode("utf-8", "replace")
    yield text
    if text[:1] not in ("[", "{") or '\\"' not in text:
        return  # no escaped quote: the raw text holds every marker there is
    try:
        stack: list[Any] = [json.loads(text)]
    except (ValueError, RecursionError):
        return
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            if "[ctxrules:" in value:
                yield value
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)


def _shown(value: object, width: int = 80) -> str:
    """``value`` quoted for an error message (the model reads it, and a call may hold a
    megabyte)."""
    return shown_repr(value, width)


def _parse_lines(text: str | None) -> tuple[int | None, int | None]:
    if text is None or text == "":
        return None, None
    match = _LINES.fullmatch(str(text).strip())
    if match is None:
        raise RecallError(
            f'lines {_shown(text)} is not of the form "A:B" (1-based, inclusive; numbers of at most 18 digits)'
        )
    a = int(match.group(1)) if match.group(1) else None
    b = int(match.group(2)) if match.group(2) else (a if match.group(0).find(":") < 0 else None)
    if (a is not None and a < 1) or (b is not None and b < 1) or (a and b and b < a):
        raise RecallError(f"lines {_shown(text)}: give 1 <= A <= B")
    return a, b


class _Lines:
    """The item's lines; a span of messages (stored as their JSON list) is one message per
    line, each the exact JSON of that message, so paging never cuts a message in two.

    Only "\n" ends a line, as for markers and `vault get --lines` (str.splitlines would also
    break at "\r", "\f", "\x1c".."\x1e", "\x85", "\u2028": a progress bar's redraws). A text's
    lines are read where a page starts, never split all at once: a list of every line of a
    100 MB output would cost several times the output for a page of a few thousand tokens."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.messages: list[str] | None = None
        if text.startswith("[{"):
            try:
                value = json.loads(text)
            except (ValueError, RecursionError):
                value = None
            if isinstance(value, list) and value and all(isinstance(m, dict) for m in value):
                self.messages = [json.dumps(m, ensure_ascii=False) + "\n" for m in value]
        if self.messages is not None:
            self.count = len(self.messages)
        else:
            self.count = text.count("\n") + (1 if text and not text.endswith("\n") else 0)

    def starting_at(self, first: int) -> Iterator[str]:
        """Lines ``first``, ``first + 1``, ... (1-based)."""
        if self.messages is not None:
            yield from self.messages[first - 1 :]
            return
        text, at = self.text, 0
        for _ in range(first - 1):
            at = text.find("\n", at) + 1
        while at < len(text):
            end = text.find("\n", at)
            end = len(text) if end < 0 else end + 1
            yield text[at:end]
            at = end


def answer_recall(
    arguments: Mapping[str, Any] | str,
    *,
    vault: Vault,
    allowed: set[str],
    count: Callable[[str], int],
    settings: RecallSettings,
) -> str:
    """The answer to one recall call (see the module docstring); raises :class:`RecallError`."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except (ValueError, RecursionError):
            raise RecallError("the arguments are not a JSON object") from None
    if not isinstance(arguments, Mapping):
        raise RecallError("the arguments are not a JSON object")
    ref = arguments.get("id")
    if not isinstance(ref, str) or not ref.strip():
        raise RecallError("give the id of a [ctxrules:elided ...] marker's ref")
    match = _REF.match(ref.strip())
    if match is None:
        raise RecallError(f"{_shown(ref)} is not a vault id (hex digits, or vault://ID#La-Lb)")
    prefix = match.group(1).lower()
    if len(prefix) < MIN_PREFIX:
        raise RecallError(f"give at least {MIN_PREFIX} hex digits of the id")
    candidates = [vid for vid in allowed if vid.startswith(prefix)]
    if not candidates:
        raise RecallError(f"no marker of this conversation refers to {prefix[:16]}…")
    if len(candidates) > 1:
        raise RecallError(f"{prefix} is ambiguous: give more digits")
    vault_id = candidates[0]
    a, b = _parse_lines(arguments.get("lines"))
    if a is None and b is None and match.group(2):
        a, b = int(match.group(2)), int(match.group(3))
        if a < 1 or b < a:
            raise RecallError(f"{_shown(ref)}: the range #La-Lb needs 1 <= a <= b")
    try:
        data = vault.get(vault_id)
    except VaultError as exc:
        raise RecallError(f"the item {vault_id[:16]}… is missing from the vault: {exc}") from None
    media = vault.media_type(vault_id)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None and (media is None or media.startswith("text/")) and b"\x00" not in data[:8192]:
        # Output with a stray byte that is not UTF-8 (a Latin-1 log): its lines as text, that
        # byte shown as U+FFFD; the line numbers are the markers' (only "\n" ends a line).
        text = data.decode("utf-8", "replace")
    if text is None or (media is not None and not media.startswith("text/")):
        return (
            f"[ctxrules:recall binary item vault://{vault_id}: {len(data)} bytes "
            f"({media or 'an image or other media'}), which cannot be shown as text]"
        )
    lines = _Lines(text)
    first = a or 1
    last = min(b or lines.count, lines.count)
    if first > lines.count:
        raise RecallError(f"the item has {lines.count} line(s); line {first} does not exist")
    out: list[str] = []
    used = 0
    n = first
    for line in lines.starting_at(first):
        if n > last:
            break
        cost = count(line)
        if out and used + cost > settings.budget_tokens:
            break
        if not out and cost > settings.budget_tokens:
            # One line longer than the whole budget: its head, by characters, then a pointer.
            share = max(1, len(line) * settings.budget_tokens // max(cost, 1))
            out.append(line[:share].rstrip("\n"))
            out.append(
                f"\n[ctxrules:recall line {n} is cut after {share} of "
                f"{len(line)} characters: it is longer than the answer budget]"
            )
            n += 1
            break
        out.append(line)
        used += cost
        n += 1
    answer = "".join(out)
    if n <= last:
        remaining = last - n + 1
        if not answer.endswith("\n"):
            answer += "\n"
        answer += f"[ctxrules:elided kind=lines count={remaining} ref=vault://{vault_id}#L{n}-L{last}]"
    return answer
