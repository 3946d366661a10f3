"""Load a pack: read each file once, resolve ``extends`` depth-first, merge, keep origins.

Each file is checked against the pack schema as it is read; the semantic checks of the
resolved pack, and ``load_pack``, are in ``ctxrules.packs.validated``.
"""

from __future__ import annotations

import os
import re
import stat
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

from ctxrules.diagnostics import Diagnostic, did_you_mean
from ctxrules.packs.confine import HINT as CONFINE_HINT
from ctxrules.packs.confine import (
    MAX_PACK_BYTES,
    FileRefused,
    OutsideRoots,
    check_inside,
    file_kind,
    make_roots,
    read_limited,
)
from ctxrules.packs.cycles import Components, first_cycles, shown_cycle
from ctxrules.packs.merge import ID_LISTS, MergeProblem, drop_disabled, merge_packs
from ctxrules.packs.semver import RangeError, is_semver, parse_range
from ctxrules.packs.source import Origin, SourceDoc, YamlProblem, parse_yaml
from ctxrules.packs.tree import OList, OMap, OriginIndex, annotate, plain, shallow
from ctxrules.resources import rules_dir
from ctxrules.validation.schema import check_document

BUILTIN_PREFIX = "builtin:"
BUILTIN_REF = re.compile(r"^builtin:(?P<name>[A-Za-z0-9_][A-Za-z0-9_./-]*?)(?:@(?P<range>.+))?$")
"""A built-in pack reference, ``builtin:NAME`` or ``builtin:NAME@RANGE`` (``explain`` reads it too)."""


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
    docs: Mapping[str, SourceDoc] = field(default_factory=dict)
    """The parsed document of each file (that holds a mapping) by its shown name."""
    real_paths: dict[str, Path] = field(default_factory=dict)
    roots: tuple[Path, ...] = ()
    """Folders the pack may read from (:mod:`ctxrules.packs.confine`)."""
    search_path: tuple[str, ...] = ()
    """The extra roots the caller gave (kept to reload the pack the same way)."""
    # Where each disabled item was switched off: list key -> id -> the origin of the item (in
    # the file that wrote ``enabled: false``, with that file's own pointer).
    disabled_at: dict[str, dict[str, Origin]] = field(default_factory=dict)
    merged: bool = True
    """False when the pack's ``extends`` meet a cycle: its files are not merged (where a cycle is
    cut decides what wins; ``data`` and ``docs`` are empty, ``files`` not in an order of
    application, ``real_paths`` the files its diagnostics name), and ``diagnostics`` already
    hold each file's own problems."""
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


