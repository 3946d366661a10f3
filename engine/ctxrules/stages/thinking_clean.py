"""``thinking.clean``: keep the model's reasoning from bloating the context, per provider.

Reasoning comes back from providers in two shapes (through litellm's OpenAI format):
``reasoning_content`` (a string on the assistant message: DeepSeek, Kimi/Moonshot, Qwen, GLM,
MiMo, and litellm's flattened copy of Anthropic thinking) and ``thinking_blocks`` (Anthropic's
signed ``thinking`` / ``redacted_thinking`` blocks; also accepted as parts of a list
``content``). What may be dropped depends on what the provider checks:

**anthropic**
  - ``reasoning_content`` that is exactly the concatenation of the message's thinking texts is
    a duplicate of its ``thinking_blocks``: it is dropped (kept in the vault; no marker is
    needed, the blocks still hold the text). A ``reasoning_content`` that differs is kept.
  - ``thinking_blocks`` are kept, and a signed block in the latest assistant step is never
    touched (it is pinned, and Anthropic rejects a tool-use turn whose thinking changed).
  - A signature covers the prefix it was produced after, so an earlier step whose prefix a
    compaction changed carries a signature that no longer verifies: its thinking is moved to
    the vault, leaving a marker in the message text. *Prefix changed* is detected through the
    stage state: the first time a signed message is seen, the digest of everything before it
    is recorded (keyed by its signatures); when a later run finds a different prefix before
    it, the prefix was changed (by a compaction stage of an earlier call, or by this stage
    stripping an earlier step, which changes every later prefix in turn). The stage type is
    ``after_compaction``: when a later stage of the same call changed the messages, the runner
    runs it once more on the result, so thinking whose prefix *this* call's compaction changed
    is stripped before the request goes out, not on the next call.
**deepseek**, **kimi** (the ``reasoning_content`` convention)
  - ``reasoning_content`` of assistant messages before the latest real user message is moved
    to the vault (marker in the text), except on messages with tool calls: these APIs demand
    the reasoning of a tool-call turn back. The current exchange is always kept.
    A reasoning that costs fewer tokens than its marker is kept: moving it would grow the message.
  - On a switch from a non-thinking to a thinking model (``backfill_reasoning: auto``: the
    model's name says it thinks, or the latest assistant message carries reasoning), every
    assistant message with tool calls that has no ``reasoning_content`` gets an empty one,
    which these APIs demand in thinking mode (HTTP 400 otherwise). This validity fix applies to
    pinned and protected messages too, like ``normalize.tool_pairs``' id fix: adding an empty
    field changes no content.
**none**
  - nothing is changed (OpenAI, Gemini and others do not take reasoning back).

``provider: auto`` reads the session's model (:attr:`ModelInfo.family`, provider and name);
set it to override. Pinned and protected messages are never cleaned, with one exception for
protected ones: signed thinking after a changed prefix is stripped from them too, because the
provider rejects (or silently drops) it — protection keeps content, not an invalid signature.
"""

from __future__ import annotations

import hashlib
import json
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from ctxrules.carry import Carry
from ctxrules.hookspecs import hookimpl
from ctxrules.messages import is_real_user, message_digest
from ctxrules.stages.base import Action, Message, StageOutcome, StageType, unchanged
from ctxrules.stages.compress_common import text_id
from ctxrules.stages.filter_common import check_options, tokens_saved
from ctxrules.structure import PIN_SIGNED_PREFIX, pinned_indices
from ctxrules.vault import format_marker

if TYPE_CHECKING:
    from ctxrules.pipeline.context import StageContext

__all__ = ["STAGE_TYPE", "ThinkingClean", "ctxrules_register_stages", "resolve_provider"]

PROVIDERS = ("auto", "anthropic", "deepseek", "kimi", "none")
_THINKING_PART_TYPES = frozenset({"thinking", "redacted_thinking"})
# Providers (litellm names) and model-name hints that follow the reasoning_content convention.
_REASONING_PROVIDERS = frozenset(
    {"deepseek", "moonshot", "dashscope", "zai", "xiaomi_mimo", "volcengine", "siliconflow"}
)
_REASONING_NAMES = re.compile(r"deepseek|kimi|moonshot|qwen|qwq|glm|mimo", re.I)
_THINKING_NAMES = re.compile(r"reason|think|(?:^|[-_/])r1(?:$|[-_.])|qwq|deepseek-v3\.[12]", re.I)


