"""``cache.markers``: keep the provider's prompt-cache prefix stable and tell it where to cache.

Finalize phase: it runs after every content stage, adds markers and request options, and never
changes a message's text (the runner checks that).

**The stable prefix** is, in order: the system message; the tool schemas; the *workspace
rules* (further leading system/developer messages and anything injected before the first real
user message: AGENTS.md, CLAUDE.md, environment context); the first real user message (the
human anchor, which is pinned). Everything after it is *history*. The stage

- sorts and normalizes the tool schemas (:func:`normalize_tools`): tools by name, object keys
  sorted, ``required`` lists sorted, description whitespace trimmed — two requests that differ
  only in such noise get the same bytes;
- keeps the tool list stable when the caller narrows it: on providers that honour
  ``tool_choice: allowed_tools`` (OpenAI), a call that drops tools the session sent before
  keeps sending them and narrows the choice instead (``stable_tools``); a pack can also narrow
  explicitly with ``allowed_tools`` globs;
- adds cache breakpoints: Anthropic ``cache_control`` on the last message (the next call reads
  everything up to it), the end of the stable prefix, the end of the system block (reused across
  sessions) and, after a long step, the previous call's last message — only where the prefix is
  long enough to be cached (``min_prefix_tokens``) and never more than ``max_breakpoints``
  (4, Anthropic's limit) counting markers the caller set. Qwen-style providers get prefix
  markers only (system block and stable prefix);
- sets ``prompt_cache_key`` in ``result.request`` for native OpenAI endpoints: the session's
  cache key (``ctx.cache_key``), which is its id unless the session was opened with ``cache_key=`` (a sub-agent
  passes its parent's key and so shares the parent's cache routing);
- keeps a per-session fingerprint of every layer in ``ctx.state`` and, when the prefix changes,
  reports which layer broke it (model, tools — named —, system, workspace rules, first user
  message, history from message N) and whether the cache had simply expired (idle > TTL).

Markers this stage added on one call are removed from messages that are no longer a target on
the next (the session feeds its previous output back in), and a message it turned from a
string into a one-part list gets its string back, so history bytes stay the caller's.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import operator
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar
from urllib.parse import urlparse

from ctxrules import structure
from ctxrules.carry import PerSession
from ctxrules.errors import StoreUnavailable
from ctxrules.hookspecs import hookimpl
from ctxrules.json_stream import json_text_canonical, make_json_text
from ctxrules.messages import clone_json, is_real_user
from ctxrules.stages.base import Action, Message, StageOutcome, StageType, unchanged

if TYPE_CHECKING:
    from ctxrules.pipeline.context import StageContext
    from ctxrules.tokens import TokenCounter

__all__ = [
    "STAGE_TYPE",
    "CacheMarkers",
    "PrefixLayers",
    "canonical_message",
    "count_markers",
    "ctxrules_register_stages",
    "normalize_tools",
    "prefix_layers",
    "stable_prefix_bytes",
]

MARKER_KEY = "cache_control"
_UNMARKED = object()  # a tool without a breakpoint (a null one is kept as given)
ANTHROPIC_LIMIT = 4
# Anthropic looks for an earlier cache entry up to about 20 content blocks before a breakpoint;
# after a longer step the previous call's end gets a breakpoint of its own.
LOOKBACK_BLOCKS = 18
OPENAI_HOSTS = ("api.openai.com",)
# Families whose chat API honours tool_choice={"type": "allowed_tools", ...}.
ALLOWED_TOOLS_FAMILIES = frozenset({"openai"})
ALLOWED_TOOLS_PROVIDERS = frozenset({"openai", "azure"})
TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}
_T = TypeVar("_T")
_SHORT = 16  # hex digits kept per history message digest


# -- tool schemas -----------------------------------------------------------------------------


def _tool_name(tool: Mapping[str, Any]) -> str:
    fn = tool.get("function")
    if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
        return str(fn["name"])
    return str(tool.get("name") or "")


def _normalize(value: Any, key: str | None = None) -> Any:
    if isinstance(value, Mapping):
        return {k: _normalize(value[k], k) for k in sorted(value, key=str)}
    if isinstance(value, list):
        items = [_normalize(v) for v in value]
        if key == "required" and all(isinstance(v, str) for v in items):
            return sorted(set(items))
        return items
    if isinstance(value, str) and key == "description":
        return "\n".join(line.rstrip() for line in value.strip().split("\n"))
    return value


def normalize_tools(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Tool schemas in one canonical form: sorted by (type, name); every object's keys sorted;
    ``required`` lists sorted and deduplicated; descriptions without trailing whitespace.
    Nothing that changes meaning is touched (property order in JSON Schema carries none).

    A breakpoint (``cache_control`` on a tool) stays at its place in the list, not with its
    tool: it caches the tools up to it, and sorting must not shrink that (the usual one, on
    the last tool, would otherwise cache only the tool that sorts first)."""
    normalized = [_normalize(t) if isinstance(t, Mapping) else t for t in tools]
    ordered = sorted(
        normalized,
        key=lambda t: (str(t.get("type", "")), _tool_name(t)) if isinstance(t, dict) else ("", ""),
    )
    places = [t.get(MARKER_KEY, _UNMARKED) if isinstance(t, dict) else _UNMARKED for t in normalized]
    if ordered == normalized or all(p is _UNMARKED for p in places):
        return ordered
    out: list[Any] = []
    for tool, marker in zip(ordered, places, strict=True):
        if isinstance(tool, dict):
            tool = {k: v for k, v in tool.items() if k != MARKER_KEY}
            if marker is not _UNMARKED:
                tool = _normalize({**tool, MARKER_KEY: marker})  # the key in its sorted place
        out.append(tool)
    return out


