"""Session notes: the API (``session.notes``) and the ``notes.render`` stage."""

from __future__ import annotations

import json
import stat
import threading
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from compress_kit import filler, make_ctx, step, system, text_of, user

from ctxrules import Engine
from ctxrules.messages import injected_kind, is_injected, is_real_user
from ctxrules.notes import NOTES_FILE, NotesError, SessionNotes, load_notes
from ctxrules.stages.base import options_schema_for
from ctxrules.stages.notes_render import STAGE_TYPE, NotesRender
from ctxrules.vault import parse_markers

Msg = dict[str, Any]


# --- the API ------------------------------------------------------------------------------------


def test_add_update_remove_list(tmp_path: Path) -> None:
    notes = SessionNotes(tmp_path / "s", clock=lambda: 100.0)
    a = notes.add("tests live in tests/unit", tags=["testing"])
    b = notes.add("the CI runs on Python 3.11", id="ci")
    assert (a.id, b.id) == ("n1", "ci")
    assert [n.id for n in notes.list()] == ["n1", "ci"]
    changed = notes.update("n1", "tests live in tests/unit and tests/e2e")
    assert changed.text.endswith("e2e") and changed.tags == ("testing",)
    assert notes.update("ci", tags=("infra",)).tags == ("infra",)
    assert notes.remove("n1").id == "n1"
    assert [n.id for n in notes.list()] == ["ci"] and len(notes) == 1
    assert notes.add("third").id == "n2", "ids are never reused"
    assert notes.get("n2").text == "third"
    assert notes.clear() == 2 and notes.list() == []


def test_file_is_private_and_valid_json(tmp_path: Path) -> None:
    notes = SessionNotes(tmp_path / "s")
    notes.add("x")
    path = tmp_path / "s" / NOTES_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    data = json.loads(path.read_text())
    assert data["version"] == 1 and data["notes"][0]["text"] == "x"
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda n: n.add(""), "must not be empty"),
        (lambda n: n.add(42), "must be a string"),
        (lambda n: n.add("x" * 20_001), "limited to 20000"),
        (lambda n: n.add("bad \ud800 text"), "valid Unicode"),
        (lambda n: n.add("x", tags="testing"), "not the string"),
        (lambda n: n.add("x", tags=["a,b"]), "invalid tag"),
        (lambda n: n.add("x", id="has space"), "invalid note id"),
        (lambda n: n.update("nope", "x"), "no note with id 'nope'"),
        (lambda n: n.update("nope"), "needs a new text or new tags"),
        (lambda n: n.remove("nope"), "no note with id"),
        (lambda n: n.get("nope"), "no note with id"),
    ],
)
def test_bad_input_is_a_clear_error(tmp_path: Path, call: Any, message: str) -> None:
    with pytest.raises(NotesError, match=message):
        call(SessionNotes(tmp_path / "s"))


def test_duplicate_id_and_a_damaged_file(tmp_path: Path) -> None:
    notes = SessionNotes(tmp_path / "s")
    notes.add("one", id="k")
    with pytest.raises(NotesError, match="exists already"):
        notes.add("two", id="k")
    (tmp_path / "s" / NOTES_FILE).write_text("{not json")
    with pytest.raises(NotesError, match="not valid JSON"):
        notes.list()


def test_a_notes_file_nested_past_the_stack_is_a_damaged_file(tmp_path: Path) -> None:
    """json.loads raised RecursionError, which left notes.list()/add() as a bare exception and
    failed the notes stage (skipped with the RecursionError as its warning)."""
    notes = SessionNotes(tmp_path / "s")
    notes.add("one")
    (tmp_path / "s" / NOTES_FILE).write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(NotesError, match="not valid JSON"):
        notes.list()
    with pytest.raises(NotesError, match="not valid JSON"):
        notes.add("two")
    session = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o")
    warnings = session.prepare([{"role": "user", "content": "hi"}]).report["warnings"]
    assert any(w.startswith("notes: the notes file") and "not valid JSON" in w for w in warnings), warnings


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    def writer(k: int) -> None:
        own = SessionNotes(tmp_path / "s")
        for j in range(15):
            own.add(f"writer {k} note {j}")

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    listed = SessionNotes(tmp_path / "s").list()
    assert len(listed) == 90 and len({n.id for n in listed}) == 90


def test_session_notes_is_lazy_and_shared(tmp_path: Path) -> None:
    session = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o")
    assert session.notes is session.notes
    assert not (tmp_path / "s" / NOTES_FILE).exists()
    session.notes.add("remember the flaky test")
    assert [n.text for n in load_notes(tmp_path / "s")] == ["remember the flaky test"]


# --- the stage ----------------------------------------------------------------------------------


def history() -> list[Msg]:
    return [system(), user("build it"), *step("a", "ok"), *step("b", "done")]


