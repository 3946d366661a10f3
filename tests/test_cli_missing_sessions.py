"""A command given a session that is not there changes nothing on disk: ``usage reset`` of a
missing session (a typo, a path below a file, one reached through ``..``, an absolute path
elsewhere) is exit 2 (CR147) and makes no folder, and a ``usage add`` that fails makes nothing
(no session folder, no empty day ledger). Every verb that takes ``--session`` or ``--state``
is driven through the real CLI and the whole tree it could touch (the working folder with the
state root, and ``HOME``) compared before and after."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from cli_kit import cli

from ctxrules.budget.tracker import SessionLedger
from ctxrules.budget.usage import TokenUsage

# How a mistaken --session looks; each names no session. "outside" is absolute, away from STATE.
FORMS = {
    "missing": "typo/s",
    "below a file": "afile/s",
    "dot-dot": "STATE/real/../../typo/s",
    "outside": "{tmp}/elsewhere/s",
}


def _tree(top: Path) -> dict[str, tuple[str, int, int]]:
    """Every file and folder below ``top``: its kind, size and modification time."""
    out = {}
    for folder, dirs, files in os.walk(top):
        for name in dirs + files:
            path = Path(folder) / name
            st = path.lstat()
            kind = "dir" if path.is_dir() else "file"
            out[str(path.relative_to(top))] = (kind, st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working folder: ``STATE`` with one session (``STATE/real``) that recorded a call,
    ``afile`` (a regular file), and ``HOME`` (empty) that the commands run with."""
    for name in ("CTXRULES_STATE", "CTXRULES_STORE"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "HOME").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "HOME"))
    (tmp_path / "afile").write_text("x", encoding="utf-8")
    state = tmp_path / "STATE"
    ledger = SessionLedger(state / "real", "real", state_root=state)
    ledger.record(TokenUsage.of(prompt=10, completion=2), model="gpt-4o", at=1_700_000_000.0)
    return tmp_path


def _session(form: str, tmp: Path) -> str:
    return FORMS[form].format(tmp=tmp)


def _refused_in_one_line(proc: subprocess.CompletedProcess[str], *, code: int = 2) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ctxrules: error: "), proc.stderr
    return lines[0]


@pytest.mark.parametrize("state", [True, False], ids=["--state", "no --state"])
@pytest.mark.parametrize("dimension", ["session", "day", "goal"])
@pytest.mark.parametrize("form", list(FORMS))
def test_a_reset_of_a_session_that_is_not_there_changes_nothing(
    work: Path, form: str, dimension: str, state: bool
) -> None:
    # `usage reset --session typo/s` made typo/s/ledger.jsonl (or, without --state, a state
    # root typo/ledger/ next to it) and said "reset the session budget": exit 0 for a typo.
    session = _session(form, work)
    before = _tree(work)
    argv = ["usage", "reset", "--session", session, "--dimension", dimension, "--goal", "g"]
    proc = cli(*argv, *(["--state", "STATE"] if state else []), cwd=work)
    line = _refused_in_one_line(proc)
    if form == "below a file":  # the system's word for the path, as every verb gives it
        assert line == f"ctxrules: error: {session}: {os.strerror(20)}"
    else:
        assert line.startswith(f"ctxrules: error: [CR147] no session {session}, nothing was reset"), line
    assert proc.stdout == ""
    assert _tree(work) == before


def test_a_reset_without_a_session_needs_the_default_one_and_the_state_root(work: Path) -> None:
    # No --session: the session dimension is STATE/default's, which is not there; the day and
    # goal dimensions are the state root's, and a state root that is not there is not made.
    before = _tree(work)
    line = _refused_in_one_line(cli("usage", "reset", "--state", "STATE", "--dimension", "session", cwd=work))
    assert line.startswith(f"ctxrules: error: [CR147] no session {work / 'STATE' / 'default'}, nothing was reset")
    for dimension in ("day", "goal"):
        proc = cli("usage", "reset", "--state", "nowhere", "--dimension", dimension, "--goal", "g", cwd=work)
        line = _refused_in_one_line(proc)
        assert line.startswith(f"ctxrules: error: {work / 'nowhere'}: no such state root, nothing was reset"), line
    assert _tree(work) == before
    # What is there is reset, as before: the session's root task, the state root's day.
    for dimension in ("session", "day"):
        proc = cli("usage", "reset", "--session", "STATE/real", "--state", "STATE", "--dimension", dimension, cwd=work)
        assert proc.returncode == 0 and proc.stdout.startswith(f"reset the {dimension} budget"), proc.stderr


