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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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

    Where a request changes a message (a compaction), every block from there on has a new
    chained digest, but the messages after it are mostly the objects the last request sent:
    their serialised text is kept per object (the replay never edits a message in place), and
    only the digests are chained again."""

    def __init__(self) -> None:
        self._tools: tuple[Sequence[Mapping[str, Any]], int] | None = None
        self._base: Any = None  # the digest state after the tools
        self._head: list[Block] = []  # the tools' block, when there are tools
        self._messages: list[Mapping[str, Any]] = []
        self._tokens: list[int] = []
        self._states: list[Any] = []  # the digest state after each message
        self._blocks: list[Block] = []
        # id of each message of the last request -> (the message, its text, whether marked)
        self._texts: dict[int, tuple[Mapping[str, Any], bytes, bool]] = {}

    def blocks(
        self,
        messages: Sequence[Mapping[str, Any]],
        tokens: Sequence[int],
        tools: Sequence[Mapping[str, Any]] = (),
        tool_tokens: int = 0,
    ) -> list[Block]:
        if len(messages) != len(tokens):
            raise ValueError("one token count per message")
        if self._tools is None or self._tools[0] is not tools or self._tools[1] != tool_tokens:
            chain = hashlib.sha256()
            self._head = []
            if tools:
                clean, marked = _strip(list(tools))
                chain.update(json.dumps(clean, sort_keys=True, ensure_ascii=False).encode("utf-8", "replace"))
                self._head = [Block(chain.copy().hexdigest(), tool_tokens, marked)]
            self._tools, self._base = (tools, tool_tokens), chain
            self._messages, self._tokens, self._states, self._blocks = [], [], [], []
        same = 0
        for old, new, was, now in zip(self._messages, messages, self._tokens, tokens, strict=False):
            if old is not new or was != now:
                break
            same += 1
        del self._messages[same:], self._tokens[same:], self._states[same:], self._blocks[same:]
        chain = (self._states[-1] if self._states else self._base).copy()
        kept, texts = self._texts, {}
        for msg in messages[:same]:
            hit = kept.get(id(msg))  # None only after a call that failed part-way
            if hit is not None:
                texts[id(msg)] = hit
        for msg, count in zip(messages[same:], tokens[same:], strict=True):
            hit = kept.get(id(msg))
            if hit is not None and hit[0] is msg:
                _, text, marked = hit
            else:
                clean, marked = _strip(msg)
                text = json.dumps(clean, sort_keys=True, ensure_ascii=False).encode("utf-8", "replace")
            texts[id(msg)] = (msg, text, marked)
            chain.update(b"\x00")
            chain.update(text)
            self._messages.append(msg)
            self._tokens.append(count)
            self._states.append(chain.copy())
            self._blocks.append(Block(chain.copy().hexdigest(), count, marked))
        self._texts = texts
        return [*self._head, *self._blocks]


class CacheModel:
    """A session's provider cache; :meth:`request` accounts one request at ``clock``."""

    def request(self, blocks: Sequence[Block], clock: float) -> CacheUse:  # pragma: no cover
        raise NotImplementedError


class AutomaticPrefixCache(CacheModel):
    """OpenAI-style automatic prefix caching (see the module docstring)."""

    def __init__(self, *, min_tokens: int = 1024, step: int = 128, ttl_s: float = 600.0) -> None:
        self.min_tokens = min_tokens
        self.step = step
        self.ttl_s = ttl_s
        self._seen: dict[str, float] = {}  # prefix chain -> last use

    def request(self, blocks: Sequence[Block], clock: float) -> CacheUse:
        prompt = sum(b.tokens for b in blocks)
        shared = 0
        total = 0
        for block in blocks:
            total += block.tokens
            last = self._seen.get(block.chain)
            if last is None or clock - last > self.ttl_s:
                break
            shared = total
        read = (shared // self.step) * self.step if shared >= self.min_tokens else 0
        for block in blocks:
            self._seen[block.chain] = clock
        return CacheUse(prompt, read, 0)


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
        prompt = sum(b.tokens for b in blocks)
        marks = [i for i, b in enumerate(blocks) if b.breakpoint]
        if not marks and self.implicit_last and blocks:
            marks = [len(blocks) - 1]
        ends: list[int] = []
        total = 0
        for block in blocks:
            total += block.tokens
            ends.append(total)
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
