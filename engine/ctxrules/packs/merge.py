"""The merge rules of ``extends`` (docs/reference/concepts.md "Merge rules"; README "How packs merge").

- Maps merge deeply; the later value wins.
- Lists of items with ``id`` (the keys in :data:`ID_LISTS`) merge by id: a new id with the
  fields that make it complete is appended (``before:``/``after:`` place it); an existing id is
  overridden field by field (its ``with:`` merges deeply) and may be moved with ``before:``/
  ``after:``; ``enabled: false`` removes it, ``enabled: true`` restores it; a partial item whose
  id exists nowhere is an error.
- Every other list is replaced as a whole.
- ``metadata`` is the child's own (a pack's name and version are not inherited); ``extends`` is
  consumed by resolution and never appears in the result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ctxrules.diagnostics import did_you_mean
from ctxrules.packs.source import Origin
from ctxrules.packs.tree import OList, OMap, clone, shallow

# The fields that make a *new* item complete, per id-keyed list.
ID_LISTS: dict[str, tuple[str, ...]] = {
    "pipeline": ("use",),
    "priorities": ("priority",),
    "models": ("match",),
    "compressors": ("match", "steps"),
    "tests": ("input",),
}
PLACEMENT_KEYS = ("before", "after")
NOT_INHERITED = ("metadata", "extends")


@dataclass(frozen=True)
class MergeProblem:
    code: str
    message: str
    origin: Origin
    pointer: str
    hint: str | None = None


def merge_packs(base: OMap, child: OMap, problems: list[MergeProblem], *, reuse_base: bool = False) -> OMap:
    """``child`` applied over ``base``; neither is modified. Problems are appended.

    ``reuse_base``: ``base`` is the caller's own intermediate result and may become part of the
    answer (the loader folds a pack's files one by one: copying what it has merged so far for
    each file would make resolving quadratic in the number of files). Its maps and lists below
    the top level are then shared with the answer where ``child`` does not touch them (nothing
    changes a merged tree below its top level)."""
    out: OMap = base if reuse_base else clone(base)
    for key in NOT_INHERITED:
        out.drop(key)
    for key, value in child.items():
        origin = child.origins.get(key, child.origin)
        if key in ID_LISTS and isinstance(value, OList) and isinstance(out.get(key), OList):
            out.put(key, _merge_id_list(out[key], value, key, problems), origin)
        elif key in ID_LISTS and isinstance(value, OList):
            out.put(key, _merge_id_list(OList(value.origin), value, key, problems), origin)
        else:
            out.put(key, _merge_value(out.get(key), value), origin)
    return out


def _merge_value(base: Any, over: Any) -> Any:
    """``over`` merged into ``base``: a new map for each map both write, sharing with ``base``
    what ``over`` does not touch (merging never changes a tree's maps and lists below its top
    level, so they can be shared; a deep copy of ``base`` at each level made a chain of N packs
    adding to one nested map copy it N times, and the loader keep N copies)."""
    if isinstance(base, OMap) and isinstance(over, OMap):
        out = shallow(base)
        for k, v in over.items():
            out.put(k, _merge_value(out.get(k), v), over.origins.get(k, over.origin))
        return out
    return clone(over)


def _item_id(item: Any) -> str | None:
    if isinstance(item, OMap) and isinstance(item.get("id"), str):
        return str(item["id"])
    return None


def _merge_id_list(base: OList, over: OList, key: str, problems: list[MergeProblem]) -> OList:
    items: list[tuple[OMap | Any, Origin]] = list(zip(base, base.origins, strict=False))
    # Position of each id in `items`, kept up to date on appends and rebuilt after a move: a
    # lookup per item keeps merging linear in the number of items (140,000 rules included).
    positions = _positions(items)
    for index, item in enumerate(over):
        pointer = f"/{key}/{index}"
        origin = over.origins[index] if index < len(over.origins) else over.origin
        ident = _item_id(item)
        if ident is None:
            # Schema validation reports items without an id; keep them so nothing is silently lost.
            items.append((clone(item), origin))
            continue
        if ident in positions:
            pos = positions[ident]
            merged = _merge_value(items[pos][0], _without_placement(item))
            items[pos] = (merged, items[pos][1])
            if any(k in item for k in PLACEMENT_KEYS):
                moved = items.pop(pos)
                _place(items, moved, item, key, pointer, problems, _positions(items))
                positions = _positions(items)
            continue
        missing = [f for f in ID_LISTS[key] if f not in item]
        if missing:
            problems.append(
                MergeProblem(
                    "CR041",
                    f"{key} item '{ident}' does not exist in any parent pack, and is missing "
                    + ", ".join(f"'{m}'" for m in missing)
                    + " to be a new item",
                    origin,
                    pointer,
                    hint=_hint_for(ident, list(positions), problems),
                )
            )
            continue
        if any(k in item for k in PLACEMENT_KEYS):
            _place(items, (_without_placement(item), origin), item, key, pointer, problems, positions)
            positions = _positions(items)
        else:
            positions.setdefault(ident, len(items))
            items.append((_without_placement(item), origin))
    out = OList(over.origin)
    for value, origin in items:
        out.add(value, origin)
    return out


def _positions(items: list[tuple[Any, Origin]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for pos, (item, _) in enumerate(items):
        ident = _item_id(item)
        if ident is not None:
            out.setdefault(ident, pos)
    return out


_HINTS = 20
"""Did-you-mean hints per merge: each compares against every id, so a pack with thousands of
unknown ids gets its first hints, not a quadratic validation."""


def _hint_for(ident: str, ids: list[str], problems: list[MergeProblem]) -> str | None:
    if sum(p.hint is not None for p in problems) >= _HINTS:
        return None
    return did_you_mean(ident, ids)


def _without_placement(item: OMap) -> OMap:
    """A copy of ``item`` (a new tree, as merging needs) without its placement keys."""
    out: OMap = clone(item)
    for k in PLACEMENT_KEYS:
        out.drop(k)
    return out


def _place(
    items: list[tuple[Any, Origin]],
    entry: tuple[Any, Origin],
    spec: OMap,
    key: str,
    pointer: str,
    problems: list[MergeProblem],
    positions: dict[str, int],
) -> None:
    for where in PLACEMENT_KEYS:
        target = spec.get(where)
        if target is None:
            continue
        if target not in positions:
            problems.append(
                MergeProblem(
                    "CR042",
                    f"{where}: '{target}' names no {key} item",
                    spec.origins.get(where, spec.origin),
                    f"{pointer}/{where}",
                    hint=_hint_for(str(target), list(positions), problems),
                )
            )
            break
        pos = positions[target]
        items.insert(pos if where == "before" else pos + 1, entry)
        return
    items.append(entry)


def drop_disabled(tree: OMap) -> OMap:
    """Remove id-keyed items whose ``enabled`` is false (kept until now so a child can restore)."""
    for key in ID_LISTS:
        lst = tree.get(key)
        if not isinstance(lst, OList):
            continue
        kept = OList(lst.origin)
        for item, origin in zip(lst, lst.origins, strict=False):
            if isinstance(item, OMap) and item.get("enabled") is False:
                continue
            if isinstance(item, OMap) and "enabled" in item:
                item = shallow(item)  # items are shared with kept merges (PackLoader): not changed
                item.drop("enabled")
            kept.add(item, origin)
        tree.put(key, kept, tree.origins.get(key, tree.origin))
    return tree
