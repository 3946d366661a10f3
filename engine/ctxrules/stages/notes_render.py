"""``notes.render``: the session notes as ONE clearly marked message in the context.

The notes come from the session directory (``ctxrules.notes``; the API is ``session.notes``);
the stage makes no LLM call. The message is an injected ``user`` message (kind ``notes``,
``<ctxrules:notes>`` tag) listing every note with its id and tags.

Placement (option ``placement``):

``end`` (default)
    the message is appended after the last message (before it when the last message is the
    latest real user message, so the ask stays last) and then **stays where it is** as long as
    the notes do not change: the prompt-cache prefix is not touched by an unchanged note set.
    When the notes change, the old message leaves and the new one is appended at the end, so
    the cached prefix breaks only from where the previous rendering was (the end of the history
    at the last change), never at the system prompt. A user message after a tool result or
    after a user message merges into that user turn (Anthropic) and is valid for OpenAI.
``after_system``
    right after the leading system/developer messages: the notes are read first, but every
    change re-sends (and re-caches) the whole history after the system prompt.

Budget: the rendering is at most ``max_tokens`` and never lifts utilization to ``max_tier``
(default ``emergency``, which keeps the emergency guarantee); when the notes do not fit, the
newest ones are rendered and one marker line points at the vault copy of the older ones (they
also stay in ``notes.json``). No notes: no message (a stale rendering is removed).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ctxrules.hookspecs import hookimpl
from ctxrules.messages import injected_kind, is_real_user, mark_injected, message_text
from ctxrules.notes import Note, NotesError, load_notes
from ctxrules.stages.base import Action, Message, StageOutcome, StageType, unchanged
from ctxrules.stages.compress_common import line_count, text_id
from ctxrules.structure import shape
from ctxrules.types import THRESHOLD_NAMES
from ctxrules.vault import format_marker

if TYPE_CHECKING:
    from ctxrules.pipeline.context import StageContext

KIND = "notes"
_HEADER = "Session notes (kept with the notes API; context for the task, not a new request). Ids in brackets."
# Role, tags and the per-message overhead a marked message adds to its text.
_MESSAGE_OVERHEAD = 16


def render_note(note: Note) -> str:
    lines = note.text.rstrip("\n").split("\n")
    out = [f"- [{note.id}] {lines[0]}"]
    out.extend(f"  {line}" for line in lines[1:])
    if note.tags:
        out.append(f"  tags: {', '.join(note.tags)}")
    return "\n".join(out)


def render_notes(notes: Sequence[Note], omitted: str | None = None) -> str:
    body = [_HEADER]
    if omitted is not None:
        body.append(omitted)
    body.extend(render_note(n) for n in notes)
    return "\n".join(body)


def insertion_point(messages: Sequence[Mapping[str, Any]], placement: str) -> int:
    """Where an injected message goes: after the leading system messages, or at the end
    (before a trailing real user message)."""
    if placement == "after_system":
        i = 0
        while i < len(messages) and messages[i].get("role") in ("system", "developer"):
            i += 1
        return i
    if messages and is_real_user(messages[-1]):
        return len(messages) - 1
    return len(messages)


class NotesRender:
    """The configured stage; see the module docstring."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.placement = str(options.get("placement", "end"))
        self.max_tokens = int(options.get("max_tokens", 2000))
        self.max_tier = str(options.get("max_tier", "emergency"))

    def __call__(self, messages: Sequence[dict[str, Any]], ctx: StageContext) -> StageOutcome:
        try:
            notes = load_notes(store=ctx.vault.store, session=ctx.vault.session)
        except NotesError as exc:
            return StageOutcome(messages=unchanged(messages), warnings=[str(exc)])
        existing = [i for i in shape(messages).where("injected") if injected_kind(messages[i]) == KIND]
        if not notes and not existing:
            return StageOutcome(messages=unchanged(messages))
        skip = set(existing)
        rest = [m for i, m in enumerate(messages) if i not in skip]
        actions: list[Action] = []
        warnings: list[str] = []
        new_msg: Message | None = None
        if notes:
            new_msg, stored, dropped = self._render(notes, rest, ctx)
            if new_msg is None:
                warnings.append(
                    f"{len(notes)} session note(s) not rendered: no room below the {self.max_tier} threshold"
                )
            elif stored is not None:
                vault_id = ctx.vault.put_text(stored)
                actions.append(
                    Action(
                        "omit",
                        f"{dropped} older note(s) over the notes budget left out of the rendering",
                        vault_id=vault_id,
                    )
                )
        if (
            new_msg is not None
            and len(existing) == 1
            and message_text(messages[existing[0]]) == message_text(new_msg)
            and (self.placement == "end" or existing[0] == insertion_point(rest, self.placement))
        ):
            # Unchanged notes stay where they are: the cached prefix is not touched.
            return StageOutcome(messages=unchanged(messages), actions=actions, warnings=warnings)
        for i in existing:
            vault_id = ctx.vault.put_text(message_text(messages[i]))
            actions.append(
                Action(
                    "replace" if new_msg is not None else "remove",
                    f"message {i}: earlier notes rendering",
                    index=i,
                    vault_id=vault_id,
                )
            )
        out = list(rest)
        if new_msg is not None:
            at = insertion_point(out, self.placement)
            out.insert(at, new_msg)
            actions.append(Action("render", f"{len(notes)} note(s) rendered at message {at}", index=at))
        return StageOutcome(messages=out, actions=actions, warnings=warnings)

    def _render(
        self, notes: list[Note], rest: Sequence[Message], ctx: StageContext
    ) -> tuple[Message | None, str | None, int]:
        """``(message, vault text of omitted notes, how many omitted)``; the message is
        ``None`` when not even one note fits."""
        room = ctx.budget.tokens_at(self.max_tier) - ctx.count(rest) - _MESSAGE_OVERHEAD
        limit = min(self.max_tokens, room)
        kept = list(notes)
        while kept:
            dropped = notes[: len(notes) - len(kept)]
            stored = "\n".join(render_note(n) for n in dropped) if dropped else None
            omitted = None
            if stored is not None:
                omitted = (
                    format_marker("lines", line_count(stored), text_id(stored), notes=len(dropped))
                    + f" ({len(dropped)} older note(s) left out; the notes file keeps them)"
                )
            msg = mark_injected({"role": "user", "content": render_notes(kept, omitted)}, KIND, count=len(kept))
            if ctx.counter.count_message(msg) <= limit:
                return msg, stored, len(dropped)
            kept.pop(0)
        return None, None, len(notes)


STAGE_TYPE = StageType(
    name="notes.render",
    phase="content",
    factory=NotesRender,
    description="Renders the session notes (session.notes) into the context as one marked message; no LLM call.",
    options_schema={
        "type": "object",
        "title": "notes.render options",
        "description": "Where the notes message goes and how large it may get.",
        "additionalProperties": False,
        "properties": {
            "placement": {
                "title": "Placement",
                "description": "'end': appended after the history and kept in place while the "
                "notes do not change (cache-friendly); 'after_system': right "
                "after the leading system messages.",
                "enum": ["end", "after_system"],
                "default": "end",
            },
            "max_tokens": {
                "title": "Largest rendering (tokens)",
                "description": "The notes message is at most this many tokens; older notes are "
                "left out (with a marker) when they do not fit.",
                "type": "integer",
                "minimum": 50,
                "default": 2000,
            },
            "max_tier": {
                "title": "Ceiling tier",
                "description": "The notes never lift utilization to this tier (default: "
                "emergency, so the emergency guarantee holds).",
                "enum": list(THRESHOLD_NAMES),
                "default": "emergency",
            },
        },
    },
)


@hookimpl
def ctxrules_register_stages(register: Callable[[StageType], None]) -> None:
    register(STAGE_TYPE)
