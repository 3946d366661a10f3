"""A file a verb writes (`run --output/--report`, `sessions resume --output`, `report --html`,
`eval --json`, ...) is replaced whole or not at all: a write that fails part-way (a full disk, a
file size limit) leaves the previous file as it was, not a cut-off JSON. Devices, pipes and the
file the shell's `>>` appends to are written in place, never renamed over."""

from __future__ import annotations

import json
import os
import resource
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_kit import ENGINE, cli

# 300 short messages: the pretty-printed output (about 17 KB) is larger than what the session
# keeps of it (last_output.jsonl, about 13 KB), so a file size limit between the two fails the
# output's write after the session has saved its turn.
HISTORY = [{"role": "system", "content": "You fix bugs."}] + [
    {"role": "user" if i % 2 == 0 else "assistant", "content": f"step {i}"} for i in range(300)
]
RUN = ["run", "--pack", "builtin:default", "--model", "gpt-4o", "--window", "32000", "--input", "in.json"]


def limited(max_bytes: int):  # type: ignore[no-untyped-def]
    """A child whose files cannot grow past ``max_bytes``: the write fails with EFBIG (the
    signal that would end the process is ignored), as a full disk fails it with ENOSPC."""

    def setup() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))

    return setup


def test_a_failed_output_write_leaves_the_previous_file_whole(tmp_path: Path) -> None:
    (tmp_path / "in.json").write_text(json.dumps(HISTORY))
    first = cli(*RUN, "--output", "out.json", "--report", "report.json", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    out, report = tmp_path / "out.json", tmp_path / "report.json"
    kept_out, kept_report = out.read_bytes(), report.read_bytes()
    saved = (tmp_path / ".ctxrules" / "default" / "last_output.jsonl").stat().st_size
    assert saved < 15_000 < len(kept_out), "the sizes this test relies on changed"
    os.chmod(out, 0o640)
    failed = cli(*RUN, "--output", "out.json", "--report", "report.json", cwd=tmp_path, preexec_fn=limited(15_000))
    assert failed.returncode == 2
    assert "out.json: cannot write: File too large" in failed.stderr and "Traceback" not in failed.stderr
    assert out.read_bytes() == kept_out and report.read_bytes() == kept_report
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".partial")]
    # A write that succeeds replaces the file and keeps its mode.
    again = cli(*RUN, "--output", "out.json", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert json.loads(out.read_text()) == json.loads(kept_out) and stat.S_IMODE(out.stat().st_mode) == 0o640


def test_a_new_output_gets_the_mode_open_gives_and_a_link_keeps_its_target(tmp_path: Path) -> None:
    (tmp_path / "in.json").write_text(json.dumps(HISTORY[:3]))
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "o.json").write_text("old")
    (tmp_path / "link.json").symlink_to("real/o.json")
    umask = os.umask(0o022)
    try:
        done = cli(*RUN, "--output", "link.json", "--report", "new.json", cwd=tmp_path)
    finally:
        os.umask(umask)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "link.json").is_symlink()
    assert json.loads((tmp_path / "real" / "o.json").read_text())[0]["content"] == "You fix bugs."
    assert stat.S_IMODE((tmp_path / "new.json").stat().st_mode) == 0o644


def test_an_output_through_dev_stdout_appends_where_the_shell_said(tmp_path: Path) -> None:
    """`--output /dev/stdout >> log`: renaming a new file over the log would lose what it held."""
    (tmp_path / "in.json").write_text(json.dumps(HISTORY[:3]))
    log = tmp_path / "log.txt"
    log.write_text("earlier lines\n")
    with open(log, "a") as sink:
        done = subprocess.run(
            [sys.executable, "-m", "ctxrules.cli.main", *RUN, "--output", "/dev/stdout"],
            env={**os.environ, "PYTHONPATH": ENGINE},
            cwd=tmp_path,
            stdout=sink,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
        )
    assert done.returncode == 0, done.stderr
    text = log.read_text()
    assert text.startswith("earlier lines\n") and json.loads(text[len("earlier lines\n") :])[1]["content"] == "step 0"


def test_an_export_that_cannot_be_written_is_one_line_naming_the_file(tmp_path: Path) -> None:
    """A full disk while `sessions export --to FILE` wrote said "internal error ... this is a bug"."""
    (tmp_path / "in.json").write_text(json.dumps(HISTORY))
    made = cli(*RUN, "--output", "out.json", "--session", "s", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    (tmp_path / "x.ctxs").write_text("an earlier archive")
    failed = cli("sessions", "export", "s", "--to", "x.ctxs", cwd=tmp_path, preexec_fn=limited(4_000))
    assert failed.returncode == 2
    assert failed.stderr.strip() == "ctxrules: error: --to x.ctxs: cannot write: File too large"
    assert (tmp_path / "x.ctxs").read_text() == "an earlier archive"
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".partial")]


def test_a_vault_that_cannot_be_written_is_named_not_the_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli: Any
) -> None:
    """Every compacting stage failed on the vault and was skipped; the run then said "does not
    fit" (exit 1): a script that handles that by raising the window does the wrong thing."""
    import errno

    from ctxrules.stores import filesystem

    big = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Fix it."}]
    for i in range(30):
        big += [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{i}", "type": "function", "function": {"name": "sh", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": f"line {i} of a long build log\n" * 400},
        ]  # fmt: skip
    (tmp_path / "in.json").write_text(json.dumps(big))
    real = filesystem.FilesystemStore._write_blob
    writes: list[str] = []

    def full_after_the_backup(self: Any, session: str, shard: str, path: str, data: bytes) -> None:
        writes.append(path)
        if len(writes) > 1:  # the checkpoint's backup is written; the items of the stages are not
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        real(self, session, shard, path, data)

    monkeypatch.setattr(filesystem.FilesystemStore, "_write_blob", full_after_the_backup)
    code, _, err = cli(*RUN[:-2], "--window", "16000", "--input", str(tmp_path / "in.json"),
                       "--session", str(tmp_path / "s"), "--output", str(tmp_path / "o.json"),
                       "--report", str(tmp_path / "r.json"))  # fmt: skip
    assert code == 2, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("ctxrules: error: cannot write to the vault at ") and "No space left on device" in line
    assert line.endswith("the stages that needed it failed, so the output does not fit")
    after = json.loads((tmp_path / "r.json").read_text())["after"]
    assert not after["fits"] and "stage(s) failed: " in after["reason"] and "No space left on device" in after["reason"]
