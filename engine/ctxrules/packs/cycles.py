"""The strongly connected sets of the ``extends`` graph, and the cycle a walk from a file meets.

A folder of packs that extend each other in a ring made every pack walk the whole ring (and the
run quadratic). The graph is taken apart once per loader instead: :class:`Components` numbers the
strongly connected sets as files are met (Tarjan's algorithm, with its own stack), and
:func:`first_cycles` finds, for every file of a set with a cycle, the cycle that a depth-first
walk entering the set at that file closes first, for all of them in one pass.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Generic, TypeVar

N = TypeVar("N", bound=Hashable)


class Components(Generic[N]):
    """The strongly connected sets of a graph given by ``successors`` (each node's successors in
    order, the same at every call), numbered as :meth:`add` meets them: a set is numbered after
    every set it reaches, so each is known to reach a cycle or not when numbered."""

    def __init__(self, successors: Callable[[N], Sequence[N]]) -> None:
        self.successors = successors
        self.of: dict[N, int] = {}
        self.members: list[list[N]] = []  # in the order the walk met them
        self.cyclic: list[bool] = []  # more than one node, or a node that is its own successor
        self.reaches_cycle: list[bool] = []

    def add(self, root: N) -> int:
        """The number of ``root``'s set, numbering every set it reaches that is not yet."""
        known = self.of.get(root)
        if known is not None:
            return known
        index: dict[N, int] = {root: 0}
        low: dict[N, int] = {root: 0}
        stack: list[N] = [root]
        place: dict[N, int] = {root: 0}  # where each node is on the stack
        work: list[tuple[N, Iterator[N]]] = [(root, iter(self.successors(root)))]
        while work:
            node, rest = work[-1]
            for nxt in rest:
                if nxt in self.of:
                    continue  # a set numbered before: not on the stack
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    place[nxt] = len(stack)
                    stack.append(nxt)
                    work.append((nxt, iter(self.successors(nxt))))
                    break
                low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    above = work[-1][0]
                    low[above] = min(low[above], low[node])
                if low[node] == index[node]:
                    self._number(stack[place[node] :])
                    del stack[place[node] :]
        return self.of[root]

    def _number(self, members: list[N]) -> None:
        number = len(self.members)
        for m in members:
            self.of[m] = number
        cyclic = len(members) > 1 or members[0] in self.successors(members[0])
        reaches = cyclic or any(
            self.reaches_cycle[self.of[s]] for m in members for s in self.successors(m) if self.of[s] != number
        )
        self.members.append(members)
        self.cyclic.append(cyclic)
        self.reaches_cycle.append(reaches)


def first_cycles(members: Sequence[N], first: Callable[[N], N]) -> dict[N, tuple[list[N], int]]:
    """For each node of one strongly connected set with a cycle: the cycle a depth-first walk
    entering the set there closes first, as ``(ring, start)``: the walk reads ``ring[start:]``
    then ``ring[:start]`` and then names ``ring[start]`` again.

    ``first(node)``: the node's first successor in the set (a depth-first walk that enters the
    set follows these until one is on its stack; what it visits outside the set cannot lead
    back). Following them from any node ends in a ring; where it joins the ring is where the
    walk's cycle starts. One pass over the set: each node is followed once."""
    found: dict[N, tuple[list[N], int]] = {}
    for node in members:
        path: list[N] = []
        at: dict[N, int] = {}
        x = node
        while x not in found and x not in at:
            at[x] = len(path)
            path.append(x)
            x = first(x)
        if x in at:  # a new ring: the path from where it closes
            ring = path[at[x] :]
            for i, r in enumerate(ring):
                found[r] = (ring, i)
            path = path[: at[x]]
        joined = found[x]
        for p in path:
            found[p] = joined
    return found


def shown_cycle(ring: Sequence[str], start: int, *, ends: tuple[int, int] = (6, 5)) -> str:
    """``a -> b -> ... -> a`` for the cycle ``ring`` read from ``start``; a cycle of more than
    ``sum(ends) + 1`` names is named by its first and last ones (a cycle through a thousand
    files would be a line of a thousand names)."""
    size = len(ring) + 1  # the first name is named again at the end

    def name(i: int) -> str:
        return ring[(start + i) % len(ring)]

    head, tail = ends
    if size <= head + tail + 1:
        return " -> ".join(name(i) for i in range(size))
    names = [name(i) for i in range(head)]
    names.append(f"... {size - head - tail} more ...")
    names += [name(i) for i in range(size - tail, size)]
    return " -> ".join(names)
