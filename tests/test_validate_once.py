"""``ctxrules validate`` judges each pattern and each compressor step once per run (issue 22):
what it remembers must never change what it reports, nor where."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from ctxrules import patterns
from ctxrules.compressors.actions.common import compile_all
from ctxrules.plugins import build_plugin_manager, collect
from ctxrules.validation.validate import validate_paths

# One bad step, written the same way in a fragment and in the pack that extends it: an unknown
# option (CR061 at its key), a pattern that does not compile (CR070), a nested quantifier
# (CR102 warning) and options the action itself rejects (CR061).
_STEPS = """\
    steps:
      - {use: drop, with: {patterns: ['(\\w+\\s?)+$'], pattern: x}}
      - {use: keep, with: {patterns: ['FAILED (']}}
      - {use: group, with: {pattern: '^([^:]+):(\\d+)'}}
      - {use: drop, with: {patterns: ['(\\w+\\s?)+$']}}
"""


def _write(folder: Path) -> list[Path]:
    fragment = folder / "fragment.yaml"
    fragment.write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: fragment, version: 1.0.0}\n"
        "compressors:\n  - id: shared\n    match: {argv: [tool]}\n" + _STEPS,
        encoding="utf-8",
    )
    child = folder / "child.yaml"
    child.write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: child, version: 1.0.0}\n"
        "extends: [./fragment.yaml]\n\n"
        "compressors:\n  - id: own\n    match: {argv: [other]}\n" + _STEPS,
        encoding="utf-8",
    )
    return [child, fragment]


def _fresh_registry(*, remembering: bool = True) -> Any:
    registry = collect(*build_plugin_manager())
    if not remembering:
        registry.checked = _Forgetful()
    return registry


class _Forgetful(dict[Any, Any]):
    """A memo that never keeps anything: every value is checked afresh."""

    def __setitem__(self, key: Any, value: Any) -> None:
        pass


def _found(run: Any) -> set[tuple[Any, ...]]:
    return {(d.code, d.severity, d.message, d.file, d.line, d.col, d.pointer, d.hint) for d in run.diagnostics}


def test_remembered_verdicts_are_reported_at_every_place_they_apply(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    files = _write(tmp_path)
    together = _found(validate_paths([str(tmp_path)], _fresh_registry()))
    # Nothing remembered: the same findings.
    patterns._compiled.cache_clear()
    assert _found(validate_paths([str(tmp_path)], _fresh_registry(remembering=False))) == together
    # Each file on its own: the same findings.
    alone: set[tuple[Any, ...]] = set()
    for f in files:
        alone |= _found(validate_paths([str(f)], _fresh_registry()))
    assert together == alone
    codes = sorted((d[0], d[3], d[4]) for d in together)
    # Both copies of each bad step are reported, each in its own file and line.
    for name, first in (("fragment.yaml", 8), ("child.yaml", 10)):
        assert ("CR061", name, first) in codes  # the unknown option, at its key
        assert ("CR102", name, first) in codes
        assert ("CR070", name, first + 1) in codes
        assert ("CR061", name, first + 2) in codes  # the group the action's pattern lacks
        assert ("CR102", name, first + 3) in codes
    pointers = {d[6] for d in together if d[3] == "child.yaml"}
    assert "/compressors/0/steps/0/with/pattern" in pointers  # the child's own numbering


def test_validating_twice_in_one_process_gives_the_same_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _write(tmp_path)
    registry = _fresh_registry()
    first = validate_paths([str(tmp_path)], registry)
    second = validate_paths([str(tmp_path)], registry)
    assert first.diagnostics == second.diagnostics and first.diagnostics


def test_a_pattern_is_one_object_whatever_form_its_flags_take() -> None:
    assert patterns.compile(r"x+y") is patterns.compile(r"x+y", 0)
    assert patterns.compile(r"^a", re.MULTILINE) is patterns.compile(r"^a", int(re.MULTILINE))
    assert patterns.compile(r"^a", re.MULTILINE) is not patterns.compile(r"^a")


@pytest.mark.parametrize(
    ("sources", "text", "hit"),
    [
        (["error", r"(?i)warn"], "a WARNing here", "WARN"),  # a global flag, scoped
        (["error", r"(?i)warn"], "nothing", None),
        ([r"(?a)\w+!", "zzz"], "é! and ab!", "ab!"),  # an ASCII flag cannot be scoped: one by one
        ([r"\d+", r"[a-z]+"], "-- 42 --", "42"),
    ],
)
def test_an_alternation_is_built_on_its_first_search(sources: list[str], text: str, hit: str | None) -> None:
    matcher = compile_all(sources)
    assert matcher is not None
    assert getattr(matcher, "_matcher", "?") is None  # validate builds actions and never searches
    found = matcher.search(text)
    assert (found.group(0) if found is not None else None) == hit
    assert getattr(matcher, "_matcher", None) is not None


def test_the_origin_index_answers_as_the_full_walk_does() -> None:
    """ResolvedPack.origins() looks each pointer up in the tree when asked (validate asks for
    a few dozen of thousands): every pointer the full walk lists, and nothing else, for every
    fixture and built-in pack."""
    from ctxrules.packs.loader import PackLoader
    from ctxrules.packs.tree import OriginIndex, origins_by_pointer

    repo = Path(__file__).resolve().parents[1]
    targets = sorted((repo / "tests" / "fixtures").rglob("*.yaml")) + sorted((repo / "rules").rglob("*.yaml"))
    checked = 0
    for target in targets:
        pack = PackLoader().resolve(str(target))
        full = origins_by_pointer(pack.tree)
        lazy = pack.origins()
        assert isinstance(lazy, OriginIndex)
        for pointer, origin in full.items():
            assert pointer in lazy and lazy[pointer] == origin and lazy.get(pointer) == origin
            for miss in (f"{pointer}/zz", f"{pointer}/0", f"{pointer}/00", f"{pointer}~", f"{pointer}/"):
                assert (miss in lazy) == (miss in full), (target, miss)
            checked += 1
        assert dict(OriginIndex(pack.tree)) == full and len(lazy) == len(full)
    assert checked > 10_000


def test_a_layer_shared_by_several_resolutions_is_never_changed_by_them() -> None:
    """The loader annotates each file once and applies the same layer in every pack that
    extends it: resolving the built-in pack first and its fragments afterwards (and the
    reverse) gives each exactly what a fresh loader gives."""
    from ctxrules.packs.loader import PackLoader
    from ctxrules.packs.tree import annotate, origins_by_pointer

    repo = Path(__file__).resolve().parents[1]
    files = [repo / "rules" / "default.yaml", *sorted((repo / "rules" / "compressors").glob("*.yaml"))]
    for order in (files, files[::-1]):
        shared = PackLoader()
        for f in order:
            mine, fresh = shared.resolve(str(f)), PackLoader().resolve(str(f))
            assert mine.data == fresh.data and mine.diagnostics == fresh.diagnostics
            assert dict(mine.origins()) == origins_by_pointer(fresh.tree)
        for path, layer in shared._layers.items():
            doc, _ = shared.read(path)
            assert doc is not None
            assert origins_by_pointer(layer) == origins_by_pointer(annotate(doc)) and layer == annotate(doc)