def _not_regular(path: Path) -> str | None:
    """What ``path`` is when it is not a regular file (``a FIFO``...), else None."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None  # gone since: reading it says so
    return None if stat.S_ISREG(mode) else file_kind(mode)


class PackLoader:
    """Reads packs and caches parsed files; one loader resolves one or many packs."""

    def __init__(self, search_path: Sequence[str | os.PathLike[str]] = ()) -> None:
        self._docs: dict[Path, SourceDoc | None] = {}
        self._doc_problems: dict[Path, list[Diagnostic]] = {}
        self._layers: dict[Path, OMap] = {}
        # What read() returned for each absolute path asked for (the real one included).
        self._got: dict[Path, tuple[SourceDoc | None, list[Diagnostic]]] = {}
        self._named: dict[str, list[Path]] = {}  # a parsed file's shown name -> its real paths
        self._unread: list[Path] = []  # files that could not be read or parsed, in reading order
        # The resolutions of one set of roots and working directory, by file (see _Walked).
        self._walked: dict[tuple[tuple[Path, ...], str], dict[Path, _Walked]] = {}
        self._graphs: dict[tuple[tuple[Path, ...], str], _Graph] = {}  # the same, for the extends graph
        # The walks whose merged tree is kept for later resolutions, least recently used first,
        # with the _weight of each tree; and what they weigh together, one more for each.
        self._keeps: dict[_Walked, int] = {}
        self._kept = 0
        # What _locate found for each reference, folder and set of roots.
        self._located: dict[
            tuple[str, Path, tuple[Path, ...]], tuple[Path | None, tuple[tuple[str, str, str | None], ...]]
        ] = {}
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
        return self._shown_in(path, os.getcwd())

    def _shown_in(self, path: Path, cwd: str) -> str:
        key = (path, cwd)
        shown = self._shown.get(key)
        if shown is None:
            shown = self._shown[key] = display_path(path)
        return shown

    def paths_of(self, shown: str) -> Sequence[Path]:
        """The real paths of the files read that are shown as ``shown``: those parsed, in
        reading order, else those not read or parsed whose path ends with it."""
        return self._named.get(shown) or [p for p in self._unread if str(p).endswith(shown)]

    # -- reading -----------------------------------------------------------------------
    def read(self, path: Path) -> tuple[SourceDoc | None, list[Diagnostic]]:
        # A pack's files are named again by every pack that extends it: resolve() (a system
        # call per path component) once per absolute path and loader.
        got = self._got.get(path)
        if got is not None:
            return got
        real = path.resolve()
        if real == path:
            real = path  # one object for the file in every table: equal paths compare part by part
        if real not in self._docs:
            self._docs[real], self._doc_problems[real] = self._read(real)
            doc = self._docs[real]
            if doc is None:
                self._unread.append(real)
            else:
                self._named.setdefault(doc.path, []).append(real)
        got = self._docs[real], self._doc_problems[real]
        if path.is_absolute():
            self._got[real] = self._got[path] = got
        return got

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
            return None, [_not_utf8(raw, exc.start, shown)]
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
        cwd = os.getcwd()
        self._roots = ()  # the caller named ref: it is not confined
        path = self._locate(ref, base or Path(cwd), None, diagnostics)
        first = root if root is not None else path.parent if path is not None else None
        self._roots = make_roots([first] if first is not None else [], self.search_path)
        order: list[Path] = []
        heads: list[tuple[int, _Walked]] = []
        if path is not None:
            graph = self._graph(cwd)
            if graph.parts.reaches_cycle[graph.parts.add(path)]:
                return self._resolve_cyclic(ref, path, graph, diagnostics, cwd)
            heads = self._linearize(path, order, diagnostics, self._walked.setdefault((self._roots, cwd), {}), graph)
        tree: OMap | None = None
        problems: list[MergeProblem] = []
        start = 0
        since: tuple[OMap | None, int] = (None, 0)  # the last tree kept, and its weight
        # A walk kept with its merged tree stands for the first files of the order: merge from
        # there (in a folder of packs that extend each other, each file is merged once).
        for end, known in reversed(heads):
            if known.merged is not None:
                weight = self._keeps[known] = self._keeps.pop(known)  # used: the last to be dropped
                kept, merged_problems = known.merged
                tree, problems, start = shallow(kept) if kept is not None else None, list(merged_problems), end
                since = (kept, weight)
                break
        keep = {end: known for end, known in heads if known.merged is None and end > start}
        # The files before ``start`` are merged in the tree kept: only the others are looked at
        # (each walk's ``end`` in ``keep`` is past ``start``).
        for i in range(start, len(order)):
            p = order[i]
            doc, _ = self.read(p)
            if doc is not None and isinstance(doc.data, dict):
                layer = self._layer(p, doc)
                base_tree = tree if tree is not None else OMap(layer.origin)
                tree = merge_packs(base_tree, layer, problems, reuse_base=True)
            if i + 1 in keep:
                since = self._keep(keep[i + 1], tree, problems, since)
        docs = _Docs(order, self.read)
        for mp in problems:
            diagnostics.append(
                Diagnostic(
                    mp.code, "error", mp.message, mp.origin.file, mp.origin.line, mp.origin.col, mp.pointer, mp.hint
                )
            )
        if tree is None:
            tree = OMap(Origin(self._shown_in(path, cwd) if path else ref, 1, 1))
        tree.drop("extends")
        disabled = _disabled_ids(tree)
        disabled_at = _disabled_origins(tree, docs)
        drop_disabled(tree)
        whole = heads[-1][1] if heads and heads[-1][0] == len(order) else None  # the walk of all the files
        files = whole.shown_files() if whole is not None else []
        if len(files) != len(order):  # (no walk of them all: named one by one)
            files = [self._shown_in(p, cwd) for p in order]
        name = tree.get("metadata", {}).get("name") if isinstance(tree.get("metadata"), dict) else None
        return ResolvedPack(
            str(name or ref),
            plain(tree),
            tree,
            files,
            _dedupe(diagnostics),
            disabled,
            docs,
            dict(zip(files, order, strict=True)),
            self._roots,
            self.search_path,
            disabled_at,
        )

    def _graph(self, cwd: str) -> _Graph:
        """The ``extends`` graph of the current roots and working directory (as :meth:`_locate`
        finds each reference, once)."""
        key = (self._roots, cwd)
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._graphs[key] = _Graph(self, cwd)
        return graph

    def _resolve_cyclic(
        self, ref: str, path: Path, graph: _Graph, diagnostics: list[Diagnostic], cwd: str
    ) -> ResolvedPack:
        """A pack whose ``extends`` meet a cycle: CR031 for the cycle its depth-first walk closes
        first in each strongly connected set of files it enters (each set entered at the files
        that lead into it), the problems of every ``extends`` entry and every file it reaches;
        not merged. What each strongly connected set reaches is found once per loader, from what
        the sets it extends reach: a folder of packs in one cycle, or of a chain of packs leading
        into one, is not walked again for each pack."""
        parts = graph.parts
        own = parts.of[path]
        if parts.cyclic[own]:
            diagnostics.append(graph.cycle_at(path))
        reached = graph.reach(own)
        diagnostics.extend(reached.found)
        doc, _ = self.read(path)
        meta = doc.data.get("metadata") if doc is not None and isinstance(doc.data, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        mine = _dedupe(diagnostics)
        # The real path of each file a diagnostic names (for its source lines), and the pack's.
        real_paths = {self._shown_in(path, cwd): path}
        for d in mine:
            if d.file not in real_paths and (named := self.paths_of(d.file)):
                real_paths[d.file] = named[0]
        return ResolvedPack(
            str(name or ref),
            {},
            OMap(Origin(self._shown_in(path, cwd), 1, 1)),
            list(reached.shown),  # not merged: the files are not in an order of application
            mine,
            real_paths=real_paths,
            roots=self._roots,
            search_path=self.search_path,
            merged=False,
        )

    def _keep(
        self, walked: _Walked, tree: OMap | None, problems: list[MergeProblem], since: tuple[OMap | None, int]
    ) -> tuple[OMap | None, int]:
        """Keep the tree merged from ``walked``'s files for the packs that extend its file, and
        return it with its weight (else ``since``: the tree kept last in this resolution, which
        ``tree`` was merged from, and its weight). The tree is shared, not copied (merging never
        changes what it merges from; only the top level of the tree it merges into, here a copy).

        What a loader keeps is bounded by weight: the trees used least recently are dropped to
        make room (a folder of packs that extend each other, resolved in any order, mostly needs
        the tree of the pack resolved just before)."""
        before, before_weight = since
        weight = before_weight + _weight_change(tree, before)
        if 1 + weight > _KEEP_WEIGHT:
            return since
        while self._kept + 1 + weight > _KEEP_WEIGHT:
            old = next(iter(self._keeps))
            self._kept -= 1 + self._keeps.pop(old)
            old.merged = None
        self._keeps[walked] = weight
        self._kept += 1 + weight
        kept = shallow(tree) if tree is not None else None
        walked.merged = (kept, tuple(problems))
        return kept, weight

    def _locate(
        self, ref: str, base: Path, at: tuple[Origin, str] | None, diagnostics: list[Diagnostic]
    ) -> Path | None:
        """The file ``ref`` names from a pack in ``base`` (diagnostics at ``at`` when it names
        none), once per loader and set of roots: a file of an extends cycle is named again
        by the resolution of every pack of the cycle, and finding it resolves paths (a system
        call per path component) and checks them against the roots."""
        key = (ref, base, self._roots) if isinstance(ref, str) else None
        known = self._located.get(key) if key is not None else None
        if known is None:
            found: list[tuple[str, str, str | None]] = []
            known = (
                self._find(ref, base, lambda code, message, hint=None: found.append((code, message, hint))),
                tuple(found),
            )
            if key is not None:
                self._located[key] = known
        path, said = known
        if path is not None and at is not None and (kind := _not_regular(path)) is not None:
            # Said at the `extends` that names it (it was reported at the FIFO's own 1:1); a
            # pack given on the command line stays CR101 at its own name.
            said = (*said, ("CR030", f"{ref} is {kind}, not a pack file (looked for {path})", None))
            path = None
        for code, message, hint in said:
            if at is None:
                diagnostics.append(Diagnostic(code, "error", message, ref, 1, 1, "", hint))
            else:
                o, pointer = at
                diagnostics.append(Diagnostic(code, "error", message, o.file, o.line, o.col, pointer, hint))
        return path

    def _find(self, ref: str, base: Path, report: Callable[..., None]) -> Path | None:
        if not isinstance(ref, str):
            return None  # the schema check reports the wrong type (CR011)
        if not ref:
            report("CR030", "extends entry must be a non-empty string")
            return None
        if ref.startswith(BUILTIN_PREFIX):
            m = BUILTIN_REF.match(ref)
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
            if path.is_dir():
                report("CR030", f"{ref} is a folder, not a pack file (looked for {path}); name the pack's YAML file")
            else:
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
        self,
        root: Path,
        order: list[Path],
        diagnostics: list[Diagnostic],
        walked: dict[Path, _Walked],
        graph: _Graph,
    ) -> list[tuple[int, _Walked]]:
        """Append ``root`` and every pack it extends to ``order``, parents first (depth-first,
        in the order written). The walk keeps its own stack, so a chain of any length is no
        RecursionError. A pack whose ``extends`` meet a cycle is not walked here
        (:meth:`_resolve_cyclic`).

        ``walked``: the walks of this loader's earlier resolutions (same roots, same working
        directory) by file. A file met again is not walked again when its walk cannot turn out
        differently here (none of its files is placed yet): its files and diagnostics are taken
        as they are. A walk that met no file placed before it began (a diamond meets its own
        files again) is what resolving its file alone finds, and is kept. Returns ``(end, walk)`` for
        the walks whose files are ``order[:end]``, whose merged tree may be kept."""
        heads: list[tuple[int, _Walked]] = []
        on_stack: set[Path] = set()
        done: dict[Path, int] = {}  # the files placed, and where in the order
        pending: list[_Frame] = []

        def enter(path: Path) -> None:
            known = walked.get(path)
            if known is not None:
                files = known.files()
                # (Nothing is placed or on the stack before the first file: a pack resolved
                # after its walk is known takes its files as they are, without a look at each.)
                if not (done or on_stack) or not any(p in done or p in on_stack for p in files):
                    if not order:
                        heads.append((len(files), known))
                    if pending:  # more files to place after these (else the walk is over)
                        done.update((p, i) for i, p in enumerate(files, len(order)))
                    order.extend(files)
                    if known.diagnostics:
                        diagnostics.extend(known.found())
                    if pending:
                        pending[-1].parts.append(known)
                        if known.diagnostics:
                            pending[-1].found.append(known)
                    return
            doc, _ = self.read(path)
            if doc is None or not isinstance(doc.data, dict):
                done[path] = len(order)
                order.append(path)
                if pending:
                    pending[-1].parts.append(path)
                return
            on_stack.add(path)
            pending.append(_Frame(doc, iter(graph.entries(path)), path, len(order)))

        enter(root)
        while pending:
            frame = pending[-1]
            step = next(frame.parents, None)
            if step is None:
                pending.pop()
                on_stack.discard(frame.path)
                done[frame.path] = len(order)
                order.append(frame.path)
                if pending:
                    pending[-1].met = min(pending[-1].met, frame.met)
                if frame.met < frame.start:  # met a file placed before it began: no walk of its own
                    if pending:
                        # Its files and findings are still the enclosing walk's: a diamond's
                        # second side (the shared parent placed by the first) is part of the
                        # walk of the pack that names both sides.
                        pending[-1].parts.extend((*frame.parts, frame.path))
                        pending[-1].found.extend(frame.found)
                    continue
                known = walked.get(frame.path)
                if known is None:
                    parts = (*frame.parts, frame.path)
                    known = walked[frame.path] = _Walked(
                        parts,
                        tuple(frame.found),
                        len(order) - frame.start,
                        tuple(self._shown_in(x, graph.cwd) if isinstance(x, Path) else x for x in parts),
                    )
                if frame.start == 0:
                    heads.append((len(order), known))
                if pending:
                    pending[-1].parts.append(known)
                    if known.diagnostics:
                        pending[-1].found.append(known)
                continue
            parent, _, _, said = step
            diagnostics.extend(said)
            frame.found.extend(said)
            if parent is None:
                continue
            if parent in done:
                frame.met = min(frame.met, done[parent])
                continue
            if parent in on_stack:  # a cycle: resolve() sent the pack to _resolve_cyclic
                frame.met = -1
                continue
            enter(parent)
        return heads

    @staticmethod
    def _parents(doc: SourceDoc) -> Iterator[tuple[str, Any]]:
        """``(pointer, reference)`` for each entry of the document's ``extends``."""
        parents = doc.data.get("extends", [])
        if isinstance(parents, str):
            yield "/extends", parents
        elif isinstance(parents, list):
            for i, ref in enumerate(parents):
                yield f"/extends/{i}", ref


