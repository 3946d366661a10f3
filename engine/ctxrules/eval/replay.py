"""Replay one transcript under one plan (a pack, or a baseline), call by call.

Before every assistant message of the transcript, the history up to it is what the agent would
have sent; a pack's plan passes it through ``prepare`` of one session kept for the whole
transcript (a fresh temporary directory), exactly as an agent that calls ctxrules before each
model call. The ``none`` baseline sends the history as it is; ``trim`` passes it through
``litellm.utils.trim_messages``. Each call is then accounted: prompt tokens, the provider's
cache (:mod:`ctxrules.eval.caching`), USD, the retention probes and the invariants.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from ctxrules.eval.caching import BlockChain, cache_model_for
from ctxrules.eval.checks import Pairing, Pins
from ctxrules.eval.engines import engine_for
from ctxrules.eval.judge import JUDGE_TIMEOUT_S, ask, grade, judge_request, parse_answers
from ctxrules.eval.probes import ContextTexts, ProbeExtractor, check_probes, context_text, lost_all
from ctxrules.eval.scratch import session_folder
from ctxrules.eval.shared import shared_prefix
from ctxrules.injected import KEY_FILE
from ctxrules.models import ModelInfo, lookup_model
from ctxrules.packs.validated import load_pack
from ctxrules.pipeline.budget import DEFAULT_RESERVE
from ctxrules.structure import pinned_indices
from ctxrules.tokens import TokenCounter, trusted_objects
from ctxrules.toolroles import tool_roles

__all__ = ["STEP_S", "CallRecord", "Plan", "Task", "TaskResult", "replay", "step_clock_fits"]

STEP_S = 20.0
"""Seconds between two calls when the transcript's messages carry no timestamps."""
_TIME_KEYS = ("timestamp", "created_at", "time")
_EPOCH = 1_700_000_000.0  # the replay clock's start (a fixed date: runs are reproducible)
_LAST_EPOCH = 253402300799  # 9999-12-31T23:59:59Z: a later timestamp is damage, not a time

Message = dict[str, Any]
Progress = Callable[[str, str, int, int], None]


@dataclass(frozen=True)
class Plan:
    """What a call goes through: ``kind`` ``pack`` (``ref`` a pack path or ``builtin:NAME``),
    ``none`` or ``trim``."""

    name: str
    kind: str
    ref: str | None = None

    @property
    def baseline(self) -> bool:
        return self.kind != "pack"


@dataclass(frozen=True)
class Task:
    transcript: str  # display name
    path: str
    messages: tuple[Message, ...]
    tools: tuple[Message, ...]
    plan: Plan
    model: str
    window: int | None
    step_s: float = STEP_S
    judge: str | None = None
    judge_api_base: str | None = None
    judge_timeout_s: float = JUDGE_TIMEOUT_S


@dataclass
class CallRecord:
    turn: int
    index: int
    prompt: int
    read: int
    write: int
    usd: float
    fits: bool
    ms: float
    compacted: bool
    cache_break: str | None
    retention: dict[str, dict[str, int]]
    violations: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass
class TaskResult:
    transcript: str
    plan: str
    baseline: bool
    calls: list[CallRecord]
    usable: int
    error: str | None = None
    judge: dict[str, dict[str, int]] | None = None
    judge_error: str | None = None


def _clock(messages: Sequence[Mapping[str, Any]], index: int, turn: int, step_s: float) -> float:
    for key in _TIME_KEYS:
        value = messages[index].get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            if 0 <= value <= _LAST_EPOCH:  # not NaN, not a time no clock shows
                return float(value)
            continue
        if isinstance(value, str):
            try:
                stamp = datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except (ValueError, OverflowError):
                continue
            if 0 <= stamp <= _LAST_EPOCH:  # "0001-01-01" parses, to a time before 1970
                return stamp
    return _EPOCH + turn * step_s


def step_clock_fits(turns: int, step_s: float) -> bool:
    """Whether the step clock of the last of ``turns`` calls is still a time a clock shows:
    ``--step-s 1e308`` made it infinite on the third call, which ``prepare`` refused, and the
    run ended in exit 1 as if an invariant had broken."""
    return _EPOCH + max(0, turns - 1) * step_s <= _LAST_EPOCH


