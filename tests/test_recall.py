"""The recall tool: definitions, answers (exact lines, paging, budgets), the ids it refuses,
the pack's ``recall:`` key, and the MCP server driven by the SDK's own client."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO

from ctxrules import Engine
from ctxrules.messages import message_text
from ctxrules.recall import PARAMETERS, RecallError
from ctxrules.toolroles import tool_roles
from ctxrules.vault import parse_markers

Msg = dict[str, Any]


def log(n: int) -> str:
    return "".join(f"line {i:04d} of job {n}: value={(i * 7919) % 10007}\n" for i in range(1, 1201))


def history(steps: int = 6) -> list[Msg]:
    msgs: list[Msg] = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Run the jobs."}]
    for n in range(1, steps + 1):
        msgs.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"c{n}",
                        "type": "function",
                        "function": {"name": "Bash", "arguments": json.dumps({"command": f"job {n}"})},
                    }
                ],
            }
        )
        msgs.append({"role": "tool", "tool_call_id": f"c{n}", "content": log(n)})
    msgs.append({"role": "user", "content": "What did job 1 print on line 500?"})
    return msgs


def prepared(tmp_path: Path, pack: str = "builtin:default") -> tuple[Any, list[Msg]]:
    session = Engine.load(pack).session(tmp_path / "s", model="gpt-4o", window=200_000)
    out = session.prepare(history()).messages
    return session, out


def line_markers(messages: list[Msg]) -> list[Any]:
    return [m for msg in messages for m in parse_markers(message_text(msg)) if m.lines]


def test_an_agent_loop_reads_back_the_exact_lines_behind_a_marker(tmp_path: Path) -> None:
    session, out = prepared(tmp_path)
    marker = line_markers(out)[0]
    a, b = marker.lines
    # The model calls the tool with the marker's ref, as it appears in the text.
    call = {"id": f"vault://{marker.vault_id}#L{a}-L{b}"}
    answer = session.recall(json.dumps(call))
    original = next(
        m["content"] for m in history() if m.get("role") == "tool" and f"vault://{marker.vault_id}" in json.dumps(out)
    )
    lines = original.splitlines(keepends=True)
    body, _, tail = answer.rpartition("[ctxrules:elided")
    # A page within the budget, then a marker for the rest.
    assert body and lines[a - 1 :].__len__() > 0
    assert original.find(body) >= 0 and body.startswith(lines[a - 1])
    nxt = parse_markers("[ctxrules:elided" + tail)[0]
    assert nxt.vault_id == marker.vault_id and nxt.lines is not None and nxt.lines[1] == b
    assert session.counter.count_text(body) <= 4000
    # Following the next-page markers gives back every line of the range, in order.
    pages = [body]
    while True:
        page = session.recall({"id": nxt.vault_id, "lines": f"{nxt.lines[0]}:{nxt.lines[1]}"})
        text, sep, rest = page.rpartition("[ctxrules:elided")
        if not sep:
            pages.append(page)
            break
        pages.append(text)
        nxt = parse_markers(sep + rest)[0]
    assert "".join(pages) == "".join(lines[a - 1 : b])


def test_lines_and_prefixes(tmp_path: Path) -> None:
    session, out = prepared(tmp_path)
    marker = line_markers(out)[0]
    original = session.vault.get(marker.vault_id).decode().splitlines(keepends=True)
    assert session.recall({"id": marker.vault_id[:12], "lines": "3:5"}) == "".join(original[2:5])
    assert session.recall({"id": marker.vault_id, "lines": "7"}) == original[6]
    with pytest.raises(RecallError, match="lines"):
        session.recall({"id": marker.vault_id, "lines": "5:3"})
    with pytest.raises(RecallError, match="does not exist"):
        session.recall({"id": marker.vault_id, "lines": f"{len(original) + 5}:"})
    with pytest.raises(RecallError, match="at least 12"):
        session.recall({"id": marker.vault_id[:8]})
    with pytest.raises(RecallError, match="JSON object"):
        session.recall("not json")
    # Numbers past what int() reads are a malformed call, said in a short message.
    for call in (
        {"id": marker.vault_id, "lines": "9" * 5000},
        {"id": marker.vault_id, "lines": "1:" + "9" * 5000},
        {"id": f"vault://{marker.vault_id}#L1-L{'9' * 5000}"},
    ):
        with pytest.raises(RecallError) as caught:
            session.recall(call)
        assert len(str(caught.value)) < 250, str(caught.value)


def test_a_long_run_of_spaces_in_lines_is_answered_not_hung(tmp_path: Path) -> None:
    """The model writes `lines`: spaces around the numbers are allowed, but a call that is a long
    run of them must not make the pattern backtrack for hours (it ran in cubic time)."""
    import subprocess

    session, out = prepared(tmp_path)
    marker = line_markers(out)[0]
    original = session.vault.get(marker.vault_id).decode().splitlines(keepends=True)
    script = (
        "import json, sys\n"
        "from ctxrules import Engine\n"
        "from ctxrules.recall import RecallError\n"
        "s = Engine.load('builtin:default').session(sys.argv[1], model='gpt-4o', window=200_000)\n"
        "pad = ' ' * 50_000\n"
        "for lines in (pad + 'x', pad + '3 : 5' + pad, '1' + pad + ':' + pad + 'x'):\n"
        "    try:\n"
        "        print(json.dumps(s.recall({'id': sys.argv[2], 'lines': lines})))\n"
        "    except RecallError as exc:\n"
        "        print(json.dumps('error: ' + str(exc)[:200]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "engine") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-c", script, str(session.path), marker.vault_id],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,  # a hang guard: the old pattern took hours on these calls
    )
    assert proc.returncode == 0, proc.stderr
    bad, spaced, bad_too = (json.loads(line) for line in proc.stdout.splitlines())
    assert bad.startswith("error: lines") and 'is not of the form "A:B"' in bad
    assert spaced == "".join(original[2:5])
    assert bad_too.startswith("error: lines") and 'is not of the form "A:B"' in bad_too


def _with_output(tmp_path: Path, output: str) -> tuple[Any, str]:
    """A session whose one tool output (``output``) was elided behind a marker: the session
    and the marker's vault id."""
    msgs = history()
    msgs[3] = {**msgs[3], "content": output}
    session = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o", window=200_000)
    out = session.prepare(msgs).messages
    (marker, *_) = [m for m in line_markers(out) if session.vault.get(m.vault_id).decode() == output]
    return session, marker.vault_id


