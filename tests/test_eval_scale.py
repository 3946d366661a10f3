"""``ctxrules eval`` on long transcripts: a replayed call does Python work for what changed since
the call before, not for the whole history (a 5,000 message transcript took 22 s, almost all of
it spent walking each call's history again). Shown by counting the per-message work of a whole
replay, not by timing it (``tests/bench_eval.py`` prints the times)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest

from ctxrules.eval import caching, checks
from ctxrules.eval import replay as eval_replay
from ctxrules.eval.caching import AutomaticPrefixCache, Block, BlockChain, blocks_of
from ctxrules.eval.replay import Plan, Task

Msg = dict[str, Any]
TOOLS = ({"type": "function", "function": {"name": "Bash", "parameters": {"type": "object"}}},)


def chat(n: int) -> tuple[Msg, ...]:
    """``n`` small messages: a system prompt, then user and assistant in turns."""
    messages: list[Msg] = [{"role": "system", "content": "You are a helpful assistant."}]
    for i in range(n):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"})
    return tuple(messages[:n])


def test_new_tool_lists_with_the_same_tools_keep_the_chain() -> None:
    """A runner hands a new tools list with every call (an empty one without tools): compared
    as a list object, it made the chain start over on every call and hash the whole request."""
    messages = [dict(m) for m in chat(50)]
    for tools in ([], list(TOOLS)):
        chain = BlockChain()
        first = chain.blocks(messages[:40], [5] * 40, list(tools), 9 if tools else 0)
        second = chain.blocks(messages, [5] * 50, list(tools), 9 if tools else 0)
        assert all(a is b for a, b in zip(first, second[: len(first)], strict=True))
        assert second == blocks_of(messages, [5] * 50, list(tools), 9 if tools else 0)


def _reference_requests(requests: Sequence[tuple[list[Block], float]]) -> list[tuple[int, int, int]]:
    """The automatic prefix cache's rule, block by block, as a plain loop."""
    seen: dict[str, float] = {}
    out = []
    for blocks, clock in requests:
        shared = total = 0
        for block in blocks:
            total += block.tokens
            last = seen.get(block.chain)
            if last is None or clock - last > 600.0:
                break
            shared = total
        read = (shared // 128) * 128 if shared >= 1024 else 0
        for block in blocks:
            seen[block.chain] = clock
        out.append((sum(b.tokens for b in blocks), read, 0))
    return out


def test_the_automatic_cache_gives_the_rules_figures_for_any_order_of_requests() -> None:
    """What the cache takes from the request before (its blocks, all used at its clock) and what
    it looks up give the same figures as the rule applied block by block: appended blocks,
    blocks replaced, requests cut short, earlier requests sent again, clocks that go back or
    jump past the 10 minutes an entry lives."""
    rng = random.Random(11)
    made: dict[tuple[str, int], Block] = {}

    def request_of(steps: list[tuple[str, int]]) -> list[Block]:
        """Blocks named as BlockChain names them, by their whole prefix; one object per prefix
        and count, as BlockChain hands the blocks a request shares with the one before."""
        out = []
        for i, (_, tokens) in enumerate(steps):
            chain = "/".join(step for step, _ in steps[: i + 1])
            out.append(made.setdefault((chain, tokens), Block(chain, tokens, False)))
        return out

    steps: list[tuple[str, int]] = [("s0", 300)]
    requests: list[tuple[list[Block], float]] = []
    clock = 0.0
    history: list[list[tuple[str, int]]] = []
    for n in range(400):
        move = rng.randrange(6)
        if move < 3:
            steps = [*steps, (f"s{rng.randrange(8)}", rng.randrange(1, 400))]
        elif move == 3 and len(steps) > 1:
            i = rng.randrange(len(steps))
            steps = [*steps[:i], (f"new{n}", rng.randrange(1, 400)), *steps[i + 1 :]]
        elif move == 4 and len(steps) > 1:
            steps = steps[: rng.randrange(1, len(steps))]
        elif history:
            steps = list(rng.choice(history))  # an earlier request again
        clock += rng.choice([0.0, 5.0, 20.0, 700.0, -30.0])
        history.append(steps)
        requests.append((request_of(steps), clock))
    cache = AutomaticPrefixCache()
    got = []
    for blocks, at in requests:
        use = cache.request(blocks, at)
        got.append((use.prompt, use.read, use.write))
    assert got == _reference_requests(requests)
    assert any(read for _, read, _ in got) and any(not read for _, read, _ in got[1:])


def test_a_replay_does_per_message_work_for_what_each_call_adds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Over a whole replay of N messages, the blocks made, the messages counted and the messages
    the pin check reads add up to a few per message (each call used to make them for its whole
    history again: N²/4 each, 22,500 for N = 300)."""
    made: list[int] = []
    real_block = caching.Block

    def block(*args: Any) -> Block:
        made.append(1)
        return real_block(*args)

    monkeypatch.setattr(caching, "Block", block)
    users: list[int] = []
    real_user = checks.is_real_user
    monkeypatch.setattr(checks, "is_real_user", lambda m: users.append(1) or real_user(m))
    counted: list[int] = []
    real_for_model = eval_replay.TokenCounter.for_model

    class Counting:
        def __init__(self, counter: Any) -> None:
            self.counter = counter

        def __getattr__(self, name: str) -> Any:
            return getattr(self.counter, name)

        def count_each(self, messages: Sequence[Msg]) -> list[int]:
            messages = list(messages)
            counted.append(len(messages))
            return list(self.counter.count_each(messages))

    class Counters:  # the replay's counter only (the session has its own)
        @staticmethod
        def for_model(info: Any) -> Counting:
            return Counting(real_for_model(info))

    monkeypatch.setattr(eval_replay, "TokenCounter", Counters)
    n = 300
    task = Task("t", "t.json", chat(n), TOOLS, Plan("default", "pack", "builtin:default"), "gpt-4o", None)
    result = eval_replay.replay(task)
    assert len(result.calls) == n // 2 - 1 and result.error is None
    assert not any(c.violations for c in result.calls)
    assert len(made) < 3 * n
    assert len(users) <= n
    assert sum(counted) < 3 * n


def test_the_pin_check_of_a_replay_is_the_pin_check_of_each_call() -> None:
    """:class:`checks.Pins` (the transcript walked once) finds what :func:`pin_problems` finds
    on each call's history and output: kept, an anchor dropped, the latest ask rewritten, a
    system message changed, an anchor kept as another object with the same content."""
    messages = [dict(m) for m in chat(12)]
    pins = checks.Pins(messages)
    outputs = {
        4: messages[:4],
        6: [messages[0], *messages[2:6]],
        8: [*messages[:7], {"role": "user", "content": "rewritten"}],
        10: [{"role": "system", "content": "other"}, *messages[1:10]],
        12: [messages[0], dict(messages[1]), *messages[2:12]],
    }
    seen = []
    for end, output in outputs.items():
        problems = pins.problems(end, output)
        assert problems == checks.pin_problems(messages[:end], output)
        seen.append(problems)
    assert seen == [
        [],
        ["the human anchor is not in the output unchanged"],
        ["the latest real user message is not in the output unchanged"],
        ["the leading system messages changed"],
        [],
    ]


def test_the_pairing_check_of_a_replay_is_the_pairing_check_of_each_request() -> None:
    """:class:`checks.Pairing` resumes its walk where the request before differed, and finds
    what :func:`pairing_problems` finds on each request alone: calls answered, unanswered,
    answered twice, orphan results, ids used before, calls without an id; messages appended,
    replaced, dropped, and requests cut short."""

    def call(cid: str | None) -> Msg:
        return {"id": cid, "type": "function", "function": {"name": "Bash", "arguments": "{}"}}

    rng = random.Random(5)
    ids = ["a", "b", "c", "d", None]
    requests: list[list[Msg]] = []
    messages: list[Msg] = [{"role": "system", "content": "s"}]
    for n in range(600):
        move = rng.randrange(8)
        if move < 3:
            calls = [call(rng.choice(ids)) for _ in range(rng.randrange(1, 3))]
            messages = [*messages, {"role": "assistant", "content": None, "tool_calls": calls}]
        elif move < 5:
            messages = [*messages, {"role": "tool", "tool_call_id": rng.choice(ids), "content": f"r{n}"}]
        elif move == 5:
            messages = [*messages, {"role": "user", "content": f"u{n}"}]
        elif move == 6 and len(messages) > 2:
            i = rng.randrange(1, len(messages))
            messages = [*messages[:i], {"role": "assistant", "content": f"x{n}"}, *messages[i + 1 :]]
        elif len(messages) > 2:
            messages = messages[: rng.randrange(1, len(messages))]
        requests.append(messages)
    pairing = checks.Pairing()
    found = [pairing(request) for request in requests]
    assert found == [checks.pairing_problems(request) for request in requests]
    assert sum(bool(f) for f in found) > 100 and sum(not f for f in found) > 10