def test_a_reset_of_a_goal_that_recorded_nothing_changes_nothing(work: Path) -> None:
    # `usage reset --dimension goal --goal typo` wrote a reset into a new ledger/goals/typo.jsonl
    # and said "reset the goal budget": exit 0 for a typo, as the session reset was.
    recorded = cli("usage", "add", "--session", "STATE/real", "--state", "STATE", "--goal", "ship-v2",
                   "--model", "gpt-4o", "--prompt", "10", cwd=work)  # fmt: skip
    assert recorded.returncode == 0, recorded.stderr
    before = _tree(work)
    argv = ["usage", "reset", "--session", "STATE/real", "--state", "STATE", "--dimension", "goal"]
    line = _refused_in_one_line(cli(*argv, "--goal", "ship-v3", cwd=work))
    assert line == (
        f"ctxrules: error: no call was recorded for goal ship-v3 in {work / 'STATE'}, nothing was reset; "
        "did you mean 'ship-v2'?"
    )
    assert _tree(work) == before
    # A goal that recorded a call is reset, as before.
    proc = cli(*argv, "--goal", "ship-v2", cwd=work)
    assert proc.returncode == 0 and proc.stdout.startswith("reset the goal budget"), proc.stderr


@pytest.mark.parametrize(
    ("where", "goal"),
    [("afile/s", None), ("{tmp}/afile/s", None), ("STATE/new", "g")],
    ids=["below a file", "absolute below a file", "goal ledger folder is a file"],
)
def test_an_add_that_fails_makes_nothing(work: Path, where: str, goal: str | None) -> None:
    # The day ledger was opened (made, empty, with its lock file) before the session's failed:
    # a fresh state root was left with ledger/days/DAY.jsonl after "Not a directory".
    fresh = work / "FRESH"
    fresh.mkdir()
    if goal:
        (fresh / "ledger").mkdir()
        (fresh / "ledger" / "goals").write_text("", encoding="utf-8")  # a file where the folder goes
    session = where.format(tmp=work).replace("STATE", "FRESH")
    before = _tree(work)
    goals = ["--goal", goal] if goal else []
    argv = ["usage", "add", "--session", session, "--state", "FRESH", *goals, "--model", "gpt-4o", "--prompt", "5"]
    line = _refused_in_one_line(cli(*argv, cwd=work))
    assert line.endswith(os.strerror(20)), line  # "Not a directory", naming the path
    blocked = session if not goal else str(fresh / "ledger" / "goals")
    assert line == f"ctxrules: error: {blocked}: {os.strerror(20)}"
    assert _tree(work) == before
    # Once the way is clear the same add makes its session (that is what add is for).
    if goal:
        (fresh / "ledger" / "goals").unlink()
        proc = cli(*argv, cwd=work)
        assert proc.returncode == 0 and proc.stdout.startswith("recorded gpt-4o"), proc.stderr
        assert (work / "FRESH" / "new" / "ledger.jsonl").is_file()


def test_an_add_refused_at_a_linked_goal_ledger_folder_makes_no_day_ledger(work: Path) -> None:
    # A link where ledger/goals belongs is refused (a planted link must not receive ledgers),
    # but the day ledger, opened first, had been made by then: empty, with its lock file.
    fresh = work / "FRESH"
    (fresh / "ledger").mkdir(parents=True)
    (work / "elsewhere").mkdir()
    (fresh / "ledger" / "goals").symlink_to(work / "elsewhere")
    before = _tree(work)
    argv = ["usage", "add", "--session", "FRESH/s", "--state", "FRESH", "--goal", "g", "--model", "gpt-4o"]
    line = _refused_in_one_line(cli(*argv, "--prompt", "5", cwd=work))
    goals = fresh / "ledger" / "goals"
    assert line.startswith(f"ctxrules: error: refusing to use {goals}: it is a symbolic link"), line
    assert _tree(work) == before


VERBS = {
    "usage show": ["usage", "show", "--session", "{s}"],
    "usage add": ["usage", "add", "--session", "{s}", "--model", "gpt-4o", "--prompt", "1"],
    "usage reset": ["usage", "reset", "--session", "{s}", "--dimension", "session"],
    "sessions resume": ["sessions", "resume", "{s}"],
    "sessions export": ["sessions", "export", "{s}", "--to", "out.ctxs"],
    "vault get": ["vault", "get", "0123456789abcdef", "--session", "{s}"],
    "mcp": ["mcp", "--session", "{s}"],
}


@pytest.mark.parametrize("form", ["below a file", "missing"])
@pytest.mark.parametrize("verb", list(VERBS))
def test_no_verb_makes_anything_for_a_session_that_is_not_there(work: Path, verb: str, form: str) -> None:
    # A session that is not there is read as empty (`usage show`: exit 0 and a note), refused
    # (exit 2, one line), or made (`usage add` of a new session): never a folder left behind
    # by a command that failed, never a file in HOME.
    session = _session(form, work)
    argv = [part.format(s=session) for part in VERBS[verb]]
    before = _tree(work)
    proc = cli(*argv, "--state", "STATE", cwd=work, stdin=subprocess.DEVNULL)
    if verb == "usage add" and form == "missing":
        assert proc.returncode == 0, proc.stderr
        made = {m for m in set(_tree(work)) - set(before) if not m.startswith("STATE/ledger/days/")}  # today's
        assert made == {"typo", "typo/s", "typo/s/ledger.jsonl", "typo/s/ledger.jsonl.lock"}
        return
    if verb == "usage show" and form == "missing":
        assert proc.returncode == 0 and proc.stderr.startswith(f"ctxrules: note: --session {session}: no session")
    else:
        assert session in _refused_in_one_line(proc)
    assert _tree(work) == before


