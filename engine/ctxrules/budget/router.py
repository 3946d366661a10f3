"""The complexity router: SIMPLE / STANDARD / REASONING tiers mapped to the pack's models.

A decision, in order (docs/budgets.md "Routing"):

1. **Rules**: every rule whose conditions all hold adds its score (the built-in
   :data:`DEFAULT_RULES`, merged by id with the pack's ``router.rules``; a rule without
   conditions always applies, e.g. ``baseline``). ``score >= cutoffs.reasoning`` is REASONING,
   ``>= cutoffs.standard`` STANDARD, else SIMPLE.
2. **Misroutes**: misroutes recorded for messages the rules put in the same tier shift it
   towards the tier that was wanted. Each weighs 1 when recorded and 0 after ``decay_h`` (24 h),
   linearly; a summed weight of ``threshold`` (0.5) or more shifts by one tier (rounded).
3. **Judge** (optional): the ``ctxrules_route_judge`` plugin hook, when the score is within
   ``judge.band`` of a cutoff, given up after ``judge.timeout_s`` (an LLM judge whose endpoint
   trickles bytes never lets a read time out: it held the caller's turn for as long as it liked).
4. **Momentum**: a follow-up never routes below the highest tier the rules (with misroutes and
   the judge) gave one of the last ``momentum.turns`` decisions made within ``momentum.window_s``.
   Only those tiers count, never a tier that momentum, a regeneration or privacy raised: a floor
   that counted its own output would hold one reasoning turn forever.
5. **Regeneration floor**: a regeneration gets at least ``regenerate.min_tier`` and (with
   ``step_up``) one tier above the previous decision.
6. **Privacy**: when the pack's redaction patterns flag the text (credentials, PII) and the
   tier is not ``privacy_safe``, the nearest privacy-safe tier is used (above first).

Decisions are remembered per session (``<session>/router.json``); misroutes span sessions
(``<state>/router/misroutes.jsonl``). Everything is deterministic for the same text, state and
clock.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from ctxrules.errors import CtxrulesError, UsageError
from ctxrules.llm import call_within
from ctxrules.messages import is_real_user, message_text
from ctxrules.patterns import Pattern, PatternTimeout
from ctxrules.patterns import compile as patterns_compile
from ctxrules.redaction import redactor_for
from ctxrules.stores.base import Log
from ctxrules.stores.filesystem import FilesystemStore

if TYPE_CHECKING:
    from ctxrules.stores.base import Store

__all__ = ["DEFAULT_RULES", "JUDGE_TIMEOUT_S", "TIERS", "ComplexityRouter", "RouteDecision", "privacy_findings"]

TIERS: Final = ("simple", "standard", "reasoning")
JUDGE_TIMEOUT_S: Final = 10.0
"""Seconds the judge hook may take for one decision (``router.judge.timeout_s``)."""

DEFAULT_RULES: Final[Mapping[str, Mapping[str, Any]]] = {
    "baseline": {"score": 1, "description": "an ordinary message is a standard task"},
    "greeting": {
        "score": -2,
        "max_chars": 200,  # a greeting is short; a huge text must not time the pattern out
        "regex": r"(?i)^\W*(hi|hello|hey|thanks|thank you|thx|ok|okay|great|cool|nice|"
        r"yes|no|sure|good (morning|evening|night))\W*$",
        "description": "greetings and acknowledgements",
    },
    "short-question": {
        "score": -1,
        "max_chars": 120,
        "regex": r"\?\s*$",
        "description": "a one-line question",
    },
    "long": {"score": 1, "min_chars": 2000, "description": "a long request"},
    "very-long": {"score": 1, "min_chars": 8000, "description": "a very long request"},
    "code": {
        "score": 1,
        "regex": r"(?m)```|Traceback \(most recent call last\)|"
        r"^[^\S\n]*(def|class|fn|func|function|import|#include)\b",
        "description": "code or a stack trace",
    },
    "multi-step": {
        "score": 1,
        "min_lines": 3,
        "regex": r"(?m)^[^\S\n]*(\d+[.)]|[-*])\s+\S",
        "description": "a list of steps",
    },
    "reasoning": {
        "score": 2,
        "keywords": [
            "prove",
            "derive",
            "architecture",
            "trade-off",
            "tradeoff",
            "trade-offs",
            "root cause",
            "step by step",
            "analyze",
            "analyse",
            "optimize",
            "formal",
            "algorithm",
            "complexity",
            "design a",
            "why does",
            "why is",
        ],
        "description": "words that ask for reasoning",
    },
}
DEFAULT_CUTOFFS: Final = {"standard": 1.0, "reasoning": 4.0}
_MAX_DECISIONS: Final = 50


@dataclass(frozen=True)
class RouteDecision:
    """Where a call goes and why."""

    tier: str
    model: str | None
    score: float
    rules_tier: str
    matched: tuple[str, ...]
    reasons: tuple[str, ...]
    privacy: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "tier": self.tier,
            "model": self.model,
            "score": self.score,
            "rules_tier": self.rules_tier,
            "matched": list(self.matched),
            "reasons": list(self.reasons),
            "privacy": self.privacy,
        }


@dataclass(frozen=True)
class _Rule:
    id: str
    score: float
    regex: Pattern | None = None
    keywords: re.Pattern[str] | None = None
    min_chars: int | None = None
    max_chars: int | None = None
    min_lines: int | None = None

    def matches(self, text: str, lines: int) -> bool:
        if self.min_chars is not None and len(text) < self.min_chars:
            return False
        if self.max_chars is not None and len(text) > self.max_chars:
            return False
        if self.min_lines is not None and lines < self.min_lines:
            return False
        if self.regex is not None:
            try:
                if not self.regex.search(text):
                    return False
            except PatternTimeout:  # remembered as timed out (ctxrules.patterns): the rule does not hold
                return False
        return not (self.keywords is not None and not self.keywords.search(text))


def _compile_rule(rid: str, spec: Mapping[str, Any]) -> _Rule:
    try:
        regex = patterns_compile(spec["regex"]) if isinstance(spec.get("regex"), str) else None
    except re.error as exc:
        raise UsageError(f"router.rules.{rid}.regex does not compile: {exc}") from None
    words = [w for w in spec.get("keywords") or [] if isinstance(w, str) and w.strip()]
    keywords = (
        re.compile(r"(?i)(?<!\w)(" + "|".join(re.escape(w.strip()) for w in words) + r")(?!\w)") if words else None
    )
    return _Rule(
        rid,
        float(spec.get("score", 0)),
        regex,
        keywords,
        spec.get("min_chars"),
        spec.get("max_chars"),
        spec.get("min_lines"),
    )


def privacy_findings(text: str, pack: Mapping[str, Any], kinds: tuple[str, ...] = ("credential", "pii")) -> list[str]:
    """Ids of the pack's redaction patterns that flag ``text`` (``ctxrules.redaction``)."""
    try:
        redactor = redactor_for(pack)
    except ValueError:  # a pattern that does not compile: validate reports CR070
        return []
    return sorted({f.pattern for f in redactor.findings(text) if f.kind in kinds})


