"""Provider prompt caching, modelled from the providers' documented rules (not from bills).

A request is seen as a sequence of *blocks* — the tool schemas (one block), then each message —
each with a digest of what it says (cache breakpoints left out: moving a breakpoint does not
change the cached bytes) and a token count. A prefix is identified by the chained digest of its
blocks, so "the same prefix" means byte-identical content up to there.

- :class:`AutomaticPrefixCache` (OpenAI-style, also used for every provider without explicit
  breakpoints): the longest prefix, at block boundaries, that an earlier request of the session
  also sent is read from the cache, counted from 1,024 tokens in 128-token steps. Every request
  writes its own prefixes; writes cost the normal input price. Entries expire after ``ttl_s`` of
  not being used (default 600 s: the providers keep prefixes 5-10 minutes, longer off-peak).
- :class:`BreakpointCache` (Anthropic-style): only prefixes that end at a ``cache_control``
  breakpoint are cached. A request reads the longest such prefix that an earlier request wrote
  (or read) within ``ttl_s`` (300 s, refreshed on every hit), and writes the tokens from there up
  to its own last breakpoint; a prefix under ``min_tokens`` (1,024) is never cached.

Both work at block granularity: a cache hit that ends inside a message (providers cache token
prefixes) is not counted, which makes the model slightly conservative for requests whose last
shared message was edited.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate, compress, count, islice, repeat
from operator import attrgetter, gt, sub
from typing import Any

from ctxrules.eval.shared import same_values, shared_prefix

__all__ = [
    "AutomaticPrefixCache",
    "Block",
    "BlockChain",
    "BreakpointCache",
    "CacheModel",
    "CacheUse",
    "blocks_of",
    "cache_model_for",
]

MARKER_KEY = "cache_control"
_CHAIN = attrgetter("chain")
_TOKENS = attrgetter("tokens")
_BREAKPOINT = attrgetter("breakpoint")


@dataclass(frozen=True)
class Block:
    """One unit of a request: its chained prefix digest (this block and all before it), its
    tokens, and whether a cache breakpoint ends on it."""

    chain: str
    tokens: int
    breakpoint: bool


@dataclass(frozen=True)
class CacheUse:
    """What one request did to the cache: tokens read from it, tokens written to it, and the
    request's prompt tokens in all (reads and writes included)."""

    prompt: int
    read: int
    write: int

    @property
    def uncached(self) -> int:
        """Prompt tokens billed at the normal input price (writes not included)."""
        return self.prompt - self.read - self.write


def _strip(value: Any) -> tuple[Any, bool]:
    """``value`` without ``cache_control`` keys, and whether it had any."""
    if isinstance(value, Mapping):
        marked = MARKER_KEY in value
        out = {}
        for k, v in value.items():
            if k == MARKER_KEY:
                continue
            out[k], inner = _strip(v)
            marked = marked or inner
        return out, marked
    if isinstance(value, list):
        items = [_strip(v) for v in value]
        return [v for v, _ in items], any(m for _, m in items)
    return value, False


def blocks_of(
    messages: Sequence[Mapping[str, Any]],
    tokens: Sequence[int],
    tools: Sequence[Mapping[str, Any]] = (),
    tool_tokens: int = 0,
) -> list[Block]:
    """The blocks of a request (``tokens``: each message's count), on their own."""
    return BlockChain().blocks(messages, tokens, tools, tool_tokens)


class BlockChain:
    """:func:`blocks_of` for the requests of one replay, in order: the blocks of the messages a
    request shares with the one before (the same objects, at the same places, with the same
    counts, after the same tools) are taken from it, and only the rest is serialised and hashed.
    Each call of a replay sends its last output plus a step, so a replay of N calls serialised
    N²/2 messages; the blocks are those of the request on its own (:func:`blocks_of`).

    The tools are the same when they serialise to the same text (breakpoints left out), which
    is only made again when they are not the same objects as last time: a runner hands a new
    list with every call (an empty one, or the tools with a breakpoint on the last), and
    comparing the list object made every call hash the whole request again. The shared prefix
    is found by :func:`shared_prefix`, so what a call costs in Python steps grows with what
    changed, not with the request.

    Where a request changes a message (a compaction), every block from there on has a new
    chained digest, but the messages after it are mostly the objects the last request sent:
    their serialised text is kept per object (the replay never edits a message in place), and
    only the digests are chained again."""

    def __init__(self) -> None:
        self._tools: tuple[tuple[Mapping[str, Any], ...], int] | None = None  # the last tools, tokens
        self._tools_text = b""  # their serialised text (breakpoints left out)
        self._base: Any = None  # the digest state after the tools
        self._head: list[Block] = []  # the tools' block, when there are tools
        self._messages: list[Mapping[str, Any]] = []
        self._tokens: list[int] = []
        self._states: list[Any] = []  # the digest state after each message
        self._blocks: list[Block] = []
        self._texts: list[tuple[bytes, bool]] = []  # each message's text, and whether marked

    def blocks(
        self,
        messages: Sequence[Mapping[str, Any]],
        tokens: Sequence[int],
        tools: Sequence[Mapping[str, Any]] = (),
        tool_tokens: int = 0,
    ) -> list[Block]:
        if len(messages) != len(tokens):
            raise ValueError("one token count per message")
        fresh = False  # a new chain: nothing is shared with the last request
        if (
            self._tools is None
            or self._tools[1] != tool_tokens
            or len(self._tools[0]) != len(tools)
            or shared_prefix(self._tools[0], tools) != len(tools)
        ):
            text, marked = b"", False
            if tools:
                clean, marked = _strip(list(tools))
                text = json.dumps(clean, sort_keys=True, ensure_ascii=False).encode("utf-8", "replace")
            if self._tools is None or text != self._tools_text:  # other tools: a new chain
                self._base, self._tools_text, fresh = hashlib.sha256(text), text, True
            self._head = [Block(self._base.copy().hexdigest(), tool_tokens, marked)] if tools else []
            self._tools = (tuple(tools), tool_tokens)
        same = 0 if fresh else same_values(self._tokens, tokens, shared_prefix(self._messages, messages))
        # The messages this request no longer sends where the last one did: after a
        # compaction they are mostly sent again further on, their texts taken from here.
        dropped = {id(msg): (msg, text) for msg, text in zip(self._messages[same:], self._texts[same:], strict=True)}
        del self._messages[same:], self._tokens[same:], self._states[same:], self._blocks[same:]
        del self._texts[same:]
        chain = (self._states[-1] if self._states else self._base).copy()
        for msg, n in zip(messages[same:], tokens[same:], strict=True):
            hit = dropped.get(id(msg))
            if hit is not None and hit[0] is msg:
                text, marked = hit[1]
            else:
                clean, marked = _strip(msg)
                text = json.dumps(clean, sort_keys=True, ensure_ascii=False).encode("utf-8", "replace")
            chain.update(b"\x00")
            chain.update(text)
            self._messages.append(msg)
            self._tokens.append(n)
            self._texts.append((text, marked))
            self._states.append(chain.copy())
            self._blocks.append(Block(chain.copy().hexdigest(), n, marked))
        return [*self._head, *self._blocks]


