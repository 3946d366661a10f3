"""A model call the CLI gave up on (past its time) may still run in a thread inside litellm
when the verb is done. At interpreter exit such a thread is frozen holding what it holds; a
run of `ctxrules run` whose summarizer stream never ended then hung after writing its output
in about one run of four (litellm's finalizer waited on the import lock the thread held), and
SIGTERM did not end it. The CLI now ends the process without the interpreter's teardown when a
thread it gave up on still runs."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from conftest import REPO

from ctxrules import threads
from ctxrules.llm import call_within
from ctxrules.threads import abandoned_alive

# The failure made deterministic: a thread the CLI gave up on holds a lock for good, and the
# interpreter's teardown needs it (litellm's finalizer needed the import lock).
HOLDER = """
import atexit, sys, threading, time
sys.path.insert(0, sys.argv[1])
from ctxrules.threads import abandon

lock, held = threading.Lock(), threading.Event()

def stuck():
    with lock:
        held.set()
        time.sleep(3600)

thread = threading.Thread(target=stuck, daemon=True)
thread.start()
held.wait()
abandon(thread)
atexit.register(lock.acquire)  # the teardown waits for what the thread holds
# An idle pool of a library (litellm logs through one): its workers are no daemons, and only the
# interpreter's teardown stops them; waiting for them would hang as well.
from concurrent.futures import ThreadPoolExecutor
ThreadPoolExecutor(1, thread_name_prefix="library-pool").submit(int).result()

from ctxrules.cli.main import main
main(["validate", sys.argv[2]])
"""


def test_the_cli_exits_with_its_code_while_a_given_up_thread_holds_a_lock(tmp_path: Path) -> None:
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, str(script), str(REPO / "engine"), str(REPO / "rules" / "default.yaml")],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        raise AssertionError("the process hung at exit") from None
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 file checked: 0 error(s)" in done.stdout, done.stdout  # the output was flushed
    assert time.monotonic() - started < 60


def test_a_call_given_up_on_is_known_as_such() -> None:
    def slow() -> None:
        time.sleep(3)

    try:
        call_within(slow, {}, 0.1, name="ctxrules-test-slow")
    except TimeoutError:
        pass
    else:
        raise AssertionError("the call was not given up on")
    assert abandoned_alive()
    assert any(t.name == "ctxrules-test-slow" and t.is_alive() for t in list(threads._ABANDONED))