def test_lines_are_counted_as_markers_and_vault_get_count_them(tmp_path: Path) -> None:
    """Only "\\n" ends a line: progress redraws ("\\r"), form feeds and the other characters
    str.splitlines breaks at stay inside their line, so recall's A:B is vault get's A:B."""
    output = "".join(
        f"pkg{i} 10%\r pkg{i} 60%\r pkg{i} done\x0c\u2028 ok {(i * 7919) % 10007}\n" for i in range(1, 1500)
    )
    session, vault_id = _with_output(tmp_path, output)
    for a, b in ((3, 4), (1, 1), (700, 702)):
        assert session.recall({"id": vault_id, "lines": f"{a}:{b}"}) == session.vault.get_lines(vault_id, a, b).decode()
    with pytest.raises(RecallError, match="1 <= a <= b"):
        session.recall({"id": f"vault://{vault_id}#L5-L3"})
    with pytest.raises(RecallError, match="1 <= a <= b"):
        session.recall({"id": f"vault://{vault_id}#L0-L3"})


def test_an_output_with_bytes_that_are_not_utf8_is_read_as_text(tmp_path: Path) -> None:
    """`ctxrules compress` keeps a command's raw bytes: a Latin-1 byte in a build log. Recall
    answers its lines (that byte as U+FFFD), numbered as the marker numbers them; only what is
    media (a type that is not text/*, or NUL bytes) is a binary item."""
    session, _ = _with_output(tmp_path, log(1))
    raw = b"".join(b"compiling unit %d \xe9t\xe9\n" % i for i in range(1, 401))
    vault_id = session.vault.put_bytes(raw)
    image = session.vault.put_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64), "image/png")
    from ctxrules.recall import RecallSettings, answer_recall

    settings = RecallSettings.from_pack(session.engine.pack.data)

    def ask(vid: str, lines: str | None = None) -> str:
        call = {"id": vid, **({"lines": lines} if lines else {})}
        return answer_recall(call, vault=session.vault, allowed={vid}, count=len, settings=settings)

    assert ask(vault_id, "5:6") == "compiling unit 5 \ufffdt\ufffd\ncompiling unit 6 \ufffdt\ufffd\n"
    assert "binary item" in ask(image) and "image/png" in ask(image)


