"""``compress.intent``: the compression intent and the protection it gives."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from compress_kit import filler, make_ctx, step, system, user
from conftest import TRANSCRIPTS

from ctxrules import Engine
from ctxrules.messages import mark_injected
from ctxrules.stages.base import options_schema_for
from ctxrules.stages.compress_intent import STAGE_TYPE, IntentStage, build_intent, extract_terms
from ctxrules.structure import pair_tool_calls, pinned_indices

Msg = dict[str, Any]


# --- extraction ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "files", "modules"),
    [
        ("Please fix src/x.py", ["src/x.py"], []),
        ("see a/b/c.ts and ./run.sh", ["a/b/c.ts", "run.sh"], []),
        ("/abs/path/Makefile.am, ../up.py and ~/h.toml", ["/abs/path/Makefile.am", "../up.py", "~/h.toml"], []),
        ("edit setup.cfg then README.md.", ["setup.cfg", "README.md"], []),
        ("import ctxrules.stages.base and django.db.models", [], ["ctxrules.stages.base", "django.db.models"]),
        ("e.g. self.value, ds.Rows, np.array(x), github.com, v1.2.3, i.e. done", [], []),
        ("https://github.com/o/r/blob/main/x.py is a URL", [], []),
        ("src/x.pyc is not src/x.py", ["src/x.pyc", "src/x.py"], []),
        ("the notes.txt", ["notes.txt"], []),
        ("nothing here at all", [], []),
    ],
)
def test_extract_terms(text: str, files: list[str], modules: list[str]) -> None:
    assert extract_terms(text) == (files, modules)


def test_extract_terms_caps_the_number_of_terms() -> None:
    text = " ".join(f"pkg/mod{i}.py" for i in range(100))
    assert len(extract_terms(text, limit=10)[0]) == 10


def test_intent_reads_the_latest_real_user_message_recent_steps_and_failures() -> None:
    msgs = [
        system(),
        user("Look at old/first.py"),
        *step("a", "ok", text="I will check lib/util.py next"),
        *step("b", "Traceback (most recent call last):\nboom\nExit code 1"),
        user("Now fix src/x.py in package app.core.parser"),
        mark_injected(user("<ctxrules:notes> mentions secret/ignored.py"), "notes"),
        *step("c", "fine", text="Editing src/y.py"),
    ]
    pack = make_ctx(Path("/nonexistent")).pack
    intent = build_intent(msgs, pack)
    # The ask first, then the assistant's text in the newest 3 steps, newest first.
    assert intent.files == ["src/x.py", "src/y.py", "lib/util.py"]
    assert intent.modules == ["app.core.parser"]
    assert intent.failed_calls == ["b"]
    assert build_intent(msgs, pack, history_steps=2).files == ["src/x.py", "src/y.py"]
    narrow = build_intent(msgs, pack, history_steps=0, failed_steps=1)
    assert narrow.files == ["src/x.py"] and narrow.failed_calls == []


# --- protection ---------------------------------------------------------------------------------


def history(old_lines: int = 40) -> list[Msg]:
    return [
        system(),
        user("Get started."),
        *step(
            "r1", filler(old_lines, "xpy") + "def parse(): pass  # src/x.py\n", name="Read", file_path="/repo/src/x.py"
        ),
        *step("r2", filler(old_lines, "other"), name="Read", file_path="/repo/src/other.py"),
        *step("g1", "src/x.py:10: match\nsrc/z.py:3: match", name="Grep", pattern="parse"),
        *step("b1", filler(old_lines, "bash")),
        user("Now change src/x.py and app.mod"),
        *step("n1", "app/mod.py imported fine"),
    ]


def test_matching_messages_and_their_call_halves_are_protected(tmp_path: Path) -> None:
    msgs = history()
    ctx = make_ctx(tmp_path)
    out = IntentStage({})(msgs, ctx)
    assert out.messages == msgs and all(a is b for a, b in zip(out.messages, msgs, strict=True))
    protected = {i for i, m in enumerate(msgs) if id(m) in ctx.protected}
    # Read of src/x.py (call in the arguments, result), the grep hit; pins are never listed.
    assert protected == {2, 3, 6, 7}
    assert ctx.state["intent"]["files"] == ["src/x.py"]
    assert ctx.state["intent"]["modules"] == ["app.mod"]
    assert out.actions[0].kind == "intent" and "src/x.py" in out.actions[0].detail


def test_module_matches_its_path_form(tmp_path: Path) -> None:
    msgs = [
        system(),
        user("hi"),
        *step("a", "loaded app/mod.py ok"),
        *step("b", "other"),
        user("what does app.mod do?"),
    ]
    ctx = make_ctx(tmp_path)
    IntentStage({})(msgs, ctx)
    assert {i for i, m in enumerate(msgs) if id(m) in ctx.protected} == {2, 3}


def test_failed_calls_are_protected_within_the_window(tmp_path: Path) -> None:
    msgs = [
        system(),
        user("go"),
        *step("old", "Error: bad\nExit code 1"),
        *[m for n in range(6) for m in step(f"s{n}", "ok")],
        *step("new", "fatal: not a repo\nExit code 128"),
        *step("last", "ok"),
    ]
    ctx = make_ctx(tmp_path)
    IntentStage({"failed_steps": 3})(msgs, ctx)
    protected = {
        msgs[i].get("tool_call_id") or msgs[i]["tool_calls"][0]["id"]
        for i, m in enumerate(msgs)
        if id(m) in ctx.protected
    }
    assert protected == {"new"}


def test_protection_is_capped_newest_first(tmp_path: Path) -> None:
    msgs = [
        system(),
        user("start"),
        *[m for n in range(12) for m in step(f"s{n}", filler(60, f"n{n}") + "see src/x.py\n")],
        *step("z", "ok"),
        user("fix src/x.py"),
    ]
    ctx = make_ctx(tmp_path, window=32_000)
    out = IntentStage({"max_share": 0.1})(msgs, ctx)
    counts = ctx.counter.count_each(msgs)
    protected = sorted(i for i, m in enumerate(msgs) if id(m) in ctx.protected)
    assert sum(counts[i] for i in protected) <= 0.1 * ctx.budget.usable
    assert protected and protected[-1] == len(msgs) - 4, "the newest match is kept first"
    assert "over the cap" in out.actions[0].detail


def test_nothing_to_protect_is_silent(tmp_path: Path) -> None:
    msgs = [system(), user("hello"), *step("a", "ok")]
    ctx = make_ctx(tmp_path)
    out = IntentStage({})(msgs, ctx)
    assert out.actions == [] and ctx.protected == set()


def test_option_schema_documents_every_option() -> None:
    schema = options_schema_for(STAGE_TYPE)
    jsonschema.Draft202012Validator.check_schema(schema)
    for name, prop in schema["properties"].items():
        assert prop.get("title") and prop.get("description"), name
    defaults = {k: v["default"] for k, v in schema["properties"].items()}
    jsonschema.validate(defaults, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"max_share": 2}, schema)


@pytest.mark.corpus
def test_golden_openhands_transcript(tmp_path: Path) -> None:
    """The SDK transcript works on telemetry/hello.py: its ask and the steps that touch the
    file are the intent."""
    msgs = json.loads((TRANSCRIPTS / "openhands-sdk-claude-sonnet-4-1757015046.json").read_text())
    ctx = make_ctx(tmp_path)
    IntentStage({})(msgs, ctx)
    assert "hello.py" in ctx.state["intent"]["files"]
    pairing = pair_tool_calls(msgs)
    halves: dict[int, set[int]] = {}
    for result, (owner, _) in pairing.call_of.items():
        halves.setdefault(result, set()).add(owner)
        halves.setdefault(owner, set()).add(result)
    mentions = {i for i, m in enumerate(msgs) if "hello.py" in json.dumps(m)}
    protected = {i for i, m in enumerate(msgs) if id(m) in ctx.protected}
    assert protected
    for i in protected:
        assert i in mentions or halves.get(i, set()) & mentions, i
    pins = pinned_indices(msgs)
    assert mentions - pins - {h for i in mentions for h in halves.get(i, ())} <= protected


# --- the proof the issue asks for ---------------------------------------------------------------


def proof_history() -> list[Msg]:
    """An old assistant message that names src/x.py, then enough steps to reach the full tier
    of a 32K window, then a latest ask that names src/x.py again."""
    old_text = "Notes on src/x.py: the tokenizer splits on spaces only.\n" + filler(90, "analysis")
    msgs: list[Msg] = [
        system(),
        user("Get familiar with the parser package."),
        *step("old", "listing done", text=old_text, command="ls src"),
    ]
    for n in range(26):
        msgs += step(f"s{n}", filler(36, f"step{n}"), command=f"make check-{n}")
    msgs.append(user("Now change src/x.py so that the tokenizer handles tabs."))
    return msgs


def test_an_old_message_naming_the_focus_file_survives_the_full_tier(tmp_path: Path) -> None:
    msgs = proof_history()
    engine = Engine.load("builtin:default")
    session = engine.session(tmp_path / "on", model="gpt-4o", window=32_000)
    assert session.budget.tier(session.counter.count_messages(msgs)) == "full"
    result = session.prepare(msgs)
    ran = {s["id"] for s in result.report["stages"] if s["ran"] and s["tokens_saved"] > 0}
    assert "remove" in ran, result.report["stages"]
    assert msgs[2] in result.messages and msgs[3] in result.messages

    (tmp_path / "no-intent.yaml").write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\n"
        "metadata: {name: no-intent, version: 1.0.0}\n"
        "extends: [builtin:default]\n"
        "pipeline:\n  - {id: intent, enabled: false}\n"
    )
    off = Engine.load(tmp_path / "no-intent.yaml")
    assert "intent" not in [p.id for p in off.plan]
    result = off.session(tmp_path / "off", model="gpt-4o", window=32_000).prepare(msgs)
    assert msgs[2] not in result.messages, "without the intent the old message is compressed"


# --- what the latest ask names ranks first ----------------------------------------------------


def _ask_history(incidental_steps: int = 32) -> list[Msg]:
    """An early read of the file the latest ask names, then many newer steps whose outputs
    mention another file the assistant keeps talking about (incidental mentions)."""
    target = filler(200, "target-src")  # ~2,400 tokens: the file's content
    msgs: list[Msg] = [
        system(),
        user("Get the project building."),
        *step("read-target", target, name="Read", file_path="/repo/src/target.py"),
    ]
    for i in range(incidental_steps):
        msgs += step(
            f"b{i}", filler(45, f"util{i}") + "see lib/util.py for details\n", text="Checking lib/util.py again"
        )
    msgs += [user("Please fix the bug in src/target.py"), *step("last", "ok", text="Looking at lib/util.py first")]
    return msgs


def test_the_file_the_latest_ask_names_survives_when_incidental_mentions_use_up_the_cap(tmp_path: Path) -> None:
    msgs = _ask_history()
    target = msgs[3]["content"]
    engine = Engine.load("builtin:default")
    session = engine.session(tmp_path / "s", model="gpt-4o", window=32_000)
    result = session.prepare(msgs)
    report = result.report
    # The incidental mentions alone are over the protection cap, and the conversation had to be
    # compressed: otherwise this test would prove nothing.
    assert report["before"]["tier"] in ("full", "emergency"), report["before"]
    intent = next(s for s in report["stages"] if s["id"] == "intent")
    assert any("over the cap" in a["detail"] for a in intent["actions"]), intent
    # The read of the asked-about file is in the output verbatim (not reduced, archived or
    # removed), and so is the call that produced it.
    assert any(m.get("content") == target for m in result.messages)
    assert any(
        m.get("role") == "assistant" and any(c["id"] == "read-target" for c in m.get("tool_calls") or [])
        for m in result.messages
    )
    # Warm turns keep it while that ask is the latest.
    more = [*msgs, *step("later", "still fine", text="Now lib/util.py")]
    assert any(m.get("content") == target for m in session.prepare(more).messages)


def test_incidental_mentions_still_lose_the_read_without_the_ask_naming_it(tmp_path: Path) -> None:
    # The same history, but the latest ask names no file: the old read is fair game, which
    # shows the test above depends on the ask's ranking, not on the read being small.
    msgs = _ask_history()
    msgs[-3] = user("Please fix the bug.")
    target = msgs[3]["content"]
    session = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o", window=32_000)
    assert not any(m.get("content") == target for m in session.prepare(msgs).messages)


def test_ask_matches_rank_before_incidental_ones_under_the_cap(tmp_path: Path) -> None:
    msgs = _ask_history(incidental_steps=6)
    # A second, older read of the asked-about file: under the cap, it comes before the newer
    # incidental matches.
    msgs[2:2] = step(
        "read-old", filler(30, "target-old") + "src/target.py\n", name="Read", file_path="/repo/src/target.py"
    )
    # A cap that holds both reads and one incidental step, not all six of them.
    ctx = make_ctx(tmp_path, window=8192 + 10_000)
    IntentStage({"max_share": 0.5})(msgs, ctx)
    protected = {m.get("tool_call_id") for m in msgs if id(m) in ctx.protected}
    assert {"read-old", "read-target", "b5"} <= protected
    assert not {"b0", "b1"} & protected
    assert ctx.state["intent"]["asked"] == ["src/target.py"]


def test_a_spilled_ask_gives_the_same_focus_on_a_run_over_the_output(tmp_path: Path) -> None:
    """Invariant 4: a latest ask over the hard-spill limit was read whole by the first run and as
    its stand-in by a run on that output; the files named past the preview lost their
    protection and the second run removed the steps the first one kept."""
    import copy
    import random
    import shutil

    rnd = random.Random(7)

    def prose(lines: int) -> str:
        words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
        return "\n".join(" ".join(rnd.choice(words) for _ in range(12)) for _ in range(lines))

    files = [f"src/app/part_{i}.py" for i in range(10)]
    history: list[Msg] = [system("You are a coding agent.\n" + prose(100)), user("Fix the failure below.")]
    for i, name in enumerate(files):
        history += step(f"r{i}", f"# {name}\n" + prose(6), "read_file", path=name)
        history += step(f"t{i}", prose(40), "bash", command=f"make test {i}")
    ask = "The log of the failure:\n" + prose(60) + "\nThe files: " + ", ".join(files) + "\n" + prose(400)
    history.append(user(ask))
    engine = Engine.load("builtin:default")
    first = engine.session(tmp_path / "s", model="gpt-4o", window=16000).prepare(copy.deepcopy(history), clock=1.8e9)
    spilled = [a for s in first.report["stages"] for a in s["actions"] if a["kind"] == "spill"]
    assert spilled and first.messages[-1]["content"] != ask, "the ask was not spilled: the test needs it spilled"
    shutil.copytree(tmp_path / "s", tmp_path / "again")
    second = engine.session(tmp_path / "again", model="gpt-4o", window=16000).prepare(
        copy.deepcopy(first.messages), clock=1.8e9
    )
    focus = [
        a["detail"] for r in (first, second) for s in r.report["stages"] if s["id"] == "intent" for a in s["actions"]
    ]
    assert focus[0] == focus[1] and all(name in focus[0] for name in files)
    assert second.messages == first.messages


def test_the_newest_read_of_an_asked_file_is_protected_over_the_cap(tmp_path: Path) -> None:
    """docs/stages-compression.md: for each file the latest ask names, the newest message that
    mentions it is protected whatever its size. The newest mention was the ask itself (pinned,
    kept anyway), so a read over the cap went unprotected."""
    msgs = [
        system(),
        user("Get it building."),
        *step("read", filler(600, "target"), name="Read", file_path="/r/src/t.py"),
    ]
    for i in range(5):
        msgs += step(f"b{i}", filler(20, f"u{i}"))
    msgs.append(user("Please fix the bug in src/t.py"))
    ctx = make_ctx(tmp_path, window=8192 + 10_000)
    out = IntentStage({})(msgs, ctx)
    assert ctx.budget.usable * 0.25 < ctx.counter.count_message(msgs[3]), "the read must be over the cap"
    assert id(msgs[3]) in ctx.protected and id(msgs[2]) in ctx.protected, out.actions
    assert "2 always" in out.actions[0].detail
