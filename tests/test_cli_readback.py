"""Small things on the way: the read-back command of `--explain` and the HTML report works when
pasted from another directory; `ctxrules report` on a wrong file says what it expected in one
line; skip reasons name tiers readably."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from html import unescape
from pathlib import Path

from conftest import REPO

ENV = {**os.environ, "PYTHONPATH": str(REPO / "engine")}


def ctxrules(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ctxrules.cli.main", *argv],
        cwd=cwd,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )


def big_history() -> list[dict[str, object]]:
    out = "\n".join(f"test_{i} PASSED in {i}ms" for i in range(20_000))
    return [
        {"role": "system", "content": "You run tests."},
        {"role": "user", "content": "Run the tests."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "pytest"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": out},
        {"role": "assistant", "content": "All pass."},
        {"role": "user", "content": "Good, now lint."},
    ]


def test_the_read_back_commands_work_from_another_directory(tmp_path: Path) -> None:
    work, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    (work / "in.json").write_text(json.dumps(big_history()))
    run = ctxrules(
        "run",
        "--pack",
        "builtin:default",
        "--model",
        "gpt-4o",
        "--input",
        "in.json",
        "--output",
        "out.json",
        "--report",
        "report.json",
        "--explain",
        cwd=work,
    )
    assert run.returncode == 0, run.stderr
    commands = re.findall(r"ctxrules vault get .+", run.stdout)
    assert commands, run.stdout
    html = ctxrules("report", str(work / "report.json"), "--html", str(work / "page.html"), cwd=work)
    assert html.returncode == 0, html.stderr
    page = (work / "page.html").read_text()
    from_html = [unescape(c) for c in re.findall(r"<td>(ctxrules vault get [^<]+)</td>", page)]
    assert from_html and from_html[0] == commands[0].strip()
    for command in (commands[0], from_html[0]):
        argv = shlex.split(command)[1:]
        assert "--session" in argv
        got = ctxrules(*argv, cwd=elsewhere)
        assert got.returncode == 0, got.stderr
        assert "test_0 PASSED" in got.stdout and "test_19999 PASSED" in got.stdout


def test_report_on_a_wrong_file_says_what_it_expected_in_one_line(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    conversation = tmp_path / "conversation.json"
    conversation.write_text(json.dumps({"messages": big_history()}))
    code, out, err = cli("report", str(conversation))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and len(err) < 400, err
    assert "expected the JSON object `ctxrules run --report FILE` writes" in err
    assert "missing keys: version" in err and "ctxrules run --input" in err
    assert "test_0 PASSED" not in err  # the file is not echoed
    listing = tmp_path / "list.json"
    listing.write_text(json.dumps(big_history()))
    code, _, err = cli("report", str(listing))
    assert code == 2 and "this file holds an array" in err and err.count("\n") == 1 and "PASSED" not in err


def test_skip_reasons_name_tiers_readably(tmp_path: Path) -> None:
    from ctxrules import Engine

    s = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o")
    report = s.prepare([{"role": "user", "content": "hi"}]).report
    reasons = [st["skipped"] for st in report["stages"] if st.get("skipped")]
    assert any("tier `below` is under `" in r for r in reasons), reasons
    assert not any(re.search(r"tier below is below", r) for r in reasons)


def test_run_refuses_an_output_and_a_report_in_one_place(tmp_path: Path, cli, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Both on stdout, the two JSON documents ran together and neither parsed; in one file the
    # report overwrote the output (or, named the other way round, the input it was read from).
    monkeypatch.chdir(tmp_path)
    source = tmp_path / "in.json"
    source.write_text(json.dumps(big_history()))
    base = ("run", "--pack", "builtin:default", "--model", "gpt-4o", "--input", str(source))
    (tmp_path / "loop").symlink_to("loop")  # a link loop is a place too, not an internal error
    same = (
        ["--report", "-"],
        ["--output", "-", "--report", "-"],
        ["--output", "o.json", "--report", "./o.json"],
        ["--output", "loop", "--report", "loop"],
    )
    for where in same:
        code, out, err = cli(*base, *where)
        assert (code, out) == (2, ""), (where, err)
        assert "--output and --report both write to" in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.json", "loop"]  # nothing was run or written
    # The same place by another name: stdout as /dev/stdout (a pipe here), a hard link.
    (tmp_path / "o.json").write_text("")
    os.link(tmp_path / "o.json", tmp_path / "hard.json")
    code, out, err = cli(*base, "--output", "o.json", "--report", "hard.json")
    assert code == 2 and "the same file (hard.json)" in err, err
    proc = subprocess.run(
        [sys.executable, "-m", "ctxrules.cli.main", *base, "--report", "/dev/stdout"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO / "engine")},
        check=False,
    )
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
    assert "both write to stdout" in proc.stderr
    assert (tmp_path / "o.json").read_text() == ""
    # The report on stdout: the --explain table goes to stderr, stdout is the report alone.
    code, out, err = cli(*base, "--output", "o.json", "--report", "-", "--explain")
    assert code == 0, err
    assert json.loads(out)["version"] == 1 and "stage" in err


def test_vault_get_refuses_two_line_ranges_that_differ_and_an_empty_one(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    """`vault get vault://ID#L3-L4 --lines 1:2` printed lines 1-2 without a word (the caller
    meant one range and got the other); `--lines ""` (an unset variable) printed the whole item."""
    from ctxrules.stores.filesystem import FilesystemStore
    from ctxrules.vault import Vault

    session = tmp_path / "s"
    item = Vault.of(FilesystemStore(tmp_path), str(session)).put_text("".join(f"line {i}\n" for i in range(1, 9)))
    got = cli("vault", "get", f"vault://{item}#L3-L4", "--lines", "1:2", "--session", str(session))
    assert got[0] == 2 and got[1] == "", got
    assert "the ref names lines 3:4 and --lines 1:2: give one range" in got[2]
    got = cli("vault", "get", item, "--lines", "", "--session", str(session))
    assert got[0] == 2 and got[1] == "" and "--lines takes A:B" in got[2], got
    got = cli("vault", "get", f"vault://{item}#L3-L4", "--lines", "3:4", "--session", str(session))
    assert got == (0, "line 3\nline 4\n", ""), got  # the same range twice is one range
