"""The file tracker: which files the agent changed, for ``reread.recent_files``.

Two sources feed it:

- the caller: ``session.touch(*paths)`` (Python) or ``ctxrules run --touched FILE...`` (CLI)
  records paths in ``<session>/touched.json`` (atomic writes, mode 0600, a ``ctxrules.locks`` lock on
  ``<session>/.tracker.lock`` for writers). Paths are stored absolute (``~`` expanded, relative
  paths taken from the current directory) and may name files that do not exist yet;
- the history: :func:`edited_paths` reads the file paths of tool calls whose tool has the
  ``file_edit`` role (``tools.roles``): the ``file_path``/``path``/``filename``/
  ``notebook_path``/``target_file`` argument, the files an ``apply_patch`` patch adds or
  updates, and not the ``view`` command of an editor tool such as ``str_replace_editor``.
"""

from __future__ import annotations

import builtins
import json
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctxrules.errors import CtxrulesError, StoreError
from ctxrules.toolroles import call_arguments, call_name, tool_roles

if TYPE_CHECKING:
    from ctxrules.stores.base import Store

__all__ = ["TRACKER_FILE", "FileTracker", "TrackedFile", "TrackerError", "edited_paths", "load_tracked"]

TRACKER_FILE = "touched.json"
LOCK_FILE = ".tracker.lock"
MAX_TRACKED = 500
PATH_ARGS: tuple[str, ...] = ("file_path", "path", "filename", "notebook_path", "target_file", "file")
READ_ONLY_COMMANDS = frozenset({"view", "read", "cat", "show", "list"})
_PATCH_FILE = re.compile(r"^\*\*\* (?:Update|Add) File: (.+?)\s*$", re.MULTILINE)
_PATCH_MOVE = re.compile(r"^\*\*\* Move to: (.+?)\s*$", re.MULTILINE)


class TrackerError(CtxrulesError):
    """Bad input to ``touch``, or a tracker file that cannot be used."""


@dataclass(frozen=True)
class TrackedFile:
    """A path the caller touched, with when (seconds since the epoch) and in which order."""

    path: str
    touched: float
    seq: int


def _absolute(path: object) -> str:
    if not isinstance(path, str | os.PathLike):
        raise TrackerError(f"a touched path must be a string or a path, got {type(path).__name__}")
    text = os.fspath(path)
    if not isinstance(text, str) or not text.strip():
        raise TrackerError("a touched path must not be empty")
    if "\x00" in text:
        raise TrackerError(f"a touched path must not contain NUL bytes: {text!r}")
    return os.path.abspath(os.path.expanduser(text))


def _parse(raw: bytes, path: object) -> list[TrackedFile]:
    try:
        data = json.loads(raw)
        return [TrackedFile(str(item["path"]), float(item["touched"]), int(item["seq"])) for item in data["files"]]
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise TrackerError(f"the tracker file {path} is malformed ({exc}); fix or delete it") from exc


