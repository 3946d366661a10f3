"""The pack's ``priorities:`` rules: conditions, first match wins, and the default pack."""

from __future__ import annotations

import json
from typing import Any

import pytest
from compress_kit import call, default_pack, step, system, user
from conftest import TRANSCRIPTS

from ctxrules.messages import mark_injected
from ctxrules.priorities import (
    PRIORITIES,
    evaluate_priorities,
    priority_rank,
    priority_rules,
)

Msg = dict[str, Any]


def rule(ident: str, match: dict[str, Any], priority: str = "critical", **extra: Any) -> dict[str, Any]:
    return {"id": ident, "match": match, "priority": priority, **extra}


def pack_with(*rules: dict[str, Any]) -> dict[str, Any]:
    pack = default_pack()
    pack["priorities"] = list(rules)
    return pack


def history() -> list[Msg]:
    """0 system, 1 user, then steps: 2-3 Read ok, 4-5 Bash error, 6-7 Bash ok, 8 user,
    9-10 Grep ok, 11-12 Bash error."""
    return [
        system(),
        user("Fix src/app.py please"),
        *step("c1", "def main(): ...", name="Read", file_path="src/app.py"),
        *step("c2", "Traceback (most recent call last):\n  boom\nExit code 1"),
        *step("c3", "all good\nExit code 0"),
        user("and the tests?"),
        *step("c4", "tests/test_app.py:3: match", name="Grep", pattern="x"),
        *step("c5", "FAILED tests/test_app.py\nExit code 2"),
    ]


def test_default_pack_rules_errors_recent_rest() -> None:
    got = evaluate_priorities(history(), default_pack())
    # errors within 3 steps: only the newest error result (index 12) is within 3 steps.
    assert got[12] == "critical"
    # The older error (index 5) is 4 steps back: within 5 steps -> important.
    assert got[5] == "important"
    # within 5 steps = from the assistant of the 5th newest step (index 2) on.
    assert all(got[i] == "important" for i in (2, 3, 4, 6, 7, 8, 9, 10, 11))
    # before the first step: standard.
    assert got[0] == got[1] == "standard"


def test_first_match_wins() -> None:
    msgs = history()
    tool_critical, all_important = rule("a", {"role": "tool"}), rule("b", {}, "important")
    a = evaluate_priorities(msgs, pack_with(tool_critical, all_important))
    b = evaluate_priorities(msgs, pack_with(all_important, tool_critical))
    assert a[3] == "critical" and b[3] == "important"


def test_unmatched_messages_are_standard_and_no_rules_means_standard() -> None:
    msgs = history()
    assert evaluate_priorities(msgs, pack_with(rule("x", {"role": "system"})))[1] == "standard"
    assert evaluate_priorities(msgs, pack_with()) == ["standard"] * len(msgs)


@pytest.mark.parametrize(
    ("match", "expected"),
    [
        ({"role": "tool"}, {3, 5, 7, 10, 12}),
        ({"role": "user"}, {1, 8}),
        ({"error": True}, {5, 12}),
        ({"error": True, "within_steps": 1}, {12}),
        ({"error": False, "role": "tool"}, {3, 7, 10}),
        ({"within_steps": 0}, set()),
        ({"within_steps": 2}, {9, 10, 11, 12}),
        ({"within_steps": 99}, set(range(2, 13))),
        ({"tool": "Read"}, {2, 3}),
        ({"tool": ["Gr*", "Read"]}, {2, 3, 9, 10}),
        ({"tool_role": "shell"}, {4, 5, 6, 7, 11, 12}),
        ({"tool_role": "search", "role": "assistant"}, {9}),
        ({"contains": r"src/app\.py"}, {1}),  # text only: the Read call names it in arguments
        ({"contains": r"(?i)traceback"}, {5}),
        ({"injected": True}, set()),
    ],
)
def test_each_condition(match: dict[str, Any], expected: set[int]) -> None:
    got = evaluate_priorities(history(), pack_with(rule("r", match)))
    assert {i for i, p in enumerate(got) if p == "critical"} == expected


