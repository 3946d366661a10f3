"""``ctxrules sessions import`` is all or nothing in every store: an import killed (SIGKILL) or
failing halfway through its writes leaves nothing ``sessions list`` shows, a retry then
succeeds and the session equals the export, and a complete session is still never replaced
(CR146). The real CLI in a subprocess; the kill comes at a chosen write (the store method is
wrapped before the CLI's entry point runs), so the test does not depend on timing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO
from session_kit import export_session

ENV = {**os.environ, "PYTHONPATH": str(REPO / "engine"), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
ENV.pop("CTXRULES_STORE", None)
ENV.pop("CTXRULES_STATE", None)

# The CLI's entry point, with the store's method METHOD wrapped to end the process (SIGKILL)
# or raise (OSError: a full disk) on its COUNT-th call.
_WRAPPED = """
import os, signal, sys
import ctxrules.stores.{module} as m
how, method, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
cls = m.{cls}
real = getattr(cls, method)
calls = [0]
def wrapped(self, *a, **k):
    calls[0] += 1
    if calls[0] == count:
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise OSError(28, "No space left on device")
    return real(self, *a, **k)
setattr(cls, method, wrapped)
from ctxrules.cli.main import main
sys.argv = ["ctxrules", *sys.argv[4:]]
sys.exit(main())
"""
_STORES = {"file": ("filesystem", "FilesystemStore"), "redis": ("redis", "RedisStore")}


def ctxrules(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ctxrules.cli.main", *argv],
        cwd=cwd, env=ENV, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def interrupted(
    kind: str, how: str, method: str, count: int, *argv: str, cwd: Path
) -> subprocess.CompletedProcess[str]:
    module, cls = _STORES[kind]
    code = _WRAPPED.format(module=module, cls=cls)
    return subprocess.run(
        [sys.executable, "-c", code, how, method, str(count), *argv],
        cwd=cwd, env=ENV, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp_path = tmp_path_factory.mktemp("export")
    """An archive of a session with a turn, vault items, a note, a recorded call and its key."""
    tool = "\n".join(f"test_{i} PASSED in {i}ms" for i in range(6000))
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You run tests."},
        {"role": "user", "content": "Run the tests."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": tool},
        {"role": "assistant", "content": "All pass."},
        {"role": "user", "content": "Good."},
    ]  # fmt: skip
    (tmp_path / "in.json").write_text(json.dumps(msgs))
    run = ctxrules("run", "--pack", "builtin:default", "--model", "gpt-4o", "--window", "20000", "--input",
                   "in.json", "--output", "out.json", "--state", "A", "--session", "A/s", cwd=tmp_path)  # fmt: skip
    assert run.returncode == 0, run.stderr
    return export_session(ctxrules, tmp_path, ENV, prompt_tokens=10)


def _records(archive: bytes) -> list[dict[str, Any]]:
    """The records of an archive but the header's time and the end record's digest (an
    export of the imported session is otherwise the same file)."""
    lines = [json.loads(line) for line in archive.splitlines()]
    for rec in lines:
        for key in ("exported", "from", "sha256", "session"):
            rec.pop(key, None)
        if rec.get("kind") == "turn":
            rec["state"]["last"].pop("output_file", None)  # the filesystem store's file identity
    return lines


def _store_args(kind: str, tmp_path: Path, url: str | None) -> tuple[list[str], str]:
    """The store options of the target, and the --session of the import."""
    if kind == "file":
        return ["--state", str(tmp_path / "B")], str(tmp_path / "B" / "s")
    assert url is not None
    return ["--store", url], "s"


@pytest.fixture(params=["file", "redis"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, list[str], str]:
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    store, session = _store_args(request.param, tmp_path, url)
    return request.param, store, session


# Where an import is cut short: SIGKILL at a write (a vault item after the first, the document,
# the turn: the last write), and a write failing (a full disk) halfway.
_CUTS = [
    ("kill", "put_blob", 2),
    ("kill", "write_doc", 1),
    ("kill", "commit_turn", 1),
    ("error", "append", 1),
]


@pytest.mark.parametrize(("how", "method", "count"), _CUTS, ids=[f"{h}-{m}-{n}" for h, m, n in _CUTS])
def test_an_import_cut_short_leaves_nothing_and_a_retry_imports_it_whole(
    tmp_path: Path, archive: Path, target: tuple[str, list[str], str], how: str, method: str, count: int
) -> None:
    kind, store, session = target
    other = ctxrules("sessions", "import", str(archive), *store, "--session", session + "-other", cwd=tmp_path)
    assert other.returncode == 0, other.stderr
    argv = ["sessions", "import", str(archive), *store, "--session", session]
    cut = interrupted(kind, how, method, count, *argv, cwd=tmp_path)
    if how == "kill":
        assert cut.returncode == -signal.SIGKILL, cut.stderr
    else:
        # Named as the session it was writing, not as an archive that cannot be read.
        said = cut.stderr
        assert cut.returncode == 2 and "No space left" in said and "cannot read" not in said and session in said, said
        assert "Traceback" not in said
        if kind == "file":  # a failure that the process lives through removes what it wrote
            assert sorted(p.name for p in (tmp_path / "B").iterdir()) == ["s-other"]
    # Nothing of it is a session, nor an interrupted one; the other session is untouched.
    assert _sessions(kind, store, tmp_path) == [session + "-other"]
    scan = ctxrules("sessions", "scan", *store, cwd=tmp_path)
    assert scan.returncode == 0 and scan.stdout.startswith("0 interrupted"), scan.stdout + scan.stderr
    retry = ctxrules(*argv, cwd=tmp_path)
    assert retry.returncode == 0, retry.stderr
    for name in (session, session + "-other"):
        again = ctxrules("sessions", "export", name, *store, "--to", "again.ctxs", cwd=tmp_path)
        assert again.returncode == 0, again.stderr
        assert _records((tmp_path / "again.ctxs").read_bytes()) == _records(archive.read_bytes())
    assert _sessions(kind, store, tmp_path) == sorted([session, session + "-other"])
    if kind == "file":  # what the killed import left went with the retry
        assert sorted(p.name for p in (tmp_path / "B").iterdir()) == ["s", "s-other"]
    # A complete session is still never replaced.
    refused = ctxrules(*argv, cwd=tmp_path)
    assert refused.returncode == 2 and "[CR146]" in refused.stderr and "exists already" in refused.stderr


def _sessions(kind: str, store: list[str], tmp_path: Path) -> list[str]:
    """The sessions the store lists (what ``sessions list`` would show), as --session names."""
    code = (
        "import sys, json\nfrom ctxrules.stores import open_store\n"
        "s = open_store(sys.argv[1])\nprint(json.dumps(s.sessions()))"
    )
    url = store[1] if kind == "redis" else (tmp_path / "B").as_uri()
    got = subprocess.run([sys.executable, "-c", code, url], cwd=tmp_path, env=ENV, capture_output=True, text=True)
    assert got.returncode == 0, got.stderr
    return list(json.loads(got.stdout))


@pytest.mark.parametrize("points_at", ["nowhere", "an empty folder"])
def test_an_import_into_a_symbolic_link_names_the_link(archive: Path, tmp_path: Path, points_at: str) -> None:
    """``--session B/lnk`` where lnk is a symbolic link: the import failed naming its hidden
    staging folder (``B/.lnk.importing-XXXXXXXX: Not a directory``), a path the user never
    gave. It names the link; nothing is written on either side of it."""
    (tmp_path / "B").mkdir()
    target = tmp_path / "elsewhere"
    if points_at == "an empty folder":
        target.mkdir()
    (tmp_path / "B" / "lnk").symlink_to(target)
    done = ctxrules("sessions", "import", str(archive), "--state", "B", "--session", "B/lnk", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr == "ctxrules: error: B/lnk: a symbolic link, which a session is not written through\n"
    assert sorted(p.name for p in (tmp_path / "B").iterdir()) == ["lnk"]
    assert not target.exists() or list(target.iterdir()) == []