def test_a_page_of_a_large_item_is_read_without_a_list_of_all_its_lines(tmp_path: Path) -> None:
    import tracemalloc

    from ctxrules.recall import RecallSettings, answer_recall
    from ctxrules.vault import Vault

    vault = Vault(tmp_path / "vault")
    data = "".join(f"{i:07d}\n" for i in range(1_000_000))  # 8 MB of short lines
    vid = vault.put_text(data)
    tracemalloc.start()
    try:
        answer = answer_recall(
            {"id": vid, "lines": "500001:"}, vault=vault, allowed={vid}, count=len, settings=RecallSettings()
        )
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert answer.startswith("0500000\n0500001\n") and answer.endswith(f"ref=vault://{vid}#L500501-L1000000]")
    assert peak < 3 * len(data)


def test_only_ids_this_sessions_markers_reference_are_answered(tmp_path: Path) -> None:
    session, out = prepared(tmp_path)
    referenced = {m.vault_id for msg in out for m in parse_markers(message_text(msg))}
    stored = {p.name for p in (session.path / "vault").rglob("*") if p.is_file() and len(p.name) == 64}
    unreferenced = stored - referenced
    secret = session.vault.put_text("a secret the agent was never pointed at")
    for vid in [*unreferenced, secret]:
        with pytest.raises(RecallError, match="no marker of this conversation"):
            session.recall({"id": vid})
    # Another session's items are not this session's either.
    _, other_out = prepared(tmp_path / "other")
    foreign = line_markers(other_out)[0].vault_id
    with pytest.raises(RecallError):
        Engine.load("builtin:default").session(tmp_path / "empty", model="gpt-4o").recall({"id": foreign})


def test_a_new_process_answers_from_the_session_directory(tmp_path: Path) -> None:
    session, out = prepared(tmp_path)
    marker = line_markers(out)[0]
    again = Engine.load("builtin:default").session(session.path, model="gpt-4o")
    assert again.recall({"id": marker.vault_id, "lines": "1:2"}) == session.recall(
        {"id": marker.vault_id, "lines": "1:2"}
    )


def test_a_marker_with_a_quoted_field_inside_a_removed_span_is_answered(tmp_path: Path) -> None:
    # Results without a call id (legacy `function` messages): a dedup marker names the copy it
    # keeps as duplicate_of="a newer result", a quoted field. Archived in a span of removed
    # messages, it is in the span's JSON with its quotes escaped; the recall answer shows it so,
    # and the model asks for it: an item referenced from inside a referenced item is answered.
    pack = tmp_path / "pack.yaml"
    pack.write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: p, version: 1.0.0}\n"
        "context: {window: auto, reserve_output: 1000, tail_budget: 0.05}\n"
        "pipeline:\n"
        "  - {id: dedup, use: compress.dedup, with: {target: monitor, min_saving_ratio: 0.0}}\n"
        "  - {id: remove, use: compress.remove, with: {target: light}}\n"
    )
    same = "".join(f"row {i}: the same status line\n" for i in range(300))
    msgs: list[Msg] = [{"role": "system", "content": "agent"}, {"role": "user", "content": "check"}]
    for n in range(12):
        msgs.append({"role": "assistant", "content": None, "function_call": {"name": "status", "arguments": "{}"}})
        msgs.append({"role": "function", "name": "status", "content": same if n in (0, 11) else f"run {n}\n" * 200})
    msgs.append({"role": "user", "content": "and now?"})
    session = Engine.load(str(pack)).session(tmp_path / "s", model="gpt-4o", window=12_000)
    out = session.prepare(msgs).messages
    (span,) = [m for msg in out for m in parse_markers(message_text(msg)) if m.kind == "message"]
    shown = session.recall({"id": span.vault_id, "lines": "1:"})
    inner = [m for msg in json.loads(session.vault.get_text(span.vault_id)) for m in parse_markers(message_text(msg))]
    quoted = [m for m in inner if m.extra.get("duplicate_of") == "a newer result"]
    assert quoted and f"vault://{quoted[0].vault_id}" in shown
    for marker in quoted:
        assert session.recall({"id": marker.ref}) == session.vault.get_text(marker.vault_id)