def resolve_provider(option: str, family: str, provider: str | None, name: str) -> str:
    """The behaviour for ``provider: auto``: anthropic, deepseek (the reasoning_content
    convention, also for Kimi, Qwen, GLM and MiMo) or none."""
    if option != "auto":
        return "deepseek" if option == "kimi" else option
    if family == "anthropic":
        return "anthropic"
    if family in ("deepseek", "qwen") or (provider or "") in _REASONING_PROVIDERS:
        return "deepseek"
    if _REASONING_NAMES.search(name):
        return "deepseek"
    return "none"


# --- reading thinking out of a message ---------------------------------------------------------


def _blocks(msg: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Thinking blocks of a message: ``thinking_blocks`` plus thinking parts of its content."""
    found: list[Mapping[str, Any]] = []
    blocks = msg.get("thinking_blocks")
    if isinstance(blocks, list):
        found.extend(b for b in blocks if isinstance(b, Mapping))
    content = msg.get("content")
    if isinstance(content, list):
        found.extend(p for p in content if isinstance(p, Mapping) and p.get("type") in _THINKING_PART_TYPES)
    return found


def _signature_key(msg: Mapping[str, Any]) -> str | None:
    """A stable identity of a signed assistant message: the digest of its signatures."""
    marks = []
    for block in _blocks(msg):
        if block.get("type") == "redacted_thinking" and isinstance(block.get("data"), str):
            marks.append("r:" + block["data"])
        elif isinstance(block.get("signature"), str) and block["signature"]:
            marks.append("s:" + block["signature"])
    if not marks:
        return None
    return hashlib.sha256("\x1f".join(marks).encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _is_duplicate(reasoning: str, blocks: list[Mapping[str, Any]]) -> bool:
    texts = [
        b["thinking"] for b in blocks if b.get("type", "thinking") == "thinking" and isinstance(b.get("thinking"), str)
    ]
    if not blocks:
        return False
    # litellm joins the thinking texts with "" when it builds reasoning_content; other
    # clients use a newline or a blank line.
    return any(reasoning == sep.join(texts) for sep in ("", "\n", "\n\n"))


def _with_marker(msg: Message, marker: str) -> Message:
    """``msg`` with ``marker`` appended to its text (a new text part for list content)."""
    content = msg.get("content")
    if isinstance(content, list):
        return {**msg, "content": [*content, {"type": "text", "text": marker}]}
    if isinstance(content, str) and content:
        return {**msg, "content": f"{content}\n{marker}"}
    return {**msg, "content": marker}


def _dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


class ThinkingClean:
    """The ``thinking.clean`` stage (see the module docstring)."""

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        opts = check_options(STAGE_TYPE.name, OPTIONS_SCHEMA, options)
        self.provider: str = opts["provider"]
        self.backfill: str = opts["backfill_reasoning"]
        self.strip_changed_prefix: bool = opts["strip_changed_prefix"]
        # Per session, what the messages of the last list say (see _Read): a warm turn reads
        # its new messages only.
        self._carry: Carry[_Read] = Carry()

    def __repr__(self) -> str:
        return f"ThinkingClean(provider={self.provider!r}, backfill={self.backfill!r})"

    def __call__(self, messages: Sequence[Message], ctx: StageContext) -> StageOutcome:
        model = ctx.model
        behaviour = resolve_provider(self.provider, model.family, model.provider, model.name)
        if behaviour not in ("anthropic", "deepseek"):
            ctx.state["model"] = model.name
            return StageOutcome(messages=unchanged(messages))  # no reasoning convention to apply
        out = list(messages)
        actions: list[Action] = []
        if behaviour == "anthropic":
            self._anthropic(messages, out, actions, ctx)
        elif behaviour == "deepseek":
            self._reasoning_content(messages, out, actions, ctx)
        ctx.state["model"] = model.name
        if not actions and all(map(operator.is_, out, messages)):
            return StageOutcome(messages=unchanged(messages))
        return StageOutcome(messages=out, actions=actions)

    # --- anthropic ---------------------------------------------------------------------------

    def _anthropic(
        self, messages: Sequence[Message], out: list[Message], actions: list[Action], ctx: StageContext
    ) -> None:
        pins = pinned_indices(messages)
        # What keeps a message's thinking from being stripped: the ordinary pins (the newest
        # step's thinking goes back byte-exact). preserved_thinking: pin's extension of them
        # does not: when even the pinned part did not fit and the emergency pass spilled some
        # of it, the signatures after the spill are stale like any other.
        own_pins = _own_pins(messages)
        read = self._read(messages, ctx.session_id)
        signed = read.signed
        recorded: dict[str, str] = dict(ctx.state.get("prefixes") or {})
        prefixes = read.prefixes if signed else []
        changed_from: int | None = None
        for index, key in signed.items():
            seen = recorded.get(key)
            if seen is not None and seen != prefixes[index]:
                changed_from = index
                break
        # Only these messages can change: those whose reasoning_content repeats their thinking
        # and, after a changed prefix, the signed ones (the others are left as they are).
        look = set(read.duplicates)
        if self.strip_changed_prefix and changed_from is not None:
            look.update(i for i in signed if i >= changed_from)
        dropped: set[int] = set()
        stripped: set[int] = set()
        for index in sorted(look):
            msg = messages[index]
            if index in own_pins:
                continue
            # Protection keeps a message's content, not what the provider will reject: signed
            # thinking whose prefix changed is stripped from protected messages too.
            if self.strip_changed_prefix and changed_from is not None and index >= changed_from and index in signed:
                self._strip_thinking(index, msg, out, actions, ctx, changed_from, protected=id(msg) in ctx.protected)
                stripped.add(index)
                continue
            if index in pins or id(msg) in ctx.protected:
                continue
            reasoning = msg["reasoning_content"]
            new = {k: v for k, v in msg.items() if k != "reasoning_content"}
            vid = ctx.vault.put_text(reasoning)
            out[index] = new
            dropped.add(index)
            actions.append(
                Action(
                    "reasoning_duplicate_dropped",
                    f"message {index}: reasoning_content duplicated its thinking_blocks",
                    index=index,
                    tokens_saved=tokens_saved(ctx, msg, new),
                    vault_id=vid,
                )
            )
        # Remember the prefix each signed message was first seen after; a stripped message
        # loses its signatures and drops out, so the record stays as small as the history.
        keep: dict[str, str] = {}
        for index, key in signed.items():
            if out[index] is messages[index] or _signature_key(out[index]) == key:
                keep[key] = recorded.get(key, prefixes[index])
        ctx.state["prefixes"] = keep
        if dropped or stripped:
            # What the next turn gets back is this list: kept as it reads now. A dropped
            # reasoning changes nothing the provider sees; stripped thinking does, from there on.
            gone = dropped | stripped
            read = _Read(
                {i: k for i, k in signed.items() if i not in stripped},
                tuple(i for i in read.duplicates if i not in gone),
                None if stripped else read.digests,
            )
        self._carry.keep(ctx.session_id, out if dropped or stripped else messages, (), read)

    def _read(self, messages: Sequence[Message], session: str) -> _Read:
        """What :class:`_Read` says of ``messages``: carried over from the last list of the
        session (:meth:`_anthropic` keeps it) for the messages it shares with this one (the
        same objects, or ones that send the provider the same: cache breakpoints moved), read
        for the others."""
        start, carried = self._carry.resume(session, messages, (), alike=_alike)
        if carried is None:
            carried = _Read({}, (), None)
        signed = dict(carried.signed)
        duplicates = list(carried.duplicates)
        for index in range(start, len(messages)):
            msg = messages[index]
            if msg.get("role") != "assistant":
                continue
            key = _signature_key(msg)
            if key is not None:
                signed[index] = key
            reasoning = msg.get("reasoning_content")
            if isinstance(reasoning, str) and reasoning and _is_duplicate(reasoning, _blocks(msg)):
                duplicates.append(index)
        digests = carried.digests
        if signed:
            # The prefix digests are kept from the first list that needed them on.
            if digests is None:
                digests = _Digests([], hashlib.sha256(), 0)
            digests = digests.extended(messages)
        return _Read(signed, tuple(duplicates), digests)

    def _strip_thinking(
        self,
        index: int,
        msg: Message,
        out: list[Message],
        actions: list[Action],
        ctx: StageContext,
        changed_from: int,
        *,
        protected: bool = False,
    ) -> None:
        removed: dict[str, Any] = {}
        new: Message = {k: v for k, v in msg.items() if k not in ("thinking_blocks", "reasoning_content")}
        for key in ("thinking_blocks", "reasoning_content"):
            if key in msg:
                removed[key] = msg[key]
        content = msg.get("content")
        if isinstance(content, list):
            parts = [p for p in content if not (isinstance(p, Mapping) and p.get("type") in _THINKING_PART_TYPES)]
            if len(parts) != len(content):
                removed["content_thinking_parts"] = [p for p in content if p not in parts]
                new["content"] = parts
        vid = ctx.vault.put_text(_dumps(removed))
        before = ctx.counter.count_message(msg)
        stripped = ctx.counter.count_message(new)
        marker = format_marker("tokens", max(0, before - stripped), vid, field="thinking", reason="prefix_changed")
        new = _with_marker(new, marker)
        out[index] = new
        where = "its own prefix" if changed_from == index else f"the prefix at message {changed_from}"
        note = " (a protected message: its content is kept, the invalid signature is not)" if protected else ""
        actions.append(
            Action(
                "thinking_stripped",
                f"message {index}: signed thinking moved to the vault: a compaction changed "
                f"{where}, so its signature no longer verifies{note}",
                index=index,
                tokens_saved=tokens_saved(ctx, msg, new),
                vault_id=vid,
            )
        )

    # --- deepseek / kimi ---------------------------------------------------------------------

    def _reasoning_content(
        self, messages: Sequence[Message], out: list[Message], actions: list[Action], ctx: StageContext
    ) -> None:
        pins = pinned_indices(messages)
        last_user = next((i for i in range(len(messages) - 1, -1, -1) if is_real_user(messages[i])), None)
        for index in range(last_user or 0):
            msg = messages[index]
            if msg.get("role") != "assistant" or index in pins or id(msg) in ctx.protected:
                continue
            reasoning = msg.get("reasoning_content")
            if not isinstance(reasoning, str) or not reasoning or msg.get("tool_calls"):
                continue
            new = {k: v for k, v in msg.items() if k != "reasoning_content"}
            vid = text_id(reasoning)
            marker = format_marker("tokens", ctx.counter.count_text(reasoning), vid, field="reasoning_content")
            new = _with_marker(new, marker)
            if tokens_saved(ctx, msg, new) <= 0:
                continue  # a short reasoning costs less than its marker: moving it would grow the message
            ctx.vault.put_text(reasoning)
            out[index] = new
            actions.append(
                Action(
                    "reasoning_dropped",
                    f"message {index}: reasoning_content of an earlier exchange moved to the vault",
                    index=index,
                    tokens_saved=tokens_saved(ctx, msg, new),
                    vault_id=vid,
                )
            )
        if self._thinking_active(messages, ctx):
            self._backfill(out, actions, ctx)

    def _thinking_active(self, messages: Sequence[Message], ctx: StageContext) -> bool:
        if self.backfill != "auto":
            return self.backfill == "always"
        if _THINKING_NAMES.search(ctx.model.name):
            return True
        latest = next((m for m in reversed(messages) if m.get("role") == "assistant"), None)
        reasoning = latest.get("reasoning_content") if latest is not None else None
        return isinstance(reasoning, str) and bool(reasoning)

    def _backfill(self, out: list[Message], actions: list[Action], ctx: StageContext) -> None:
        filled: list[int] = []
        for index, msg in enumerate(out):
            if msg.get("role") == "assistant" and msg.get("tool_calls") and "reasoning_content" not in msg:
                out[index] = {**msg, "reasoning_content": ""}
                filled.append(index)
        if filled:
            previous = ctx.state.get("model")
            switch = (
                f" (model switched from {previous} to {ctx.model.name})"
                if isinstance(previous, str) and previous != ctx.model.name
                else ""
            )
            shown = ", ".join(map(str, filled[:10])) + (" ..." if len(filled) > 10 else "")
            actions.append(
                Action(
                    "reasoning_backfilled",
                    f"empty reasoning_content added to {len(filled)} tool-call message(s) "
                    f"[{shown}]: a thinking model demands it{switch}",
                )
            )


def _own_pins(messages: Sequence[Message]) -> frozenset[int]:
    """The pins of ``messages`` without ``preserved_thinking: pin``'s signed prefix."""
    token = PIN_SIGNED_PREFIX.set(False)
    try:
        return pinned_indices(messages)
    finally:
        PIN_SIGNED_PREFIX.reset(token)


def _signed_view(msg: Mapping[str, Any]) -> dict[str, Any]:
    """What of a message Anthropic sees, hence what a signature after it covers.

    ``reasoning_content`` (litellm does not send it to Anthropic), ``cache_control`` (moved by
    ``cache.markers`` on every call) and ctxrules' own metadata are left out: changing them is
    not a change of the prefix, and counting them would strip valid thinking.
    """
    view: dict[str, Any] = {"role": msg.get("role")}
    content = msg.get("content")
    if isinstance(content, list):
        view["content"] = [
            {k: v for k, v in p.items() if k != "cache_control"} if isinstance(p, Mapping) else p for p in content
        ]
    else:
        # A string is one text block to Anthropic: cache.markers turns it into that list.
        view["content"] = [{"type": "text", "text": content}] if content else []
    for key in ("tool_calls", "tool_call_id", "name", "function_call", "thinking_blocks"):
        if msg.get(key) is not None:
            view[key] = msg[key]
    return view


def _prefix_digests(messages: Sequence[Message]) -> list[str]:
    """For each index, a digest of what the provider sees before it (a rolling sha256)."""
    return _Digests([], hashlib.sha256(), 0).extended(messages).prefixes


class _Digests(NamedTuple):
    """:func:`_prefix_digests` of the first ``length`` messages of a list, and the rolling hash
    after them (a list that extends that one goes on from there)."""

    prefixes: list[str]
    rolling: Any  # hashlib's sha256 object
    length: int

    def extended(self, messages: Sequence[Message]) -> _Digests:
        """The digests of ``messages``, which start with the ``length`` messages digested
        (the same ones, or ones the provider sees the same)."""
        prefixes, rolling = list(self.prefixes), self.rolling.copy()
        for msg in messages[self.length :]:
            prefixes.append(rolling.hexdigest()[:32])
            rolling.update(message_digest(_signed_view(msg)).encode("ascii"))
        return _Digests(prefixes, rolling, len(messages))


class _Read(NamedTuple):
    """What the messages of a list say, for the ``anthropic`` convention: the signature key
    of each signed assistant message, the assistant messages whose ``reasoning_content``
    repeats their thinking, and the prefix digests (computed once a message is signed)."""

    signed: dict[int, str]
    duplicates: tuple[int, ...]
    digests: _Digests | None

    @property
    def prefixes(self) -> list[str]:
        return self.digests.prefixes if self.digests is not None else []


def _alike(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether two messages say the same for :class:`_Read`: what the provider sees of them
    (cache breakpoints left out) and their ``reasoning_content``."""
    return old.get("reasoning_content") == new.get("reasoning_content") and _signed_view(old) == _signed_view(new)


OPTIONS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "title": "thinking.clean options",
    "description": "Which provider convention applies, and the switch-to-thinking fix.",
    "additionalProperties": False,
    "properties": {
        "provider": {
            "title": "Provider convention",
            "description": (
                "auto: from the session's model (Claude -> anthropic; DeepSeek, "
                "Kimi, Qwen, GLM, MiMo -> deepseek; others -> none). anthropic: "
                "drop duplicate reasoning_content, strip thinking whose prefix "
                "changed. deepseek / kimi: drop reasoning_content of earlier "
                "exchanges except on tool-call messages. none: change nothing."
            ),
            "enum": list(PROVIDERS),
            "default": "auto",
        },
        "backfill_reasoning": {
            "title": "Backfill empty reasoning_content",
            "description": (
                "deepseek/kimi only. auto: when the model thinks (its name says so, "
                "or the latest assistant message carries reasoning), give every "
                "tool-call message without reasoning_content an empty one, as these "
                "APIs demand in thinking mode; always; never."
            ),
            "enum": ["auto", "always", "never"],
            "default": "auto",
        },
        "strip_changed_prefix": {
            "title": "Strip thinking after a changed prefix",
            "description": (
                "anthropic only. Move the signed thinking of earlier steps whose "
                "prefix was changed by a compaction to the vault (the signature "
                "no longer verifies)."
            ),
            "type": "boolean",
            "default": True,
        },
        "preserved_thinking": {
            "title": "Preserved thinking",
            "description": (
                "For models that keep earlier turns' thinking, whose signature covers "
                "everything before it. drop: thinking after a changed prefix is "
                "moved to the vault (strip_changed_prefix). pin: every stage treats "
                "all messages up to the newest one with signed thinking as pinned, "
                "so no signature's prefix changes (only what follows can be "
                "compacted)."
            ),
            "enum": ["drop", "pin"],
            "default": "drop",
        },
    },
}

STAGE_TYPE = StageType(
    name="thinking.clean",
    phase="content",
    factory=ThinkingClean,
    description=(
        "Drops redundant or stale reasoning per provider convention (Anthropic thinking "
        "blocks, DeepSeek/Kimi reasoning_content) and backfills what thinking APIs "
        "demand; everything removed goes to the vault."
    ),
    options_schema=OPTIONS_SCHEMA,
    # A signed block whose prefix a later stage of this same call changed must not go out:
    # the runner runs the stage again on the compacted messages, where the recorded prefixes
    # no longer match.
    after_compaction=True,
)


@hookimpl
def ctxrules_register_stages(register: Callable[[StageType], None]) -> None:
    register(STAGE_TYPE)
