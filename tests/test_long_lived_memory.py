"""One process serving one session for thousands of turns (an agent loop, a proxy): what the
session and the stages remember per message or per text must let go of what no history can
reach any more, or memory grows with every turn. The caller's history is decoded from JSON on
each call, as a proxy does (new objects every turn); its messages are a dict subclass here so
that a weak reference tells whether anything still holds them."""

from __future__ import annotations

import contextlib
import gc
import json
import tracemalloc
import weakref
from pathlib import Path
from typing import Any

import pytest

from ctxrules import Engine
from ctxrules.stages.compress_dedup import normalized_digest
from ctxrules.stages.compress_intent import extract_terms


class _Msg(dict[str, Any]):
    """A message that can be referenced weakly (a plain dict cannot)."""


def _decoded(text: str) -> list[dict[str, Any]]:
    return json.loads(text, object_hook=_Msg)  # type: ignore[no-any-return]


def _alive(refs: list[weakref.ref[_Msg]]) -> int:
    gc.collect()
    return sum(ref() is not None for ref in refs)


def test_repairs_of_messages_no_history_holds_are_not_kept_for_the_sessions_life(tmp_path: Path) -> None:
    """Each turn repairs the lone surrogate of the caller's new object again; the session kept
    that object, its repaired copy and a copy of the original for every turn until it ended
    (three copies of a large tool output per turn). Only the last turn's are kept now, and a
    caller that keeps its objects still has its repaired messages reused."""
    session = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o", window=120_000)
    text = json.dumps([{"role": "user", "content": "go"}, {"role": "assistant", "content": "bad \ud800 text"}])
    refs = []
    for turn in range(12):
        history = _decoded(text)
        refs.append(weakref.ref(history[1]))
        assert "lone surrogate" in session.prepare(history).report["warnings"][0]  # repaired again
        text = json.dumps([*history, {"role": "user", "content": f"turn {turn}"}])
    del history
    assert _alive(refs) <= 1
    # The same objects again and again: the repaired copy stands in for them, every turn reuses.
    history = _decoded(text)
    session.prepare(history)
    for turn in range(5):
        before = len(history)
        history.append({"role": "user", "content": f"kept {turn}"})
        assert session.prepare(history).report["reused_messages"] == before


def test_the_intent_memos_let_go_of_the_messages_of_cold_turns(tmp_path: Path) -> None:
    """A caller that keeps only its last few messages (a sliding window) sends a history that
    never extends the last one: every turn is cold, which makes compress.intent's per-message
    memos stale; they still held each turn's latest ask, 4,096 of them before they emptied."""
    session = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o", window=120_000)
    refs = []
    for turn in range(12):
        window = [{"role": "user", "content": f"start {turn}"}, {"role": "user", "content": f"fix app{turn}.py"}]
        history = _decoded(json.dumps(window))
        refs.append(weakref.ref(history[1]))
        session.prepare(history)
    del history
    assert _alive(refs) <= 2


def test_texts_remembered_by_the_stages_are_not_held_whole() -> None:
    """compress.intent's terms and compress.dedup's digests are remembered per text (a history
    decoded per call brings new string objects): keyed by the text, the memos held 256 and
    4,096 whole texts, tool outputs of megabytes among them. A long text is now held as its
    digest; the answers are the same."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(60):
            text = f"see src/mod{n}.py\n" + "line of output\n" * 10_000  # 150 kB, made anew
            assert extract_terms(text) == ([f"src/mod{n}.py"], [])
            assert extract_terms(text) == ([f"src/mod{n}.py"], [])  # remembered
            assert normalized_digest(text) == normalized_digest(text.replace("line", "line", 1))
        del text
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 1_000_000, held  # kept whole: 40 x 150 kB x 2 memos, 12 MB


@pytest.mark.parametrize("trusted", [False, True])
def test_the_token_memos_keep_a_bounded_amount_of_text(monkeypatch: pytest.MonkeyPatch, trusted: bool) -> None:
    """A token counter lives as long as the process and remembered every message it counted,
    200,000 of them before it emptied: every tool output of days of work. Past MEMO_CHARS
    characters of text its memos empty (1 MB here; 32 Mi characters by default); a message
    counted again meanwhile is still taken from them."""
    from ctxrules import tokens

    monkeypatch.setattr(tokens, "MEMO_CHARS", 1_000_000, raising=False)
    counter = tokens.TokenCounter("o200k_base")
    held = 0
    tracemalloc.start()
    try:
        for n in range(60):
            # trusted: each message counted in a scope of its own, as each prepare has one
            with tokens.trusted_objects() if trusted else contextlib.nullcontext():
                message = {"role": "tool", "tool_call_id": f"c{n}", "content": f"output {n} " + "word " * 20_000}
                first = counter.count_each([message])
                misses = counter.memo_misses
                assert counter.count_each([dict(message)]) == first  # a new object: the key memo
                assert counter.count_message(message) == first[0]
                assert counter.memo_misses == misses
            if n == 4:
                held = tracemalloc.get_traced_memory()[0]
        del message
        with tokens.trusted_objects() if trusted else contextlib.nullcontext():
            pass  # the next prepare's scope empties what the last one left past the limit
        held = tracemalloc.get_traced_memory()[0] - held
    finally:
        tracemalloc.stop()
    assert held < 2_500_000, held  # kept before: 55 x 100 kB (5.5 MB)


def test_a_history_past_the_memo_limit_is_counted_once_in_its_prepare(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Inside one prepare the memos keep what they hold past MEMO_CHARS and empty at the next:
    emptied halfway, every later stage of the same call counted the whole history again (a
    36-million-character history took twice as long). Counted, not timed: the same texts are
    tokenized as with no limit at all."""
    from ctxrules import Engine, tokens

    words = " ".join(f"w{i}" for i in range(3000))
    history = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"{i} {words[i:]} " * 8} for i in range(60)
    ]  # some 1.4 million characters
    engine = Engine.load("builtin:default")

    def tokenized(limit: int) -> tuple[int, int]:
        monkeypatch.setattr(tokens, "MEMO_CHARS", limit)
        session = engine.session(tmp_path / f"s{limit}", model="gpt-4o", window=32_000)
        session.counter.clear_memo()
        before = session.counter.texts_tokenized
        session.prepare(history)
        during = session.counter.texts_tokenized - before
        with tokens.trusted_objects():  # the next prepare's scope
            left = session.counter._chars
        return during, left

    unlimited, _ = tokenized(1 << 40)
    limited, left = tokenized(200_000)
    assert limited == unlimited, (limited, unlimited)
    assert left == 0  # and the memos were emptied when the next scope began


def test_the_per_message_memos_keep_a_bounded_amount_of_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """compress.intent and compress.dedup remember what a message's text gives per message
    object, holding the message: messages a compaction replaced are held by nobody else, and
    4,096 of them may be large tool outputs. Past TEXT_CHARS characters of content the memo
    empties; a message asked again meanwhile is still answered from it."""
    from ctxrules import message_memo

    monkeypatch.setattr(message_memo, "TEXT_CHARS", 3_000_000)
    memo: message_memo.MessageMemo[int] = message_memo.MessageMemo()
    computed: list[int] = []

    def size(msg: Any) -> int:
        computed.append(1)
        return len(msg["content"])

    refs = []
    for n in range(10):
        message = _Msg(role="tool", tool_call_id=f"c{n}", content=f"output {n} " + "x" * 1_000_000)
        refs.append(weakref.ref(message))
        assert memo.get(message, None, size) == memo.get(message, None, size)
    assert len(computed) == 10  # each message computed once
    del message
    assert _alive(refs) <= 3