# -- the prefix ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrefixLayers:
    """Where the stable prefix's layers sit in a message list (``stop`` indices exclusive).

    ``system``: ``[0, system_stop)``; workspace rules: ``[system_stop, workspace_stop)``; the
    first real user message at ``anchor`` (``None``: there is none yet, and the prefix ends with
    the workspace rules); history from ``history_start``."""

    system_stop: int
    workspace_stop: int
    anchor: int | None

    @property
    def history_start(self) -> int:
        return self.anchor + 1 if self.anchor is not None else self.workspace_stop

    @property
    def prefix_stop(self) -> int:
        return self.history_start


def prefix_layers(messages: Sequence[Mapping[str, Any]]) -> PrefixLayers:
    """The layers of ``messages`` (see :class:`PrefixLayers`)."""
    system_stop = 1 if messages and messages[0].get("role") in ("system", "developer") else 0
    anchor = next((i for i, m in enumerate(messages) if is_real_user(m)), None)
    return _layers(system_stop, anchor, (messages[i].get("role") for i in range(system_stop, len(messages))))


def _layers_of(out_shape: structure.Shape) -> PrefixLayers:
    """:func:`prefix_layers` from the facts of the list (which the stage has at hand): the
    first real user message is read off them, not found by checking each message's tag."""
    facts = out_shape.facts
    system_stop = 1 if facts and facts[0].role in ("system", "developer") else 0
    anchor = next((i for i, f in enumerate(facts) if f.real_user), None)
    return _layers(system_stop, anchor, (facts[i].role for i in range(system_stop, len(facts))))


def _layers(system_stop: int, anchor: int | None, roles: Iterable[Any]) -> PrefixLayers:
    """The layers given where the system block ends and the anchor, if any; without one, the
    workspace rules are the leading system/developer messages after it (``roles``: those of
    the messages from ``system_stop`` on, read only that far)."""
    if anchor is not None:
        return PrefixLayers(system_stop, max(anchor, system_stop), anchor)
    stop = system_stop
    for role in roles:
        if role not in ("system", "developer"):
            break
        stop += 1
    return PrefixLayers(system_stop, stop, None)


def _strip_markers(value: Any) -> Any:
    kind = type(value)
    if kind is str:  # most values: decided without the Mapping check (an ABC test, the slowest)
        return value
    if kind is dict or isinstance(value, Mapping):
        return {k: _strip_markers(v) for k, v in value.items() if k != MARKER_KEY}
    if isinstance(value, list):
        return [_strip_markers(v) for v in value]
    return value


def canonical_message(msg: Mapping[str, Any]) -> Any:
    """``msg`` without cache markers, a single plain text part written as a string: the form
    in which marker placement can never make two messages differ."""
    out = _strip_markers(msg)
    content = out.get("content")
    if (
        isinstance(content, list)
        and len(content) == 1
        and isinstance(content[0], dict)
        and set(content[0]) == {"type", "text"}
        and content[0]["type"] == "text"
    ):
        out["content"] = content[0]["text"]
    return out


def _digest(value: Any) -> str:
    return hashlib.sha256(json_text_canonical(value).encode("utf-8")).hexdigest()


class _NotPlain(Exception):
    """A value that :func:`canonical_message` would write otherwise than it stands."""


def _plain_only(value: Any) -> str:
    # What JSON cannot write goes through str(), as in json_text_canonical; but a Mapping that
    # is not a dict becomes a dict in canonical_message's copy, written as an object.
    if isinstance(value, Mapping):
        raise _NotPlain
    return str(value)


_plain_canonical: Callable[[Any], str] = make_json_text(True, (",", ":"), _plain_only)
# The same text for JSON data only (anything else raises TypeError).
_strict_canonical: Callable[[Any], str] = make_json_text(True, (",", ":"))
# No key named like the marker anywhere: a string's own quotes are escaped in JSON text.
_MARKER_IN_TEXT = json.dumps(MARKER_KEY) + ":"


def _message_digest(msg: Mapping[str, Any]) -> str:
    """``_digest(canonical_message(msg))``, without the copy when it would equal ``msg``: a
    new message of a warm turn (every history message is digested once) is written as it is
    unless it holds a marker or a one-part content list."""
    content = msg.get("content")
    if not (isinstance(content, list) and len(content) == 1):
        try:
            text = _plain_canonical(msg)
        except Exception:  # not plain, or no JSON at all: the copy decides (and raises) as always
            text = _MARKER_IN_TEXT
        if _MARKER_IN_TEXT not in text:
            return hashlib.sha256(text.encode("utf-8")).hexdigest()
    return _digest(canonical_message(msg))


def stable_prefix_bytes(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]) -> bytes:
    """The bytes of the stable prefix *as sent* (markers included): the tool schemas and the
    messages up to and including the first real user message, as canonical JSON."""
    layers = prefix_layers(messages)
    body = {"tools": list(tools), "messages": list(messages[: layers.prefix_stop])}
    return json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def count_markers(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] = ()) -> int:
    """Cache breakpoints in a request: ``cache_control`` on messages, their parts and tools."""

    def count(value: Any) -> int:
        if isinstance(value, Mapping):
            return (MARKER_KEY in value) + sum(count(v) for k, v in value.items() if k != MARKER_KEY)
        if isinstance(value, list):
            return sum(count(v) for v in value)
        return 0

    return sum(count(m) for m in messages) + sum(count(t) for t in tools)


# -- markers ----------------------------------------------------------------------------------


def _markable_part(content: list[Any]) -> int | None:
    for j in range(len(content) - 1, -1, -1):
        part = content[j]
        if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str) and part["text"]:
            return j
    return None


def _is_markable(msg: Mapping[str, Any]) -> bool:
    content = msg.get("content")
    if isinstance(content, str):
        return bool(content)
    return isinstance(content, list) and _markable_part(content) is not None


