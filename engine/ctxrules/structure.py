"""The structure of a message list: per-message facts, tool pairing, steps, exchanges and pins.

**Pairing.** A tool result answers the most recent still-unanswered call with its
``tool_call_id`` (ids may repeat across turns); within one assistant message the earliest such
call goes first. A result that finds no such call *supersedes* the stand-in answering the
most recent call with that id, when that answer is ctxrules' own stand-in
(:data:`STAND_IN_KIND`, signed under the current key): the agent's real result arrived after
all (later in the list, or on a later turn, whose pipeline runs on the last output). Otherwise
it is a *duplicate* when an earlier call with that id exists (already answered), else an
*orphan*. :func:`pair_tool_calls` is the one
implementation; :func:`steps`, :func:`pinned_indices` and the ``normalize.tool_pairs`` stage
all use it, so they never disagree about which result belongs where.

**Remembered per list, derived from the last one.** Every stage asks about the list it was
given, and a session's next turn hands the pipeline the last output plus a few appended
messages. :func:`shape` computes the facts of a list once (role, injected or not, images,
longest text, call and result ids) and derives them from a recently seen list when it can:

- the new list *extends* it (same message objects, then more): the facts of the new messages
  are computed and the pairing scan resumes where it stopped;
- the new list has the same length and differs in a few *replaced* messages (a stage shortened
  some): those facts are recomputed, and when the replacements keep their role, injected flag
  and call/result ids the pairing and the pins are shared as they are.

Otherwise every message is looked up in a per-object memo. Message dicts are never changed in
place by ctxrules; a caller that edits one in place is noticed by the session, which calls
:func:`forget` before the run.
"""

from __future__ import annotations

import itertools
import operator
import weakref
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ctxrules.injected import current_key
from ctxrules.messages import has_tool_calls, injected_kind, injected_meta, tool_call_id

STAND_IN_KIND = "interrupted"
"""The injected kind of the result ``normalize.tool_pairs`` gives a call that has none: a
stand-in that a real result for the call, arriving later, replaces (see "Pairing")."""

PIN_SIGNED_PREFIX: ContextVar[bool] = ContextVar("ctxrules_pin_signed_prefix", default=False)
"""Set while a pack's ``thinking.clean`` has ``preserved_thinking: pin``: every message up to
the newest one with signed thinking is pinned too (a preserved-thinking signature covers its
whole prefix, so no stage may change it)."""

__all__ = [
    "STAND_IN_KIND",
    "Exchange",
    "Facts",
    "Shape",
    "Step",
    "ToolPairing",
    "exchanges",
    "facts_of",
    "forget",
    "generation",
    "pair_tool_calls",
    "pinned_indices",
    "replaced",
    "shape",
    "steps",
]

CallKey = tuple[int, int]
"""A tool call as ``(index of its assistant message, position in its tool_calls)``."""

_LEADING_ROLES = frozenset({"system", "developer"})
_RESULT_ROLES = frozenset({"tool", "function"})


# --- per-message facts ----------------------------------------------------------------------


class Facts(NamedTuple):
    """What the structure of a list needs to know about one message."""

    role: Any
    injected: bool
    """ctxrules made it (:func:`ctxrules.messages.is_injected`)."""
    real_user: bool
    """A ``user`` message that is not injected."""
    media: bool
    """The content has an image part."""
    longest: int
    """Characters of the longest text: a string content, or the longest text part."""
    calls: tuple[str | None, ...] | None
    """The ids of its tool calls (``None`` for one without a usable id) when it has any."""
    result_id: str | None
    """A tool result's ``tool_call_id`` when it is a non-empty string."""
    signed: bool = False
    """An assistant message with signed thinking (a signature, or redacted thinking data)."""
    stand_in: str | None = None
    """For ctxrules' own stand-in for a missing tool result (:data:`STAND_IN_KIND`): the id the
    agent gave the call (its ``call`` attribute when the repair renamed a reused id, else its
    own ``tool_call_id``); None for every other message."""

    @property
    def structure(self) -> tuple[Any, ...]:
        """What pairing, steps and pins depend on."""
        return (self.role, self.real_user, self.calls, self.result_id, self.signed, self.stand_in)


