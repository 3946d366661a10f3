"""The bounded set of sessions an integration keeps open (litellm's hook, LangChain's middleware)."""

from __future__ import annotations

import threading

import pytest

from ctxrules.integrations import OpenSessions


def test_the_least_recently_used_session_is_let_go() -> None:
    opened: list[str] = []

    def opener(key: str) -> object:
        opened.append(key)
        return object()

    sessions: OpenSessions[object] = OpenSessions(2)
    a = sessions.get("a", lambda: opener("a"))
    sessions.get("b", lambda: opener("b"))
    assert sessions.get("a", lambda: opener("a")) is a  # used again: now the most recent
    sessions.get("c", lambda: opener("c"))  # lets "b" go, not "a"
    assert "a" in sessions and "c" in sessions and "b" not in sessions and len(sessions) == 2
    sessions.get("b", lambda: opener("b"))
    assert opened == ["a", "b", "c", "b"]


def test_one_opener_call_per_key_under_threads() -> None:
    sessions: OpenSessions[object] = OpenSessions(8)
    calls: list[int] = []
    barrier = threading.Barrier(6)
    got: list[object] = []

    def opener() -> object:
        calls.append(1)
        return object()

    def worker() -> None:
        barrier.wait()
        got.append(sessions.get("k", opener))

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len({id(g) for g in got}) == 1


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_sessions must be at least 1"):
        OpenSessions(0)
