"""What the summarizer model is asked: instructions, the previous summary, the user's own words,
and the compacted span as a compact transcript — trimmed to fit the model's window.

The transcript shortens what a summary does not need verbatim: tool outputs keep their head and
tail (:data:`TOOL_HEAD`/:data:`TOOL_TAIL` characters), tool-call arguments and long messages are
cut. Everything is redacted before it is sent (the caller passes a redactor), so a summarizer
endpoint never receives the credentials the conversation happened to contain.

Trimming (the auxiliary-ratio guard's ``trim``): when the prompt is over budget, older
transcript entries are dropped from the middle (the first two and the newest are kept, with a
line saying how many were left out); the user messages list is cut to its newest entries last.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ctxrules.messages import injected_kind, is_injected, message_text
from ctxrules.summarize.model import FIELDS, Summary, field_descriptions, list_limit
from ctxrules.toolroles import call_name, calls_by_result

__all__ = [
    "TOOL_HEAD",
    "TOOL_TAIL",
    "SummaryPrompt",
    "build_prompt",
    "render_entries",
    "system_prompt",
]

TOOL_HEAD = 700
TOOL_TAIL = 500
MESSAGE_CHARS = 3000
ARGS_CHARS = 400
USER_CHARS = 1500
NEWEST_USER_CHARS = 4000


def system_prompt() -> str:
    """The instructions, listing the 14 fields with the schema's descriptions."""
    lines = []
    for name, description in field_descriptions().items():
        kind = "string" if name == "user_goal" else "array of strings"
        limit = list_limit(name) if name != "user_goal" else None
        cap = f", at most {limit}" if limit is not None and limit < 100 else ""
        lines.append(f'- "{name}" ({kind}{cap}): {description}')
    fields = "\n".join(lines)
    return (
        "You compact the history of an AI agent's conversation. Your summary replaces the "
        "messages shown under CONVERSATION in the agent's context, so the agent must be able "
        "to continue its work from the summary alone.\n\n"
        "Answer with exactly one JSON object and nothing else: no prose, no code fences. It has "
        f"exactly these {len(FIELDS)} keys, each present (use [] or a short string when there is "
        f"nothing to say):\n{fields}\n\n"
        "Rules:\n"
        "- user_goal states what the user wants now, anchored in the NEWEST user message (listed "
        "last under USER MESSAGES); reuse the user's own words.\n"
        "- Only report requests a user message actually makes; never invent goals, asks or "
        "constraints.\n"
        "- When a PREVIOUS SUMMARY is given, fold it in: keep what still holds, and when one of "
        "its blocked_items is resolved or one of its next_steps is done, leave it out of those "
        "lists and copy its text into completed_actions.\n"
        "- Be specific: exact file paths, commands, error messages, names and numbers.\n"
        "- Keep pointers of the form [ctxrules:elided ...] exactly as written when the content "
        "they point to matters.\n"
        "- Never copy secrets (keys, tokens, passwords) or personal data; text such as "
        "[REDACTED:...] stays as it is.\n"
        "- Entries are short self-contained sentences, one fact each."
    )


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f" …[{len(text) - limit} more chars]"


def _head_tail(text: str, head: int = TOOL_HEAD, tail: int = TOOL_TAIL) -> str:
    if len(text) <= head + tail + 40:
        return text
    return f"{text[:head]}\n…[{len(text) - head - tail} chars omitted]…\n{text[-tail:]}"


