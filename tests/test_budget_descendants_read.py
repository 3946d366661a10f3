"""The descendants registry a ledger reads on every prepare is the one of its current root:
a ledger keeps what it read last (the log, a cursor, the keys), and must read another
registry once register_child made its session a sub-agent of another root."""

from __future__ import annotations

from pathlib import Path

from ctxrules.budget.tracker import SessionLedger


def test_a_session_made_a_sub_agent_reads_its_new_roots_registry(tmp_path: Path) -> None:
    state = tmp_path / "state"
    root = SessionLedger(state / "root", "root")
    child = SessionLedger(state / "child", "child")
    sibling = SessionLedger(state / "sibling", "sibling")
    assert child.descendant_keys() == []  # its own registry (it is its own root): read, empty
    assert child.status().totals.calls == 0
    root.register_child(child)
    root.register_child(sibling)
    keys = child.descendant_keys()
    assert [Path(k).name for k in keys] == ["child", "sibling"]
    assert keys == root.descendant_keys()


def test_the_registry_read_on_from_where_it_ended(tmp_path: Path) -> None:
    state = tmp_path / "state"
    root = SessionLedger(state / "root", "root")
    kids = [SessionLedger(state / f"k{i}", f"k{i}") for i in range(3)]
    assert root.descendant_keys() == []
    for n, kid in enumerate(kids, 1):
        root.register_child(kid)
        assert [Path(k).name for k in root.descendant_keys()] == [f"k{i}" for i in range(n)]
        assert root.descendant_keys() == root.descendant_keys()  # unchanged: the same keys again