class ComplexityRouter:
    """The router of a pack's ``router:`` node (see the module docstring)."""

    def __init__(self, pack: Mapping[str, Any], *, hooks: Any = None) -> None:
        node = pack.get("router")
        self.pack = pack
        self.node: Mapping[str, Any] = node if isinstance(node, Mapping) else {}
        self.enabled = isinstance(node, Mapping) and self.node.get("enabled", True) is not False
        self.hooks = hooks
        self.tiers: dict[str, Mapping[str, Any]] = {
            t: v for t, v in (self.node.get("tiers") or {}).items() if t in TIERS and isinstance(v, Mapping)
        }
        cut = {**DEFAULT_CUTOFFS, **(self.node.get("cutoffs") or {})}
        self.cutoffs = (float(cut["standard"]), float(cut["reasoning"]))
        if self.cutoffs[0] > self.cutoffs[1]:
            raise UsageError(
                f"router.cutoffs: standard ({self.cutoffs[0]}) must not be above reasoning ({self.cutoffs[1]})"
            )
        merged: dict[str, Mapping[str, Any]] = {k: dict(v) for k, v in DEFAULT_RULES.items()}
        for rid, spec in (self.node.get("rules") or {}).items():
            if not isinstance(spec, Mapping):
                continue
            merged[rid] = {**merged.get(rid, {}), **spec}
        self.rules = [
            _compile_rule(rid, spec) for rid, spec in merged.items() if spec.get("enabled", True) is not False
        ]
        mom = self.node.get("momentum") or {}
        self.momentum_turns = int(mom.get("turns", 2))
        self.momentum_window_s = float(mom.get("window_s", 900.0))
        regen = self.node.get("regenerate") or {}
        self.regen_min = str(regen.get("min_tier", "standard"))
        self.regen_step_up = bool(regen.get("step_up", True))
        mis = self.node.get("misroutes") or {}
        self.decay_s = float(mis.get("decay_h", 24.0)) * 3600.0
        self.threshold = float(mis.get("threshold", 0.5))
        priv = self.node.get("privacy") or {}
        self.privacy_enabled = priv.get("enabled", True) is not False
        self.privacy_kinds = tuple(priv.get("kinds") or ("credential", "pii"))
        judge = self.node.get("judge") or {}
        self.judge_enabled = bool(judge.get("enabled", False))
        self.judge_band = float(judge.get("band", 1.0))
        self.judge_timeout_s = float(judge.get("timeout_s", JUDGE_TIMEOUT_S))

    # -- scoring -----------------------------------------------------------------------------

    def score(self, text: str) -> tuple[float, tuple[str, ...]]:
        lines = text.count("\n") + 1 if text else 0
        matched = tuple(r.id for r in self.rules if r.matches(text, lines))
        return sum(r.score for r in self.rules if r.id in matched), matched

    def tier_of(self, score: float) -> str:
        if score >= self.cutoffs[1]:
            return "reasoning"
        return "standard" if score >= self.cutoffs[0] else "simple"

    def model_for(self, tier: str) -> str | None:
        """The tier's model; an undeclared tier borrows the nearest declared one, above first."""
        rank = TIERS.index(tier)
        for t in (*TIERS[rank:], *reversed(TIERS[:rank])):
            spec = self.tiers.get(t)
            if spec is not None and isinstance(spec.get("model"), str):
                return str(spec["model"])
        return None

    # -- deciding ----------------------------------------------------------------------------

    def route(
        self,
        text: str,
        *,
        session_dir: Path | None = None,
        state_root: Path | None = None,
        regenerate: bool = False,
        now: float | None = None,
        remember: bool = True,
        store: Store | None = None,
        session: str | None = None,
    ) -> RouteDecision:
        """Decide the tier of ``text`` for the session in ``session_dir`` (or ``session`` in
        ``store``) and remember it."""
        now = time.time() if now is None else now
        store, session = _where(store, session, session_dir, state_root)
        root = store
        score, matched = self.score(text)
        rules_tier = self.tier_of(score)
        rank = TIERS.index(rules_tier)
        reasons = [f"rules: score {score:g} -> {rules_tier}"]
        shift = self._misroute_shift(rules_tier, root, now)
        if shift:
            rank = _clamp(rank + shift)
            reasons.append(f"misroutes: {shift:+d} tier(s) -> {TIERS[rank]}")
        if self.judge_enabled and self.hooks is not None and self._ambiguous(score):
            rank = self._ask_judge(text, TIERS[rank], score, matched, rank, reasons)
        # What this message itself asks for: the only tier later decisions' momentum counts.
        own_tier = TIERS[rank]

        def decide(state: dict[str, Any]) -> RouteDecision:
            nonlocal rank
            decisions = [d for d in state.get("decisions", []) if isinstance(d, dict)]
            recent = [
                d
                for d in decisions[-self.momentum_turns :]
                if self.momentum_turns
                and isinstance(d.get("ts"), int | float)
                and 0 <= now - d["ts"] <= self.momentum_window_s
            ]
            floor = max((TIERS.index(t) for t in map(_own_tier, recent) if t in TIERS), default=0)
            if floor > rank:
                rank = floor
                reasons.append(f"momentum: recent turns were {TIERS[floor]}")
            if regenerate:
                regen_floor = TIERS.index(self.regen_min) if self.regen_min in TIERS else 1
                last = decisions[-1]["tier"] if decisions and decisions[-1].get("tier") in TIERS else None
                if self.regen_step_up and last is not None:
                    regen_floor = max(regen_floor, _clamp(TIERS.index(last) + 1))
                if regen_floor > rank:
                    rank = regen_floor
                    reasons.append(f"regeneration floor: {TIERS[rank]}")
            privacy = False
            if self.privacy_enabled and text:
                flagged = privacy_findings(text, self.pack, self.privacy_kinds)
                if flagged:
                    privacy = True
                    rank = self._privacy_rank(rank, flagged, reasons)
            decision = RouteDecision(
                TIERS[rank],
                self.model_for(TIERS[rank]),
                score,
                rules_tier,
                matched,
                tuple(reasons),
                privacy,
            )
            if remember:
                decisions.append(
                    {
                        "ts": now,
                        "tier": decision.tier,
                        "rules_tier": rules_tier,
                        "own_tier": own_tier,
                        "score": score,
                        "regenerate": regenerate,
                    }
                )
                state["decisions"] = decisions[-_MAX_DECISIONS:]
            return decision

        return _update_state(store, session, decide)

    def _ambiguous(self, score: float) -> bool:
        return any(abs(score - c) <= self.judge_band for c in self.cutoffs)

    def _ask_judge(
        self,
        text: str,
        tier: str,
        score: float,
        matched: tuple[str, ...],
        rank: int,
        reasons: list[str],
    ) -> int:
        kwargs = {"text": text, "tier": tier, "score": score, "reasons": list(matched)}
        try:
            answer = call_within(
                self.hooks.ctxrules_route_judge, kwargs, self.judge_timeout_s, name="ctxrules-route-judge"
            )
        except TimeoutError:
            reasons.append(f"judge gave no answer within {self.judge_timeout_s:g} s; kept {tier}")
            return rank
        except Exception as exc:  # a judge must never break routing
            reasons.append(f"judge failed ({type(exc).__name__}); kept {tier}")
            return rank
        if answer is None:
            return rank
        # What an LLM judge answers is the model's text: anything but a tier's name (another
        # type, whose comparison may raise; a reply of megabytes) is shown cut and ignored.
        named = str.__str__(answer) if isinstance(answer, str) else None
        if named not in TIERS:
            reasons.append(f"judge answered {_shown(answer)}, not a tier; kept {tier}")
            return rank
        if named != tier:
            reasons.append(f"judge: {named}")
        return TIERS.index(str(named))

    def _privacy_rank(self, rank: int, flagged: list[str], reasons: list[str]) -> int:
        safe = [TIERS.index(t) for t, spec in self.tiers.items() if spec.get("privacy_safe") is True]
        if rank in safe:
            reasons.append(f"privacy: flagged ({', '.join(flagged)}); {TIERS[rank]} is privacy-safe")
            return rank
        if not safe:
            reasons.append(f"privacy: flagged ({', '.join(flagged)}) but no tier is privacy_safe")
            return rank
        above = sorted(r for r in safe if r > rank)
        chosen = above[0] if above else max(safe)
        reasons.append(f"privacy: flagged ({', '.join(flagged)}) -> privacy-safe tier {TIERS[chosen]}")
        return chosen

    # -- misroutes ---------------------------------------------------------------------------

    def record_misroute(
        self,
        routed: str,
        wanted: str,
        *,
        rules_tier: str | None = None,
        session_dir: Path | None = None,
        state_root: Path | None = None,
        now: float | None = None,
        store: Store | None = None,
    ) -> None:
        """Note that a call routed to ``routed`` should have gone to ``wanted``.

        ``rules_tier`` is the tier the rules chose for it (the decision's ``rules_tier``;
        default ``routed``): later messages the rules put in that tier are shifted."""
        for t in (routed, wanted, rules_tier or routed):
            if t not in TIERS:
                raise UsageError(f"unknown tier {t!r}; one of: {', '.join(TIERS)}")
        if store is None:
            root = (
                state_root
                if state_root is not None
                else (session_dir.resolve().parent if session_dir is not None else None)
            )
            if root is None:
                raise UsageError("record_misroute needs state_root (or session_dir)")
            store = FilesystemStore(root)
        ts = time.time() if now is None else now
        record = {"ts": ts, "routed": routed, "wanted": wanted, "rules_tier": rules_tier or routed}
        store.append([Log("misroutes")], record)

    def _misroute_shift(self, rules_tier: str, root: Store, now: float) -> int:
        try:
            lines = root.read_log(Log("misroutes")).lines
        except (OSError, CtxrulesError):
            return 0
        total = 0.0
        for line in lines:
            try:
                rec = json.loads(line)
                ts, routed, wanted = float(rec["ts"]), rec["routed"], rec["wanted"]
            except (ValueError, TypeError, KeyError):
                continue
            if rec.get("rules_tier", routed) != rules_tier or routed not in TIERS or wanted not in TIERS:
                continue
            age = now - ts
            if age < 0 or age >= self.decay_s:
                continue
            total += (1.0 - age / self.decay_s) * (TIERS.index(wanted) - TIERS.index(routed))
        if abs(total) < self.threshold:
            return 0
        return int(math.copysign(max(1, math.floor(abs(total) + 0.5)), total))