_KEEP_WEIGHT = 1_000_000
"""What one loader keeps of merged trees for later resolutions: the sum of their :func:`_weight`
(plus one each)."""


def _weight(value: Any) -> int:
    """The maps and lists of ``value`` and their entries, all the way down (0 for a scalar): what
    keeping a tree may keep alive. Kept trees share what a pack does not change with the tree it
    was merged from (and with the packs resolved); each is counted in full here, so the sum over
    the kept trees is an upper bound, whatever they share and whichever of them are dropped.
    Scalars are not counted: they are the parsed files' own, which the loader keeps anyway."""
    weight = 0
    todo = [value]
    while todo:
        node = todo.pop()
        if isinstance(node, OMap | OList):
            weight += 1 + len(node)
            todo.extend(node.values() if isinstance(node, OMap) else node)
    return weight


def _weight_change(new: Any, old: Any) -> int:
    """``_weight(new) - _weight(old)``, walking only where the two differ: ``new`` is merged from
    ``old``, and merging shares what a pack does not touch, so this costs about what the merge
    did, not the size of the tree (the whole tree again at each pack of a chain of 400 packs of
    50 prices each was as long as the rest of ``ctxrules validate``)."""
    change = 0
    todo = [(new, old)]
    while todo:
        a, b = todo.pop()
        if a is b:
            continue
        if isinstance(a, OMap) and isinstance(b, OMap):
            change += len(a) - len(b)
            for k, v in a.items():
                w = b.get(k)
                if v is not w:
                    todo.append((v, w))
            change -= sum(_weight(w) for k, w in b.items() if k not in a)
        elif isinstance(a, OList) and isinstance(b, OList):
            change += len(a) - len(b)
            left = Counter(map(id, b))  # the items of b not (yet) found in a
            for v in a:
                if left[id(v)] > 0:
                    left[id(v)] -= 1
                else:
                    change += _weight(v)
            for v in b:
                if left[id(v)] > 0:
                    left[id(v)] -= 1
                    change -= _weight(v)
        else:
            change += _weight(a) - _weight(b)
    return change