def _usd(info: ModelInfo, uncached: int, read: int, write: int) -> float:
    rate = info.input_cost_per_token or 0.0
    read_rate = info.cache_read_input_token_cost
    write_rate = info.cache_creation_input_token_cost
    return (
        uncached * rate
        + read * (rate if read_rate is None else read_rate)
        + write * (rate if write_rate is None else write_rate)
    )


def _fetcher(read: Callable[[str], bytes]) -> Callable[[str], str | None]:
    memo: dict[str, str | None] = {}

    def fetch(vault_id: str) -> str | None:
        if vault_id not in memo:
            try:
                text = read(vault_id).decode("utf-8", "replace")
            except Exception:  # a marker whose item cannot be read recovers nothing
                memo[vault_id] = None
                return None
            # A span of messages is stored as their JSON list: read it as the model would.
            if text.startswith("["):
                try:
                    value = json.loads(text)
                except (ValueError, RecursionError):
                    value = None
                if isinstance(value, list) and all(isinstance(m, dict) for m in value):
                    text = context_text(value)
            memo[vault_id] = text
        return memo[vault_id]

    return fetch


def _default_roles() -> Any:
    return tool_roles(load_pack("builtin:default").data)


def replay(task: Task, progress: Progress | None = None) -> TaskResult:
    """Replay ``task``; never raises for a failing call (it is recorded as a violation)."""
    info = lookup_model(task.model, window=task.window)
    counter = TokenCounter.for_model(info)
    messages = list(task.messages)
    tools = list(task.tools)
    turns = [i for i, m in enumerate(messages) if m.get("role") == "assistant" and i > 0]
    extractor = ProbeExtractor(messages, _default_roles())
    pins = Pins(messages)
    pairing = Pairing()
    cache = cache_model_for(info.family, baseline=task.plan.baseline)
    tool_tokens = counter.count_tools(tools) if tools else 0
    history_counts = counter.count_each(messages)
    with session_folder() as tmp:
        runner = _runner(task, tmp)
        chain = BlockChain()
        texts = ContextTexts()
        usable = runner.usable
        records: list[CallRecord] = []
        judged: tuple[dict[str, dict[str, int]] | None, str | None] = (None, None)
        last_out: list[Message] = []
        last_counts: list[int] = []
        for turn, index in enumerate(turns):
            history = messages[:index]
            clock = _clock(messages, index, turn, task.step_s)
            started = time.perf_counter()
            try:
                out, out_tools, report = runner.call(history, tools, clock)
            except Exception as exc:  # a bug in ctxrules or the baseline: recorded, replay stops
                return TaskResult(
                    task.transcript,
                    task.plan.name,
                    task.plan.baseline,
                    records,
                    usable,
                    f"call {turn} (message {index}): {type(exc).__name__}: {exc}",
                )
            ms = (time.perf_counter() - started) * 1000
            if out is history:
                counts = history_counts[:index]
            else:
                # Counted by object (a replay never edits a message in place): the prefix this
                # output shares with the last one has the last one's counts, and only what
                # follows is looked up (each of N calls looking up its whole output was N²/4).
                same = shared_prefix(last_out, out)
                with trusted_objects():
                    counts = last_counts[:same] + counter.count_each(out[same:])
                last_out, last_counts = out, counts
            out_tool_tokens = (
                tool_tokens if out_tools is tools else (counter.count_tools(out_tools) if out_tools else 0)
            )
            blocks = chain.blocks(out, counts, out_tools, out_tool_tokens)
            use = cache.request(blocks, clock)
            fits = use.prompt <= usable
            probes = extractor.probes(index)
            # A request over the window is refused: the model sees none of it.
            retention = (check_probes(probes, texts(out), runner.fetch) if fits else lost_all(probes)).as_dict()
            violations: list[str] = []
            if not task.plan.baseline:
                violations += pairing(out) + pins.problems(index, out)
                if not fits:
                    pinned = sum(history_counts[i] for i in pinned_indices(history)) + tool_tokens
                    if pinned <= usable:
                        violations.append(
                            f"does not fit ({use.prompt} > {usable} tokens) although "
                            f"the pinned messages alone do ({pinned})"
                        )
            records.append(
                CallRecord(
                    turn=turn,
                    index=index,
                    prompt=use.prompt,
                    read=use.read,
                    write=use.write,
                    usd=_usd(info, use.uncached, use.read, use.write) if fits else 0.0,
                    fits=fits,
                    ms=round(ms, 3),
                    compacted=_compacted(report),
                    cache_break=_cache_break(report),
                    retention=retention,
                    violations=violations,
                )
            )
            if progress is not None:
                progress(task.transcript, task.plan.name, turn + 1, len(turns))
            if task.judge and turn == len(turns) - 1:
                judged = _judge(task, out if fits else [], probes)
    result = TaskResult(task.transcript, task.plan.name, task.plan.baseline, records, usable)
    if task.judge and turns:
        result.judge, result.judge_error = judged
    return result


