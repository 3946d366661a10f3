"""The summary schema, its rendering into the summary message, and the title helper."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from conftest import REPO, transcript_paths

from ctxrules.messages import injected_kind, injected_meta, is_injected, is_real_user, message_text
from ctxrules.summarize import (
    FIELDS,
    Summary,
    clean_for_title,
    parse_rendered,
    render_summary,
    summary_message,
    summary_schema,
    title,
    validate_summary,
)
from ctxrules.summarize.render import bridge_message
from ctxrules.summarize.title import FALLBACK_TITLES
from ctxrules.vault import parse_markers

SCHEMA_FILE = REPO / "schemas" / "summary.v1.schema.json"


def full_summary(**overrides: object) -> dict[str, object]:
    data: dict[str, object] = {name: [] for name in FIELDS}
    data["user_goal"] = "Fix the failing migration test"
    data["completed_actions"] = ["Ran pytest tests/test_migrations.py: 2 failures"]
    data.update(overrides)
    return data


def test_schema_has_the_fourteen_documented_fields_and_limits() -> None:
    schema = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema == summary_schema()
    assert len(FIELDS) == 14 and tuple(schema["properties"]) == FIELDS
    assert set(schema["required"]) == set(FIELDS)
    for name, prop in schema["properties"].items():
        assert prop.get("title") and len(prop.get("description", "")) > 20, name
    assert schema["properties"]["blocked_items"]["maxItems"] == 3
    assert schema["properties"]["next_steps"]["maxItems"] == 5
    assert FIELDS[-2:] == ("blocked_items", "next_steps")


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"blocked_items": ["a", "b", "c", "d"]}, "blocked_items"),
        ({"next_steps": [str(i) for i in range(6)]}, "next_steps"),
        ({"user_goal": "   "}, "user_goal"),
        ({"risks": "one risk"}, "risks"),
        ({"extra": []}, "summary"),
        ({"errors": [""]}, "errors/0"),
    ],
)
def test_validation_names_the_field(change: dict[str, object], problem: str) -> None:
    errors = validate_summary(full_summary(**change))
    assert errors and any(e.startswith(problem) for e in errors), errors


def test_a_missing_field_fails_validation() -> None:
    data = full_summary()
    del data["risks"]
    assert any("risks" in e for e in validate_summary(data))
    assert validate_summary(["not", "an", "object"]) == ["expected a JSON object, got list"]
    assert validate_summary(full_summary()) == []


def test_rendering_puts_blocked_items_and_next_steps_last() -> None:
    summary = Summary.from_dict(
        full_summary(
            blocked_items=["CI is red on main"],
            next_steps=["Fix the enum serializer", "Rerun the suite"],
            key_facts=["Django 3.1"],
            relevant_files=["django/db/migrations/serializer.py"],
        )
    )
    text = render_summary(summary)
    lines = text.splitlines()
    assert lines[0] == "User goal: Fix the failing migration test"
    assert text.index("Blocked items:") > text.index("Key facts:")
    assert text.rstrip().endswith("2. Rerun the suite")
    assert "Risks:" not in text  # empty fields are left out


def test_the_summary_message_is_a_marked_assistant_message_that_round_trips() -> None:
    summary = Summary.from_dict(full_summary(next_steps=["Patch it"], errors=["multi\nline"]))
    marker = f"[ctxrules:elided kind=message count=12 ref=vault://{'a' * 64}]"
    msg = summary_message(summary, marker=marker, source="llm", removed=12, model="gpt-4o-mini")
    assert msg["role"] == "assistant" and is_injected(msg) and not is_real_user(msg)
    assert set(msg) == {"role", "content"}, "nothing but the text marks it"
    assert injected_kind(msg) == "summary" and injected_meta(msg)["id"] == summary.id
    text = message_text(msg)
    assert text.startswith(f'<ctxrules:summary id="{summary.id}" source="llm" messages="12" model="gpt-4o-mini" sig="')
    assert text.endswith("</ctxrules:summary>")
    assert [m.count for m in parse_markers(text)] == [12]
    back = parse_rendered(text)
    assert back is not None
    assert back.as_dict() == {**summary.as_dict(), "errors": ["multi line"]}
    # The signed tag survives a round trip through a strict SDK model; an edit breaks it.
    assert is_injected({"role": "assistant", "content": text})
    assert not is_injected({"role": "assistant", "content": text.replace("Patch it", "Patch that")})


def test_bridges_are_marked_user_turns_never_real_users() -> None:
    for position in ("before", "after"):
        msg = bridge_message(position)
        assert msg["role"] == "user" and is_injected(msg) and not is_real_user(msg)
    with pytest.raises(ValueError):
        bridge_message("middle")


def test_parse_rendered_rejects_other_text() -> None:
    assert parse_rendered("hello") is None
    assert parse_rendered("User goal: \n") is None


# --- title helper -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "expected"),
    [
        ("```python\nprint('hi')\n```", FALLBACK_TITLES["code"]),
        ("https://example.com/a?b=1 https://x.org", FALLBACK_TITLES["link"]),
        ("<div><br/></div>&nbsp;", FALLBACK_TITLES["markup"]),
        ("   ", FALLBACK_TITLES["empty"]),
        (
            "Fix the login bug in `auth.py`, see https://github.com/o/r/issues/3\n```\nTraceback\n```",
            "Fix the login bug in auth.py, see",
        ),
        ("帮我修复登录页面的问题。然后部署", "帮我修复登录页面的问题"),
        ("# Release checklist\nmore", "Release checklist"),
    ],
)
def test_title_strips_code_urls_and_html(first: str, expected: str) -> None:
    assert title(first) == expected


def test_title_cuts_at_a_word_boundary_and_accepts_messages() -> None:
    long = "Please refactor the payment reconciliation service so that retries are idempotent and logged"
    out = title({"role": "user", "content": [{"type": "text", "text": long}]}, max_chars=40)
    assert len(out) <= 40 and out.endswith("…") and not out[:-1].endswith(" ")
    assert long.startswith(out[:-1])


@pytest.mark.corpus
def test_title_of_every_real_first_message_is_short_and_code_free() -> None:
    for path in transcript_paths():
        messages = json.loads(Path(path).read_text(encoding="utf-8"))
        first = next((m for m in messages if m["role"] == "user"), None)
        if first is None:
            continue
        out = title(first)
        assert 0 < len(out) <= 60, (path.name, out)
        assert "```" not in out and "http" not in out and "<" not in out, (path.name, out)
        assert clean_for_title(first) == "" or out in FALLBACK_TITLES.values() or out[:10] in clean_for_title(first)
