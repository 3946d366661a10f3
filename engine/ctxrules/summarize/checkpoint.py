"""The deterministic fallback checkpoint: a summary built without any model.

Used when no summarizer model is callable (no credentials), when every call failed or timed out,
when the breaker is open, or when the auditor rejected what the model wrote. It still shrinks the
context, and it is a pure function of the compacted messages (same input, same checkpoint):

- ``user_goal``: the latest real user message (excerpt);
- ``completed_actions``: how many tool calls of which tools the span held, then its last
  actions (shell commands with their exit codes, files read or edited);
- ``errors``: the last failed tool results (exit code or error text) with their first error
  line;
- ``relevant_files``: files the span's calls read, edited or searched, newest first;
- ``key_facts``: what the user said inside the span (excerpts, duplicates once) and the last
  note the assistant wrote.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from ctxrules.messages import is_injected, message_text
from ctxrules.summarize.model import Summary
from ctxrules.toolroles import ToolRoles, call_arguments, call_name, calls_by_result, shell_command
from ctxrules.vault import parse_markers

__all__ = ["build_checkpoint", "excerpt"]

_PATH_KEYS = ("file_path", "path", "filename", "file", "notebook_path", "target_file", "target")
_PATH_LIST_KEYS = ("paths", "files", "file_paths")
_LAST_ACTIONS = 10
_LAST_ERRORS = 5
_MAX_FILES = 20
_USER_NOTES = 8


def excerpt(text: str, limit: int) -> str:
    """``text`` on one line, cut at a word boundary to at most ``limit`` characters."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    cut = flat[: limit - 1]
    space = cut.rfind(" ")
    if space > limit // 2:
        cut = cut[:space]
    return cut + "…"


def _paths(args: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    for key in _PATH_KEYS:
        value = args.get(key)
        if isinstance(value, str) and _looks_like_path(value):
            out.append(value)
    for key in _PATH_LIST_KEYS:
        value = args.get(key)
        if isinstance(value, list):
            out.extend(v for v in value if isinstance(v, str) and _looks_like_path(v))
    return out


def _looks_like_path(value: str) -> bool:
    return 0 < len(value) < 300 and "\n" not in value and not value.startswith(("http://", "https://"))


_ERROR_LINE = re.compile(r"(?im)^.*\b(?:error|exception|fatal|failed|failure|traceback|panic)\b.*$")


def _error_line(text: str) -> str:
    match = _ERROR_LINE.search(text)
    line = match.group(0) if match else next((ln for ln in text.splitlines() if ln.strip()), "")
    return excerpt(line, 240)


def build_checkpoint(span: Sequence[Mapping[str, Any]], *, user_messages: Sequence[str], roles: ToolRoles) -> Summary:
    """The checkpoint of the compacted ``span`` (ctxrules' own injected messages are skipped).

    ``user_messages`` are the texts of every real user message of the conversation, oldest
    first (the latest one is the goal).
    """
    counts: Counter[str] = Counter()
    actions: list[str] = []
    action_of: dict[str, int] = {}  # call id -> index in actions
    edited: list[str] = []
    files: list[str] = []
    results = calls_by_result(span)
    errors: list[str] = []
    said: list[str] = []
    said_set: set[str] = set()
    last_note = ""
    pointers = 0
    for index, msg in enumerate(span):
        if is_injected(msg):
            # Earlier summaries, bridges, placeholders of other stages: not the conversation,
            # but their pointers still lead to what they replaced.
            pointers += len(parse_markers(message_text(msg)))
            continue
        role = msg.get("role")
        if role == "user":
            text = message_text(msg).strip()
            if text and text not in said_set:  # a set beside the list: 10,000 user messages
                said_set.add(text)
                said.append(text)
        elif role == "assistant":
            text = message_text(msg).strip()
            if text:
                last_note = text
            for call in msg.get("tool_calls") or []:
                if not isinstance(call, Mapping):
                    continue
                name = call_name(call) or "unknown"
                counts[name] += 1
                role_name = roles.role_of(name)
                paths = _paths(call_arguments(call))
                command = shell_command(call) if role_name == "shell" else None
                files.extend(paths)
                if role_name == "file_edit":
                    edited.extend(paths)
                cid = call.get("id")
                if isinstance(cid, str):
                    action_of[cid] = len(actions)
                actions.append(_describe(name, role_name, command, paths))
        elif role == "tool":
            call = results.get(index)
            name = (call_name(call) if call is not None else None) or "tool"
            is_shell = roles.role_of(name) == "shell"
            command = shell_command(call) if call is not None and is_shell else None
            text = message_text(msg)
            code = roles.exit_code(text) if is_shell else None
            cid = call.get("id") if call is not None else None
            if code is not None and isinstance(cid, str) and cid in action_of:
                actions[action_of[cid]] += f" (exit {code})"
            if roles.is_error(text):
                what = f"`{excerpt(command, 120)}`" if command else name
                exit_part = f" (exit {code})" if code is not None else ""
                errors.append(f"{what} failed{exit_part}: {_error_line(text)}")
    completed: list[str] = []
    if counts:
        total = sum(counts.values())
        tally = ", ".join(f"{name} x{n}" for name, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
        completed.append(f"{total} tool calls in the compacted messages: {tally}")
    completed.extend(actions[-_LAST_ACTIONS:])
    if not completed:
        completed.append(f"Compacted {len(span)} earlier messages (no tool calls).")
    newest_first: list[str] = []
    for path in reversed(files):
        label = f"{path} (edited)" if path in edited else path
        if path not in {p.split(" (edited)")[0] for p in newest_first}:
            newest_first.append(label)
    facts = [f"User said: «{excerpt(t, 300)}»" for t in said[-_USER_NOTES:]]
    if last_note:
        facts.append(f"Last assistant note: {excerpt(last_note, 400)}")
    if pointers:
        facts.append(
            f"The compacted messages held {pointers} vault pointers of earlier compactions; "
            "they are kept in the vault entry of this summary."
        )
    goal_source = next((t for t in reversed(user_messages) if t.strip()), "")
    goal = (
        f"Latest user message: «{excerpt(goal_source, 400)}»"
        if goal_source
        else "No user message: continue the agent's task as described in the system prompt."
    )
    return Summary(
        user_goal=goal,
        completed_actions=tuple(completed),
        errors=tuple(errors[-_LAST_ERRORS:]),
        relevant_files=tuple(newest_first[:_MAX_FILES]),
        key_facts=tuple(facts),
    )


def _describe(name: str, role: str | None, command: str | None, paths: Sequence[str]) -> str:
    if command:
        return f"ran `{excerpt(command, 160)}`"
    if role == "file_edit" and paths:
        return f"edited {', '.join(paths[:3])}"
    if role == "file_read" and paths:
        return f"read {', '.join(paths[:3])}"
    if paths:
        return f"{name} on {', '.join(paths[:3])}"
    return f"called {name}"
