"""``ctxrules run`` never writes over the file it reads: ``--output`` or ``--report`` naming
``--input`` (by path, through a symbolic link, or as a hard link) is a usage error before
anything runs, and the input is left as it was."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

HISTORY = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "List the files."},
    {"role": "assistant", "content": "Sure."},
]


def _args(src: Path, tmp_path: Path, *extra: str) -> list[str]:
    return [
        "run",
        "--pack",
        "builtin:default",
        "--model",
        "gpt-4o",
        "--input",
        str(src),
        "--session",
        str(tmp_path / "s"),
        *extra,
    ]


def test_an_output_or_report_naming_the_input_is_refused(tmp_path: Path, cli: Any) -> None:
    """`run --input h.json --output h.json` replaced the caller's history with the output (and
    `--report h.json` with the report): the full history was gone, and a failed write would
    have left neither."""
    src = tmp_path / "h.json"
    src.write_text(json.dumps(HISTORY), encoding="utf-8")
    before = src.read_bytes()
    (tmp_path / "link.json").symlink_to(src)
    os.link(src, tmp_path / "hard.json")
    for target in (src, tmp_path / "link.json", tmp_path / "hard.json"):
        for option in ("--output", "--report"):
            extra = [option, str(target)]
            if option == "--report":
                extra += ["--output", str(tmp_path / "out.json")]
            code, _, err = cli(*_args(src, tmp_path, *extra))
            assert code == 2, (option, target, err)
            assert f"{option} {target} is the input this run reads; give the output its own file" in err, err
            assert src.read_bytes() == before
    assert not (tmp_path / "s").exists()  # refused before a session was opened


def test_outputs_elsewhere_still_run(tmp_path: Path, cli: Any) -> None:
    src = tmp_path / "h.json"
    src.write_text(json.dumps(HISTORY), encoding="utf-8")
    out, report = tmp_path / "out.json", tmp_path / "report.json"
    code, _, err = cli(*_args(src, tmp_path, "--output", str(out), "--report", str(report), "--quiet"))
    assert code == 0, err
    assert json.loads(out.read_text())[1]["content"] == "List the files."
    assert json.loads(report.read_text())["after"]["messages"] == 3
    assert json.loads(src.read_text()) == HISTORY


def test_an_output_naming_the_file_redirected_to_stdin_is_refused(tmp_path: Path) -> None:
    """`ctxrules run --output h.json < h.json` wrote over the history it read from stdin."""
    from cli_kit import cli as shell

    src = tmp_path / "h.json"
    src.write_text(json.dumps(HISTORY), encoding="utf-8")
    before = src.read_bytes()
    args = ("run", "--pack", "builtin:default", "--model", "gpt-4o", "--session", str(tmp_path / "s"))
    with src.open("rb") as stdin:
        proc = shell(*args, "--output", str(src), stdin=stdin)
    assert proc.returncode == 2, proc.stderr
    assert f"--output {src} is the input this run reads; give the output its own file" in proc.stderr
    assert src.read_bytes() == before
    # From a pipe (nothing to compare with), or into another file, it runs.
    out = tmp_path / "out.json"
    proc = shell(*args, "--output", str(out), "--quiet", input=before.decode("utf-8"))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())[1]["content"] == "List the files."


def test_a_request_object_comes_back_sendable_with_the_callers_keys(tmp_path: Path, cli: Any) -> None:
    """An OpenAI request body in, the same body out: the call options the pack adds
    (`prompt_cache_key`) are request parameters where the caller set none, never a `request`
    object (OpenAI refuses an unknown parameter; a caller's own `request` key was replaced)."""
    tools = [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}]
    body = {"model": "gpt-4o", "temperature": 0.3, "request": {"mine": 1}, "messages": HISTORY, "tools": tools}
    src = tmp_path / "h.json"
    for given, key in (({}, "s"), ({"prompt_cache_key": "caller-key"}, "caller-key")):  # s: the session's id
        src.write_text(json.dumps({**body, **given}), encoding="utf-8")
        out = tmp_path / "out.json"
        code, _, err = cli(*_args(src, tmp_path, "--output", str(out), "--quiet"))
        assert code == 0, err
        sent = json.loads(out.read_text())
        assert set(sent) == {"model", "temperature", "request", "messages", "tools", "prompt_cache_key"}
        assert sent["request"] == {"mine": 1} and sent["temperature"] == 0.3 and sent["tools"] == tools
        assert sent["prompt_cache_key"] == key, sent["prompt_cache_key"]


def test_the_api_body_of_a_request_object_carries_the_call_options(tmp_path: Path) -> None:
    from ctxrules import Engine

    session = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o")
    result = session.prepare({"model": "gpt-4o", "messages": HISTORY})
    assert result.request and result.body == {"model": "gpt-4o", "messages": result.messages, **result.request}
    assert session.prepare(HISTORY).body == result.messages  # a list stays a list
