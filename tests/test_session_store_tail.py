"""``last_output.jsonl`` after a turn that changed only its last messages (a cache breakpoint
that moves on with each call, on Anthropic models): the file is rewritten from the first
changed line, in place, and holds exactly what a whole rewrite would have written."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
from pathlib import Path
from typing import Any

from ctxrules.session_store import SessionStore


def _line(message: dict[str, Any]) -> bytes:
    return json.dumps(message, ensure_ascii=False).encode("utf-8") + b"\n"


def _check(store: SessionStore, path: Path, state: dict[str, Any], output: list[dict[str, Any]]) -> None:
    raw = store.output_file.read_bytes()
    assert raw == b"".join(_line(m) for m in output)
    last = state["last"]
    assert last["output_digest"] == hashlib.sha256(raw).hexdigest()
    assert last["output_file"][1] == len(raw)
    # Another process reads the same output back through the state's size and digest.
    fresh = SessionStore(path)
    assert fresh.load_output(len(output), last["output_file"], last["output_digest"]) == output


def _marked(message: dict[str, Any]) -> dict[str, Any]:
    text = message["content"]
    return {**message, "content": [{"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}]}


def test_a_breakpoint_moving_on_rewrites_the_tail_in_place(tmp_path: Path) -> None:
    path = tmp_path / "s"
    store = SessionStore(path)
    plain = [{"role": "user" if i % 2 else "assistant", "content": f"message {i} ü"} for i in range(300)]
    output = [*plain[:100], _marked(plain[100])]
    state: dict[str, Any] = {}
    store.save(state, output)
    _check(store, path, state, output)
    inode = os.stat(store.output_file).st_ino
    for n in range(101, 160):
        # The last output's marked message goes back to plain, the new last one is marked.
        output = [*output[:-1], plain[n - 1], plain[n], _marked(plain[n + 1])][: n + 2]
        state = {}
        store.save(state, output)
        _check(store, path, state, output)
        # In place: a whole rewrite renames a new file over the old one.
        assert os.stat(store.output_file).st_ino == inode, n


def test_a_change_far_back_rewrites_the_whole_file(tmp_path: Path) -> None:
    path = tmp_path / "s"
    store = SessionStore(path)
    output = [{"role": "user", "content": f"m{i}"} for i in range(200)]
    store.save({}, output)
    inode = os.stat(store.output_file).st_ino
    output = [{"role": "user", "content": "summary"}, *output[150:]]
    state: dict[str, Any] = {}
    store.save(state, output)
    _check(store, path, state, output)
    assert os.stat(store.output_file).st_ino != inode


def test_random_turns_keep_file_and_digest_exact(tmp_path: Path) -> None:
    """Appends, tails replaced at any depth, shorter outputs, the same output again."""
    rng = random.Random(11)
    path = tmp_path / "s"
    store = SessionStore(path)
    output: list[dict[str, Any]] = []
    for turn in range(400):
        move = rng.randrange(6)
        if move <= 1 or not output:
            output = [
                *output,
                *(
                    {"role": "user", "content": f"t{turn}.{k}" * rng.randrange(1, 4)}
                    for k in range(rng.randrange(1, 4))
                ),
            ]
        elif move == 2:  # a message replaced a little or far back
            i = max(0, len(output) - 1 - rng.choice([0, 1, 2, 5, 31, 32, 33, 60]))
            output = [*output[:i], {"role": "assistant", "content": f"new {turn}"}, *output[i + 1 :]]
        elif move == 3:  # shorter
            output = output[: rng.randrange(len(output) + 1)]
        elif move == 4:  # the tail replaced and grown
            i = max(0, len(output) - rng.randrange(1, 40))
            output = [*output[:i], *({"role": "tool", "content": f"r{turn}.{k}"} for k in range(rng.randrange(0, 5)))]
        state: dict[str, Any] = {}
        store.save(state, output)
        _check(store, path, state, output)


def test_a_file_changed_behind_the_store_is_rewritten_whole(tmp_path: Path) -> None:
    path = tmp_path / "s"
    store = SessionStore(path)
    output = [{"role": "user", "content": f"m{i}"} for i in range(50)]
    store.save({}, output)
    with open(store.output_file, "ab") as fh:
        fh.write(b'{"role": "user", "content": "planted"}\n')
    output = [*output[:-1], {"role": "user", "content": "changed"}]
    state: dict[str, Any] = {}
    store.save(state, output)
    _check(store, path, state, output)


def test_a_save_that_cannot_write_its_lines_leaves_the_last_output_readable(tmp_path: Path) -> None:
    """The file was cut at the first changed line before the new lines were made: a line that
    cannot be written (a lone surrogate from a stage's bad data) lost the output the state on
    disk still described."""
    path = tmp_path / "s"
    store = SessionStore(path)
    output = [{"role": "user", "content": f"m{i}"} for i in range(10)]
    store.save({}, output)
    output = [*output, {"role": "user", "content": "tail"}]
    state: dict[str, Any] = {}
    store.save(state, output)
    with contextlib.suppress(UnicodeEncodeError):
        store.save(dict(state), [*output[:-1], {"role": "user", "content": "bad \ud800"}])
    fresh = SessionStore(path)
    last = fresh.load()["last"]
    assert fresh.load_output(len(output), last["output_file"], last["output_digest"]) == output