def _judge(
    task: Task, context: list[Message], probes: list[Any]
) -> tuple[dict[str, dict[str, int]] | None, str | None]:
    categories = list(dict.fromkeys(p.category for p in probes))
    if not categories:
        return None, None
    if not context:  # the last call did not fit: the model would have seen nothing
        return grade(probes, {}), None
    try:
        text = ask(
            str(task.judge),
            judge_request(context, categories),
            api_base=task.judge_api_base,
            timeout_s=task.judge_timeout_s,
        )
    except Exception as exc:  # a failing judge leaves the offline figures as they are
        return None, f"{type(exc).__name__}: {str(exc)[:300]}"
    return grade(probes, parse_answers(text)), None


def _compacted(report: Mapping[str, Any] | None) -> bool:
    if not report:
        return False
    return any(
        s.get("ran") and s.get("tokens_saved", 0) > 0 and str(s.get("type", "")).startswith(("compress.", "summarize."))
        for s in report.get("stages") or []
    )


def _cache_break(report: Mapping[str, Any] | None) -> str | None:
    if not report:
        return None
    for stage in report.get("stages") or []:
        for action in stage.get("actions") or []:
            if action.get("kind") == "cache_break":
                return str(action.get("detail"))
    return None


class _Runner:
    usable: int

    def call(
        self, history: list[Message], tools: list[Message], clock: float
    ) -> tuple[list[Message], list[Message], dict[str, Any] | None]:
        raise NotImplementedError  # pragma: no cover

    def fetch(self, vault_id: str) -> str | None:
        return None


class _PackRunner(_Runner):
    def __init__(self, task: Task, tmp: Path) -> None:
        # A fixed key for the signatures of injected tags: a new session makes a random one,
        # and a tag's signature tokenizes to a slightly different count with each key, so two
        # replays of the same transcript gave figures a few tokens apart (a pack compared with
        # another by eval must differ by what the packs do, not by chance).
        folder = tmp / "session"
        folder.mkdir(mode=0o700)
        key = folder / KEY_FILE
        key.write_text(hashlib.sha256(b"ctxrules eval replay").hexdigest() + "\n", encoding="ascii")
        key.chmod(0o600)
        self.session = engine_for(str(task.plan.ref)).session(
            tmp / "session", model=task.model, window=task.window, private=True
        )
        self.usable = self.session.budget.usable
        self._fetch = _fetcher(self.session.vault.get)

    def call(
        self, history: list[Message], tools: list[Message], clock: float
    ) -> tuple[list[Message], list[Message], dict[str, Any] | None]:
        result = self.session.prepare(history, tools=tools or None, clock=clock)
        return list(result.messages), list(result.tools or []), result.report

    def fetch(self, vault_id: str) -> str | None:
        return self._fetch(vault_id)


class _BaselineRunner(_Runner):
    def __init__(self, task: Task) -> None:
        info = lookup_model(task.model, window=task.window)
        window = task.window or info.window
        if window is None:
            raise ValueError(f"no window known for {task.model}: pass --window")
        # The usable window of a pack that keeps the default reply reserve.
        self.usable = max(1, window - DEFAULT_RESERVE)
        self.kind = task.plan.kind
        self.model = task.model

    def call(
        self, history: list[Message], tools: list[Message], clock: float
    ) -> tuple[list[Message], list[Message], dict[str, Any] | None]:
        if self.kind == "none":
            return history, tools, None
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        import litellm

        trimmed = litellm.utils.trim_messages([dict(m) for m in history], model=self.model, max_tokens=self.usable)
        return list(trimmed), tools, None


def _runner(task: Task, tmp: Path) -> _Runner:
    if task.plan.kind == "pack":
        return _PackRunner(task, tmp)
    return _BaselineRunner(task)