@dataclass(eq=False)
class _Walked:
    """What resolving one file found, for one loader, set of roots and working directory: its
    files in application order (``order``; ``shown``: the same, each file as it is displayed)
    and the diagnostics of the walk, each given as files (or diagnostics) and the walks of its
    parents (shared, so a chain of N files keeps N of these, not N²/2 paths), and, once merged
    and while the loader's budget lasts, the tree merged from those files with the merge
    problems met on the way."""

    order: tuple[Path | _Walked, ...]
    diagnostics: tuple[Diagnostic | _Walked, ...]
    size: int
    shown: tuple[str | _Walked, ...] = ()
    merged: tuple[OMap | None, tuple[MergeProblem, ...]] | None = None
    # attr -> (a list, n): the attribute spelled out is the list's first n items (_spelled).
    _spelled: dict[str, tuple[list[Any], int]] = field(default_factory=dict, repr=False)

    def files(self) -> list[Path]:
        return _spelled(self, "order")

    def shown_files(self) -> list[str]:
        return _spelled(self, "shown")

    def found(self) -> list[Diagnostic]:
        return _spelled(self, "diagnostics")


def _spelled(walked: _Walked, attr: str) -> list[Any]:
    """``walked``'s ``attr`` with the walks it names spelled out, in a new list.

    Each walk's is made once, as the first items of a list it may share with other walks: a
    walk that starts with another walk's items appends its own to that walk's list when
    nothing was appended to it yet (the other walk's items stay its first ones). In a folder of
    packs that extend each other in a chain, every pack's files are then a slice of one list,
    copied at C speed, where spelling each pack's chain out item by item made validating the
    folder quadratic in Python (a chain of 5,000 packs took half a minute). Made iteratively: a
    chain may be longer than the recursion limit."""
    todo = [walked]
    while todo:
        top = todo[-1]
        if attr in top._spelled:
            todo.pop()
            continue
        items = getattr(top, attr)
        missing = [x for x in items if isinstance(x, _Walked) and attr not in x._spelled]
        if missing:
            todo.extend(missing)
            continue
        todo.pop()
        out: list[Any] | None = None
        for item in items:
            if isinstance(item, _Walked):
                base, n = item._spelled[attr]
                if out is None:
                    # Its list, to append to, while it holds just its items; else a copy of them.
                    out = base if len(base) == n else base[:n]
                else:
                    out.extend(base[:n])
            elif out is None:
                out = [item]
            else:
                out.append(item)
        if out is None:
            out = []
        top._spelled[attr] = (out, len(out))
    base, n = walked._spelled[attr]
    return base[:n]


