"""Values that remember where they were written.

Merging moves and overrides values across files; to tell a user where each resolved value came
from, containers carry the origin of every child. Scalars cannot carry attributes, so the
container holds them: ``OMap.origins[key]`` and ``OList.origins[i]``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ctxrules.packs.source import Origin, SourceDoc, escape_token


class OMap(dict[str, Any]):
    """A mapping whose children remember their origins."""

    origin: Origin
    origins: dict[str, Origin]

    def __init__(self, origin: Origin) -> None:
        super().__init__()
        self.origin = origin
        self.origins = {}

    def put(self, key: str, value: Any, origin: Origin) -> None:
        self[key] = value
        self.origins[key] = origin

    def drop(self, key: str) -> None:
        self.pop(key, None)
        self.origins.pop(key, None)


class OList(list[Any]):
    """A list whose items remember their origins."""

    origin: Origin
    origins: list[Origin]

    def __init__(self, origin: Origin) -> None:
        super().__init__()
        self.origin = origin
        self.origins = []

    def add(self, value: Any, origin: Origin) -> None:
        self.append(value)
        self.origins.append(origin)


def annotate(doc: SourceDoc) -> Any:
    """Turn a parsed document into a tree of :class:`OMap`/:class:`OList` with origins."""

    def walk(value: Any, pointer: str) -> Any:
        if isinstance(value, dict):
            out = OMap(doc.origin(pointer))
            for k, v in value.items():
                child = f"{pointer}/{escape_token(k)}"
                # A section (a mapping or list under its key) was written where its key is: a
                # block value's own position is its first child's line.
                where = doc.key_origin(child) if isinstance(v, dict | list) else doc.origin(child)
                out.put(k, walk(v, child), where)
            return out
        if isinstance(value, list):
            lst = OList(doc.origin(pointer))
            for i, v in enumerate(value):
                child = f"{pointer}/{i}"
                lst.add(walk(v, child), doc.origin(child))
            return lst
        return value

    return walk(doc.data, "")


def clone(value: Any) -> Any:
    """A deep copy that keeps origins (parents are shared between packs: never mutate them)."""
    if isinstance(value, OMap):
        out = OMap(value.origin)
        for k, v in value.items():
            out.put(k, clone(v), value.origins.get(k, value.origin))
        return out
    if isinstance(value, OList):
        lst = OList(value.origin)
        for i, v in enumerate(value):
            lst.add(clone(v), value.origins[i] if i < len(value.origins) else value.origin)
        return lst
    return value


def shallow(value: OMap) -> OMap:
    """A new top-level map over the same children and origins: what merging into a tree with
    ``reuse_base`` changes (nothing below the top level is changed by merging)."""
    out = OMap(value.origin)
    dict.update(out, value)
    out.origins = dict(value.origins)
    return out


def plain(value: Any) -> Any:
    """The tree as plain dicts and lists (what stages and the schema see)."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def origins_by_pointer(value: Any) -> dict[str, Origin]:
    """Every value's origin, keyed by its JSON pointer in the resolved tree."""
    out: dict[str, Origin] = {}

    def walk(v: Any, pointer: str, origin: Origin | None) -> None:
        if origin is not None:
            out[pointer] = origin
        if isinstance(v, OMap):
            for k, child in v.items():
                walk(child, f"{pointer}/{escape_token(k)}", v.origins.get(k))
        elif isinstance(v, OList):
            for i, child in enumerate(v):
                walk(child, f"{pointer}/{i}", v.origins[i] if i < len(v.origins) else None)

    walk(value, "", getattr(value, "origin", None))
    return out


class OriginIndex(Mapping[str, Origin]):
    """:func:`origins_by_pointer` of a tree, answered one pointer at a time: a lookup walks the
    tree along the pointer's tokens (and remembers the answer) instead of first building the
    pointer of every value. Validating a pack asks for a few dozen origins of a tree of
    thousands of values (the whole index was a twentieth of ``ctxrules validate``). Iterating
    builds the whole index once. The tree must not change while the index is in use."""

    def __init__(self, tree: Any) -> None:
        self._tree = tree
        self._found: dict[str, Origin | None] = {}
        self._all: dict[str, Origin] | None = None

    def _lookup(self, pointer: str) -> Origin | None:
        if pointer in self._found:
            return self._found[pointer]
        if self._all is not None:
            return self._all.get(pointer)
        found = self._walk(pointer)
        if len(self._found) < 100_000:
            self._found[pointer] = found
        return found

    def _walk(self, pointer: str) -> Origin | None:
        node = self._tree
        if pointer == "":
            root: Origin | None = getattr(node, "origin", None)
            return root
        if not pointer.startswith("/"):
            return None
        origin: Origin | None = None
        for token in pointer[1:].split("/"):
            if isinstance(node, OMap):
                key = token.replace("~1", "/").replace("~0", "~")
                if key not in node or escape_token(key) != token:  # only the pointer the index would build
                    return None
                origin, node = node.origins.get(key), node[key]
            elif isinstance(node, OList):
                if not token.isdigit() or str(int(token)) != token or int(token) >= len(node):
                    return None
                i = int(token)
                origin, node = (node.origins[i] if i < len(node.origins) else None), node[i]
            else:
                return None
        return origin

    def _index(self) -> dict[str, Origin]:
        if self._all is None:
            self._all = origins_by_pointer(self._tree)
        return self._all

    def __getitem__(self, pointer: str) -> Origin:
        found = self._lookup(pointer) if isinstance(pointer, str) else None
        if found is None:
            raise KeyError(pointer)
        return found

    def __contains__(self, pointer: object) -> bool:
        return isinstance(pointer, str) and self._lookup(pointer) is not None

    def get(self, pointer: str, default: Any = None) -> Any:
        found = self._lookup(pointer) if isinstance(pointer, str) else None
        return default if found is None else found

    def __iter__(self) -> Iterator[str]:
        return iter(self._index())

    def __len__(self) -> int:
        return len(self._index())