def notes_messages(messages: list[Msg]) -> list[int]:
    return [i for i, m in enumerate(messages) if is_injected(m) and injected_kind(m) == "notes"]


def test_renders_one_marked_message_at_the_end(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    SessionNotes(ctx.vault.root.parent).add("use tabs\nnot spaces", tags=["style"])
    SessionNotes(ctx.vault.root.parent).add("the DB is sqlite")
    msgs = history()
    out = NotesRender({})(msgs, ctx)
    [at] = notes_messages(out.messages)
    assert at == len(msgs) and out.messages[:at] == msgs
    msg = out.messages[at]
    assert msg["role"] == "user" and not is_real_user(msg)
    text = text_of(msg)
    assert text.startswith('<ctxrules:notes count="2" sig="')
    assert "- [n1] use tabs\n  not spaces\n  tags: style" in text
    assert "- [n2] the DB is sqlite" in text


def test_goes_before_a_trailing_real_user_message_and_after_system(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    SessionNotes(ctx.vault.root.parent).add("x")
    msgs = [*history(), user("next ask")]
    assert notes_messages(NotesRender({})(msgs, ctx).messages) == [len(msgs) - 1]
    assert notes_messages(NotesRender({"placement": "after_system"})(msgs, ctx).messages) == [1]


def test_unchanged_notes_stay_in_place_changed_notes_move_to_the_end(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    notes = SessionNotes(ctx.vault.root.parent)
    notes.add("first")
    stage = NotesRender({})
    first = stage(history(), ctx).messages
    grown = [*first, *step("c", "more"), user("and now?")]
    again = stage(grown, ctx)
    assert again.messages == grown and again.actions == []
    notes.add("second")
    moved = stage(grown, ctx)
    [at] = notes_messages(moved.messages)
    assert at == len(moved.messages) - 2 and "second" in text_of(moved.messages[at])
    assert moved.messages[-1] == user("and now?"), "the ask stays last"
    old = [a for a in moved.actions if a.kind == "replace"]
    assert old and ctx.vault.get_text(old[0].vault_id) == text_of(first[notes_messages(first)[0]])
    notes.clear()
    gone = stage(moved.messages, ctx)
    assert notes_messages(gone.messages) == [] and gone.actions[0].kind == "remove"


def test_no_notes_no_message(tmp_path: Path) -> None:
    msgs = history()
    out = NotesRender({})(msgs, make_ctx(tmp_path))
    assert out.messages == msgs and out.actions == []


def test_over_budget_keeps_the_newest_and_points_at_the_rest(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    notes = SessionNotes(ctx.vault.root.parent)
    for n in range(30):
        notes.add(f"fact number {n}: " + "detail " * 20)
    out = NotesRender({"max_tokens": 400})(history(), ctx)
    [at] = notes_messages(out.messages)
    msg = out.messages[at]
    assert ctx.counter.count_message(msg) <= 400
    text = text_of(msg)
    assert "fact number 29" in text and "fact number 0:" not in text
    (marker,) = parse_markers(text)
    assert "fact number 0:" in ctx.vault.get_text(marker.vault_id)


def test_never_lifts_utilization_to_the_ceiling(tmp_path: Path) -> None:
    msgs = [system(), user("go"), *step("a", filler(1150, "big"))]
    ctx = make_ctx(tmp_path, window=32_000)
    assert ctx.budget.tier(ctx.count(msgs)) == "full"
    SessionNotes(ctx.vault.root.parent).add("x " * 3000)
    out = NotesRender({})(msgs, ctx)
    assert notes_messages(out.messages) == [] and out.warnings
    assert ctx.budget.tier(ctx.count(out.messages)) != "emergency"


def test_a_damaged_notes_file_is_a_warning_not_a_failure(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    ctx.vault.root.parent.mkdir(parents=True)
    (ctx.vault.root.parent / NOTES_FILE).write_text("[]")
    out = NotesRender({})(history(), ctx)
    assert out.messages == history() and "notes" in out.warnings[0]


def test_through_the_engine_rendering_is_stable(tmp_path: Path) -> None:
    session = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o")
    session.notes.add("the API key lives in .env, never print it")
    msgs = history()
    first = session.prepare(msgs)
    assert len(notes_messages(first.messages)) == 1
    assert any(s["id"] == "notes" and s["ran"] for s in first.report["stages"])
    second = session.prepare([*msgs, user("thanks")])
    assert second.messages[: len(first.messages)] == first.messages, "the prefix stays byte-stable"


def test_option_schema_documents_every_option() -> None:
    schema = options_schema_for(STAGE_TYPE)
    jsonschema.Draft202012Validator.check_schema(schema)
    for name, prop in schema["properties"].items():
        assert prop.get("title") and prop.get("description"), name
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"placement": "middle"}, schema)