class _Graph:
    """The ``extends`` graph of one loader, set of roots and working directory: each file's
    parents as :meth:`PackLoader._locate` finds them (once), its strongly connected sets, and
    what the files of each set with a cycle reach."""

    def __init__(self, loader: PackLoader, cwd: str) -> None:
        self.loader, self.cwd = loader, cwd
        self.edges: dict[Path, tuple[tuple[Path, Origin, str], ...]] = {}  # the entries found
        self.found: dict[Path, tuple[Diagnostic, ...]] = {}  # what locating a file's parents said
        self._entries: dict[Path, tuple[_Entry, ...]] = {}
        self.parts: Components[Path] = Components(self.parents)
        self._cycles: dict[int, dict[Path, tuple[list[Path], int]]] = {}
        self._reached: dict[int, _Reached] = {}

    def parents(self, path: Path) -> list[Path]:
        return [to for to, _, _ in self._edges(path)]

    def entries(self, path: Path) -> tuple[_Entry, ...]:
        """Each ``extends`` entry of the file (a parsed pack): the file it names (None when it
        names none), where it is written, and what finding the file said."""
        self._edges(path)
        return self._entries[path]

    def _edges(self, path: Path) -> tuple[tuple[Path, Origin, str], ...]:
        edges = self.edges.get(path)
        if edges is not None:
            return edges
        doc, _ = self.loader.read(path)
        entries: list[_Entry] = []
        if doc is not None and isinstance(doc.data, dict):
            for pointer, ref in PackLoader._parents(doc):
                origin = doc.origin(pointer)
                said: list[Diagnostic] = []
                to = self.loader._locate(ref, path.parent, (origin, pointer), said)
                entries.append((to, origin, pointer, tuple(said)))
        self._entries[path] = tuple(entries)
        self.edges[path] = edges = tuple((to, o, p) for to, o, p, _ in entries if to is not None)
        self.found[path] = tuple(d for *_, said in entries for d in said)
        return edges

    def cycle_at(self, path: Path) -> Diagnostic:
        """CR031 for the cycle a walk entering ``path``'s set at ``path`` closes first, at the
        ``extends`` entry that closes it."""
        part = self.parts.of[path]
        cycles = self._cycles.get(part)
        if cycles is None:
            cycles = self._cycles[part] = first_cycles(self.parts.members[part], self._first_in(part))
        ring, start = cycles[path]
        last = ring[(start - 1) % len(ring)]
        _, origin, pointer = self._first_edge_in(last, part)
        names = [self.loader.display_path(p) for p in ring] if len(ring) <= 12 else _LazyNames(self.loader, ring)
        return Diagnostic(
            "CR031",
            "error",
            f"extends forms a cycle: {shown_cycle(names, start)}",
            origin.file,
            origin.line,
            origin.col,
            pointer,
        )

    def _first_in(self, part: int) -> Callable[[Path], Path]:
        return lambda p: self._first_edge_in(p, part)[0]

    def _first_edge_in(self, path: Path, part: int) -> tuple[Path, Origin, str]:
        of = self.parts.of
        return next(e for e in self._edges(path) if of[e[0]] == part)

    def reach(self, part: int) -> _Reached:
        """What the files of a strongly connected set reach: the files (not in an order of
        application), and the problems met: each file's own, its ``extends`` entries', and CR031
        for each set with a cycle entered from outside it. Once per set, from what the sets it
        extends reach (so a chain of packs leading into a cycle is not walked again for each);
        the packs resolved share it, and must not change it."""
        todo = [part]
        while todo:  # the sets a set extends first (numbered before it), without recursion
            top = todo[-1]
            if top in self._reached:
                todo.pop()
                continue
            below = [q for q in self._below(top) if q not in self._reached]
            if below:
                todo.extend(below)
                continue
            todo.pop()
            self._reached[top] = self._reach_of(top)
        return self._reached[part]

    def _below(self, part: int) -> list[int]:
        """The sets the files of ``part`` extend, in the order written."""
        of = self.parts.of
        return list(
            dict.fromkeys(of[to] for m in self.parts.members[part] for to, _, _ in self._edges(m) if of[to] != part)
        )

    def _reach_of(self, part: int) -> _Reached:
        of, cyclic = self.parts.of, self.parts.cyclic
        files: dict[Path, str] = {}  # and the name each is shown by
        found: dict[Diagnostic, None] = {}
        for q in self._below(part):
            got = self._reached[q]
            files.update(zip(got.files, got.shown, strict=True))
            found.update(dict.fromkeys(got.found))
        for m in self.parts.members[part]:
            for to, _, _ in self._edges(m):
                if cyclic[of[to]] and of[to] != part:
                    found[self.cycle_at(to)] = None
            found.update(dict.fromkeys(self.found[m]))
            found.update(dict.fromkeys(self.loader.read(m)[1]))
            files[m] = self.loader._shown_in(m, self.cwd)
        return _Reached(tuple(files), tuple(found), tuple(files.values()))


