"""The summary as the model reads it, and the messages that carry it.

The summary replaces the compacted span as **one assistant message** right after the human
anchor. Its text opens with a ``<ctxrules:summary ...>`` tag (and the message carries the
metadata key ``ctxrules``), then the elision marker of the span, then the fields in schema
order: ``blocked_items`` and ``next_steps`` come last, where a long context is read most
reliably. Empty fields are left out.

Role alternation (OpenAI accepts any order; Anthropic wants user and assistant turns to
alternate, starting with a user turn):

- before the summary sits the anchor (a user message). Without an anchor (an agent that
  started on its own), a short marked **bridge** user turn goes before the summary;
- after the summary, when the next kept message is an assistant message, a short marked
  bridge user turn goes between them (rather than folding the summary into that message,
  which may be pinned and must stay unchanged).

Bridges are injected messages (``kind: summary-bridge``), so they are never taken for a real
user message, and a later compaction removes them with the span.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ctxrules.messages import mark_injected
from ctxrules.summarize.model import Summary

__all__ = [
    "BRIDGE_KIND",
    "SUMMARY_KIND",
    "bridge_message",
    "parse_rendered",
    "render_summary",
    "summary_message",
]

SUMMARY_KIND = "summary"
BRIDGE_KIND = "summary-bridge"

_TITLES: dict[str, str] = {
    "constraints": "Constraints",
    "active_tasks": "Active tasks",
    "completed_actions": "Completed actions",
    "errors": "Errors",
    "decisions": "Decisions",
    "open_questions": "Open questions",
    "relevant_files": "Relevant files",
    "key_facts": "Key facts",
    "tool_state": "Tool state",
    "pending_user_asks": "Pending user asks",
    "risks": "Risks",
    "blocked_items": "Blocked items",
    "next_steps": "Next steps",
}


def _one_line(text: str) -> str:
    # Entries are rendered one per line; an entry's own line breaks would break the layout.
    return " ".join(text.split())


def render_summary(summary: Summary) -> str:
    """The fields as text: goal first, then every non-empty list; next steps numbered."""
    lines = [f"User goal: {_one_line(summary.user_goal)}"]
    for name, title in _TITLES.items():
        items = getattr(summary, name)
        if not items:
            continue
        lines.append("")
        lines.append(f"{title}:")
        for n, item in enumerate(items, 1):
            bullet = f"{n}." if name == "next_steps" else "-"
            lines.append(f"{bullet} {_one_line(item)}")
    return "\n".join(lines)


def _attr(value: object) -> str:
    text = str(value).replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;")
    return f'"{text}"'


def summary_message(
    summary: Summary,
    *,
    marker: str,
    source: str,
    removed: int,
    model: str | None = None,
    extra_meta: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The assistant message that replaces a compacted span.

    ``marker`` is the elision marker of the span (``[ctxrules:elided kind=message ...]``);
    ``source`` is ``llm`` or ``checkpoint``; ``removed`` the number of messages it replaces.
    """
    attrs = {"id": summary.id, "source": source, "messages": removed}
    if model:
        attrs["model"] = model
    head = "<ctxrules:summary " + " ".join(f"{k}={_attr(v)}" for k, v in attrs.items()) + ">"
    note = (
        "Summary of the earlier conversation. ctxrules compacted those messages; the originals "
        "are in the vault at the pointer above."
    )
    text = f"{head}\n{marker}\n{note}\n\n{render_summary(summary)}\n</ctxrules:summary>"
    meta: dict[str, Any] = {"id": summary.id, "source": source, "messages": removed}
    if model:
        meta["model"] = model
    meta.update(extra_meta or {})
    return mark_injected({"role": "assistant", "content": text}, SUMMARY_KIND, **meta)


def bridge_message(position: str) -> dict[str, Any]:
    """The marked user turn that keeps roles alternating around a summary.

    ``position`` is ``before`` (no anchor precedes the summary) or ``after`` (an assistant
    message follows it).
    """
    if position == "before":
        text = "(The conversation so far was compacted; its summary follows.)"
    elif position == "after":
        text = "(End of the summary; the conversation continues with the messages kept after it.)"
    else:
        raise ValueError(f"bridge position must be 'before' or 'after', got {position!r}")
    body = f'<ctxrules:{BRIDGE_KIND} position="{position}">\n{text}\n</ctxrules:{BRIDGE_KIND}>'
    return mark_injected({"role": "user", "content": body}, BRIDGE_KIND, position=position)


_REVERSE_TITLES = {title: name for name, title in _TITLES.items()}
_BULLET = re.compile(r"^(?:-|\d+\.)\s+(.*)$")


def parse_rendered(text: str) -> Summary | None:
    """The summary a :func:`summary_message` text renders (entries come back on one line each),
    or ``None`` when ``text`` is not such a rendering. Lets a later compaction fold in an
    earlier summary even when the session state that stored it is gone."""
    lines = text.splitlines()
    goal_at = next((i for i, line in enumerate(lines) if line.startswith("User goal: ")), None)
    if goal_at is None:
        return None
    values: dict[str, Any] = {"user_goal": lines[goal_at][len("User goal: ") :].strip()}
    current: str | None = None
    for line in lines[goal_at + 1 :]:
        if line.startswith("</ctxrules:summary"):
            break
        if line.endswith(":") and line[:-1] in _REVERSE_TITLES:
            current = _REVERSE_TITLES[line[:-1]]
            values[current] = []
            continue
        match = _BULLET.match(line)
        if current is not None and match:
            values[current].append(match.group(1))
    if not values["user_goal"]:
        return None
    return Summary.from_dict(values)
