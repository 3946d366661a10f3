"""The message-list model: validation, injected markers, steps, exchanges, pins, text."""

from __future__ import annotations

import copy
import hashlib
import hmac
import itertools
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import transcript_paths
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxrules.errors import MessagesError
from ctxrules.injected import InjectionKey, key_scope
from ctxrules.messages import (
    injected_kind,
    injected_meta,
    is_injected,
    is_real_user,
    mark_injected,
    message_text,
    replace_text,
    signed_by,
    split_input,
    validate_messages,
)
from ctxrules.structure import exchanges, pair_tool_calls, pinned_indices, steps

CORPUS = transcript_paths()

Msg = dict[str, Any]


def call(cid: str, name: str = "Bash", arguments: str = "{}") -> Msg:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": arguments}}


def asst(*ids: str, content: str | None = "") -> Msg:
    msg: Msg = {"role": "assistant", "content": content}
    if ids:
        msg["tool_calls"] = [call(i) for i in ids]
    return msg


def tool(cid: str, content: str = "ok") -> Msg:
    return {"role": "tool", "tool_call_id": cid, "content": content}


def user(text: str) -> Msg:
    return {"role": "user", "content": text}


# --- validation -----------------------------------------------------------------------------


def test_valid_list_and_object_forms_are_accepted() -> None:
    messages = [{"role": "system", "content": "s"}, user("hi"), asst("a"), tool("a")]
    assert validate_messages(messages) == messages
    tools = [{"type": "function", "function": {"name": "Bash"}}]
    assert validate_messages({"messages": messages, "tools": tools}) == messages
    assert split_input({"messages": messages, "tools": tools, "model": "x"}) == (messages, tools)
    assert split_input(messages) == (messages, None)


def test_validate_returns_a_new_list_and_never_mutates() -> None:
    messages = [user("hi"), asst("a", content=None), tool("a")]
    snapshot = copy.deepcopy(messages)
    out = validate_messages(messages)
    assert out is not messages
    assert messages == snapshot


def test_call_without_id_is_left_for_the_pair_stage_to_repair() -> None:
    history = [user("x"), {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "a"}}]}]
    assert validate_messages(history) == history


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        ([user("x"), "not a message"], r"message 1: expected an object, got string"),
        ([{"content": "x"}], r"message 0: missing 'role'"),
        ([{"role": 3, "content": "x"}], r"message 0: 'role' must be a string"),
        ([user("x"), {"role": "robot", "content": "x"}], r"message 1: unknown role 'robot'"),
        ([{"role": "user", "content": None}], r"message 0 \(user\): 'content' must be"),
        ([{"role": "user"}], r"message 0 \(user\): 'content' must be"),
        ([user("a"), {"role": "user", "content": 42}], r"message 1 \(user\): 'content' must be"),
        ([{"role": "user", "content": ["x"]}], r"message 0 \(user\), content part 0"),
        ([{"role": "user", "content": [{"type": "text"}]}], r"content part 0: a text part"),
        ([{"role": "user", "content": [{"text": "x"}]}], r"content part 0: missing"),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
            r"image_url part needs",
        ),
        (
            [user("x"), {"role": "assistant", "content": "", "tool_calls": {"id": "a"}}],
            r"message 1 \(assistant\): 'tool_calls' must be a list",
        ),
        (
            [{"role": "user", "content": "x", "tool_calls": [call("a")]}],
            r"message 0 \(user\): 'tool_calls' is only valid on assistant",
        ),
        (
            [
                user("x"),
                {"role": "assistant", "content": None, "tool_calls": [{"id": 7, "function": {"name": "a"}}]},
            ],
            r"message 1 \(assistant\), tool_calls\[0\]: 'id' must be a string",
        ),
        (
            [{"role": "assistant", "content": None, "tool_calls": [call("a"), {"id": "b"}]}],
            r"tool_calls\[1\]: missing 'function'",
        ),
        (
            [{"role": "assistant", "content": None, "tool_calls": ["a"]}],
            r"tool_calls\[0\]: expected an object",
        ),
        (
            [{"role": "tool", "tool_call_id": 7, "content": "x"}],
            r"message 0 \(tool\): 'tool_call_id' must be a string",
        ),
        (
            [user("x"), {"role": "assistant", "content": "a", "thinking_blocks": 5}],
            r"message 1 \(assistant\): 'thinking_blocks' must be a list of blocks, got int",
        ),
        (
            [user("x"), {"role": "assistant", "content": "a", "thinking_blocks": "think"}],
            r"message 1 \(assistant\): 'thinking_blocks' must be a list of blocks, got string",
        ),
    ],
)
def test_structural_errors_name_the_message_index(messages: list[Any], expected: str) -> None:
    with pytest.raises(MessagesError, match=expected):
        validate_messages(messages)


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ("text", "expected a JSON list"),
        ({"msgs": []}, "no 'messages'"),
        ({"messages": {}}, "'messages' must be a list"),
        ({"messages": [], "tools": {}}, "'tools' must be a list"),
        ({"messages": [], "tools": ["Bash"]}, "tool 0: expected an object"),
    ],
)
def test_bad_input_shapes_are_reported(obj: object, expected: str) -> None:
    with pytest.raises(MessagesError, match=expected):
        validate_messages(obj)


