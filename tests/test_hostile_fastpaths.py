"""Hostile input against what the warm-turn and cold-compaction fast paths read: counts kept in
state.json, per-object memos shared by the sessions of one process, a session directory changed
under a long-lived session, the per-process pack cache, and Python objects no JSON writer takes.

Each case goes through the public API or the real CLI, and checks what the user sees: the
right output (the same as a run that took no shortcut), a clear error, or nothing written
outside the session.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import types
from pathlib import Path
from typing import Any

import pytest
from cli_kit import cli, run_default
from invariants import pairing_problems

from ctxrules import Engine
from ctxrules.errors import CtxrulesError, MessagesError


def history() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "List the files."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "ls"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt\nb.txt\n"},
        {"role": "assistant", "content": "Two files."},
    ]


def run_cli(tmp_path: Path, messages: list[dict[str, Any]]) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    (tmp_path / "in.json").write_text(json.dumps(messages))
    report = tmp_path / "report.json"
    report.unlink(missing_ok=True)
    proc = run_default(tmp_path / "in.json", "--state", str(tmp_path / "state"), "--report", str(report), cwd=tmp_path)
    return proc, json.loads(report.read_text()) if report.is_file() else {}


# --- counts kept in state.json -------------------------------------------------------------


@pytest.mark.parametrize(
    "damage",
    [
        {"output_counts": "9" * 5000 + ",1,1,1,1"},  # int() refuses more than 4300 digits
        {"output_counts": "1" * 40 + ",1,1,1,1"},
        {"output_counts": [10**40, 1, 1, 1, 1]},
        {"tokens": 10**40},
    ],
    ids=["counts-past-int-limit", "count-40-digits", "listed-count-40-digits", "tokens-40-digits"],
)
def test_absurd_counts_in_the_state_are_damage_not_a_crash_or_a_wrong_budget(
    tmp_path: Path, damage: dict[str, Any]
) -> None:
    first, _ = run_cli(tmp_path, history())
    assert first.returncode == 0, first.stderr
    state_file = tmp_path / "state" / "default" / "state.json"
    state = json.loads(state_file.read_text())
    state["last"].update(damage)
    state_file.write_text(json.dumps(state))
    grown = [*history(), {"role": "user", "content": "Thanks."}]
    for _turn in range(2):  # and the turn after it: the damage is not saved again
        proc, report = run_cli(tmp_path, grown)
        assert proc.returncode == 0, proc.stderr
        assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr
        assert report["before"]["tokens"] < 1000 and report["before"]["tier"] == "below"
        assert report["after"]["tokens"] < 1000
        assert json.loads(proc.stdout)[-1] == grown[-1]
        grown.append({"role": "assistant", "content": "You are welcome."})


# --- memos shared by the sessions of one process ---------------------------------------------


def test_a_list_edited_in_place_is_paired_again_by_a_new_session_object(tmp_path: Path) -> None:
    """One engine, two session objects (an application opening a session per request, an
    integration reopening one it let go): the second must not trust what the first found about
    the very same message objects before the caller edited one of them in place."""
    engine = Engine.load("builtin:default")
    messages = history()
    engine.session(tmp_path / "a", model="gpt-4o", state_root=tmp_path).prepare(messages)
    messages[2]["tool_calls"][0]["id"] = "zz"  # the result now answers no call
    edited = engine.session(tmp_path / "b", model="gpt-4o", state_root=tmp_path).prepare(messages).messages
    assert pairing_problems(edited) == []
    fresh = Engine.load("builtin:default").session(tmp_path / "c", model="gpt-4o", state_root=tmp_path)
    assert edited == fresh.prepare(json.loads(json.dumps(messages))).messages


def test_a_reopened_session_sees_a_list_edited_in_place(tmp_path: Path) -> None:
    """The same session directory opened again in the same process (OpenSessions lets the least
    recently used go), with the message list edited in place in between."""
    engine = Engine.load("builtin:default")
    messages = history()
    engine.session(tmp_path / "s", model="gpt-4o").prepare(messages)
    messages[3]["tool_call_id"] = "other"  # an orphaned result, and a call without its answer
    again = engine.session(tmp_path / "s", model="gpt-4o").prepare(messages)
    assert again.report["reused_messages"] == 0
    assert pairing_problems(again.messages) == []


# --- a session directory changed under a long-lived session ---------------------------------

BIG = [*history()[:3], {"role": "tool", "tool_call_id": "c1", "content": "line of a long listing\n" * 4000}]


def test_a_session_directory_removed_between_turns_is_made_again(tmp_path: Path) -> None:
    session = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o")
    session.prepare(history())
    shutil.rmtree(tmp_path / "s")  # "reset the session" while the process runs
    grown = [*history(), {"role": "user", "content": "again"}]
    result = session.prepare(grown)
    assert result.messages[-1] == grown[-1]
    assert (tmp_path / "s" / "state.json").is_file() and (tmp_path / "s" / ".lock").is_file()
    assert session.prepare([*grown, {"role": "assistant", "content": "ok"}]).report["reused_messages"] == len(grown)


def test_a_session_directory_swapped_for_a_link_between_turns_receives_nothing(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    session = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o")
    session.prepare(history())
    os.rename(tmp_path / "s", tmp_path / "s.old")
    (tmp_path / "s").symlink_to(elsewhere)
    with pytest.raises(CtxrulesError, match=r"s: it is a symbolic link"):
        session.prepare(BIG)
    assert list(elsewhere.iterdir()) == []  # no lock file, no vault, no state


def test_a_vault_write_outside_a_turn_refuses_a_swapped_session_directory(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    session = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o")
    session.prepare(history())
    session.spill("an original kept before the swap " * 2000)
    os.rename(tmp_path / "s", tmp_path / "s.old")
    (tmp_path / "s").symlink_to(elsewhere)
    time.sleep(2.1)  # past the time a checked vault directory is trusted
    with pytest.raises(CtxrulesError, match=r"s: it is a symbolic link"):
        session.spill("the user's original, which must not leave the session " * 2000)
    assert list(elsewhere.iterdir()) == []


# --- the per-process pack cache ----------------------------------------------------------------

PACK = """\
apiVersion: ctxrules/v1
kind: RulePack
metadata: {name: stamped, version: 1.0.0}
context: {reserve_output: 4096}
"""


def test_a_pack_rewritten_with_its_mtime_kept_is_read_again(tmp_path: Path) -> None:
    pack = tmp_path / "pack.yaml"
    pack.write_text(PACK)
    past = time.time() - 60
    for path in (pack, tmp_path):
        os.utime(path, (past, past))
    assert Engine.load(pack).pack.data["context"]["reserve_output"] == 4096
    before = pack.stat()
    pack.write_text(PACK.replace("4096", "2048"))  # the same size
    os.utime(pack, ns=(before.st_atime_ns, before.st_mtime_ns))  # as cp -p or tar x leave it
    assert pack.stat().st_size == before.st_size and pack.stat().st_mtime_ns == before.st_mtime_ns
    assert Engine.load(pack).pack.data["context"]["reserve_output"] == 2048


# --- Python objects no JSON writer takes -------------------------------------------------------


class _Key:
    pass


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"blob": b"raw bytes"}, r"message 1 \(user\): /blob: a value of type bytes is not JSON data"),
        ({"tags": {"a", "b"}}, r"/tags: a value of type set is not JSON data"),
        ({"meta": {"when": object()}}, r"/meta/when: a value of type object is not JSON data"),
        ({"meta": {1: "one"}}, r"/meta: a key that is not a string: 1"),
        ({"meta": {(1, 2): "pair"}}, r"/meta: a key that is not a string: \(1, 2\)"),
        ({"meta": {_Key(): "x"}}, r"/meta: a key that is not a string: <"),
        ({"meta": types.MappingProxyType({"a": 1})}, r"/meta: a value of type mappingproxy is not JSON data"),
        ({"meta": (1, float("nan"))}, r"/meta/1: nan is not a finite number"),  # inside a tuple too
    ],
    ids=["bytes", "set", "object", "int-key", "tuple-key", "object-key", "mappingproxy", "nan-in-tuple"],
)
def test_the_api_rejects_python_objects_naming_the_field(tmp_path: Path, extra: dict[str, Any], match: str) -> None:
    session = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o")
    with pytest.raises(MessagesError, match=match):
        session.prepare([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi", **extra}])
    assert not (tmp_path / "s" / "last_output.jsonl").exists()


def test_a_tool_holding_bytes_is_rejected_naming_the_tool(tmp_path: Path) -> None:
    tool = {"type": "function", "function": {"name": "read", "parameters": {"type": "object", "default": b"x"}}}
    session = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o")
    with pytest.raises(MessagesError, match=r"read.*/function/parameters/default: a value of type bytes"):
        session.prepare([{"role": "user", "content": "hi"}], tools=[tool])


def test_a_tuple_of_json_values_is_accepted_as_an_array(tmp_path: Path) -> None:
    session = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o")
    out = session.prepare([{"role": "user", "content": "hi", "meta": ("a", 1, None)}]).messages
    assert json.loads(json.dumps(out))[-1]["meta"] == ["a", 1, None]


# --- the quick look for plugin distributions -----------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_fifo_named_like_entry_points_in_the_current_folder_does_not_hang(tmp_path: Path) -> None:
    """`python -m` puts the current folder on sys.path: a repository holding a FIFO where a
    distribution's entry_points.txt would be must not hang the look for plugins."""
    (tmp_path / "evil.dist-info").mkdir()
    os.mkfifo(tmp_path / "evil.dist-info" / "entry_points.txt")
    (tmp_path / "pack.yaml").write_text(PACK)
    proc = cli("validate", "pack.yaml", cwd=tmp_path)  # the cwd is on sys.path under python -m
    assert proc.returncode == 0, proc.stderr
    assert "0 error(s)" in proc.stdout


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_fifo_named_like_entry_points_does_not_hang_beside_a_real_plugin(tmp_path: Path) -> None:
    """With a distribution that does declare a ctxrules plugin on sys.path, the entry points
    are read from the distributions: a FIFO named like another one's entry_points.txt must
    still not be opened (importlib.metadata's entry_points() read it and hung)."""
    (tmp_path / "evil.dist-info").mkdir()
    os.mkfifo(tmp_path / "evil.dist-info" / "entry_points.txt")
    info = tmp_path / "acme-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme\nVersion: 0\n", encoding="utf-8")
    (info / "entry_points.txt").write_text("[ctxrules]\nacme = acme_fifo_plugin\n", encoding="utf-8")
    (tmp_path / "acme_fifo_plugin.py").write_text(
        "from ctxrules.hookspecs import hookimpl\nfrom ctxrules.stages.base import StageOutcome, StageType\n"
        "@hookimpl\ndef ctxrules_register_stages(register):\n"
        "    register(StageType('acme.fifo', 'content', lambda o: (lambda m, c: StageOutcome(list(m)))))\n",
        encoding="utf-8",
    )
    proc = cli("plugins", "--all", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "acme.fifo" in proc.stdout


# --- a stage's own section of state.json -------------------------------------------------------


@pytest.mark.parametrize("ours", [7, 1e308, True])
def test_a_mistyped_field_in_a_stage_state_resets_that_state_once(tmp_path: Path, ours: Any) -> None:
    """``stages.cache.ours`` is cache.markers' own bookkeeping: a value of the wrong type made
    the stage fail, and be skipped, on every later turn of the session (no cache markers)."""
    first, _ = run_cli(tmp_path, history())
    assert first.returncode == 0, first.stderr
    state_file = tmp_path / "state" / "default" / "state.json"
    state = json.loads(state_file.read_text())
    state["stages"]["cache"]["ours"] = ours
    state_file.write_text(json.dumps(state))
    grown = [*history(), {"role": "user", "content": "Thanks."}]
    proc, report = run_cli(tmp_path, grown)
    assert proc.returncode == 0, proc.stderr
    assert not [w for w in report["warnings"] if "failed and was skipped" in w]
    assert [w for w in report["warnings"] if "stage 'cache': its saved state could not be used" in w]
    assert {s["id"]: s["ran"] for s in report["stages"]}["cache"] is True
    # The reset state was saved: the next turn has nothing to say.
    proc, report = run_cli(tmp_path, [*grown, {"role": "assistant", "content": "You are welcome."}])
    assert proc.returncode == 0, proc.stderr
    assert report["warnings"] == [] and report["reused_messages"] == len(grown)
