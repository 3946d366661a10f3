"""Stages that resume from what they carried get what a session that carries nothing gets.

A warm turn's stages look only at the messages appended since the last turn (their carried
state resumes where the new list extends the last one: ``Shape.extends``). Each turn below is
prepared by a session that carried its state over and by a new engine and session over a
fresh directory, and both must give the same messages and the same actions of the stages that
resume (the intent, the tool pairs, the output filter): turns whose appended messages change
the focus terms, bring a new user message, a failing result, an id-less or reused call id;
a message edited in place; two sessions taking turns on one engine; a list that is not an
extension of the last one (a retry of a turn with another reply).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from session_kit import keyed_state_root

from ctxrules import Engine
from ctxrules.carry import Carry, PerSession
from ctxrules.messages import mark_injected
from ctxrules.structure import STAND_IN_KIND, forget, shape

MODEL = "gpt-4o"
CLOCK = 1_760_000_000.0
# Turns further apart than the provider's cache lives: a warm session would otherwise leave
# outputs it already sent alone (hot-cache bypass) where a new one reduces them.
GAP = 1_000.0
# Stages whose warm path resumes from carried state; their actions must match a fresh run's.
RESUMING = ("pairs", "intent", "outputs", "thinking", "media", "notes", "reread")


def _state_root(tmp_path: Path) -> Path:
    return keyed_state_root(tmp_path, "test_warm_incremental")


def _call(cid: str, name: str, **args: Any) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def _step(cid: str, text: str, name: str, result: str, **args: Any) -> list[dict[str, Any]]:
    return [
        {"role": "assistant", "content": text, "tool_calls": [_call(cid, name, **args)]},
        {"role": "tool", "tool_call_id": cid, "content": result},
    ]


def _listing(n: int) -> str:
    return "".join(f"src/app/module_{i}.py: {'x' * 60}\n" for i in range(n))


def _conversation() -> list[list[dict[str, Any]]]:
    """The turns: each the messages appended to the history before it is prepared."""
    turns: list[list[dict[str, Any]]] = [
        [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "Please fix the crash in src/app/main.py (see app.config.loader)."},
            *_step(
                "c1", "Reading the file first.", "Read", "def main():\n    load()\n" * 40, file_path="src/app/main.py"
            ),
        ],
        _step("c2", "Listing the package.", "Bash", _listing(300), command="ls -l src/app"),
        # The assistant names a new file: the focus terms change.
        _step(
            "c3",
            "The bug is in src/app/helpers.py, reading it.",
            "Read",
            "def helper():\n    pass\n" * 30,
            file_path="src/app/helpers.py",
        ),
        # A failing call: protected with its result from now on.
        _step(
            "c4",
            "Running the tests.",
            "Bash",
            "Traceback (most recent call last):\nError: boom\nExit code 1",
            command="pytest -x",
        ),
        _step("c5", "Next I will look around.", "Bash", _listing(200), command="ls -R"),
        # A new user message with its own terms.
        [{"role": "user", "content": "Also update docs/guide.md and the module app.config.loader."}],
        _step("c6", "Reading docs/guide.md.", "Read", "# Guide\n" + "text line\n" * 200, file_path="docs/guide.md"),
        # A call id used before: the repair renames it (the pairs stage's full path).
        _step("c2", "Listing again.", "Bash", _listing(50), command="ls src"),
        # A call without an id and its result without one.
        [
            {
                "role": "assistant",
                "content": "One more.",
                "tool_calls": [{"type": "function", "function": {"name": "Bash", "arguments": '{"command": "ls"}'}}],
            },
            {"role": "tool", "content": _listing(20)},
        ],
        _step("c7", "Done with src/app/main.py.", "Bash", "ok", command="true"),
    ]
    return turns


def _open(root: Path, folder: str, engine: Engine | None = None, session_id: str = "s") -> Any:
    engine = engine or Engine.load("builtin:default")
    return engine.session(root / folder, model=MODEL, window=400_000, state_root=root, session_id=session_id)


def _actions(result: Any, new_from: int) -> dict[str, list[tuple[str, str]]]:
    """Each resuming stage's actions (over its runs: the integrity stages run again after a
    stage that changed something); of those about one message, the ones about the messages new
    this turn (a warm turn's input holds what the stages repaired or reduced before: each is
    reported once, when it happens)."""
    out: dict[str, list[tuple[str, str]]] = {}
    for s in result.report["stages"]:
        if s["id"] in RESUMING:
            out.setdefault(s["id"], []).extend(
                (a["kind"], a["detail"]) for a in s["actions"] if a.get("index", new_from) >= new_from
            )
    return out


def _same_as_fresh(
    root: Path,
    warm: Any,
    given: list[dict[str, Any]],
    clock: float,
    label: str,
    session_id: str = "s",
    new_from: int = 0,
) -> Any:
    got = warm.prepare(given, clock=clock)
    want = _open(root, f"fresh-{label}", session_id=session_id).prepare(copy.deepcopy(given), clock=clock)
    assert (got.messages, got.tools, got.request) == (want.messages, want.tools, want.request), label
    did, fresh = _actions(got, new_from), _actions(want, new_from)
    assert did.keys() == fresh.keys(), label
    for stage in did:
        assert did[stage] == fresh[stage], f"{label}: {stage}"
    return got


def test_each_turn_equals_a_session_that_carries_nothing(tmp_path: Path) -> None:
    root = _state_root(tmp_path)
    warm = _open(root, "warm")
    history: list[dict[str, Any]] = []
    intents: list[str] = []
    for n, appended in enumerate(_conversation()):
        new_from = len(history)
        history = [*history, *appended]
        got = _same_as_fresh(root, warm, history, CLOCK + GAP * n, f"turn{n}", new_from=new_from)
        intents += [d for _, d in _actions(got, 0)["intent"]]
    # The turns did change what the intent protects: new terms, a failed call, a new ask.
    assert len(set(intents)) >= 6 and any("failed calls: 1" in d for d in intents)


def test_a_message_edited_in_place_is_seen(tmp_path: Path) -> None:
    """The caller edits an old message in place (the session notices and calls forget()):
    what the stages carried for it is not used."""
    root = _state_root(tmp_path)
    warm = _open(root, "warm")
    history: list[dict[str, Any]] = []
    for n, appended in enumerate(_conversation()[:6]):
        history = [*history, *appended]
        warm.prepare(history, clock=CLOCK + GAP * n)
    # An old result now names the asked file; an old assistant message names a new one.
    history[4]["content"] = "see src/app/main.py line 3\n" + _listing(100)
    history[2]["content"] = "Reading src/app/other_module.py instead."
    history = [*history, *_step("c9", "Checking.", "Bash", "ok", command="true")]
    _same_as_fresh(root, warm, history, CLOCK + GAP * 10, "edited", new_from=len(history) - 2)


def test_a_turn_that_does_not_extend_the_last_one(tmp_path: Path) -> None:
    """A retry: the same history with another reply appended, then the turn after it."""
    root = _state_root(tmp_path)
    warm = _open(root, "warm")
    turns = _conversation()
    history: list[dict[str, Any]] = [m for t in turns[:5] for m in t]
    warm.prepare([*history, *turns[5]], clock=CLOCK)
    retried = [
        *history,
        *_step("c8", "Trying src/app/helpers.py again.", "Bash", "Error: no\nExit code 2", command="false"),
    ]
    _same_as_fresh(root, warm, retried, CLOCK + GAP, "retry", new_from=len(history))
    _same_as_fresh(root, warm, [*retried, *turns[6]], CLOCK + GAP * 2, "after-retry", new_from=len(retried))


def test_two_sessions_alternating_on_one_engine(tmp_path: Path) -> None:
    root = _state_root(tmp_path)
    shared = Engine.load("builtin:default")
    sessions = [_open(root, f"shared{k}", shared, session_id=f"s{k}") for k in range(2)]
    turns = _conversation()
    histories: list[list[dict[str, Any]]] = [[], []]
    for n, appended in enumerate(turns):
        for k in range(2):
            # The second session gets its own objects (and a call id of its own per turn).
            own = copy.deepcopy(appended) if k else appended
            new_from = len(histories[k])
            histories[k] = [*histories[k], *own]
            clock = CLOCK + GAP * (2 * n + k)
            _same_as_fresh(root, sessions[k], histories[k], clock, f"s{k}-turn{n}", f"s{k}", new_from)


def test_a_carry_resumes_only_on_an_extension_of_the_kept_list() -> None:
    forget()
    carry: Carry[str] = Carry()
    base = [{"role": "user", "content": f"m{i}"} for i in range(5)]
    shape(base)
    carry.keep("s", base, "k", "value")
    grown = [*base, {"role": "assistant", "content": "x"}]
    assert carry.resume("s", grown, "k") == (5, "value")
    assert carry.resume("s", grown, "other key") == (0, None)
    assert carry.resume("t", grown, "k") == (0, None)  # another session
    equal = [*base[:2], {"role": "user", "content": "m2"}, *base[3:], grown[-1]]
    assert carry.resume("s", equal, "k") == (5, "value")  # an equal message: the same facts
    replaced = [*base[:2], {"role": "user", "content": "changed"}, *base[3:], grown[-1]]
    assert carry.resume("s", replaced, "k") == (0, None)
    shorter = base[:3]
    assert carry.resume("s", shorter, "k") == (0, None)
    forget()  # an edit in place: nothing carried is used
    assert carry.resume("s", grown, "k") == (0, None)


def test_a_value_taken_out_is_gone_until_put_back() -> None:
    memo: PerSession[list[int]] = PerSession()
    memo.put("s", [1])
    taken = memo.pop("s")
    assert taken == [1] and memo.get("s") is None and memo.pop("s") is None
    memo.put("s", [*taken, 2])
    assert memo.get("s") == [1, 2]


@pytest.mark.parametrize("appended", [1, 2, 7])
def test_shape_extends_is_its_ancestry(appended: int) -> None:
    forget()
    first = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    old = shape(first)
    grown = [*first, *({"role": "user", "content": str(i)} for i in range(appended))]
    new = shape(grown)
    assert new.extends(old) == 2 and new.extends(new) == len(grown)
    assert old.extends(new) is None
    other = shape([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])  # equal, not the same
    assert new.extends(other) is None
    assert shape([*grown, {"role": "user", "content": "z"}]).extends(old) == 2  # two derivations back


def _stand_in(cid: str) -> dict[str, Any]:
    """normalize.tool_pairs' stand-in for call ``cid`` (a real result later supersedes it)."""
    return mark_injected({"role": "tool", "tool_call_id": cid, "content": "no result"}, STAND_IN_KIND)


