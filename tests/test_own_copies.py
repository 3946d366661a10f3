"""What `prepare` hands back when the caller sends its whole history as new objects on every
call (an HTTP proxy decodes JSON per request): the messages no stage changed are the caller's
own objects of this call, as for a caller that keeps its objects, and the ones a stage made are
copies (never the session's record)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import transcript_path

from ctxrules import Engine


def _fresh(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    fresh: list[dict[str, Any]] = json.loads(json.dumps(messages))
    return fresh


def _step(i: int) -> list[dict[str, Any]]:
    arguments = json.dumps({"cmd": f"ls {i}"})
    call = {"id": f"c{i}", "type": "function", "function": {"name": "Bash", "arguments": arguments}}
    return [
        {"role": "assistant", "content": f"Checking {i}.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"c{i}", "content": f"file_{i}.txt\n" * 30},
    ]


def _unsigned(messages: list[dict[str, Any]]) -> str:
    """The messages as JSON without the signatures of injected blocks (a key per session)."""
    return re.sub(r'sig=\\"[0-9a-f]+\\"', "sig", json.dumps(messages))


def _own(history: list[dict[str, Any]], out: list[dict[str, Any]]) -> tuple[int, int]:
    """(output messages that are objects of ``history``, those that are not)."""
    ids = {id(m) for m in history}
    mine = sum(id(m) in ids for m in out)
    return mine, len(out) - mine


def test_new_objects_every_call_get_their_own_unchanged_messages_back(tmp_path: Path) -> None:
    session = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o", window=128_000)
    history: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Go."}]
    for i in range(6):
        history += _step(i)
        sent = _fresh(history)
        out = session.prepare(sent).messages
        assert out == session.last_output()
        # Nothing is compacted at this size: every message is the caller's, of this call.
        assert all(a is b for a, b in zip(out, sent, strict=True)), i


@pytest.mark.parametrize("window", [32_000, 64_000])
def test_a_compacting_session_fed_new_objects_hands_back_the_callers_and_copies_the_rest(
    tmp_path: Path, window: int
) -> None:
    history = json.loads(transcript_path("claudecode-ae4a77f8").read_text(encoding="utf-8"))
    engine = Engine.load("builtin:default")
    proxy = engine.session(tmp_path / "proxy", model="gpt-4o", window=window)
    kept = engine.session(tmp_path / "kept", model="gpt-4o", window=window)  # a caller that keeps its objects
    grown = list(history)
    proxy.prepare(_fresh(grown))
    kept.prepare(grown)
    for i in range(4):
        grown = grown + _step(i)
        sent = _fresh(grown)
        result = proxy.prepare(sent)
        reference = kept.prepare(grown)
        assert _unsigned(result.messages) == _unsigned(reference.messages)
        assert result.report["reused_messages"] == len(grown) - 2  # the proxy's turns are warm
        # As many of the caller's own objects as a caller that keeps its objects gets.
        assert _own(sent, result.messages) == _own(grown, reference.messages)
        # A message given back that is not the caller's is a copy, not the session's record.
        record, theirs = {id(m) for m in proxy.last_output()}, {id(m) for m in sent}
        assert not [m for m in result.messages if id(m) in record and id(m) not in theirs]


def _history() -> list[dict[str, Any]]:
    return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "List the files."}, *_step(0)]


def _texts(messages: list[dict[str, Any]]) -> list[Any]:
    return [m.get("content") for m in messages]


def test_an_edit_to_a_message_handed_back_does_not_reach_a_later_call_that_sends_new_objects(
    tmp_path: Path,
) -> None:
    session = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o", window=128_000)
    out = session.prepare(_fresh(_history())).messages
    out[1]["content"] = "EDITED after the call"  # the caller's own object, edited in place
    sent = _fresh(_history()) + _step(1)  # the next request, decoded afresh: no edit in it
    result = session.prepare(sent)
    assert "EDITED after the call" not in json.dumps(result.messages)
    assert _texts(result.messages) == _texts(sent)
    # Unedited, the same session goes on reusing its output.
    grown = _fresh(sent) + _step(2)
    assert session.prepare(grown).report["reused_messages"] == len(sent)


def test_an_edit_to_an_earlier_calls_objects_is_seen_when_the_caller_sends_the_last_calls_objects(
    tmp_path: Path,
) -> None:
    session = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o", window=128_000)
    first = _history()
    session.prepare(first)  # the output holds these objects
    second = _fresh(first) + _step(1)
    assert session.prepare(second).report["reused_messages"] == len(first)
    first[1]["content"] = "EDITED after the first call"  # an object the session's output still holds
    third = [*second, *_step(2)]  # the second call's objects again, and new ones
    result = session.prepare(third)
    assert "EDITED after the first call" not in json.dumps(result.messages)
    assert _texts(result.messages) == _texts(third)


def _compacted(tmp_path: Path, name: str) -> tuple[Any, list[dict[str, Any]]]:
    history = json.loads(transcript_path("claudecode-ae4a77f8").read_text(encoding="utf-8"))
    session = Engine.load("builtin:default").session(tmp_path / name, model="gpt-4o", window=32_000)
    session.prepare(history)
    return session, history


def test_a_copy_handed_back_is_the_same_object_next_call_unless_the_caller_edited_it(tmp_path: Path) -> None:
    """Every warm turn of a compacted session copied each message a stage had made, so a
    caller saw new objects for them on every call (and re-counted, re-hashed each one)."""
    session, history = _compacted(tmp_path, "s")
    grown = [*history, *_step(0)]
    first = session.prepare(grown).messages
    theirs = {id(m) for m in grown}
    made = [i for i, m in enumerate(first) if id(m) not in theirs]
    assert len(made) >= 5, "the transcript compacts at 32K: stages made messages"
    grown = [*grown, *_step(1)]
    second = session.prepare(grown).messages
    assert all(second[i] is first[i] for i in made)
    # An edited copy is not handed back again: the next call gets one equal to the session's.
    edited = made[len(made) // 2]
    pristine = json.loads(json.dumps(first[edited]))
    first[edited]["content"] = "EDITED by the caller"
    grown = [*grown, *_step(2)]
    third = session.prepare(grown).messages
    assert third[edited] is not first[edited] and third[edited] == pristine
    assert all(third[i] is first[i] for i in made if i != edited)
    assert "EDITED by the caller" not in json.dumps(session.last_output())


def test_stable_copies_give_the_outputs_of_fresh_copies(tmp_path: Path) -> None:
    """The same messages as a session whose caller never keeps what it got back."""
    session, history = _compacted(tmp_path, "a")
    other, _ = _compacted(tmp_path, "b")
    grown = list(history)
    for i in range(3):
        grown = [*grown, *_step(i)]
        out = session.prepare(grown).messages
        ref = other.prepare(_fresh(grown)).messages
        assert _unsigned(out) == _unsigned(ref)


def test_one_stage_made_object_at_two_places_is_two_copies_on_every_call() -> None:
    from ctxrules.engine import _OwnCopies

    own = _OwnCopies()
    history = [{"role": "user", "content": "hi"}]
    made = {"role": "user", "content": "a reminder"}
    for _ in range(3):
        out = own(history, [history[0], made, made])
        assert out[0] is history[0] and out[1] == made == out[2]
        assert out[1] is not out[2] and out[1] is not made and out[2] is not made
    out[1]["content"] = "edited by the caller"
    assert out[2]["content"] == "a reminder" and made["content"] == "a reminder"


@pytest.mark.parametrize("seed", range(40))
def test_a_hand_back_that_looks_at_what_is_new_gives_what_looking_at_all_gives(seed: int) -> None:
    """Turn after turn the session looks only at what is new since the last call (appended
    messages, the few positions a stage replaced: a Claude model's moved breakpoints). Every
    call must hand back what the same state hands back when it looks at every position: the
    caller's object at the same positions, equal copies elsewhere."""
    import random

    from ctxrules.engine import _OwnCopies

    class Whole(_OwnCopies):
        def _foreign_of(self, history: Any, output: Any) -> Any:
            self._output = []  # nothing to extend: every position is looked at
            return super()._foreign_of(history, output)

    rng = random.Random(seed)
    kept, whole = _OwnCopies(), Whole()
    history: list[dict[str, Any]] = []
    output: list[dict[str, Any]] = []
    made: list[dict[str, Any]] = []  # stage-made messages of earlier turns
    for turn in range(25):
        new = [{"role": "user", "content": f"m{turn}.{k}"} for k in range(rng.randint(0, 3))]
        if rng.random() < 0.15 and history:  # a caller that now passes new equal objects
            history = [dict(m) for m in history]
        history = [*history, *new]
        output = [*output, *new]
        for _ in range(rng.randint(0, 4)):  # positions a stage replaced, or put back
            if not output:
                break
            i = rng.randrange(len(output))
            choice = rng.random()
            if choice < 0.4:
                output[i] = {**output[i], "content": [{"type": "text", "text": str(output[i]["content"])}]}
            elif choice < 0.6 and made:
                output[i] = rng.choice(made)  # one stage-made object, perhaps at two places
            elif i < len(history):
                output[i] = history[i]
            made.append(output[i])
        if rng.random() < 0.1 and output:
            output = [*output[: rng.randrange(len(output))], {"role": "user", "content": "summary"}]
        given = list(output)
        got = kept(history, given)
        want = whole(history, given)
        assert got == want, f"turn {turn}"
        theirs = {id(m): m for m in history}
        assert [id(m) if id(m) in theirs else None for m in got] == [
            id(m) if id(m) in theirs else None for m in want
        ], f"turn {turn}: another choice of the caller's objects"