def render_entries(
    span: Sequence[Mapping[str, Any]], *, redact: Callable[[str], str] = str, first_index: int = 0
) -> list[str]:
    """One transcript entry per message of ``span``; ``first_index`` is the index of its first
    message in the full list (entries are numbered by it)."""
    calls = calls_by_result(span)
    entries: list[str] = []
    for offset, msg in enumerate(span):
        index = first_index + offset
        role = str(msg.get("role"))
        text = message_text(msg)
        if is_injected(msg) and injected_kind(msg) == "summary":
            entries.append(f"#{index} [earlier summary]\n{redact(_cut(text, MESSAGE_CHARS * 2))}")
            continue
        if role == "tool":
            call = calls.get(offset)
            name = (call_name(call) if call is not None else None) or "tool"
            entries.append(f"#{index} [tool result: {name}]\n{redact(_head_tail(text))}")
            continue
        parts = [f"#{index} [{role}]"]
        if text.strip():
            parts.append(redact(_cut(text, MESSAGE_CHARS)))
        for call in msg.get("tool_calls") or []:
            if not isinstance(call, Mapping):
                continue
            function = call.get("function") or call.get("custom") or {}
            called = function.get("name") if isinstance(function, Mapping) else None
            args = function.get("arguments", function.get("input")) if isinstance(function, Mapping) else None
            if not isinstance(args, str):
                args = json.dumps(args, ensure_ascii=False) if args is not None else ""
            parts.append(f"-> calls {called}: {redact(_cut(args, ARGS_CHARS))}")
        entries.append("\n".join(parts))
    return entries


@dataclass(frozen=True)
class SummaryPrompt:
    """The messages to send, and what trimming left out."""

    messages: list[dict[str, str]]
    tokens: int
    entries_total: int
    entries_dropped: int


def _users_block(user_messages: Sequence[str], redact: Callable[[str], str], keep: int) -> str:
    shown = list(user_messages)[-keep:] if keep else []
    omitted = len(user_messages) - len(shown)
    lines = [f"({omitted} older user messages not shown)"] if omitted else []
    for n, text in enumerate(shown, 1):
        limit = NEWEST_USER_CHARS if n == len(shown) else USER_CHARS
        label = "NEWEST" if n == len(shown) else str(n + omitted)
        lines.append(f"[{label}] {redact(_cut(text, limit))}")
    return "\n".join(lines) if lines else "(no user message)"


def build_prompt(
    entries: Sequence[str],
    *,
    user_messages: Sequence[str],
    previous: Summary | None,
    count: Callable[[str], int],
    budget: int | None,
    redact: Callable[[str], str] = str,
    span_note: str = "",
) -> SummaryPrompt:
    """The summarizer's messages, trimmed to ``budget`` prompt tokens (``None``: no limit)."""
    system = system_prompt()
    previous_block = (
        "PREVIOUS SUMMARY (fold it in):\n" + json.dumps(previous.as_dict(), ensure_ascii=False, indent=1)
        if previous is not None
        else ""
    )
    keep_users = len(user_messages)

    def assemble(kept: Sequence[str], dropped: int, users_keep: int) -> tuple[list[dict[str, str]], int]:
        transcript = list(kept)
        if dropped:
            position = min(2, len(transcript))
            transcript.insert(position, f"…[{dropped} messages omitted to fit the summarizer's window]…")
        blocks = [
            b
            for b in (
                previous_block,
                "USER MESSAGES (verbatim, oldest first):\n" + _users_block(user_messages, redact, users_keep),
                f"CONVERSATION{(' ' + span_note) if span_note else ''}:\n" + "\n\n".join(transcript),
                "Write the JSON summary now.",
            )
            if b
        ]
        user = "\n\n".join(blocks)
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        return messages, count(system) + count(user) + 16

    messages, tokens = assemble(entries, 0, keep_users)
    if budget is None or tokens <= budget:
        return SummaryPrompt(messages, tokens, len(entries), 0)
    # Drop from the middle: keep the first two entries (how the span began) and the newest.
    head = list(entries[:2])
    tail = list(entries[2:])
    dropped = 0
    while tail and tokens > budget:
        # Remove in chunks proportional to the overshoot, so long spans trim in a few passes.
        share = max(1, int(len(tail) * min(0.5, (tokens - budget) / max(tokens, 1) + 0.05)))
        tail = tail[share:]
        dropped += share
        messages, tokens = assemble([*head, *tail], dropped, keep_users)
    while tokens > budget and keep_users > 1:
        keep_users = max(1, keep_users // 2)
        messages, tokens = assemble([*head, *tail], dropped, keep_users)
    while tokens > budget and head:
        head = head[:-1]
        dropped += 1
        messages, tokens = assemble([*head, *tail], dropped, keep_users)
    return SummaryPrompt(messages, tokens, len(entries), dropped)
