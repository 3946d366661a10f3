"""Tool roles and tool facts: which role a tool has, what command a shell call ran, which exit
code its result reports, and which call a tool result answers.

Roles come from the pack's ``tools.roles`` (globs, case-sensitive, first role in
:data:`ROLE_ORDER` wins); exit codes from ``tools.exit_code`` regexes (first match wins; the
first group is the code).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from functools import lru_cache
from typing import Any

from ctxrules.patterns import Pattern, PatternTimeout
from ctxrules.patterns import compile as patterns_compile
from ctxrules.structure import pair_tool_calls

ROLE_ORDER: tuple[str, ...] = ("file_read", "file_edit", "shell", "subagent", "search", "browser", "mcp")
# Argument names under which agents pass a shell command.
COMMAND_ARGS: tuple[str, ...] = ("command", "cmd", "script", "commands", "input")
# Text that marks a tool result as an error when no exit code says so.
# (The traceback header ends in ")" and then ":": no word boundary there, so it has none.)
_ERROR_TEXT = re.compile(
    r"(?im)^(?:(?:error|fatal|exception)\b|traceback \(most recent call last\))|<tool_use_error>|\bis_error\b"
)
# Words one of which any match of _ERROR_TEXT holds (``<tool_use_error>`` and ``is_error``
# hold "error"). An ASCII text without them in lower case cannot match, and most tool results
# are such: a substring test spares the regex, which tries every line start and word boundary.
# Only for ASCII: under IGNORECASE a non-ASCII letter can match too ("EXCEPTİON").
_ERROR_WORDS: tuple[str, ...] = ("error", "fatal", "traceback", "exception")


@dataclass(frozen=True)
class ToolRoles:
    """The pack's ``tools:`` section, compiled."""

    roles: tuple[tuple[str, tuple[str, ...]], ...]
    exit_patterns: tuple[Pattern, ...]
    # Tool name -> role, filled as names are met (stages ask for every tool result on every
    # call; hashing this whole object for an lru_cache key would cost more than the lookup).
    _memo: dict[str, str | None] = field(default_factory=dict, compare=False, hash=False, repr=False)
    _errors: dict[str, bool] = field(default_factory=dict, compare=False, hash=False, repr=False)
    # Per exit pattern, a literal every match of it holds (see _literal_hint).
    _hints: tuple[_Hint | None, ...] = field(init=False, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hints", tuple(map(_literal_hint, self.exit_patterns)))

    def role_of(self, tool_name: str | None) -> str | None:
        if not tool_name:
            return None
        try:
            return self._memo[tool_name]
        except KeyError:
            pass
        role = _role_of(self, tool_name)
        if len(self._memo) < 4096:
            self._memo[tool_name] = role
        return role

    def exit_code(self, text: str) -> int | None:
        """The exit code a shell result reports, from the pack's patterns (None if none match).
        A pattern whose literal (_literal_hint) the text lacks is not run: most results name
        no exit code, and each search costs the engine's time limit set up (microseconds)."""
        lower: str | None = None
        for pat, hint in zip(self.exit_patterns, self._hints, strict=True):
            if hint is not None:
                literal, folded = hint
                if not folded:
                    if literal not in text:
                        continue
                elif text.isascii():
                    lower = text.lower() if lower is None else lower
                    if literal not in lower:
                        continue
            try:
                m = pat.search(text)
            except PatternTimeout:  # reported by the pattern's memory; it reads no code
                continue
            if m:
                try:
                    return int(m.group(1))
                except (IndexError, ValueError, TypeError):
                    continue
        return None

    def is_error(self, text: str) -> bool:
        """A tool result that reports failure: a non-zero exit code, else error-looking text.
        Remembered per text (the newest steps' results are asked about on every turn)."""
        try:
            return self._errors[text]
        except KeyError:
            pass
        code = self.exit_code(text)
        failed = code != 0 if code is not None else _error_text(text[:4000])
        if len(self._errors) >= 1024:
            self._errors.clear()
        self._errors[text] = failed
        return failed


_Hint = tuple[str, bool]
"""A literal every match of a pattern holds, and whether it is compared in lower case."""


def _literal_hint(pattern: Pattern) -> _Hint | None:
    """The longest run of literal characters at the top level of ``pattern`` (outside groups,
    alternatives and repeats, so every match holds it), by ``re``'s parse of it: the language
    of pack patterns, and the engines agree with it on literals. Under IGNORECASE the run is
    kept in lower case, only when it is ASCII, and only ASCII text is tested against it (no
    other letter folds to an ASCII one then). None when there is no such run, and for a
    pattern holding ``{`` or ``[:``: the ``regex`` engine that runs it reads ``x{e<=1}`` as
    fuzzy matching and ``[[:digit:]]`` as a class, where ``re`` sees literal characters."""
    from re import _parser  # type: ignore[attr-defined]

    if "{" in pattern.pattern or "[:" in pattern.pattern:
        return None
    try:
        tree = _parser.parse(pattern.pattern, pattern.flags)
    except Exception:  # compiled already, so not expected: then the pattern just runs
        return None
    folded = bool(int(tree.state.flags) & re.IGNORECASE)
    best, run = "", []
    for op, av in (*tree, (None, None)):
        if op is _parser.LITERAL:
            run.append(chr(av))
            continue
        if len(run) > len(best):
            best = "".join(run)
        run = []
    if not best or (folded and not best.isascii()):
        return None
    return (best.lower(), True) if folded else (best, False)


def _error_text(head: str) -> bool:
    """Whether ``head`` looks like an error report (:data:`_ERROR_TEXT`)."""
    if head.isascii():
        lower = head.lower()
        if not any(word in lower for word in _ERROR_WORDS):
            return False
    return _ERROR_TEXT.search(head) is not None


def _role_of(roles: ToolRoles, name: str) -> str | None:
    table = dict(roles.roles)
    for role in ROLE_ORDER:
        if any(fnmatchcase(name, g) for g in table.get(role, ())):
            return role
    return None


RECALL_TOOL = "ctxrules_recall"
"""The recall tool's name when the pack's ``recall.name`` does not set one."""


def tool_roles(pack: Mapping[str, Any]) -> ToolRoles:
    """Compile ``pack['tools']`` (validated already: patterns compile). The recall tool
    (``recall.name``) always has the ``file_read`` role: a recalled output is never reduced.
    Remembered for the last pack object and its ``tools`` and ``recall`` objects (stages ask
    on every turn; a pack's data is not changed once loaded, a reloaded pack is a new object)."""
    global _LAST
    tools, recall = pack.get("tools"), pack.get("recall")
    last = _LAST  # one tuple, replaced whole: another thread's call never mixes into it
    if last is not None and last[0] is pack and last[1] is tools and last[2] is recall:
        return last[3]
    roles = _tool_roles(pack)
    _LAST = (pack, tools, recall, roles)
    return roles


_LAST: tuple[Mapping[str, Any], Any, Any, ToolRoles] | None = None  # see tool_roles


def _tool_roles(pack: Mapping[str, Any]) -> ToolRoles:
    tools = pack.get("tools") or {}
    roles = {k: tuple(v) for k, v in (tools.get("roles") or {}).items()}
    recall = pack.get("recall") or {}
    name = str(recall.get("name", RECALL_TOOL)) if isinstance(recall, Mapping) else RECALL_TOOL
    if name not in roles.get("file_read", ()):
        roles["file_read"] = (*roles.get("file_read", ()), name)
    return _compile(tuple(sorted(roles.items())), tuple(tools.get("exit_code") or ()))


@lru_cache(maxsize=64)
def _compile(roles: tuple[tuple[str, tuple[str, ...]], ...], patterns: tuple[str, ...]) -> ToolRoles:
    return ToolRoles(roles, tuple(patterns_compile(p) for p in patterns))


def call_arguments(call: Mapping[str, Any]) -> dict[str, Any]:
    """A tool call's arguments as a dict ({} when they are not a JSON object)."""
    fn = call.get("function") or {}
    raw = fn.get("arguments") if isinstance(fn, Mapping) else None
    if isinstance(raw, Mapping):
        return dict(raw)
    if isinstance(raw, str):
        try:
            value = json.loads(raw)
        except (ValueError, RecursionError):  # not JSON, or nested past Python's limit
            return {}
        return value if isinstance(value, dict) else {}
    return {}


def call_name(call: Mapping[str, Any]) -> str | None:
    fn = call.get("function") or {}
    name = fn.get("name") if isinstance(fn, Mapping) else None
    return name if isinstance(name, str) else None


def shell_command(call: Mapping[str, Any]) -> str | None:
    """The command line a shell-role call ran, if its arguments name one."""
    args = call_arguments(call)
    for key in COMMAND_ARGS:
        value = args.get(key)
        if isinstance(value, str) and value.strip():
            return value
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            return " ".join(value)
    return None


def calls_by_result(messages: Sequence[Mapping[str, Any]]) -> dict[int, Mapping[str, Any]]:
    """For each tool-result index, the call it answers (pairing as :mod:`ctxrules.messages`)."""
    pairing = pair_tool_calls(messages)
    out: dict[int, Mapping[str, Any]] = {}
    for result_index, (msg_index, pos) in pairing.call_of.items():
        calls = messages[msg_index].get("tool_calls") or []
        if pos < len(calls) and isinstance(calls[pos], Mapping):
            out[result_index] = calls[pos]
    return out