def test_the_plain_tail_agrees_with_the_pairing() -> None:
    """Shape.tail_calls (the newest step's results read from its messages alone) says what the
    pairing says, on random lists of calls and results with reused, missing and foreign ids,
    and stand-ins."""
    import random

    from ctxrules.structure import _NO_TAIL, Shape, facts_of

    rng = random.Random(22)
    ids = ["a", "b", "c", None]
    for _ in range(3000):
        messages: list[dict[str, Any]] = []
        for _ in range(rng.randint(1, 9)):
            kind = rng.choice(["user", "assistant", "assistant", "tool", "tool", "tool", "stand-in", "function"])
            if kind == "assistant":
                calls = [
                    {"type": "function", "function": {"name": "f", "arguments": "{}"}}
                    | ({"id": cid} if (cid := rng.choice(ids)) else {})
                    for _ in range(rng.randint(0, 3))
                ]
                messages.append({"role": "assistant", "content": "x", **({"tool_calls": calls} if calls else {})})
            elif kind == "tool":
                cid = rng.choice(ids)
                messages.append({"role": "tool", "content": "r", **({"tool_call_id": cid} if cid else {})})
            elif kind == "stand-in":
                messages.append(_stand_in(rng.choice(["a", "b", "c"])))
            elif kind == "function":
                messages.append({"role": "function", "name": "f", "content": "r"})
            else:
                messages.append({"role": "user", "content": "u"})
        if rng.random() < 0.5:  # end with a step whose results come in any order, some missing
            step = rng.sample(["a", "b", "c"], rng.randint(1, 3))
            call = {"type": "function", "function": {"name": "f", "arguments": "{}"}}
            messages.append({"role": "assistant", "content": "x", "tool_calls": [call | {"id": c} for c in step]})
            answered = rng.sample(step, rng.randint(0, len(step)))
            messages.extend({"role": "tool", "tool_call_id": c, "content": "r"} for c in answered)
        made = Shape([facts_of(m) for m in messages])
        tail = made.tail_calls()
        call_of = made.pairing.call_of
        for j, key in (tail or {}).items():
            assert call_of.get(j) == key, messages
        reference = Shape([facts_of(m) for m in messages])
        reference._tail = _NO_TAIL  # "no plain tail": the pins come from the pairing
        assert Shape([facts_of(m) for m in messages]).pins == reference.pins, messages


