"""Session notes: short facts an agent (or its harness) keeps, persisted in the session
directory and rendered into the context by the ``notes.render`` stage — zero LLM calls, a cheap
alternative to a summary.

API (``session.notes`` is a :class:`SessionNotes`)::

    note = session.notes.add("tests live in tests/unit; run with -x", tags=("testing",))
    session.notes.update(note.id, "tests live in tests/unit and tests/e2e")
    session.notes.remove(note.id)
    session.notes.list()          # [Note(id='n1', text=..., tags=(...), created=..., updated=...)]

Storage: ``<session>/notes.json`` (``{"version": 1, "next": N, "notes": [...]}``), written
atomically with mode 0600. Writers take ``<session>/.notes.lock`` (a ``ctxrules.locks`` lock) so two processes
never lose each other's notes; readers need no lock (the file is replaced atomically). Ids are
given by the caller (letters, digits, ``_.-``; up to 64 characters) or assigned as ``n1``,
``n2``, ... and never reused.
"""

from __future__ import annotations

import builtins
import json
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ctxrules.errors import CtxrulesError, StoreError

if TYPE_CHECKING:
    from ctxrules.stores.base import Store

_R = TypeVar("_R")

__all__ = ["MAX_NOTE_CHARS", "NOTES_FILE", "Note", "NotesError", "SessionNotes", "load_notes"]

NOTES_FILE = "notes.json"
LOCK_FILE = ".notes.lock"
NOTES_VERSION = 1
MAX_NOTE_CHARS = 20_000
"""A note is a fact, not a document: longer text belongs in a file the agent can read."""
MAX_NOTES = 500
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_TAG_RE = re.compile(r"[^\s,][^\n,]{0,39}")


class NotesError(CtxrulesError):
    """A notes call was given bad input, or the notes file cannot be used."""


@dataclass(frozen=True)
class Note:
    """One note. ``created``/``updated`` are seconds since the epoch."""

    id: str
    text: str
    tags: tuple[str, ...] = ()
    created: float = 0.0
    updated: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "text": self.text,
            "tags": list(self.tags),
            "created": self.created,
            "updated": self.updated,
        }


def _check_text(text: object) -> str:
    if not isinstance(text, str):
        raise NotesError(f"a note's text must be a string, got {type(text).__name__}")
    if not text.strip():
        raise NotesError("a note's text must not be empty")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise NotesError(f"a note's text must be valid Unicode text ({exc.reason})") from exc
    if len(text) > MAX_NOTE_CHARS:
        raise NotesError(
            f"a note's text is limited to {MAX_NOTE_CHARS} characters, got "
            f"{len(text)}; keep long material in a file and note its path"
        )
    return text


def _check_tags(tags: object) -> tuple[str, ...]:
    if isinstance(tags, str):
        raise NotesError(f"tags must be a list of strings, not the string {tags!r}")
    if not isinstance(tags, Iterable):
        raise NotesError(f"tags must be a list of strings, got {type(tags).__name__}")
    out: list[str] = []
    for tag in tags:
        if not isinstance(tag, str) or not _TAG_RE.fullmatch(tag):
            raise NotesError(f"invalid tag {tag!r}: 1-40 characters, no comma or line break, not starting with a space")
        if tag not in out:
            out.append(tag)
    return tuple(out)


def _check_id(note_id: object) -> str:
    if not isinstance(note_id, str) or not _ID_RE.fullmatch(note_id):
        raise NotesError(
            f"invalid note id {note_id!r}: letters, digits, '_', '.', '-' (up to 64, starting with a letter or digit)"
        )
    return note_id


def _parse(raw: bytes, path: object) -> tuple[int, list[Note]]:
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # nested past the stack: damage too, as in touched.json
        raise NotesError(f"the notes file {path} is not valid JSON ({exc}); fix or delete it") from exc
    if not isinstance(data, dict) or not isinstance(data.get("notes"), list):
        raise NotesError(f"the notes file {path} has no 'notes' list; fix or delete it")
    notes: list[Note] = []
    for n, item in enumerate(data["notes"]):
        try:
            notes.append(
                Note(
                    _check_id(item["id"]),
                    _check_text(item["text"]),
                    _check_tags(item.get("tags", ())),
                    float(item.get("created", 0)),
                    float(item.get("updated", 0)),
                )
            )
        except (KeyError, TypeError, ValueError, NotesError) as exc:
            raise NotesError(f"the notes file {path}: note {n} is malformed ({exc})") from exc
    next_seq = data.get("next", 1)
    return (next_seq if isinstance(next_seq, int) and next_seq > 0 else 1), notes


