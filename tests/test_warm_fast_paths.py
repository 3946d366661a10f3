"""The shortcuts a warm turn takes change nothing the caller gets.

A warm turn runs the pipeline's stages from what they carried over from the last turn, with
contexts made from the fields the run shares, reads session documents only when their file
changed, and reports an empty budget total from a copy made once. Each of these is checked
against the slow way here: real transcripts fed one message at a time (every turn appends
exactly one message) against a new engine and session over the saved session, which carries
nothing over; a notes file rewritten behind the session's back; the stage context a stage sees.
"""

from __future__ import annotations

import itertools
import json
import operator
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import load_transcript
from session_kit import keyed_state_root

from ctxrules import Engine
from ctxrules.budget.ledger import Totals
from ctxrules.messages import message_text
from ctxrules.models import lookup_model
from ctxrules.notes import load_notes
from ctxrules.pipeline.budget import Budget
from ctxrules.pipeline.context import StageContext
from ctxrules.pipeline.runner import PlannedStage, run_pipeline
from ctxrules.session_store import SessionStore
from ctxrules.stages.base import StageOutcome, StageType, unchanged
from ctxrules.stores.filesystem import FilesystemStore
from ctxrules.tokens import TokenCounter
from ctxrules.vault import Vault

MODEL = "gpt-4o"
CLOCK = 1_760_000_000.0


def _state_root(tmp_path: Path) -> Path:
    return keyed_state_root(tmp_path, "test_warm_fast_paths")


def _open(root: Path, folder: str, window: int, model: str = MODEL) -> Any:
    return Engine.load("builtin:default").session(
        root / folder, model=model, window=window, state_root=root, session_id="s"
    )


# (transcript, window, first prepared length, model): a long Claude Code session that never
# compacts at 400K and an OpenHands one that compacts at 32K and then carries its compaction.
# On a Claude model the cache breakpoints move on every call, so no output is a prefix of the
# next one: the stages carry their work over a list whose breakpoints moved.
CASES = [
    ("claudecode-4d5611e5", 400_000, 240, MODEL),
    ("openhands-ponylang__ponyc-4588", 32_000, 60, MODEL),
    ("claudecode-4d5611e5", 400_000, 240, "claude-sonnet-4-5"),
    ("openhands-ponylang__ponyc-4588", 32_000, 60, "claude-sonnet-4-5"),
]


@pytest.mark.corpus
@pytest.mark.parametrize(("name", "window", "start", "model"), CASES, ids=lambda v: str(v))
def test_one_message_at_a_time_equals_a_session_that_carries_nothing(
    tmp_path: Path, name: str, window: int, start: int, model: str
) -> None:
    history = load_transcript(name)
    root = _state_root(tmp_path)
    warm = _open(root, "warm", window, model)
    start = min(start, len(history) - 40)
    turns = [(CLOCK + 20 * turn, upto) for turn, upto in enumerate(range(start, len(history) + 1))]
    # Every warm turn first: a session's first turn forgets what the process remembers per
    # message object (another session may have seen the objects edited), so a reference turn
    # between two warm ones would leave the warm session nothing to carry.
    results = [warm.prepare(history[:upto], clock=clock) for clock, upto in turns]
    reused = compacted = 0
    for turn, ((clock, upto), got) in enumerate(zip(turns, results, strict=True)):
        want = _open(root, "reference", window, model).prepare(history[:upto], clock=clock)
        assert (got.messages, got.tools, got.request) == (want.messages, want.tools, want.request), (
            f"turn {turn} ({upto} messages) differs from a session that carries nothing over"
        )
        assert got.report["reused_messages"] == want.report["reused_messages"]
        assert got.report["before"] == want.report["before"] and got.report["after"] == want.report["after"]
        # Which stages ran and what they counted (their actions may differ: a stage that carried
        # its settled outputs over does not report the ones it left alone again).
        assert [(s["id"], s["ran"], s["tokens_before"], s["tokens_after"]) for s in got.report["stages"]] == [
            (s["id"], s["ran"], s["tokens_before"], s["tokens_after"]) for s in want.report["stages"]
        ]
        reused += turn > 0 and got.report["reused_messages"] == upto - 1
        compacted += got.report["after"]["tokens"] < got.report["before"]["tokens"]
    assert reused >= (len(history) - start) - 2  # nearly every turn reused the last one
    if window < 100_000:
        assert compacted >= 1  # and the small window compacted, and carried the compaction