def test_injected_and_legacy_function_results() -> None:
    msgs = [
        user("go"),
        mark_injected({"role": "user", "content": "notes"}, "notes"),
        {"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": "{}"}},
        {"role": "function", "name": "f", "content": "Exit code 3"},
    ]
    errors = rule("t", {"role": "tool", "error": True}, "important")
    got = evaluate_priorities(msgs, pack_with(rule("i", {"injected": True}), errors))
    assert got == ["standard", "critical", "standard", "important"]


def test_disabled_rules_are_skipped_and_bad_regex_names_the_rule() -> None:
    msgs = history()
    got = evaluate_priorities(msgs, pack_with(rule("off", {}, enabled=False)))
    assert set(got) == {"standard"}
    with pytest.raises(ValueError, match=r"rule 'broken'.*does not compile"):
        priority_rules(pack_with(rule("broken", {"contains": "("})))


def test_rules_are_compiled_once_per_pack_content() -> None:
    a, b = default_pack(), default_pack()
    assert a is not b
    assert priority_rules(a) is priority_rules(b)
    b["priorities"][0]["priority"] = "important"
    assert priority_rules(a) is not priority_rules(b)


def test_tool_names_come_from_the_answered_call_even_with_several_calls() -> None:
    msgs = [
        user("go"),
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [call("a", "Read", file_path="x"), call("b", "Bash", command="ls")],
        },
        {"role": "tool", "tool_call_id": "b", "content": "bash out"},
        {"role": "tool", "tool_call_id": "a", "content": "file"},
    ]
    got = evaluate_priorities(msgs, pack_with(rule("r", {"tool": "Read", "role": "tool"})))
    assert got == ["standard", "standard", "standard", "critical"]


def test_rank_orders_the_three_priorities() -> None:
    assert [priority_rank(p) for p in PRIORITIES] == [2, 1, 0]


@pytest.mark.corpus
def test_golden_minisweagent_transcript() -> None:
    """A real transcript: errors in the newest 3 steps are critical, the newest 5 steps
    important, the rest standard; numbers checked against an independent count."""
    msgs = json.loads((TRANSCRIPTS / "minisweagent-pytest-dev__pytest-7521.json").read_text())
    got = evaluate_priorities(msgs, default_pack())
    assistants = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    b3, b5 = assistants[-3], assistants[-5]

    def failed(m: Msg) -> bool:
        import re

        code = re.search(r"<returncode>(-?\d+)</returncode>", m["content"])
        return m["role"] == "tool" and code is not None and code.group(1) != "0"

    for i, m in enumerate(msgs):
        if i >= b3 and failed(m):
            assert got[i] == "critical", i
        elif i >= b5:
            assert got[i] == "important", i
        else:
            assert got[i] == "standard", i
    assert got.count("important") > 0


def _walked(rules: Any, messages: list[Msg]) -> list[str]:
    """Every message through the rules one by one (what evaluate() must give)."""
    from ctxrules.priorities import _Facts

    names = rules._tool_names(messages)
    starts = rules._step_starts(messages)
    return [
        rules._first_match(i, m, _Facts(str(m.get("role")), names.get(i, ())), starts) for i, m in enumerate(messages)
    ]


_MATCHES: list[dict[str, Any]] = [
    {},
    {"within_steps": 1},
    {"within_steps": 3},
    {"within_steps": 0},
    {"within_steps": 50},
    {"role": "tool"},
    {"role": "user", "within_steps": 2},
    {"role": "tool", "error": True, "within_steps": 3},
    {"tools": ["Bash"]},
    {"injected": True},
    {"contains": "app"},
]


@pytest.mark.parametrize("shape", range(40))
def test_older_messages_get_what_the_rules_give_them_one_by_one(shape: int) -> None:
    # evaluate() decides the messages older than every step window at once when the first
    # rule without a window asks nothing: the same priorities as the walk over each message.
    import random

    rng = random.Random(shape)
    chosen = [
        rule(f"r{k}", dict(rng.choice(_MATCHES)), rng.choice(["critical", "important", "standard"]))
        for k in range(rng.randint(0, 4))
    ]
    messages = history() if shape % 3 else [system(), user("only a question")]
    messages = messages * rng.randint(1, 4)
    rules = priority_rules(pack_with(*chosen))
    assert rules.evaluate(messages) == _walked(rules, messages)
