"""Session directories are ctxrules' own: planted links are refused, nothing outside is written,
a tampered cache is never trusted, and damaged state is a cache miss.

Each test plants the hostile file the way a repository could (a committed ``.ctxrules/...``)
and runs the real CLI or the public API over it.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_kit import ENGINE, cli, run_default

from ctxrules import Engine

HISTORY: list[dict[str, Any]] = [
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
    {"role": "assistant", "content": "Two files: a.txt and b.txt."},
]


def run_cli(
    tmp_path: Path, *argv: str, messages: Any = None, state: Path | None = None
) -> subprocess.CompletedProcess[str]:
    inp = tmp_path / "in.json"
    inp.write_text(json.dumps(HISTORY if messages is None else messages))
    return run_default(inp, "--state", str(state or tmp_path / "state"), *argv, cwd=tmp_path)


def victim(tmp_path: Path) -> Path:
    path = tmp_path / "home" / "somefile"
    path.parent.mkdir()
    path.write_text("precious\n")
    return path


def assert_refused(proc: subprocess.CompletedProcess[str], what: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "symbolic link" in proc.stderr and what in proc.stderr
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1  # one line


@pytest.mark.parametrize("name", ["state.json", "last_output.jsonl", ".lock"])
def test_a_planted_link_in_the_session_is_refused(tmp_path: Path, name: str) -> None:
    target = victim(tmp_path)
    session = tmp_path / "state" / "default"
    session.mkdir(parents=True)
    (session / name).symlink_to(target)
    assert_refused(run_cli(tmp_path), name)
    assert target.read_text() == "precious\n"


def test_a_link_swapped_in_after_a_run_is_refused(tmp_path: Path) -> None:
    """The second process finds last_output.jsonl replaced by a link: no reuse, no write."""
    assert run_cli(tmp_path).returncode == 0
    target = victim(tmp_path)
    out = tmp_path / "state" / "default" / "last_output.jsonl"
    out.unlink()
    out.symlink_to(target)
    assert_refused(run_cli(tmp_path), "last_output.jsonl")
    assert target.read_text() == "precious\n"


def test_a_session_directory_that_is_a_link_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "default").symlink_to(elsewhere)
    assert_refused(run_cli(tmp_path), "default")
    assert list(elsewhere.iterdir()) == []


def test_a_planted_vault_link_receives_nothing(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    session = tmp_path / "state" / "s"
    session.mkdir(parents=True)
    (session / "vault").symlink_to(elsewhere)
    s = Engine.load("builtin:default").session(session, model="gpt-4o")
    from ctxrules.errors import CtxrulesError

    with pytest.raises(CtxrulesError, match=r"vault.*symbolic link"):
        s.spill("x" * 50_000)
    assert list(elsewhere.iterdir()) == []


def test_the_state_root_itself_may_be_a_link(tmp_path: Path) -> None:
    real = tmp_path / "bigdisk"
    real.mkdir()
    (tmp_path / "state").symlink_to(real)
    proc = run_cli(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (real / "default" / "state.json").is_file()


def _session(tmp_path: Path) -> Any:
    return Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o")


def test_a_last_output_tampered_to_the_same_size_and_mtime_is_not_reused(tmp_path: Path) -> None:
    first = _session(tmp_path).prepare(HISTORY)
    out = tmp_path / "s" / "last_output.jsonl"
    raw = out.read_bytes()
    assert b"Two files" in raw
    st = out.stat()
    tampered = raw.replace(b"Two files", b"RM -RF /!")
    assert len(tampered) == len(raw)
    with open(out, "r+b") as fh:  # in place: same inode, same size
        fh.write(tampered)
    os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
    grown = [*HISTORY, {"role": "user", "content": "Thanks."}]
    again = _session(tmp_path).prepare(grown)  # a new process would do the same
    assert again.report["reused_messages"] == 0
    assert "RM -RF" not in json.dumps(again.messages)
    assert json.dumps(again.messages[: len(first.messages)]) == json.dumps(first.messages)


def test_an_untouched_last_output_is_reused_by_a_new_session_object(tmp_path: Path) -> None:
    """The digest check above must not cost the reuse when nothing was touched."""
    _session(tmp_path).prepare(HISTORY)
    grown = [*HISTORY, {"role": "user", "content": "Thanks."}]
    assert _session(tmp_path).prepare(grown).report["reused_messages"] == len(HISTORY)


@pytest.mark.parametrize(
    "damage",
    [
        {"last": "not a dict"},
        {"last": {"count": "5", "chain": 3, "output_count": [], "output_file": "x"}},
        {"stages": ["a"]},
        {"stages": {"pairs": 7}},
        {"fingerprint": {"x": 1}},
        {"last_clock": "yesterday"},
        {"budget": 3},
    ],
)
def test_a_mistyped_state_is_a_cache_miss(tmp_path: Path, damage: dict[str, Any]) -> None:
    assert run_cli(tmp_path).returncode == 0
    state_file = tmp_path / "state" / "default" / "state.json"
    state = json.loads(state_file.read_text())
    state.update(damage)
    state_file.write_text(json.dumps(state))
    proc = run_cli(tmp_path, "--report", str(tmp_path / "r.json"))
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["reused_messages"] == 0
    assert any("state.json was damaged" in w for w in report["warnings"])
    assert json.loads(proc.stdout)[-1] == HISTORY[-1]


@pytest.mark.parametrize(
    "content",
    [
        b'{"version": 1, "stages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"version": 1, "last_clock": ' + b"9" * 5000 + b"}",
        b"\xff\xfe garbage",
        b'{"version": 1, "last_clock": NaN, "stages": {}}',
    ],
    ids=["deep", "long-int", "not-utf8", "nan"],
)
def test_a_damaged_state_is_a_cache_miss(tmp_path: Path, content: bytes) -> None:
    assert run_cli(tmp_path).returncode == 0
    (tmp_path / "state" / "default" / "state.json").write_bytes(content)
    proc = run_cli(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)[-1] == HISTORY[-1]
    # ...and the turn after it writes a sound state again.
    saved = json.loads((tmp_path / "state" / "default" / "state.json").read_text())
    assert isinstance(saved["last"]["output_digest"], str)


def _address_space(limit: int) -> Any:
    """A ``preexec_fn`` capping the child's memory: a read of a whole huge file fails in it."""
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def test_a_state_claiming_gigabytes_is_a_cache_miss_read_in_bounded_memory(tmp_path: Path) -> None:
    assert run_cli(tmp_path).returncode == 0
    state = tmp_path / "state" / "default" / "state.json"
    os.truncate(state, 5 << 30)  # sparse: 5 GiB claimed, no disk used
    (tmp_path / "in.json").write_text(json.dumps(HISTORY))
    report = tmp_path / "report.json"
    argv = ("--state", str(tmp_path / "state"), "--report", str(report))
    proc = run_default(tmp_path / "in.json", *argv, cwd=tmp_path, timeout=120, preexec_fn=_address_space(2 << 30))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)[-1] == HISTORY[-1]
    assert any("state.json is larger than" in w for w in json.loads(report.read_text())["warnings"])
    assert state.stat().st_size < 1 << 20  # the turn's save cut it back to a state