def load_notes(
    session_dir: Path | None = None, *, store: Store | None = None, session: str | None = None
) -> list[Note]:
    """The notes of the session directory ``session_dir`` (or of ``session`` in ``store``;
    ``[]`` when it has none)."""
    from ctxrules.stores import store_and_session  # (the store package: where a session is opened)

    store, session = store_and_session(session_dir, store, session)
    try:
        raw = store.read_doc(session, "notes")
    except (OSError, StoreError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise NotesError(f"cannot read the notes file {store.doc_location(session, 'notes')}: {why}") from exc
    if raw is None:
        return []
    return _parse(raw, store.doc_location(session, "notes"))[1]


class SessionNotes:
    """The notes of one session directory; every call reads the file afresh, so notes added
    by another process are seen at once."""

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
        """The session directory (filesystem stores)."""
        return Path(self.session)

    @property
    def file(self) -> str:
        """Where the notes are (a path for the filesystem store)."""
        return self.store.doc_location(self.session, "notes")

    def __repr__(self) -> str:
        return f"SessionNotes({self.file!r})"

    # --- reading ----------------------------------------------------------------------------

    def list(self) -> builtins.list[Note]:
        """Every note, oldest first."""
        return load_notes(store=self.store, session=self.session)

    def get(self, note_id: str) -> Note:
        for note in self.list():
            if note.id == note_id:
                return note
        raise NotesError(f"no note with id {note_id!r}")

    def __iter__(self) -> Iterator[Note]:
        return iter(self.list())

    def __len__(self) -> int:
        return len(self.list())

    # --- writing ----------------------------------------------------------------------------

    def add(self, text: str, *, id: str | None = None, tags: Iterable[str] = ()) -> Note:
        """Add a note; ``id`` defaults to the next free ``n<N>``."""
        text = _check_text(text)
        checked_tags = _check_tags(tags)
        if id is not None:
            _check_id(id)

        def change(next_seq: int, notes: builtins.list[Note]) -> tuple[int, builtins.list[Note], Note]:
            nonlocal id
            if len(notes) >= MAX_NOTES:
                raise NotesError(f"a session holds at most {MAX_NOTES} notes; remove some first")
            taken = {n.id for n in notes}
            if id is None:
                while f"n{next_seq}" in taken:
                    next_seq += 1
                id = f"n{next_seq}"
                next_seq += 1
            elif id in taken:
                raise NotesError(f"a note with id {id!r} exists already; use update()")
            now = self._clock()
            note = Note(id, text, checked_tags, now, now)
            return next_seq, [*notes, note], note

        return self._change(change)

    def update(self, note_id: str, text: str | None = None, *, tags: Iterable[str] | None = None) -> Note:
        """Replace a note's text (and/or its tags); it keeps its place and id."""
        if text is None and tags is None:
            raise NotesError("update() needs a new text or new tags")
        new_text = _check_text(text) if text is not None else None
        new_tags = _check_tags(tags) if tags is not None else None

        def change(next_seq: int, notes: builtins.list[Note]) -> tuple[int, builtins.list[Note], Note]:
            for n, note in enumerate(notes):
                if note.id == note_id:
                    changed = Note(
                        note.id,
                        new_text if new_text is not None else note.text,
                        new_tags if new_tags is not None else note.tags,
                        note.created,
                        self._clock(),
                    )
                    return next_seq, [*notes[:n], changed, *notes[n + 1 :]], changed
            raise NotesError(f"no note with id {note_id!r}")

        return self._change(change)

    def remove(self, note_id: str) -> Note:
        """Delete a note; returns what it held."""

        def change(next_seq: int, notes: builtins.list[Note]) -> tuple[int, builtins.list[Note], Note]:
            for n, note in enumerate(notes):
                if note.id == note_id:
                    return next_seq, [*notes[:n], *notes[n + 1 :]], note
            raise NotesError(f"no note with id {note_id!r}")

        return self._change(change)

    def clear(self) -> int:
        """Delete every note; returns how many there were."""
        return self._change(lambda next_seq, notes: (next_seq, [], len(notes)))

    def _change(self, change: Callable[[int, builtins.list[Note]], tuple[int, builtins.list[Note], _R]]) -> _R:
        """Apply ``change(next, notes) -> (next, notes, result)`` under the document's lock (two
        processes never lose each other's notes); returns ``result``."""
        out: list[_R] = []

        def update(raw: bytes | None) -> bytes:
            next_seq, notes = _parse(raw, self.file) if raw is not None else (1, [])
            next_seq, notes, result = change(next_seq, notes)
            out.append(result)
            data = {"version": NOTES_VERSION, "next": next_seq, "notes": [n.as_dict() for n in notes]}
            return json.dumps(data, ensure_ascii=False, indent=1).encode("utf-8")

        try:
            self.store.update_doc(self.session, "notes", update)
        except OSError as exc:
            raise NotesError(f"cannot write the notes file {self.file}: {exc.strerror}") from exc
        except StoreError as exc:
            raise NotesError(str(exc)) from exc
        return out[0]
