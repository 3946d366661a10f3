"""Many turns of one session: a history edited in place between calls, then the session picked
up by another process, must never be answered with the output of the history before the edit."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import random
import re
from pathlib import Path
from typing import Any

import pytest
from invariants import MARKER, id_problems, markers_resolve, pairing_problems, text_of

from ctxrules import Engine
from ctxrules.formats import anthropic as anthropic_format


def _history() -> list[dict[str, Any]]:
    call = {"id": "c1", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "OLD"}'}}
    return [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "Fix the bug."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        {"role": "assistant", "content": "Done: OLD"},
    ]


def _edit_arguments(history: list[dict[str, Any]]) -> None:
    history[2]["tool_calls"][0]["function"]["arguments"] = '{"command": "NEW"}'


def _edit_content(history: list[dict[str, Any]]) -> None:
    history[4]["content"] = "Done: NEW"


@pytest.mark.parametrize("edit", [_edit_arguments, _edit_content])
def test_an_edit_in_place_is_what_the_next_process_reuses(tmp_path: Path, edit: Any) -> None:
    # The output shares unchanged messages with the caller; the store appended to
    # last_output.jsonl when the new output held the same objects as the one it wrote, so an
    # object edited in place kept its old line, and the next process reused the stale output.
    engine = Engine.load("builtin:default")
    session = engine.session(tmp_path / "s", model="gpt-4o", window=16000)
    history = _history()
    session.prepare(history)
    edit(history)
    expected = copy.deepcopy(history)
    assert session.prepare(history).messages == expected
    again = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o", window=16000)
    result = again.prepare(history)
    assert result.messages == expected
    assert result.report["reused_messages"] == len(history)


# --- a seeded driver: what agents do between calls, with the reuse checked after each call ---

TAG = re.compile(r"Zt(\d+)Z")  # each text carries a unique tag, so stale or lost text shows
_FALLBACK = ["ok", "src/app.py:3: E501 line too long\n" * 40, "Traceback (most recent call last):\nValueError"]


def _corpus_texts() -> list[str]:
    root = os.environ.get("CTXRULES_CORPUS")
    texts: list[str] = []
    for path in sorted(Path(root, "transcripts").glob("*.json"))[:6] if root else []:
        data = json.loads(path.read_text(encoding="utf-8"))
        messages = data.get("messages", []) if isinstance(data, dict) else data
        texts += [m["content"] for m in messages if isinstance(m, dict) and isinstance(m.get("content"), str)]
    return [t for t in texts if t] or _FALLBACK


def _all_text(m: dict[str, Any]) -> str:
    calls = m.get("tool_calls") or []
    return text_of(m) + "".join((c.get("function") or {}).get("arguments") or "" for c in calls)


def _tags(messages: list[dict[str, Any]], vault: Any, *, whole_vault: bool = False) -> set[str]:
    """Tags in the messages' text and in the vault items their markers name (or all items)."""
    texts = [_all_text(m) for m in messages]
    ids = set(vault.list_ids()) if whole_vault else {x.group(1) for t in texts for x in MARKER.finditer(t)}
    for vid in ids:
        with contextlib.suppress(Exception):  # media, or gone (markers_resolve reports that)
            texts.append(vault.get(vid).decode("utf-8", "replace"))
    return {tag for t in texts for tag in TAG.findall(t)}


def _common(a: list[Any], b: list[Any] | None) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b or [], strict=False)) if x != y), min(len(a), len(b or [])))