def test_what_an_extended_list_knows_from_the_one_before_is_what_the_pairing_says() -> None:
    """call_of and step_results of a list derived by appending steps (each turn's shape asks
    the ones it was derived from) against the pairing of a list that carries nothing."""
    import random

    from ctxrules.structure import Shape, facts_of

    rng = random.Random(7)
    for _ in range(300):
        forget()
        messages: list[dict[str, Any]] = [{"role": "user", "content": "u"}]
        for turn in range(8):
            grown = list(messages)
            step = rng.sample(["a", "b", "c"], rng.randint(1, 3))
            call = {"type": "function", "function": {"name": "f", "arguments": "{}"}}
            grown.append({"role": "assistant", "content": "x", "tool_calls": [call | {"id": c} for c in step]})
            answered = rng.sample(step, rng.randint(0, len(step)))
            if rng.random() < 0.2:  # a result for an older call, or one with no call
                answered.append(rng.choice(["a", "b", "c", "zz"]))
            grown.extend({"role": "tool", "tool_call_id": c, "content": "r"} for c in answered)
            # The repair's stand-ins for some unanswered calls: a real result a later turn
            # appends (the older call's above) replaces one.
            grown.extend(_stand_in(c) for c in step if c not in answered and rng.random() < 0.5)
            if rng.random() < 0.3:
                grown.append({"role": "user", "content": f"u{turn}"})
            made = shape(grown)
            made.pins  # noqa: B018  # what a warm turn's stages ask first
            reference = Shape([facts_of(m) for m in grown]).pairing
            for j, f in enumerate(made.facts):
                if f.role == "tool":
                    assert made.call_of(j) == reference.call_of.get(j)
                if f.role == "assistant":
                    known = made.step_results(j)
                    if known is not None:
                        calls = range(len(f.calls or ()))
                        assert known == tuple(sorted(reference.result_of[(j, p)] for p in calls))
            messages = grown


