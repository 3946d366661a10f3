"""A finding with a stable code and a position, the hint for a misspelled name, and the
reporter the checks add findings through.

A leaf module (only ``packs.source`` for positions): the pack loader, the validators, the
compressor checks and the plugin manager all report through it without importing each other.
The table of codes is ``ctxrules.validation.diagnostics.CODES``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol

from ctxrules.packs.source import Origin, SourceDoc

Severity = Literal["error", "warning", "note"]


@dataclass(frozen=True)
class Diagnostic:
    """One finding, positioned in a file (1-based line and column) and by JSON pointer."""

    code: str
    severity: Severity
    message: str
    file: str
    line: int = 1
    col: int = 1
    pointer: str = ""
    hint: str | None = None
    related: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["related"] = list(self.related)
        return out

    @property
    def sort_key(self) -> tuple[str, int, int, str]:
        return (self.file, self.line, self.col, self.code)


def did_you_mean(word: str, choices: Collection[str]) -> str | None:
    """A 'did you mean …' hint, or None when nothing is close."""
    import difflib  # only when a name is wrong

    close = difflib.get_close_matches(word, sorted(choices), n=3, cutoff=0.6)
    if not close:
        return None
    return "did you mean " + " or ".join(f"'{c}'" for c in close) + "?"


class PackView(Protocol):
    """What a reporter needs of a resolved pack: its files and where each value was written."""

    @property
    def files(self) -> list[str]: ...

    @property
    def docs(self) -> Mapping[str, SourceDoc]: ...

    def origins(self) -> Mapping[str, Origin]: ...


class Reporter:
    """Collects the diagnostics of one resolved pack, each positioned at the value it is about
    (the nearest written ancestor of ``pointer`` when the value itself came from a default)."""

    def __init__(self, pack: PackView) -> None:
        self.pack = pack
        self.origins = pack.origins()
        self.out: list[Diagnostic] = []
        self.schema_ok = True  # False when a file of the pack breaks the schema

    def origin(self, pointer: str) -> Origin:
        p = pointer
        while p not in self.origins and p:
            p = p.rsplit("/", 1)[0]
        found: Origin = self.origins.get(p, Origin(self.pack.files[-1] if self.pack.files else "<pack>", 1, 1))
        return found

    def file_pointer(self, pointer: str) -> str:
        """``pointer`` (into the merged pack) as a pointer into the document of the file that
        wrote it: the nearest value that has an origin, in that file's numbering, plus the rest
        of the path (a key the file leaves to its default)."""
        p = pointer
        while p not in self.origins and p:
            p = p.rsplit("/", 1)[0]
        o: Origin | None = self.origins.get(p)
        if o is None or (not o.pointer and p):
            return pointer
        return o.pointer + pointer[len(p) :]

    def add(
        self,
        code: str,
        message: str,
        pointer: str,
        hint: str | None = None,
        severity: Severity = "error",
        *,
        at_key: bool = False,
    ) -> None:
        """A diagnostic at ``pointer``'s value (``at_key``: at its key, for an unknown option),
        with the pointer into the document of the file that wrote it."""
        o = self.origin(pointer)
        doc = self.pack.docs.get(o.file) if at_key and pointer in self.origins else None
        if doc is not None and o.pointer:
            o = doc.key_origin(o.pointer)
        self.out.append(Diagnostic(code, severity, message, o.file, o.line, o.col, self.file_pointer(pointer), hint))