class _Agent:
    """One session's caller: its history, and the steps it takes between two calls."""

    STEPS = ("tools",) * 4 + ("user", "edit", "edit_args", "replace", "rewind", "fresh", "output", "switch", "reopen")

    def __init__(self, seed: int, root: Path, texts: list[str]) -> None:
        self.rng, self.root, self.texts, self.n = random.Random(seed), root, texts, 0
        self.window = self.rng.choice([12000, 16000])
        self.anthropic = self.rng.random() < 0.25
        self.session = self._open()
        self.history: list[dict[str, Any]] = [
            {"role": "system", "content": f"{self._tag()} You are an agent."},
            {"role": "user", "content": f"{self._tag()} Fix the bug."},
        ]
        self.last: tuple[list[Any], list[Any]] | None = None  # (history, output) of the last call, as JSON
        self.output: list[dict[str, Any]] = []
        self.steps: list[str] = []

    def _open(self) -> Any:
        return Engine.load("builtin:default").session(self.root / "s", model="gpt-4o", window=self.window)

    def _tag(self) -> str:
        self.n += 1
        return f"Zt{self.n}Z"

    def _text(self) -> str:
        text = self.rng.choice(self.texts)
        while self.rng.random() < 0.15 and len(text) < 20000:  # now and then an output that spills
            text += "\n" + self.rng.choice(self.texts)
        return f"{self._tag()} {text[: self.rng.choice([60, 600, 4000, 40000])]}"

    def step(self) -> None:
        rng, h = self.rng, self.history
        kind = rng.choice(self.STEPS)
        self.steps.append(kind)
        if kind == "tools":  # an assistant step with parallel calls, and their results
            calls = []
            for _ in range(rng.choice([1, 1, 2, 3])):
                args = json.dumps({"command": self._tag()})
                calls.append({"id": f"c{self.n}", "type": "function", "function": {"name": "Bash", "arguments": args}})
            h.append(
                {"role": "assistant", "content": rng.choice([None, f"{self._tag()} working"]), "tool_calls": calls}
            )
            h.extend({"role": "tool", "tool_call_id": c["id"], "content": self._text()} for c in calls)
        elif kind == "user":
            h.append({"role": "user", "content": self._text()})
        elif kind == "edit":  # the same dict, its content changed
            rng.choice([m for m in h if isinstance(m.get("content"), str)])["content"] = self._text()
        elif kind == "edit_args" and any(m.get("tool_calls") for m in h):
            call = rng.choice([c for m in h for c in m.get("tool_calls") or []])
            call["function"]["arguments"] = json.dumps({"command": self._tag()})
        elif kind == "replace":  # an equal-looking new object
            i = rng.randrange(len(h))
            h[i] = copy.deepcopy(h[i])
        elif kind == "rewind" and len(h) > 3:
            del h[-rng.randint(1, min(5, len(h) - 2)) :]
        elif kind == "fresh":  # JSON decoded per call, as a proxy does
            self.history = json.loads(json.dumps(h))
        elif kind == "output" and not self.anthropic:  # a caller that keeps what it got back
            self.history = [*self.output, {"role": "user", "content": self._text()}]
        elif kind == "switch":
            self.session.switch(model=rng.choice(["gpt-4o", "gpt-4o-mini"]), window=rng.choice([12000, 16000]))
        elif kind == "reopen":  # another process continues the session
            self.session = self._open()

    def call(self) -> list[str]:
        h, vault = self.history, self.session.vault
        frozen = copy.deepcopy(h)
        if self.anthropic:
            body = anthropic_format.encode(h, None, {"model": "claude-sonnet-4", "max_tokens": 100})
            result = self.session.prepare(body, format="anthropic")
        else:
            result = self.session.prepare(h)
        out = self.output = result.messages
        problems = pairing_problems(out) + id_problems(out) + markers_resolve(out, vault)
        if h != frozen:
            problems.append("the caller's messages were changed")
        current, got = _tags(h, vault), _tags(out, vault)
        if got - current:  # an edited text, or a dropped message, came back
            problems.append(f"stale text in the output: tags {sorted(got - current)}")
        if current - got - _tags([], vault, whole_vault=True):
            problems.append(f"text lost: tags {sorted(current - got)}")
        if not self.anthropic:
            now, reused = json.loads(json.dumps(h)), result.report["reused_messages"]
            before, output = self.last or ([], [])
            bound = max(_common(now, before), _common(now, output))
            if reused > bound:
                problems.append(f"reused_messages {reused}, but only {bound} messages match")
            self.last = (now, json.loads(json.dumps(out)))
        return problems


@pytest.mark.parametrize("seed", range(8))
def test_many_turns_never_answer_with_a_stale_output(tmp_path: Path, seed: int) -> None:
    agent = _Agent(seed, tmp_path, _TEXTS)
    assert agent.call() == []
    for _ in range(20):
        agent.step()
        assert agent.call() == [], f"seed {seed}, steps {agent.steps}"


_TEXTS = _corpus_texts()


def test_a_repaired_message_edited_in_place_is_not_answered_with_its_old_repair(tmp_path: Path) -> None:
    # A message with a lone surrogate is repaired (a copy with U+FFFD); the next turn put that
    # copy back for the same object so the history still extended the last one, even when the
    # caller had edited the object in place since: the old text came back, reused as a prefix.
    session = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o", window=16000)
    history = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "bad \ud800 text"},
        {"role": "user", "content": "next"},
    ]
    session.prepare(history)
    history[1]["content"] = "fixed text"
    history += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
    result = session.prepare(history)
    assert result.messages == history
    assert result.report["reused_messages"] == 0  # the history no longer extends the last one


def test_a_repaired_message_left_as_it_was_still_extends_the_last_history(tmp_path: Path) -> None:
    session = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o", window=16000)
    history = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "bad \ud800 text"}]
    first = session.prepare(history)
    history.append({"role": "user", "content": "more"})
    result = session.prepare(history)
    assert result.messages == [*first.messages, history[-1]]
    assert result.report["reused_messages"] == 2