def _own_tier(decision: Mapping[str, Any]) -> Any:
    """The tier a remembered decision's own message asked for (rules, misroutes, judge); a record
    written before ``own_tier`` existed counts its rules' tier."""
    return decision.get("own_tier", decision.get("rules_tier"))


def _clamp(rank: int) -> int:
    return max(0, min(len(TIERS) - 1, rank))


def _where(
    store: Store | None, session: str | None, session_dir: Path | None, state_root: Path | None
) -> tuple[Store, str]:
    if store is not None:
        if session is None:
            raise UsageError("route(store=...) needs session=")
        return store, session
    if session_dir is None:
        raise UsageError("route() needs session_dir (or store= and session=)")
    return FilesystemStore(state_root if state_root is not None else session_dir.resolve().parent), str(session_dir)


def _update_state(store: Store, session: str, decide: Callable[[dict[str, Any]], RouteDecision]) -> RouteDecision:
    """``decide(state)`` under the router document's lock (one decision at a time); the state is
    written back when ``decide`` changed it."""
    out: list[RouteDecision] = []

    def update(raw: bytes | None) -> bytes | None:
        try:
            loaded = json.loads(raw) if raw is not None else {}
        except (ValueError, RecursionError):  # damaged (or nested past the stack): start afresh
            loaded = {}
        state = loaded if isinstance(loaded, dict) else {}
        before = json.dumps(state, sort_keys=True)
        out.append(decide(state))
        after = json.dumps(state, sort_keys=True)
        return after.encode("utf-8") if after != before else None

    store.update_doc(session, "router", update)
    return out[0]


def _shown(value: object, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters (a repr that fails: the type's name)."""
    try:
        text = repr(value)
    except Exception:  # an object from a plugin: its repr is not ours to trust
        return f"<{type(value).__name__}>"
    if len(text) <= limit:
        return text
    size = f" ({len(value)} characters)" if isinstance(value, str) else ""
    return f"{text[:limit]}…{size}"


def route_for_session(session: Any, text: Any, *, regenerate: bool = False, now: float | None = None) -> RouteDecision:
    """``Session.route``: route ``text`` (a string, or a message list whose latest real user
    message is routed) with the session's pack, plugin hooks, directory and state root."""
    if isinstance(text, list):
        users = [m for m in text if isinstance(m, dict) and is_real_user(m)]
        text = message_text(users[-1]) if users else ""
    if not isinstance(text, str):
        raise UsageError(f"route() takes a string or a message list, not {type(text).__name__}")
    router = ComplexityRouter(session.engine.pack.data, hooks=session.engine.registry.hooks)
    return router.route(text, store=session.store, session=session.key, regenerate=regenerate, now=now)
