"""Store selection through the real CLI (subprocesses): ``--store URL``, ``--state DIR``,
``CTXRULES_STORE``, the usage errors, ``sessions export``/``import`` between two filesystem
stores, and ``sessions scan --store`` finding a half-written compaction checkpoint."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO
from session_kit import export_session

ENV = {**os.environ, "PYTHONPATH": str(REPO / "engine")}
ENV.pop("CTXRULES_STORE", None)
ENV.pop("CTXRULES_STATE", None)


def ctxrules(
    *argv: str, cwd: Path, env: dict[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ctxrules.cli.main", *argv],
        cwd=cwd,
        env=env or ENV,
        capture_output=True,
        text=True,
        input=stdin,
        timeout=300,
    )


def history(extra: int = 0) -> list[dict[str, object]]:
    out = "\n".join(f"test_{i} PASSED in {i}ms" for i in range(6000))
    msgs: list[dict[str, object]] = [
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
        {"role": "user", "content": "Good."},
    ]
    for i in range(extra):
        msgs += [{"role": "assistant", "content": f"step {i}"}, {"role": "user", "content": f"go on {i}"}]
    return msgs


def run_args(tmp_path: Path, *store: str, extra: int = 0, out: str = "out.json") -> list[str]:
    (tmp_path / "in.json").write_text(json.dumps(history(extra)))
    return ["run", "--pack", "builtin:default", "--model", "gpt-4o", "--window", "20000",
            "--input", "in.json", "--output", out, *store]  # fmt: skip


BOTH = ("--store", "file://a", "--state", "b")


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["compress", *BOTH, "--command", "echo hi", "--input", "in.txt"], id="compress"),
        pytest.param(["vault", "get", "0123456789ab", *BOTH], id="vault-get"),
        pytest.param(["usage", "show", *BOTH], id="usage-show"),
        pytest.param(["usage", "report", *BOTH], id="usage-report"),
        pytest.param(["sessions", "scan", *BOTH], id="sessions-scan"),
        pytest.param(["sessions", "export", "s", "--to", "x.ctxs", *BOTH], id="sessions-export"),
        pytest.param(["sessions", "import", "x.ctxs", *BOTH], id="sessions-import"),
        pytest.param(["mcp", "--session", "s", *BOTH], id="mcp"),
    ],
)
def test_store_and_state_together_is_a_usage_error(tmp_path: Path, argv: list[str]) -> None:
    (tmp_path / "in.txt").write_text("hi\n")
    got = ctxrules(*argv, cwd=tmp_path)
    assert got.returncode == 2, got
    assert "[CR145] give --store URL or --state DIR, not both" in got.stderr
    assert "Traceback" not in got.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_run_with_store_and_state_is_a_usage_error_before_reading_anything(tmp_path: Path) -> None:
    got = ctxrules(*run_args(tmp_path, *BOTH), cwd=tmp_path)
    assert got.returncode == 2 and "[CR145]" in got.stderr and "Traceback" not in got.stderr
    assert not (tmp_path / "out.json").exists()


def test_an_unknown_scheme_is_a_usage_error_naming_the_schemes(tmp_path: Path) -> None:
    got = ctxrules("vault", "get", "0123456789ab", "--store", "memcache://u:pw@h/1", cwd=tmp_path)
    assert got.returncode == 2
    assert "[CR145] unknown store URL 'memcache://u:***@h/1'" in got.stderr and "pw" not in got.stderr
    assert "file://, redis://, rediss://, unix://" in got.stderr


def test_store_file_url_and_the_environment_select_the_same_store_as_state(tmp_path: Path) -> None:
    by_state = ctxrules(*run_args(tmp_path, "--state", "s1", out="o1.json"), cwd=tmp_path)
    assert by_state.returncode == 0, by_state.stderr
    by_url = ctxrules(*run_args(tmp_path, "--store", f"file://{tmp_path}/s2", out="o2.json"), cwd=tmp_path)
    assert by_url.returncode == 0, by_url.stderr
    env = {**ENV, "CTXRULES_STORE": (tmp_path / "s3").as_uri()}
    by_env = ctxrules(*run_args(tmp_path, out="o3.json"), cwd=tmp_path, env=env)
    assert by_env.returncode == 0, by_env.stderr
    outputs = [json.loads((tmp_path / f"o{i}.json").read_text()) for i in (1, 2, 3)]
    assert outputs[0] == outputs[1] == outputs[2]
    for root in ("s1", "s2", "s3"):
        assert (tmp_path / root / "default" / "state.json").is_file()
    # A marker of that output resolves through each way of naming the store.
    ref = next(m for m in json.dumps(outputs[0]).split("vault://")[1:])[:64]
    for store in (["--state", "s1"], ["--store", f"file://{tmp_path}/s2"]):
        got = ctxrules("vault", "get", ref, *store, cwd=tmp_path)
        assert got.returncode == 0 and "test_0 PASSED" in got.stdout, got.stderr
    got = ctxrules("vault", "get", ref, cwd=tmp_path, env=env)
    assert got.returncode == 0 and "test_0 PASSED" in got.stdout, got.stderr


def test_export_then_import_moves_a_session_byte_for_byte(tmp_path: Path) -> None:
    first = ctxrules(*run_args(tmp_path, "--state", "A", "--session", "A/conv-1"), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    usage = ctxrules("usage", "add", "--model", "gpt-4o", "--prompt", "1000", "--completion", "10",
                     "--session", "A/conv-1", "--state", "A", cwd=tmp_path)  # fmt: skip
    assert usage.returncode == 0, usage.stderr
    note = "import sys\nfrom ctxrules.notes import SessionNotes\nSessionNotes(sys.argv[1]).add('keep me', tags=['x'])"
    subprocess.run([sys.executable, "-c", note, "A/conv-1"], cwd=tmp_path, env=ENV, check=True)
    exported = ctxrules(
        "sessions", "export", "A/conv-1", "--store", f"file://{tmp_path}/A", "--to", "conv.ctxs", cwd=tmp_path
    )
    assert exported.returncode == 0, exported.stderr
    assert "vault item(s)" in exported.stderr and (tmp_path / "conv.ctxs").is_file()
    # It holds the conversation and the signing key: private whatever the umask.
    assert stat.S_IMODE((tmp_path / "conv.ctxs").stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir() if ".partial" in p.name] == []
    imported = ctxrules("sessions", "import", "conv.ctxs", "--store", f"file://{tmp_path}/B", cwd=tmp_path)
    assert imported.returncode == 0, imported.stderr
    a, b = tmp_path / "A" / "conv-1", tmp_path / "B" / "conv-1"
    vault_a = {p.relative_to(a): p.read_bytes() for p in (a / "vault").rglob("*") if p.is_file()}
    vault_b = {p.relative_to(b): p.read_bytes() for p in (b / "vault").rglob("*") if p.is_file()}
    assert vault_a and vault_a == vault_b
    assert (a / "last_output.jsonl").read_bytes() == (b / "last_output.jsonl").read_bytes()
    assert json.loads((b / "notes.json").read_text())["notes"][0]["text"] == "keep me"
    shown = ctxrules("usage", "show", "--session", "B/conv-1", "--state", "B", "--format", "json", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert '"calls": 1' in shown.stdout
    # The moved session goes on as the original would.
    for root in ("A", "B"):
        nxt = ctxrules(
            *run_args(tmp_path, "--state", root, "--session", f"{root}/conv-1", extra=1, out=f"n{root}.json"),
            cwd=tmp_path,
        )
        assert nxt.returncode == 0, nxt.stderr
    assert (tmp_path / "nA.json").read_text() == (tmp_path / "nB.json").read_text()
    # Importing again is refused: an existing session is never overwritten.
    again = ctxrules("sessions", "import", "conv.ctxs", "--store", f"file://{tmp_path}/B", cwd=tmp_path)
    assert again.returncode == 2 and "[CR146]" in again.stderr and "exists already" in again.stderr
    # A truncated archive writes nothing.
    lines = (tmp_path / "conv.ctxs").read_bytes().splitlines(keepends=True)
    (tmp_path / "cut.ctxs").write_bytes(b"".join(lines[:-1]))
    cut = ctxrules("sessions", "import", "cut.ctxs", "--store", f"file://{tmp_path}/C", cwd=tmp_path)
    assert cut.returncode == 2 and "truncated" in cut.stderr and not (tmp_path / "C").exists()
    # Through stdout and stdin too.
    piped = ctxrules("sessions", "export", "A/conv-1", "--state", "A", "--to", "-", cwd=tmp_path)
    assert piped.returncode == 0
    into = ctxrules("sessions", "import", "-", "--state", "D", "--session", "D/x", cwd=tmp_path, stdin=piped.stdout)
    assert into.returncode == 0, into.stderr
    assert (tmp_path / "D" / "x" / "last_output.jsonl").read_bytes() == (a / "last_output.jsonl").read_bytes()


def _exported_session(tmp_path: Path, *, usage: bool = False) -> list[bytes]:
    """The lines of an archive of session A/s (a run, a note, optionally a recorded call),
    exported with the real CLI to ``s.ctxs``: it holds every kind of record."""
    first = ctxrules(*run_args(tmp_path, "--state", "A", "--session", "A/s"), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    archive = export_session(ctxrules, tmp_path, ENV, prompt_tokens=1000 if usage else None)
    return archive.read_bytes().splitlines(keepends=True)


def test_an_archive_missing_or_repeating_any_line_imports_nothing(tmp_path: Path) -> None:
    """Each record line (the turn, a vault item, a document, the key, the ledger) dropped or
    doubled: refused with CR146 naming the end record, nothing written. An import that went
    on would leave a session whose output names vault items it lacks, or whose injected
    messages lost the key they are signed with."""
    lines = _exported_session(tmp_path)
    kinds = [json.loads(line).get("kind") for line in lines[1:-1]]
    assert {"turn", "blob", "doc", "secret", "ledger"} <= set(kinds), kinds
    for i in range(1, len(lines) - 1):
        for label, damaged in (("dropped", lines[:i] + lines[i + 1 :]), ("doubled", lines[: i + 1] + lines[i:])):
            (tmp_path / "bad.ctxs").write_bytes(b"".join(damaged))
            got = ctxrules("sessions", "import", "bad.ctxs", "--state", "B", "--session", "B/s", cwd=tmp_path)
            why = f"{kinds[i - 1]} line {label}"
            assert got.returncode == 2 and "[CR146]" in got.stderr and "end record counts" in got.stderr, why
            assert not (tmp_path / "B" / "s").exists(), why
    whole = ctxrules("sessions", "import", "s.ctxs", "--state", "B", "--session", "B/s", cwd=tmp_path)
    assert whole.returncode == 0, whole.stderr


def _altered(record: dict[str, Any]) -> dict[str, Any]:
    """The record with one value changed as damage would change it, still well-formed."""
    kind = record.get("kind")
    if kind == "turn":
        output = record["output"]
        return {**record, "output": [{**output[0], "content": "text nobody wrote"}, *output[1:]]}
    if kind == "blob":
        return {**record, "media_type": "text/html"}
    if kind in ("doc", "secret"):
        return {**record, "data": base64.b64encode(base64.b64decode(record["data"]) + b" ").decode()}
    if kind == "ledger":
        return {**record, "lines": [line.replace('"prompt": 1000', '"prompt": 1') for line in record["lines"]]}
    return {**record, "session": "other"}  # the header


def test_an_archive_with_any_line_altered_imports_nothing(tmp_path: Path) -> None:
    """Each line but the end record changed in one value, the counts still right: refused
    with CR146 (the end record's sha256), nothing written. Before, an altered last output was
    imported and the next turn sent its text in place of the user's first message."""
    lines = _exported_session(tmp_path, usage=True)
    records = [json.loads(line) for line in lines]
    assert {"turn", "blob", "doc", "secret", "ledger"} <= {r.get("kind") for r in records}
    for i in range(len(lines) - 1):
        altered = json.dumps(_altered(records[i]), ensure_ascii=False).encode() + b"\n"
        assert altered != lines[i]
        (tmp_path / "bad.ctxs").write_bytes(b"".join([*lines[:i], altered, *lines[i + 1 :]]))
        got = ctxrules("sessions", "import", "bad.ctxs", "--state", "B", "--session", "B/s", cwd=tmp_path)
        why = f"{records[i].get('kind', 'header')} line altered: {got.stderr}"
        assert got.returncode == 2 and "[CR146]" in got.stderr and "sha256" in got.stderr, why
        assert not (tmp_path / "B" / "s").exists(), why
    # Line endings a transfer changed are not damage.
    (tmp_path / "crlf.ctxs").write_bytes(b"".join(line.replace(b"\n", b"\r\n") for line in lines))
    whole = ctxrules("sessions", "import", "crlf.ctxs", "--state", "B", "--session", "B/s", cwd=tmp_path)
    assert whole.returncode == 0, whole.stderr


@pytest.mark.parametrize(
    ("kind", "change", "words"),
    [
        ("ledger", {"lines": 5}, "list of lines"),
        ("ledger", {"lines": [{"v": 1}]}, "list of lines"),
        ("turn", {"state": {"last": None}}, "state.last must be an object"),
        ("turn", {"output": ["not a message"]}, "list of message objects"),
        # Written, a key file every later turn of the imported session refused.
        ("secret", {"data": "YWI="}, "the injection key is 2 bytes, not 16 to 64"),
        ("secret", {"data": "YWJj" * 100}, "the injection key is 300 bytes, not 16 to 64"),
    ],
)
def test_an_archive_record_of_the_wrong_shape_imports_nothing(
    tmp_path: Path, kind: str, change: dict[str, Any], words: str
) -> None:
    """An archive without the end record's sha256 (as written before it was added, or by
    hand) is checked on its counts, and each record on its shape: CR146, nothing written,
    never an internal error half way through the writes."""
    first = ctxrules(*run_args(tmp_path, "--state", "A", "--session", "A/s"), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    exported = ctxrules("sessions", "export", "A/s", "--state", "A", "--to", "s.ctxs", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    records = [json.loads(line) for line in (tmp_path / "s.ctxs").read_text().splitlines()]
    del records[-1]["sha256"]
    for record in records:
        if record.get("kind") == kind:
            if "state" in change:
                record["state"] = {**record["state"], **change["state"]}
            else:
                record.update(change)
        if record.get("kind") == "ledger":  # the counts stay right: only the shape is wrong
            listed = record["lines"]
            records[-1]["ledger"] = len(listed) if isinstance(listed, list) else 0
    (tmp_path / "bad.ctxs").write_text("".join(json.dumps(r) + "\n" for r in records))
    got = ctxrules("sessions", "import", "bad.ctxs", "--state", "B", "--session", "B/s", cwd=tmp_path)
    assert got.returncode == 2 and "[CR146]" in got.stderr and words in got.stderr, got.stderr
    assert "internal error" not in got.stderr and not (tmp_path / "B").exists()


def test_an_archive_line_nested_too_deep_is_a_damaged_archive(tmp_path: Path) -> None:
    header = {"format": "ctxrules-session", "version": 1, "session": "s"}
    (tmp_path / "deep.ctxs").write_text(json.dumps(header) + "\n" + "[" * 100_000 + "]" * 100_000 + "\n")
    got = ctxrules("sessions", "import", "deep.ctxs", "--state", "B", "--session", "B/s", cwd=tmp_path)
    assert got.returncode == 2 and "[CR146]" in got.stderr and "deep.ctxs:2" in got.stderr, got.stderr
    assert "internal error" not in got.stderr and not (tmp_path / "B").exists()


def test_exporting_without_the_state_root_the_session_ran_under_is_refused(tmp_path: Path) -> None:
    """A session run with ``--state A`` signs its injected messages with A's key. Exported
    without ``--state`` the archive carried the default state root's key (or none), and once
    imported its summaries read as the caller's own messages. Refused (CR150), nothing written."""
    example = REPO / "rules" / "examples" / "agent-session.json"
    run = ["run", "--pack", "builtin:default", "--model", "gpt-4o", "--window", "32000", "--input", str(example)]
    note = "import sys\nfrom ctxrules.notes import SessionNotes\nSessionNotes(sys.argv[1]).add('n', tags=['x'])"
    subprocess.run([sys.executable, "-c", note, "work/s"], cwd=tmp_path, env=ENV, check=True)
    ran = ctxrules(*run, "--session", "work/s", "--state", "A", "--output", "out.json", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert "<ctxrules:notes" in (tmp_path / "out.json").read_text()  # an injected message, signed with A's key
    other = ctxrules(*run, "--session", "other", "--state", "B", "--output", "o2.json", cwd=tmp_path)
    assert other.returncode == 0 and (tmp_path / "B" / "injection.key").is_file()  # B: a key of its own
    for state in ([], ["--state", "B"]):
        got = ctxrules("sessions", "export", "work/s", *state, "--to", "x.ctxs", cwd=tmp_path)
        assert got.returncode == 2 and "[CR150]" in got.stderr and "--state DIR" in got.stderr, got.stderr
        assert not (tmp_path / "x.ctxs").exists()
    good = ctxrules("sessions", "export", "work/s", "--state", "A", "--to", "x.ctxs", cwd=tmp_path)
    assert good.returncode == 0, good.stderr
    imported = ctxrules("sessions", "import", "x.ctxs", "--state", "C", "--session", "C/s", cwd=tmp_path)
    assert imported.returncode == 0, imported.stderr
    again = ctxrules("sessions", "export", "C/s", "--state", "C", "--to", "y.ctxs", cwd=tmp_path)
    assert again.returncode == 0, again.stderr  # the imported session carries the key it was signed with


def test_exporting_a_session_that_is_not_there_is_a_usage_error(tmp_path: Path) -> None:
    got = ctxrules("sessions", "export", "nope", "--state", "A", "--to", "x.ctxs", cwd=tmp_path)
    assert got.returncode == 2 and "[CR147] no session nope to export" in got.stderr
    assert not (tmp_path / "x.ctxs").exists()


def test_sessions_scan_with_a_store_url_finds_a_half_written_checkpoint(tmp_path: Path) -> None:
    made = ctxrules(*run_args(tmp_path, "--state", "S", "--session", "S/conv-1"), cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    # A compaction that died half-way: its checkpoint says running, its process is gone.
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(gone.stdout)
    write = (
        "import sys\nfrom pathlib import Path\nfrom ctxrules.runtime import checkpoint\n"
        "from ctxrules.stores.filesystem import FilesystemStore\nfrom ctxrules.vault import Vault\n"
        "store = FilesystemStore(Path('S')); key = 'S/conv-1'\n"
        "backup = Vault.of(store, key).put_text('[]')\n"
        "checkpoint.begin(key, store=store, backup=backup, state={}, messages=0, clock=1.0)\n"
        "import json; p = Path(key, 'checkpoint.json'); d = json.loads(p.read_text()); d['pid'] = int(sys.argv[1])\n"
        "p.write_text(json.dumps(d))\n"
    )
    subprocess.run([sys.executable, "-c", write, str(pid)], cwd=tmp_path, env=ENV, check=True)
    got = ctxrules("sessions", "scan", "--store", f"file://{tmp_path}/S", cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    assert f"process {pid} ended during a compaction" in got.stdout
    assert "1 interrupted session(s)" in got.stdout
    resumed = ctxrules("sessions", "resume", "S/conv-1", "--store", f"file://{tmp_path}/S", cwd=tmp_path)
    assert resumed.returncode == 0 and json.loads(resumed.stdout) == []


def test_a_compaction_cut_short_on_another_host_is_resumed_as_scan_reports_it(tmp_path: Path) -> None:
    """A shared store's checkpoint from another host counts as cut short when the session's
    lock is free. ``resume`` asked that holding the lock itself, found it taken (by itself) and
    said "no interrupted compaction to resume" of a session ``scan`` had just listed."""
    made = ctxrules(*run_args(tmp_path, "--state", "S", "--session", "S/conv-1"), cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    write = (
        "from pathlib import Path\nfrom ctxrules.runtime import checkpoint\n"
        "from ctxrules.stores.filesystem import FilesystemStore\nfrom ctxrules.vault import Vault\n"
        "store = FilesystemStore(Path('S')); key = 'S/conv-1'\n"
        "backup = Vault.of(store, key).put_text('[]')\n"
        "checkpoint.begin(key, store=store, backup=backup, state={}, messages=0, clock=1.0)\n"
        "import json; p = Path(key, 'checkpoint.json'); d = json.loads(p.read_text())\n"
        "d.update(pid=4242, host='another-host'); p.write_text(json.dumps(d))\n"
    )
    subprocess.run([sys.executable, "-c", write], cwd=tmp_path, env=ENV, check=True)
    got = ctxrules("sessions", "scan", "--state", "S", cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    assert "process 4242 on another-host ended during a compaction (the session's lock is free)" in got.stdout
    resumed = ctxrules("sessions", "resume", "S/conv-1", "--state", "S", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout) == []
    assert "0 interrupted session(s)" in ctxrules("sessions", "scan", "--state", "S", cwd=tmp_path).stdout


@pytest.mark.parametrize("option", ["--state", "--store"])
def test_sessions_scan_of_a_state_root_that_is_not_a_folder_is_a_usage_error(tmp_path: Path, option: str) -> None:
    (tmp_path / "a-file").write_text("[]")
    for name, why in (("a-file", "not a directory"), ("missing", "no such directory")):
        value = name if option == "--state" else f"file://{tmp_path / name}"
        got = ctxrules("sessions", "scan", option, value, cwd=tmp_path)
        assert got.returncode == 2 and why in got.stderr, (got.returncode, got.stderr)
        assert "Traceback" not in got.stderr and got.stdout == ""
    # The default state root, not made yet: nothing to resume, not an error.
    fresh = ctxrules("sessions", "scan", cwd=tmp_path)
    assert fresh.returncode == 0 and "0 interrupted session(s)" in fresh.stdout, fresh.stderr


def test_every_session_verb_takes_a_redis_store(tmp_path: Path, redis_url: str) -> None:
    store = ("--store", redis_url)
    made = ctxrules(*run_args(tmp_path, *store, "--session", "conv-r", "--report", "report.json"), cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    out = json.loads((tmp_path / "out.json").read_text())
    ref = next(part[:64] for part in json.dumps(out).split("vault://")[1:])
    got = ctxrules("vault", "get", ref, *store, "--session", "conv-r", cwd=tmp_path)
    assert got.returncode == 0 and "test_0 PASSED" in got.stdout, got.stderr
    anywhere = ctxrules("vault", "get", ref, *store, cwd=tmp_path)  # searched in every session of the store
    assert anywhere.returncode == 0 and anywhere.stdout == got.stdout, anywhere.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["session"]["key"] == "conv-r" and report["session"]["store"].startswith(("redis", "unix"))
    added = ctxrules(
        "usage", "add", "--model", "gpt-4o", "--prompt", "500", "--completion", "5", *store, "--session", "conv-r",
        cwd=tmp_path,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    shown = ctxrules("usage", "show", *store, "--session", "conv-r", "--format", "json", cwd=tmp_path)
    assert shown.returncode == 0 and '"calls": 1' in shown.stdout, shown.stderr
    (tmp_path / "log.txt").write_text("\n".join(f"ok {i}" for i in range(3000)) + "\nFAILED: boom\n")
    squeezed = ctxrules(
        "compress", *store, "--session", "conv-r", "--command", "make test", "--exit-code", "1", "--input", "log.txt",
        cwd=tmp_path,
    )  # fmt: skip
    assert squeezed.returncode == 0, squeezed.stderr
    assert "FAILED: boom" in squeezed.stdout and "vault://" in squeezed.stdout
    full = squeezed.stdout.split("vault://")[1][:64]
    back = ctxrules("vault", "get", full, *store, "--session", "conv-r", cwd=tmp_path)
    assert back.returncode == 0 and back.stdout == (tmp_path / "log.txt").read_text()
    missing = ctxrules("mcp", *store, "--session", "nobody", cwd=tmp_path)
    assert missing.returncode == 2 and "[CR147]" in missing.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.json", "log.txt", "out.json", "report.json"]


def test_a_large_output_streams_into_a_redis_vault(tmp_path: Path, redis_url: str) -> None:
    # Over the 8 MB a capture holds in memory: the entry is written in pieces through the store.
    lines = [f"ok {i} " + "x" * 90 for i in range(100_000)] + ["FAILED: boom"]
    (tmp_path / "big.txt").write_text("\n".join(lines) + "\n")
    store = ("--store", redis_url, "--session", "conv-big")
    squeezed = ctxrules(
        "compress", *store, "--stats", "--command", "make test", "--exit-code", "1", "--input", "big.txt", cwd=tmp_path
    )
    assert squeezed.returncode == 0, squeezed.stderr
    assert "FAILED: boom" in squeezed.stdout and "tokens" in squeezed.stderr
    ref = squeezed.stdout.split("vault://")[1][:64]
    back = ctxrules("vault", "get", ref, *store, cwd=tmp_path)
    assert back.returncode == 0 and back.stdout == (tmp_path / "big.txt").read_text()


@pytest.mark.parametrize("store", [(), ("--store", "file://S")])
def test_resuming_a_session_that_is_not_there_writes_nothing(tmp_path: Path, store: tuple[str, ...]) -> None:
    """A mistyped session: CR147, exit 2, and no folder, parent or lock file left behind (the
    prepare lock used to make them before finding nothing to resume)."""
    (tmp_path / "S").mkdir()
    got = ctxrules("sessions", "resume", "S/typo/deep/conv", *store, cwd=tmp_path)
    assert got.returncode == 2 and "[CR147]" in got.stderr and "Traceback" not in got.stderr, got.stderr
    assert list((tmp_path / "S").iterdir()) == []


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(
            ["run", "--pack", "builtin:default", "--model", "gpt-4o", "--input", "m.json", "--session", ""],
            id="run-session",
        ),
        pytest.param(["run", "--pack", "builtin:default", "--model", "gpt-4o", "--input", ""], id="run-input"),
        pytest.param(["run", "--pack", "", "--model", "gpt-4o", "--input", "m.json"], id="run-pack"),
        pytest.param(["test", ""], id="test"),
        pytest.param(["validate", "m.json", " "], id="validate"),
        pytest.param(["mcp", "--session", ""], id="mcp"),
        pytest.param(["sessions", "export", "", "--to", "x.ctxs"], id="sessions-export"),
        pytest.param(["vault", "get", "abc", "--session", ""], id="vault-get"),
        pytest.param(["sessions", "scan", "--state", ""], id="sessions-scan"),
    ],
)
def test_an_empty_path_argument_is_a_usage_error_not_the_current_directory(tmp_path: Path, argv: list[str]) -> None:
    # An unset shell variable (`ctxrules test "$PACK"`) must not mean "every pack here", nor make
    # the current directory a session with its state files.
    (tmp_path / "m.json").write_text(json.dumps([{"role": "user", "content": "hi"}]))
    got = ctxrules(*argv, cwd=tmp_path)
    assert got.returncode == 2, (got.returncode, got.stdout, got.stderr)
    assert "an empty value names no file, folder or store" in got.stderr and "Traceback" not in got.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json"]


def test_every_path_argument_of_every_verb_is_checked_for_emptiness() -> None:
    import argparse

    from ctxrules.cli.main import _PATH_DESTS, build_parser

    path_words = {"DIR", "FILE", "PATH", "PACK", "P", "SESSION", "INPUT", "OUT", "OUT.html"}
    unchecked = []

    def walk(parser: argparse.ArgumentParser, where: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{where} {name}".strip())
            elif (
                action.metavar in path_words or "path" in (action.help or "").lower()
            ) and action.dest not in _PATH_DESTS:
                unchecked.append(f"{where}: {action.dest}")

    walk(build_parser(), "")
    assert unchecked == []


def test_a_file_store_lock_timeout_bounds_the_wait_for_a_stuck_holder(tmp_path: Path) -> None:
    """A holder that stopped (SIGSTOP, a hung network file system) kept `run` waiting for ever;
    `file://DIR?lock_timeout_s=N` bounds the wait (CR149, exit 2), as the Redis store's does."""
    import fcntl
    import time

    first = ctxrules(*run_args(tmp_path, "--store", f"file://{tmp_path}/st"), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    session = tmp_path / "st" / "default"
    with open(session / ".lock", "a+b") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # another holder, as a stopped process's
        started = time.monotonic()
        got = ctxrules(*run_args(tmp_path, "--store", f"file://{tmp_path}/st?lock_timeout_s=1"), cwd=tmp_path)
        waited = time.monotonic() - started
    assert got.returncode == 2, got.stderr
    assert f"[CR149] the session {session} stayed locked by another process" in got.stderr
    assert "for 1s (lock_timeout_s)" in got.stderr and "Traceback" not in got.stderr
    assert waited < 60  # (a process start and one second: never the whole test's timeout)
    again = ctxrules(*run_args(tmp_path, "--store", f"file://{tmp_path}/st?lock_timeout_s=1"), cwd=tmp_path)
    assert again.returncode == 0, again.stderr  # released: the option changes nothing else
    for bad in (
        "lock_timeout_s=-1",
        "lock_timeout_s=soon",
        "lock_timeout_s=nan",
        "ttl_s=5",
        "lock_timeout_s=1&lock_timeout_s=2",
    ):
        got = ctxrules(*run_args(tmp_path, "--store", f"file://{tmp_path}/st?{bad}"), cwd=tmp_path)
        assert got.returncode == 2 and "[CR145]" in got.stderr and "lock_timeout_s" in got.stderr, (bad, got.stderr)