def _compute_facts(msg: Mapping[str, Any]) -> Facts:
    role = msg.get("role")
    content = msg.get("content")
    longest = 0
    media = False
    if isinstance(content, str):
        longest = len(content)
    elif isinstance(content, list):
        for part in content:
            if not isinstance(part, Mapping):
                continue
            kind = part.get("type")
            if kind in ("image_url", "image"):
                media = True
            text = part.get("text")
            if isinstance(text, str) and len(text) > longest:
                longest = len(text)
    kind = injected_kind(msg)
    injected = kind is not None
    calls = tuple(tool_call_id(c) for c in msg["tool_calls"]) if has_tool_calls(msg) else None
    result = msg.get("tool_call_id")
    result_id = result if isinstance(result, str) and result else None
    stand_in = None
    if role == "tool" and kind == STAND_IN_KIND:
        stand_in = injected_meta(msg).get("call") or result_id or ""
    return Facts(
        role,
        injected,
        role == "user" and not injected,
        media,
        longest,
        calls,
        result_id,
        role == "assistant" and _has_signed_thinking(msg),
        stand_in,
    )


def _has_signed_thinking(msg: Mapping[str, Any]) -> bool:
    blocks = (
        [*(msg.get("thinking_blocks") or []), *(msg.get("content") or [])]
        if isinstance(msg.get("content") or [], list)
        else list(msg.get("thinking_blocks") or [])
    )
    for block in blocks:
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if (kind == "thinking" and block.get("signature")) or (kind == "redacted_thinking" and block.get("data")):
            return True
    return False


_FACTS: dict[int, tuple[Mapping[str, Any], Any, Any, Any, Facts]] = {}
_FACTS_LIMIT = 200_000


def facts_of(msg: Mapping[str, Any]) -> Facts:
    """The facts of one message, remembered per message object (holding the object keeps its
    id from being reused; a new ``content`` or ``tool_calls`` object is noticed). "Injected"
    depends on the session's key, so the key is part of the memo."""
    hit = _FACTS.get(id(msg))
    key = current_key()
    if (
        hit is not None
        and hit[0] is msg
        and hit[1] is msg.get("content")
        and hit[2] is msg.get("tool_calls")
        and hit[3] is key
    ):
        return hit[4]
    facts = _compute_facts(msg)
    if len(_FACTS) >= _FACTS_LIMIT:
        _FACTS.clear()
    _FACTS[id(msg)] = (msg, msg.get("content"), msg.get("tool_calls"), key, facts)
    return facts


# --- pairing --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolPairing:
    """Which tool result answers which call (see the module docstring for the rule).

    ``positional`` lists results without a ``tool_call_id`` that were matched, in order, to
    id-less calls of the assistant message whose block they sit in: the repair stage gives
    both the same generated id. ``superseded`` maps each stand-in a real result replaced to
    the call it stood in for (it answers nothing any more; the repair stage drops it).
    """

    result_of: Mapping[CallKey, int]
    call_of: Mapping[int, CallKey]
    orphans: tuple[int, ...]
    duplicates: Mapping[int, CallKey]
    unanswered: tuple[CallKey, ...]
    positional: frozenset[int] = field(default_factory=frozenset)
    superseded: Mapping[int, CallKey] = field(default_factory=dict)


