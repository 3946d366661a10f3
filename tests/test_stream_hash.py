"""The sha256 of a blob written in pieces (ctxrules.stores.hashing.StreamHash): hashed in the
writer's thread while small, on a helper thread once large; the same digest either way."""

from __future__ import annotations

import hashlib
import os
import random
import threading
from pathlib import Path

import pytest

import ctxrules.stores.hashing as hashing
from ctxrules.stores.filesystem import FilesystemStore
from ctxrules.stores.hashing import StreamHash
from ctxrules.vault import Vault


def _helpers() -> int:
    return sum(t.name == "ctxrules-hash" and t.is_alive() for t in threading.enumerate())


@pytest.mark.parametrize("inline", [0, 1000, 1 << 30])
def test_the_digest_is_the_sha256_of_the_pieces_in_order(monkeypatch: pytest.MonkeyPatch, inline: int) -> None:
    monkeypatch.setattr(hashing, "INLINE_BYTES", inline)
    rnd = random.Random(inline)
    pieces = [os.urandom(rnd.choice([0, 1, 100, 5000, 70_000])) for _ in range(300)]
    streamed = StreamHash()
    for piece in pieces:
        streamed.update(piece)
    assert streamed.hexdigest() == hashlib.sha256(b"".join(pieces)).hexdigest()
    assert _helpers() == 0  # the helper ended with the digest


def _held(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Every piece goes to the helper, which hashes nothing until the event is set."""
    monkeypatch.setattr(hashing, "INLINE_BYTES", 0)
    gate = threading.Event()
    run = StreamHash._run

    def held(self: StreamHash, pending: object) -> None:
        gate.wait(10)
        run(self, pending)  # type: ignore[arg-type]

    monkeypatch.setattr(StreamHash, "_run", held)
    return gate


@pytest.mark.parametrize("given", ["memoryview", "bytearray"])
def test_a_piece_the_caller_changes_afterwards_is_hashed_as_it_was(monkeypatch: pytest.MonkeyPatch, given: str) -> None:
    gate = _held(monkeypatch)  # the helper hashes nothing before the caller changed its buffer
    streamed = StreamHash()
    buffer = bytearray(b"a" * 10_000)
    streamed.update(memoryview(buffer) if given == "memoryview" else buffer)  # type: ignore[arg-type]
    buffer[:] = b"b" * 10_000
    streamed.update(memoryview(buffer)[:5])
    gate.set()
    assert streamed.hexdigest() == hashlib.sha256(b"a" * 10_000 + b"bbbbb").hexdigest()


def test_pieces_after_a_digest_go_on_into_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hashing, "INLINE_BYTES", 10)
    streamed = StreamHash()
    streamed.update(b"x" * 100)
    first = streamed.hexdigest()
    streamed.update(b"y" * 100)
    assert first == hashlib.sha256(b"x" * 100).hexdigest()
    assert streamed.hexdigest() == hashlib.sha256(b"x" * 100 + b"y" * 100).hexdigest()


def test_a_large_blob_written_in_pieces_gets_its_sha256_and_a_dropped_one_leaves_no_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hashing, "INLINE_BYTES", 64 * 1024)  # past it after a few pieces
    store = FilesystemStore(tmp_path / "state")
    vault = Vault.of(store, store.session_key("s1"))
    data = os.urandom(3 << 20)
    writer = vault.open_writer()
    for at in range(0, len(data), 100_000):
        writer.write(data[at : at + 100_000])
    assert writer.commit() == hashlib.sha256(data).hexdigest()
    assert vault.get(hashlib.sha256(data).hexdigest()) == data
    dropped = vault.open_writer()
    for at in range(0, len(data), 100_000):
        dropped.write(data[at : at + 100_000])
    dropped.discard()
    assert _helpers() == 0 and not Path(dropped.path).exists()


def test_a_piece_the_helper_cannot_hash_is_raised_not_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    # Hashed in the caller's thread, a piece hashlib refuses raises there; on the helper it must
    # not end the helper silently (the writer would wait on a full queue for ever, or get the
    # digest of part of its data).
    monkeypatch.setattr(hashing, "INLINE_BYTES", 10)
    streamed = StreamHash()
    streamed.update(b"x" * 100)
    streamed.update(memoryview(b"abcdef" * 1000)[::2])  # not contiguous: hashlib refuses it
    with pytest.raises(BufferError):  # from a later piece or from the digest: never a hang
        for _ in range(50):  # more than the queue holds
            streamed.update(b"y" * 1000)
        streamed.hexdigest()
    with pytest.raises(BufferError):  # and never a digest that leaves that piece out
        streamed.hexdigest()
    assert _helpers() == 0