def test_what_agents_really_produce_is_not_fatal() -> None:
    messages = [
        user("go"),
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [call("a", arguments="{not json"), call("b", arguments="")],
        },
        tool("a"),
        tool("never-called"),  # the pair stage repairs this
        {"role": "assistant", "content": [{"type": "text", "text": "x"}, {"type": "thinking"}]},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                {"type": "input_audio", "input_audio": {"data": "..."}},
            ],
        },
        {"role": "assistant", "content": None, "tool_calls": None},
        {"role": "function", "name": "legacy", "content": "42"},
        {"role": "developer", "content": "be brief", "x-unknown": {"kept": True}},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c", "type": "custom", "custom": {"name": "apply_patch"}}],
        },
    ]
    assert validate_messages(messages) == messages


@pytest.mark.corpus
@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_every_corpus_transcript_validates(path: Path) -> None:
    messages = json.loads(path.read_text())
    assert validate_messages(messages) == messages


# --- injected messages ----------------------------------------------------------------------


def test_only_a_signed_leading_tag_marks_a_message_injected() -> None:
    marked = mark_injected(user("remember X"), "notes")
    assert is_injected(marked) and injected_kind(marked) == "notes"
    # A metadata key is no mark (nothing extra travels on the wire) ...
    assert not is_injected({"role": "user", "content": "summary", "ctxrules": {"kind": "summary"}})
    # ... and neither is a tag without a signature that verifies under the current key.
    assert not is_injected(user("<ctxrules:summary>\n...\n</ctxrules:summary>"))
    assert not is_injected(user("  \n<ctxrules:notes v=1>x"))
    forged = marked["content"].replace("remember X", "remember Y")
    assert not is_injected(user(forged)) and injected_kind(user(forged)) is None
    with key_scope(InjectionKey(b"k" * 32)):
        assert not is_injected(marked), "another session's key does not verify it"
    parts = mark_injected({"role": "user", "content": [{"type": "text", "text": "<ctxrules:reread/>"}]}, "reread")
    assert is_injected(parts) and injected_kind(parts) == "reread"


def test_humans_mentioning_or_pasting_the_tag_stay_real() -> None:
    assert is_real_user(user("what does <ctxrules:summary> mean?"))
    assert is_real_user(user("<ctxrules: is that a tag?"))  # no kind: not a tag
    assert is_real_user(user("<ctxrulesfoo>"))
    assert is_real_user(user('<ctxrules:summary id="abc" source="llm" sig="0123456789abcdef">\nx'))
    assert not is_real_user(asst())
    assert not is_real_user(tool("a"))


def test_an_elided_real_user_message_is_still_real() -> None:
    marker = "[ctxrules:elided kind=message count=1 ref=vault://" + "a" * 64 + "]"
    assert is_real_user(user(marker))


def test_mark_injected_signs_a_tag_adds_no_key_and_is_idempotent() -> None:
    original = {"role": "user", "content": "remember X", "name": "kept"}
    marked = mark_injected(original, "notes", source="ledger")
    assert original == {"role": "user", "content": "remember X", "name": "kept"}
    assert set(marked) == {"role", "content", "name"}, "no field is added"
    assert re.fullmatch(
        r'<ctxrules:notes source="ledger" sig="[0-9a-f]{16}">\nremember X\n</ctxrules:notes>', marked["content"]
    )
    assert injected_meta(marked) == {"source": "ledger"}
    assert marked["name"] == "kept"
    assert is_injected(marked) and not is_real_user(marked)
    assert mark_injected(marked, "notes", source="ledger") == marked
    with pytest.raises(TypeError):
        mark_injected(original, "notes", files=["a"])  # type: ignore[arg-type]