class _PairScan:
    """The pairing pass as a state that can be resumed on appended messages."""

    __slots__ = (
        "_made",
        "block_owner",
        "call_of",
        "duplicates",
        "idless",
        "last_call",
        "open_calls",
        "orphans",
        "positional",
        "renamed",
        "result_of",
        "stop",
        "superseded",
        "unanswered",
    )

    def __init__(self) -> None:
        # Per id, its open calls in runs of one assistant message each (a result takes the
        # first open call of the newest run): a deque per run, so that 40,000 calls sharing an
        # id in one message are answered in linear time, not by a walk over the run each.
        self.open_calls: dict[str, list[deque[CallKey]]] = {}
        self.last_call: dict[str, CallKey] = {}
        self.idless: dict[int, deque[int]] = {}
        self.result_of: dict[CallKey, int] = {}
        self.call_of: dict[int, CallKey] = {}
        self.orphans: list[int] = []
        self.duplicates: dict[int, CallKey] = {}
        self.positional: set[int] = set()
        self.superseded: dict[int, CallKey] = {}
        # The agent's id -> the call the repair renamed from it that a stand-in answers.
        self.renamed: dict[str, CallKey] = {}
        self.unanswered: dict[CallKey, None] = {}
        self.block_owner: int | None = None
        self.stop = 0
        self._made: ToolPairing | None = None

    def copy(self) -> _PairScan:
        out = _PairScan.__new__(_PairScan)
        out.open_calls = {k: [deque(run) for run in v] for k, v in self.open_calls.items() if v}
        out.last_call = dict(self.last_call)
        out.idless = {k: deque(v) for k, v in self.idless.items() if v}
        out.result_of = dict(self.result_of)
        out.call_of = dict(self.call_of)
        out.orphans = list(self.orphans)
        out.duplicates = dict(self.duplicates)
        out.positional = set(self.positional)
        out.superseded = dict(self.superseded)
        out.renamed = dict(self.renamed)
        out.unanswered = dict(self.unanswered)
        out.block_owner = self.block_owner
        out.stop = self.stop
        out._made = None
        return out

    def feed(self, facts: Sequence[Facts]) -> None:
        """Scan ``facts[self.stop:]``."""
        open_calls, result_of, call_of = self.open_calls, self.result_of, self.call_of
        block_owner = self.block_owner
        for index in range(self.stop, len(facts)):
            f = facts[index]
            role = f.role
            if role == "assistant":
                block_owner = index
                if f.calls is None:
                    continue
                for pos, cid in enumerate(f.calls):
                    key = (index, pos)
                    self.unanswered[key] = None
                    if cid is None:
                        self.idless.setdefault(index, deque()).append(pos)
                    else:
                        runs = open_calls.setdefault(cid, [])
                        if runs and runs[-1][-1][0] == index:
                            runs[-1].append(key)
                        else:
                            runs.append(deque((key,)))
                        self.last_call[cid] = key
                continue
            if role not in _RESULT_ROLES:
                block_owner = None
                continue
            if role != "tool":
                continue
            cid = f.result_id
            if cid is None:
                waiting = self.idless.get(block_owner) if block_owner is not None else None
                if block_owner is not None and waiting:
                    key = (block_owner, waiting.popleft())
                    result_of[key] = index
                    call_of[index] = key
                    del self.unanswered[key]
                    self.positional.add(index)
                else:
                    self.orphans.append(index)
                continue
            pending = open_calls.get(cid)
            if pending:
                # The earliest open call of the most recent assistant message with this id.
                key = pending[-1].popleft()
                if not pending[-1]:
                    pending.pop()
                if not pending:  # answered: copies of the scan (a warm turn's) skip it
                    del open_calls[cid]
                result_of[key] = index
                call_of[index] = key
                del self.unanswered[key]
                if f.stand_in is not None and f.stand_in != cid:
                    self.renamed[f.stand_in] = key
            elif cid in self.last_call or cid in self.renamed:
                stood = self._stood_in(cid, f, facts)
                if stood is not None:
                    # The real result of a call that got a stand-in: it answers the call now.
                    answer = result_of[stood]
                    del call_of[answer]
                    self.superseded[answer] = stood
                    result_of[stood] = index
                    call_of[index] = stood
                elif cid in self.last_call:
                    self.duplicates[index] = self.last_call[cid]
                else:
                    self.orphans.append(index)
            else:
                self.orphans.append(index)
        self.block_owner = block_owner
        self.stop = len(facts)
        self._made = None

    def _stood_in(self, cid: str, f: Facts, facts: Sequence[Facts]) -> CallKey | None:
        """The call a real result with id ``cid`` answers in place of the stand-in it got: the
        last call with that id, or one the repair renamed from it (an agent reusing ids)."""
        if f.stand_in is not None:
            return None
        for key in (self.last_call.get(cid), self.renamed.get(cid)):
            answer = self.result_of.get(key) if key is not None else None
            if answer is not None and facts[answer].stand_in is not None:
                return key
        return None

    def pairing(self) -> ToolPairing:
        # The pairing shares the scan's dicts: a finished scan is never fed again, only copied.
        if self._made is None:
            self._made = ToolPairing(
                result_of=self.result_of,
                call_of=self.call_of,
                orphans=tuple(self.orphans),
                duplicates=self.duplicates,
                unanswered=tuple(self.unanswered),
                positional=frozenset(self.positional),
                superseded=self.superseded,
            )
        return self._made


