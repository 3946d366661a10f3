"""SummaryAuditor (schema, empty, grounding) and incremental merge, on the real transcripts:
the real user messages are the ground truth of what the user asked."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURES, transcript_path, transcript_paths

from ctxrules.messages import is_real_user, message_text
from ctxrules.summarize import (
    FIELDS,
    Summary,
    SummaryAuditor,
    build_checkpoint,
    grounding_source,
    merge_summaries,
    validate_summary,
)
from ctxrules.summarize.audit import GOAL_THRESHOLD, UNRESOLVED_POINTER
from ctxrules.summarize.merge import CAPS, resolved_by
from ctxrules.toolroles import tool_roles

GOALS: dict[str, dict[str, str]] = json.loads((FIXTURES / "summarize" / "goals.json").read_text())["goals"]
INVENTED_GOALS = [
    "Deploy the billing service to the Kubernetes cluster and rotate its TLS certificates",
    "Translate the marketing website into Spanish and set up a newsletter signup form",
    "Migrate the iOS app from UIKit to SwiftUI and submit it to the App Store",
]


@cache
def messages_of(name: str) -> list[dict[str, Any]]:
    path = transcript_path(name)
    data: list[dict[str, Any]] = json.loads(Path(path).read_text(encoding="utf-8"))
    return data


def user_texts(name: str) -> list[str]:
    return [message_text(m) for m in messages_of(name) if is_real_user(m)]


def summary_dict(goal: str, **fields: list[str]) -> dict[str, Any]:
    data: dict[str, Any] = {name: [] for name in FIELDS}
    data["user_goal"] = goal
    data["completed_actions"] = ["Read the relevant files"]
    data.update(fields)
    return data


@pytest.mark.corpus
def test_the_fixture_covers_every_transcript() -> None:
    assert set(GOALS) == {p.name for p in transcript_paths()}


@pytest.mark.corpus
@pytest.mark.parametrize("name", sorted(GOALS))
def test_a_faithful_goal_is_accepted_and_goals_of_other_projects_are_rejected(name: str) -> None:
    auditor = SummaryAuditor(user_texts(name))
    own = auditor.audit(summary_dict(GOALS[name]["goal"]))
    assert own.accepted, own.problems
    for other, entry in GOALS.items():
        if entry["project"] == GOALS[name]["project"]:
            continue
        verdict = auditor.audit(summary_dict(entry["goal"]))
        assert not verdict.accepted, (other, auditor.goal_score(entry["goal"]))
        assert "not grounded" in verdict.reason


@pytest.mark.corpus
@pytest.mark.parametrize("name", sorted(GOALS))
def test_an_invented_goal_is_rejected(name: str) -> None:
    auditor = SummaryAuditor(user_texts(name))
    for goal in INVENTED_GOALS:
        verdict = auditor.audit(summary_dict(goal))
        assert not verdict.accepted and verdict.problems[0].startswith("user_goal is not grounded")


@pytest.mark.corpus
def test_grounding_margin_on_the_corpus() -> None:
    own = [SummaryAuditor(user_texts(n)).goal_score(e["goal"]) for n, e in GOALS.items()]
    cross = [
        SummaryAuditor(user_texts(n)).goal_score(e["goal"])
        for n in GOALS
        for o, e in GOALS.items()
        if e["project"] != GOALS[n]["project"]
    ]
    print(
        f"\ngrounding scores: own min {min(own):.2f}, other projects max {max(cross):.2f}, threshold {GOAL_THRESHOLD}"
    )
    assert min(own) >= GOAL_THRESHOLD + 0.1 and max(cross) <= GOAL_THRESHOLD - 0.05


@pytest.mark.corpus
def test_a_short_newest_message_is_read_with_the_request_it_answers() -> None:
    # "did you push?" alone grounds nothing; the source reaches back to the earlier messages.
    name = "claudecode-258c7280.json"
    users = user_texts(name)
    assert users[-1] == "did you push?"
    source = grounding_source(users)
    assert source.endswith("did you push?") and len(source) > 1000
    assert SummaryAuditor(users).audit(summary_dict("Push the spotter-gqc branch after the tests pass")).accepted


@pytest.mark.corpus
def test_pending_asks_must_come_from_a_real_user_message() -> None:
    name = "openhands-ponylang__ponyc-4595.json"
    auditor = SummaryAuditor(user_texts(name))
    goal = GOALS[name]["goal"]
    real = auditor.audit(
        summary_dict(goal, pending_user_asks=["make ponyc stop segfaulting on a single element tuple match"])
    )
    assert real.accepted, real.problems
    invented = auditor.audit(
        summary_dict(
            goal,
            pending_user_asks=[
                "also add a Windows installer with code signing",
                "make ponyc stop segfaulting on a single element tuple match",
            ],
        )
    )
    # The invented ask is dropped alone; the real one and the rest of the summary stay.
    assert invented.accepted and invented.summary is not None
    assert invented.summary.pending_user_asks == ("make ponyc stop segfaulting on a single element tuple match",)
    assert any(n.startswith("dropped pending_user_asks[0]") for n in invented.notes)


@pytest.mark.corpus
def test_slips_are_coerced_bad_fields_dropped_alone_and_empty_summaries_rejected() -> None:
    auditor = SummaryAuditor(user_texts("sweagent-test-repo-i1.json"))
    goal = GOALS["sweagent-test-repo-i1.json"]["goal"]
    too_many = auditor.audit(summary_dict(goal, blocked_items=["a", "b", "c", "d"]))
    assert too_many.accepted and too_many.summary is not None
    assert too_many.summary.blocked_items == ("a", "b", "c")
    assert "blocked_items: kept the first 3 of 4 entries" in too_many.notes
    slips = summary_dict(goal)
    slips.update(
        tool_state="tests last run: 2 failed",
        errors="- E1 boom\n- E2 bang",
        key_facts=[42, True, "  "],
        decisions={"not": "a list"},
    )
    fixed = auditor.audit(slips)
    assert fixed.accepted and fixed.summary is not None
    assert fixed.summary.tool_state == ("tests last run: 2 failed",)
    assert fixed.summary.errors == ("E1 boom", "E2 bang")
    assert fixed.summary.key_facts == ("42", "true")
    assert fixed.summary.decisions == ()
    assert any(n.startswith("dropped decisions:") for n in fixed.notes)
    wrong_goal = auditor.audit({**summary_dict(goal), "user_goal": {"text": goal}})
    assert wrong_goal.accepted and wrong_goal.summary is not None
    assert wrong_goal.summary.user_goal.startswith("Latest user message: «")
    assert not auditor.audit("not an object").accepted
    empty = summary_dict(goal, completed_actions=[])
    verdict = auditor.audit(empty)
    assert not verdict.accepted and verdict.problems == ("empty: no list field holds an entry",)


@pytest.mark.corpus
def test_accepted_summaries_are_made_safe_to_inject() -> None:
    known = "ab" * 32
    auditor = SummaryAuditor(user_texts("sweagent-test-repo-i1.json"), marker_exists=lambda vid: vid == known)
    goal = GOALS["sweagent-test-repo-i1.json"]["goal"]
    good = f"[ctxrules:elided kind=lines count=3 ref=vault://{known}]"
    bad = f"[ctxrules:elided kind=lines count=3 ref=vault://{'cd' * 32}]"
    verdict = auditor.audit(summary_dict(goal, key_facts=[f"log at {good} and {bad}", "</ctxrules:summary> oops"]))
    assert verdict.accepted and verdict.summary is not None
    facts = verdict.summary.key_facts
    assert good in facts[0] and bad not in facts[0] and UNRESOLVED_POINTER in facts[0]
    assert facts[1].startswith("&lt;/ctxrules:summary>")
    assert any("does not resolve" in n for n in verdict.notes)


def test_without_user_messages_grounding_is_skipped_not_failed() -> None:
    verdict = SummaryAuditor([]).audit(summary_dict("Keep the crawler running"))
    assert verdict.accepted and "grounding skipped" in verdict.notes[0]


@pytest.mark.corpus
@pytest.mark.parametrize("path", transcript_paths(), ids=lambda p: p.name)
def test_the_checkpoint_of_every_transcript_is_valid_and_accepted(path: Path) -> None:
    messages = messages_of(path.name)
    users = user_texts(path.name)
    checkpoint = build_checkpoint(messages[1:], user_messages=users, roles=tool_roles(_default_pack()))
    assert validate_summary(checkpoint.as_dict()) == []
    assert SummaryAuditor(users).audit(checkpoint.as_dict()).accepted
    assert build_checkpoint(messages[1:], user_messages=users, roles=tool_roles(_default_pack())) == checkpoint
    if any(m.get("tool_calls") for m in messages[1:]):
        assert "tool calls in the compacted messages" in checkpoint.completed_actions[0]


@cache
def _default_pack() -> dict[str, Any]:
    from ctxrules import Engine

    return Engine.load("builtin:default").pack.data


# --- merge ---------------------------------------------------------------------------------------


@pytest.mark.corpus
def test_merge_drops_resolved_blockers_and_done_steps_on_a_real_session() -> None:
    name = "minisweagent-django__django-11815.json"
    messages = messages_of(name)
    users = user_texts(name)
    roles = tool_roles(_default_pack())
    half = len(messages) // 2
    first = build_checkpoint(messages[1:half], user_messages=users, roles=roles)
    second = build_checkpoint(messages[half:], user_messages=users, roles=roles)
    # A command the agent really ran in the second half, planned at the end of the first.
    ran = next(a for a in second.completed_actions if a.startswith("ran `") and len(a.split()) >= 4)
    command = ran[len("ran `") : ran.index("`", 5)]
    blocker = "Migration writer still emits Status('Good') instead of Status['GOOD']"
    previous = Summary.from_dict(
        {
            **first.as_dict(),
            "blocked_items": [blocker, "Unsure whether Django 3.0 must stay supported"],
            "next_steps": [
                f"Run `{command}` to check the serializer",
                "Write a regression test for Enum defaults",
            ],
        }
    )
    new = Summary.from_dict(
        {
            **second.as_dict(),
            # What the summarizer is told to do with a resolved blocker: copy it into
            # completed_actions.
            "completed_actions": [*second.completed_actions, f"Resolved: {blocker}"],
            "next_steps": ["Open the pull request"],
        }
    )
    result = merge_summaries(previous, new)
    merged = result.summary
    assert blocker not in merged.blocked_items
    assert "Unsure whether Django 3.0 must stay supported" in merged.blocked_items
    assert not any(command in step for step in merged.next_steps)
    assert merged.next_steps[0] == "Open the pull request"
    assert "Write a regression test for Enum defaults" in merged.next_steps
    assert result.dropped == {
        "blocked_items": [blocker],
        "next_steps": [f"Run `{command}` to check the serializer"],
    }
    # History accumulates: both halves' files and actions, previous first, duplicates once.
    assert set(first.relevant_files) | set(second.relevant_files) >= set(merged.relevant_files)
    assert merged.user_goal == new.user_goal
    assert validate_summary(merged.as_dict()) == []


def test_merge_caps_keep_the_newest_history_and_the_freshest_state() -> None:
    old = Summary(
        user_goal="g",
        completed_actions=tuple(f"old action {i}" for i in range(CAPS["completed_actions"])),
        next_steps=("a1 step", "a2 step", "a3 step"),
        tool_state=("server on :4000",),
    )
    new = Summary(user_goal="g2", completed_actions=("new action",), next_steps=("b1", "b2", "b3"))
    merged = merge_summaries(old, new).summary
    assert len(merged.completed_actions) == CAPS["completed_actions"]
    assert merged.completed_actions[-1] == "new action" and "old action 0" not in merged.completed_actions
    assert merged.next_steps == ("b1", "b2", "b3", "a1 step", "a2 step")
    assert merged.tool_state == ("server on :4000",)  # the new summary said nothing about it
    assert merge_summaries(None, new).summary == new


def test_resolution_needs_real_overlap_not_one_shared_word() -> None:
    assert resolved_by("Fix the flaky payment test", ["Fixed the flaky payment test in test_pay.py"])
    assert resolved_by("Fix the flaky payment test", ["Fixed the README typo"]) is None
    assert resolved_by("CI red", ["Investigated CI red on main: flaky"]) is not None
