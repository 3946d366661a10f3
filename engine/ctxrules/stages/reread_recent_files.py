"""``reread.recent_files``: after a compaction, the current content of recently changed files.

When a compaction happened earlier in this run (a stage whose type matches ``after`` — by
default ``compress.*`` and ``summarize.*`` — removed or shortened messages; the runner lists
them in ``ctx.compactions``), the agent may have lost the latest state of the files it was
working on, or kept a stale copy. This stage re-reads them from disk and injects them as ONE
marked ``user`` message (kind ``reread``) at the end of the history (before a trailing real
user message).

Which files: those the caller touched (``session.touch(*paths)``, ``ctxrules run --touched``)
and those ``file_edit`` tool calls in the history changed (also inside removed-step
placeholders, read back from the vault), ranked by on-disk modification time, newest first
(ties: latest mention); the top ``top_n`` that exist, are text, and are not larger than
``max_file_bytes`` (only such files count toward ``top_n``). Files from the history must lie
under one of ``roots`` (default: the current directory), so a transcript cannot make ctxrules
read ``~/.ssh``; touched files are the caller's explicit choice and always allowed. Relative
paths are taken from ``base_dir`` (default: the current directory).

Budget: at most ``budget_tokens`` in total, and never enough to lift utilization to
``max_tier`` (default ``full``, so a reread cannot trigger the removal it follows, and the
emergency guarantee holds). A file that does not fit whole is included by its head when at
least ``min_partial_tokens`` remain; a marker points at the vault copy of the whole file.

A file version (path + sha256 of its bytes) is never injected twice: the stage state keeps
what it injected.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctxrules.hookspecs import hookimpl
from ctxrules.messages import mark_injected
from ctxrules.stages.base import Action, Message, StageOutcome, StageType, unchanged
from ctxrules.stages.compress_common import cut_text, is_placeholder, restore_placeholder
from ctxrules.stages.notes_render import insertion_point
from ctxrules.tracker import TrackerError, edited_paths, load_tracked
from ctxrules.types import THRESHOLD_NAMES

if TYPE_CHECKING:
    from ctxrules.pipeline.context import StageContext

KIND = "reread"
_HEADER = (
    "Current content of files changed recently, re-read from disk after the context was "
    "compacted; copies of them earlier in the conversation may be stale."
)
_PER_FILE_OVERHEAD = 40
_MAX_DIGESTS_PER_FILE = 16


@dataclass(frozen=True)
class Candidate:
    path: str
    mtime: float
    mention: int
    touched: bool


class Reread:
    """The configured stage; see the module docstring."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.top_n = int(options.get("top_n", 5))
        self.budget_tokens = int(options.get("budget_tokens", 50_000))
        self.max_tier = str(options.get("max_tier", "full"))
        self.after = tuple(options.get("after", ("compress.*", "summarize.*")))
        self.base_dir = options.get("base_dir")
        self.roots = tuple(options.get("roots", ()))
        self.max_file_bytes = int(options.get("max_file_bytes", 1_000_000))
        self.min_partial_tokens = int(options.get("min_partial_tokens", 1000))

    def __call__(self, messages: Sequence[dict[str, Any]], ctx: StageContext) -> StageOutcome:
        compactions = [c for c in ctx.compactions if any(fnmatchcase(c, g) for g in self.after)]
        if not compactions:
            return StageOutcome(messages=unchanged(messages))
        warnings: list[str] = []
        try:
            candidates = self._candidates(messages, ctx)
        except TrackerError as exc:
            return StageOutcome(messages=unchanged(messages), warnings=[str(exc)])
        room = min(self.budget_tokens, ctx.budget.tokens_at(self.max_tier) - ctx.count(messages))
        seen: dict[str, list[str]] = ctx.state.setdefault("injected", {})
        blocks: list[str] = []
        files_meta: list[dict[str, Any]] = []
        stored: list[str] = []
        actions: list[Action] = []
        considered = 0
        for cand in candidates:
            if considered >= self.top_n:
                break
            data = self._read(cand.path)
            if data is None:
                continue  # binary, too large or unreadable: not a file to re-read
            considered += 1
            digest = hashlib.sha256(data).hexdigest()
            if digest in seen.get(cand.path, []):
                actions.append(Action("skip", f"{cand.path}: this version was re-read before"))
                continue
            text = data.decode("utf-8")
            tokens = ctx.counter.count_text(text) + _PER_FILE_OVERHEAD
            body, partial = text, False
            if tokens > room:
                if room < self.min_partial_tokens:
                    actions.append(
                        Action("skip", f"{cand.path}: {tokens} tokens, {max(room, 0)} left in the reread budget")
                    )
                    continue
                cut = cut_text(
                    text,
                    room - _PER_FILE_OVERHEAD - 60,
                    0,
                    max(1.0, len(text) / max(1, tokens)),
                    ctx.counter.count_text,
                )
                if cut is None:
                    continue
                body, partial = cut.new, True
                stored.append(cut.stored)
                tokens = ctx.counter.count_text(body) + _PER_FILE_OVERHEAD
            room -= tokens
            blocks.append(_file_block(cand.path, digest, body, partial))
            files_meta.append({"path": cand.path, "sha256": digest, "partial": partial})
            seen[cand.path] = [*seen.get(cand.path, []), digest][-_MAX_DIGESTS_PER_FILE:]
        if not blocks:
            return StageOutcome(messages=unchanged(messages), actions=actions, warnings=warnings)
        content = _HEADER + "\n\n" + "\n\n".join(blocks)
        msg: Message = mark_injected({"role": "user", "content": content}, KIND, files=len(files_meta))
        vault_ids = [ctx.vault.put_text(s) for s in stored]
        out = list(messages)
        at = insertion_point(out, "end")
        out.insert(at, msg)
        paths = ", ".join(f["path"] for f in files_meta)
        actions.append(
            Action(
                "reread",
                f"{len(files_meta)} file(s) re-read after {', '.join(sorted(set(compactions)))}: {paths}",
                index=at,
                vault_id=vault_ids[0] if vault_ids else None,
            )
        )
        return StageOutcome(messages=out, actions=actions, warnings=warnings)

    # --- candidates ---------------------------------------------------------------------------

    def _candidates(self, messages: Sequence[Mapping[str, Any]], ctx: StageContext) -> list[Candidate]:
        base = Path(self.base_dir).expanduser() if self.base_dir else Path.cwd()
        roots = [Path(r).expanduser() for r in self.roots] or [base]
        roots = [(base / r if not r.is_absolute() else r).resolve() for r in roots]
        mentioned: dict[str, tuple[int, bool]] = {}
        history = list(messages)
        for msg in messages:
            if is_placeholder(msg):
                restored = restore_placeholder(msg, ctx.vault)
                if restored:
                    history.extend(restored)
        for n, raw in enumerate(edited_paths(history, ctx.pack)):
            path = os.path.normpath(base / Path(raw).expanduser())
            if _under(Path(path), roots):
                mentioned[path] = (n, False)
        offset = len(mentioned)
        for n, tracked in enumerate(reversed(load_tracked(store=ctx.vault.store, session=ctx.vault.session))):
            mentioned[tracked.path] = (offset + n, True)
        out: list[Candidate] = []
        for path, (order, touched) in mentioned.items():
            try:
                stat = os.stat(path)
            except OSError:
                continue
            if not os.path.isfile(path) or stat.st_size > self.max_file_bytes:
                continue
            out.append(Candidate(path, stat.st_mtime, order, touched))
        out.sort(key=lambda c: (c.mtime, c.mention), reverse=True)
        return out

    def _read(self, path: str) -> bytes | None:
        try:
            with open(path, "rb") as fh:
                data = fh.read(self.max_file_bytes + 1)
        except OSError:
            return None
        if len(data) > self.max_file_bytes or b"\x00" in data[:8192]:
            return None
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return None
        return data


