"""Recognizing an append-only history, so the next turn reuses the last compaction.

The caller passes the full history on every call. When the new history starts with the one the
session saw last, the pipeline runs on *the previous output* plus the appended messages: the
compaction is not redone, and the prefix the provider caches stays byte-identical. Invariant 4
(the pipeline changes nothing on its own output) makes this equal to a fresh run's decisions.

Within one process the session compares the new history with its own copy of the last one;
across processes (``ctxrules run`` twice on one session) it compares a chained digest of the
first messages with the one stored in ``state.json`` (:class:`HistoryChain`).
"""

from __future__ import annotations

import hashlib
import itertools
import operator
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ctxrules.dangling import marker_ids, missing
from ctxrules.json_stream import dumps_sha256
from ctxrules.messages import clone_json

if TYPE_CHECKING:
    from ctxrules.tokens import TokenCounter
    from ctxrules.types import Message
    from ctxrules.vault import Vault


def counts_text(counts: list[int]) -> str:
    """Per-message token counts as state.json keeps them: decimal numbers joined by commas. A
    string, not a JSON list: writing the state each turn encodes one string instead of an
    integer per message, and a warm turn appends the counts of its new messages to it."""
    return ",".join(map(str, counts))


_COUNT_DIGITS = 15


def parse_counts(value: Any) -> list[int] | None:
    """The counts :func:`counts_text` wrote (or a list of them, as earlier versions saved);
    None for anything else."""
    if isinstance(value, str):
        if not value:
            return []
        parts = value.split(",")
        # A count is a token count: more than _COUNT_DIGITS digits is damage (and past 4300
        # digits int() itself refuses, which would fail every turn of the session).
        if not all(p.isdigit() and p.isascii() and len(p) <= _COUNT_DIGITS for p in parts):
            return None
        return [int(p) for p in parts]
    if isinstance(value, list) and all(type(c) is int and 0 <= c < 10**_COUNT_DIGITS for c in value):
        return value
    return None


_TAIL_REWRITE = 64
"""Most trailing counts a text is rewritten for in place of the whole (:func:`_text_from`)."""


def _text_from(text: str, old_len: int, counts: list[int], first: int) -> str:
    """:func:`counts_text` of ``counts``, given ``text``, that of ``old_len`` counts which
    ``counts`` shares up to ``first`` (not after): when ``first`` is near the end, the text is
    cut after its first ``first`` counts and the rest written anew. On a Claude model the
    breakpoints move on the newest messages at every call, and writing thousands of numbers
    again cost more than the rest of the count."""
    if first <= 0 or old_len - first > _TAIL_REWRITE or first > old_len:
        return counts_text(counts)
    cut = len(text)
    for _ in range(old_len - first):  # back over the counts from ``first`` on, comma by comma
        cut = text.rfind(",", 0, cut)
        if cut < 0:
            return counts_text(counts)
    tail = counts_text(counts[first:])
    return f"{text[:cut]},{tail}" if tail else text[:cut]


class HistoryChain:
    """One digest for a whole history, extended message by message.

    ``state.json`` keeps this (and the message count) instead of one digest per message, so
    the file stays small however long the session grows; a process that picks the session up
    recomputes the chain over the first ``count`` messages it is given and compares one value.
    Each message enters as the sha256 of its ``json.dumps`` text, the text the compaction backup
    and the vault write too (made once per prepare, :func:`ctxrules.json_stream.dumps_sha256`):
    a client that sends the same messages with their keys in another order starts cold once.
    """

    __slots__ = ("_hash", "count")

    def __init__(self) -> None:
        self._hash = hashlib.sha256(b"ctxrules.history.v2")  # v1: canonical JSON per message
        self.count = 0

    def extended(self, messages: Iterable[Mapping[str, Any]]) -> HistoryChain:
        """A new chain over this history plus ``messages`` (this one is left as it is)."""
        out = HistoryChain.__new__(HistoryChain)
        out._hash, out.count = self._hash.copy(), self.count
        for message in messages:
            out._hash.update(dumps_sha256(message).encode("ascii"))
            out.count += 1
        return out

    @property
    def value(self) -> str:
        return self._hash.hexdigest()


EMPTY_CHAIN = HistoryChain()
"""The chain of an empty history (shared: :meth:`HistoryChain.extended` leaves it as it is)."""