# --- steps, exchanges, pins -----------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One assistant message and the results of its tool calls.

    ``results`` are the indices of the tool results that answer its calls wherever they sit,
    plus unpaired results (orphans, duplicates) and legacy ``function`` results in the block
    right after it. ``start``/``stop`` is the half-open range that covers all of them; when a
    result is misplaced, other messages may lie inside that range, so use ``indices`` for the
    exact membership.
    """

    assistant: int
    results: tuple[int, ...] = ()

    @property
    def indices(self) -> tuple[int, ...]:
        return (self.assistant, *self.results)

    @property
    def start(self) -> int:
        return self.assistant

    @property
    def stop(self) -> int:
        return max(self.indices) + 1


@dataclass(frozen=True)
class Exchange:
    """A real user message and everything up to the next real user message.

    ``start``/``stop`` is the half-open range (``start`` is the user message); ``steps`` are
    the steps whose assistant message lies in that range.
    """

    user: int
    start: int
    stop: int
    steps: tuple[Step, ...] = ()


# --- the shape of a list --------------------------------------------------------------------


class Shape:
    """The facts of one message list, with its pairing and pins computed when first asked."""

    __slots__ = (
        "__weakref__",
        "_longest",
        "_parent",
        "_pins",
        "_results",
        "_results_base",
        "_resume",
        "_same_as",
        "_scan",
        "_signed_pins",
        "_tail",
        "_where",
        "facts",
        "snapshot",
    )

    def __init__(
        self,
        facts: list[Facts],
        *,
        resume: _PairScan | None = None,
        same_as: Shape | None = None,
        parent: Shape | None = None,
    ) -> None:
        self.facts = facts
        # The shape of a list whose messages this list starts with (see :meth:`extends`);
        # weak, so that a long session does not keep every turn's shape alive.
        self._parent: weakref.ref[Shape] | None = weakref.ref(parent) if parent is not None else None
        self._scan: _PairScan | None = None
        self._resume = resume  # the scan of a list this one extends
        self._same_as = same_as  # a list with the same structure
        self._pins: frozenset[int] | None = None
        self._signed_pins: frozenset[int] | None = None
        self._tail: dict[int, CallKey] | None = None  # see tail_calls (_NO_TAIL: there is none)
        self._results: tuple[int, ...] | None = None
        # The results of the list this one extends and its length (see ``results``).
        self._results_base: tuple[tuple[int, ...], int] | None = None
        self.snapshot: list[Mapping[str, Any]] | None = None
        """The messages (a copy of the list, when :func:`shape` made it): a stage that carried
        this shape can compare what it saw then with a list that does not simply extend it."""
        self._where: dict[str, tuple[int, ...]] = {}  # boolean fact -> indices where it holds
        self._longest: int | None = None

    def extends(self, other: Shape) -> int | None:
        """``len(other.facts)`` when this list starts with the messages ``other`` was made
        from, in the same order, each the same object or an equal one (this very shape, or one
        it was derived from by appending messages); None when that is not known. O(1) on a
        warm turn: a stage that carried ``other`` from the last turn learns which messages are
        new without comparing the lists (:func:`shape` compared them once, when it derived
        this one)."""
        here: Shape | None = self
        for _ in range(_EXTENDS_DEPTH):
            if here is None:
                return None
            if here is other:
                return len(other.facts)
            ref = here._parent
            here = ref() if ref is not None else None
        return None

    def where(self, fact: str) -> tuple[int, ...]:
        """Indices of the messages whose boolean fact ``fact`` (``injected``, ``real_user``,
        ``media``, ``signed``) holds; a list that extends a remembered one looks only at its
        new messages."""
        found = self._where.get(fact)
        if found is None:
            found = self._where[fact] = tuple(
                itertools.compress(range(len(self.facts)), map(operator.attrgetter(fact), self.facts))
            )
        return found

    @property
    def longest(self) -> int:
        """The longest text of any message (characters; 0 for none)."""
        if self._longest is None:
            self._longest = max(map(operator.attrgetter("longest"), self.facts), default=0)
        return self._longest

    @property
    def results(self) -> tuple[int, ...]:
        """Indices of the tool and function results."""
        if self._results is None:
            same, base = self._same_as, self._results_base
            if same is not None:
                self._results = same.results
            elif base is not None:  # derived by appending: the old list's, then the new ones
                facts, (old, start) = self.facts, base
                self._results = old + tuple(i for i in range(start, len(facts)) if facts[i].role in _RESULT_ROLES)
                self._results_base = None
            else:
                self._results = tuple(i for i, f in enumerate(self.facts) if f.role in _RESULT_ROLES)
        return self._results

    def _scanned(self) -> _PairScan:
        if self._scan is None:
            if self._same_as is not None:
                self._scan = self._same_as._scanned()
            else:
                resume = self._resume if self._resume is not None else self._ancestor_scan()
                scan = resume.copy() if resume is not None else _PairScan()
                scan.feed(self.facts)
                self._scan = scan
            self._resume = None
        return self._scan

    def _ancestor_scan(self) -> _PairScan | None:
        """The finished scan of the nearest list this one extends that has one: the pairing
        resumes from there (turns whose stages needed no pairing computed none)."""
        ref = self._parent
        for _ in range(_EXTENDS_DEPTH):
            here = ref() if ref is not None else None
            if here is None:
                return None
            if here._scan is not None:
                return here._scan
            if here._same_as is not None and here._same_as._scan is not None:
                return here._same_as._scan
            ref = here._parent
        return None

    def tail_calls(self) -> dict[int, CallKey] | None:
        """The call each tool result after the newest assistant message answers, when that is
        plain from those messages alone: the assistant message's calls have distinct ids and
        every tool result after it answers one of them, each a different one. Then each
        result answers the call of that message with its id (the most recent call with that
        id, and none of the results before it took it), as the pairing would say, without the
        pairing (a warm turn's appended step is such a tail). None otherwise."""
        if self._tail is not None:
            return self._tail if self._tail is not _NO_TAIL else None
        facts = self.facts
        tail: dict[int, CallKey] | None = None
        last = next((j for j in range(len(facts) - 1, -1, -1) if facts[j].role == "assistant"), None)
        calls = facts[last].calls if last is not None else None
        if last is not None and calls and None not in calls and len(set(calls)) == len(calls):
            position = {cid: pos for pos, cid in enumerate(calls)}
            tail = {}
            for j in range(last + 1, len(facts)):
                if facts[j].role != "tool":
                    continue
                pos = position.pop(facts[j].result_id, None)
                if pos is None:  # no id, not one of the calls, or a call already answered
                    tail = None
                    break
                tail[j] = (last, pos)
        self._tail = tail if tail is not None else _NO_TAIL
        return tail

    def call_of(self, index: int) -> CallKey | None:
        """The call the tool result at ``index`` answers (``pairing.call_of``), from
        :meth:`tail_calls` when the result is in such a tail."""
        tail = self.tail_calls()
        if tail is not None and index in tail:
            return tail[index]
        known = self._known_before(index) if self.facts[index].stand_in is None else None
        return known[0] if known is not None else self.pairing.call_of.get(index)

    def step_results(self, assistant: int) -> tuple[int, ...] | None:
        """The results of every call of the assistant message at ``assistant`` when its step
        is, or was on a list this one extends, a plain tail (:meth:`tail_calls`) that answers
        all of its calls (no later result can answer one then, unless it supersedes a
        stand-in: such a step is not known so); None when not known so."""
        for here in self._lineage():
            tail = here.tail_calls() if here is self else here._tail
            if tail is None or tail is _NO_TAIL or not tail:
                continue
            owner = next(iter(tail.values()))[0]
            if owner == assistant:
                calls = self.facts[assistant].calls or ()
                if here is not self and any(self.facts[j].stand_in is not None for j in tail):
                    return None  # a real result appended since may have superseded a stand-in
                return tuple(sorted(tail)) if len(tail) == len(calls) else None
        return None

    def _known_before(self, index: int) -> tuple[CallKey | None] | None:
        """``(call_of[index],)`` from a list this one extends, when one of them knows it: the
        call a result answers never changes when messages are appended after it (but for a
        stand-in, which a real result appended later supersedes: not asked for one)."""
        ref = self._parent
        for _ in range(_EXTENDS_DEPTH):
            here = ref() if ref is not None else None
            if here is None or index >= len(here.facts):
                return None
            tail = here._tail
            if tail is not None and index in tail:
                return (tail[index],)
            scan = here._scan if here._scan is not None else (here._same_as._scan if here._same_as else None)
            if scan is not None:
                return (scan.call_of.get(index),)
            ref = here._parent
        return None

    def _lineage(self) -> Iterator[Shape]:
        """This shape, then the ones it was derived from by appending (newest first)."""
        here: Shape | None = self
        for _ in range(_EXTENDS_DEPTH):
            if here is None:
                return
            yield here
            ref = here._parent
            here = ref() if ref is not None else None

    def resumable(self) -> _PairScan | None:
        """The finished pairing scan, when it was computed (for a list that extends this one)."""
        if self._scan is None and self._same_as is not None and self._same_as._scan is not None:
            self._scan = self._same_as._scan
        return self._scan

    @property
    def pairing(self) -> ToolPairing:
        return self._scanned().pairing()

    @property
    def pins(self) -> frozenset[int]:
        if self._pins is None:
            same = self._same_as
            self._pins = same._base_pins() if same is not None else self._compute_pins()
        if not PIN_SIGNED_PREFIX.get():
            return self._pins
        if self._signed_pins is None:
            newest = next((j for j in range(len(self.facts) - 1, -1, -1) if self.facts[j].signed), None)
            self._signed_pins = self._pins if newest is None else self._pins | frozenset(range(newest + 1))
        return self._signed_pins

    def _base_pins(self) -> frozenset[int]:
        if self._pins is None:
            same = self._same_as
            self._pins = same._base_pins() if same is not None else self._compute_pins()
        return self._pins

    def _compute_pins(self) -> frozenset[int]:
        """The leading system/developer messages, the human anchor (first real user message),
        the latest real user message, and every message of the newest step."""
        facts = self.facts
        pinned: set[int] = set()
        n = len(facts)
        i = 0
        while i < n and facts[i].role in _LEADING_ROLES:
            pinned.add(i)
            i += 1
        users = self.where("real_user")
        if users:
            pinned.add(users[0])  # the human anchor
            pinned.add(users[-1])  # the latest ask
        last_assistant = next((j for j in range(n - 1, -1, -1) if facts[j].role == "assistant"), None)
        if last_assistant is not None:
            pinned.update(self._newest_step(last_assistant).indices)
        return frozenset(pinned)

    def _newest_step(self, last_assistant: int) -> Step:
        facts = self.facts
        tail = range(last_assistant + 1, len(facts))
        if not any(facts[j].role == "tool" for j in tail):
            # Only legacy function results (or nothing) follow: membership is positional.
            results: list[int] = []
            for j in tail:
                if facts[j].role not in _RESULT_ROLES:
                    break
                results.append(j)
            return Step(last_assistant, tuple(results))
        # Whether a later tool result answers this step or an older unanswered call with the
        # same id depends on the whole history: the pairing decides (unless the tail says it
        # alone: tail_calls).
        plain = self.tail_calls()
        call_of = plain if plain is not None else self.pairing.call_of
        results = []
        in_block = True
        for j in tail:
            in_block = in_block and facts[j].role in _RESULT_ROLES
            key = call_of.get(j)
            if (key is not None and key[0] == last_assistant) or (key is None and in_block):
                results.append(j)
        return Step(last_assistant, tuple(results))

    def steps(self) -> list[Step]:
        call_of = self.pairing.call_of
        members: dict[int, list[int]] = {}
        block_owner: int | None = None
        for index, f in enumerate(self.facts):
            role = f.role
            if role == "assistant":
                members[index] = []
                block_owner = index
            elif role in _RESULT_ROLES:
                key = call_of.get(index)
                owner = key[0] if key is not None else block_owner
                if owner is not None:
                    members[owner].append(index)
            else:
                block_owner = None
        return [Step(assistant, tuple(sorted(results))) for assistant, results in members.items()]


_NO_TAIL: dict[int, CallKey] = {}
"""What :meth:`Shape.tail_calls` remembers for "no plain tail" (never changed)."""

_EXTENDS_DEPTH = 8
"""How many derivations back :meth:`Shape.extends` looks (a stage that skipped more turns
than that starts over)."""


class _Seen(NamedTuple):
    messages: Sequence[Mapping[str, Any]]
    snapshot: list[Mapping[str, Any]]
    shape: Shape
    key: Any
    """The injection key the facts were computed under (see :func:`facts_of`)."""


_RECENT: list[_Seen] = []
_RECENT_KEEP = 8
_DERIVE_FROM = 3
"""How many of the most recent lists a new list is compared with."""


def shape(messages: Sequence[Mapping[str, Any]]) -> Shape:
    """The shape of ``messages``, remembered for the last few lists (the key is the list object
    and the identity of every message in it) and derived from one of them when it can be."""
    key = current_key()
    for seen in _RECENT:
        # List equality tests identity first, in C, without touching the messages: the check
        # that the list was not changed since costs microseconds however often it is asked
        # (every stage asks). Where an object differs, equal content is as good: facts
        # depend on the content alone.
        if seen.messages is messages and seen.key is key and _same_items(seen.snapshot, messages):
            return seen.shape
    made = _derive(messages, key) or Shape([facts_of(m) for m in messages])
    made.snapshot = list(messages)
    _RECENT.insert(0, _Seen(messages, made.snapshot, made, key))
    del _RECENT[_RECENT_KEEP:]
    return made


def _starts_with(messages: Sequence[Mapping[str, Any]], old: list[Mapping[str, Any]]) -> bool:
    """Whether ``messages`` starts with the messages of ``old``: the same objects, or equal
    ones (list equality tests identity first, in C: hundreds of messages in microseconds)."""
    if isinstance(messages, list):
        return _equal(messages if len(messages) == len(old) else messages[: len(old)], old)
    return all(map(operator.is_, old, messages))


def _same_items(snapshot: list[Mapping[str, Any]], messages: Sequence[Mapping[str, Any]]) -> bool:
    if isinstance(messages, list):
        return _equal(snapshot, messages)
    if isinstance(messages, tuple):
        return True  # the same tuple object: its items cannot have changed
    return _equal(snapshot, list(messages))


def _equal(a: list[Mapping[str, Any]], b: list[Mapping[str, Any]]) -> bool:
    try:
        return bool(a == b)
    except Exception:  # a value whose comparison fails (not JSON): only the same objects count
        return len(a) == len(b) and all(map(operator.is_, a, b))


def replaced(old: Sequence[Any], new: Sequence[Any]) -> Iterator[int]:
    """Positions (below both lengths) where ``new`` holds another object than ``old``; the
    identity test runs in C, so comparing two lists of hundreds of messages costs microseconds."""
    return itertools.compress(range(min(len(old), len(new))), map(operator.is_not, old, new))


def _derive(messages: Sequence[Mapping[str, Any]], key: Any) -> Shape | None:
    n = len(messages)
    for seen in _RECENT[:_DERIVE_FROM]:
        if seen.key is not key:
            continue
        old = seen.snapshot
        m = len(old)
        if n >= m and _starts_with(messages, old):
            facts = [*seen.shape.facts, *(facts_of(messages[i]) for i in range(m, n))]
            if n == m:
                made = Shape(facts, same_as=seen.shape, parent=seen.shape)
                made._where, made._longest = dict(seen.shape._where), seen.shape._longest
                return made
            made = Shape(facts, resume=seen.shape.resumable(), parent=seen.shape)
            # Made when first asked (a warm turn's stages mostly look at the new results only).
            old_results = seen.shape._results
            made._results_base = (old_results, m) if old_results is not None else None
            # What the old list's facts gave, extended by the new messages' alone.
            made._where = {
                fact: found + tuple(i for i in range(m, n) if getattr(facts[i], fact))
                for fact, found in seen.shape._where.items()
            }
            if seen.shape._longest is not None:
                made._longest = max(seen.shape._longest, *(facts[i].longest for i in range(m, n)))
            return made
        if n == m:
            changed = list(replaced(old, messages))
            if len(changed) > max(16, n // 8):
                continue
            facts = list(seen.shape.facts)
            same = True
            for i in changed:
                new = facts_of(messages[i])
                same = same and new.structure == facts[i].structure
                facts[i] = new
            return Shape(facts, same_as=seen.shape if same else None)
    return None


_GENERATION = [0]


def forget() -> None:
    """Drop every remembered fact and shape (after a message was changed in place); memos kept
    elsewhere per message object watch :func:`generation` to do the same."""
    _FACTS.clear()
    _RECENT.clear()
    _GENERATION[0] += 1


def generation() -> int:
    """A number that changes whenever :func:`forget` is called."""
    return _GENERATION[0]


def pair_tool_calls(messages: Sequence[Mapping[str, Any]]) -> ToolPairing:
    """Pair tool results with calls in one pass (O(messages + calls)); remembered per list."""
    return shape(messages).pairing


def pinned_indices(messages: Sequence[Mapping[str, Any]]) -> frozenset[int]:
    """Indices that never leave the context (docs/reference/concepts.md "pinned"); remembered per list.

    The leading system/developer messages, the human anchor (first real user message), the
    latest real user message, and every message of the newest step; with
    :data:`PIN_SIGNED_PREFIX` set, also every message up to the newest with signed thinking.
    """
    return shape(messages).pins


def steps(messages: Sequence[Mapping[str, Any]]) -> list[Step]:
    """Every step, in the order of its assistant message."""
    return shape(messages).steps()


def exchanges(messages: Sequence[Mapping[str, Any]]) -> list[Exchange]:
    """Every exchange, in order. Messages before the first real user message (the system
    prompt, or steps of an agent that started on its own) belong to no exchange."""
    known = shape(messages)
    users = [i for i, f in enumerate(known.facts) if f.real_user]
    if not users:
        return []
    all_steps = known.steps()
    bounds = [*users, len(messages)]
    out: list[Exchange] = []
    step_iter = 0
    while step_iter < len(all_steps) and all_steps[step_iter].assistant < users[0]:
        step_iter += 1
    for n, user in enumerate(users):
        stop = bounds[n + 1]
        inside: list[Step] = []
        while step_iter < len(all_steps) and all_steps[step_iter].assistant < stop:
            inside.append(all_steps[step_iter])
            step_iter += 1
        out.append(Exchange(user=user, start=user, stop=stop, steps=tuple(inside)))
    return out