class CacheModel:
    """A session's provider cache; :meth:`request` accounts one request at ``clock``."""

    def request(self, blocks: Sequence[Block], clock: float) -> CacheUse:  # pragma: no cover
        raise NotImplementedError


class AutomaticPrefixCache(CacheModel):
    """OpenAI-style automatic prefix caching (see the module docstring).

    A block's chain names its whole prefix, so one chain is at one place of a request. Every
    request writes all its prefixes at its clock, so what the next request shares with it
    (the same :class:`Block` objects at the same places, as :class:`BlockChain` hands them) was
    last used at that clock: those blocks are not looked up one by one, and only the blocks the
    last request sent past the shared ones are written to the table when the next one comes.
    Per request, the work in Python steps grows with what changed, not with the request: a
    replay of N calls walked and wrote N²/2 blocks."""

    def __init__(self, *, min_tokens: int = 1024, step: int = 128, ttl_s: float = 600.0) -> None:
        self.min_tokens = min_tokens
        self.step = step
        self.ttl_s = ttl_s
        self._seen: dict[str, float] = {}  # prefix chain -> last use, but for the last request's
        self._last: list[Block] = []  # the last request's blocks, all used at _last_clock
        self._last_clock = 0.0
        self._ends: list[int] = []  # the tokens up to the end of each of the last request's blocks

    def request(self, blocks: Sequence[Block], clock: float) -> CacheUse:
        same = shared_prefix(self._last, blocks)
        self._seen.update(zip(map(_CHAIN, self._last[same:]), repeat(self._last_clock)))
        ends = self._ends[:same]
        ends.extend(islice(accumulate(map(_TOKENS, blocks[same:]), initial=ends[-1] if ends else 0), 1, None))
        # The shared prefix ends at the first block not seen, or seen longer than ttl_s ago.
        if same and clock - self._last_clock > self.ttl_s:
            fresh = 0
        else:
            lasts = map(self._seen.get, map(_CHAIN, blocks[same:]), repeat(-math.inf))  # never seen: stale
            stale = map(gt, map(sub, repeat(clock), lasts), repeat(self.ttl_s))
            fresh = same + next(compress(count(), stale), len(blocks) - same)
        shared = ends[fresh - 1] if fresh else 0
        read = (shared // self.step) * self.step if shared >= self.min_tokens else 0
        self._last, self._last_clock, self._ends = list(blocks), clock, ends
        return CacheUse(ends[-1] if ends else 0, read, 0)


class BreakpointCache(CacheModel):
    """Anthropic-style explicit breakpoints (see the module docstring). ``implicit_last``: treat
    the last block as a breakpoint when the request carries none (an agent that marks its own
    requests, as the baselines are assumed to)."""

    def __init__(self, *, min_tokens: int = 1024, ttl_s: float = 300.0, implicit_last: bool = False) -> None:
        self.min_tokens = min_tokens
        self.ttl_s = ttl_s
        self.implicit_last = implicit_last
        self._entries: dict[str, float] = {}  # prefix chain at a breakpoint -> last use

    def request(self, blocks: Sequence[Block], clock: float) -> CacheUse:
        ends = list(accumulate(map(_TOKENS, blocks)))  # the tokens up to each block's end
        prompt = ends[-1] if ends else 0
        marks = list(compress(count(), map(_BREAKPOINT, blocks)))
        if not marks and self.implicit_last and blocks:
            marks = [len(blocks) - 1]
        read = 0
        for i in marks:
            last = self._entries.get(blocks[i].chain)
            if last is not None and clock - last <= self.ttl_s and ends[i] >= self.min_tokens:
                read = max(read, ends[i])
                self._entries[blocks[i].chain] = clock
        write = 0
        if marks and ends[marks[-1]] >= self.min_tokens:
            write = max(0, ends[marks[-1]] - read)
            for i in marks:
                if ends[i] >= self.min_tokens:
                    self._entries[blocks[i].chain] = clock
        return CacheUse(prompt, read, write)


def cache_model_for(family: str, *, baseline: bool) -> CacheModel:
    """The cache model of a provider family (``ctxrules.models`` families): Anthropic's
    breakpoint rule for ``anthropic``, automatic prefix caching for every other family."""
    if family == "anthropic":
        return BreakpointCache(implicit_last=baseline)
    return AutomaticPrefixCache()