def test_a_notes_file_changed_behind_the_session_is_read_again(tmp_path: Path) -> None:
    store = FilesystemStore(tmp_path)
    session = str(tmp_path / "s")
    os.mkdir(session, 0o700)
    notes = Path(session) / "notes.json"

    def write(text: str) -> None:
        body = {"next": 2, "notes": [{"id": "n1", "text": text, "tags": [], "created": 1.0, "updated": 1.0}]}
        notes.write_text(json.dumps(body), encoding="utf-8")
        notes.chmod(0o600)
        os.utime(notes, ns=(1_000_000_000, 1_000_000_000))  # long settled: the memo may hold it

    assert load_notes(store=store, session=session) == []
    write("first text")
    assert [n.text for n in load_notes(store=store, session=session)] == ["first text"]
    assert [n.text for n in load_notes(store=store, session=session)] == ["first text"]  # from memory
    # Rewritten in place, to the same size and the same modification time: the change time moved.
    write("other text")
    assert [n.text for n in load_notes(store=store, session=session)] == ["other text"]
    # Replaced by another process (a new file renamed over it), and removed.
    FilesystemStore(tmp_path).write_doc(session, "notes", notes.read_bytes().replace(b"other", b"third"))
    assert [n.text for n in load_notes(store=store, session=session)] == ["third text"]
    notes.unlink()
    assert load_notes(store=store, session=session) == []


def test_a_recent_notes_file_is_not_served_from_memory(tmp_path: Path) -> None:
    # File times are coarse: a file changed within the last two seconds is read every time.
    store = FilesystemStore(tmp_path)
    session = str(tmp_path / "s")
    os.mkdir(session, 0o700)
    store.write_doc(session, "notes", b'{"next": 1, "notes": []}')
    assert store.read_doc(session, "notes") == b'{"next": 1, "notes": []}'
    assert (session, "notes") not in store._doc_reads


def test_an_empty_total_is_a_fresh_copy_equal_to_the_computed_one() -> None:
    first = Totals().as_dict()
    assert first == Totals()._as_dict()
    first["tokens"]["prompt"] = 99
    first["usd_by_kind"]["input"] = 1.0
    first["by_model"]["x"] = {}
    assert Totals().as_dict() == Totals()._as_dict()


def _probe(seen: list[StageContext], change: bool = False) -> Any:
    def stage(messages: list[dict[str, Any]], ctx: StageContext) -> StageOutcome:
        seen.append(ctx)
        ctx.state["runs"] = ctx.state.get("runs", 0) + 1
        if change:
            return StageOutcome(messages=[*messages[:-1], {**messages[-1], "content": "changed"}])
        return StageOutcome(messages=unchanged(messages))

    return stage