class PrefixCache:
    """What a session's last ``prepare`` saw and returned, so that a history that only appends
    runs the pipeline on the last output plus the new messages.

    ``history`` is the session's own copy of the last history (sharing leaf strings with what
    the caller passed), ``output`` the pipeline's output for it, ``chain`` its
    :class:`HistoryChain`; ``msgs_sum`` and ``out_tokens`` are the token counts of the history's
    messages and of the output (with ``tools``), ``has_system`` whether the history holds a
    system message. They let a warm turn count only the appended messages. ``output_ids`` are
    the vault ids the output's markers may name: reuse is refused when one of them is gone.

    The output shares its unchanged messages with the caller, who may edit what it got back.
    A caller that passes the same objects again is checked by comparing the history with the
    copy; one that passes new objects (JSON decoded per call) is not passing the objects the
    output holds, so the output is compared with ``output_copies`` (made when it was
    returned) before it is reused.
    """

    def __init__(self) -> None:
        self.history: list[Message] | None = None
        self.output: list[Message] | None = None
        self.chain = EMPTY_CHAIN
        self.msgs_sum = 0
        self.out_tokens: int | None = None
        self.tools: list[dict[str, Any]] = []
        self.has_system = False
        self.output_ids: set[str] = set()
        self.output_counts: list[int] | None = None  # tokens of each output message, when known
        self.output_counts_text: str | None = None  # the same, as state.json keeps them
        # The output without what finalize stages added (cache breakpoints), which the next
        # turn runs on (RunOutcome.basis; None: the output itself); ``out_tokens`` is its count.
        self.basis: list[Message] | None = None
        # id(given) -> (given, repaired, a copy of given as it was repaired)
        self._repaired: dict[int, tuple[Message, Message, Message]] = {}
        # The objects of the last history as the caller passed them (validated), copies of the
        # output as returned (None: the output holds none of the caller's objects), and
        # whether the output may hold objects of a history before the last one.
        self.given: list[Message] = []
        self.output_copies: list[Message] | None = None
        self.borrowed = False
        # Whether the last match found the history extending the last *output* (a caller that
        # keeps what prepare returned as its history) rather than the last history, and the
        # counts that match replaced, put back by rollback() when the turn then fails.
        self.adopted = False
        self._undo: tuple[int, bool] | None = None
        # Whether the last match read the output back from the store (another process or
        # worker wrote it last): it holds what the finalize stages added, unlike ``basis``.
        self.loaded = False

    def clear(self) -> None:
        """Forget the last history and output (a model switch, a pack reload, a failed write)."""
        self.history = self.output = self.output_copies = self.basis = None

    def with_repairs(self, history: list[Message]) -> list[Message]:
        """``history`` with the repaired copy of each message an earlier turn repaired (lone
        surrogates replaced), so that it still extends the history the last turn saw. Only
        while the message still holds what was repaired: one edited in place since is the
        same object with new content, which the old repaired copy would hide.

        The repairs of messages ``history`` does not hold (any more) are forgotten: a caller
        that decodes its history from JSON on every call passes new objects each time, and
        three copies of every repaired message of every turn stayed for the session's life.
        Only a message of this history can be in the history the next turn extends."""
        repaired = self._repaired
        if not repaired:
            return history
        kept: dict[int, tuple[Message, Message, Message]] = {}
        out = history
        for i, m in enumerate(history):
            r = repaired.get(id(m))
            if r is None or r[0] is not m or m != r[2]:
                continue
            kept[id(m)] = r
            if out is history:
                out = list(history)
            out[i] = r[1]
        self._repaired = kept
        return out

    def note_repairs(self, given: list[Message], validated: list[Message], start: int) -> None:
        """Remember the messages from ``start`` on that validation replaced with a repaired copy."""
        for i in range(start, len(given)):
            if validated[i] is not given[i]:
                self._repaired[id(given[i])] = (given[i], validated[i], clone_json(given[i]))

    def match(
        self,
        history: list[Message],
        state: Mapping[str, Any],
        load_output: Callable[[], list[Message] | None],
        counter: TokenCounter,
        vault: Vault,
    ) -> tuple[int, list[Message], HistoryChain]:
        """(messages reused, the previous output, the chain of the reused history) when
        ``history`` extends the last one; (0, [], empty chain) otherwise. Without a copy in
        memory, or when the state's chain is not the one this object saved (another process or
        worker prepared since), the chain stored in ``state`` is compared and the output is read
        back with ``load_output`` (the store checks its digest). An output one of whose
        markers points at a vault item that is gone is not reused: computing it again from the
        history stores the originals it still has (same ids)."""
        last = self.history
        record = state.get("last") or {}
        self.adopted, self._undo, self.loaded = False, None, False
        if last is not None and self.output is not None and record.get("chain") == self.chain.value:
            # Our copies share leaf strings with what the caller passed, so `==` mostly meets
            # identical objects and stays cheap; a message edited in place compares unequal.
            n = len(last)
            if n <= len(history) and last == history[:n] and not missing(vault, self.output_ids):
                if not self._output_intact(history, n):
                    return 0, [], EMPTY_CHAIN
                return n, self._previous(self.output), self.chain
            return self._adopting(history, counter, vault)
        count, value, output_count = record.get("count"), record.get("chain"), record.get("output_count")
        if not isinstance(count, int) or not isinstance(value, str) or not 0 < count <= len(history):
            return 0, [], EMPTY_CHAIN
        if not isinstance(output_count, int):
            return 0, [], EMPTY_CHAIN
        chain = EMPTY_CHAIN.extended(history[:count])
        if chain.value != value:
            return 0, [], EMPTY_CHAIN
        output = load_output()
        if output is None or len(output) != output_count:
            return 0, [], EMPTY_CHAIN
        ids = marker_ids(output)
        if missing(vault, ids):
            return 0, [], EMPTY_CHAIN
        self.output_ids = ids
        self.basis, self.loaded = None, True  # the output as saved, its breakpoints on it
        self.history = [clone_json(m) for m in history[:count]]
        self.output_copies, self.borrowed = None, False  # read from the store: no caller holds it
        # The counts the session saved with the output (engine: ``state["last"]``): no
        # tokenizer is needed for messages counted before.
        tokens, counts = record.get("tokens"), parse_counts(record.get("output_counts"))
        self.output_counts = self.output_counts_text = None
        if counts is not None and len(counts) == len(output):
            counter.remember(output, counts)
            self.output_counts, self.output_counts_text = counts, counts_text(counts)
        if type(tokens) is int and 0 <= tokens < 10**_COUNT_DIGITS:
            self.msgs_sum = tokens
        else:
            self.msgs_sum = sum(counter.count_each(history[:count]))
        self.has_system = any(m.get("role") == "system" for m in history[:count])
        self.out_tokens = None
        return count, output, chain

    def _adopting(
        self, history: list[Message], counter: TokenCounter, vault: Vault
    ) -> tuple[int, list[Message], HistoryChain]:
        """The match of a history that extends the last *output* as it was returned (a caller
        that sends back what prepare gave it, plus new messages): the pipeline then runs on the
        last output and the new messages, which is what a run over this whole history starts
        from anyway. Cache breakpoints that move on every call make such a history differ from
        the last one at every turn, so without this every turn ran cold. The output is reused
        only when it and the history both still equal the copies made when it was returned."""
        output, copies = self.output, self.output_copies
        m = len(output) if output is not None else 0
        if (
            output is None
            or copies is None
            or len(copies) != m
            or not 0 < m <= len(history)
            or missing(vault, self.output_ids)
        ):
            return 0, [], EMPTY_CHAIN
        try:
            sent = history[:m]
            same = output == copies and (copies == sent or all(map(_same_as_sent, copies, sent)))
        except Exception:  # a value whose comparison fails (not JSON): not the output
            same = False
        if not same:
            return 0, [], EMPTY_CHAIN
        counts = self.output_counts
        self._undo = (self.msgs_sum, self.has_system)
        self.msgs_sum = sum(counts) if counts is not None and len(counts) == m else sum(counter.count_each(output))
        self.has_system = any(msg.get("role") == "system" for msg in output)
        # The output may hold objects of an earlier history that the caller keeps: later turns
        # compare it with its copies too (_output_intact).
        self.adopted = self.borrowed = True
        return m, self._previous(output), EMPTY_CHAIN.extended(history[:m])

    def _previous(self, output: list[Message]) -> list[Message]:
        """What a turn that reuses the last ``output`` runs on: that output without the
        breakpoints its finalize stages placed (they place them again), else the output."""
        basis = self.basis
        return basis if basis is not None and len(basis) == len(output) else output

    def rollback(self) -> None:
        """After a turn that failed: put back what a match that adopted the last output changed
        (the history's token sum and system flag), so the next turn starts from the last one
        that was kept. Nothing else of this object changes before :meth:`remember`."""
        if self._undo is not None:
            self.msgs_sum, self.has_system = self._undo
        self.adopted, self._undo = False, None

    def _output_intact(self, history: list[Message], n: int) -> bool:
        """Whether the output to reuse still holds what it held when it was returned. With the
        same objects as last time in ``history`` (compared with the copy already), and no
        object of an earlier history in the output, nothing else can have changed it."""
        copies = self.output_copies
        if copies is None:
            return True
        given = self.given
        same = len(given) == n and all(map(operator.is_, given, history))
        if same and not self.borrowed:
            return True
        self.borrowed = True
        try:
            return bool(self.output == copies)
        except Exception:  # a value whose comparison fails (not JSON): changed, as far as we know
            return False

    def counts_of(self, output: list[Message], reused: int, counter: TokenCounter) -> tuple[list[int], str]:
        """The tokens of each message of ``output``, and the same as state.json keeps them
        (:func:`counts_text`). A message that is the very object at the same position of the
        last output (the session's own, on a turn that reused it) keeps its count; only the
        others are counted, and when just messages were appended, just their counts are
        appended to the text (a warm turn handles its new tail, not the whole output)."""
        last, counts, text = self.output, self.output_counts, self.output_counts_text
        if not reused or last is None or counts is None or text is None or len(counts) != len(last):
            fresh_counts = counter.count_each(output)
            return fresh_counts, counts_text(fresh_counts)
        if len(output) >= len(last) and all(map(operator.is_, last, output)):
            # The warm turn's case: the last output with messages appended (no list of flags).
            added = counter.count_each(output[len(last) :])
            if not added:
                return counts, text
            return [*counts, *added], f"{text},{counts_text(added)}" if text else counts_text(added)
        same = list(map(operator.is_, last, output))  # the common length only
        same.extend([False] * (len(output) - len(same)))
        fresh = list(itertools.compress(range(len(output)), map(operator.not_, same)))
        out = [*counts[: len(output)], *[0] * (len(output) - len(counts))]
        for i, n in zip(fresh, counter.count_each([output[i] for i in fresh]), strict=True):
            out[i] = n
        return out, _text_from(text, len(counts), out, fresh[0] if fresh else len(output))

    def _copies_of(self, history: list[Message], output: list[Message], reused: int) -> list[Message]:
        """Copies of ``output``: those of the last output's objects where they stand again
        (a warm turn copies its new messages only), else the copy of the history message
        that is the same object (``self.history`` holds them, aligned with ``history``)."""
        last, copies = self.output, self.output_copies
        if not reused or last is None or copies is None or len(copies) != len(last):
            mine = self.history or []
            where = {id(m): k for k, m in enumerate(history)}
            return [mine[k] if (k := where.get(id(m), -1)) >= 0 and k < len(mine) else clone_json(m) for m in output]
        n = len(last)
        if len(output) >= n and all(map(operator.is_, last, output)):
            return [*copies, *(clone_json(m) for m in output[n:])]
        return [copies[i] if i < n and m is last[i] else clone_json(m) for i, m in enumerate(output)]

    def remember(
        self,
        history: list[Message],
        reused: int,
        output: list[Message],
        chain: HistoryChain,
        *,
        msgs_sum: int,
        out_tokens: int,
        output_counts: tuple[list[int], str],
        tools: list[dict[str, Any]],
        new_ids: set[str],
        lost: set[str],
        basis: list[Message] | None = None,
    ) -> None:
        """Keep ``history`` (its first ``reused`` messages are the copy held already) and the
        pipeline's ``output`` for the next turn. ``new_ids``: vault ids this turn's new messages
        and stages added to the output; ``lost``: ids marked as lost this turn. ``basis``: the
        output before its finalize stages (the same length), which the next turn runs on;
        ``out_tokens`` is the count of that list with ``tools``."""
        self.msgs_sum, self.out_tokens, self.tools = msgs_sum, out_tokens, tools
        self.basis = basis if basis is not None and basis is not output and len(basis) == len(output) else None
        self.output_counts, self.output_counts_text = output_counts
        self._undo = None
        # The copy of the reused messages: of the last history, or of the last output when the
        # history extended that (both equal those messages of ``history``).
        source = self.output_copies if self.adopted else self.history
        kept = source[:reused] if reused and source else []
        self.history = [*kept, *(clone_json(m) for m in history[reused:])]
        self.output_copies = self._copies_of(history, output, reused)
        if not reused:
            self.borrowed = False
        self.given = list(history)
        self.output, self.chain = output, chain
        self.output_ids = (self.output_ids | new_ids) - lost if reused else marker_ids(output)


def _same_as_sent(ours: Message, given: Message) -> bool:
    """Whether ``given`` is the message ``ours`` as a request format gave it back: the same, or
    its string content as the one text block it is (an Anthropic turn that held two messages
    of one role decodes into messages of text blocks). A history that extends the last output
    sent in that format is then the last output, not a new history run cold."""
    if ours == given:
        return True
    if ours.keys() != given.keys() or any(ours[k] != given[k] for k in ours if k != "content"):
        return False
    mine, theirs = ours.get("content"), given.get("content")
    if isinstance(theirs, str):
        mine, theirs = theirs, mine
    return isinstance(mine, str) and theirs == [{"type": "text", "text": mine}]
