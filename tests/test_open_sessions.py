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


@pytest.mark.parametrize("limit", [0, -3, 1.5, "a", True, None])
def test_a_limit_that_is_no_whole_number_of_at_least_one_is_refused(limit: object) -> None:
    # "a" was a TypeError from comparing it, 1.5 was taken.
    with pytest.raises(ValueError, match=f"max_sessions must be a whole number of at least 1, got {limit!r}"):
        OpenSessions(limit)  # type: ignore[arg-type]


def test_a_slow_opening_does_not_hold_up_the_sessions_already_open() -> None:
    # Opening asks the store; a Redis that is slow or gone takes its socket timeout. It was done
    # under the set's lock, so every call of every other conversation waited for it too.
    sessions: OpenSessions[object] = OpenSessions(8)
    b = sessions.get("b", object)
    release = threading.Event()
    started = threading.Event()
    got: dict[str, object] = {}

    def slow() -> object:
        started.set()
        assert release.wait(10)
        return object()

    def open_a(name: str) -> None:
        got[name] = sessions.get("a", slow)

    first = threading.Thread(target=open_a, args=("first",))
    first.start()
    assert started.wait(10)
    second = threading.Thread(target=open_a, args=("second",))  # asks for the same one: waits
    second.start()
    done = threading.Event()
    threading.Thread(target=lambda: (sessions.get("b", object), done.set())).start()
    assert done.wait(5), "an open session waited for another one's opening"
    assert sessions.get("b", object) is b
    release.set()
    first.join(10)
    second.join(10)
    assert got["first"] is got["second"] and "a" in sessions


def test_a_failed_opening_is_raised_to_every_waiter_and_tried_again_later() -> None:
    sessions: OpenSessions[object] = OpenSessions(8)
    release = threading.Event()
    errors: list[BaseException] = []

    def failing() -> object:
        assert release.wait(10)
        raise OSError("store gone")

    def ask() -> None:
        try:
            sessions.get("a", failing)
        except OSError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=ask) for _ in range(3)]
    for t in threads:
        t.start()
    release.set()
    for t in threads:
        t.join(10)
    assert len(errors) == 3 and "a" not in sessions
    assert sessions.get("a", object) is not None  # the next call opens it afresh