def test_every_stage_sees_the_context_a_constructor_would_make(tmp_path: Path) -> None:
    seen: list[StageContext] = []
    plan = [
        PlannedStage("check", StageType("t.check", "integrity", lambda o: _probe(seen)), _probe(seen), {}),
        PlannedStage(
            "cut", StageType("t.cut", "content", lambda o: _probe(seen)), _probe(seen, True), {"target": "light"}
        ),
        PlannedStage("mark", StageType("t.mark", "finalize", lambda o: _probe(seen)), _probe(seen), {}),
    ]
    counter = TokenCounter.for_model(lookup_model(MODEL))
    budget = Budget(window=10_000, reserve_output=1_000)
    protected: set[int] = set()
    base = StageContext(
        stage_id="",
        model=object(),  # type: ignore[arg-type]
        counter=counter,
        budget=budget,
        vault=Vault.of(FilesystemStore(tmp_path), str(tmp_path / "s")),
        tools=[],
        pack={"p": 1},
        log=object(),  # type: ignore[arg-type]
        session_id="sess",
        protected=protected,
        clock=5.0,
        cache_hot=True,
        valid_prefix=1,
        hooks="hooks",
        registry="registry",
        cache_key="ck",
    )
    # A logger the runner can bind and call.
    base.log = _Log()  # type: ignore[assignment]
    states: dict[str, dict[str, Any]] = {}
    messages = [{"role": "user", "content": "hello there"}, {"role": "assistant", "content": "hi"}]
    outcome = run_pipeline(plan, messages, base, states)
    assert outcome.messages[-1]["content"] == "changed"
    # check (first pass), cut, check (after the change), mark
    assert [c.stage_id for c in seen] == ["check", "cut", "check", "mark"]
    tokens = counter.count_messages(messages, [])
    for ctx in seen:
        assert (ctx.model, ctx.counter, ctx.budget, ctx.vault, ctx.pack) == (
            base.model,
            counter,
            budget,
            base.vault,
            base.pack,
        )
        assert ctx.protected is protected and ctx.state is states[ctx.stage_id]
        assert (ctx.session_id, ctx.clock, ctx.cache_hot, ctx.hooks, ctx.registry, ctx.cache_key) == (
            "sess",
            5.0,
            True,
            "hooks",
            "registry",
            "ck",
        )
        assert ctx.tools == []
    assert seen[0].valid_prefix == 1 and seen[2].valid_prefix == 0  # only the first pass gets it
    assert seen[1].target == "light" and seen[0].target == "monitor"
    assert (seen[1].tier, seen[1].utilization) == (budget.tier(tokens), budget.utilization(tokens))
    assert seen[3].compactions == () and seen[0].log is base.log
    assert states["check"]["runs"] == 2
    # A plan edited in place between runs runs as it now is.
    plan.pop()
    seen.clear()
    run_pipeline(plan, messages, base, {})
    assert [c.stage_id for c in seen] == ["check", "cut", "check"]


class _Log:
    def bind(self, **values: Any) -> _Log:
        return self

    def debug(self, *args: Any, **values: Any) -> None:
        pass

    def warning(self, *args: Any, **values: Any) -> None:
        pass


def test_a_state_that_shrinks_leaves_no_tail_and_one_that_grows_is_whole(tmp_path: Path) -> None:
    files = SessionStore(tmp_path / "s")
    out = [{"role": "user", "content": "hi"}]
    for stages in ({"a": {"x": "y" * 5000}}, {"a": {}}, {"a": {"x": "z" * 300}}):
        files.save({"stages": stages}, out)
        on_disk = json.loads(files.state_file.read_bytes())  # the whole file is one JSON value
        assert on_disk["stages"] == stages
        assert SessionStore(tmp_path / "s").load() == on_disk  # a new process reads the same
        assert files.load() is not None and files.load()["stages"] == stages  # this object: from memory
    # Another writer's longer state in between: the next save still cuts the file to its own.
    files.state_file.write_bytes(json.dumps({"version": 1, "stages": {"b": {"x": "w" * 9000}}}).encode())
    files.save({"stages": {"c": {}}}, out)
    assert json.loads(files.state_file.read_bytes())["stages"] == {"c": {}}