def test_the_pack_words_the_tool_and_sets_the_budget(tmp_path: Path) -> None:
    pack = tmp_path / "pack.yaml"
    pack.write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: p, version: 1.0.0}\n"
        "extends: [builtin:default]\n"
        "recall: {name: read_back, description: Read back moved-out text., budget_tokens: 200}\n"
    )
    session, out = prepared(tmp_path, str(pack))
    tool = session.recall_tool()
    assert tool["function"]["name"] == "read_back"
    assert tool["function"]["description"] == "Read back moved-out text."
    assert session.recall_tool("anthropic")["input_schema"]["required"] == ["id"]
    marker = line_markers(out)[0]
    answer = session.recall({"id": marker.vault_id})
    body = answer.rpartition("[ctxrules:elided")[0]
    assert 0 < session.counter.count_text(body) <= 200
    # The renamed tool keeps the file_read role: its outputs are never reduced again.
    assert tool_roles(session.engine.pack.data).role_of("read_back") == "file_read"
    assert tool_roles(Engine.load("builtin:default").pack.data).role_of("ctxrules_recall") == "file_read"


def test_a_bad_recall_key_is_a_located_diagnostic(tmp_path: Path) -> None:
    from ctxrules.cli.main import run

    pack = tmp_path / "pack.yaml"
    pack.write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: p, version: 1.0.0}\n"
        "recall: {name: 'bad name!', budget_tokens: 0, colour: red}\n"
    )
    assert run(["validate", str(pack), "--format", "json"]) == 1


# --- the MCP server, driven by the SDK's own client ----------------------------------------------


mcp = pytest.importorskip("mcp", reason='the MCP SDK is not installed: pip install "ctxrules[mcp]"')


def test_the_mcp_server_answers_the_recall_tool(tmp_path: Path) -> None:
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    session, out = prepared(tmp_path)
    marker = line_markers(out)[0]
    expected = session.recall({"id": marker.vault_id, "lines": "10:12"})
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO / "engine") + os.pathsep + env.get("PYTHONPATH", "")

    async def talk() -> tuple[list[str], Any, Any]:
        params = StdioServerParameters(
            command=sys.executable, env=env, args=["-m", "ctxrules.cli.main", "mcp", "--session", str(session.path)]
        )
        async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
            await client.initialize()
            tools = await client.list_tools()
            good = await client.call_tool("ctxrules_recall", {"id": marker.vault_id, "lines": "10:12"})
            bad = await client.call_tool("ctxrules_recall", {"id": "ab" * 32})
            huge = await client.call_tool("ctxrules_recall", {"id": marker.vault_id, "lines": "9" * 5000})
            (tool,) = tools.tools
            schema = getattr(tool, "input_schema", None) or tool.inputSchema  # SDK 2.x or 1.x
            return [tool.name, schema], good, bad, huge

    (name, schema), good, bad, huge = asyncio.run(asyncio.wait_for(talk(), timeout=60))
    assert name == "ctxrules_recall"
    # The model is told what id and lines take, as session.recall_tool() tells it.
    for arg in ("id", "lines"):
        assert schema["properties"][arg]["description"] == PARAMETERS["properties"][arg]["description"]
    assert schema["required"] == ["id"]
    assert not _is_error(good) and good.content[0].text == expected
    assert _is_error(bad) and "no marker of this conversation" in bad.content[0].text
    assert _is_error(huge) and 'is not of the form "A:B"' in huge.content[0].text  # the reason, not a bare error


def _is_error(result: Any) -> bool:
    return bool(getattr(result, "is_error", getattr(result, "isError", False)))


def test_mcp_without_a_session_directory_is_a_usage_error(tmp_path: Path) -> None:
    from ctxrules.cli.main import run

    assert run(["mcp", "--session", str(tmp_path / "missing")]) == 2


def _mcp_argv(session: Path) -> list[str]:
    return [sys.executable, "-m", "ctxrules.cli.main", "mcp", "--session", str(session)]


def _mcp_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO / "engine") + os.pathsep + env.get("PYTHONPATH", "")
    return env