@pytest.mark.parametrize("digits", [63, 33, 1])
def test_an_injection_key_cut_short_is_a_one_line_error(tmp_path: Path, digits: int) -> None:
    """A key file cut to an odd number of hex digits (a write that died) passed the check and
    failed in ``bytes.fromhex``: "internal error: ValueError" for ``run`` and ``sessions
    export``. Any damage is the documented refusal, naming the file, exit 2."""
    assert run_cli(tmp_path).returncode == 0
    key = next((tmp_path / "state").rglob("injection.key"))
    key.write_text(key.read_text()[:digits])
    proc = run_cli(tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "not an injection key" in proc.stderr and "delete it" in proc.stderr, proc.stderr
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr


def test_a_fifo_in_place_of_the_state_is_refused_without_hanging(tmp_path: Path) -> None:
    session = tmp_path / "state" / "default"
    session.mkdir(parents=True)
    os.mkfifo(session / "state.json")
    proc = run_cli(tmp_path)
    assert proc.returncode == 2 and "not a regular file" in proc.stderr


@pytest.mark.parametrize(
    ("name", "write"),
    [
        ("notes.json", lambda s: s.notes.add("remember the flag")),
        ("touched.json", lambda s: s.touch("src/app.py")),
    ],
)
def test_other_session_files_planted_as_links_are_refused(tmp_path: Path, name: str, write: Any) -> None:
    from ctxrules.errors import CtxrulesError

    target = victim(tmp_path)
    session_dir = tmp_path / "s"
    session_dir.mkdir()
    (session_dir / name).symlink_to(target)
    session = Engine.load("builtin:default").session(session_dir, model="gpt-4o")
    with pytest.raises(CtxrulesError, match="symbolic link"):
        write(session)
    assert target.read_text() == "precious\n"
    assert (session_dir / name).is_symlink()  # refused, not replaced


@pytest.mark.parametrize("swapped", ["session", "vault", "shard"])
def test_vault_get_does_not_read_through_a_swapped_in_link(tmp_path: Path, swapped: str) -> None:
    """``vault get`` checks the directories a run checks: a session, vault or shard directory
    replaced by a link to a copy elsewhere is refused (exit 2, one line), not read from."""
    session = tmp_path / "state" / "s"
    s = Engine.load("builtin:default").session(session, model="gpt-4o")
    item = s.spill("line\n" * 20_000).vault_id
    assert item
    shard = session / "vault" / item[:2]
    where = {"session": session, "vault": session / "vault", "shard": shard}[swapped]
    copy = tmp_path / "elsewhere"
    where.rename(copy)
    where.symlink_to(copy)
    proc = cli("vault", "get", item[:12], "--session", str(session), "--state", str(tmp_path / "state"))
    assert proc.returncode == 2, proc.stderr
    assert "symbolic link" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize("swapped", ["vault", "shard"])
def test_a_vault_or_shard_link_is_refused_not_listed_through(tmp_path: Path, swapped: str) -> None:
    """Listing the vault (``sessions export``, a prefix for ``vault get``) checks its
    directories as reading an item does: a vault or shard directory replaced by a link to an
    empty folder is refused (exit 2, one line), not listed through to an archive that lacks
    the session's items or a "no entry starts with it"."""
    session = tmp_path / "state" / "s"
    s = Engine.load("builtin:default").session(session, model="gpt-4o")
    item = s.spill("line\n" * 20_000).vault_id
    assert item
    where = {"vault": session / "vault", "shard": session / "vault" / item[:2]}[swapped]
    where.rename(tmp_path / "moved")
    (tmp_path / "empty").mkdir()
    where.symlink_to(tmp_path / "empty")
    state = ("--state", str(tmp_path / "state"))
    to = tmp_path / "s.ctxs"
    for argv in (("sessions", "export", str(session), "--to", str(to)), ("vault", "get", item[:12])):
        proc = cli(*argv, *state)
        assert proc.returncode == 2, proc.stderr
        assert f"refusing to use {where}: it is a symbolic link" in proc.stderr
        assert proc.stderr.count("\n") == 1 and proc.stdout == ""
    assert not to.exists()


def test_an_item_planted_as_a_link_is_missing_by_its_id_and_by_a_prefix(tmp_path: Path) -> None:
    """A link in an item's place is no item (a run writes the item over it): ``vault get``
    says the same by the full id and by a prefix, and reads nothing through it."""
    session = tmp_path / "state" / "s"
    s = Engine.load("builtin:default").session(session, model="gpt-4o")
    item = s.spill("line\n" * 20_000).vault_id
    assert item
    path = session / "vault" / item[:2] / item
    path.rename(tmp_path / "copy")
    path.symlink_to(tmp_path / "copy")
    for ident in (item, item[:12]):
        proc = cli("vault", "get", ident, "--session", str(session), "--state", str(tmp_path / "state"))
        assert proc.returncode == 2, proc.stderr
        assert f"vault item {ident}" in proc.stderr and "is missing from" in proc.stderr
        assert proc.stdout == ""


@pytest.mark.parametrize("planted", ["ledger", "ledger/days", "ledger/goals"])
def test_a_ledger_link_in_the_state_root_receives_no_record(tmp_path: Path, planted: str) -> None:
    """The day and goal ledgers live in the state root's ``ledger/`` folder: a link planted for
    that folder (or one below it) is refused, exit 2, and nothing is created through it."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    state = tmp_path / "state"
    (state / planted).parent.mkdir(parents=True, exist_ok=True)
    (state / planted).symlink_to(elsewhere)
    argv = ("--state", str(state), "--model", "gpt-4o", "--prompt", "10", "--completion", "5", "--goal", "g1")
    proc = cli("usage", "add", *argv, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "symbolic link" in proc.stderr and "Traceback" not in proc.stderr
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("planted", ["ledger", "ledger/days"])
def test_a_ledger_link_in_the_state_root_is_not_read_either(tmp_path: Path, planted: str) -> None:
    """A planted link must not hand ctxrules another place's ledger: its records would decide
    the budget level (a forged day over its limit stops every call; a victim's ledger would be
    shown). ``usage show`` and a session's ``prepare`` refuse it, exit 2, as writing does."""
    from ctxrules.errors import CtxrulesError

    state = tmp_path / "state"
    proc = cli("usage", "add", "--state", str(state), "--model", "gpt-4o", "--prompt", "10", "--completion", "5")
    assert proc.returncode == 0, proc.stderr
    (day_file,) = (state / "ledger" / "days").glob("*.jsonl")
    record = json.loads(day_file.read_text(encoding="utf-8"))
    forged = {**record, "id": "f" * 32, "usd": {**record["usd"], "total": 123456.0}}
    elsewhere = tmp_path / "elsewhere"
    target = elsewhere / Path(planted).relative_to("ledger") if planted != "ledger" else elsewhere
    (target / "days").mkdir(parents=True) if planted == "ledger" else target.mkdir(parents=True)
    (target / "days" if planted == "ledger" else target).joinpath(day_file.name).write_text(
        json.dumps(forged) + "\n", encoding="utf-8"
    )
    real = tmp_path / "real-ledger"
    (state / planted).rename(real)
    (state / planted).symlink_to(target if planted != "ledger" else elsewhere)
    shown = cli("usage", "show", "--state", str(state))
    assert shown.returncode == 2, shown.stdout + shown.stderr
    assert "symbolic link" in shown.stderr and "Traceback" not in shown.stderr
    assert "123456" not in shown.stdout
    pack = tmp_path / "pack.yaml"
    pack.write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: day, version: 1.0.0}\n"
        "extends: [builtin:default]\nbudgets: {day: {usd: 50}}\n",
        encoding="utf-8",
    )
    session = Engine.load(str(pack)).session(state / "default", model="gpt-4o", state_root=state)
    with pytest.raises(CtxrulesError, match="symbolic link"):
        session.prepare([{"role": "user", "content": "hi"}])