def test_the_arguments_check_agrees_with_json_loads() -> None:
    """normalize.tool_pairs calls the JSON scanner directly (see _parses): the verdicts of
    ``json.loads`` held to JSON itself (``NaN``, ``Infinity`` and a number that overflows a
    double, ``1e400``, are Python's reading, not JSON)."""
    import math
    import random

    from ctxrules.stages.normalize_tool_pairs import _parses

    def refuse(value: str) -> Any:
        raise ValueError(value)

    def finite(value: str) -> float:
        if math.isinf(float(value)):
            raise ValueError(value)
        return float(value)

    def loads(text: str) -> bool:
        try:
            json.loads(text, parse_constant=refuse, parse_float=finite)
        except ValueError:
            return False
        return True

    fixed = ["{}", " {} ", '{"a": 1', "\ufeff{}", "{}\u00a0", "\u00a0{}", "[NaN, Infinity]", "{} {}", "", "01", "[1,]"]
    fixed += ['{"a": NaN}', "[-Infinity]", "[1e400]", "[-1e400]", "[1.5e300]", '{"a": "NaN"}', "[1e-400]"]
    assert not _parses("[NaN]") and not _parses("[1e400]") and _parses("[1e-400]")
    rng = random.Random(3)
    alphabet = [*'{}[]":,0123456789.-+eE \t\n\rabcdeflnrstu\\', "\u00a0", "\ufeff", "é"]
    generated = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))) for _ in range(20_000)]
    for text in [*fixed, *generated]:
        assert _parses(text) == loads(text), repr(text)