@pytest.mark.parametrize(
    "argv",
    [
        ["usage", "report"],
        ["usage", "show"],
        ["usage", "reset", "--dimension", "day"],
        ["usage", "add", "--model", "gpt-4o", "--prompt", "1"],
        ["sessions", "scan"],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_a_state_root_that_is_a_file_is_named_as_one(work: Path, argv: list[str]) -> None:
    # `usage report --state afile` said "no such state root" of a file that is there.
    before = _tree(work)
    line = _refused_in_one_line(cli(*argv, "--state", "afile", cwd=work))
    assert line.startswith(f"ctxrules: error: {work / 'afile'}: ") and "not a directory" in line, line
    assert _tree(work) == before


@pytest.mark.parametrize(
    "argv",
    [
        ["sessions", "import", "arch.ctxs", "--session", "typo/s"],
        ["sessions", "export", "STATE/real", "--to", "out.ctxs"],
        ["sessions", "resume", "STATE/real"],
        ["vault", "get", "0123456789abcdef", "--session", "STATE/real"],
        ["mcp", "--session", "STATE/real"],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_a_state_root_that_is_a_file_is_refused_before_anything(work: Path, argv: list[str]) -> None:
    # `sessions import ... --session typo/s --state afile` made typo/s (with a signing key of its
    # own) and said "imported"; export said "cannot read the injection key", mcp served.
    exported = cli("sessions", "export", "STATE/real", "--state", "STATE", "--to", "arch.ctxs", cwd=work)
    assert exported.returncode == 0, exported.stderr
    before = _tree(work)
    proc = cli(*argv, "--state", "afile", cwd=work, stdin=subprocess.DEVNULL)
    line = _refused_in_one_line(proc)
    assert line == f"ctxrules: error: {work / 'afile'}: the state root is not a directory (give --state DIR)"
    assert _tree(work) == before


@pytest.mark.parametrize(
    ("argv", "stdin", "code"),
    [
        (["compress", "--", "echo", "short"], None, 125),
        (["compress", "--command", "echo", "--input", "-"], b"short\n", 2),
    ],
    ids=["proxy", "filter"],
)
def test_compress_refuses_a_state_root_that_is_a_file_before_the_command(
    work: Path, argv: list[str], stdin: bytes | None, code: int
) -> None:
    # A short output needs no vault: `compress --state afile -- echo short` printed it and
    # exited 0, while a long one failed on the vault. Now both are refused up front, and the
    # command does not run in proxy mode (125: ctxrules failed, not CMD).
    before = _tree(work)
    proc = cli(*argv[:1], "--state", "afile", *argv[1:], text=False, cwd=work, input=stdin or b"")
    assert proc.returncode == code, proc.stderr
    assert proc.stdout == b""
    assert f"{work / 'afile'}: the state root is not a directory (give --state DIR)" in proc.stderr.decode()
    assert "Traceback" not in proc.stderr.decode()
    assert _tree(work) == before


@pytest.mark.parametrize(
    "argv",
    [
        ["sessions", "import", "arch.ctxs", "--session", "STATE/real/vault/x"],
        ["usage", "add", "--session", "STATE/real/vault/x", "--model", "gpt-4o", "--prompt", "1"],
        ["usage", "add", "--session", "STATE/real/vault/ab/x", "--model", "gpt-4o", "--prompt", "1"],
    ],
    ids=["sessions import", "usage add", "usage add in a shard"],
)
def test_a_session_in_a_vault_not_made_yet_is_refused(work: Path, argv: list[str]) -> None:
    # STATE/real recorded calls but stored no item yet, so it has no vault/ folder: a session
    # named inside it was made there (import: exit 0), its folder the vault the next item goes in.
    exported = cli("sessions", "export", "STATE/real", "--state", "STATE", "--to", "arch.ctxs", cwd=work)
    assert exported.returncode == 0, exported.stderr
    assert not (work / "STATE" / "real" / "vault").exists()
    before = _tree(work)
    line = _refused_in_one_line(cli(*argv, "--state", "STATE", cwd=work))
    vault = work / "STATE" / "real" / "vault"
    session = argv[argv.index("--session") + 1]
    assert line.startswith(f"ctxrules: error: --session {session}: {vault} is where ctxrules keeps "), line
    assert _tree(work) == before


def test_a_reset_of_a_session_id_not_in_a_redis_store_writes_nothing(redis_url: str, tmp_path: Path) -> None:
    redis = pytest.importorskip("redis", reason="the Redis store's client (ctxrules[redis]) is not installed")
    proc = cli("usage", "reset", "--store", redis_url, "--session", "typo", "--dimension", "session", cwd=tmp_path)
    line = _refused_in_one_line(proc)
    assert line.startswith(f"ctxrules: error: [CR147] no session typo in {redis_url}, nothing was reset"), line
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.dbsize() == 0  # not a key: no ledger, no session
    finally:
        client.close()