def _under(path: Path, roots: Sequence[Path]) -> bool:
    try:
        resolved = path.resolve()
    except OSError:
        return False
    return any(resolved == r or r in resolved.parents for r in roots)


def _file_block(path: str, digest: str, body: str, partial: bool) -> str:
    lines = body.count("\n") + (0 if body.endswith("\n") else 1)
    extra = ' partial="true"' if partial else ""
    ending = "" if body.endswith("\n") else "\n"
    return f'<file path="{path}" sha256="{digest[:16]}" lines="{lines}"{extra}>\n{body}{ending}</file>'


STAGE_TYPE = StageType(
    name="reread.recent_files",
    phase="content",
    factory=Reread,
    description="After a compaction, re-injects the current on-disk content of the most "
    "recently changed files as one marked user message, within a token budget.",
    options_schema={
        "type": "object",
        "title": "reread.recent_files options",
        "description": "Which files are re-read after a compaction, and how much they may take.",
        "additionalProperties": False,
        "properties": {
            "top_n": {
                "title": "Files",
                "description": "Re-read at most this many files (the most recently modified).",
                "type": "integer",
                "minimum": 1,
                "default": 5,
            },
            "budget_tokens": {
                "title": "Budget (tokens)",
                "description": "Most tokens all re-read files may take together.",
                "type": "integer",
                "minimum": 1,
                "default": 50000,
            },
            "max_tier": {
                "title": "Ceiling tier",
                "description": "The reread never lifts utilization to this tier (default: full, "
                "so it cannot trigger the removal it follows).",
                "enum": list(THRESHOLD_NAMES),
                "default": "full",
            },
            "after": {
                "title": "Compactions that trigger a reread",
                "description": "Stage type globs; a reread happens when a stage of a matching "
                "type shortened the messages earlier in the same run.",
                "type": "array",
                "items": {"type": "string", "minLength": 1},
                "default": ["compress.*", "summarize.*"],
            },
            "base_dir": {
                "title": "Base directory",
                "description": "Relative paths in tool calls are taken from here (default: the current directory).",
                "type": "string",
                "minLength": 1,
            },
            "roots": {
                "title": "Allowed roots",
                "description": "Files named in the history are re-read only under these "
                "directories (default: the base directory); touched files are "
                "always allowed.",
                "type": "array",
                "items": {"type": "string", "minLength": 1},
            },
            "max_file_bytes": {
                "title": "Largest file (bytes)",
                "description": "Larger files are not re-read.",
                "type": "integer",
                "minimum": 1,
                "default": 1000000,
            },
            "min_partial_tokens": {
                "title": "Smallest partial file (tokens)",
                "description": "A file that does not fit whole is included by its head when at "
                "least this many tokens of the budget remain.",
                "type": "integer",
                "minimum": 1,
                "default": 1000,
            },
        },
    },
)


@hookimpl
def ctxrules_register_stages(register: Callable[[StageType], None]) -> None:
    register(STAGE_TYPE)
