"""Helpers for the tests of priorities, intent, the compress stages, notes and reread.

Builds a real :class:`StageContext` (token counter, budget, vault, the resolved
``builtin:default`` pack) so stages can be driven directly; conversation builders; and an
independent reader of markers that puts elided text back (written without the stages' code,
so a bug there cannot hide itself).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import structlog

from ctxrules.messages import injected_kind
from ctxrules.models import lookup_model
from ctxrules.pipeline.budget import DEFAULT_THRESHOLDS, Budget
from ctxrules.pipeline.context import StageContext
from ctxrules.tokens import TokenCounter
from ctxrules.vault import Vault

Msg = dict[str, Any]

MARKER = re.compile(r"\[ctxrules:elided [^\]\n]*\]")
_REF = re.compile(r"ref=vault://([0-9a-f]{64})(?:#L(\d+)-L(\d+))?")
_KIND = re.compile(r"kind=([a-z]+)")


@cache
def _default_pack_json() -> str:
    from ctxrules import Engine

    return json.dumps(Engine.load("builtin:default").pack.data)


def default_pack() -> dict[str, Any]:
    """The resolved ``builtin:default`` as plain data (a fresh copy)."""
    return json.loads(_default_pack_json())  # type: ignore[no-any-return]


def make_ctx(
    tmp_path: Path,
    *,
    window: int = 32_000,
    pack: dict[str, Any] | None = None,
    state: dict[str, Any] | None = None,
    protected: Iterable[int] = (),
    target: str = "monitor",
    compactions: tuple[str, ...] = (),
    tail_budget: float = 0.20,
    model: str = "gpt-4o",
    tools: list[Any] | None = None,
    session: str = "session",
) -> StageContext:
    info = lookup_model(model, window=window)
    counter = TokenCounter.for_model(info)
    budget = Budget(window=window, reserve_output=8192, thresholds=dict(DEFAULT_THRESHOLDS), tail_budget=tail_budget)
    return StageContext(
        stage_id="test",
        model=info,
        counter=counter,
        budget=budget,
        vault=Vault.for_session(tmp_path / session),
        tools=tools or [],
        pack=default_pack() if pack is None else pack,
        log=structlog.get_logger(),
        state={} if state is None else state,
        protected=set(protected),
        target=target,
        compactions=compactions,
    )


# --- builders ---------------------------------------------------------------------------------


def call(cid: str, name: str = "Bash", **arguments: Any) -> Msg:
    return {
        "id": cid,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments or {"command": "ls"})},
    }


def step(cid: str, output: str, name: str = "Bash", text: str | None = None, **arguments: Any) -> list[Msg]:
    """An assistant message with one call and its result."""
    return [
        {"role": "assistant", "content": text, "tool_calls": [call(cid, name, **arguments)]},
        {"role": "tool", "tool_call_id": cid, "content": output},
    ]


def user(text: str = "go on") -> Msg:
    return {"role": "user", "content": text}


def system(text: str = "You are a careful coding agent.") -> Msg:
    return {"role": "system", "content": text}


def filler(lines: int, seed: str = "x") -> str:
    """Distinct, realistic-looking lines (about 12 tokens each): no two seeds share a line."""
    return "".join(f"{seed}: line {i:05d} of the output, value={(i * 7919) % 10007} ok\n" for i in range(lines))


def conversation(n_steps: int, lines: int = 60, *, ask: str = "Fix the failing build.") -> list[Msg]:
    """system, one real user message, then ``n_steps`` Bash steps with distinct outputs."""
    out: list[Msg] = [system(), user(ask)]
    for n in range(n_steps):
        out += step(f"call_{n}", filler(lines, f"s{n}"), command=f"cmd {n}")
    return out


# --- independent checks -------------------------------------------------------------------------


def restore(text: str, vault: Vault) -> str:
    """``text`` with every line-range marker replaced by the vault lines it points at.

    The writer puts a "\n" after a range marker exactly when the elided lines end with one,
    so that "\n" goes together with the marker."""
    out, pos = [], 0
    for match in MARKER.finditer(text):
        ref = _REF.search(match.group(0))
        if ref is None or ref.group(2) is None:
            continue
        lines = vault.get_lines(ref.group(1), int(ref.group(2)), int(ref.group(3)))
        elided = lines.decode("utf-8", "surrogatepass")
        out.append(text[pos : match.start()])
        out.append(elided)
        pos = match.end()
        if elided.endswith("\n") and text[pos : pos + 1] == "\n":
            pos += 1
    out.append(text[pos:])
    return "".join(out)


def refs(text: str) -> list[str]:
    """Vault ids of every marker in ``text``."""
    return [ref.group(1) for m in MARKER.finditer(text) if (ref := _REF.search(m.group(0)))]


def recovers(original: str, shortened: str, vault: Vault, depth: int = 0) -> bool:
    """Whether ``original`` comes back byte-identical from ``shortened`` and the vault: by
    putting the elided line ranges back, or through a marker that points at a vault entry
    holding the whole original (dedup, character cuts, filters that also reshape what they
    keep). Stages compose — a cut of a filtered output points at the filtered text, whose own
    marker points at the original — so this follows markers a few levels deep."""
    if original == shortened:
        return True
    if depth > 4:
        return False
    restored = restore(shortened, vault)
    if restored != shortened and recovers(original, restored, vault, depth + 1):
        return True
    for vid in refs(shortened):
        stored = vault.get(vid).decode("utf-8", "surrogatepass")
        if stored == original or (
            stored != shortened and MARKER.search(stored) and recovers(original, stored, vault, depth + 1)
        ):
            return True
    return False


def expand(messages: list[Msg], vault: Vault) -> list[Msg]:
    """Messages with every removed-steps placeholder replaced by the messages it stands for."""
    out: list[Msg] = []
    for msg in messages:
        text = msg.get("content") if isinstance(msg.get("content"), str) else ""
        if injected_kind(msg) == "removed":
            kinds = [_KIND.search(m.group(0)) for m in MARKER.finditer(text)]
            refs = [_REF.search(m.group(0)) for m in MARKER.finditer(text)]
            for kind, ref in zip(kinds, refs, strict=True):
                if kind and kind.group(1) == "message" and ref:
                    out.extend(expand(json.loads(vault.get(ref.group(1))), vault))
            continue
        out.append(msg)
    return out


def text_of(msg: Msg) -> str:
    content = msg.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def clone(messages: list[Msg]) -> list[Msg]:
    return copy.deepcopy(messages)