def _mark(msg: Mapping[str, Any], marker: dict[str, Any]) -> tuple[Message, bool] | None:
    """(marked copy, was the content a string) or None when the message cannot carry one or
    already carries one."""
    content = msg.get("content")
    if isinstance(content, str) and content:
        return {
            **msg,
            "content": [{"type": "text", "text": content, MARKER_KEY: dict(marker)}],
        }, True
    if isinstance(content, list):
        if any(isinstance(p, dict) and MARKER_KEY in p for p in content) or MARKER_KEY in msg:
            return None
        j = _markable_part(content)
        if j is None:
            return None
        parts = list(content)
        parts[j] = {**parts[j], MARKER_KEY: dict(marker)}
        return {**msg, "content": parts}, False
    return None


def _unmark(msg: Mapping[str, Any], marker: dict[str, Any], was_string: bool) -> Message | None:
    """``msg`` without the marker this stage put on it, or None when it carries none."""
    content = msg.get("content")
    if not isinstance(content, list):
        return None
    for j in range(len(content) - 1, -1, -1):
        part = content[j]
        if isinstance(part, dict) and part.get(MARKER_KEY) == marker:
            stripped = {k: v for k, v in part.items() if k != MARKER_KEY}
            if was_string and len(content) == 1 and set(stripped) == {"type", "text"}:
                return {**msg, "content": stripped["text"]}
            parts = list(content)
            parts[j] = stripped
            return {**msg, "content": parts}
    return None


# -- the stage ----------------------------------------------------------------------------------


OPTIONS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "strategy": {
            "title": "Breakpoint strategy",
            "description": "auto: from the model family (Anthropic -> anthropic, Qwen -> prefix, "
            "others "
            "none); anthropic: rolling cache_control breakpoints plus the stable prefix; "
            "prefix: cache_control on the stable prefix only (Qwen/DashScope style); "
            "none: no markers.",
            "enum": ["auto", "anthropic", "prefix", "none"],
            "default": "auto",
        },
        "max_breakpoints": {
            "title": "Most breakpoints",
            "description": "Upper bound on cache_control markers in the request, counting those "
            "the "
            "caller set (Anthropic rejects more than 4).",
            "type": "integer",
            "minimum": 0,
            "maximum": ANTHROPIC_LIMIT,
            "default": ANTHROPIC_LIMIT,
        },
        "min_prefix_tokens": {
            "title": "Smallest cached prefix",
            "description": "A breakpoint is only set where the prompt up to it has at least this "
            "many "
            "tokens (Anthropic caches nothing shorter: 1024 for most models).",
            "type": "integer",
            "minimum": 0,
            "default": 1024,
        },
        "min_gain_tokens": {
            "title": "Smallest gain per breakpoint",
            "description": "A breakpoint is only set where it caches at least this many tokens "
            "more than "
            "the neighbouring breakpoints (a marker right after another one buys nothing).",
            "type": "integer",
            "minimum": 0,
            "default": 256,
        },
        "ttl": {
            "title": "Cache TTL",
            "description": "Anthropic cache lifetime to ask for: null (the provider's default, 5 "
            "minutes), "
            "5m or 1h (costs more per write).",
            "enum": [None, "5m", "1h"],
            "default": None,
        },
        "prompt_cache_key": {
            "title": "OpenAI prompt_cache_key",
            "description": "auto: set request.prompt_cache_key to the session's cache key for "
            "native "
            "OpenAI endpoints only (provider openai and api_base unset or api.openai.com); "
            "always / never.",
            "enum": ["auto", "always", "never"],
            "default": "auto",
        },
        "api_base": {
            "title": "API base URL",
            "description": "The endpoint the caller sends requests to, when it is not the "
            "provider's own "
            "(a proxy, a gateway, a compatible server): a host other than api.openai.com "
            "turns prompt_cache_key off under auto.",
            "type": ["string", "null"],
            "default": None,
        },
        "allowed_tools": {
            "title": "Allowed tools",
            "description": "Globs of tool names the model may call. Narrows through "
            "request.tool_choice = {type: allowed_tools, ...}; the tools list itself is "
            "left whole, so the cached prefix survives.",
            "type": ["array", "null"],
            "items": {"type": "string"},
            "default": None,
        },
        "allowed_tools_mode": {
            "title": "Allowed tools mode",
            "description": "auto: the model may answer without a tool; required: it must call one "
            "of "
            "the allowed tools.",
            "enum": ["auto", "required"],
            "default": "auto",
        },
        "stable_tools": {
            "title": "Stable tool list",
            "description": "When a call passes fewer tools than the session sent before, keep "
            "sending "
            "the earlier list and narrow with allowed_tools instead. auto: only for "
            "providers that honour allowed_tools (OpenAI); always; never.",
            "enum": ["auto", "always", "never"],
            "default": "auto",
        },
        "normalize_tools": {
            "title": "Normalize tool schemas",
            "description": "Sort tools by name and their schemas' keys, sort required lists, trim "
            "description whitespace, so equivalent tool lists are byte-identical.",
            "type": "boolean",
            "default": True,
        },
        "report_breaks": {
            "title": "Report cache breaks",
            "description": "Warn when the stable prefix changed since the previous call, naming "
            "the "
            "layer that changed (history rewrites and expiry are reported as actions).",
            "type": "boolean",
            "default": True,
        },
    },
}


class _Options(NamedTuple):
    strategy: str
    max_breakpoints: int
    min_prefix_tokens: int
    min_gain_tokens: int
    ttl: str | None
    prompt_cache_key: str
    api_base: str | None
    allowed_tools: tuple[str, ...] | None
    allowed_tools_mode: str
    stable_tools: str
    normalize_tools: bool
    report_breaks: bool


