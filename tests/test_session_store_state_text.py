"""state.json as a session store writes it turn after turn: its text keeps the strings of the
last state (ctxrules.session_store._Escapes) and escapes a long string that grew by appending
for its new end only. Whatever it kept, every save must write exactly what a fresh
``json.dumps(state, ensure_ascii=False, sort_keys=True)`` writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ctxrules.session_store import SessionStore, _state_encoder

# Every character JSON escapes and characters it passes through; a lone surrogate (which
# the text holds, and UTF-8 cannot: the save refuses it, as it always did).
_ODD = '"\\\n\t\x00\x1f\x7f é€😀/'
_SURROGATE = "\ud800"


def _expected(state: dict[str, Any]) -> str:
    return json.dumps(state, ensure_ascii=False, sort_keys=True)


def _states(odd: str = _ODD) -> list[dict[str, Any]]:
    """States as a session's turns make them: long strings that grow by appending (one with
    characters to escape right where the old one ended), one rewritten from its middle, one
    cut short, one that starts over with the same length, short strings that come and go."""
    history, counts = "", ""
    out: list[dict[str, Any]] = []
    for turn in range(40):
        history += f"{turn:016x}"
        counts += f"{turn * 7},"
        if turn == 10:
            history += odd  # the escapes land at the end, the next turn appends after them
        if turn == 20:
            history = history[:100] + "X" + history[101:]  # rewritten in the middle
        if turn == 25:
            counts = counts[: len(counts) // 2]  # shorter than the one escaped before
        if turn == 30:
            history = "f" * len(history)  # the same length, other characters
        out.append(
            {
                "stages": {
                    "cache": {"prefix": {"history": history, "history_start": 3}, "last_clock": turn + 0.5},
                    "outputs": {"sent": [f"{i:032x}" for i in range(turn % 7)]},
                    f"stage_{turn % 3}": {"note": odd * (turn % 2)},
                },
                "last": {"output_counts": counts, "count": turn},
                "fingerprint_parts": {"plugins": "p;" * 300, "model": "gpt-4o"},
                "odd": odd * turn,
            }
        )
    return out


def test_each_state_text_is_the_text_of_a_fresh_dump() -> None:
    text = _state_encoder()
    for state in _states(_ODD + _SURROGATE):
        assert text(state) == _expected(state)


def test_a_long_string_that_grew_is_escaped_like_the_whole() -> None:
    text = _state_encoder()
    base = "a" * 300
    for tail in ("", "b", _ODD, _SURROGATE, '"', "\\", "\n" * 3, "é" * 5):
        grown = base + tail
        assert text({"s": base}) == _expected({"s": base})
        assert text({"s": grown}) == _expected({"s": grown}), repr(tail)


def test_many_short_strings_past_the_memo_bound_stay_right() -> None:
    text = _state_encoder()
    for n in range(3):
        state = {"sent": [f"{n}-{i}-{_ODD}" for i in range(3000)]}
        assert text(state) == _expected(state)


def test_saved_state_files_match_a_fresh_dump_turn_after_turn(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "s")
    output: list[dict[str, Any]] = []
    for n, state in enumerate(_states()):
        output = [*output, {"role": "user", "content": f"turn {n}"}]
        saved = json.loads(json.dumps(state))  # the store changes the dict it is given
        store.save(saved, output)
        raw = store.state_file.read_bytes().decode("utf-8")
        assert raw == _expected(saved)
        # A store that starts afresh (another process) reads back the same state.
        assert SessionStore(tmp_path / "s").load() == json.loads(raw)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 10**30, True, None, 1.5e-7])
def test_values_other_than_strings_are_written_as_before(value: Any) -> None:
    state = {"v": value, "s": "x" * 400, "k": [value, "y"]}
    assert _state_encoder()(state) == _expected(state)


def test_a_string_too_long_to_keep_is_escaped_whole_each_time() -> None:
    from ctxrules.json_stream import LONG_STRING

    text = _state_encoder()
    huge = "h" * LONG_STRING + _ODD
    for state in ({"s": huge}, {"s": huge + "more"}, {"s": huge + "more" + _ODD}):
        assert text(state) == _expected(state)
