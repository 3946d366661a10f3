"""ctxrules.locks: one portable lock (filelock) for every writer of shared state.

Exclusion across threads and processes, timeouts, a planted symbolic link refused, no ``fcntl``
left in the package, and the read-only verbs importing no lock module at all.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ctxrules.locks import FileLock, LockError, LockTimeout

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "engine"
LOCK_MODULES = ("ctxrules.locks", "filelock", "ctxrules.summarize.lock")

# Runs the real CLI entry point in this interpreter and, at exit, writes which lock modules
# the run loaded to the file named first (stdout belongs to the command).
_WRAPPER = (
    "import atexit, json, sys\n"
    "out = sys.argv.pop(1)\n"
    f"mods = {LOCK_MODULES!r}\n"
    "atexit.register(lambda: open(out, 'w').write(json.dumps([m for m in mods if m in sys.modules])))\n"
    "from ctxrules.cli.main import main\n"
    "sys.argv[0] = 'ctxrules'\n"
    "main()\n"
)


def _cli(tmp_path: Path, *argv: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    record = tmp_path / "modules.json"
    env = {**os.environ, "PYTHONPATH": str(ENGINE), "CTXRULES_STATE": str(tmp_path / "state")}
    proc = subprocess.run(
        [sys.executable, "-c", _WRAPPER, str(record), *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc, json.loads(record.read_text())


@pytest.mark.parametrize(
    "argv",
    [
        ("validate", "rules/"),
        ("explain", "rules/default.yaml"),
        ("assemble", "--pack", "builtin:default", "--mode", "full", "--model", "gpt-4o"),
        ("test", "rules/"),
    ],
)
def test_read_only_verbs_import_no_lock_module(tmp_path: Path, argv: tuple[str, ...]) -> None:
    proc, loaded = _cli(tmp_path, *argv)
    assert proc.returncode == 0, proc.stderr
    assert loaded == []


def test_run_does_use_the_lock_module(tmp_path: Path) -> None:
    """The check above can fail: a verb that writes a session does load it."""
    inp = tmp_path / "in.json"
    inp.write_text(json.dumps([{"role": "user", "content": "hello"}]))
    proc, loaded = _cli(tmp_path, "run", "--pack", "builtin:default", "--model", "gpt-4o", "--input", str(inp))
    assert proc.returncode == 0, proc.stderr
    assert "ctxrules.locks" in loaded
    # POSIX locks with flock directly; filelock is the Windows implementation.
    assert ("filelock" in loaded) == (sys.platform == "win32")
    assert (tmp_path / "state" / "default" / ".lock").is_file()


def test_no_module_of_the_package_locks_with_fcntl() -> None:
    """fcntl does not exist on Windows: the package locks through ctxrules.locks only, which
    imports it on POSIX alone (filelock on Windows). Any other use of fcntl (the pipe of
    `ctxrules compress -- CMD` widened on Linux) imports it inside a function, on its platform."""
    import ast

    at_import: list[str] = []
    locking: list[str] = []
    for path in sorted((ENGINE / "ctxrules").rglob("*.py")):
        name = str(path.relative_to(ENGINE))
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
        top = [n for node in tree.body for n in ast.walk(node) if not isinstance(node, ast.FunctionDef | ast.ClassDef)]
        if any(isinstance(n, ast.Import) and any(a.name == "fcntl" for a in n.names) for n in top):
            at_import.append(name)
        if "flock(" in source or "lockf(" in source:
            locking.append(name)
    assert at_import == [str(Path("ctxrules") / "locks.py")]
    assert locking == [str(Path("ctxrules") / "locks.py")]
    source = (ENGINE / "ctxrules" / "locks.py").read_text(encoding="utf-8")
    assert 'if sys.platform != "win32":\n    import fcntl' in source


def test_threads_exclude_one_another_through_one_lock_object(tmp_path: Path) -> None:
    lock = FileLock(tmp_path / "x.lock")
    inside: list[int] = []
    overlaps: list[int] = []

    def work(n: int) -> None:
        for _ in range(20):
            with lock:
                if inside:
                    overlaps.append(n)
                inside.append(n)
                time.sleep(0.001)
                inside.pop()

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert overlaps == [] and not any(t.is_alive() for t in threads)


def test_another_process_holding_the_lock_times_out(tmp_path: Path) -> None:
    path = tmp_path / "s" / ".lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from ctxrules.locks import FileLock\n"
            "with FileLock(sys.argv[1]):\n    print('held', flush=True); time.sleep(30)\n",
            str(path),
        ],
        env={**os.environ, "PYTHONPATH": str(ENGINE)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        t = time.monotonic()
        with pytest.raises(LockTimeout, match="held by another process"):
            FileLock(path, timeout=0.3).acquire()
        assert time.monotonic() - t >= 0.25
        with pytest.raises(LockTimeout):
            FileLock(path, timeout=0).acquire()
    finally:
        holder.kill()
        holder.communicate()
    with FileLock(path, timeout=5):  # released when the holder died
        pass
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert oct(path.parent.stat().st_mode & 0o777) == "0o700"


def test_run_waiting_on_a_held_session_says_so_and_goes_on_when_released(tmp_path: Path) -> None:
    """A run whose session another process holds (stopped, or slow) waits for it, as the
    session's contract says, but not silently: one line on stderr names the lock, then the run
    finishes once the holder lets go."""
    inp = tmp_path / "in.json"
    inp.write_text(json.dumps([{"role": "user", "content": "hello"}]))
    session = tmp_path / "sess"
    argv = ["run", "--pack", "builtin:default", "--model", "gpt-4o", "--input", str(inp), "--session", str(session)]
    first, _ = _cli(tmp_path, *argv)
    assert first.returncode == 0, first.stderr
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from ctxrules.locks import FileLock\n"
            "with FileLock(sys.argv[1]):\n    print('held', flush=True); sys.stdin.readline()\n",
            str(session / ".lock"),
        ],
        env={**os.environ, "PYTHONPATH": str(ENGINE)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        env = {**os.environ, "PYTHONPATH": str(ENGINE)}
        waiting = subprocess.Popen(
            [sys.executable, "-m", "ctxrules.cli.main", *argv],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert waiting.stderr is not None
        ready, _, _ = select.select([waiting.stderr], [], [], 60)
        assert ready, "a minute passed without a word: the wait is silent"
        line = waiting.stderr.readline()
        assert "lock.wait" in line and str(session / ".lock") in line, line
        assert waiting.poll() is None, "it waits for the holder"
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.flush()
        out, err = waiting.communicate(timeout=120)
        assert waiting.returncode == 0, err
        assert json.loads(out)[0]["content"] == "hello"
    finally:
        holder.kill()
        holder.communicate()


def test_a_symlinked_lock_file_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / ".lock").symlink_to(target)
    with pytest.raises(LockError, match="symbolic link"):
        FileLock(tmp_path / "s" / ".lock").acquire()
    assert not target.exists()


def test_run_refuses_a_session_whose_lock_is_a_symlink(tmp_path: Path) -> None:
    target = tmp_path / "victim.txt"
    target.write_text("precious\n")
    session = tmp_path / "state" / "default"
    session.mkdir(parents=True)
    (session / ".lock").symlink_to(target)
    inp = tmp_path / "in.json"
    inp.write_text(json.dumps([{"role": "user", "content": "hello"}]))
    proc, _ = _cli(tmp_path, "run", "--pack", "builtin:default", "--model", "gpt-4o", "--input", str(inp))
    assert proc.returncode == 2
    assert "symbolic link" in proc.stderr and "internal error" not in proc.stderr
    assert target.read_text() == "precious\n"


def test_one_object_nests_in_a_thread_and_two_objects_are_an_error_not_a_deadlock(tmp_path: Path) -> None:
    path = tmp_path / "n.lock"
    lock = FileLock(path)
    with lock:
        with lock:
            assert lock.is_locked
        assert lock.is_locked  # the outer hold is still there
        with pytest.raises(LockError, match="another lock object"):
            FileLock(path).acquire()  # waiting for itself: an error, never a deadlock
        with pytest.raises(LockTimeout):
            FileLock(path, timeout=5).acquire()  # with a timeout: held, as by anyone else
    assert not lock.is_locked
    with FileLock(path, timeout=0):  # released: another object takes it at once
        pass


def test_a_kept_descriptor_follows_a_lock_file_replaced_between_acquires(tmp_path: Path) -> None:
    """The lock keeps its descriptor open between acquires; when the file at the path is
    removed or replaced meanwhile, the next acquire locks the file that is there now, so that
    another process opening the path is excluded."""
    path = tmp_path / "s" / ".lock"
    lock = FileLock(path)
    with lock:
        pass
    path.unlink()
    with lock:
        assert path.is_file()
        code = (
            "import sys; from ctxrules.locks import FileLock, LockTimeout\n"
            "try:\n    FileLock(sys.argv[1], timeout=0).acquire()\n"
            "except LockTimeout:\n    print('busy')\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code, str(path)],
            env={**os.environ, "PYTHONPATH": str(ENGINE)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.stdout == "busy\n", out.stderr


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_does_not_inherit_the_hold(tmp_path: Path) -> None:
    path = tmp_path / "f.lock"
    lock = FileLock(path, timeout=0.2)
    with lock:
        pid = os.fork()
        if pid == 0:  # the child: its acquire must wait for the parent, and time out
            try:
                lock.acquire()
                os._exit(1)
            except LockTimeout:
                os._exit(0)
            except BaseException:
                os._exit(2)
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0
        assert lock.is_locked  # the child closing its copy left the parent's lock in place
    pid = os.fork()
    if pid == 0:  # released now: the child takes it
        try:
            with lock:
                os._exit(0)
        except BaseException:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