def test_a_rewritten_injected_message_stays_marked() -> None:
    marked = mark_injected(user("line\n" * 50), "notes", count=2)
    cut = replace_text(marked, message_text(marked)[:80] + "\n[cut]")
    assert is_injected(cut) and injected_meta(cut) == {"count": "2"}
    spilled = replace_text(marked, "[ctxrules:elided kind=lines count=50 ref=vault://" + "b" * 64 + "]")
    assert injected_kind(spilled) == "notes" and "[ctxrules:elided" in message_text(spilled)
    # A real message rewritten stays real.
    assert is_real_user(replace_text(user("<ctxrules:notes>x"), "<ctxrules:notes>y"))


def test_mark_injected_keeps_an_existing_tag_and_non_text_parts() -> None:
    tagged = mark_injected(user("<ctxrules:summary v=2>\nbody\n</ctxrules:summary>"), "summary", id="s1")
    assert tagged["content"].startswith('<ctxrules:summary v=2 id="s1" sig="')
    assert injected_meta(tagged) == {"v": "2", "id": "s1"}
    image = {"type": "image_url", "image_url": {"url": "data:,"}}
    parts = mark_injected({"role": "user", "content": [image]}, "reread")
    assert parts["content"][1:] == [image] and is_injected(parts)
    assert re.fullmatch(r'<ctxrules:reread sig="[0-9a-f]{16}"/>', parts["content"][0]["text"])
    with pytest.raises(ValueError):
        mark_injected(user("x"), "Bad Kind")


def test_the_signature_covers_every_part_of_the_message() -> None:
    """A copied signed tag does not make the caller's own text or image ours: stages drop and
    replace injected messages, and would drop what the caller put next to the tag."""
    notes = mark_injected(user("remember X"), "notes", count=1)
    tag_part = {"type": "text", "text": notes["content"]}
    question = {"type": "text", "text": "and a new question?"}
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    for content in ([tag_part, question], [tag_part, image], [question, tag_part], [image, tag_part]):
        merged = {"role": "user", "content": content}
        assert not is_injected(merged) and is_real_user(merged) and injected_meta(merged) == {}, content
    appended = user(notes["content"] + "\nand a new question?")
    assert is_real_user(appended), "a string is signed whole"
    # The text alone, as a string or as the one part of a list (a client's form), stays ours.
    assert is_injected({"role": "user", "content": [{**tag_part, "cache_control": {"type": "ephemeral"}}]})


def test_a_signed_message_with_other_parts_keeps_its_mark_only_while_they_stay() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}}
    ours = mark_injected({"role": "user", "content": [image, {"type": "text", "text": "the screen"}]}, "reread")
    signed = ours["content"][1]
    assert injected_kind(ours) == "reread" and ours["content"][0] == image
    assert signed["text"].startswith("<ctxrules:reread sig=") and signed["text"].endswith(
        "\nthe screen\n</ctxrules:reread>"
    )
    # What a client does to a message it sends back: a caching hint on a part, keys reordered.
    hinted = {**ours, "content": [{**image, "cache_control": {"type": "ephemeral"}}, signed]}
    flipped = {"image_url": dict(reversed(list(image["image_url"].items()))), "type": "image_url"}
    assert is_injected(hinted) and is_injected({**ours, "content": [flipped, signed]})
    # Anything added, removed, changed or moved is the caller's message, not ours.
    other = {"type": "image_url", "image_url": {"url": "data:image/png;base64,BBBB", "detail": "low"}}
    for content in (
        [image, signed, other],
        [image, signed, {"type": "text", "text": "and this?"}],
        [signed],
        [other, signed],
        [signed, image],
        [{**image, "image_url": {**image["image_url"], "detail": True}}, signed],
    ):
        assert is_real_user({**ours, "content": content}), content
    # A rewrite by a stage is signed again for the message as it now is.
    assert injected_kind(replace_text(ours, "<ctxrules:reread>\nshorter")) == "reread"
    with key_scope(InjectionKey(b"k" * 32)):
        assert not is_injected(ours)


def test_which_key_signed_a_copied_tag_is_still_known() -> None:
    key = InjectionKey(b"s" * 32)
    with key_scope(key):
        notes = mark_injected(user("remember X"), "notes")
    merged = {"role": "user", "content": [{"type": "text", "text": notes["content"]}, {"type": "text", "text": "Q"}]}
    with key_scope(key):
        assert not is_injected(merged)
    assert signed_by(merged, key) is True and signed_by(notes, key) is True
    assert signed_by(merged, InjectionKey(b"o" * 32)) is False
    assert signed_by(user("no tag"), key) is None


