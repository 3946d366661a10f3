"""``tool_output.filter``: keep large tool outputs from flooding the context, losing nothing.

Three levels, in this order (docs/reference/concepts.md "Reference numbers"):

(a) **Compressors** — a result of a ``shell`` tool goes through the pack's output compressors
    (:func:`ctxrules.compressors.api.compress_tool_output`) when a rule matches its command.
(b) **Structure-aware reduction** — a single output over ``item_tokens`` (5,000), or the outputs
    of one step over ``turn_tokens`` (15,000) together, are shortened by their structure: a JSON
    skeleton (depth 4, 12 keys, 6 items per list, still valid JSON, with counts of what was
    elided), a table's header and first/last rows, an XML tree's shape, a text's head and tail
    around a ``#L<a>-L<b>`` marker line. With ``semantic_filter: true`` a plugin implementing
    ``ctxrules_semantic_filter`` may shorten plain text instead. A ``subagent`` result over
    ``subagent_chars`` (8,000) becomes its head and tail plus a structured handover
    (done, todo, risks, files) extracted from it.
(c) **Hard spill** — any single content over the spill limit, in *any* message (pinned and
    protected ones included: an exception to pinning), goes to the vault whole and leaves a
    short summary with a pointer. The limit scales with the window: ``spill_chars`` (100,000)
    characters, or ``spill_window_share`` (1.0) of the usable window at 4 characters per token
    when that is less (a 16K window with the default reserve: 31,232 characters): a content
    longer than the whole window can never stay. What is smaller but still too large in tokens
    (dense output runs near 1.5 characters per token) is for ``compress.emergency``, which spills
    the largest pinned contents when the pins alone do not fit.

Who is exempt: tools with a role in ``exempt_roles`` (``file_read``, ``file_edit``: shortening a
file the agent reads makes it read again), pinned and protected messages, and — with the
``hot_cache_bypass`` — outputs already sent while the provider's prompt cache is hot. Content
that already carries a marker of this session (a live vault ref) is never reduced again, which
makes the stage idempotent. All of them still count toward their step's total.

**Predictive strength.** How much of an output is kept depends on how much budget remains::

    h    = clamp(1 - utilization / emergency_threshold, 0, 1)    # headroom, 1 = empty window
    keep = min_keep_ratio + (max_keep_ratio - min_keep_ratio) * h
    item target = max(floor, item_tokens * keep)      turn target = turn_tokens * keep

``utilization`` is measured on the stage's input. With the defaults (0.6 / 0.15) and an empty
window, an output over 5,000 tokens keeps about 3,000; at half the emergency threshold 1,875;
at or above it 750. For a step over ``turn_tokens``, the reducible outputs are capped at the
level ``c`` (water-filling) at which the step fits its turn target, never below ``floor``.

The vault always receives the *whole original* output (id = sha256 of its UTF-8 bytes); every
marker in the shortened text points into it, with ``#L`` ranges where whole lines were cut.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from ctxrules import structure
from ctxrules.carry import PerSession
from ctxrules.errors import StoreUnavailable
from ctxrules.hookspecs import hookimpl
from ctxrules.messages import keep_mark
from ctxrules.stages.base import Action, Message, StageOutcome, StageType, unchanged
from ctxrules.stages.filter_common import (
    BYPASS_PROPERTIES,
    bypass_active,
    check_options,
    has_live_marker,
    result_digest,
    result_key,
    tokens_saved,
)
from ctxrules.structure import Step, shape
from ctxrules.toolroles import ROLE_ORDER, call_name, shell_command, tool_roles
from ctxrules.vault import format_marker, is_spill_stand_in, parse_markers

if TYPE_CHECKING:
    from ctxrules.pipeline.context import StageContext
    from ctxrules.stages.reduce import JsonLimits

__all__ = ["STAGE_TYPE", "ToolOutputFilter", "ctxrules_register_stages", "keep_ratio"]


# The compressors and the structure-aware reducers are imported on first use: building the
# stage, as `ctxrules validate` does for every pack, needs neither (the two packages were a
# tenth of validating the built-in pack). Same names and signatures as where they live.
def compress_tool_output(*args: Any, **kwargs: Any) -> Any:
    from ctxrules.compressors.api import compress_tool_output as run

    return run(*args, **kwargs)


def detect(*args: Any, **kwargs: Any) -> Any:
    from ctxrules.stages.reduce import detect as run

    return run(*args, **kwargs)


def handover_text(*args: Any, **kwargs: Any) -> Any:
    from ctxrules.stages.reduce import handover_text as run

    return run(*args, **kwargs)


def reduce_structured(*args: Any, **kwargs: Any) -> Any:
    from ctxrules.stages.reduce import reduce_structured as run

    return run(*args, **kwargs)


def spill_summary(*args: Any, **kwargs: Any) -> Any:
    from ctxrules.stages.reduce import spill_summary as run

    return run(*args, **kwargs)


def text_vault_id(text: str) -> str:
    from ctxrules.stages.reduce import text_vault_id as run

    return run(text)


FLOOR_TOKENS = 200
"""No reduction goes below this many tokens: less would not be worth its marker."""

_RESULT_ROLES = frozenset({"tool", "function"})


KEEP_STEP = 0.05
"""The headroom is taken in steps of 5 %: targets change when utilization crosses a step, not a
little on every turn, so outputs left alone stay alone (and cached prefixes stay put)."""


CHARS_PER_TOKEN_FOR_SPILL = 4


def spill_limit(spill_chars: int, window_share: float, usable_tokens: int) -> int:
    """The hard-spill limit in characters: ``spill_chars``, or ``window_share`` of the usable
    window at :data:`CHARS_PER_TOKEN_FOR_SPILL` characters per token when that is less."""
    return max(1, min(spill_chars, int(window_share * usable_tokens * CHARS_PER_TOKEN_FOR_SPILL)))


def keep_ratio(utilization: float, emergency: float, min_keep: float, max_keep: float) -> float:
    """The share of ``item_tokens`` / ``turn_tokens`` an output keeps (module docstring)."""
    headroom = min(1.0, max(0.0, 1.0 - utilization / emergency)) if emergency > 0 else 0.0
    headroom = math.floor(headroom / KEEP_STEP + 1e-9) * KEEP_STEP
    return min_keep + (max_keep - min_keep) * headroom


@dataclass
class _Unit:
    """One text of a result (a string content, or one text part of a list content)."""

    part: int | None
    text: str
    tokens: int = 0


@dataclass
class _Result:
    index: int
    tool: str | None
    role: str | None
    units: list[_Unit] = field(default_factory=list)
    tokens: int = 0
    reducible: bool = True
    target: int | None = None


class ToolOutputFilter:
    """The ``tool_output.filter`` stage (see the module docstring)."""

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        opts = check_options(STAGE_TYPE.name, OPTIONS_SCHEMA, options)
        self.options = opts
        self.item_tokens: int = opts["item_tokens"]
        self.turn_tokens: int = opts["turn_tokens"]
        self.spill_chars: int = opts["spill_chars"]
        self.spill_window_share: float = opts["spill_window_share"]
        self.spill_preview_tokens: int = opts["spill_preview_tokens"]
        self.subagent_chars: int = opts["subagent_chars"]
        self.subagent_keep_tokens: int = opts["subagent_keep_tokens"]
        self.min_keep: float = opts["min_keep_ratio"]
        self.max_keep: float = opts["max_keep_ratio"]
        if self.min_keep > self.max_keep:
            raise ValueError(
                f"{STAGE_TYPE.name}: min_keep_ratio ({self.min_keep}) is above max_keep_ratio ({self.max_keep})"
            )
        self.head_share: float = opts["head_share"]
        self.min_saving: int = opts["min_saving_tokens"]
        self.compressors: bool = opts["compressors"]
        self.semantic: bool = opts["semantic_filter"]
        self.exempt: frozenset[str] = frozenset(opts["exempt_roles"])
        # id(message) -> (message, keep ratio, content): outputs this stage examined and left
        # as they were. The session hands the same objects back call after call, so a warm turn
        # skips them unless trimming got harder (a lower keep ratio) or the content object
        # changed; holding the message keeps its id from being reused while it is here.
        self._settled: dict[int, tuple[Message, float, Any]] = {}
        self._sent: dict[tuple[int, str], tuple[Message, Any, str | None]] = {}
        # What the last call saw, so that a warm turn looks only at what changed: the tool
        # results of its input, the keep ratio, the _settled epoch and the positions (in that
        # tuple) not settled; and the tool results of its output with their digests.
        # Per session (ctxrules.carry.PerSession): sessions of one engine taking turns keep theirs.
        # The scan is (the input's shape, keep ratio, epoch, indices not settled); the sent
        # memo is a _SentMemo. A warm turn's list extends the carried one (Shape.extends):
        # only the new results are looked at.
        self._last_scan: PerSession[tuple[structure.Shape, float, int, frozenset[int]]] = PerSession()
        self._last_sent: PerSession[_SentMemo] = PerSession()
        self._epoch = 0
        self._generation = structure.generation()
        json_opts = {**_JSON_DEFAULTS, **opts.get("json", {})}
        self._json_options = {k: json_opts[k] for k in ("depth", "keys", "items", "string_chars")}
        self._json_limits: JsonLimits | None = None

    @property
    def json_limits(self) -> JsonLimits:
        """The JSON skeleton limits of the ``json`` option (made on first use, see above)."""
        if self._json_limits is None:
            from ctxrules.stages.reduce import JsonLimits

            self._json_limits = JsonLimits(**self._json_options)
        return self._json_limits

    def __repr__(self) -> str:
        return (
            f"ToolOutputFilter(item_tokens={self.item_tokens}, turn_tokens={self.turn_tokens}, "
            f"spill_chars={self.spill_chars})"
        )

    def __call__(self, messages: Sequence[Message], ctx: StageContext) -> StageOutcome:
        if self._generation != structure.generation():  # a message was edited in place
            self._settled.clear()
            self._sent.clear()
            self._last_scan.clear()
            self._last_sent.clear()
            self._generation = structure.generation()
        run = _Run(self, messages, ctx)
        return run.execute()

    def forget_settled(self) -> None:
        self._settled.clear()
        self._epoch += 1


class _Run:
    """One application of the stage to one message list."""

    def __init__(self, stage: ToolOutputFilter, messages: Sequence[Message], ctx: StageContext) -> None:
        self.stage = stage
        self.messages = messages
        self.ctx = ctx
        # Copied on the first change (_commit): a warm turn changes nothing.
        self.out: list[Message] = unchanged(messages)
        self.actions: list[Action] = []
        self.warnings: list[str] = []
        self.count: Callable[[str], int] = ctx.counter.count_text
        self.shape = shape(messages)
        self.roles = tool_roles(ctx.pack)
        self.limit = spill_limit(stage.spill_chars, stage.spill_window_share, ctx.budget.usable)
        self._unsettled_at: list[int] = []  # tool results not settled (see _unsettled)

    def call(self, index: int) -> Mapping[str, Any] | None:
        """The call the tool result at ``index`` answers."""
        key = self.shape.call_of(index)
        if key is None:
            return None
        calls = self.messages[key[0]].get("tool_calls") or []
        call = calls[key[1]] if key[1] < len(calls) else None
        return call if isinstance(call, Mapping) else None

    # --- driver -----------------------------------------------------------------------------

    def execute(self) -> StageOutcome:
        stage, ctx = self.stage, self.ctx
        facts = self.shape.facts
        sent, sent_keys = self._sent_before() if bypass_active(ctx, stage.options) else (frozenset(), None)
        self.keep = keep_ratio(ctx.utilization, ctx.budget.thresholds["emergency"], stage.min_keep, stage.max_keep)
        limit = self.limit
        oversized = [i for i, f in enumerate(facts) if f.longest > limit] if self.shape.longest > limit else []
        fresh, skipped_hot = self._unsettled(sent, sent_keys)
        if not oversized and not fresh and not skipped_hot:
            # A warm turn: every output was examined before (or is pinned, protected, exempt)
            # and nothing is over the spill limit, so nothing can change.
            self._settle({})
            self._remember_sent()
            return StageOutcome(messages=unchanged(self.messages))
        results = {i: self._result(i) for i in fresh}
        examined = list(results)
        relevant: list[Step] = []
        # A huge sub-agent result that may be handed over gets the handover (which also puts
        # it in the vault whole) rather than the spill preview: done/todo/risks say more.
        handed = {
            i
            for i, r in results.items()
            if r.reducible
            and r.role == "subagent"
            and len(self.messages[i].get("content") or "") > stage.subagent_chars
            and isinstance(self.messages[i].get("content"), str)
        }
        for index in oversized:
            if index not in handed:
                self._spill(index, self.messages[index])
        for r in results.values():
            if self.out[r.index] is not self.messages[r.index]:  # spilled
                r.reducible = False
        if any(r.reducible for r in results.values()):
            # Token counts are only needed for outputs that may be reduced and for the other
            # outputs of their steps (the turn cap); a warm turn counts just those.
            relevant = self._steps_of(r.index for r in results.values() if r.reducible)
            for st in relevant:
                for i in st.results:
                    if i not in results and facts[i].role in _RESULT_ROLES:
                        results[i] = self._result(i, examine=False)
            needed = {i for st in relevant for i in st.results if i in results}
            needed.update(r.index for r in results.values() if r.reducible)
            for i in needed:
                if results[i].tokens < 0:
                    results[i].tokens = ctx.counter.count_message(self.out[i])
            for r in results.values():
                if r.reducible:
                    self._first_pass(r)
            self._plan_targets(results, relevant)
            for r in results.values():
                if r.reducible and r.target is not None:
                    self._reduce(r)
        if skipped_hot:
            self.actions.append(
                Action(
                    "hot_cache_bypass",
                    f"{skipped_hot} output(s) already sent while the prompt cache is hot were left alone",
                )
            )
        self._settle(self._settle_at(examined, results, relevant))
        self._remember_sent()
        return StageOutcome(messages=self.out, actions=self.actions, warnings=self.warnings)

    def _settle_at(self, examined: list[int], results: dict[int, _Result], relevant: list[Step]) -> dict[int, float]:
        """The keep ratio each examined output is settled at. What happened to it now stays so
        at this keep ratio or a laxer one; at *any* ratio (0) when no ratio could give it a
        target: it cannot be reduced (exempt, already marked, no text), or it and its whole
        step are under the thresholds (outputs only ever shrink). Reduced or spilled outputs
        are new objects next time; _settle skips them."""
        stage = self.stage
        totals: dict[int, int] = {}
        for st in relevant:
            total = sum(results[i].tokens for i in st.results if i in results)
            totals.update(dict.fromkeys(st.results, total))
        out: dict[int, float] = {}
        for i in examined:
            r = results[i]
            lasting = not r.reducible or (
                r.target is None
                and 0 <= r.tokens <= stage.item_tokens
                and totals.get(i, stage.turn_tokens + 1) <= stage.turn_tokens
            )
            out[i] = 0.0 if lasting else self.keep
        return out

    def _sent_before(self) -> tuple[AbstractSet[str], AbstractSet[str] | None]:
        """The digests of ``state['sent']``, and the keys (filter_common.result_key) of the
        results they were taken of when known (else None): kept as sets by the last call with
        the list it left there, so a warm turn does not hash every digest sent into a new set,
        nor digest a new result whose key no sent result has."""
        listed = self.ctx.state.get("sent") or []
        last = self.stage._last_sent.get(self.ctx.session_id)
        if last is not None and last.listed is listed:  # not loaded from elsewhere since
            return last.members, last.keys
        return set(listed), None

    def _unsettled(self, sent: AbstractSet[str], sent_keys: AbstractSet[str] | None) -> tuple[list[int], int]:
        """The tool results to examine: not pinned, protected or settled, and not already sent
        while the prompt cache is hot (those are only counted).

        Only results that were not settled at the end of the last call, and results that are
        new since then (other objects at a position), are looked at: the others were settled
        and stay so while the keep ratio does not drop."""
        stage, messages = self.stage, self.messages
        last = stage._last_scan.get(self.ctx.session_id)
        look: Iterable[int] | None = None
        if last is not None and last[2] == stage._epoch and self.keep >= last[1]:
            old_shape, pending = last[0], last[3]
            start = self.shape.extends(old_shape)
            if start is not None:  # only appended to: what was pending, and the new results
                facts = self.shape.facts
                new = [i for i in range(start, len(facts)) if facts[i].role in _RESULT_ROLES]
                look = sorted(pending.union(new)) if pending else new
            elif old_shape.snapshot is not None:
                # Compared result by result: the n-th tool result of each list.
                old_results, results = old_shape.results, self.shape.results
                old = tuple(map(old_shape.snapshot.__getitem__, old_results))
                current = tuple(map(messages.__getitem__, results))
                n = min(len(old), len(current))
                where = {i: p for p, i in enumerate(old_results)}
                held = [where[i] for i in pending if i in where]
                look = [
                    results[p]
                    for p in sorted({p for p in held if p < n and old[p] is current[p]}.union(_changed(old, current)))
                ]
        if look is None:
            look = self.shape.results
        pins, protected = self.shape.pins, self.ctx.protected
        out: list[int] = []
        unsettled: list[int] = []
        hot = 0
        for i in look:
            msg = messages[i]
            if i in pins:
                unsettled.append(i)
                continue
            if self._is_settled(msg):
                continue  # examined before at this keep ratio or a laxer one
            unsettled.append(i)
            if id(msg) in protected:
                continue
            if (
                sent
                and (sent_keys is None or result_key(msg) in sent_keys)
                and result_digest(msg) in sent
                and not self._marked(msg)
            ):
                hot += 1
            else:
                out.append(i)  # an output already shortened is examined once, then settled
        self._unsettled_at = unsettled
        return out, hot

    def _marked(self, msg: Message) -> bool:
        """Whether a text of ``msg`` carries a live marker (it was shortened already)."""
        return any(has_live_marker(u.text, self.ctx.vault) for u in _units(msg))

    def _is_settled(self, msg: Message) -> bool:
        hit = self.stage._settled.get(id(msg))
        return hit is not None and hit[0] is msg and hit[2] is msg.get("content") and self.keep >= hit[1]

    def _steps_of(self, indices: Iterable[int]) -> list[Step]:
        """The steps the tool results at ``indices`` belong to (from the pairing, without
        walking the whole list: on a warm turn only a few results are in question)."""
        found: dict[int, Step] = {}
        loose: list[int] = []
        tail = self.shape.tail_calls()
        for index in indices:
            key = self.shape.call_of(index)
            if key is None:
                loose.append(index)
                continue
            owner = key[0]
            if owner in found:
                continue
            plain = self.shape.step_results(owner)
            if tail is not None and index in tail:
                # The newest step, plain from its messages: its results are the tail's.
                members = sorted(tail)
            elif plain is not None:  # a step that was the newest before, all its calls answered
                members = list(plain)
            else:
                pairing = self.shape.pairing
                calls = self.messages[owner].get("tool_calls") or []
                members = sorted(
                    pairing.result_of[(owner, pos)] for pos in range(len(calls)) if (owner, pos) in pairing.result_of
                )
            found[owner] = Step(owner, tuple(members))
        if loose:  # unpaired results (orphans, legacy function results): the full walk
            for step in self.shape.steps():
                if step.assistant not in found and any(i in step.results for i in loose):
                    found[step.assistant] = step
        return [found[k] for k in sorted(found)]

    def _remember_sent(self) -> None:
        if not self.stage.options["hot_cache_bypass"]:
            return
        # Only outputs big enough to be reduced at all are remembered. The digest (or None)
        # of each output is carried from the last call for the same objects.
        stage, out = self.stage, self.out
        tokenizer = self.ctx.counter.tokenizer
        session = self.ctx.session_id
        # Taken out while it is extended in place (PerSession.pop): a failure on the way
        # leaves no half-changed memo behind.
        last = stage._last_sent.pop(session)
        out_shape = self.shape if out is self.messages else shape(out)
        start = out_shape.extends(last.shape) if last is not None and last.tokenizer == tokenizer else None
        if last is not None and start is not None:
            # A warm turn that only appended: the digests of the new results go after the
            # old ones, into the sorted list and the set of last time.
            digests, sent, members, keys = last.digests, last.ordered, last.members, last.keys
            facts = out_shape.facts
            for i in range(start, len(facts)):
                if facts[i].role in _RESULT_ROLES:
                    digest = self._sent_digest(out[i])
                    digests.append(digest)
                    if digest:
                        bisect.insort(sent, digest)
                        members.add(digest)
                        keys.add(result_key(out[i]))
            listed = self.ctx.state["sent"] = list(sent)
            stage._last_sent.put(session, _SentMemo(out_shape, tokenizer, digests, sent, listed, members, keys))
            return
        # Stages before the integrity pass keep each message's role where it is.
        indices = self.shape.results if len(out) == len(self.messages) else out_shape.results
        current = tuple(map(out.__getitem__, indices))
        sent_now: list[str] | None = None
        sent_keys: set[str] | None = None
        if last is not None and last.tokenizer == tokenizer and last.shape.snapshot is not None:
            before = tuple(map(last.shape.snapshot.__getitem__, last.shape.results))
            digests = last.digests[: len(current)]
            digests.extend([None] * (len(current) - len(digests)))
            changed = list(_changed(before, current))
            gone = [d for d in last.digests[len(current) :] if d]  # the list got shorter
            for p in changed:
                was = last.digests[p] if p < len(last.digests) else None
                if was:
                    gone.append(was)
                digests[p] = self._sent_digest(current[p])
            if len(changed) + len(gone) <= _SENT_EDITS:
                # The sorted list of last time, edited where outputs changed.
                sent_now = last.ordered
                for d in gone:
                    del sent_now[bisect.bisect_left(sent_now, d)]
                sent_keys = last.keys  # a superset stays one: only the changed outputs' keys join
                for p in changed:
                    now = digests[p]
                    if now:
                        bisect.insort(sent_now, now)
                        sent_keys.add(result_key(current[p]))
        else:
            digests = [self._sent_digest(m) for m in current]
        if sent_now is None:
            sent_now = sorted(d for d in digests if d)
        listed = self.ctx.state["sent"] = list(sent_now)
        if sent_keys is None or len(sent_keys) > 2 * len(sent_now) + 64:  # (keys of outputs long gone)
            # digests[p] is the digest (or None) of current[p]; sent_now holds those digests.
            sent_keys = {result_key(m) for m, d in zip(current, digests, strict=True) if d}
        stage._last_sent.put(
            session, _SentMemo(out_shape, tokenizer, digests, sent_now, listed, set(sent_now), sent_keys)
        )

    def _sent_digest(self, msg: Message) -> str | None:
        """The digest to remember for ``msg`` as sent, or None when it is too small to ever be
        reduced; remembered per message object and tokenizer like ``_settled``."""
        memo = self.stage._sent
        key = (id(msg), self.ctx.counter.tokenizer)
        hit = memo.get(key)
        if hit is not None and hit[0] is msg and hit[1] is msg.get("content"):
            return hit[2]
        big = self.ctx.counter.count_message(msg) > self.stage.min_saving
        digest = result_digest(msg) if big else None
        if len(memo) > 50_000:
            memo.clear()
        memo[key] = (msg, msg.get("content"), digest)
        return digest

    def _settle(self, settle_at: dict[int, float]) -> None:
        stage = self.stage
        if len(stage._settled) > 50_000:
            stage.forget_settled()
        for index, keep in settle_at.items():
            msg = self.messages[index]
            if self.out[index] is msg:
                stage._settled[id(msg)] = (msg, keep, msg.get("content"))
        messages = self.messages
        pending = frozenset(i for i in self._unsettled_at if not self._is_settled(messages[i]))
        stage._last_scan.put(self.ctx.session_id, (self.shape, self.keep, stage._epoch, pending))

    # --- level (c): the hard spill, every message ------------------------------------------

    def _spill(self, index: int, msg: Message) -> None:
        limit = self.limit
        content = msg.get("content")
        what = "tool output" if msg.get("role") in _RESULT_ROLES else f"{msg.get('role')} message"
        if isinstance(content, str):
            spilled = self._spilled(content, what) if len(content) > limit else None
            if spilled is not None:
                text, vid, fmt = spilled
                self._commit(
                    index,
                    {**msg, "content": text},
                    "spill",
                    f"{len(content):,} chars ({fmt}) spilled to the vault",
                    vid,
                )
            return
        if not isinstance(content, list):
            return
        parts: list[Any] = list(content)
        changed: list[tuple[str, str]] = []
        for pos, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != "text":
                continue
            part_text = part.get("text")
            if not isinstance(part_text, str) or len(part_text) <= limit:
                continue
            spilled = self._spilled(part_text, what)
            if spilled is not None:
                new_text, vid, fmt = spilled
                parts[pos] = {**part, "text": new_text}
                changed.append((vid, f"part {pos}: {len(part_text):,} chars ({fmt})"))
        if changed:
            detail = "; ".join(d for _, d in changed) + " spilled to the vault"
            self._commit(index, {**msg, "content": parts}, "spill", detail, changed[0][0])

    def _spilled(self, text: str, what: str) -> tuple[str, str, str] | None:
        """The stand-in for ``text`` spilled whole, its vault id and format; None when the
        stand-in (marker, note and preview) would not be shorter than ``text`` — a short text
        at a tiny usable window, or a stand-in spilled again — so a spill never grows what it
        stands for."""
        if is_spill_stand_in(text):
            return None
        vid = self.ctx.vault.put_text(text)  # (content-addressed: a spill not taken leaves a copy)
        summary, fmt = spill_summary(
            text, vault_id=vid, count=self.count, preview_tokens=self.stage.spill_preview_tokens, what=what
        )
        return None if len(summary) >= len(text) else (summary, vid, fmt)

    # --- which results may be reduced ----------------------------------------------------------

    def _result(self, index: int, *, examine: bool = True) -> _Result:
        """What the stage knows of the tool result at ``index``; ``examine`` is false for a
        result that only counts toward its step's total (pinned, protected, settled, hot)."""
        ctx, stage = self.ctx, self.stage
        msg = self.messages[index]
        call = self.call(index)
        name = call_name(call) if call is not None else msg.get("name")
        tool = name if isinstance(name, str) else None
        result = _Result(index, tool, self.roles.role_of(tool))
        result.tokens = -1  # counted in execute() when anything may be reduced
        if self.out[index] is not msg:  # spilled
            result.reducible = False
            result.tokens = ctx.counter.count_message(self.out[index])
        elif not examine or result.role in stage.exempt:
            result.reducible = False
        else:
            result.units = _units(msg)
            units = result.units
            if not units or any(has_live_marker(u.text, ctx.vault) for u in units):
                result.reducible = False
        return result

    # --- subagent handover and level (a) ---------------------------------------------------

    def _first_pass(self, r: _Result) -> None:
        msg = self.out[r.index]
        content = msg.get("content")
        if not isinstance(content, str):
            return
        stage = self.stage
        if r.role == "subagent" and len(content) > stage.subagent_chars:
            vid = text_vault_id(content)
            text, handover = handover_text(
                content, vault_id=vid, count=self.count, keep_tokens=stage.subagent_keep_tokens, tokens=r.tokens
            )
            self.ctx.vault.put_text(content)
            detail = (
                f"sub-agent result of {len(content):,} chars: head + tail + handover "
                f"({len(handover.done)} done, {len(handover.todo)} todo, "
                f"{len(handover.risks)} risks, {len(handover.files)} files)"
            )
            self._commit(r.index, {**msg, "content": text}, "handover", detail, vid)
            r.reducible = False
            r.tokens = self.ctx.counter.count_message(self.out[r.index])
            return
        # An output no bigger than the minimum saving cannot save that much: not worth a parse.
        if r.role == "shell" and stage.compressors and r.tokens > stage.min_saving:
            self._compress(r, msg, content)

    def _compress(self, r: _Result, msg: Message, content: str) -> None:
        call = self.call(r.index)
        command = shell_command(call) if call is not None else None
        if not command:
            return
        registry = self.ctx.registry
        if registry is None:  # a context built by hand, without plugins: no actions to run
            return
        exit_code = tool_roles(self.ctx.pack).exit_code(content)
        try:
            result = compress_tool_output(self.ctx.pack, command, content, exit_code, self.ctx.vault, registry=registry)
        except StoreUnavailable:
            raise  # not the rule's fault: the turn fails at once (ctxrules.pipeline.runner)
        except Exception as exc:  # a broken compressor rule must not cost the other outputs
            self.warnings.append(
                f"compressor failed on message {r.index} ({command[:60]!r}): {type(exc).__name__}: {exc}"
            )
            return
        if result is None or len(result.text) >= len(content):
            return
        vid = self.ctx.vault.put_text(content)
        text = result.text
        if not any(m.vault_id == vid for m in parse_markers(text)):
            # Every elision leaves a marker that resolves to the original (invariant 3).
            dropped = max(0, result.lines_before - result.lines_after)
            marker = format_marker("lines", dropped, vid, rule=result.rule_id)
            text = f"{text.rstrip(chr(10))}\n{marker}"
        new = {**msg, "content": text}
        if tokens_saved(self.ctx, msg, new) <= 0:
            return  # shorter in characters, not in tokens: not worth a marker
        self._commit(
            r.index,
            new,
            "compress",
            f"compressor '{result.rule_id}': {result.lines_before} -> {result.lines_after} lines",
            vid,
        )
        r.units = _units(new)
        r.tokens = self.ctx.counter.count_message(new)

    # --- level (b): targets, then structure-aware reduction --------------------------------

    def _plan_targets(self, results: dict[int, _Result], relevant: list[Step]) -> None:
        """Targets for reducible outputs: the item target, then the turn cap of each step in
        ``relevant`` (the steps that have a reducible output; the others cannot change)."""
        stage = self.stage
        keep = self.keep
        item_target = max(FLOOR_TOKENS, math.floor(stage.item_tokens * keep))
        turn_target = max(FLOOR_TOKENS, math.floor(stage.turn_tokens * keep))
        for r in results.values():
            if r.reducible and r.tokens > stage.item_tokens:
                r.target = item_target
        for step in relevant:
            members = [results[i] for i in step.results if i in results]
            sizes = {r.index: min(r.tokens, r.target) if r.target is not None else r.tokens for r in members}
            if sum(sizes.values()) <= stage.turn_tokens:
                continue
            fixed = sum(sizes[r.index] for r in members if not r.reducible)
            flexible = sorted(sizes[r.index] for r in members if r.reducible)
            cap = _water_level(flexible, turn_target - fixed)
            cap = max(FLOOR_TOKENS, cap)
            for r in members:
                if r.reducible and sizes[r.index] > cap:
                    r.target = cap if r.target is None else min(r.target, cap)

    def _reduce(self, r: _Result) -> None:
        assert r.target is not None
        msg = self.out[r.index]
        for unit in r.units:
            unit.tokens = self.count(unit.text)
        total = sum(u.tokens for u in r.units) or 1
        details: list[str] = []
        vault_ids: list[str] = []
        content = msg.get("content")
        parts: list[Any] = list(content) if isinstance(content, list) else []
        new_content: Any = content
        for unit in r.units:
            budget = max(FLOOR_TOKENS // 2, math.floor(r.target * unit.tokens / total))
            if unit.tokens <= budget:
                continue
            reduced = self._reduce_text(unit, budget)
            if reduced is None:
                continue
            text, detail, vid = reduced
            if unit.part is None:
                new_content = text
            else:
                parts[unit.part] = {**parts[unit.part], "text": text}
                new_content = parts
            details.append(detail)
            vault_ids.append(vid)
        if not details:
            return
        new = {**msg, "content": new_content}
        saved = tokens_saved(self.ctx, msg, new)
        if saved < self.stage.min_saving:
            return
        for unit in r.units:
            if text_vault_id(unit.text) in vault_ids:
                self.ctx.vault.put_text(unit.text)
        tool = f" ({r.tool})" if r.tool else ""
        self._commit(
            r.index,
            new,
            "reduce",
            f"output{tool} of {r.tokens:,} tokens to a target of {r.target:,}: " + "; ".join(details),
            vault_ids[0],
        )

    def _reduce_text(self, unit: _Unit, budget: int) -> tuple[str, str, str] | None:
        vid = text_vault_id(unit.text)
        detected = detect(unit.text)
        if self.stage.semantic and detected.format == "text":
            semantic = self._semantic(unit, budget, vid)
            if semantic is not None:
                return semantic
        reduced = reduce_structured(
            unit.text,
            vault_id=vid,
            budget_tokens=budget,
            count=self.count,
            json_limits=self.stage.json_limits,
            head_share=self.stage.head_share,
            detected=detected,
            tokens=unit.tokens,
        )
        if reduced is None or len(reduced.text) >= len(unit.text):
            return None
        return reduced.text, reduced.detail, vid

    def _semantic(self, unit: _Unit, budget: int, vid: str) -> tuple[str, str, str] | None:
        hooks = self.ctx.hooks
        caller = getattr(hooks, "ctxrules_semantic_filter", None) if hooks is not None else None
        if caller is None:
            return None
        try:
            answer = caller(text=unit.text, budget_tokens=budget, ctx=self.ctx)
        except Exception as exc:  # an LLM plugin failing must not cost the reduction
            self.warnings.append(
                f"semantic filter failed: {type(exc).__name__}: {exc}; used the structure-aware reduction"
            )
            return None
        if not isinstance(answer, str) or not answer.strip():
            return None
        removed = max(0, unit.tokens - self.count(answer))
        text = f"{format_marker('tokens', removed, vid, reason='semantic')}\n{answer}"
        if self.count(text) > budget * 1.1 or len(text) >= len(unit.text):
            self.warnings.append("semantic filter returned more than its budget; used the structure-aware reduction")
            return None
        return text, "semantic filter", vid

    # --- bookkeeping -----------------------------------------------------------------------

    def _commit(self, index: int, new: Message, kind: str, detail: str, vault_id: str) -> None:
        if self.out is self.messages:
            self.out = list(self.messages)
        old = self.out[index]
        new = keep_mark(old, new)  # a spilled notes/reread/summary message is still ctxrules' own
        self.out[index] = new
        saved = tokens_saved(self.ctx, old, new)
        self.actions.append(
            Action(kind, f"message {index}: {detail}", index=index, tokens_saved=saved, vault_id=vault_id)
        )


# More outputs changed than this since the last call: the sent digests are sorted afresh.
_SENT_EDITS = 32


class _SentMemo(NamedTuple):
    """What the last call left in ``state['sent']``, per session (see _remember_sent)."""

    shape: structure.Shape  # of its output
    tokenizer: str
    digests: list[str | None]  # of each tool result of the output in order (None: too small)
    ordered: list[str]  # the digests sorted, as state['sent'] keeps them
    listed: list[str]  # the copy of ``ordered`` put in state['sent'] (nothing changes it)
    members: set[str]  # the digests as a set, for the next call's _sent_before
    keys: set[str]  # the result_key of each result whose digest is in members (a superset)


def _changed(old: Sequence[Any], new: Sequence[Any]) -> Iterable[int]:
    """Positions of ``new`` that do not hold the object ``old`` held there."""
    return itertools.chain(structure.replaced(old, new), range(min(len(old), len(new)), len(new)))


def _units(msg: Mapping[str, Any]) -> list[_Unit]:
    content = msg.get("content")
    if isinstance(content, str):
        return [_Unit(None, content)] if content else []
    if not isinstance(content, list):
        return []
    return [
        _Unit(pos, part["text"])
        for pos, part in enumerate(content)
        if isinstance(part, Mapping)
        and part.get("type") == "text"
        and isinstance(part.get("text"), str)
        and part["text"]
    ]


def _water_level(sizes: list[int], room: int) -> int:
    """The largest cap ``c`` with ``sum(min(s, c) for s in sizes) <= room`` (sizes sorted)."""
    if not sizes:
        return room
    remaining = room
    for i, size in enumerate(sizes):
        share = remaining // (len(sizes) - i) if remaining > 0 else 0
        if size > share:
            return share
        remaining -= size
    return sizes[-1]


_JSON_DEFAULTS = {"depth": 4, "keys": 12, "items": 6, "string_chars": 200}

OPTIONS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "title": "tool_output.filter options",
    "description": "Thresholds and limits of the three levels (compress, reduce, spill).",
    "additionalProperties": False,
    "properties": {
        "item_tokens": {
            "title": "Single-output threshold",
            "description": "An output over this many tokens is reduced by its structure (level b).",
            "type": "integer",
            "minimum": 1,
            "default": 5000,
        },
        "turn_tokens": {
            "title": "Per-step threshold",
            "description": (
                "When the outputs of one step total more than this many tokens, its "
                "reducible outputs are capped so the step fits (level b)."
            ),
            "type": "integer",
            "minimum": 1,
            "default": 15000,
        },
        "spill_chars": {
            "title": "Hard spill threshold",
            "description": (
                "Any single content over this many characters, in any message (pinned "
                "and protected ones included), goes to the vault whole and leaves a "
                "short summary with a pointer (level c)."
            ),
            "type": "integer",
            "minimum": 1,
            "default": 100000,
        },
        "spill_window_share": {
            "title": "Hard spill share of the window",
            "description": (
                "The spill limit scales with the window: a content over this share of "
                "the usable window (counted at 4 characters per token) is spilled too, "
                "when that is fewer characters than spill_chars."
            ),
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": 1,
            "default": 1.0,
        },
        "spill_preview_tokens": {
            "title": "Spill preview size",
            "description": ("Tokens of the preview (skeleton or head/tail) a spilled content leaves."),
            "type": "integer",
            "minimum": 50,
            "default": 400,
        },
        "subagent_chars": {
            "title": "Sub-agent result threshold",
            "description": (
                "A result of a 'subagent' tool over this many characters becomes "
                "its head and tail plus a structured handover (done, todo, risks, "
                "files)."
            ),
            "type": "integer",
            "minimum": 1,
            "default": 8000,
        },
        "subagent_keep_tokens": {
            "title": "Sub-agent head + tail size",
            "description": "Tokens of the head and tail kept from a long sub-agent result.",
            "type": "integer",
            "minimum": 50,
            "default": 1000,
        },
        "max_keep_ratio": {
            "title": "Keep ratio with an empty window",
            "description": (
                "Share of item_tokens / turn_tokens a reduced output keeps when the "
                "window is empty (predictive strength, see the docs)."
            ),
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": 1,
            "default": 0.6,
        },
        "min_keep_ratio": {
            "title": "Keep ratio at the emergency tier",
            "description": (
                "Share of item_tokens / turn_tokens a reduced output keeps once "
                "utilization reaches the emergency threshold."
            ),
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": 1,
            "default": 0.15,
        },
        "head_share": {
            "title": "Head share",
            "description": (
                "Share of a text or table reduction given to its first lines (the rest goes to its last lines)."
            ),
            "type": "number",
            "minimum": 0.2,
            "maximum": 0.8,
            "default": 0.6,
        },
        "min_saving_tokens": {
            "title": "Minimum saving",
            "description": "A reduction that would save fewer tokens than this is not made.",
            "type": "integer",
            "minimum": 0,
            "default": 200,
        },
        "json": {
            "title": "JSON skeleton limits",
            "description": ("Starting limits of the JSON skeleton; they tighten until the skeleton fits its target."),
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "depth": {
                    "title": "Depth",
                    "description": "Container levels shown (the root is 1).",
                    "type": "integer",
                    "minimum": 1,
                    "default": 4,
                },
                "keys": {
                    "title": "Keys",
                    "description": "Keys shown per object.",
                    "type": "integer",
                    "minimum": 1,
                    "default": 12,
                },
                "items": {
                    "title": "Items",
                    "description": "Items shown per list (first and last).",
                    "type": "integer",
                    "minimum": 1,
                    "default": 6,
                },
                "string_chars": {
                    "title": "String length",
                    "description": "Characters shown per string value.",
                    "type": "integer",
                    "minimum": 8,
                    "default": 200,
                },
            },
            "default": dict(_JSON_DEFAULTS),
        },
        "compressors": {
            "title": "Use output compressors",
            "description": "Run shell-tool outputs through the pack's compressors (level a).",
            "type": "boolean",
            "default": True,
        },
        "semantic_filter": {
            "title": "Semantic filter plugin",
            "description": (
                "Let a plugin implementing ctxrules_semantic_filter (e.g. an LLM) "
                "shorten large plain-text outputs; off by default, and the stage "
                "works offline without it."
            ),
            "type": "boolean",
            "default": False,
        },
        "exempt_roles": {
            "title": "Exempt tool roles",
            "description": ("Tool roles whose outputs levels (a) and (b) leave alone (level c still applies)."),
            "type": "array",
            "uniqueItems": True,
            "items": {"enum": list(ROLE_ORDER)},
            "default": ["file_read", "file_edit"],
        },
        **BYPASS_PROPERTIES,
    },
}

STAGE_TYPE = StageType(
    name="tool_output.filter",
    phase="content",
    factory=ToolOutputFilter,
    description=(
        "Compresses shell outputs, reduces large tool outputs by their structure, hands "
        "over long sub-agent results and spills any huge content to the vault."
    ),
    options_schema=OPTIONS_SCHEMA,
)


@hookimpl
def ctxrules_register_stages(register: Callable[[StageType], None]) -> None:
    register(STAGE_TYPE)
