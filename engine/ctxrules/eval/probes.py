"""Retention probes: facts an agent needs, taken from the original transcript at each call, and
whether the prepared context still holds them.

Probes are extracted from the history *as the agent lived it* (never from what a pack kept), so
every pack and baseline is asked the same questions:

- ``anchor``: the human anchor (first real user message), verbatim;
- ``latest_ask``: the latest real user message, verbatim;
- ``edited_files``: each path a file-edit call named so far;
- ``errors``: the error line of each of the last :data:`LAST_ERRORS` failing tool results;
- ``commands``: the shell commands of the newest :data:`LAST_COMMANDS` steps;
- ``test_status``: the exit status line (or the pass/fail summary line) of the last test run.

A probe is **kept** when its text is in the prepared context (message texts and tool-call
arguments, decoded), **recoverable** when it is not but one ``vault get`` through a marker in
the context gives it back, and **lost** otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ctxrules.eval.shared import shared_prefix
from ctxrules.messages import is_real_user, message_text
from ctxrules.toolroles import ToolRoles, call_arguments, call_name, shell_command
from ctxrules.vault import parse_markers

__all__ = [
    "CATEGORIES",
    "LAST_COMMANDS",
    "LAST_ERRORS",
    "ContextTexts",
    "Probe",
    "ProbeExtractor",
    "Retention",
    "check_probes",
    "context_text",
    "lost_all",
]

CATEGORIES: tuple[str, ...] = (
    "anchor",
    "latest_ask",
    "edited_files",
    "errors",
    "commands",
    "test_status",
)
LAST_ERRORS = 2
LAST_COMMANDS = 3
_PATH_KEYS = ("file_path", "path", "filename", "file", "notebook_path", "target_file")
_TEST_COMMAND = re.compile(
    r"(?:^|[\s;&|(/])(?:pytest|py\.test|tox|nox|unittest|go\s+test|cargo\s+(?:test|nextest)|"
    r"npm\s+(?:run\s+)?test|yarn\s+test|pnpm\s+test|jest|vitest|mocha|rspec|ctest|"
    r"make\s+(?:test|check)|runtests\.py|manage\.py\s+test|gradle\w*\s+test|mvn\s+test)\b"
)
_SUMMARY_LINE = re.compile(r"^.*\b\d+\s+(?:passed|failed|errors?|tests?\s+(?:ran|passed|failed))\b.*$", re.M | re.I)
_ERROR_LINE = re.compile(r"^.*\b(?:error|exception|fatal|failed|failure|traceback|panic)\b.*$", re.M | re.I)
_MIN_PROBE_CHARS = 4


@dataclass(frozen=True)
class Probe:
    category: str
    text: str


@dataclass
class Retention:
    """Per category: probes kept in the context, recoverable through a marker, lost."""

    kept: dict[str, int]
    recoverable: dict[str, int]
    lost: dict[str, int]

    @classmethod
    def empty(cls) -> Retention:
        return cls({c: 0 for c in CATEGORIES}, {c: 0 for c in CATEGORIES}, {c: 0 for c in CATEGORIES})

    def add(self, other: Retention) -> None:
        for c in CATEGORIES:
            self.kept[c] += other.kept[c]
            self.recoverable[c] += other.recoverable[c]
            self.lost[c] += other.lost[c]

    def total(self, category: str | None = None) -> int:
        cats = CATEGORIES if category is None else (category,)
        return sum(self.kept[c] + self.recoverable[c] + self.lost[c] for c in cats)

    def score(self, category: str | None = None, *, recoverable: bool = False) -> float | None:
        """Share of probes kept (or, with ``recoverable``, kept or recoverable)."""
        cats = CATEGORIES if category is None else (category,)
        total = self.total(category)
        if not total:
            return None
        good = sum(self.kept[c] + (self.recoverable[c] if recoverable else 0) for c in cats)
        return good / total

    def as_dict(self) -> dict[str, dict[str, int]]:
        return {c: {"kept": self.kept[c], "recoverable": self.recoverable[c], "lost": self.lost[c]} for c in CATEGORIES}


def _error_line(text: str) -> str:
    match = _ERROR_LINE.search(text)
    line = match.group(0) if match else next((ln for ln in text.splitlines() if ln.strip()), "")
    return line.strip()[:300]


class ProbeExtractor:
    """Walks a transcript once, oldest first, and gives the probes of each history prefix."""

    def __init__(self, messages: Sequence[Mapping[str, Any]], roles: ToolRoles) -> None:
        self.messages = messages
        self.roles = roles
        self._at = 0
        self._anchor: str | None = None
        self._latest: str | None = None
        self._edited: dict[str, None] = {}
        self._errors: list[str] = []
        self._commands: list[str] = []
        self._test_status: str | None = None
        self._calls: dict[str, Mapping[str, Any]] = {}

    def probes(self, end: int) -> list[Probe]:
        """The probes of ``messages[:end]`` (``end`` never decreases between calls)."""
        for msg in self.messages[self._at : end]:
            self._see(msg)
        self._at = max(self._at, end)
        out: list[Probe] = []
        if self._anchor:
            out.append(Probe("anchor", self._anchor))
        if self._latest and self._latest != self._anchor:
            out.append(Probe("latest_ask", self._latest))
        out.extend(Probe("edited_files", p) for p in self._edited)
        out.extend(Probe("errors", e) for e in self._errors[-LAST_ERRORS:])
        out.extend(Probe("commands", c) for c in self._commands[-LAST_COMMANDS:])
        if self._test_status:
            out.append(Probe("test_status", self._test_status))
        return [p for p in out if len(p.text.strip()) >= _MIN_PROBE_CHARS]

    def _see(self, msg: Mapping[str, Any]) -> None:
        role = msg.get("role")
        if is_real_user(msg):
            text = message_text(msg).strip()
            if text:
                if self._anchor is None:
                    self._anchor = text
                self._latest = text
            return
        if role == "assistant":
            for call in msg.get("tool_calls") or []:
                if not isinstance(call, Mapping):
                    continue
                cid = call.get("id")
                if isinstance(cid, str):
                    self._calls[cid] = call
                name = call_name(call)
                tool_role = self.roles.role_of(name)
                if tool_role == "file_edit":
                    args = call_arguments(call)
                    for key in _PATH_KEYS:
                        value = args.get(key)
                        if isinstance(value, str) and value.strip() and "\n" not in value:
                            self._edited.setdefault(value.strip(), None)
                            break
                command = shell_command(call) if tool_role == "shell" else None
                if command:
                    self._commands.append(command.strip())
            return
        if role == "tool":
            text = message_text(msg)
            call = self._calls.get(str(msg.get("tool_call_id")))
            if text and self.roles.is_error(text):
                line = _error_line(text)
                if line:
                    self._errors.append(line)
            command = shell_command(call) if call is not None else None
            if command and _TEST_COMMAND.search(command):
                self._test_status = self._status_line(text)

    def _status_line(self, text: str) -> str | None:
        summaries = _SUMMARY_LINE.findall(text)
        if summaries:
            return str(summaries[-1]).strip()[:300]
        for pattern in self.roles.exit_patterns:
            match = pattern.search(text)
            if match:
                return str(match.group(0)).strip()[:300]
        return None


def context_text(messages: Iterable[Mapping[str, Any]]) -> str:
    """Everything a model reads in ``messages``: texts, tool names and decoded arguments."""
    return "\n".join(map(_message_part, messages))


def _message_part(msg: Mapping[str, Any]) -> str:
    parts = [message_text(msg)]
    for call in msg.get("tool_calls") or []:
        if not isinstance(call, Mapping):
            continue
        fn = call.get("function") or {}
        raw = fn.get("arguments") if isinstance(fn, Mapping) else None
        if isinstance(raw, str):
            parts.append(raw)
        parts.extend(_strings(call_arguments(call)))
    return "\n".join(parts)


class ContextTexts:
    """:func:`context_text` for the requests of one replay, each message's part made once per
    object: a call sends mostly the objects the last one sent, and a replay never edits a
    message in place (a replay of N calls read N²/2 messages). The parts of the prefix a call
    shares with the last one are taken as they are (:func:`shared_prefix`): looking each of
    them up on every call was still N²/4 Python steps."""

    def __init__(self) -> None:
        self._messages: list[Mapping[str, Any]] = []
        self._parts: list[str] = []

    def __call__(self, messages: Sequence[Mapping[str, Any]]) -> str:
        same = shared_prefix(self._messages, messages)
        # What the last call sent past the shared prefix: mostly sent again, further on.
        dropped = {id(m): (m, part) for m, part in zip(self._messages[same:], self._parts[same:], strict=True)}
        parts = self._parts[:same]
        for msg in messages[same:]:
            hit = dropped.get(id(msg))
            parts.append(hit[1] if hit is not None and hit[0] is msg else _message_part(msg))
        self._messages, self._parts = list(messages), parts
        return "\n".join(parts)


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def check_probes(probes: Sequence[Probe], context: str, fetch: Callable[[str], str | None]) -> Retention:
    """Score ``probes`` against ``context``; ``fetch(vault_id)`` reads a marker's vault item
    (None when it cannot)."""
    result = Retention.empty()
    recovered: list[str] | None = None
    for probe in probes:
        if probe.text in context:
            result.kept[probe.category] += 1
            continue
        if recovered is None:
            recovered = []
            for marker in parse_markers(context):
                item = fetch(marker.vault_id)
                if item is not None:
                    recovered.append(item)
        if any(probe.text in item for item in recovered):
            result.recoverable[probe.category] += 1
        else:
            result.lost[probe.category] += 1
    return result


def lost_all(probes: Sequence[Probe]) -> Retention:
    """Every probe lost (a request the provider refuses shows the model nothing)."""
    result = Retention.empty()
    for probe in probes:
        result.lost[probe.category] += 1
    return result
