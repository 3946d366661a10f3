"""Collect transcripts, replay every (transcript, plan) pair, in worker processes if asked."""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from ctxrules.errors import CtxrulesError, MessagesError, UsageError
from ctxrules.eval.replay import Plan, Progress, Task, TaskResult, replay
from ctxrules.eval.scratch import remove_abandoned
from ctxrules.formats import anthropic, detect
from ctxrules.json_files import read_json
from ctxrules.messages import split_input, validate_messages, validate_tools
from ctxrules.threads import helper_thread

__all__ = ["load_transcripts", "run_tasks"]


def _messages_of(data: Any, path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
    """``(messages, tools)`` of a transcript file's JSON, checked as ``ctxrules run`` checks its
    input (an Anthropic Messages request is decoded first); None when it is not a transcript.
    A transcript whose messages no stage could take is a usage error naming the file: a list
    is one when any of its items is an object with a ``role`` (one message without a role, or
    not an object, is damage to name, not a sign the file is something else: it was skipped
    with a note, and the run's totals went without it)."""
    listed = isinstance(data, list) and any(isinstance(m, dict) and "role" in m for m in data)
    if not listed and not (isinstance(data, dict) and isinstance(data.get("messages"), list)):
        return None
    try:
        if detect(data) == "anthropic":
            decoded = anthropic.decode(data)
            messages, tools = decoded.messages, decoded.tools or []
        else:
            raw, raw_tools = split_input(data)
            messages, tools = raw, raw_tools or []
        messages = validate_messages(messages)
        tools = validate_tools(tools) if tools else []
    except MessagesError as exc:
        raise UsageError(f"{path}: not a transcript ctxrules can replay: {exc}") from None
    return messages, tools


def _names(files: Sequence[Path]) -> list[str]:
    """A name per file, its stem, or where stems repeat its path from the files' common folder
    (without ``.json``): every row of the report is one transcript. Stems are compared as
    shown (:func:`_decoded`): ``a\\xff.json`` (a byte that is not UTF-8) and ``a\\\\xff.json``
    (a backslash) both read ``a\\xff``, and shared one row of the tables and of the JSON."""
    stems = [_decoded(p.stem) for p in files]
    repeated = {stem for stem in stems if stems.count(stem) > 1}
    if not repeated:
        return stems
    clashing = [p.resolve() for p, stem in zip(files, stems, strict=True) if stem in repeated]
    base = Path(os.path.commonpath([str(p.parent) for p in clashing]))
    paths = [
        _decoded(p.resolve().relative_to(base).with_suffix("").as_posix()) if stem in repeated else stem
        for p, stem in zip(files, stems, strict=True)
    ]
    # Paths can read the same as shown too (both of the files above in one folder): the later
    # ones are numbered.
    names: list[str] = []
    for path in paths:
        name, n = path, 1
        while name in names:
            n += 1
            name = f"{path} ({n})"
        names.append(name)
    return names


def _decoded(name: str) -> str:
    """``name`` with each byte of the file name that is not UTF-8 (a lone surrogate, as Python
    reads it) written ``\\xff``: the JSON and the page are UTF-8, which cannot hold a lone
    surrogate, and the table shows the byte the file name has."""
    return os.fsencode(name).decode("utf-8", "backslashreplace")


def _json_files(folder: Path) -> list[Path]:
    """The regular ``*.json`` files below ``folder``, sorted (a FIFO would wait for a writer
    that never comes; links to folders are not followed, as ``Path.rglob`` did not). A folder
    that cannot be listed is a usage error naming it: ``Path.rglob`` skipped it without a word,
    and its transcripts were missing from every total."""

    def refuse(exc: OSError) -> None:
        raise UsageError(f"{exc.filename or folder}: cannot read: {exc.strerror}")

    found: list[Path] = []
    for root, _dirs, names in os.walk(folder, onerror=refuse):
        found.extend(Path(root, name) for name in names if name.endswith(".json"))
    return sorted(p for p in found if p.is_file())


def load_transcripts(
    inputs: Sequence[str | Path],
) -> tuple[list[tuple[str, Path, list[dict[str, Any]], list[dict[str, Any]]]], list[str]]:
    """The transcripts named by ``inputs`` (files, or folders read for ``*.json``), sorted by
    name, and a note for every JSON file that is not a transcript. Each file is read as
    ``ctxrules run`` reads its input (size, NaN, nesting and digit limits; a damaged one is a
    usage error naming it), and a file named twice is replayed once."""
    files: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            files.extend(_json_files(path))
        elif path.exists():
            # Named on the command line: a pipe (`<(zcat t.json.gz)`, /dev/fd/N) is read as
            # `run --input` reads one; read_json refuses a device as not a regular file.
            files.append(path)
        else:
            raise UsageError(f"{item}: no such file or folder")
    notes = []
    unique: dict[Path, Path] = {}
    for path in files:
        if path.resolve() in unique:
            notes.append(f"{path}: named more than once, replayed once")
        else:
            unique[path.resolve()] = path
    found: list[tuple[Path, tuple[list[dict[str, Any]], list[dict[str, Any]]]]] = []
    for path in unique.values():
        transcript = _messages_of(read_json(str(path)), path)
        if transcript is None:
            notes.append(f'{path}: skipped, not a transcript (a JSON list of chat messages, or {{"messages": [...]}})')
            continue
        found.append((path, transcript))
    if not found:
        raise UsageError("no transcript among the inputs" + (f": {'; '.join(notes)}" if notes else ""))
    names = _names([path for path, _ in found])
    out = [(name, path, msgs, tools) for name, (path, (msgs, tools)) in zip(names, found, strict=True)]
    return out, notes


_ORPHAN_POLL_S = 0.5
# The progress queue of a worker process, given once when the process starts (a queue cannot be
# an argument of each task).
_events: Any = None
# Whether this worker is in a task (which may have a session folder to remove).
_replaying = False


def _started(events: Any, parent: int) -> None:
    global _events
    _events = events
    # Ctrl-C on a terminal reaches the whole process group: the parent alone decides, and ends
    # the workers with SIGTERM, which unwinds a replay like an exception, so its session folder
    # (in /dev/shm: memory until the next boot) is removed rather than left behind.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _unwind)
    # The parent's pid comes from the parent: one killed while this worker was still starting
    # has already left it to another parent, and os.getppid() here would name that one.
    helper_thread(_end_with, "ctxrules-eval-orphan", args=(parent,)).start()


def _unwind(signum: int, frame: object) -> None:
    """SIGTERM (eval ending its workers): a replay under way unwinds like an exception, so that
    its session folder is removed, and :func:`_worker` then ends the process; between tasks
    the process ends at once. Never through multiprocessing's exit handlers: an exception
    raised in one of them (a second SIGTERM, the pool's own to the workers left when it finds
    one gone) skipped the handler that ends the progress queue's thread, and the worker then
    waited for that thread forever."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if not _replaying:
        os._exit(128 + signum)
    raise SystemExit(128 + signum)


_ORPHAN_GRACE_S = 10.0


def _end_with(parent: int) -> None:
    """End this worker once ``parent`` (the ``eval`` process) is gone. Killed outright (SIGKILL),
    it left its workers waiting for tasks forever, holding its standard error open: a pipe
    reading it never ended either. A replay under way gets SIGTERM first, so that it removes
    its session folder, and the exit follows once it has unwound (the pool's loop, which
    survives an exception in a task, would wait for the next one)."""
    while os.getppid() == parent:
        time.sleep(_ORPHAN_POLL_S)
    if _replaying:  # (between tasks there is nothing to remove)
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + _ORPHAN_GRACE_S
        while _replaying and time.monotonic() < deadline:
            time.sleep(0.05)
    os._exit(1)


def _worker(task: Task) -> TaskResult:
    global _replaying

    def progress(transcript: str, plan: str, turn: int, total: int) -> None:
        _events.put((transcript, plan, turn, total))

    _replaying = True
    try:
        return replay(task, progress)
    except SystemExit as stop:  # SIGTERM, and the replay has unwound (see _unwind)
        os._exit(stop.code if isinstance(stop.code, int) else 1)
    finally:
        _replaying = False


def workers(jobs: int, tasks: int) -> int:
    """How many worker processes ``jobs`` asked for become: never more than the tasks, nor than
    the CPUs (each worker imports ctxrules and a tokenizer, ~100 MB: ``--jobs 1000`` over a
    folder of a thousand transcripts would start a thousand of them)."""
    return max(1, min(jobs, tasks, os.cpu_count() or 1))


def run_tasks(tasks: Sequence[Task], *, jobs: int = 1, progress: Progress | None = None) -> list[TaskResult]:
    """Every task's result, in the order of ``tasks``, with :func:`workers` processes."""
    jobs = workers(jobs, len(tasks))
    remove_abandoned()  # the replay folders of runs killed outright (ctxrules.eval.scratch)
    if jobs <= 1 or len(tasks) <= 1:
        return [replay(task, progress) for task in tasks]
    context = multiprocessing.get_context("spawn")
    # A plain queue each worker gets when it starts, not a manager's: a manager is one more
    # process, and a worker whose manager died printed a traceback of its own.
    events = context.Queue()
    stop = threading.Event()

    def forward() -> None:
        while not stop.is_set():
            try:
                event = events.get(timeout=0.1)
            except queue.Empty:
                continue
            if progress is not None:
                progress(*event)

    reader = helper_thread(forward, "ctxrules-eval-reader")
    reader.start()
    try:
        with ProcessPoolExecutor(
            max_workers=jobs, mp_context=context, initializer=_started, initargs=(events, os.getpid())
        ) as pool:
            try:
                # Longest transcripts first keeps the workers busy to the end.
                order = sorted(range(len(tasks)), key=lambda i: -len(tasks[i].messages))
                futures = {i: pool.submit(_worker, tasks[i]) for i in order}
                results = [futures[i].result() for i in range(len(tasks))]
            except BaseException:
                _stop_workers(pool)
                raise
    except BrokenProcessPool:
        # A worker killed (SIGKILL, the out-of-memory killer) takes its pair's figures with it:
        # totals without them would compare the plans on different transcripts.
        raise CtxrulesError(
            "a worker process ended without its result (killed, or out of memory); "
            "nothing was written: run again, or with fewer --jobs"
        ) from None
    finally:
        stop.set()
        reader.join()
        events.close()
    return results


_STOP_GRACE_S = 10.0


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Stopped (Ctrl-C, SIGTERM) or failed: end the workers now. Leaving the pool's block waits
    for every replay under way (minutes of a long transcript) after the user asked to stop; a
    SIGTERM each unwinds them (their session folders removed), and what is still running after
    a grace is killed. The pool's own queues are then released as the process exits (killed by
    the signal instead, eval left multiprocessing's "leaked semaphore" warning)."""
    # The pool's pid -> process map (Python 3.14 has terminate_workers()); read before the
    # shutdown, which drops it.
    workers = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in workers:
        process.terminate()
    deadline = time.monotonic() + _STOP_GRACE_S
    for process in workers:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()


def plans_from(
    packs: Sequence[str], baselines: Sequence[str], name_of: Callable[[str], str] = lambda ref: ref
) -> list[Plan]:
    """The plans of a run: each pack, then each baseline."""
    plans = [Plan(name_of(ref), "pack", ref) for ref in packs]
    plans.extend(Plan(b, b) for b in baselines)
    names = [p.name for p in plans]
    if len(set(names)) != len(names):
        raise UsageError(f"the same pack or baseline is named twice: {', '.join(names)}")
    return plans