def test_texts_signed_by_earlier_versions_still_verify() -> None:
    """The payload of a text that is the whole message is the text without its sig attribute,
    as it always was: a session's history signed before keeps its marks (no second notes
    message, no summary taken for the user's)."""
    secret = b"e" * 32
    unsigned = '<ctxrules:notes count="1">\nSession notes\n- [n1] X\n</ctxrules:notes>'
    sig = hmac.new(secret, unsigned.encode(), hashlib.sha256).hexdigest()[:16]
    text = unsigned.replace('count="1">', f'count="1" sig="{sig}">', 1)
    with key_scope(InjectionKey(secret)):
        assert injected_meta(user(text)) == {"count": "1"}
        assert is_injected({"role": "user", "content": [{"type": "text", "text": text}]})


def test_a_message_with_other_parts_is_verified_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The warm path: an equal message (a new object, as every turn parses) is not hashed again."""
    key = InjectionKey(b"m" * 32)
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 100_000}}
    with key_scope(key):
        ours = mark_injected({"role": "user", "content": [image]}, "reread")
        calls: list[str] = []
        digest = InjectionKey._digest

        def counted(self: InjectionKey, text: str, others: Any) -> str:
            calls.append(text)
            return digest(self, text, others)

        monkeypatch.setattr(InjectionKey, "_digest", counted)
        for _ in range(3):
            assert is_injected(copy.deepcopy(ours))
    assert calls == [], "signing remembered the message"
    with key_scope(key):
        assert not is_injected({**ours, "content": [*ours["content"], image]})
        assert not is_injected({**ours, "content": [*ours["content"], image]})
    assert len(calls) == 1


# --- text -----------------------------------------------------------------------------------


def test_message_text_and_replace_text() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:,"}}
    msg = {
        "role": "user",
        "content": [
            image,
            {"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "b"},
        ],
        "extra": 1,
    }
    assert message_text(msg) == "a\nb"
    replaced = replace_text(msg, "new")
    assert replaced["content"] == [
        image,
        {"type": "text", "text": "new", "cache_control": {"type": "ephemeral"}},
    ]
    assert replaced["extra"] == 1
    assert msg["content"][1]["text"] == "a"  # input untouched
    assert replace_text(user("old"), "new") == user("new")
    assert replace_text(asst("a", content=None), "x")["content"] == "x"
    assert replace_text({"role": "user", "content": [image]}, "t")["content"] == [
        {"type": "text", "text": "t"},
        image,
    ]
    assert message_text(asst(content=None)) == ""


# --- steps, exchanges, pins -----------------------------------------------------------------


def _check_segmentation(messages: list[Msg]) -> None:
    """Properties that hold for every message list, valid or not."""
    all_steps = steps(messages)
    assistants = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    assert [s.assistant for s in all_steps] == assistants
    seen: set[int] = set()
    for step in all_steps:
        assert not seen.intersection(step.results)
        seen.update(step.results)
        assert all(messages[i]["role"] in ("tool", "function") for i in step.results)
        assert step.start == step.assistant and step.stop == max(step.indices) + 1
    pins = pinned_indices(messages)
    if all_steps:
        assert set(all_steps[-1].indices) <= pins
        # the cheap newest-step path agrees with the full segmentation
        others = pins - set(all_steps[-1].indices)
        assert all(messages[i]["role"] != "tool" for i in others)
    real = [i for i, m in enumerate(messages) if is_real_user(m)]
    if real:
        assert real[0] in pins and real[-1] in pins
    exs = exchanges(messages)
    assert [e.user for e in exs] == real
    for a, b in itertools.pairwise(exs):
        assert a.stop == b.start
    if exs:
        assert exs[-1].stop == len(messages)
        covered = [s.assistant for e in exs for s in e.steps]
        assert covered == [a for a in assistants if a > real[0]]


@pytest.mark.corpus
@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_segmentation_on_real_transcripts(path: Path) -> None:
    messages: list[Msg] = json.loads(path.read_text())
    snapshot = copy.deepcopy(messages)
    _check_segmentation(messages)
    all_steps = steps(messages)
    # The corpus is valid: every tool result is in the block right after its call.
    tools = {i for i, m in enumerate(messages) if m["role"] == "tool"}
    assert {i for s in all_steps for i in s.results} == tools
    for step in all_steps:
        assert step.indices == tuple(range(step.start, step.stop))
    pins = pinned_indices(messages)
    first_user = next(i for i, m in enumerate(messages) if m["role"] == "user")
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    assert first_user in pins and last_user in pins
    assert set(all_steps[-1].indices) <= pins
    expected = {first_user, last_user, *all_steps[-1].indices}
    expected |= {i for i in range(first_user) if messages[i]["role"] == "system"}
    assert pins == expected
    assert messages == snapshot


def test_pins_steps_and_exchanges_with_injected_messages() -> None:
    summary = mark_injected(user("earlier work: ..."), "summary")
    messages = [
        {"role": "system", "content": "sys"},  # 0 pinned
        {"role": "developer", "content": "dev"},  # 1 pinned
        summary,  # 2 injected: not the anchor
        user("fix the bug"),  # 3 anchor
        asst("a", "b"),  # 4
        tool("b"),  # 5 (out of call order, still its block)
        tool("a"),  # 6
        mark_injected(user("file.py"), "reread"),  # 7 injected
        asst(content="done?"),  # 8
        user("also add a test"),  # 9 latest real user
        asst("c"),  # 10 newest step
        user("(typed while the tool ran)"),  # 11 latest real user
        tool("c"),  # 12 misplaced result: belongs to the newest step
    ]
    s = steps(messages)
    assert [(x.assistant, x.results) for x in s] == [(4, (5, 6)), (8, ()), (10, (12,))]
    assert s[-1].start == 10 and s[-1].stop == 13
    assert pinned_indices(messages) == {0, 1, 3, 11, 10, 12}
    ex = exchanges(messages)
    assert [(e.user, e.start, e.stop) for e in ex] == [(3, 3, 9), (9, 9, 11), (11, 11, 13)]
    assert [st.assistant for st in ex[0].steps] == [4, 8]


def test_pairing_follows_ids_not_positions() -> None:
    messages = [
        user("go"),
        asst("x"),  # 1: unanswered (its id is reused later)
        asst("x", "y"),  # 2
        tool("y"),  # 3
        tool("x"),  # 4: answers message 2 (the most recent open call "x")
        tool("x"),  # 5: answers message 1 (the remaining open "x")
        tool("x"),  # 6: duplicate
        tool("z"),  # 7: orphan
    ]
    pairing = pair_tool_calls(messages)
    assert pairing.call_of == {3: (2, 1), 4: (2, 0), 5: (1, 0)}
    assert pairing.duplicates == {6: (2, 0)}
    assert pairing.orphans == (7,)
    assert pairing.unanswered == ()
    s = steps(messages)
    assert [(x.assistant, x.results) for x in s] == [(1, (5,)), (2, (3, 4, 6, 7))]
    assert pinned_indices(messages) == {0, 2, 3, 4, 6, 7}


def test_a_result_never_answers_a_later_call() -> None:
    messages = [user("go"), tool("a"), asst("a")]
    pairing = pair_tool_calls(messages)
    assert pairing.orphans == (1,)
    assert pairing.unanswered == ((2, 0),)
    assert steps(messages)[0].results == ()


def test_result_after_a_plain_reply_belongs_to_the_call_it_answers() -> None:
    messages = [user("go"), asst("a"), asst(content="thinking..."), tool("a")]
    s = steps(messages)
    assert [(x.assistant, x.results) for x in s] == [(1, (3,)), (2, ())]
    assert pinned_indices(messages) == {0, 2}


def test_empty_and_assistant_only_conversations() -> None:
    assert steps([]) == [] and exchanges([]) == [] and pinned_indices([]) == frozenset()
    only = [{"role": "system", "content": "s"}, asst(content="hello")]
    assert pinned_indices(only) == {0, 1}
    assert exchanges(only) == []


# --- property: segmentation is consistent on arbitrary (even broken) histories ---------------

_ids = st.sampled_from(["a", "b", "c"])


@st.composite
def conversations(draw: Callable[..., Any]) -> list[Msg]:
    messages: list[Msg] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": "s"})
    for _ in range(draw(st.integers(0, 14))):
        kind = draw(st.sampled_from(["user", "injected", "asst", "tool", "function"]))
        if kind == "user":
            messages.append(user("u"))
        elif kind == "injected":
            messages.append(mark_injected(user("n"), "notice"))
        elif kind == "asst":
            messages.append(asst(*draw(st.lists(_ids, max_size=3))))
        elif kind == "tool":
            messages.append(tool(draw(_ids)))
        else:
            messages.append({"role": "function", "name": "f", "content": "r"})
    return messages


@settings(max_examples=300)
@given(conversations())
def test_segmentation_is_consistent_on_arbitrary_histories(messages: list[Msg]) -> None:
    _check_segmentation(messages)
    all_steps = steps(messages)
    if all_steps:
        pins = pinned_indices(messages)
        results_elsewhere = {i for s in all_steps[:-1] for i in s.results}
        assert not pins & results_elsewhere