class CacheMarkers:
    """The ``cache.markers`` stage; options as in :data:`OPTIONS_SCHEMA`."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        allowed = options.get("allowed_tools")
        self.options = _Options(
            strategy=str(options.get("strategy", "auto")),
            max_breakpoints=int(options.get("max_breakpoints", ANTHROPIC_LIMIT)),
            min_prefix_tokens=int(options.get("min_prefix_tokens", 1024)),
            min_gain_tokens=int(options.get("min_gain_tokens", 256)),
            ttl=options.get("ttl"),
            prompt_cache_key=str(options.get("prompt_cache_key", "auto")),
            api_base=options.get("api_base"),
            allowed_tools=tuple(allowed) if allowed is not None else None,
            allowed_tools_mode=str(options.get("allowed_tools_mode", "auto")),
            stable_tools=str(options.get("stable_tools", "auto")),
            normalize_tools=bool(options.get("normalize_tools", True)),
            report_breaks=bool(options.get("report_breaks", True)),
        )
        self.marker: dict[str, Any] = {"type": "ephemeral"}
        if self.options.ttl:
            self.marker["ttl"] = self.options.ttl
        # id(message) -> (message, short digest): the session hands back the same objects call
        # after call, so history digests cost one JSON dump per new message. Holding the message
        # keeps its id from being reused while it is in the memo.
        self._memo: dict[int, tuple[Mapping[str, Any], str]] = {}
        # The history digested last (messages, short digests), and the structure generation
        # the memos belong to (ctxrules.structure.forget after an in-place edit drops them).
        # Per session (ctxrules.carry.PerSession): sessions of one engine taking turns keep theirs.
        # (the shape of the list, where its history starts, the short digest of each history
        # message, those concatenated)
        self._last_history: PerSession[tuple[structure.Shape, int, list[str], str]] = PerSession()
        self._layers: dict[tuple[Any, ...], tuple[tuple[Any, ...], Any]] = {}
        # The stable layers' digests and the digest of them together, last computed.
        self._stable: tuple[tuple[Any, ...], str] | None = None
        self._generation = structure.generation()
        # normalize_tools of the tool lists seen lately (and whether it changed them), by their
        # canonical JSON text: the same tools come with every call, and normalizing walks every
        # schema in Python. The same normalized objects each time also let the tools layer's
        # digest be remembered (_layer).
        self._normalized: dict[tuple[bool, str], tuple[list[dict[str, Any]], bool]] = {}
        # Per session, for _place: the last list's shape, the counter that counted it (another
        # tokenizer counts otherwise), the markers on each of its messages and their tokens.
        # Taken out while extended in place (PerSession.pop), like _last_history.
        self._counted: PerSession[tuple[structure.Shape, TokenCounter, list[int], list[int], list[int], int]] = (
            PerSession()
        )

    # -- helpers ----------------------------------------------------------------------------
    def _short(self, msg: Mapping[str, Any]) -> str:
        hit = self._memo.get(id(msg))
        if hit is not None and hit[0] is msg:
            return hit[1]
        digest = _message_digest(msg)[:_SHORT]
        if len(self._memo) > 200_000:
            self._memo.clear()
        self._memo[id(msg)] = (msg, digest)
        return digest

    def _own_tools(self, given: list[dict[str, Any]], normalize: bool) -> tuple[list[dict[str, Any]], bool]:
        """The tools to send, as objects of the stage's own: :func:`normalize_tools` of
        ``given`` (or copies, with ``normalize_tools: false``) and whether normalizing changed
        them, remembered by the text of ``given`` (not by its objects: a caller may edit its
        tool dicts in place; nor by ``==``, which holds between 1 and 1.0). What is counted per
        tool object (_layer) is then never counted on an object that changed since."""
        try:
            key = (normalize, _strict_canonical(given))
        except Exception:  # not JSON data (a stage called directly): nothing to remember it by
            normalized = normalize_tools(given) if normalize else list(given)
            return normalized, normalized != given
        hit = self._normalized.get(key)
        if hit is None:
            normalized = normalize_tools(given) if normalize else [clone_json(t) for t in given]
            hit = (normalized, normalize and normalized != given)
            if len(self._normalized) >= 8:
                self._normalized.clear()
            self._normalized[key] = hit
        return list(hit[0]), hit[1]

    def _layer(self, objects: Sequence[Any], compute: Callable[..., _T], *args: Hashable) -> _T:
        """``compute(objects, *args)``, remembered for the same objects (and function and
        arguments)."""
        key = (compute, args, *map(id, objects))
        hit = self._layers.get(key)
        if hit is not None and len(hit[0]) == len(objects) and all(map(operator.is_, hit[0], objects)):
            return hit[1]  # type: ignore[no-any-return]  # stored by this same compute
        value = compute(objects, *args)
        if len(self._layers) > 64:
            self._layers.clear()
        self._layers[key] = (tuple(objects), value)
        return value

    def _forget_if_edited(self) -> None:
        """Drop what is remembered per message object when a message was edited in place
        (:func:`ctxrules.structure.forget`)."""
        if self._generation != structure.generation():
            self._memo.clear()
            self._layers.clear()
            self._last_history.clear()
            self._counted.clear()
            self._generation = structure.generation()

    def _shorts(
        self, out: Sequence[Mapping[str, Any]], start: int, session: str = "", out_shape: structure.Shape | None = None
    ) -> str:
        """The short digests of ``out[start:]``, concatenated. A warm turn's history is the last
        one with messages appended (only those are digested: Shape.extends says which are new
        without comparing the lists) or perhaps a few replaced (only those are looked up)."""
        self._forget_if_edited()
        # Taken out while it is extended in place (PerSession.pop), so that a failure on the
        # way leaves nothing half-changed; the stage serves every session of its engine and
        # each finds its own.
        last = self._last_history.pop(session)
        now = out_shape if out_shape is not None else structure.shape(out)
        grown = now.extends(last[0]) if last is not None and last[1] == start else None
        if last is not None and grown is not None:
            _, _, shorts, joined = last
            added = [self._short(out[i]) for i in range(grown, len(out))]
            shorts.extend(added)
            joined += "".join(added)
        elif last is not None and last[0].snapshot is not None and len(last[0].snapshot) - last[1] <= len(out) - start:
            old_shape, old_start, shorts, joined = last
            old = old_shape.snapshot[old_start:]  # type: ignore[index]
            messages = out[start:]
            replaced = {i: self._short(messages[i]) for i in structure.replaced(old, messages)}
            added = [self._short(m) for m in messages[len(old) :]]
            shorts.extend(added)
            for i, digest in replaced.items():
                shorts[i] = digest
            # Only appended: the string of last time with the new digests after it.
            joined = joined + "".join(added) if not replaced else "".join(shorts)
        else:
            shorts = [self._short(out[i]) for i in range(start, len(out))]
            joined = "".join(shorts)
        self._last_history.put(session, (now, start, shorts, joined))
        return joined

    def _strategy(self, ctx: StageContext) -> str:
        if self.options.strategy != "auto":
            return self.options.strategy
        return {"anthropic": "anthropic", "qwen": "prefix"}.get(ctx.model.family, "none")

    def _native_openai(self, ctx: StageContext) -> bool:
        if ctx.model.provider != "openai":
            return False
        if not self.options.api_base:
            return True
        host = (urlparse(self.options.api_base).hostname or "").lower()
        return host in OPENAI_HOSTS

    @staticmethod
    def _family(ctx: StageContext) -> str:
        return ctx.model.family or ctx.model.provider or ctx.model.name

    def _allowed_tools_supported(self, ctx: StageContext) -> bool:
        return (
            ctx.model.family in ALLOWED_TOOLS_FAMILIES and (ctx.model.provider or "openai") in ALLOWED_TOOLS_PROVIDERS
        )

    # -- the call -------------------------------------------------------------------------------
    def __call__(self, messages: Sequence[Message], ctx: StageContext) -> StageOutcome:
        opts = self.options
        state = ctx.state
        actions: list[Action] = []
        warnings: list[str] = []
        request: dict[str, Any] = {}

        tools, narrowed_to = self._tools(ctx, actions)
        if narrowed_to is not None and not self._allowed_tools_supported(ctx):
            # `stable_tools: always` where the narrowing cannot be said: the pack asked for it
            # (a gateway that passes tool_choice on, say), but the caller should know.
            dropped = sorted({_tool_name(t) for t in tools} - set(narrowed_to))
            warnings.append(
                f"stable_tools: always kept {len(dropped)} tool(s) the caller dropped ({', '.join(dropped)}), "
                f"and {self._family(ctx)} has no allowed_tools tool_choice to narrow them: the model "
                "may still call them (stable_tools: auto sends the caller's list there)"
            )
        allowed = self._allowed(tools, narrowed_to)
        if allowed is not None and narrowed_to is None and not self._allowed_tools_supported(ctx):
            # The pack's `allowed_tools` on a provider without tool_choice=allowed_tools
            # (Anthropic, Gemini, ...: the choice would be dropped on the way, every tool left
            # callable): the list itself is narrowed, a tools break the report shows.
            # None allowed: the list stays and tool_choice=none says so (a request holding
            # tool calls must still define tools on Anthropic).
            names = set(allowed)
            kept = [t for t in tools if _tool_name(t) in names]
            if kept:
                if len(kept) != len(tools):
                    actions.append(
                        Action(
                            "allowed_tools",
                            f"{len(kept)} of {len(tools)} tools sent ({self._family(ctx)} has no "
                            "allowed_tools tool_choice): " + ", ".join(allowed),
                        )
                    )
                tools, allowed = kept, None
        out = self._remove_own_markers(messages, state)
        out_shape = structure.shape(out)
        layers = _layers_of(out_shape)

        fingerprint = self._fingerprint(out, tools, layers, ctx, out_shape)
        self._report_breaks(state.get("prefix"), fingerprint, ctx, actions, warnings)

        strategy = self._strategy(ctx)
        ours: list[dict[str, Any]] = []
        if strategy in ("anthropic", "prefix"):
            carried = self._carried_counts(out, ctx)
            # A copy to place markers in (the input list is never changed).
            mutable = list(out) if out is messages else out
            out, ours = self._place(mutable, tools, layers, ctx, strategy, state, actions, warnings, carried)

        key_mode = opts.prompt_cache_key
        if key_mode == "always" or (key_mode == "auto" and self._native_openai(ctx)):
            key = ctx.cache_key or ctx.session_id
            if key:
                request["prompt_cache_key"] = key
                actions.append(Action("prompt_cache_key", f"prompt_cache_key={key}"))

        if allowed == [] and tools:
            # Nothing may be called: "none" says so without dropping the schemas from the prefix.
            request["tool_choice"] = "none"
            actions.append(
                Action(
                    "allowed_tools",
                    f"no tool allowed: tool_choice=none, {len(tools)} schemas kept for the cached prefix",
                )
            )
        elif allowed is not None:
            request["tool_choice"] = {
                "type": "allowed_tools",
                "allowed_tools": {
                    "mode": opts.allowed_tools_mode,
                    "tools": [{"type": "function", "function": {"name": n}} for n in allowed],
                },
            }
            actions.append(
                Action(
                    "allowed_tools",
                    f"{len(allowed)} of {len(tools)} tools allowed: " + ", ".join(allowed),
                )
            )

        state["prefix"] = fingerprint
        state["ours"] = ours
        state["tail"] = self._tail_record(out, layers)
        state["last_clock"] = ctx.clock
        # `out is messages`: no marker removed, placed or moved, the runner sees "nothing
        # changed" at once. Otherwise keep the caller's objects where nothing changed (the
        # runner and session rely on identity).
        final = out
        if out is not messages:
            final = list(out)
            changed = 0
            for i in structure.replaced(out, messages):
                if out[i] == messages[i]:
                    final[i] = messages[i]
                else:
                    changed += 1
            if not changed and len(final) == len(messages) and isinstance(messages, list):
                final = unchanged(messages)
        return StageOutcome(
            messages=final,
            actions=actions,
            request=request,
            tools=tools if tools != list(ctx.tools) else None,
            warnings=warnings,
        )

    # -- tools ------------------------------------------------------------------------------------
    def _tools(self, ctx: StageContext, actions: list[Action]) -> tuple[list[dict[str, Any]], list[str] | None]:
        """The tool list to send and, when the caller narrowed it, the names it passed."""
        opts = self.options
        given = [t for t in ctx.tools if isinstance(t, dict)]
        tools, normalized = self._own_tools(given, opts.normalize_tools)
        if normalized:
            actions.append(Action("tools_normalized", f"{len(tools)} tool schemas sorted and normalized"))
        keep = opts.stable_tools == "always" or (opts.stable_tools == "auto" and self._allowed_tools_supported(ctx))
        previous_id = ctx.state.get("tools_vault")
        if not keep or not previous_id or (not tools and not ctx.state.get("tool_names")):
            return self._remember(tools, ctx), None
        names = [_tool_name(t) for t in tools]
        prev_names = ctx.state.get("tool_names") or []
        if set(names) < set(prev_names):
            try:
                previous = json.loads(ctx.vault.get_text(previous_id))
            except StoreUnavailable:
                raise  # the store stopped answering: the turn fails at once (ctxrules.pipeline.runner)
            except Exception:  # a missing or corrupt vault entry: fall back to what was given
                previous = None
            if isinstance(previous, list):
                merged = {_tool_name(t): t for t in previous if isinstance(t, dict)}
                merged.update({_tool_name(t): t for t in tools})
                kept = normalize_tools(list(merged.values())) if opts.normalize_tools else list(merged.values())
                dropped = sorted(set(prev_names) - set(names))
                actions.append(
                    Action(
                        "tools_kept",
                        f"caller dropped {len(dropped)} tool(s) "
                        f"({', '.join(dropped)}); kept in the list and narrowed with allowed_tools "
                        "so the cached prefix survives",
                    )
                )
                return kept, sorted(names)
        return self._remember(tools, ctx), None

    def _remember(self, tools: list[dict[str, Any]], ctx: StageContext) -> list[dict[str, Any]]:
        names = [_tool_name(t) for t in tools]
        if names != ctx.state.get("tool_names"):
            ctx.state["tool_names"] = names
            ctx.state["tools_vault"] = (
                ctx.vault.put_text(json.dumps(tools, sort_keys=True, ensure_ascii=False)) if tools else None
            )
        return tools

    def _allowed(self, tools: list[dict[str, Any]], narrowed_to: list[str] | None) -> list[str] | None:
        globs = self.options.allowed_tools
        if globs is None and narrowed_to is None:
            return None
        names = [_tool_name(t) for t in tools]
        allowed = set(narrowed_to) if narrowed_to is not None else set(names)
        if globs is not None:
            allowed = {n for n in allowed if any(fnmatchcase(n, g) for g in globs)}
        return sorted(allowed)

    # -- markers ----------------------------------------------------------------------------------
    def unfinalize(self, messages: Sequence[Message], state: dict[str, Any]) -> list[Message]:
        """``messages`` (an output of this stage, read back from the session's store) without
        the breakpoints this stage placed on it, as its ``state`` records them: the list the
        content stages of the next turn run on (the same a session continuing in one process
        keeps, RunOutcome.basis). The list itself when there are none."""
        return self._remove_own_markers(messages, state)

    def _remove_own_markers(self, messages: Sequence[Message], state: dict[str, Any]) -> list[Message]:
        """``messages`` without the markers this stage placed last time (the list itself when
        there were none: copied on the first change)."""
        out = unchanged(messages)
        for rec in state.get("ours") or []:
            i = rec.get("i") if isinstance(rec, dict) else None
            if not isinstance(i, int) or not 0 <= i < len(out):
                continue
            plain = _unmark(out[i], self.marker, bool(rec.get("s")))
            if plain is not None:
                if out is messages:
                    out = list(messages)
                out[i] = plain
        return out

    def _place(
        self,
        out: list[Message],
        tools: list[dict[str, Any]],
        layers: PrefixLayers,
        ctx: StageContext,
        strategy: str,
        state: dict[str, Any],
        actions: list[Action],
        warnings: list[str],
        carried: tuple[int, Sequence[int]],
    ) -> tuple[list[Message], list[dict[str, Any]]]:
        """Breakpoints in ``out`` (a list of its own). ``carried``: the markers already on the
        messages and their running token totals (:meth:`_carried_counts`)."""
        opts = self.options
        on_messages, running = carried
        # The tools are the same objects call after call (_own_tools): counted once.
        existing = on_messages + self._layer(tools, _tool_markers)
        budget = opts.max_breakpoints - existing
        if existing > ANTHROPIC_LIMIT:
            warnings.append(
                f"the request already carries {existing} cache_control markers; providers accept "
                f"at most {ANTHROPIC_LIMIT} and will reject it"
            )
        if budget <= 0 or not out:
            if budget <= 0 and existing:
                actions.append(
                    Action(
                        "cache_markers_skipped",
                        f"{existing} cache_control marker(s) already present; none added",
                    )
                )
            return out, []
        tools_tokens = self._layer(tools, _tool_tokens, ctx.counter, layers.system_stop > 0)
        # The prompt's tokens up to and including message i.
        cumulative = _Cumulative(tools_tokens, running)

        def markable_at_or_before(i: int, floor: int) -> int | None:
            for j in range(min(i, len(out) - 1), floor - 1, -1):
                if _is_markable(out[j]):
                    return j
            return None

        system_end = markable_at_or_before(layers.workspace_stop - 1, 0) if layers.workspace_stop else None
        prefix_end = markable_at_or_before(layers.prefix_stop - 1, 0) if layers.prefix_stop else None
        candidates: list[tuple[str, int | None]] = []
        if strategy == "anthropic":
            tail = markable_at_or_before(len(out) - 1, 0)
            candidates.append(("conversation tail", tail))
            candidates.append(("system and workspace rules", system_end))
            candidates.append(("stable prefix", prefix_end))
            prev = state.get("tail")
            if isinstance(prev, dict) and isinstance(prev.get("i"), int) and tail is not None:
                pi = prev["i"]
                if (
                    0 <= pi < tail
                    and self._short(out[pi]) == prev.get("d")
                    and _blocks(out[pi + 1 : tail + 1]) > LOOKBACK_BLOCKS
                ):
                    candidates.append(("previous call's tail", pi))
        else:
            candidates.append(("stable prefix", prefix_end))
            candidates.append(("system and workspace rules", system_end))
        chosen: dict[int, str] = {}
        for why, i in candidates:
            if i is None or i in chosen or len(chosen) >= budget:
                continue
            if cumulative[i] < opts.min_prefix_tokens:
                continue
            # A breakpoint pays only if it caches a real stretch beyond its neighbours.
            below = max((cumulative[j] for j in chosen if j < i), default=0)
            above = min((cumulative[j] for j in chosen if j > i), default=None)
            if cumulative[i] - below < opts.min_gain_tokens or (
                above is not None and above - cumulative[i] < opts.min_gain_tokens
            ):
                continue
            chosen[i] = why
        ours: list[dict[str, Any]] = []
        for i in sorted(chosen):
            marked = _mark(out[i], self.marker)
            if marked is None:
                continue
            out[i], was_string = marked
            ours.append({"i": i, "s": was_string})
            actions.append(
                Action(
                    "cache_breakpoint",
                    f"{chosen[i]}: cache_control after message {i} (caches a {cumulative[i]}-token prefix)",
                    index=i,
                )
            )
        return out, ours

    def _carried_counts(self, out: Sequence[Message], ctx: StageContext) -> tuple[int, Sequence[int]]:
        """The ``cache_control`` markers on the messages of ``out`` and the running totals of
        their tokens (the first i+1 messages' at i). Kept per message from the last call, like
        the history digests (:meth:`_shorts`): a warm turn's list is the last one with messages
        appended and perhaps a few replaced (the markers of the last call taken off), and only
        those are walked and counted, and the totals written again from the first of them on.
        The totals are the stage's own list: read them before the next call."""
        self._forget_if_edited()
        last = self._counted.pop(ctx.session_id)
        now = structure.shape(out)
        if last is not None and last[1] is ctx.counter:
            old_shape, _, marks, tokens, running, total = last
            start = now.extends(old_shape)
            if start is None and old_shape.snapshot is not None and len(old_shape.snapshot) <= len(out):
                start = len(old_shape.snapshot)
                for i in structure.replaced(old_shape.snapshot, out):
                    mark = count_markers([out[i]])
                    total += mark - marks[i]
                    marks[i], tokens[i] = mark, ctx.counter.count_each([out[i]])[0]
                    del running[i:]  # the totals from here on are written again
            if start is None:
                marks, tokens, running, start, total = [], [], [], 0, 0
        else:
            marks, tokens, running, start, total = [], [], [], 0, 0
        if start < len(out):
            appended = out[start:]
            added = [count_markers((m,)) for m in appended]
            marks.extend(added)
            total += sum(added)
            tokens.extend(ctx.counter.count_each(appended))
        done = len(running)
        if done < len(tokens):
            running.extend(itertools.accumulate(tokens[done:], initial=running[-1] if running else 0))
            del running[done]  # the initial value, which accumulate yields first
        self._counted.put(ctx.session_id, (now, ctx.counter, marks, tokens, running, total))
        return total, running

    def _tail_record(self, out: list[Message], layers: PrefixLayers) -> dict[str, Any] | None:
        if not out:
            return None
        i = len(out) - 1
        return {"i": i, "d": self._short(out[i])}

    # -- fingerprint and breaks -----------------------------------------------------------------
    def _fingerprint(
        self,
        out: list[Message],
        tools: list[dict[str, Any]],
        layers: PrefixLayers,
        ctx: StageContext,
        out_shape: structure.Shape | None = None,
    ) -> dict[str, Any]:
        # The layers are the same objects call after call: their digests are remembered.
        system = out[: layers.system_stop]
        workspace = out[layers.system_stop : layers.workspace_stop]
        anchor = [out[layers.anchor]] if layers.anchor is not None else []
        system_digest, system_chars = self._layer(system, _system_layer)
        tools_digest, tool_digests = self._layer(tools, _tools_layer)
        fp: dict[str, Any] = {
            "model": ctx.model.name,
            "system": system_digest,
            "system_chars": system_chars,
            "tools": tools_digest,
            "tool_digests": dict(tool_digests),
            "workspace": self._layer(workspace, _messages_digest),
            "workspace_count": len(workspace),
            "first_user": self._layer(anchor, _anchor_digest),
            # One string of fixed-width digests (not a list): the state file stays cheap to
            # write however long the history grows.
            "history": self._shorts(out, layers.history_start, ctx.session_id, out_shape),
            "history_start": layers.history_start,
        }
        stable = (fp["model"], fp["tools"], fp["system"], fp["workspace"], fp["first_user"])
        known = self._stable
        if known is None or known[0] != stable:  # the same layers turn after turn: digested once
            known = self._stable = (stable, _digest(list(stable)))
        fp["stable"] = known[1]
        return fp

    def _report_breaks(
        self,
        prev: Any,
        cur: dict[str, Any],
        ctx: StageContext,
        actions: list[Action],
        warnings: list[str],
    ) -> None:
        if not isinstance(prev, dict):
            actions.append(
                Action(
                    "cache_prefix",
                    f"first call of this session: prefix {cur['stable'][:12]} will be written to the provider's cache",
                )
            )
            return
        layers: list[str] = []
        if prev.get("model") != cur["model"]:
            layers.append(f"model changed ({prev.get('model')} -> {cur['model']})")
        if prev.get("tools") != cur["tools"]:
            layers.append("tools changed (" + _tool_diff(prev.get("tool_digests") or {}, cur["tool_digests"]) + ")")
        if prev.get("system") != cur["system"]:
            layers.append(f"system prompt changed ({prev.get('system_chars')} -> {cur['system_chars']} chars)")
        if prev.get("workspace") != cur["workspace"]:
            layers.append(
                f"workspace rules changed ({prev.get('workspace_count')} -> "
                f"{cur['workspace_count']} "
                "message(s) between the system prompt and the first user message)"
            )
        if prev.get("first_user") != cur["first_user"]:
            layers.append(
                "first user message changed"
                if prev.get("first_user") and cur["first_user"]
                else "first user message appeared"
                if cur["first_user"]
                else "first user message gone"
            )
        ttl = TTL_SECONDS.get(self.options.ttl or "5m", 300.0)
        last_clock = ctx.state.get("last_clock")
        if isinstance(last_clock, int | float) and ctx.clock - last_clock >= ttl:
            actions.append(
                Action(
                    "cache_expired",
                    f"idle {ctx.clock - last_clock:.0f} s since the previous call, "
                    f"longer than the {ttl:.0f} s cache TTL: the prefix is re-written",
                )
            )
        appeared = layers == ["first user message appeared"]
        if layers and not appeared:
            detail = "prefix cache broke: " + "; ".join(layers)
            actions.append(Action("cache_break", detail))
            if self.options.report_breaks:
                warnings.append(detail)
            return
        old, new = _history_string(prev.get("history")), cur["history"]
        if prev.get("history_start") != cur["history_start"]:
            return
        common = min(len(old), len(new))
        # (startswith: no copy of either string, which grows with the history)
        if not (new.startswith(old) if len(new) >= len(old) else old.startswith(new)):
            k = next(k for k in range(0, common, _SHORT) if old[k : k + _SHORT] != new[k : k + _SHORT])
            at = cur["history_start"] + k // _SHORT
            actions.append(
                Action(
                    "cache_break",
                    f"history rewritten from message {at} (compaction or an edit): the cached prefix ends before it",
                    index=at,
                )
            )
            return
        if len(new) < len(old):
            actions.append(
                Action(
                    "cache_break",
                    f"history shortened from {len(old) // _SHORT} to {len(new) // _SHORT} messages after "
                    "the first user message: the cached prefix ends there",
                )
            )
            return
        if not appeared:
            actions.append(
                Action(
                    "cache_prefix",
                    f"stable prefix unchanged ({cur['stable'][:12]}); "
                    f"{(len(new) - len(old)) // _SHORT} message(s) appended",
                )
            )


def _system_layer(messages: Sequence[Mapping[str, Any]]) -> tuple[str, int]:
    system = [canonical_message(m) for m in messages]
    return _digest(system), sum(len(json.dumps(m, ensure_ascii=False)) for m in system)


def _tools_layer(tools: Sequence[Mapping[str, Any]]) -> tuple[str, tuple[tuple[str, str], ...]]:
    plain = [_strip_markers(t) for t in tools]
    return _digest(plain), tuple((_tool_name(t), _digest(t)[:_SHORT]) for t in plain)


def _messages_digest(messages: Sequence[Mapping[str, Any]]) -> str:
    return _digest([canonical_message(m) for m in messages])


def _anchor_digest(messages: Sequence[Mapping[str, Any]]) -> str | None:
    return _digest(canonical_message(messages[0])) if messages else None


def _history_string(value: Any) -> str:
    """The stored history digests as one string (states written before 0.x kept a list)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(v for v in value if isinstance(v, str) and len(v) == _SHORT)
    return ""


def _tool_markers(tools: Sequence[Mapping[str, Any]]) -> int:
    return count_markers((), tools)


def _tool_tokens(tools: Sequence[Mapping[str, Any]], counter: TokenCounter, has_system_message: bool) -> int:
    return counter.count_tools(tools, has_system_message=has_system_message)


@dataclass(frozen=True)
class _Cumulative:
    """The prompt's tokens up to and including message ``i``: the tools', then the messages'
    running total (indexed like the list ``cumulative[i]`` it stands for, without building it)."""

    tools: int
    running: Sequence[int]

    def __getitem__(self, i: int) -> int:
        return self.tools + self.running[i]


def _blocks(messages: Sequence[Mapping[str, Any]]) -> int:
    """Rough content-block count of ``messages`` as Anthropic sees them."""
    n = 0
    for m in messages:
        content = m.get("content")
        n += len(content) if isinstance(content, list) else 1
        calls = m.get("tool_calls")
        n += len(calls) if isinstance(calls, list) else 0
    return n


def _tool_diff(prev: Mapping[str, str], cur: Mapping[str, str]) -> str:
    added = sorted(set(cur) - set(prev))
    removed = sorted(set(prev) - set(cur))
    changed = sorted(n for n in set(cur) & set(prev) if cur[n] != prev[n])
    parts = []
    if added:
        parts.append("added: " + ", ".join(added))
    if removed:
        parts.append("removed: " + ", ".join(removed))
    if changed:
        parts.append("schema changed: " + ", ".join(changed))
    return "; ".join(parts) or "order or duplicates changed"


STAGE_TYPE = StageType(
    name="cache.markers",
    phase="finalize",
    factory=CacheMarkers,
    options_schema=OPTIONS_SCHEMA,
    description="Keeps the provider's prompt-cache prefix stable: tool schemas normalized, "
    "cache_control "
    "breakpoints (Anthropic, Qwen), prompt_cache_key (OpenAI), allowed_tools narrowing, and a "
    "report of which layer broke the cache.",
)


@hookimpl
def ctxrules_register_stages(register: Any) -> None:
    register(STAGE_TYPE)
