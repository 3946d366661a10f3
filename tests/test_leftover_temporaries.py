"""What a process killed mid-write leaves in a session directory or a state root: whole-file
writes (``last_output.jsonl``, ``notes.json``, ``checkpoint.json``, ..., the injection key) go
to a hidden ``.NAME.XXXXXXXX.tmp`` file renamed over the target, and a ``kill -9`` between the
two left that file for good. An agent killed often grew its session directory without bound.
The next write of the session removes such a file once untouched for an hour; a live writer's
file is never taken from it (and one stopped that long writes again)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from conftest import REPO

from ctxrules.stores.filesystem import FilesystemStore

ENV = {**os.environ, "PYTHONPATH": str(REPO / "engine")}
MSGS = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]

# argv: ROOT SESSION. Writes the session's first turn and a checkpoint, and is killed
# (SIGKILL) at the first rename: its temporary file stays behind, as after the OOM killer.
KILLED = (
    "import os, signal, sys\nfrom ctxrules.stores.filesystem import FilesystemStore\n"
    "os.replace = lambda src, dst: os.kill(os.getpid(), signal.SIGKILL)\n"
    "store = FilesystemStore(sys.argv[1])\n"
    "if sys.argv[3] == 'turn':\n    store.commit_turn(sys.argv[2], {}, [{'role': 'user', 'content': 'x'}])\n"
    "else:\n    store.write_doc(sys.argv[2], 'checkpoint', b'{}')\n"
)
# argv: ROOT SESSION. Writes notes.json, printing the temporary file's path and waiting for a
# line on stdin before each rename (a writer about to rename), then prints "done".
PAUSED = (
    "import os, sys\nfrom ctxrules.stores.filesystem import FilesystemStore\n"
    "real = os.replace\n"
    "def paused(src, dst):\n    print(src, flush=True)\n    sys.stdin.readline()\n    real(src, dst)\n"
    "os.replace = paused\n"
    "FilesystemStore(sys.argv[1]).write_doc(sys.argv[2], 'notes', b'{\"n\": 1}')\n"
    "print('done', flush=True)\n"
)


def _age(path: Path, seconds: float = 3700) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def _leftovers(session: Path) -> list[str]:
    return sorted(p.name for p in session.iterdir() if p.name.endswith(".tmp"))


def test_what_killed_writers_left_goes_with_the_next_turn_and_nothing_else(tmp_path: Path) -> None:
    root = tmp_path / "state"
    key = FilesystemStore(root).session_key("s1")
    session = Path(key)
    for what in ("turn", "checkpoint"):
        killed = subprocess.run(
            [sys.executable, "-c", KILLED, str(root), key, what], env=ENV, capture_output=True, timeout=120
        )
        assert killed.returncode == -9, killed.stderr
    left = _leftovers(session)
    assert [name.split(".")[1] for name in left] == ["checkpoint", "last_output"], left
    # The user's own hidden files (a session directory may be a folder of theirs), and names
    # that only look alike, are never touched, however old.
    mine = [".mine.tmp", ".notes.json.abc.tmp", ".notes.json.abcdefgh.tmp.bak", ".other.json.abcdefgh.tmp"]
    for name in mine:
        (session / name).write_bytes(b"the user's")
    for path in session.iterdir():
        _age(path)
    fresh = session / ".notes.json.freshone.tmp"  # a writer at work
    fresh.write_bytes(b"{}")
    FilesystemStore(root).commit_turn(key, {}, MSGS)  # the next command
    assert _leftovers(session) == sorted([*mine[:2], mine[3], fresh.name])
    assert (session / mine[2]).exists()
    assert FilesystemStore(root).load_turn(key).output == MSGS
    # The session's verbs read such a directory as any other.
    for verb in (["scan", "--state", str(root)], ["export", key, "--state", str(root), "--to", str(tmp_path / "a")]):
        done = subprocess.run(
            [sys.executable, "-m", "ctxrules.cli.main", "sessions", *verb],
            env=ENV,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0 and ".tmp" not in done.stderr + done.stdout, done.stderr


def test_a_live_writers_file_is_kept_and_one_stopped_for_an_hour_writes_again(tmp_path: Path) -> None:
    """Two processes: one writing notes.json stands just before its rename while another
    writes the session. Its file is new: kept, and the rename lands. Then, stopped for over an
    hour (SIGSTOP, a suspended laptop), its file looks like a killed writer's and goes; the
    write is done again at the rename, and the notes are there, whole."""
    root = tmp_path / "state"
    key = FilesystemStore(root).session_key("s1")
    FilesystemStore(root).commit_turn(key, {}, MSGS)
    with subprocess.Popen(
        [sys.executable, "-c", PAUSED, str(root), key],
        env=ENV,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as writer:
        assert writer.stdout is not None and writer.stdin is not None
        tmp = Path(writer.stdout.readline().strip())
        assert tmp.parent == Path(key) and tmp.exists()
        FilesystemStore(root).commit_turn(key, {}, MSGS)  # another process's turn, now
        assert tmp.exists()  # a live writer's: kept
        _age(tmp)  # the writer was stopped for an hour
        FilesystemStore(root).commit_turn(key, {}, MSGS)
        assert not tmp.exists()
        writer.stdin.write("\n")
        writer.stdin.flush()
        again = Path(writer.stdout.readline().strip())  # written once more
        assert again != tmp and again.exists()
        writer.stdin.write("\n")
        writer.stdin.flush()
        assert writer.stdout.readline().strip() == "done"
        assert writer.wait(timeout=60) == 0
    assert Path(key, "notes.json").read_bytes() == b'{"n": 1}'
    assert _leftovers(Path(key)) == []


def test_a_killed_key_creators_file_goes_when_the_key_is_made(tmp_path: Path) -> None:
    root = tmp_path / "state"
    root.mkdir()
    left = root / ".injection.key.abcd_123.tmp"
    left.write_text("00" * 32 + "\n")
    _age(left)
    fresh = root / ".injection.key.newer123.tmp"
    fresh.write_text("")
    FilesystemStore(root).secret(None, "injection.key", lambda: b"\x01" * 32)
    assert sorted(p.name for p in root.iterdir()) == [fresh.name, "injection.key"]