@pytest.mark.corpus
def test_two_sessions_taking_turns_on_one_engine_each_keep_their_carry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A proxy serves many agents from one engine: its stage instances see their sessions' lists
    in turn. Each session's warm turn still looks only at its new tool results, and gets what a
    session on an engine of its own gets."""
    from ctxrules.stages import tool_output_filter

    looked: list[int] = []
    real = tool_output_filter._Run._is_settled

    def counting(self: Any, msg: Any) -> bool:
        looked.append(1)
        return real(self, msg)

    monkeypatch.setattr(tool_output_filter._Run, "_is_settled", counting)
    root = _state_root(tmp_path)
    shared = Engine.load("builtin:default")
    names = ["claudecode-ae4a77f8", "claudecode-4d5611e5"]
    histories = [load_transcript(n) for n in names]
    sessions = [
        shared.session(root / f"shared{k}", model=MODEL, window=400_000, state_root=root, session_id=f"s{k}")
        for k in range(2)
    ]
    alone = [
        Engine.load("builtin:default").session(
            root / f"alone{k}", model=MODEL, window=400_000, state_root=root, session_id=f"s{k}"
        )
        for k in range(2)
    ]
    starts = [len(h) - 12 for h in histories]
    for turn in range(12):
        # Turn 1 comes after the provider's cache would have expired: its outputs are examined
        # afresh, not left alone as "already sent while the cache is hot" (those stay pending).
        clock = CLOCK if turn == 0 else CLOCK + 1_000 + turn
        for k in range(2):
            given = histories[k][: starts[k] + turn + 1]
            looked.clear()
            got = sessions[k].prepare(given, clock=clock)
            shared_looked = len(looked)
            looked.clear()
            want = alone[k].prepare(given, clock=clock)
            assert (got.messages, got.request) == (want.messages, want.request)
            # As much work as on an engine of its own: the other session's turn in between did
            # not make it look at every tool result again (hundreds; a warm turn looks at few).
            # From turn 2 on: each of the four sessions' first prepares drops every per-object
            # memo (a first prepare cannot know what was edited in place before it), so turn 1
            # looks at everything in the shared engine.
            if turn >= 2:
                assert shared_looked == len(looked), f"session {k}, turn {turn}"
                if k == 0:
                    assert shared_looked <= 8


def _markers(value: Any) -> int:
    if isinstance(value, dict):
        return ("cache_control" in value) + sum(_markers(v) for v in value.values())
    if isinstance(value, list):
        return sum(_markers(v) for v in value)
    return 0


def test_a_claude_session_runs_its_stages_on_the_last_output_without_its_breakpoints(tmp_path: Path) -> None:
    # Cache breakpoints move on with every call on a Claude model. The content stages of a
    # warm turn must see their last input with messages appended (what lets each carry its
    # work over), not the last output, whose breakpoints the finalize stage moves again.
    from test_cache_markers import TOOLS, conversation
    from test_warm_adopted import _step

    engine = Engine.load("builtin:default")
    first = next(p for p in engine.plan if p.phase == "content")
    inputs: list[list[dict[str, Any]]] = []
    real = first.stage

    def recording(messages: Any, ctx: Any) -> Any:
        inputs.append(list(messages))
        return real(messages, ctx)

    first.stage = recording
    session = engine.session(tmp_path / "s", model="claude-sonnet-4-5", window=400_000)
    history = conversation(12)
    returned = [session.prepare(history, TOOLS, clock=CLOCK)]
    for i in range(4):
        history = [*history, *_step(i)]
        returned.append(session.prepare(history, TOOLS, clock=CLOCK + i + 1))
        assert returned[-1].report["reused_messages"] == len(history) - 2
    assert all(_markers(r.messages) for r in returned), "no breakpoints: the case tests less than it says"
    for before, now in itertools.pairwise(inputs):
        assert len(now) == len(before) + 2 and all(map(operator.is_, before, now)), "not its last input extended"
        assert _markers(now) == 0, "the stage saw the breakpoints of the last output"


@pytest.mark.parametrize("ours", [5, "x", [None, {"i": "one"}, {"i": 10**9}], {"i": 0}])
def test_a_session_continued_from_a_damaged_breakpoint_record_still_runs(tmp_path: Path, ours: Any) -> None:
    # A new process takes the last output's breakpoints off by the cache stage's record in
    # state.json; a record damaged on disk must not fail the turn (the stage meets it too,
    # inside the run, where a failure is contained).
    from test_cache_markers import TOOLS, conversation

    history = conversation(12)
    first = Engine.load("builtin:default").session(tmp_path / "s", model="claude-sonnet-4-5", window=400_000)
    assert _markers(first.prepare(history, TOOLS, clock=CLOCK).messages)
    state_file = tmp_path / "s" / "state.json"
    state = json.loads(state_file.read_text())
    state["stages"]["cache"]["ours"] = ours
    state_file.write_text(json.dumps(state))
    history = [*history, {"role": "user", "content": "And now the docs."}]
    again = Engine.load("builtin:default").session(tmp_path / "s", model="claude-sonnet-4-5", window=400_000)
    result = again.prepare(history, TOOLS, clock=CLOCK + 1)
    assert message_text(result.messages[-1]) == "And now the docs." and len(result.messages) == len(history)
    assert result.report["reused_messages"] == len(history) - 1