_Entry = tuple[Path | None, Origin, str, tuple[Diagnostic, ...]]


class _Reached(NamedTuple):
    """What the files of a set reach: the files, the problems met, the files' shown names."""

    files: tuple[Path, ...]
    found: tuple[Diagnostic, ...]
    shown: tuple[str, ...]


class _LazyNames(Sequence[str]):
    """The shown names of a long ring, each made when asked for (a cycle's message names a dozen)."""

    def __init__(self, loader: PackLoader, ring: list[Path]) -> None:
        self.loader, self.ring = loader, ring

    def __len__(self) -> int:
        return len(self.ring)

    def __getitem__(self, i: Any) -> Any:
        return self.loader.display_path(self.ring[i])


class _Docs(Mapping[str, SourceDoc]):
    """:attr:`ResolvedPack.docs`, made when first asked for: the document of each file of
    ``order`` that holds a mapping, by its shown name. Validating a folder of packs that extend
    each other asks for few of them (where a finding needs a file's text), and making them for
    every pack was a pass over its whole chain."""

    __slots__ = ("_made", "_order", "_read")

    def __init__(self, order: Sequence[Path], read: Callable[[Path], tuple[SourceDoc | None, list[Diagnostic]]]):
        self._order: Sequence[Path] = order
        self._read = read
        self._made: dict[str, SourceDoc] | None = None

    def _docs(self) -> dict[str, SourceDoc]:
        made = self._made
        if made is None:
            made = {}
            for p in self._order:
                doc, _ = self._read(p)  # read when the pack was resolved: the loader's copy
                if doc is not None and isinstance(doc.data, dict):
                    made[doc.path] = doc
            self._made, self._order = made, ()
        return made

    def __getitem__(self, key: str) -> SourceDoc:
        return self._docs()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._docs())

    def __len__(self) -> int:
        return len(self._docs())

    def __repr__(self) -> str:
        return repr(self._docs())


