"""Collect transcripts, replay every (transcript, plan) pair, in worker processes if asked."""

from __future__ import annotations

import json
import multiprocessing
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from ctxrules.errors import UsageError
from ctxrules.eval.replay import Plan, Progress, Task, TaskResult, replay

__all__ = ["load_transcripts", "run_tasks"]

_MAX_TRANSCRIPT_BYTES = 256 * 1024 * 1024


def _messages_of(data: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
    """``(messages, tools)`` of a transcript file's JSON, or None when it is not one."""
    if isinstance(data, list) and all(isinstance(m, dict) and "role" in m for m in data) and data:
        return list(data), []
    if isinstance(data, dict) and isinstance(data.get("messages"), list):
        tools = data.get("tools") if isinstance(data.get("tools"), list) else []
        return _anthropic_or_openai(data, list(data["messages"]), list(tools or []))
    return None


def _anthropic_or_openai(
    body: dict[str, Any], messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    # An Anthropic request body is decoded by the codec when this ctxrules has one.
    import importlib

    try:
        formats = importlib.import_module("ctxrules.formats")
    except ImportError:
        return messages, tools
    detect = getattr(formats, "detect_format", None)
    decode = getattr(formats, "decode_request", None)
    if detect is None or decode is None or detect(body) != "anthropic":
        return messages, tools
    decoded = decode(body)
    return list(decoded.messages), list(decoded.tools)


def load_transcripts(
    inputs: Sequence[str | Path],
) -> tuple[list[tuple[str, Path, list[dict[str, Any]], list[dict[str, Any]]]], list[str]]:
    """The transcripts named by ``inputs`` (files, or folders read for ``*.json``), sorted by
    name, and a note for every JSON file that is not a transcript."""
    files: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            files.extend(sorted(p for p in path.rglob("*.json") if p.is_file()))
        elif path.is_file():
            files.append(path)
        else:
            raise UsageError(f"{item}: no such file or folder")
    out = []
    notes = []
    for path in files:
        if path.stat().st_size > _MAX_TRANSCRIPT_BYTES:
            raise UsageError(f"{path}: larger than {_MAX_TRANSCRIPT_BYTES // 2**20} MB")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as exc:
            raise UsageError(f"{path}: not a JSON transcript ({type(exc).__name__}: {exc})") from None
        found = _messages_of(data)
        if found is None:
            notes.append(f'{path}: skipped, not a transcript (a JSON list of chat messages, or {{"messages": [...]}})')
            continue
        out.append((path.stem, path, found[0], found[1]))
    if not out:
        raise UsageError("no transcript among the inputs" + (f": {'; '.join(notes)}" if notes else ""))
    return out, notes


def _worker(task: Task, events: Any) -> TaskResult:
    def progress(transcript: str, plan: str, turn: int, total: int) -> None:
        events.put((transcript, plan, turn, total))

    return replay(task, progress)


def run_tasks(tasks: Sequence[Task], *, jobs: int = 1, progress: Progress | None = None) -> list[TaskResult]:
    """Every task's result, in the order of ``tasks``."""
    if jobs <= 1 or len(tasks) <= 1:
        return [replay(task, progress) for task in tasks]
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        events = manager.Queue()
        stop = threading.Event()

        def forward() -> None:
            while not stop.is_set():
                try:
                    event = events.get(timeout=0.1)
                except queue.Empty:
                    continue
                if progress is not None:
                    progress(*event)

        reader = threading.Thread(target=forward, daemon=True)
        reader.start()
        try:
            with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
                # Longest transcripts first keeps the workers busy to the end.
                order = sorted(range(len(tasks)), key=lambda i: -len(tasks[i].messages))
                futures = {i: pool.submit(_worker, tasks[i], events) for i in order}
                results = [futures[i].result() for i in range(len(tasks))]
        finally:
            stop.set()
            reader.join()
    return results


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