class _Wire:
    """`ctxrules mcp` on a session as a client meets it: lines out on its stdin, one answer
    (a JSON line) at a time back from its stdout."""

    def __init__(self, session: Path) -> None:
        import subprocess

        self.proc = subprocess.Popen(
            _mcp_argv(session), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_mcp_env()
        )

    def send_line(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data + b"\n")
        self.proc.stdin.flush()

    def send(self, message: object) -> None:
        self.send_line(json.dumps(message).encode())

    def answer(self) -> dict[str, Any]:
        import select

        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 30)
        assert ready, "no answer within 30 s"
        return json.loads(self.proc.stdout.readline())  # type: ignore[no-any-return]

    def initialize(self) -> None:
        hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
        self.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello})
        assert self.answer()["id"] == 1
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def close(self) -> int:
        """Stdin closed, as a client that goes away: the server's exit code."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        code = self.proc.wait(timeout=60)
        self.proc.stdout.close()
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        return code


def test_a_client_that_stops_reading_mid_call_ends_the_server_quietly(tmp_path: Path) -> None:
    """A client that dies with calls in flight (its read end closed, then its write end): the
    server's next reply met a broken pipe and it ended in `internal error: ExceptionGroup`,
    exit 2. The client went away, as when it closes stdin: exit 0, nothing on stderr.
    (Raw JSON-RPC: the SDK's client cannot close only its read end.)"""
    import subprocess

    session, out = prepared(tmp_path)
    marker = line_markers(out)[0]
    proc = subprocess.Popen(
        _mcp_argv(session.path),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_mcp_env(),
    )
    assert proc.stdin is not None and proc.stdout is not None

    def send(message: dict[str, Any]) -> None:
        assert proc.stdin is not None
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")
        proc.stdin.flush()

    hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    send({"id": 1, "method": "initialize", "params": hello})
    assert b'"id":1' in proc.stdout.readline()
    send({"method": "notifications/initialized"})
    for n in range(20):
        arguments = {"id": marker.vault_id, "lines": f"{n + 1}:"}
        send({"id": 10 + n, "method": "tools/call", "params": {"name": "ctxrules_recall", "arguments": arguments}})
    # Twenty pages of some 18 kB each overfill the pipe (64 kB): a second after the first
    # page is read, the server is blocked writing, and the reader goes.
    assert b'"result"' in proc.stdout.readline()
    time.sleep(1)
    proc.stdout.close()
    proc.stdin.close()
    assert proc.stderr is not None
    with proc.stderr:
        err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0, err
    assert "internal error" not in err and "Traceback" not in err, err


def _replies_stand_still(reader: Any, least: int, *, pause: float) -> None:
    """Wait until at least ``least`` bytes of replies wait unread in ``reader`` (a pipe or a
    socket) and their count has stayed the same over two pauses of ``pause`` s (the server
    is then blocked writing the rest); 120 s at most."""
    import fcntl
    import termios

    def waiting() -> int:
        held = bytearray(4)
        fcntl.ioctl(reader, termios.FIONREAD, held)
        return int.from_bytes(held, sys.byteorder)

    deadline, seen = time.monotonic() + 120, [-1, -2]
    while (now := waiting()) < least or seen != [now, now]:
        assert time.monotonic() < deadline, f"the replies filled {now} bytes (waiting for {least})"
        seen = [seen[1], now]
        time.sleep(pause)


@pytest.mark.skipif(sys.platform != "linux", reason="the server reopens its stdout pipe through /proc (Linux)")
@pytest.mark.parametrize("refused", [False, True])
def test_a_client_that_closes_stdin_but_never_reads_is_given_up_on(tmp_path: Path, refused: bool) -> None:
    """A client that sends calls, closes stdin and keeps stdout open without reading it: the
    replies fill the pipe, and the server waited for ever to write them. Once no reply has
    moved for GIVE_UP_S after stdin closed, the server drops what is due and exits 0. Also
    when lines the server answers itself (not JSON) follow the calls: the thread reading stdin
    then waits to send its answer and never reads to the end."""
    import subprocess

    from ctxrules.integrations.mcp import GIVE_UP_S

    session, out = prepared(tmp_path)
    marker = line_markers(out)[0]
    wire = _Wire(session.path)
    wire.initialize()
    for n in range(20):  # some 18 kB each: more than the pipe holds
        arguments = {"id": marker.vault_id, "lines": f"{n + 1}:"}
        wire.send({"jsonrpc": "2.0", "id": 10 + n, "method": "tools/call", "params": {
            "name": "ctxrules_recall", "arguments": arguments}})  # fmt: skip
    assert wire.proc.stdin is not None and wire.proc.stdout is not None and wire.proc.stderr is not None
    # Until the pipe is full (the server then waits to write the rest): closing stdin before
    # lets the SDK drop the calls it has not answered yet, and all may fit. Half full at least,
    # and no longer growing for a second (a loaded machine can pause half a second between two
    # replies).
    import fcntl

    _replies_stand_still(wire.proc.stdout, fcntl.fcntl(wire.proc.stdout, fcntl.F_GETPIPE_SZ) // 2, pause=0.5)
    if refused:
        wire.send_line(b"not json")
        time.sleep(0.5)  # its answer waits behind the replies
    wire.proc.stdin.close()
    started = time.monotonic()
    try:
        code = wire.proc.wait(timeout=GIVE_UP_S + 30)
    except subprocess.TimeoutExpired:
        wire.proc.kill()
        raise AssertionError("the server still waits for a client that reads nothing") from None
    finally:
        wire.proc.stdout.close()
    waited = time.monotonic() - started
    with wire.proc.stderr:
        err = wire.proc.stderr.read().decode()
    assert code == 0, err
    assert "Traceback" not in err, err
    assert waited >= GIVE_UP_S - 1, waited  # given up on only after the wait


@pytest.mark.skipif(sys.platform != "linux", reason="FIONREAD on a socket, POLLRDHUP (Linux)")
@pytest.mark.parametrize("refused", [False, True])
def test_a_client_on_sockets_that_shuts_stdin_but_never_reads_is_given_up_on(tmp_path: Path, refused: bool) -> None:
    """As above, with stdin and stdout socket pairs, as Node.js clients start a server (libuv
    makes its stdio "pipes" of sockets), and stdin ended the way Node's ``stdin.end()`` ends
    it (shutdown of the client's writing side). /proc cannot open a socket again, so stdout
    stayed blocking and the server waited for ever for a client that reads nothing."""
    import socket
    import subprocess

    from ctxrules.integrations.mcp import GIVE_UP_S

    session, out = prepared(tmp_path)
    marker = line_markers(out)[0]
    client_in, server_in = socket.socketpair()
    client_out, server_out = socket.socketpair()
    proc = subprocess.Popen(
        _mcp_argv(session.path), stdin=server_in, stdout=server_out, stderr=subprocess.PIPE, env=_mcp_env()
    )
    server_in.close()
    server_out.close()
    try:

        def send(message: dict[str, Any]) -> None:
            client_in.sendall(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")

        hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
        send({"id": 1, "method": "initialize", "params": hello})
        client_out.settimeout(60)
        assert b'"id":1' in client_out.recv(1 << 16)
        send({"method": "notifications/initialized"})
        for n in range(40):  # some 18 kB each: more than the socket buffers hold
            arguments = {"id": marker.vault_id, "lines": f"{n + 1}:"}
            send({"id": 10 + n, "method": "tools/call", "params": {"name": "ctxrules_recall", "arguments": arguments}})

        # Until the replies stop coming (the server then waits to write the rest): some
        # 200 kB, the server's send buffer (128 kB at least), the same for two seconds running
        # however slowly a loaded machine answers. Shut before, the SDK may drop the calls it
        # has not answered, and what is left may fit.
        _replies_stand_still(client_out, 128 * 1024, pause=1.0)
        if refused:
            client_in.sendall(b"not json\n")
            time.sleep(0.5)  # its answer waits behind the replies
        client_in.shutdown(socket.SHUT_WR)
        started = time.monotonic()
        try:
            code = proc.wait(timeout=GIVE_UP_S + 30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError("the server still waits for a client that reads nothing") from None
        waited = time.monotonic() - started
        assert proc.stderr is not None
        err = proc.stderr.read().decode()
    finally:
        client_in.close()
        client_out.close()
        if proc.stderr is not None:
            proc.stderr.close()
    assert code == 0, err
    assert "Traceback" not in err, err
    assert waited >= GIVE_UP_S - 1, waited  # given up on only after the wait


def test_calls_sent_before_stdin_ends_are_all_answered(tmp_path: Path) -> None:
    """`ctxrules mcp < calls.jsonl`: the SDK cancels what it has not answered when its input
    ends, so a client that sent its calls and closed stdin got the first few answers and the
    server exited 0 without the rest. The end of stdin is held back until every request the
    SDK took is answered; answers go out for all of them, at once (no give-up wait)."""
    import subprocess

    from ctxrules.integrations.mcp import GIVE_UP_S

    session, out = prepared(tmp_path)
    marker = line_markers(out)[0]
    hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    lines = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": "list", "method": "tools/list"},
        {"jsonrpc": "2.0", "id": "nope", "method": "no/such/method"},
    ]
    for n in range(20):
        arguments = {"id": marker.vault_id, "lines": f"{n + 1}:"}
        lines.append({"jsonrpc": "2.0", "id": 10 + n, "method": "tools/call", "params": {
            "name": "ctxrules_recall", "arguments": arguments}})  # fmt: skip
    calls = tmp_path / "calls.jsonl"
    calls.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    started = time.monotonic()
    with calls.open("rb") as stdin:
        run = subprocess.run(_mcp_argv(session.path), stdin=stdin, capture_output=True, env=_mcp_env(), timeout=120)
    took = time.monotonic() - started
    assert run.returncode == 0, run.stderr
    answers = [json.loads(line) for line in run.stdout.splitlines()]
    assert sorted(map(str, (a["id"] for a in answers))) == sorted(map(str, [1, "list", "nope", *range(10, 30)])), [
        a["id"] for a in answers
    ]
    pages = [a for a in answers if isinstance(a["id"], int) and a["id"] >= 10]
    assert all(not a["result"].get("isError") for a in pages), pages[0]
    assert took < GIVE_UP_S, took  # answered, not given up on


def test_a_call_holding_a_lone_surrogate_is_answered(tmp_path: Path) -> None:
    """``"\\ud800"`` is valid JSON (a JavaScript client sends it for a string cut inside a
    character); the SDK refused the message without a reply, and the client waited for ever.
    It is answered now, the surrogate read as U+FFFD, and the calls after it too."""
    session, out = prepared(tmp_path)
    marker = line_markers(out)[0]
    wire = _Wire(session.path)
    try:
        wire.initialize()
        call = '{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "ctxrules_recall", '
        wire.send_line((call + '"arguments": {"id": "\\ud800' + marker.vault_id + '"}}}').encode())
        refused = wire.answer()
        assert refused["id"] == 2 and refused["result"]["isError"], refused
        assert "\ufffd" in refused["result"]["content"][0]["text"]
        good = {"name": "ctxrules_recall", "arguments": {"id": marker.vault_id, "lines": "1:2"}}
        wire.send({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": good})
        found = wire.answer()
        assert found["id"] == 3 and not found["result"].get("isError"), found
    finally:
        code = wire.close()
    assert code == 0


def test_a_line_that_is_not_json_is_answered_with_a_parse_error(tmp_path: Path) -> None:
    """JSON-RPC 2.0 answers what is not JSON with error -32700 and ``"id": null``; the SDK's
    stdio server logged it and answered nothing, so a client that sent a request cut short
    waited for ever. The answers go out whole between the SDK's: each line read is one
    message, also with pages of some 9 kB in flight (which the SDK writes in pieces)."""
    session, out = prepared(tmp_path)
    marker = line_markers(out)[0]
    wire = _Wire(session.path)
    try:
        wire.initialize()
        for garbage in (b"hello?", b'{"jsonrpc": "2.0", "id": 2, "method": "tools/list"', b"\xff\xfe{"):
            wire.send_line(garbage)
            refused = wire.answer()
            assert refused["id"] is None and refused["error"]["code"] == -32700, refused
            assert refused["error"]["message"].startswith("Parse error"), refused
        calls = 20
        for n in range(calls):
            arguments = {"id": marker.vault_id, "lines": f"{n + 1}:"}
            wire.send({"jsonrpc": "2.0", "id": 10 + n, "method": "tools/call", "params": {
                "name": "ctxrules_recall", "arguments": arguments}})  # fmt: skip
            wire.send_line(b"not json either")
        answers = [wire.answer() for _ in range(2 * calls)]
        pages = {a["id"]: a for a in answers if a["id"] is not None}
        assert sorted(pages) == list(range(10, 10 + calls))
        assert all(not a["result"].get("isError") for a in pages.values())
        assert max(len(json.dumps(a)) for a in pages.values()) > 8192  # more than the SDK's writer buffers
        assert [a["error"]["code"] for a in answers if a["id"] is None] == [-32700] * calls
    finally:
        code = wire.close()
    assert code == 0


def test_json_that_is_not_a_json_rpc_message_is_answered_with_invalid_request(tmp_path: Path) -> None:
    """JSON the SDK's own validator refuses as a message (an object that is not one, an array,
    a number, a request whose method or params have the wrong type, or whose id is not a string
    or an integer) was dropped without an answer, and a client waited for ever; now each gets
    JSON-RPC's -32600, with its id where it has a string or a number, and the calls after it are
    answered as before."""
    session, _ = prepared(tmp_path)
    wire = _Wire(session.path)
    try:
        wire.initialize()
        refused: list[tuple[object, object]] = [
            ({"foo": 1}, None),
            ([{"jsonrpc": "2.0", "id": 2, "method": "tools/list"}], None),  # a batch: MCP has none
            (42, None),
            ({"jsonrpc": "1.0", "id": 3, "method": "tools/list"}, 3),
            ({"jsonrpc": "2.0", "id": "four", "method": 4}, "four"),
            ({"jsonrpc": "2.0", "id": 5, "method": "tools/list", "params": 5}, 5),
            ({"jsonrpc": "2.0", "id": 6}, 6),
            # Ids MCP refuses: the SDK took each for a notification and answered nothing.
            ({"jsonrpc": "2.0", "id": True, "method": "tools/list"}, None),
            ({"jsonrpc": "2.0", "id": None, "method": "tools/list"}, None),
            ({"jsonrpc": "2.0", "id": [11], "method": "tools/list"}, None),
            ({"jsonrpc": "2.0", "id": 12.0, "method": "tools/list"}, 12),
            ({"jsonrpc": "2.0", "id": 12.5, "method": "ping"}, 12.5),
        ]
        for message, expected_id in refused:
            wire.send(message)
            got = wire.answer()
            assert got["id"] == expected_id and got["error"]["code"] == -32600, (message, got)
            assert got["error"]["message"].startswith("Invalid Request"), got
        # A raw tab inside a string is not JSON (Python reads it only when told not to be strict).
        wire.send_line(b'{"jsonrpc": "2.0", "id": 8, "method": "tools/list", "params": {"a": "x\ty"}}')
        got = wire.answer()
        assert got["id"] is None and got["error"]["code"] == -32700, got
        # A bad response from the client (to a request of the server's) is not answered: the
        # answer would carry an id of the server's numbering. The next call is answered.
        wire.send({"jsonrpc": "2.0", "id": 9, "result": None})
        wire.send({"jsonrpc": "2.0", "id": 10, "error": {"code": "not a number"}})
        wire.send({"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {}})
        listed = wire.answer()
        assert listed["id"] == 7 and listed["result"]["tools"], listed
    finally:
        code = wire.close()
    assert code == 0


@pytest.mark.parametrize("closed", [0, 1])
def test_mcp_with_stdin_or_stdout_closed_is_a_usage_error(tmp_path: Path, closed: int) -> None:
    """`ctxrules mcp --session DIR >&-` (or `<&-`) was `internal error: AttributeError`."""
    import subprocess

    session, _ = prepared(tmp_path)
    proc = subprocess.run(
        _mcp_argv(session.path),
        stdin=subprocess.DEVNULL if closed else None,
        stderr=subprocess.PIPE,
        text=True,
        env=_mcp_env(),
        preexec_fn=lambda: os.close(closed),
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    stream = ("standard input", "standard output")[closed]
    assert f"{stream} is closed" in proc.stderr and "internal error" not in proc.stderr, proc.stderr


def test_a_line_longer_than_a_message_can_be_is_refused_unread(tmp_path: Path) -> None:
    """A line past 16 MiB (a client that never ends its line) was read whole, however long:
    memory grew with it. It is answered -32600, skipped without being held, and the server
    goes on answering the lines after it."""
    limit = 16 << 20  # docs/integrations.md
    session, _ = prepared(tmp_path)
    wire = _Wire(session.path)
    try:
        wire.initialize()
        wire.send_line(b"a" * (2 * limit + 5))
        refused = wire.answer()
        assert refused["id"] is None and refused["error"]["code"] == -32600, refused
        assert "longer than 16 MiB" in refused["error"]["message"], refused
        wire.send({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        assert wire.answer()["id"] == 2
    finally:
        code = wire.close()
    assert code == 0