class _Frame:
    """A file on the walk's stack: the parents still to visit, and what its walk found so far."""

    __slots__ = ("doc", "found", "met", "parents", "parts", "path", "start")

    def __init__(self, doc: SourceDoc, parents: Iterator[_Entry], path: Path, start: int) -> None:
        self.doc, self.parents, self.path, self.start = doc, parents, path, start
        self.met = start  # the first place in the order of a file its walk met again
        self.parts: list[Path | _Walked] = []
        self.found: list[Diagnostic | _Walked] = []


def _disabled_ids(tree: OMap) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key in ID_LISTS:
        lst = tree.get(key)
        if isinstance(lst, OList):
            ids = [str(i.get("id")) for i in lst if isinstance(i, dict) and i.get("enabled") is False]
            if ids:
                out[key] = ids
    return out


def _disabled_origins(tree: OMap, docs: Mapping[str, SourceDoc]) -> dict[str, dict[str, Origin]]:
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


def _not_utf8(raw: bytes, at: int, shown: str) -> Diagnostic:
    """CR001 at the first byte that is not UTF-8: its line, and its column in characters (as
    every other position); a file saved as UTF-16 or UTF-32 (a NUL byte) or in a legacy code page
    is named as such, the usual causes."""
    start = raw.rfind(b"\n", 0, at) + 1
    line = raw.count(b"\n", 0, at) + 1
    col = len(raw[start:at].decode("utf-8", errors="replace")) + 1
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")) or b"\x00" in raw:
        hint = "the file looks saved as UTF-16 or UTF-32; save it as UTF-8"
    else:
        hint = "save the file as UTF-8 (it looks saved in another encoding, such as Latin-1 or cp1252)"
    return Diagnostic("CR001", "error", f"file is not valid UTF-8 (byte {raw[at]:#04x})", shown, line, col, "", hint)
