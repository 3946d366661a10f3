"""The file tracker (``session.touch``, ``--touched``, file_edit calls) and
``reread.recent_files``."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from compress_kit import conversation, default_pack, make_ctx, step, system, text_of, user
from conftest import TRANSCRIPTS

from ctxrules.messages import injected_kind, injected_meta, is_injected, is_real_user
from ctxrules.pipeline.context import StageContext
from ctxrules.stages.base import options_schema_for
from ctxrules.stages.compress_remove import Remove
from ctxrules.stages.reread_recent_files import STAGE_TYPE, Reread
from ctxrules.tracker import TRACKER_FILE, FileTracker, TrackerError, edited_paths, load_tracked
from ctxrules.vault import parse_markers

Msg = dict[str, Any]
COMPACTED = ("compress.remove",)


def write(path: Path, text: str, mtime: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (mtime, mtime))
    return path


def file_paths(msg: dict[str, Any]) -> list[str]:
    """The paths of the files a reread message holds, in order (from its ``<file>`` blocks)."""
    return re.findall(r'^<file path="([^"]*)"', text_of(msg), flags=re.M)


def reread_messages(messages: list[Msg]) -> list[int]:
    return [i for i, m in enumerate(messages) if is_injected(m) and injected_kind(m) == "reread"]


def ctx_for(tmp_path: Path, **kw: Any) -> StageContext:
    kw.setdefault("compactions", COMPACTED)
    return make_ctx(tmp_path, window=kw.pop("window", 128_000), **kw)


# --- tracker ------------------------------------------------------------------------------------


def test_touch_records_absolute_paths_most_recent_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    tracker = FileTracker(tmp_path / "s", clock=lambda: 5.0)
    stored = tracker.touch("a.py", Path("sub/b.py"))
    assert stored == [str(tmp_path / "a.py"), str(tmp_path / "sub/b.py")]
    tracker.touch("a.py")
    assert [f.path for f in tracker.list()] == [str(tmp_path / "a.py"), str(tmp_path / "sub/b.py")]
    assert tracker.forget("a.py") == 1
    assert [f.path for f in load_tracked(tmp_path / "s")] == [str(tmp_path / "sub/b.py")]
    assert stat.S_IMODE((tmp_path / "s" / TRACKER_FILE).stat().st_mode) == 0o600


@pytest.mark.parametrize(("bad", "message"), [("", "must not be empty"), ("a\x00b", "NUL"), (42, "string or a path")])
def test_touch_rejects_bad_paths(tmp_path: Path, bad: Any, message: str) -> None:
    with pytest.raises(TrackerError, match=message):
        FileTracker(tmp_path / "s").touch(bad)


@pytest.mark.corpus
def test_edited_paths_from_a_claude_code_transcript() -> None:
    msgs = json.loads((TRANSCRIPTS / "claudecode-ae4a77f8.json").read_text())
    expected: dict[str, None] = {}
    for m in msgs:
        for c in m.get("tool_calls") or []:
            if c["function"]["name"] in ("Edit", "Write", "MultiEdit", "NotebookEdit"):
                args = json.loads(c["function"]["arguments"])
                path = args.get("file_path") or args.get("notebook_path")
                expected.pop(path, None)
                expected[path] = None
    got = edited_paths(msgs, default_pack())
    assert got == list(expected) and len(got) > 5


def test_edited_paths_skip_views_and_read_patches() -> None:
    msgs = [
        user("go"),
        *step("v", "file", name="str_replace_editor", command="view", path="/r/a.py"),
        *step("e", "ok", name="str_replace_editor", command="str_replace", path="/r/b.py"),
        *step(
            "p",
            "ok",
            name="apply_patch",
            input="*** Begin Patch\n*** Update File: src/c.py\n@@\n-x\n+y\n"
            "*** Add File: src/d.py\n+new\n*** End Patch\n",
        ),
        *step("r", "text", name="Read", file_path="/r/e.py"),
    ]
    assert edited_paths(msgs, default_pack()) == ["/r/b.py", "src/c.py", "src/d.py"]


# --- the stage ----------------------------------------------------------------------------------


def test_nothing_without_a_compaction(tmp_path: Path) -> None:
    f = write(tmp_path / "repo" / "a.py", "print(1)\n", 1000)
    ctx = ctx_for(tmp_path, compactions=("tool_output.filter",))
    FileTracker(ctx.vault.root.parent).touch(f)
    msgs = [system(), user("go"), *step("a", "ok")]
    out = Reread({})(msgs, ctx)
    assert out.messages == msgs and out.actions == []


def test_after_a_compaction_the_newest_files_come_back_once(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    a = write(repo / "a.py", "def a():\n    return 1\n", 1000)
    b = write(repo / "b.py", "B = 2\n", 2000)
    state: dict[str, Any] = {}
    ctx = ctx_for(tmp_path, state=state)
    FileTracker(ctx.vault.root.parent).touch(a, b)
    msgs = [system(), user("go"), *step("s", "ok"), user("what now?")]
    out = Reread({})(msgs, ctx)
    [at] = reread_messages(out.messages)
    assert at == len(msgs) - 1, "before the trailing real user message"
    msg = out.messages[at]
    assert msg["role"] == "user" and not is_real_user(msg)
    text = text_of(msg)
    assert text.index(str(b)) < text.index(str(a)), "newest modification first"
    assert "def a():\n    return 1\n</file>" in text and "B = 2\n</file>" in text
    assert file_paths(msg) == [str(b), str(a)] and injected_meta(msg) == {"files": "2"}
    # The same versions are never injected again ...
    again = Reread({})(out.messages, ctx_for(tmp_path, state=state))
    assert reread_messages(again.messages) == [at]
    assert {x.kind for x in again.actions} == {"skip"}
    # ... but a new version of one file is.
    write(a, "def a():\n    return 2\n", 3000)
    third = Reread({})(out.messages, ctx_for(tmp_path, state=state))
    new = [i for i in reread_messages(third.messages) if i != at]
    assert len(new) == 1 and "return 2" in text_of(third.messages[new[0]])
    assert str(b) not in text_of(third.messages[new[0]])


def test_files_from_history_edits_within_roots_only(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    inside = write(repo / "src" / "x.py", "X = 1\n", 1000)
    outside = write(tmp_path / "secret" / "key.txt", "TOPSECRET\n", 2000)
    msgs = [
        system(),
        user("edit"),
        *step("e1", "ok", name="Edit", file_path="src/x.py", old_string="a", new_string="b"),
        *step("e2", "ok", name="Write", file_path=str(outside), content="TOPSECRET\n"),
        *step("e3", "ok", name="Edit", file_path=str(repo / "missing.py")),
    ]
    ctx = ctx_for(tmp_path)
    out = Reread({"base_dir": str(repo)})(msgs, ctx)
    [at] = reread_messages(out.messages)
    text = text_of(out.messages[at])
    assert str(inside) in text and "TOPSECRET" not in text
    # Touching is the caller's explicit choice: allowed outside the roots.
    ctx = ctx_for(tmp_path, session="s2")
    FileTracker(ctx.vault.root.parent).touch(outside)
    out = Reread({"base_dir": str(repo)})(msgs, ctx)
    assert "TOPSECRET" in text_of(out.messages[reread_messages(out.messages)[0]])


def test_top_n_binary_and_oversized_files(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    files = [write(repo / f"f{n}.py", f"N = {n}\n", 1000 + n) for n in range(7)]
    binary = repo / "blob.bin"
    binary.write_bytes(b"\x00\x01\x02" * 10)
    os.utime(binary, (5000, 5000))
    big = write(repo / "big.txt", "y" * 5000, 6000)
    ctx = ctx_for(tmp_path)
    FileTracker(ctx.vault.root.parent).touch(*files, binary, big)
    out = Reread({"top_n": 3, "max_file_bytes": 4000})([system(), user("go"), *step("a", "ok")], ctx)
    paths = file_paths(out.messages[reread_messages(out.messages)[0]])
    # big.txt (too large) and blob.bin (binary) are newer but not files to re-read.
    assert [Path(p).name for p in paths] == ["f6.py", "f5.py", "f4.py"]


def test_budget_cuts_a_large_file_to_its_head(tmp_path: Path) -> None:
    content = "".join(f"line {i}: some code here = {i * 3}\n" for i in range(2000))
    f = write(tmp_path / "repo" / "big.py", content, 1000)
    ctx = ctx_for(tmp_path)
    FileTracker(ctx.vault.root.parent).touch(f)
    out = Reread({"budget_tokens": 3000, "min_partial_tokens": 500})([system(), user("go"), *step("a", "ok")], ctx)
    msg = out.messages[reread_messages(out.messages)[0]]
    assert ctx.counter.count_message(msg) <= 3200
    text = text_of(msg)
    (marker,) = parse_markers(text)
    assert ctx.vault.get_text(marker.vault_id) == content
    assert marker.lines is not None
    assert 'partial="true"' in text and text.count("line 0: some code") == 1


def test_never_lifts_utilization_to_the_ceiling(tmp_path: Path) -> None:
    f = write(tmp_path / "repo" / "a.py", "z = 1\n" * 3000, 1000)
    msgs = conversation(12, lines=60)
    ctx = ctx_for(tmp_path, window=24_000)
    assert ctx.budget.tier(ctx.count(msgs)) == "full"
    FileTracker(ctx.vault.root.parent).touch(f)
    out = Reread({"max_tier": "full"})(msgs, ctx)
    assert out.messages == msgs and out.actions[0].kind == "skip"


def test_edits_inside_removed_steps_are_found_through_the_vault(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    f = write(repo / "core.py", "CORE = True\n", 1000)
    msgs = [
        system(),
        user("go"),
        *step("e", "ok", name="Edit", file_path=str(f), old_string="a", new_string="b"),
        *[m for n in range(20) for m in step(f"s{n}", f"out {n}\n" * 80)],
    ]
    ctx = make_ctx(tmp_path, window=20_000, target="light")
    removed = Remove({"min_saving_ratio": 0})(msgs, ctx).messages
    assert not any(m.get("tool_calls", [{}])[0].get("id") == "e" for m in removed if m.get("role") == "assistant")
    out = Reread({"base_dir": str(repo)})(removed, ctx_for(tmp_path, window=64_000))
    assert "CORE = True" in text_of(out.messages[reread_messages(out.messages)[0]])


def test_cli_touched_reinjects_after_a_real_compaction(tmp_path: Path, cli: Any) -> None:
    f = write(tmp_path / "work" / "main.py", "def main():\n    return 42\n", 1000)
    history = conversation(40, lines=60, ask="Refactor main.py")
    src = tmp_path / "in.json"
    src.write_text(json.dumps(history))
    code, _, err = cli(
        "run",
        "--pack",
        "builtin:default",
        "--model",
        "gpt-4o",
        "--window",
        "32000",
        "--input",
        str(src),
        "--output",
        str(tmp_path / "out.json"),
        "--report",
        str(tmp_path / "r.json"),
        "--session",
        str(tmp_path / "s"),
        "--touched",
        str(f),
    )
    assert code == 0, err
    out = json.loads((tmp_path / "out.json").read_text())
    [at] = reread_messages(out)
    assert "return 42" in text_of(out[at])
    report = json.loads((tmp_path / "r.json").read_text())
    stages = {s["id"]: s for s in report["stages"]}
    assert stages["remove"]["tokens_saved"] > 0
    assert stages["reread"]["actions"][0]["kind"] == "reread"
    assert [t.path for t in load_tracked(tmp_path / "s")] == [str(f)]


def test_option_schema_documents_every_option() -> None:
    schema = options_schema_for(STAGE_TYPE)
    jsonschema.Draft202012Validator.check_schema(schema)
    for name, prop in schema["properties"].items():
        assert prop.get("title") and prop.get("description"), name
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"top_n": 0}, schema)
