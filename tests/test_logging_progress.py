"""Logging and progress: `CTXRULES_LOG=info` gives one line per prepare on stderr; an unknown
level is a usage error; apps using only `logging` receive the events; the CLI draws a progress
line on a terminal (tested on a real pty) for slow work, `--quiet` turns it off, and stdout
holds only the output."""

from __future__ import annotations

import json
import logging
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import FIXTURES, REPO
from llm_server import LLMServer, slow_reply

from ctxrules import Engine
from ctxrules.errors import UsageError

KEY_VARS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "DEEPSEEK_API_KEY")


def env(**extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k not in KEY_VARS and k != "CTXRULES_LOG"}
    out["PYTHONPATH"] = str(REPO / "engine")
    out.update(extra)
    return out


def ctxrules(*argv: str, cwd: Path, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ctxrules.cli.main", *argv], cwd=cwd, text=True, capture_output=True, timeout=300, **kw
    )


def long_history(steps: int = 24) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"role": "system", "content": "You fix bugs in a C compiler."},
        {"role": "user", "content": "The parser crashes on nested match arms; fix it."},
    ]
    for i in range(steps):
        out.append(
            {
                "role": "assistant",
                "content": f"Step {i}: I will look at src/{i}.c.",
                "tool_calls": [
                    {
                        "id": f"call_{i}",
                        "type": "function",
                        "function": {"name": "bash", "arguments": json.dumps({"cmd": f"grep -n match src/{i}.c"})},
                    }
                ],
            }
        )
        out.append(
            {
                "role": "tool",
                "tool_call_id": f"call_{i}",
                "content": "\n".join(f"src/{i}.c:{n}: case MATCH_ARM_{n}: bind(t_{n}, p);" for n in range(60)),
            }
        )
    out.append({"role": "user", "content": "Now apply the fix."})
    return out


def test_ctxrules_log_info_gives_one_line_per_prepare_and_stdout_holds_only_the_output(tmp_path: Path) -> None:
    (tmp_path / "in.json").write_text(json.dumps(long_history()))
    proc = ctxrules(
        "run",
        "--pack",
        "builtin:default",
        "--model",
        "gpt-4o",
        "--window",
        "16000",
        "--input",
        "in.json",
        cwd=tmp_path,
        env=env(CTXRULES_LOG="info"),
    )
    assert proc.returncode == 0, proc.stderr
    json.loads(proc.stdout)  # nothing but the output on stdout
    lines = [ln for ln in proc.stderr.splitlines() if " prepare " in ln]
    assert len(lines) == 1, proc.stderr
    m = re.search(
        r"ctxrules\.session INFO: prepare session=default tokens=(\d+)->(\d+) tier=(\w+)->(\w+) "
        r"changed=(\S+) ms=[\d.]+$",
        lines[0],
    )
    assert m, lines[0]
    assert int(m.group(1)) > int(m.group(2)) and m.group(3) != "below" and m.group(5) != "-"
    quiet = ctxrules(
        "run",
        "--pack",
        "builtin:default",
        "--model",
        "gpt-4o",
        "--input",
        "in.json",
        "--session",
        "s2",
        cwd=tmp_path,
        env=env(),
    )
    assert quiet.returncode == 0 and quiet.stderr == ""  # default: warnings only


