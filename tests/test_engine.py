"""The runner and the Python API: phases, when:, on_error, prefix reuse, report, sessions."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Any, ClassVar

import jsonschema
import pytest

from ctxrules import Engine, PackError, UsageError
from ctxrules.hookspecs import hookimpl
from ctxrules.injected import key_scope
from ctxrules.messages import mark_injected, replace_text
from ctxrules.models import UnknownModelError
from ctxrules.resources import schema_path
from ctxrules.stages.base import Action, StageOutcome, StageType
from ctxrules.structure import facts_of, pinned_indices

REPORT_SCHEMA = json.loads(schema_path("report.v1.schema.json").read_text())


def convo(n_steps: int = 3, size: int = 200) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "do it"}]
    for i in range(n_steps):
        msgs.append(
            {
                "role": "assistant",
                "content": f"step {i}",
                "tool_calls": [
                    {"id": f"c{i}", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "ls"}'}}
                ],
            }
        )
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": ("line\n" * size)})
    msgs.append({"role": "assistant", "content": "done"})
    return msgs


class Recorder:
    """A content stage that records the tier it saw and can raise or shorten tool outputs."""

    calls: ClassVar[list[tuple[str, str]]] = []

    def __init__(self, options: dict[str, Any]) -> None:
        self.mode = options.get("mode", "noop")
        self.tag = options.get("tag", "")

    def __call__(self, messages: Any, ctx: Any) -> StageOutcome:
        Recorder.calls.append((ctx.stage_id, ctx.tier))
        if self.mode == "raise":
            raise RuntimeError("boom")
        if self.mode == "shorten":
            pinned = pinned_indices(messages)
            out = [
                replace_text(m, "short") if m.get("role") == "tool" and i not in pinned else m
                for i, m in enumerate(messages)
            ]
            return StageOutcome(out, [Action("shorten", "tool outputs", tokens_saved=1)])
        if self.mode == "orphan":
            # Leave an orphan result behind: the integrity stage must repair it next.
            return StageOutcome(
                [*messages[:-1], {"role": "tool", "tool_call_id": "nope", "content": "x"}, messages[-1]]
            )
        if self.mode == "edit-text":
            return StageOutcome([replace_text(m, "changed") for m in messages])
        if self.mode == "request":
            return StageOutcome(list(messages), request={"prompt_cache_key": ctx.session_id})
        return StageOutcome(list(messages))


def _plugin() -> Any:
    schema = {
        "type": "object",
        "additionalProperties": False,
        "properties": {"mode": {"type": "string"}, "tag": {"type": "string"}},
    }

    @hookimpl
    def ctxrules_register_stages(register: Any) -> None:
        register(StageType("test.content", "content", Recorder, schema))
        register(StageType("test.finalize", "finalize", Recorder, schema))

    return types.SimpleNamespace(ctxrules_register_stages=ctxrules_register_stages)


def pack(tmp_path: Path, pipeline: str, extra: str = "") -> Path:
    p = tmp_path / "pack.yaml"
    p.write_text(
        f"apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {{name: t, version: 1.0.0}}\npipeline:\n{pipeline}{extra}"
    )
    return p


def engine(tmp_path: Path, pipeline: str, extra: str = "") -> Engine:
    Recorder.calls = []
    return Engine.load(pack(tmp_path, pipeline, extra), plugins=[("test", _plugin())])


def test_essential_pair_stage_runs_even_when_not_named(tmp_path: Path) -> None:
    e = engine(tmp_path, "  - {id: a, use: test.content}\n")
    assert [p.id for p in e.plan] == ["a", "normalize.tool_pairs"]
    r = e.session(tmp_path / "s", model="gpt-4o").prepare(convo())
    assert [s["id"] for s in r.report["stages"]] == ["normalize.tool_pairs", "a"]


def test_integrity_runs_after_a_content_stage_that_changed_messages(tmp_path: Path) -> None:
    e = engine(tmp_path, "  - {id: a, use: test.content, with: {mode: orphan}}\n")
    r = e.session(tmp_path / "s", model="gpt-4o").prepare(convo())
    ids = [s["id"] for s in r.report["stages"]]
    assert ids == ["normalize.tool_pairs", "a", "normalize.tool_pairs"]
    assert not any(m.get("tool_call_id") == "nope" for m in r.messages)
    dropped = r.report["stages"][2]["actions"]
    assert dropped and dropped[0]["vault_id"] in r.report["vault_items"]


def test_when_is_evaluated_on_the_current_tier(tmp_path: Path) -> None:
    e = engine(
        tmp_path,
        "  - {id: hi, use: test.content, when: {at_least: full}}\n"
        "  - {id: lo, use: test.content, when: {below: light}}\n",
    )
    msgs = convo(3, 200)
    s = e.session(tmp_path / "s", model="gpt-4o", window=8192 + 1000)
    r = s.prepare(msgs)
    stages = {st["id"]: st for st in r.report["stages"]}
    assert r.report["before"]["tier"] == "emergency"
    assert stages["hi"]["ran"] and not stages["lo"]["ran"]
    assert "is not under `light`" in stages["lo"]["skipped"]
    s2 = e.session(tmp_path / "s2", model="gpt-4o", window=400000)
    stages = {st["id"]: st for st in s2.prepare(msgs).report["stages"]}
    assert not stages["hi"]["ran"] and "is under `full`" in stages["hi"]["skipped"]
    assert stages["lo"]["ran"]


def test_failing_stage_is_skipped_and_reported_and_nothing_is_lost(tmp_path: Path) -> None:
    e = engine(tmp_path, "  - {id: bad, use: test.content, with: {mode: raise}}\n  - {id: after, use: test.content}\n")
    msgs = convo()
    r = e.session(tmp_path / "s", model="gpt-4o").prepare(msgs)
    bad = next(s for s in r.report["stages"] if s["id"] == "bad")
    assert not bad["ran"] and "RuntimeError: boom" in bad["error"]
    assert any("bad" in w and "boom" in w for w in r.report["warnings"])
    assert r.messages == msgs
    assert ("after", "below") in Recorder.calls


def test_on_error_fail_stops_the_run_with_a_handled_error(tmp_path: Path) -> None:
    from ctxrules.pipeline.runner import StageFailed

    e = engine(tmp_path, "  - {id: bad, use: test.content, with: {mode: raise}, on_error: fail}\n")
    with pytest.raises(StageFailed, match=r"stage 'bad' .* failed: RuntimeError: boom"):
        e.session(tmp_path / "s", model="gpt-4o").prepare(convo())


def test_finalize_stage_may_add_request_options_but_not_change_text(tmp_path: Path) -> None:
    e = engine(tmp_path, "  - {id: fin, use: test.finalize, with: {mode: request}}\n")
    r = e.session(tmp_path / "run-7", model="gpt-4o").prepare(convo())
    assert r.request == {"prompt_cache_key": "run-7"}
    e = engine(tmp_path, "  - {id: fin, use: test.finalize, with: {mode: edit-text}}\n")
    msgs = convo()
    r = e.session(tmp_path / "s2", model="gpt-4o").prepare(msgs)
    fin = next(s for s in r.report["stages"] if s["id"] == "fin")
    assert "may only add markers" in fin["error"] and r.messages == msgs


def test_phases_run_content_before_finalize_whatever_the_pack_order(tmp_path: Path) -> None:
    e = engine(tmp_path, "  - {id: fin, use: test.finalize}\n  - {id: c, use: test.content}\n")
    r = e.session(tmp_path / "s", model="gpt-4o").prepare(convo())
    assert [s["id"] for s in r.report["stages"]] == ["normalize.tool_pairs", "c", "fin"]


def test_report_validates_and_counts_tokens_saved(tmp_path: Path) -> None:
    e = engine(tmp_path, "  - {id: cut, use: test.content, with: {mode: shorten}}\n")
    r = e.session(tmp_path / "s", model="gpt-4o").prepare(convo(3, 300))
    jsonschema.validate(r.report, REPORT_SCHEMA)
    cut = next(s for s in r.report["stages"] if s["id"] == "cut")
    assert cut["tokens_saved"] > 0
    assert r.report["after"]["tokens"] < r.report["before"]["tokens"]


def test_caller_objects_are_never_mutated_and_stage_made_messages_are_copies(tmp_path: Path) -> None:
    e = engine(tmp_path, "  - {id: cut, use: test.content, with: {mode: shorten}}\n")
    msgs = convo()
    frozen = copy.deepcopy(msgs)
    s = e.session(tmp_path / "s", model="gpt-4o")
    r = s.prepare(msgs)
    assert msgs == frozen
    assert r.messages is not msgs and r.messages[0] is msgs[0]  # untouched: the caller's own object
    shortened = next(i for i, m in enumerate(r.messages) if m.get("content") == "short")
    r.messages[shortened]["content"] = "tampered"
    r2 = s.prepare([*msgs, {"role": "user", "content": "more"}])
    assert r2.report["reused_messages"] == len(msgs)
    assert r2.messages[shortened]["content"] == "short"


def test_history_edited_in_place_is_noticed(tmp_path: Path) -> None:
    e = engine(tmp_path, "  - {id: cut, use: test.content, with: {mode: shorten}}\n")
    msgs = convo()
    s = e.session(tmp_path / "s", model="gpt-4o")
    s.prepare(msgs)
    msgs[1]["content"] = "a different request"
    r = s.prepare(msgs)
    assert r.report["reused_messages"] == 0 and r.messages[1]["content"] == "a different request"


def test_a_part_edited_in_place_is_seen_afresh(tmp_path: Path) -> None:
    e = engine(tmp_path, "  - {id: a, use: test.content}\n")
    msgs = convo()
    msgs[1] = {"role": "user", "content": [{"type": "text", "text": "fix the bug"}]}
    s = e.session(tmp_path / "s", model="gpt-4o")
    s.prepare(msgs)
    assert facts_of(msgs[1]).real_user  # the human anchor
    with key_scope(s.injection_key):  # signed as this session would sign it
        msgs[1]["content"][0]["text"] = mark_injected({"role": "user", "content": "earlier"}, "summary")["content"]
    r = s.prepare(msgs)
    assert r.report["reused_messages"] == 0 and facts_of(msgs[1]).injected
    # The same with a model switch in between (the switch alone discards the reuse).
    msgs[1]["content"][0]["text"] = "fix the bug"
    s.switch(model="gpt-4.1")
    s.prepare(msgs)
    assert facts_of(msgs[1]).real_user


def test_appended_history_reuses_the_previous_compaction(tmp_path: Path) -> None:
    e = engine(tmp_path, "  - {id: cut, use: test.content, with: {mode: shorten}}\n")
    s = e.session(tmp_path / "s", model="gpt-4o")
    msgs = convo(3)
    first = s.prepare(msgs)
    more = [*msgs, {"role": "user", "content": "and now?"}]
    second = s.prepare(more)
    assert second.report["reused_messages"] == len(msgs)
    assert second.messages[: len(first.messages)] == first.messages
    # Counts kept incrementally agree with counting from scratch.
    assert second.report["before"]["tokens"] == s.counter.count_messages(more)
    assert second.report["after"]["tokens"] == s.counter.count_messages(second.messages)
    assert next(st for st in second.report["stages"] if st["id"] == "cut")["tokens_before"] == s.counter.count_messages(
        [*first.messages, more[-1]]
    )
    # A history that is not an extension is processed from scratch.
    edited = copy.deepcopy(more)
    edited[1]["content"] = "do something else"
    assert s.prepare(edited).report["reused_messages"] == 0


def test_reuse_survives_a_new_process(tmp_path: Path) -> None:
    e = engine(tmp_path, "  - {id: cut, use: test.content, with: {mode: shorten}}\n")
    msgs = convo(3)
    e.session(tmp_path / "s", model="gpt-4o").prepare(msgs)
    fresh = engine(tmp_path, "  - {id: cut, use: test.content, with: {mode: shorten}}\n")
    r = fresh.session(tmp_path / "s", model="gpt-4o").prepare([*msgs, {"role": "user", "content": "next"}])
    assert r.report["reused_messages"] == len(msgs)


def test_a_new_process_notices_an_edited_history(tmp_path: Path) -> None:
    e = engine(tmp_path, "  - {id: cut, use: test.content, with: {mode: shorten}}\n")
    msgs = convo(3)
    e.session(tmp_path / "s", model="gpt-4o").prepare(msgs)
    state = json.loads((tmp_path / "s" / "state.json").read_text())
    assert state["last"]["count"] == len(msgs) and "digests" not in state["last"]  # one chained digest
    edited = copy.deepcopy(msgs)
    edited[-1]["content"] = edited[-1]["content"] + "!"
    fresh = engine(tmp_path, "  - {id: cut, use: test.content, with: {mode: shorten}}\n")
    r = fresh.session(tmp_path / "s", model="gpt-4o").prepare([*edited, {"role": "user", "content": "next"}])
    assert r.report["reused_messages"] == 0
    assert fresh.session(tmp_path / "s", model="gpt-4o").prepare(msgs[:2]).report["reused_messages"] == 0


def test_state_written_in_place_survives_a_writer_stopped_before_the_cut(tmp_path: Path) -> None:
    e = engine(tmp_path, "  - {id: cut, use: test.content, with: {mode: shorten}}\n")
    msgs = convo(3)
    s = e.session(tmp_path / "s", model="gpt-4o")
    s.prepare(msgs)
    state = tmp_path / "s" / "state.json"
    assert state.stat().st_mode & 0o777 == 0o600
    inode = state.stat().st_ino
    more = [*msgs, {"role": "user", "content": "next"}]
    s.prepare(more)
    assert state.stat().st_ino == inode  # rewritten in place, not replaced
    # The new state was written over the old one, and the writer stopped before cutting the
    # file to its length: what follows the first JSON value is ignored.
    state.write_bytes(state.read_bytes() + b' "stages": {"left": "over"}}\n')
    fresh = engine(tmp_path, "  - {id: cut, use: test.content, with: {mode: shorten}}\n")
    r = fresh.session(tmp_path / "s", model="gpt-4o").prepare([*more, {"role": "user", "content": "and?"}])
    assert r.report["reused_messages"] == len(more)
    # A state file replaced behind the session's back (a checkpoint restore) is reopened.
    (tmp_path / "s" / "new.json").write_bytes(state.read_bytes())
    (tmp_path / "s" / "new.json").replace(state)
    assert state.stat().st_ino != inode
    s.prepare([*more, {"role": "user", "content": "and?"}, {"role": "user", "content": "ok"}])
    assert json.loads(state.read_text())["last"]["count"] == len(more) + 2


def test_an_output_file_the_state_does_not_describe_is_not_reused(tmp_path: Path) -> None:
    """A process that died between writing last_output.jsonl and state.json leaves a file
    the state does not describe; a new process must not take it for the last output."""
    e = engine(tmp_path, "  - {id: cut, use: test.content, with: {mode: shorten}}\n")
    msgs = convo(3)
    e.session(tmp_path / "s", model="gpt-4o").prepare(msgs)
    out_file = tmp_path / "s" / "last_output.jsonl"
    lines = out_file.read_bytes().splitlines(keepends=True)
    (tmp_path / "s" / "other.jsonl").write_bytes(b"".join(reversed(lines)))  # same size, other order
    (tmp_path / "s" / "other.jsonl").replace(out_file)
    more = [*msgs, {"role": "user", "content": "next"}]
    fresh = engine(tmp_path, "  - {id: cut, use: test.content, with: {mode: shorten}}\n")
    assert fresh.session(tmp_path / "s", model="gpt-4o").prepare(more).report["reused_messages"] == 0


def test_changed_pack_or_model_discards_the_previous_compaction(tmp_path: Path) -> None:
    e = engine(tmp_path, "  - {id: cut, use: test.content, with: {mode: shorten}}\n")
    msgs = convo(3)
    e.session(tmp_path / "s", model="gpt-4o").prepare(msgs)
    assert e.session(tmp_path / "s", model="gpt-4.1").prepare(msgs).report["reused_messages"] == 0
    e2 = engine(tmp_path, "  - {id: cut, use: test.content, with: {mode: shorten, tag: v2}}\n")
    assert e2.session(tmp_path / "s", model="gpt-4.1").prepare(msgs).report["reused_messages"] == 0


def test_damaged_state_file_costs_only_the_reuse(tmp_path: Path) -> None:
    e = engine(tmp_path, "  - {id: a, use: test.content}\n")
    msgs = convo()
    e.session(tmp_path / "s", model="gpt-4o").prepare(msgs)
    (tmp_path / "s" / "state.json").write_text("{not json")
    r = engine(tmp_path, "  - {id: a, use: test.content}\n").session(tmp_path / "s", model="gpt-4o").prepare(msgs)
    assert r.messages == msgs and r.report["reused_messages"] == 0


def test_session_files_are_private(tmp_path: Path) -> None:
    e = engine(tmp_path, "  - {id: a, use: test.content, with: {mode: orphan}}\n")
    e.session(tmp_path / "s", model="gpt-4o").prepare(convo())
    for p in (tmp_path / "s").rglob("*"):
        mode = p.stat().st_mode & 0o777
        assert mode == (0o700 if p.is_dir() else 0o600), p


def test_window_resolution_and_usage_errors(tmp_path: Path) -> None:
    e = engine(tmp_path, "  - {id: a, use: test.content}\n")
    assert e.session(tmp_path / "a", model="gpt-4o").budget.window == 128000
    assert e.session(tmp_path / "b", model="gpt-4o", window=50000).budget.window == 50000
    with pytest.raises(UsageError, match="leaves no usable window"):
        e.session(tmp_path / "c", model="gpt-4o", window=8000)
    with pytest.raises(UnknownModelError, match="gpt-4o"):
        e.session(tmp_path / "d", model="gpt-4oo")
    assert e.session(tmp_path / "e", model="my-local-llm", window=20000).budget.usable == 20000 - 8192


def test_pack_window_applies_to_unknown_models_and_models_entries_merge(tmp_path: Path) -> None:
    e = engine(
        tmp_path,
        "  - {id: a, use: test.content}\n",
        "context: {window: 30000, thresholds: {full: 0.75}}\n"
        "models:\n  - {id: big, match: ['claude-*'], context: {window: 100000, reserve_output: 1000}}\n",
    )
    s = e.session(tmp_path / "a", model="some-private-model")
    assert (s.budget.window, s.budget.thresholds["full"]) == (30000, 0.75)
    c = e.session(tmp_path / "b", model="anthropic/claude-sonnet-4-5")
    assert (c.budget.window, c.budget.reserve_output, c.budget.thresholds["full"]) == (100000, 1000, 0.75)
    assert c.counter.is_estimate and c.budget.safety_margin > 0


def test_invalid_pack_raises_pack_error_with_position(tmp_path: Path) -> None:
    p = pack(tmp_path, "  - {id: a, use: test.contnet}\n")
    with pytest.raises(PackError, match=r"pack.yaml:5:\d+: error\[CR060\] unknown stage type 'test.contnet'"):
        Engine.load(p, plugins=[("test", _plugin())])


def test_malformed_messages_are_a_clear_error(tmp_path: Path) -> None:
    from ctxrules import MessagesError

    e = engine(tmp_path, "  - {id: a, use: test.content}\n")
    with pytest.raises(MessagesError, match="message 1"):
        e.session(tmp_path / "s", model="gpt-4o").prepare([{"role": "user", "content": "x"}, {"content": "y"}])


def test_one_prepare_at_a_time_across_processes(tmp_path: Path) -> None:
    """A second process blocks on the session lock until the first releases it."""
    from ctxrules.session_store import SessionLock

    script = (
        "import sys, time; sys.path.insert(0, sys.argv[2])\n"
        "from pathlib import Path\n"
        "from ctxrules.session_store import SessionLock\n"
        "import ctxrules.locks\n"
        "print('ready', flush=True)\n"
        "t = time.monotonic()\n"
        "with SessionLock(Path(sys.argv[1])): print(time.monotonic() - t)\n"
    )
    engine_dir = str(Path(__file__).resolve().parents[1] / "engine")
    with SessionLock(tmp_path / "s"):
        proc = subprocess.Popen(
            [sys.executable, "-c", script, str(tmp_path / "s"), engine_dir], stdout=subprocess.PIPE, text=True
        )
        import time

        assert proc.stdout is not None
        # Timed from when the child is about to acquire (its start-up time varies with load).
        assert proc.stdout.readline() == "ready\n"
        time.sleep(1.0)
        assert proc.poll() is None  # still waiting for the lock
    out, _ = proc.communicate(timeout=30)
    assert float(out) >= 0.9


def test_a_forked_child_does_not_share_the_parents_lock(tmp_path: Path) -> None:
    """The lock file stays open between uses; a fork must not hand the child the parent's lock."""
    import os
    import time

    from ctxrules.session_store import SessionLock

    lock = SessionLock(tmp_path / "s")
    with lock:
        pass  # the descriptor is open now, and inherited by the child
    read_end, write_end = os.pipe()
    with lock:
        pid = os.fork()
        if pid == 0:  # the child: must wait for the parent to release
            os.close(read_end)
            t = time.monotonic()
            with lock:
                os.write(write_end, f"{time.monotonic() - t:.3f}".encode())
            os._exit(0)
        os.close(write_end)
        time.sleep(1.0)
    waited = float(os.read(read_end, 64).decode())
    os.waitpid(pid, 0)
    assert waited >= 0.9
