"""Load a pack: read each file once, resolve ``extends`` depth-first, merge, keep origins.

Each file is checked against the pack schema as it is read; the semantic checks of the
resolved pack, and ``load_pack``, are in ``ctxrules.packs.validated``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from ctxrules.diagnostics import Diagnostic, did_you_mean
from ctxrules.packs.confine import HINT as CONFINE_HINT
from ctxrules.packs.confine import MAX_PACK_BYTES, FileRefused, OutsideRoots, check_inside, make_roots, read_limited
from ctxrules.packs.merge import ID_LISTS, MergeProblem, drop_disabled, merge_packs
from ctxrules.packs.semver import RangeError, is_semver, parse_range
from ctxrules.packs.source import Origin, SourceDoc, YamlProblem, parse_yaml
from ctxrules.packs.tree import OList, OMap, OriginIndex, annotate, plain
from ctxrules.resources import rules_dir
from ctxrules.validation.schema import check_document

BUILTIN_PREFIX = "builtin:"
_BUILTIN_REF = re.compile(r"^builtin:(?P<name>[A-Za-z0-9_][A-Za-z0-9_./-]*?)(?:@(?P<range>.+))?$")


@dataclass
class ResolvedPack:
    """A pack with its parents applied: plain ``data``, the origin-carrying ``tree``, the files
    read (in application order) and every diagnostic met on the way."""

    name: str
    data: dict[str, Any]
    tree: OMap
    files: list[str]
    diagnostics: list[Diagnostic] = field(default_factory=list)
    disabled: dict[str, list[str]] = field(default_factory=dict)
    docs: dict[str, SourceDoc] = field(default_factory=dict)
    real_paths: dict[str, Path] = field(default_factory=dict)
    roots: tuple[Path, ...] = ()
    """Folders the pack may read from (:mod:`ctxrules.packs.confine`)."""
    search_path: tuple[str, ...] = ()
    """The extra roots the caller gave (kept to reload the pack the same way)."""
    # Where each disabled item was switched off: list key -> id -> the origin of the item (in
    # the file that wrote ``enabled: false``, with that file's own pointer).
    disabled_at: dict[str, dict[str, Origin]] = field(default_factory=dict)
    _origins: OriginIndex | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return not any(d.severity == "error" for d in self.diagnostics)

    def origins(self) -> Mapping[str, Origin]:
        """Where each value of the merged pack was written, by JSON pointer (read-only: the
        tree does not change once resolved; the validator, the prompt checks and the test
        runner each ask for it). Each pointer is looked up in the tree when first asked for
        (:class:`~ctxrules.packs.tree.OriginIndex`)."""
        if self._origins is None:
            self._origins = OriginIndex(self.tree)
        return self._origins

    def base_dir(self) -> Path:
        return Path(self.files[-1]).parent if self.files else Path.cwd()


def builtin_path(name: str) -> Path:
    return rules_dir() / f"{name}.yaml"


def builtin_names() -> list[str]:
    root = rules_dir()
    return sorted(p.relative_to(root).with_suffix("").as_posix() for p in root.rglob("*.yaml"))


def display_path(path: Path) -> str:
    """Paths in diagnostics: relative to the working directory when below it, else absolute;
    built-in packs as ``builtin:NAME`` (the wheel's location means nothing to a user)."""
    # Each resolve() is a system call per path component: once each here.
    real, cwd = path.resolve(), Path.cwd().resolve()
    try:
        rel = real.relative_to(_real_rules_dir())
        if cwd not in real.parents:
            return BUILTIN_PREFIX + rel.with_suffix("").as_posix()
    except ValueError:
        pass
    try:
        return real.relative_to(cwd).as_posix()
    except ValueError:
        return str(path)


@cache
def _real_rules_dir() -> Path:
    return rules_dir().resolve()  # the package's own folder: it does not move while we run


class PackLoader:
    """Reads packs and caches parsed files; one loader resolves one or many packs."""

    def __init__(self, search_path: Sequence[str | os.PathLike[str]] = ()) -> None:
        self._docs: dict[Path, SourceDoc | None] = {}
        self._doc_problems: dict[Path, list[Diagnostic]] = {}
        self._layers: dict[Path, OMap] = {}
        self.search_path = tuple(str(p) for p in search_path)
        self._roots: tuple[Path, ...] = ()
        self._shown: dict[tuple[Path, str], str] = {}
        # What the checks of one run (``ctxrules validate``) found about a value they meet in
        # several packs, such as a path a fragment names (see validation.validate).
        self.verdicts: dict[Any, Any] = {}

    @property
    def fresh(self) -> bool:
        """Nothing read yet (a cached resolution of the same files may stand in for it)."""
        return not self._docs

    def display_path(self, path: Path) -> str:
        """:func:`display_path`, once per path and working directory for this loader: a pack
        and the dozen fragments it extends name each file several times while resolving."""
        key = (path, os.getcwd())
        shown = self._shown.get(key)
        if shown is None:
            shown = self._shown[key] = display_path(path)
        return shown

    # -- reading -----------------------------------------------------------------------
    def read(self, path: Path) -> tuple[SourceDoc | None, list[Diagnostic]]:
        path = path.resolve()
        if path not in self._docs:
            self._docs[path], self._doc_problems[path] = self._read(path)
        return self._docs[path], self._doc_problems[path]

    def _read(self, path: Path) -> tuple[SourceDoc | None, list[Diagnostic]]:
        shown = self.display_path(path)
        try:
            raw = read_limited(path, what="the pack file")
        except FileRefused as exc:
            return None, [
                Diagnostic(
                    "CR101",
                    "error",
                    f"not read: {exc}",
                    shown,
                    1,
                    1,
                    "",
                    f"a pack is a regular YAML file of at most {MAX_PACK_BYTES:,} bytes",
                )
            ]
        except OSError as exc:
            return None, [Diagnostic("CR090", "error", f"cannot read: {exc.strerror or exc}", shown)]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = raw[: exc.start].count(b"\n") + 1
            return None, [Diagnostic("CR001", "error", "file is not valid UTF-8", shown, line, 1)]
        try:
            doc = parse_yaml(text, shown)
        except YamlProblem as p:
            return None, [Diagnostic(p.code, "error", p.message, shown, p.line, p.col, p.pointer, p.hint)]
        return doc, check_document(doc)

    def _layer(self, path: Path, doc: SourceDoc) -> OMap:
        """The origin-carrying tree of a file read, once per loader: a fragment is applied in
        its own resolution and in each pack that extends it. Merging copies what it takes from
        a layer and never changes one, so the same layer serves every resolution."""
        layer = self._layers.get(path)
        if layer is None:
            layer = self._layers[path] = annotate(doc)
        return layer

    # -- resolving ---------------------------------------------------------------------
    def resolve(self, ref: str, *, base: Path | None = None, root: Path | None = None) -> ResolvedPack:
        """Resolve ``ref`` (a path or ``builtin:NAME[@range]``) with all its parents.

        What the pack names must lie below ``root`` (default: the folder of ``ref``'s file),
        the loader's ``search_path`` or the built-in packs (:mod:`ctxrules.packs.confine`)."""
        diagnostics: list[Diagnostic] = []
        self._roots = ()  # the caller named ref: it is not confined
        path = self._locate(ref, base or Path.cwd(), None, diagnostics)
        first = root if root is not None else path.parent if path is not None else None
        self._roots = make_roots([first] if first is not None else [], self.search_path)
        order: list[Path] = []
        if path is not None:
            self._linearize(path, [], set(), order, diagnostics)
        tree: OMap | None = None
        problems: list[MergeProblem] = []
        docs: dict[str, SourceDoc] = {}
        for p in order:
            doc, _ = self.read(p)
            if doc is None or not isinstance(doc.data, dict):
                continue
            docs[doc.path] = doc
            layer = self._layer(p, doc)
            tree = merge_packs(tree if tree is not None else OMap(layer.origin), layer, problems, reuse_base=True)
        for mp in problems:
            diagnostics.append(
                Diagnostic(
                    mp.code, "error", mp.message, mp.origin.file, mp.origin.line, mp.origin.col, mp.pointer, mp.hint
                )
            )
        if tree is None:
            tree = OMap(Origin(self.display_path(path) if path else ref, 1, 1))
        tree.drop("extends")
        disabled = _disabled_ids(tree)
        disabled_at = _disabled_origins(tree, docs)
        drop_disabled(tree)
        files = [self.display_path(p) for p in order]
        name = tree.get("metadata", {}).get("name") if isinstance(tree.get("metadata"), dict) else None
        return ResolvedPack(
            str(name or ref),
            plain(tree),
            tree,
            files,
            _dedupe(diagnostics),
            disabled,
            docs,
            {self.display_path(p): p for p in order},
            self._roots,
            self.search_path,
            disabled_at,
        )

    def _locate(
        self, ref: str, base: Path, at: tuple[Origin, str] | None, diagnostics: list[Diagnostic]
    ) -> Path | None:
        def report(code: str, message: str, hint: str | None = None) -> None:
            if at is None:
                diagnostics.append(Diagnostic(code, "error", message, ref, 1, 1, "", hint))
            else:
                o, pointer = at
                diagnostics.append(Diagnostic(code, "error", message, o.file, o.line, o.col, pointer, hint))

        if not isinstance(ref, str):
            return None  # the schema check reports the wrong type (CR011)
        if not ref:
            report("CR030", "extends entry must be a non-empty string")
            return None
        if ref.startswith(BUILTIN_PREFIX):
            m = _BUILTIN_REF.match(ref)
            if not m:
                report("CR030", f"'{ref}' is not a built-in reference (builtin:NAME[@RANGE])")
                return None
            path = builtin_path(m["name"])
            inside = path.resolve().is_relative_to(_real_rules_dir())
            if not inside or not path.is_file():
                report("CR030", f"no built-in pack named '{m['name']}'", did_you_mean(m["name"], builtin_names()))
                return None
            if m["range"]:
                self._check_range(path, m["range"], ref, report)
            return path
        try:
            if self._roots:
                check_inside(self._roots, base, ref, "extends")
            path = (base / ref).resolve()
            found = path.exists() and not path.is_dir()
        except OutsideRoots as exc:
            report("CR100", str(exc), CONFINE_HINT)
            return None
        except (OSError, ValueError) as exc:  # a NUL byte, a name too long for the OS, ...
            report("CR030", f"pack file not found: {ref!r} is not a usable path ({exc})")
            return None
        if not found:
            report("CR030", f"pack file not found: {ref} (looked for {path})")
            return None
        return path

    def _check_range(self, path: Path, text: str, ref: str, report: Any) -> None:
        try:
            rng = parse_range(text)
        except RangeError as exc:
            report("CR022", f"version range in '{ref}' does not parse: {exc}")
            return
        doc, _ = self.read(path)
        version = None
        if doc is not None and isinstance(doc.data, dict) and isinstance(doc.data.get("metadata"), dict):
            version = doc.data["metadata"].get("version")
        if not is_semver(version):
            report("CR032", f"'{ref}' asks for {text} but that pack declares no semantic version")
        elif not rng.contains(str(version)):
            report("CR032", f"'{ref}' asks for {text} but the pack is version {version}")

    def _linearize(
        self, root: Path, stack: list[Path], done: set[Path], order: list[Path], diagnostics: list[Diagnostic]
    ) -> None:
        """Append ``root`` and every pack it extends to ``order``, parents first (depth-first,
        in the order written). The walk keeps its own stack, so a chain or cycle of any length
        is a diagnostic, not a RecursionError."""
        pending: list[tuple[SourceDoc, Iterator[tuple[str, Any]]]] = []

        def enter(path: Path) -> None:
            doc, _ = self.read(path)
            if doc is None or not isinstance(doc.data, dict):
                done.add(path)
                order.append(path)
                return
            stack.append(path)
            pending.append((doc, self._parents(doc)))

        if root not in done:
            enter(root)
        while pending:
            path = stack[-1]
            doc, parents = pending[-1]
            step = next(parents, None)
            if step is None:
                pending.pop()
                stack.pop()
                done.add(path)
                order.append(path)
                continue
            pointer, ref = step
            origin = doc.origin(pointer)
            parent = self._locate(ref, path.parent, (origin, pointer), diagnostics)
            if parent is None or parent in done:
                continue
            if parent in stack:
                cycle = [*stack[stack.index(parent) :], parent]
                shown = [self.display_path(p) for p in cycle]
                if len(shown) > 12:  # a cycle through a thousand files is named by its ends
                    shown = [*shown[:6], f"... {len(shown) - 11} more ...", *shown[-5:]]
                diagnostics.append(
                    Diagnostic(
                        "CR031",
                        "error",
                        f"extends forms a cycle: {' -> '.join(shown)}",
                        origin.file,
                        origin.line,
                        origin.col,
                        pointer,
                    )
                )
                continue
            enter(parent)

    @staticmethod
    def _parents(doc: SourceDoc) -> Iterator[tuple[str, Any]]:
        """``(pointer, reference)`` for each entry of the document's ``extends``."""
        parents = doc.data.get("extends", [])
        if isinstance(parents, str):
            yield "/extends", parents
        elif isinstance(parents, list):
            for i, ref in enumerate(parents):
                yield f"/extends/{i}", ref


def _disabled_ids(tree: OMap) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key in ID_LISTS:
        lst = tree.get(key)
        if isinstance(lst, OList):
            ids = [str(i.get("id")) for i in lst if isinstance(i, dict) and i.get("enabled") is False]
            if ids:
                out[key] = ids
    return out


def _disabled_origins(tree: OMap, docs: dict[str, SourceDoc]) -> dict[str, dict[str, Origin]]:
    """The item that says ``enabled: false``, in the file that says it (the merged item keeps
    the origin of the parent that introduced it)."""
    out: dict[str, dict[str, Origin]] = {}
    for key in ID_LISTS:
        lst = tree.get(key)
        if not isinstance(lst, OList):
            continue
        for item, origin in zip(lst, lst.origins, strict=False):
            if not (isinstance(item, OMap) and item.get("enabled") is False):
                continue
            said = item.origins.get("enabled", origin)
            doc = docs.get(said.file)
            item_pointer = said.pointer.rsplit("/", 1)[0] if said.pointer.endswith("/enabled") else ""
            at = doc.origin(item_pointer) if doc is not None and item_pointer else said
            out.setdefault(key, {})[str(item.get("id"))] = at
    return out


def _dedupe(diags: list[Diagnostic]) -> list[Diagnostic]:
    seen: set[tuple[Any, ...]] = set()
    out = []
    for d in diags:
        k = (d.code, d.file, d.line, d.col, d.message)
        if k not in seen:
            seen.add(k)
            out.append(d)
    return out