def test_an_unknown_level_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "in.json").write_text('[{"role": "user", "content": "hi"}]')
    proc = ctxrules(
        "run",
        "--pack",
        "builtin:default",
        "--model",
        "gpt-4o",
        "--input",
        "in.json",
        cwd=tmp_path,
        env=env(CTXRULES_LOG="verbose"),
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (
        "ctxrules: error: CTXRULES_LOG='verbose' is not a log level; use one of debug, info, warning, error, critical\n"
    )
    monkeypatch.setenv("CTXRULES_LOG", "loud")
    with pytest.raises(UsageError, match="CTXRULES_LOG='loud' is not a log level"):
        Engine.load("builtin:default")
    monkeypatch.setenv("CTXRULES_LOG", "DEBUG")  # levels are case-insensitive
    Engine.load("builtin:default")
    monkeypatch.delenv("CTXRULES_LOG")
    Engine.load("builtin:default")  # unset again: back to the application's logging
    assert logging.getLogger("ctxrules").propagate


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_an_app_using_only_the_logging_module_receives_the_events(tmp_path: Path) -> None:
    handler = Collect()
    logger = logging.getLogger("ctxrules")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:

        def broken(event: dict[str, Any]) -> None:
            raise RuntimeError("ui went away")

        s = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o", window=16000, on_event=broken)
        s.prepare(long_history())
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
    by_name = {(r.name, r.levelname) for r in handler.records}
    assert ("ctxrules.session", "INFO") in by_name
    prepare = next(r for r in handler.records if r.name == "ctxrules.session")
    assert prepare.getMessage().startswith("prepare session=s tokens=")
    warning = next(r for r in handler.records if r.levelno == logging.WARNING)
    assert "on_event.error" in warning.getMessage() and "ui went away" in warning.getMessage()
    assert not any(r.levelno == logging.DEBUG for r in handler.records)  # the app's level holds


def slow_summarizer_pack(tmp_path: Path, server: LLMServer) -> Path:
    # A pack reads only inside its own folder: the parent goes next to it.
    shutil.copy(FIXTURES / "summarize" / "summary-only.yaml", tmp_path / "summary-only.yaml")
    pack = {
        "apiVersion": "ctxrules/v1",
        "kind": "RulePack",
        "metadata": {"name": "slow-summary", "version": "1.0.0"},
        "extends": ["./summary-only.yaml"],
        "summarizer": {"api_base": server.base_url, "inactivity_s": 10, "total_s": 60, "fallback": "none"},
    }
    path = tmp_path / "pack.yaml"
    path.write_text(yaml.safe_dump(pack))
    return path


def run_on_a_pty(argv: list[str], cwd: Path) -> tuple[int, str, str]:
    """Run the CLI with stderr on a pseudo-terminal (stdout a pipe); return rc, stdout, what the
    terminal received."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ctxrules.cli.main", *argv],
        cwd=cwd,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=slave,
        text=True,
    )
    os.close(slave)
    chunks: list[str] = []
    reader = threading.Thread(target=lambda: chunks.append(proc.stdout.read() if proc.stdout else ""))
    reader.start()  # a large output must not fill the pipe while the terminal is read
    seen = b""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # the child closed its end
                break
            if not data:
                break
            seen += data
        elif proc.poll() is not None:
            break
    rc = proc.wait(timeout=60)
    reader.join(timeout=60)
    if proc.stdout:
        proc.stdout.close()
    os.close(master)
    out = "".join(chunks)
    return rc, out, seen.decode("utf-8", "replace")


def test_the_cli_draws_progress_on_a_terminal_and_quiet_turns_it_off(tmp_path: Path) -> None:
    (tmp_path / "in.json").write_text(json.dumps(long_history()))
    with LLMServer() as server:
        server.script(
            slow_reply("x" * 120, every_s=0.05, chunk_chars=2), slow_reply("x" * 120, every_s=0.05, chunk_chars=2)
        )
        pack = slow_summarizer_pack(tmp_path, server)
        argv = [
            "run",
            "--pack",
            str(pack),
            "--model",
            "gpt-4o",
            "--window",
            "14000",
            "--input",
            "in.json",
            "--output",
            "-",
        ]
        rc, out, terminal = run_on_a_pty([*argv, "--session", "a"], tmp_path)
        assert rc == 0, terminal
        assert server.requests, "the summarizer was called (slowly)"
        json.loads(out)  # stdout: only the output
        assert "\r\x1b[K" in terminal and "ctxrules: " in terminal
        assert "summary" in terminal and re.search(r"summarizer \S* ?streaming: \d+ tokens", terminal), terminal
        assert terminal.endswith("\r\x1b[K")  # the line is erased at the end
        rc, out, terminal = run_on_a_pty([*argv, "--session", "b", "--quiet"], tmp_path)
        assert rc == 0 and terminal == "" and json.loads(out)