def test_a_children_link_in_the_session_receives_no_sub_agent(tmp_path: Path) -> None:
    """``session.child(name)`` lives in ``<session>/children/<name>``: a ``children`` link planted
    in the session is refused before the child is registered or anything is written."""
    from ctxrules.errors import CtxrulesError

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    session_dir = tmp_path / "state" / "s"
    session_dir.mkdir(parents=True)
    (session_dir / "children").symlink_to(elsewhere)
    session = Engine.load("builtin:default").session(session_dir, model="gpt-4o")
    with pytest.raises(CtxrulesError, match="children: it is a symbolic link"):
        session.child("sub")
    assert list(elsewhere.iterdir()) == []
    assert session.ledger.descendant_keys() == []


@pytest.mark.parametrize("meta", [b"not json", b"\xff\xfe", b"[" * 100_000], ids=["text", "not-utf8", "deep"])
def test_a_damaged_media_type_sidecar_reads_as_none(tmp_path: Path, meta: bytes) -> None:
    """A vault item's ``.meta`` that is not ctxrules' JSON is no media type (as a damaged value
    on Redis): ``sessions export`` and the recall tool go on, not an internal error."""
    session_dir = tmp_path / "state" / "s"
    session = Engine.load("builtin:default").session(session_dir, model="gpt-4o")
    item = session.vault.put_bytes(b"\x89PNG fake image bytes", "image/png")
    sidecar = session_dir / "vault" / item[:2] / f"{item}.meta"
    assert sidecar.is_file()
    sidecar.write_bytes(meta)
    assert session.vault.media_type(item) is None
    proc = cli("sessions", "export", str(session_dir), "--to", str(tmp_path / "s.ctxs"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert '"media_type": null' in (tmp_path / "s.ctxs").read_text()


def test_a_media_type_sidecar_claiming_gigabytes_is_not_read(tmp_path: Path) -> None:
    """A ``.meta`` sidecar is a few bytes: one claiming 5 GiB (sparse) reads as no media type
    without being read whole, and a put of the item again replaces it."""
    session_dir = tmp_path / "state" / "s"
    session = Engine.load("builtin:default").session(session_dir, model="gpt-4o")
    item = session.vault.put_bytes(b"\x89PNG fake image bytes", "image/png")
    sidecar = session_dir / "vault" / item[:2] / f"{item}.meta"
    os.truncate(sidecar, 5 << 30)
    to = tmp_path / "s.ctxs"
    proc = cli(
        "sessions", "export", str(session_dir), "--to", str(to), cwd=tmp_path, preexec_fn=_address_space(2 << 30)
    )
    assert proc.returncode == 0, proc.stderr
    assert '"media_type": null' in to.read_text()
    probe = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
        "from ctxrules import Engine\n"
        "vault = Engine.load('builtin:default').session(sys.argv[1], model='gpt-4o').vault\n"
        "vault.put_bytes(b'\\x89PNG fake image bytes', 'image/png')\n"
        "print(vault.media_type(sys.argv[2]))\n"
    )
    put = subprocess.run(
        [sys.executable, "-c", probe, str(session_dir), item],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": ENGINE},
        timeout=120,
    )
    assert put.stdout == "image/png\n", put.stderr[-2000:]
    assert sidecar.stat().st_size < 100


@pytest.mark.parametrize("name", ["notes.json", "touched.json", "router.json", "checkpoint.json", "root.json"])
def test_a_document_claiming_gigabytes_is_named_not_read(tmp_path: Path, name: str) -> None:
    """A session's documents are kilobytes: one claiming 5 GiB (sparse) is not read whole.
    ``sessions export`` refuses it in one line naming it (exit 2); ``run`` goes on, as over
    any damaged checkpoint or ``root.json`` (a cache miss, a session of its own)."""
    assert run_cli(tmp_path).returncode == 0
    session = tmp_path / "state" / "default"
    (session / name).write_bytes(b"")
    os.truncate(session / name, 5 << 30)
    cap = _address_space(2 << 30)
    proc = cli("sessions", "export", str(session), "--to", str(tmp_path / "s.ctxs"), cwd=tmp_path, preexec_fn=cap)
    assert proc.returncode == 2, proc.stderr
    assert (
        proc.stderr
        == f"ctxrules: error: {session / name} is larger than 256 MiB: not a document ctxrules wrote (remove it)\n"
    )
    if name in ("checkpoint.json", "root.json"):
        (tmp_path / "in.json").write_text(json.dumps(HISTORY))
        argv = ("--state", str(tmp_path / "state"))
        proc = run_default(tmp_path / "in.json", *argv, cwd=tmp_path, timeout=120, preexec_fn=cap)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert json.loads(proc.stdout)[-1] == HISTORY[-1]


@pytest.mark.parametrize("pid", [10**21, 0, -1], ids=["past-a-c-long", "zero", "minus-one"])
def test_a_checkpoint_naming_an_impossible_pid_is_a_cut_short_compaction(tmp_path: Path, pid: int) -> None:
    """A ``running`` checkpoint's pid is ``os.getpid()``: one no process can have (damage) was
    an internal error for ``run`` and ``sessions scan`` (past a C long), or a compaction running
    for ever (0 and -1 asked about a process group, or every process). Its writer is gone."""
    assert run_cli(tmp_path).returncode == 0
    session = tmp_path / "state" / "default"
    cp = {"status": "running", "pid": pid, "host": socket.gethostname(), "started": 1.0, "backup": None}
    (session / "checkpoint.json").write_text(json.dumps(cp))
    scan = cli("sessions", "scan", "--state", str(tmp_path / "state"))
    assert scan.returncode == 0, scan.stderr
    assert f"{session}\tprocess {pid} ended during a compaction" in scan.stdout
    proc = run_cli(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)[-1] == HISTORY[-1]


def test_sessions_scan_shows_a_planted_checkpoints_escape_sequences_as_escapes(tmp_path: Path) -> None:
    """A checkpoint in a cloned repository's ``.ctxrules`` is anyone's text: its reason and
    backup reached the terminal raw (clearing the screen, retitling the window) and a newline
    or tab in them broke the one line per session."""
    assert run_cli(tmp_path).returncode == 0
    session = tmp_path / "state" / "default"
    cp = {"status": "interrupted", "reason": "\x1b]0;owned\x07cut\nshort\tthere", "backup": "\x1b[2J"}
    (session / "checkpoint.json").write_text(json.dumps(cp))
    scan = cli("sessions", "scan", "--state", str(tmp_path / "state"))
    assert scan.returncode == 0, scan.stderr
    assert scan.stdout.splitlines() == [
        f"{session}\t\\x1b]0;owned\\x07cut\\x0ashort\\x09there\tbackup=\\x1b[2J",
        f"1 interrupted session(s) under {tmp_path / 'state'}",
    ]


def test_a_damaged_vault_item_claiming_gigabytes_is_read_at_most_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An item made a huge sparse file: writing the same bytes again hashed all of it first
    (8 GiB: 24 s), and every turn that read it (``reread`` restoring a placeholder) hashed it
    again (16 GiB: 36 s, then 25 s). Counted, not timed: the write compares the sizes and reads
    nothing, and a read refuses the same damaged file again without reading it."""
    from ctxrules.errors import VaultError
    from ctxrules.stores import filesystem
    from ctxrules.stores.filesystem import FilesystemStore

    store = FilesystemStore(tmp_path / "root")
    session = str(tmp_path / "root" / "s")
    data = b"a line of a tool output\n" * 1000
    blob = store.put_blob(session, data)
    path = store._blob_path(session, blob)
    with open(path, "r+b") as f:
        f.truncate(200 << 20)  # sparse: past the size read whole at once
    hashed: list[int] = []
    sha256_of = filesystem._sha256_of
    monkeypatch.setattr(filesystem, "_sha256_of", lambda handle: hashed.append(1) or sha256_of(handle))
    for read in (lambda: store.get_blob(session, blob), lambda: store.open_blob(session, blob).close()) * 2:
        with pytest.raises(VaultError, match="corrupt"):
            read()
    assert len(hashed) == 1, hashed
    assert store.put_blob(session, data) == blob  # the repair: the file's size is not the data's
    assert len(hashed) == 1, hashed
    assert store.get_blob(session, blob) == data


def test_an_empty_directory_in_a_vault_items_place_is_written_over(tmp_path: Path) -> None:
    """A vault file's place taken by an empty directory (another tool's ``mkdir -p``) failed
    every write of that item: each later turn skipped the spilling stages and sent the whole
    tool output. Holding nothing, the directory is replaced by the item."""
    big = "\n".join(f"build line {i}: compiling module {i * 7}" for i in range(4000))
    history = [*HISTORY[:3], {"role": "tool", "tool_call_id": "c1", "content": big}, *HISTORY[4:]]
    first = run_cli(tmp_path, messages=history)
    assert first.returncode == 0, first.stderr
    items = [p for p in (tmp_path / "state" / "default" / "vault").glob("*/*") if p.stat().st_size > len(big) // 2]
    for item in items:
        item.unlink()
        item.mkdir()
    again = run_cli(tmp_path, messages=history)
    assert again.returncode == 0 and "stage.error" not in again.stderr, again.stderr
    assert json.loads(again.stdout) == json.loads(first.stdout)
    assert items and all(item.is_file() for item in items)


def test_a_planted_root_link_writes_no_ledger_outside(tmp_path: Path) -> None:
    """``root.json`` ties a sub-agent to its root task; its paths decide where ledgers are
    written. One planted in a session (a cloned repository's ``.ctxrules/default``) naming
    another folder is ignored: the session counts as its own root, nothing is written there."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "ledger").mkdir()  # even a folder that looks like a state root in use
    repo = tmp_path / "repo"
    session_dir = repo / ".ctxrules" / "default"
    session_dir.mkdir(parents=True)
    link = {"root_id": "x", "root_dir": str(victim), "state_root": str(victim), "parent_id": "x", "goal": None}
    (session_dir / "root.json").write_text(json.dumps(link))
    # The add first: a reset of a folder that holds no session yet is refused (CR147), writing nothing.
    proc = cli("usage", "add", "--session", str(session_dir), "--model", "gpt-4o", "--prompt", "10", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    proc = cli("usage", "reset", "--dimension", "session", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in victim.rglob("*")) == ["ledger"]
    assert (session_dir / "ledger.jsonl").is_file()


def test_a_sub_agent_with_a_state_root_elsewhere_reopened_alone_counts_in_its_root(tmp_path: Path) -> None:
    """The check of the link keeps what register_child writes: a root session with an explicit
    state root that is not its parent, its child reopened on its own (a restart), before the
    root recorded anything."""
    from ctxrules.budget.tracker import SessionLedger

    state = tmp_path / "state"
    root = Engine.load("builtin:default").session(tmp_path / "sessions" / "root", model="gpt-4o", state_root=state)
    worker = root.child("worker")
    again = SessionLedger(worker.path, worker.id, model="gpt-4o")
    assert again.state_root is not None and again.state_root.resolve() == state.resolve()
    assert again.root_dir.resolve() == root.path.resolve()


@pytest.mark.parametrize(
    ("state_root", "goal"),
    [("home", None), ("root", "../../../../notes/pwn"), ("root", None)],
    ids=["an-ancestor-as-state-root", "a-goal-out-of-goals", "a-state-root-not-made-by-ctxrules"],
)
def test_a_planted_child_link_in_a_childs_place_writes_nothing_outside(
    tmp_path: Path, state_root: str, goal: str | None
) -> None:
    """A link at a child's place (``<session>/children/x``) naming the real root session may
    still not pick the state root (only the root's folder's parent, or a state root ctxrules
    made) nor a goal that is not a file name (``ledger/goals/<goal>.jsonl``)."""
    home = tmp_path / "home"
    (home / "notes").mkdir(parents=True)
    root_dir = home / "proj" / ".ctxrules" / "sess"
    child = root_dir / "children" / "x"
    child.mkdir(parents=True)
    states = {"home": home, "root": home / "proj"}[state_root]
    link = {"root_id": "r", "root_dir": str(root_dir), "parent_id": "p", "goal": goal, "state_root": str(states)}
    (child / "root.json").write_text(json.dumps(link))
    session = Engine.load("builtin:default").session(child, model="gpt-4o")
    session.record_usage({"usage": {"prompt_tokens": 10, "completion_tokens": 5}})
    assert session.ledger.root_id != "r"
    written = sorted(str(p.relative_to(home)) for p in home.rglob("*.jsonl"))
    assert all(p.startswith("proj/.ctxrules/sess/children/") for p in written), written


@pytest.mark.parametrize("inside", ["vault", "vault/{shard}", "vault/{shard}/new", "ledger", "ledger/days"])
@pytest.mark.parametrize(
    "verb",
    [
        ("run",),
        ("compress", "--command", "pytest", "--input", "out.txt"),
        ("vault", "get", "0" * 64),
        ("usage", "show"),
        ("sessions", "export", "--to", "out.ctxs"),
    ],
    ids=lambda verb: verb[0],
)
def test_a_session_inside_ctxrules_own_folders_is_refused(tmp_path: Path, inside: str, verb: tuple[str, ...]) -> None:
    """``--session`` naming another session's vault (or a shard of it), or the state root's
    ledgers, would make a session among the items or the ledgers: its state files, its own
    ``vault/`` and ledger in there, listed and exported with them. Every verb refuses it: one
    line naming the folder, exit 2, nothing written."""
    state = tmp_path / "state"
    assert run_cli(tmp_path, "--session", str(state / "s")).returncode == 0  # state/ledger/days too
    item = Engine.load("builtin:default").session(state / "s", model="gpt-4o").vault.put_text("x\n")
    owner = state / "s" if inside.startswith("vault") else state
    target = str(owner / inside.format(shard=item[:2]))
    (tmp_path / "out.txt").write_text("x\n")
    before = sorted(tmp_path.rglob("*"))
    if verb[0] == "run":
        proc = run_cli(tmp_path, "--session", target)
    else:
        argv = [*verb, "--session", target] if verb[0] != "sessions" else [*verb[:2], target, *verb[2:]]
        proc = cli(*argv, "--state", str(state), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    folder = owner / inside.split("/")[0]
    assert proc.stderr.startswith(f"ctxrules: error: --session {target}: {folder} is where ctxrules keeps ")
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert sorted(tmp_path.rglob("*")) == before


def test_a_users_folder_named_vault_is_no_vault_of_ctxrules(tmp_path: Path) -> None:
    """A folder named ``vault`` that is nobody's vault (a project's, beside no session) may hold
    sessions: only ctxrules' own folders are refused."""
    proc = run_cli(tmp_path, "--session", str(tmp_path / "project" / "vault" / "s"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "project" / "vault" / "s" / "state.json").is_file()


def test_a_folder_named_like_ctxrules_own_far_above_a_session_is_the_users(tmp_path: Path) -> None:
    """A project named ``router`` (or ``ledger``) with a ``state.json`` and a ``ledger/days``
    of its own beside it, sessions kept deep inside: those folders are further above the
    session than any of ctxrules' own layouts go, so they are the user's and the run goes on."""
    (tmp_path / "state.json").write_text("{}")
    (tmp_path / "router" / "days").mkdir(parents=True)
    session = tmp_path / "router" / "app" / ".ctxrules" / "s"
    proc = run_cli(tmp_path, "--session", str(session))
    assert proc.returncode == 0, proc.stderr
    assert (session / "state.json").is_file()
