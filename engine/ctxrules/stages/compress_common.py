"""What ``compress.dedup``, ``compress.truncate``, ``compress.remove`` and ``compress.emergency``
share: the view of the messages they decide on, the order in which they pick candidates, the
anti-thrashing guard, and the two primitives that make content leave the context (head + tail
cuts and removed-step placeholders).

Eligibility (docs/reference/concepts.md): a message may be compressed when it is not **pinned**; the
regular stages also skip **protected** messages (``ctx.protected``: intent matches),
``critical`` ones (the pack's ``priorities:``) and the **tail** (the newest steps that fit in
``context.tail_budget`` of the usable window). The emergency pass ignores all of that except
the pins.

Order: ``standard`` before ``important``, oldest first within a priority (the emergency pass
then goes on to protected/critical messages, and to the tail last).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ctxrules.json_stream import known_value, list_pieces, remember_value
from ctxrules.messages import (
    injected_kind,
    is_injected,
    keep_mark,
    mark_injected,
    message_text,
    replace_text,
)
from ctxrules.priorities import Priority, priority_rank, priority_rules
from ctxrules.stages.base import Action, Message
from ctxrules.structure import Step, pinned_indices, steps
from ctxrules.toolroles import call_name
from ctxrules.vault import VaultError, format_marker, parse_markers

if TYPE_CHECKING:
    from ctxrules.pipeline.context import StageContext

__all__ = [
    "GUARD_OPTIONS",
    "OWNED_KINDS",
    "PLACEHOLDER_KIND",
    "Cut",
    "Edit",
    "RemovalPlan",
    "ThrashGuard",
    "View",
    "apply_edits",
    "argument_strings",
    "cut_text",
    "is_placeholder",
    "line_count",
    "restore_placeholder",
    "text_id",
    "truncate_arguments",
    "truncate_message",
]

PLACEHOLDER_KIND = "removed"
"""Injected kind of the message that stands for a run of removed steps."""

OWNED_KINDS = frozenset({"notes", "summary", "summary-bridge", PLACEHOLDER_KIND})
"""Injected messages the regular stages leave alone: the notes and summary stages re-render
theirs (``summarize.structured`` writes a ``summary`` and its ``summary-bridge``), and
placeholders are already as small as a removal gets. The emergency pass may still take them."""

_RESULT_ROLES = frozenset({"tool", "function"})
_TEXT_ERRORS = "surrogatepass"
# Below this many characters a cut is not worth its marker (~45 tokens).
_MIN_ELIDED_CHARS = 400
# A placeholder's tokens before its vault id is known (the id's hex costs 30-45 tokens);
# the real count is taken once the run is built, so this only steers the planning.
_PLACEHOLDER_ESTIMATE = 90


def line_count(text: str) -> int:
    """Lines as the vault counts them (only ``\\n`` ends a line; no empty last line)."""
    if not text:
        return 0
    return text.count("\n") + (0 if text.endswith("\n") else 1)


def text_id(text: str) -> str:
    """The vault id ``text`` will get (sha256 of its UTF-8 bytes), without storing it."""
    return hashlib.sha256(text.encode("utf-8", _TEXT_ERRORS)).hexdigest()


# --- the view ---------------------------------------------------------------------------------


@dataclass
class View:
    """Facts about one message list that every compress stage decides on, computed once."""

    messages: list[Message]
    counts: list[int]
    total: int
    priorities: list[Priority]
    pinned: frozenset[int]
    protected: list[bool]
    steps: list[Step]
    step_of: dict[int, int]
    tail_start: int

    @classmethod
    def build(cls, messages: Sequence[Message], ctx: StageContext) -> View:
        listed = list(messages)
        counts = ctx.counter.count_each(listed)
        all_steps = steps(listed)
        step_of = {i: n for n, step in enumerate(all_steps) for i in step.indices}
        priorities = priority_rules(ctx.pack).evaluate(listed)
        protected = [id(m) in ctx.protected for m in listed]
        return cls(
            messages=listed,
            counts=counts,
            total=ctx.count(listed),
            priorities=priorities,
            pinned=pinned_indices(listed),
            protected=protected,
            steps=all_steps,
            step_of=step_of,
            tail_start=_tail_start(all_steps, counts, ctx.budget.tail_tokens),
        )

    def guarded(self, index: int) -> bool:
        """Protected by intent or ``critical`` by priority: only the emergency pass may touch it."""
        return self.protected[index] or self.priorities[index] == "critical"

    def eligible(self, index: int, *, force: bool = False) -> bool:
        """May a stage change this message? ``force`` is the emergency pass (pins only)."""
        if index in self.pinned:
            return False
        if force:
            return True
        return not self.guarded(index) and index < self.tail_start

    def order_key(self, index: int, *, force: bool = False) -> tuple[int, int, int]:
        """Sort key: standard before important (before guarded, before the tail: emergency
        only), oldest first."""
        rank = priority_rank(self.priorities[index])
        if force and self.protected[index]:
            rank = max(rank, 2)
        in_tail = 1 if force and index >= self.tail_start else 0
        return (in_tail, rank, index)

    def below(self, tokens: int, tier: str, ctx: StageContext) -> bool:
        """``ctx.below`` for a token count instead of a message list."""
        return ctx.budget.utilization(tokens) < ctx.budget.thresholds[tier]


def _tail_start(all_steps: list[Step], counts: list[int], tail_tokens: int) -> int:
    """Index where the tail begins: the newest steps whose messages (and whatever lies between
    them) fit in ``tail_tokens``; the newest step always belongs to it."""
    n = len(counts)
    if not all_steps:
        return n
    suffix = [0] * (n + 1)
    for i in range(n - 1, -1, -1):
        suffix[i] = suffix[i + 1] + counts[i]
    start = all_steps[-1].start
    for step in reversed(all_steps[:-1]):
        if suffix[step.start] > tail_tokens:
            break
        start = step.start
    return start


# --- anti-thrashing -----------------------------------------------------------------------------

GUARD_OPTIONS: dict[str, Any] = {
    "min_saving_tokens": {
        "title": "Minimum saving (tokens)",
        "description": "Skip a cycle that would save fewer tokens than this (anti-thrashing: a "
        "small compaction is not worth a broken prompt-cache prefix). The "
        "effective minimum is the larger of this and min_saving_ratio.",
        "type": "integer",
        "minimum": 0,
        "default": 0,
    },
    "min_saving_ratio": {
        "title": "Minimum saving (share of the usable window)",
        "description": "Skip a cycle that would save less than this share of the usable window (0.02 = 2%).",
        "type": "number",
        "minimum": 0,
        "maximum": 0.5,
        "default": 0.02,
    },
    "warn_after": {
        "title": "Warn after N ineffective cycles",
        "description": "Add a warning to the report once this many consecutive cycles were skipped as ineffective.",
        "type": "integer",
        "minimum": 1,
        "default": 3,
    },
}


@dataclass(frozen=True)
class ThrashGuard:
    """Skips cycles that would save too little and counts them in the stage state.

    State keys: ``ineffective_streak`` (consecutive skipped cycles, reset by an effective
    one), ``ineffective_total`` and ``effective_total``.
    """

    min_tokens: int = 0
    min_ratio: float = 0.02
    warn_after: int = 3

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> ThrashGuard:
        return cls(
            int(options.get("min_saving_tokens", 0)),
            float(options.get("min_saving_ratio", 0.02)),
            int(options.get("warn_after", 3)),
        )

    def minimum(self, ctx: StageContext) -> int:
        return max(self.min_tokens, math.ceil(self.min_ratio * ctx.budget.usable))

    def check(self, saved: int, ctx: StageContext, what: str) -> tuple[bool, list[Action], list[str]]:
        """``(go, actions, warnings)``: whether to apply a cycle that saves ``saved`` tokens."""
        minimum = self.minimum(ctx)
        state = ctx.state
        if saved > 0 and saved >= minimum:
            state["ineffective_streak"] = 0
            state["effective_total"] = int(state.get("effective_total", 0)) + 1
            return True, [], []
        streak = int(state.get("ineffective_streak", 0)) + 1
        state["ineffective_streak"] = streak
        state["ineffective_total"] = int(state.get("ineffective_total", 0)) + 1
        detail = (
            f"skipped: {what} would save {saved} tokens, less than the minimum of "
            f"{minimum} (ineffective cycle {streak} in a row, "
            f"{state['ineffective_total']} in this session)"
        )
        warnings = []
        if streak >= self.warn_after:
            warnings.append(
                f"{streak} consecutive ineffective compression cycles: {what} keeps "
                f"saving less than {minimum} tokens; the remaining content is "
                "protected, critical, pinned or in the tail"
            )
        return False, [Action("ineffective", detail, tokens_saved=0)], warnings


# --- edits --------------------------------------------------------------------------------------


@dataclass
class Edit:
    """One message replaced by a shorter one; ``stored`` goes to the vault when applied."""

    index: int
    message: Message
    saved: int
    stored: list[str]
    kind: str
    detail: str


def apply_edits(
    messages: Sequence[Message], edits: Sequence[Edit], ctx: StageContext
) -> tuple[list[Message], list[Action]]:
    """The new list (unchanged messages are the same objects) and one action per edit."""
    out = list(messages)
    actions: list[Action] = []
    for edit in edits:
        ids = [ctx.vault.put_text(text) for text in edit.stored]
        out[edit.index] = keep_mark(messages[edit.index], edit.message)
        actions.append(
            Action(edit.kind, edit.detail, index=edit.index, tokens_saved=edit.saved, vault_id=ids[0] if ids else None)
        )
    return out, actions


# --- head + tail cuts ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Cut:
    """``text`` shortened: ``new`` holds head, marker and tail; ``stored`` is the full
    original (the vault copy the marker points at)."""

    new: str
    stored: str
    elided: int
    unit: str


def cut_text(
    text: str, head_tokens: int, tail_tokens: int, chars_per_token: float, count_text: Any = None
) -> Cut | None:
    """Keep about ``head_tokens`` at the start and ``tail_tokens`` at the end of ``text``.

    Whole lines are kept when the text has lines short enough: the marker line
    ``[ctxrules:elided kind=lines count=N ref=vault://<id>#L<a>-L<b>]`` replaces lines a..b of
    the original, which the vault holds in full (so ``vault get ID --lines a:b`` gives back
    exactly what was cut). Otherwise (one long line, minified JSON) characters are cut and the
    marker ``kind=tokens`` carries ``chars=<a>-<b>`` (1-based, inclusive) on its own line.
    ``None`` when the cut would save too little to be worth a marker.
    """
    head_chars = max(0, int(head_tokens * chars_per_token))
    tail_chars = max(0, int(tail_tokens * chars_per_token))
    if len(text) - head_chars - tail_chars < _MIN_ELIDED_CHARS:
        return None
    vault_id = text_id(text)
    lines = text.split("\n")
    # Re-attach the terminators: line k (1-based) ends with "\n" unless it is the last one.
    with_ends = [line + "\n" for line in lines[:-1]]
    if lines[-1]:
        with_ends.append(lines[-1])
    head_n, used = 0, 0
    while head_n < len(with_ends) and used + len(with_ends[head_n]) <= head_chars:
        used += len(with_ends[head_n])
        head_n += 1
    tail_n, used_tail = 0, 0
    while tail_n < len(with_ends) - head_n and used_tail + len(with_ends[-1 - tail_n]) <= tail_chars:
        used_tail += len(with_ends[-1 - tail_n])
        tail_n += 1
    elided_lines = with_ends[head_n : len(with_ends) - tail_n]
    elided_chars = sum(len(line) for line in elided_lines)
    # Lines mode only when whole lines keep a fair share of the budget; a 20 KB single line
    # would otherwise leave nothing to read.
    if elided_lines and elided_chars >= _MIN_ELIDED_CHARS and used + used_tail >= 0.5 * (head_chars + tail_chars):
        first, last = head_n + 1, head_n + len(elided_lines)
        marker = format_marker("lines", len(elided_lines), vault_id, lines=(first, last))
        ending = "\n" if elided_lines[-1].endswith("\n") else ""
        kept_tail = "".join(with_ends[len(with_ends) - tail_n :])
        new = "".join(with_ends[:head_n]) + marker + ending + kept_tail
        return Cut(new, text, len(elided_lines), "lines")
    head = _soft_cut_head(text, head_chars)
    tail_begin = _soft_cut_tail(text, len(text) - tail_chars, len(head))
    elided = text[len(head) : tail_begin]
    if len(elided) < _MIN_ELIDED_CHARS:
        return None
    tokens = int(count_text(elided)) if callable(count_text) else math.ceil(len(elided) / chars_per_token)
    marker = format_marker("tokens", tokens, vault_id, chars=f"{len(head) + 1}-{tail_begin}")
    return Cut(f"{head}\n{marker}\n{text[tail_begin:]}", text, int(tokens), "tokens")


def _soft_cut_head(text: str, limit: int) -> str:
    """``text[:limit]``, moved back to a whitespace boundary when one is near."""
    cut = text[:limit]
    space = max(cut.rfind(" "), cut.rfind("\n"))
    if space >= int(limit * 0.8):
        return cut[: space + 1]
    return cut


def _soft_cut_tail(text: str, begin: int, floor: int) -> int:
    """Start of the kept tail: ``begin``, moved forward to a whitespace boundary when near."""
    begin = max(begin, floor)
    window = text[begin : begin + max(1, (len(text) - begin) // 5)]
    for i, ch in enumerate(window):
        if ch in " \n":
            return begin + i + 1
    return begin


def _chars_per_token(msg: Mapping[str, Any], tokens: int) -> float:
    chars = len(message_text(msg)) + sum(len(a) for a in argument_strings(msg))
    return max(1.0, chars / max(1, tokens - 4))


def argument_strings(msg: Mapping[str, Any]) -> list[str]:
    calls = msg.get("tool_calls")
    out: list[str] = []
    if isinstance(calls, list):
        for call in calls:
            fn = call.get("function") if isinstance(call, Mapping) else None
            args = fn.get("arguments") if isinstance(fn, Mapping) else None
            if isinstance(args, str):
                out.append(args)
    return out


def truncate_message(
    msg: Message, tokens: int, *, max_tokens: int, head_tokens: int, tail_tokens: int, count_text: Any
) -> tuple[Message, list[str], int] | None:
    """``msg`` with its long text and long tool-call argument strings cut to head + tail.

    Returns ``(new message, vault payloads, pieces cut)`` or ``None`` when nothing is long
    enough. The text is cut when it is over ``max_tokens``; in tool-call arguments (JSON),
    every string value over ``max_tokens`` is cut on its own and the JSON re-serialized, so the
    arguments stay valid JSON.
    """
    cpt = _chars_per_token(msg, tokens)
    limit_chars = max_tokens * cpt
    stored: list[str] = []
    new: Message = msg
    text = message_text(msg)
    if len(text) > limit_chars:
        cut = cut_text(text, head_tokens, tail_tokens, cpt, count_text)
        if cut is not None:
            new = replace_text(new, cut.new)
            stored.append(cut.stored)
    new_calls = _truncated_calls(msg, limit_chars, head_tokens, tail_tokens, cpt, count_text, stored)
    if new_calls is not None:
        new = {**new, "tool_calls": new_calls}
    if new is msg:
        return None
    return new, stored, len(stored)


def truncate_arguments(
    msg: Message, tokens: int, *, max_tokens: int, head_tokens: int, tail_tokens: int, count_text: Any
) -> tuple[Message, list[str]] | None:
    """``msg`` with only its tool-call argument strings cut as :func:`truncate_message` cuts
    them (every JSON string value over ``max_tokens``); ``None`` when none is that long."""
    stored: list[str] = []
    cpt = _chars_per_token(msg, tokens)
    new_calls = _truncated_calls(msg, max_tokens * cpt, head_tokens, tail_tokens, cpt, count_text, stored)
    return None if new_calls is None else ({**msg, "tool_calls": new_calls}, stored)


def _truncated_calls(
    msg: Mapping[str, Any], limit_chars: float, head: int, tail: int, cpt: float, count_text: Any, stored: list[str]
) -> list[Any] | None:
    calls = msg.get("tool_calls")
    if not isinstance(calls, list) or not any(len(a) > limit_chars for a in argument_strings(msg)):
        return None
    new_calls: list[Any] = []
    changed = False
    for call in calls:
        replaced = _truncate_call(call, limit_chars, head, tail, cpt, count_text, stored)
        changed = changed or replaced is not call
        new_calls.append(replaced)
    return new_calls if changed else None


def _truncate_call(
    call: Any, limit_chars: float, head: int, tail: int, cpt: float, count_text: Any, stored: list[str]
) -> Any:
    fn = call.get("function") if isinstance(call, Mapping) else None
    raw = fn.get("arguments") if isinstance(fn, Mapping) else None
    if not isinstance(raw, str) or len(raw) <= limit_chars:
        return call
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return call  # not JSON: cutting it could only make it worse for the provider
    before = len(stored)
    shortened = _truncate_json(value, limit_chars, head, tail, cpt, count_text, stored)
    if len(stored) == before:
        return call
    assert isinstance(fn, Mapping)
    return {**call, "function": {**fn, "arguments": json.dumps(shortened, ensure_ascii=False)}}


def _truncate_json(
    value: Any, limit_chars: float, head: int, tail: int, cpt: float, count_text: Any, stored: list[str]
) -> Any:
    if isinstance(value, str):
        if len(value) <= limit_chars:
            return value
        cut = cut_text(value, head, tail, cpt, count_text)
        if cut is None:
            return value
        stored.append(cut.stored)
        return cut.new
    if isinstance(value, dict):
        return {k: _truncate_json(v, limit_chars, head, tail, cpt, count_text, stored) for k, v in value.items()}
    if isinstance(value, list):
        return [_truncate_json(v, limit_chars, head, tail, cpt, count_text, stored) for v in value]
    return value


# --- removal ------------------------------------------------------------------------------------


def is_placeholder(msg: Mapping[str, Any]) -> bool:
    return is_injected(msg) and injected_kind(msg) == PLACEHOLDER_KIND


def _owned(msg: Mapping[str, Any]) -> bool:
    return is_injected(msg) and injected_kind(msg) in OWNED_KINDS


@dataclass
class RemovalPlan:
    """Units (whole steps, or single loose messages) chosen for removal, with the runs they
    form: consecutive removed indices, plus existing placeholders next to them, become one
    placeholder. Tracks an estimate of the resulting token total as units are added."""

    view: View
    removed: set[int] = field(default_factory=set)
    units: int = 0
    estimate: int = 0
    _run_end: dict[int, int] = field(default_factory=dict)  # run start -> run end
    _run_start: dict[int, int] = field(default_factory=dict)  # run end -> run start

    def __post_init__(self) -> None:
        self.estimate = self.view.total

    def _placeholder_at(self, index: int) -> bool:
        return (
            0 <= index < len(self.view.messages)
            and index not in self.removed
            and is_placeholder(self.view.messages[index])
        )

    def add(self, indices: Sequence[int]) -> None:
        """Remove one unit: contiguous ``indices`` (a step, or a loose message)."""
        a, b = min(indices), max(indices)
        self.removed.update(indices)
        self.units += 1
        self.estimate -= sum(self.view.counts[i] for i in indices)
        start, end = a, b
        joined = 0
        # Existing placeholders right next to the unit are absorbed into its run.
        while self._placeholder_at(start - 1) and (start - 1) not in self._run_start:
            start -= 1
            self.estimate -= self.view.counts[start]
        if (start - 1) in self._run_start:
            left = self._run_start.pop(start - 1)
            del self._run_end[left]
            start = left
            joined += 1
        while self._placeholder_at(end + 1) and (end + 1) not in self._run_end:
            end += 1
            self.estimate -= self.view.counts[end]
        if (end + 1) in self._run_end:
            right = self._run_end.pop(end + 1)
            del self._run_start[right]
            end = right
            joined += 1
        self._run_end[start] = end
        self._run_start[end] = start
        self.estimate += _PLACEHOLDER_ESTIMATE * (1 - joined)

    def runs(self) -> list[tuple[int, int]]:
        return sorted(self._run_end.items())

    def build(self, vault: Any) -> tuple[list[Message], list[tuple[int, int, Message, str]]]:
        """The new message list and, per run, ``(start, end, placeholder, vault payload)``."""
        out: list[Message] = []
        made: list[tuple[int, int, Message, str]] = []
        runs = self.runs()
        pos = 0
        messages = self.view.messages
        for start, end in runs:
            out.extend(messages[pos:start])
            placeholder, payload = make_placeholder(messages[start : end + 1], vault)
            out.append(placeholder)
            made.append((start, end, placeholder, payload))
            pos = end + 1
        out.extend(messages[pos:])
        return out, made


def make_placeholder(run: Sequence[Message], vault: Any) -> tuple[Message, str]:
    """The placeholder for ``run`` and the JSON the vault keeps (the removed messages, with
    earlier placeholders in the run expanded back into the messages they stood for)."""
    originals: list[Message] = []
    for msg in run:
        if is_placeholder(msg):
            restored = restore_placeholder(msg, vault)
            if restored is not None:
                originals.extend(restored)
                continue
        originals.append(msg)
    payload = "".join(list_pieces(originals))  # json.dumps(originals), each message's text made once
    vault_id = text_id(payload)
    # Restored in this prepare (reread.recent_files) without reading back and parsing the entry.
    remember_value(vault_id, originals)
    n_steps = sum(1 for m in originals if m.get("role") == "assistant")
    tools = Counter(
        name
        for m in originals
        if m.get("role") == "assistant"
        for c in (m.get("tool_calls") or [])
        if isinstance(c, Mapping) and (name := call_name(c))
    )
    marker = format_marker("message", len(originals), vault_id, steps=n_steps)
    what = f"{n_steps} earlier step{'s' if n_steps != 1 else ''}" if n_steps else "earlier messages"
    if tools:
        listed = ", ".join(
            f"{name} x{n}" if n > 1 else name for name, n in sorted(tools.items(), key=lambda kv: (-kv[1], kv[0]))[:6]
        )
        what += f" (tool calls: {listed})"
    body = f"{marker}\n{what} were moved out of the context to make room; the vault entry above holds them unchanged."
    # A user-role message: after a tool result or a user message it merges into that user
    # turn (Anthropic) or is a valid user message (OpenAI), and before the next step's
    # assistant message it keeps user/assistant alternation. An assistant-role placeholder
    # would merge into the next assistant turn and push text ahead of its thinking blocks.
    msg = mark_injected({"role": "user", "content": body}, PLACEHOLDER_KIND, steps=n_steps, messages=len(originals))
    return msg, payload


def restore_placeholder(msg: Mapping[str, Any], vault: Any) -> list[Message] | None:
    """The messages an earlier placeholder stands for (``None`` when the vault lacks them).
    Callers only read them (a run made in this prepare is handed out as it was made)."""
    for marker in parse_markers(message_text(msg)):
        if marker.kind != "message" or marker.lines is not None:
            continue
        known = known_value(marker.vault_id)  # made in this prepare (messages are not edited in it)
        try:
            if isinstance(known, list) and vault.exists(marker.vault_id):
                return known
            data = json.loads(vault.get_text(marker.vault_id))
        except (VaultError, ValueError):
            return None
        if isinstance(data, list) and all(isinstance(m, dict) for m in data):
            return data
    return None


def removal_units(view: View, *, force: bool) -> Iterator[tuple[tuple[int, int, int], list[int]]]:
    """``(order key, indices)`` for every unit the stage may remove (unsorted).

    A unit is a whole step whose messages are contiguous and all eligible (a step is never
    split: a call leaves together with its results), or a loose message (in no step): for the
    regular stage only injected messages that no other stage owns, for the emergency pass
    every non-pinned one. The summary is an assistant message, so a step of its own: the
    regular stage leaves it to the summary stage, like every message of :data:`OWNED_KINDS`.
    """
    for step in view.steps:
        members = sorted(step.indices)
        if members != list(range(members[0], members[-1] + 1)):
            continue
        if not all(view.eligible(i, force=force) for i in members):
            continue
        if not force and any(_owned(view.messages[i]) for i in members):
            continue
        key = max(view.order_key(i, force=force) for i in members)
        yield (key[0], key[1], members[0]), members
    for index, msg in enumerate(view.messages):
        if index in view.step_of or is_placeholder(msg) or not view.eligible(index, force=force):
            continue
        if not force and not (is_injected(msg) and injected_kind(msg) not in OWNED_KINDS):
            continue
        yield view.order_key(index, force=force), [index]