def load_tracked(
    session_dir: Path | None = None, *, store: Store | None = None, session: str | None = None
) -> list[TrackedFile]:
    """Touched files of a session (a directory, or ``session`` in ``store``), most recently
    touched first."""
    from ctxrules.stores import store_and_session  # (the store package: where a session is opened)

    store, session = store_and_session(session_dir, store, session)
    where = store.doc_location(session, "touched")
    try:
        raw = store.read_doc(session, "touched")
    except (OSError, StoreError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise TrackerError(f"cannot read the tracker file {where}: {why}") from exc
    if raw is None:
        return []
    return sorted(_parse(raw, where), key=lambda f: f.seq, reverse=True)


class FileTracker:
    """The touched files of one session (a directory, or ``session`` in ``store``)."""

    def __init__(
        self,
        session_dir: Path | None = None,
        *,
        clock: Callable[[], float] = time.time,
        store: Store | None = None,
        session: str | None = None,
    ) -> None:
        from ctxrules.stores import store_and_session  # (the store package: where a session is opened)

        self.store, self.session = store_and_session(session_dir, store, session)
        self._clock = clock

    @property
    def path(self) -> Path:
        return Path(self.session)

    def __repr__(self) -> str:
        return f"FileTracker({self.session!r})"

    def touch(self, *paths: str | os.PathLike[str]) -> list[str]:
        """Record that ``paths`` changed (now); returns them as stored (absolute)."""
        absolute = [_absolute(p) for p in paths]
        if not absolute:
            return []

        def change(files: builtins.list[TrackedFile]) -> builtins.list[TrackedFile]:
            by_path = {f.path: f for f in files}
            seq = max((f.seq for f in files), default=0)
            now = self._clock()
            for p in absolute:
                seq += 1
                by_path[p] = TrackedFile(p, now, seq)
            return sorted(by_path.values(), key=lambda f: f.seq, reverse=True)[:MAX_TRACKED]

        self._change(change)
        return absolute

    def list(self) -> builtins.list[TrackedFile]:
        """Touched files, most recently touched first."""
        return load_tracked(store=self.store, session=self.session)

    def forget(self, *paths: str | os.PathLike[str]) -> int:
        """Stop tracking ``paths``; returns how many were tracked."""
        gone = {_absolute(p) for p in paths}
        before: builtins.list[int] = []

        def change(files: builtins.list[TrackedFile]) -> builtins.list[TrackedFile]:
            before.append(len(files))
            return [f for f in files if f.path not in gone]

        after = self._change(change)
        return before[0] - after

    def _change(self, change: Callable[[builtins.list[TrackedFile]], Sequence[TrackedFile]]) -> int:
        """Rewrite the tracked files as ``change(files)`` under the document's lock; returns how
        many are kept."""
        where = self.store.doc_location(self.session, "touched")
        kept: builtins.list[int] = []

        def update(raw: bytes | None) -> bytes:
            files = sorted(_parse(raw, where), key=lambda f: f.seq, reverse=True) if raw is not None else []
            new = change(files)
            kept.append(len(new))
            data = {"version": 1, "files": [{"path": f.path, "touched": f.touched, "seq": f.seq} for f in new]}
            return json.dumps(data, ensure_ascii=False, indent=1).encode("utf-8")

        try:
            self.store.update_doc(self.session, "touched", update)
        except OSError as exc:
            raise TrackerError(f"cannot write the tracker file: {exc.strerror}") from exc
        except StoreError as exc:
            raise TrackerError(str(exc)) from exc
        return kept[0]


def edited_paths(messages: Sequence[Mapping[str, Any]], pack: Mapping[str, Any]) -> list[str]:
    """Paths (as written in the calls) that ``file_edit`` tool calls in ``messages`` changed,
    oldest mention first, each once (at its latest mention)."""
    roles = tool_roles(pack)
    order: dict[str, None] = {}
    for msg in messages:
        if msg.get("role") != "assistant":
            continue
        for call in msg.get("tool_calls") or []:
            if not isinstance(call, Mapping) or roles.role_of(call_name(call)) != "file_edit":
                continue
            for path in _call_paths(call):
                order.pop(path, None)
                order[path] = None
    return list(order)


def _call_paths(call: Mapping[str, Any]) -> list[str]:
    args = call_arguments(call)
    command = args.get("command")
    if isinstance(command, str) and command.strip().lower() in READ_ONLY_COMMANDS:
        return []
    found = [value for key in PATH_ARGS if isinstance(value := args.get(key), str) and value.strip()]
    if found:
        return found[:1]
    patch = next((v for k in ("input", "patch", "diff") if isinstance(v := args.get(k), str)), None)
    if patch is None:
        fn = call.get("function")
        raw = fn.get("arguments") if isinstance(fn, Mapping) else None
        patch = raw if isinstance(raw, str) else None
    if patch is None:
        return []
    return [*_PATCH_FILE.findall(patch), *_PATCH_MOVE.findall(patch)]
