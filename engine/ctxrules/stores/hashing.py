"""The sha256 of a blob written in pieces: in the writer's thread while it is small, on a helper
thread once it is large.

A fast command's output streams into the vault at hundreds of MB/s (``ctxrules compress --
cat big.log``); its sha256, the blob's id, costs as much CPU as copying it into the file. Past
:data:`INLINE_BYTES` the pieces go to a helper thread that hashes them (hashlib lets go of the
GIL on large pieces) while the writer reads and writes the next ones; the hash is waited for
only when the id is asked for, once everything is written.
"""

from __future__ import annotations

import hashlib
import threading
from typing import TYPE_CHECKING

from ctxrules.threads import helper_thread

if TYPE_CHECKING:  # imported when a blob first grows past INLINE_BYTES (not by every CLI verb)
    import queue

__all__ = ["INLINE_BYTES", "StreamHash"]

INLINE_BYTES = 4 * 1024 * 1024
"""Up to this many bytes the pieces are hashed in the writer's thread (no thread for the
usual small blob)."""
_QUEUED = 8  # pieces waiting for the helper at most: the writer waits beyond (bounded memory)


class StreamHash:
    """``update`` with the pieces in order, then :meth:`hexdigest`: the sha256 of them all."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self._size = 0
        self._queue: queue.Queue[bytes | memoryview | None] | None = None
        self._thread: threading.Thread | None = None
        self._failed: BaseException | None = None

    def update(self, data: bytes | memoryview) -> None:
        if self._failed is not None:
            raise self._failed
        if self._queue is None:
            self._size += len(data)
            if self._size <= INLINE_BYTES or not self._start():
                self._hash.update(data)
                return
        assert self._queue is not None
        if not isinstance(data, bytes) and not (isinstance(data, memoryview) and isinstance(data.obj, bytes)):
            data = bytes(data)  # the caller may change a bytearray once this returns
        self._queue.put(data)

    def hexdigest(self) -> str:
        """The sha256 of every piece so far (waits for the helper to hash what it was given)."""
        self.close()
        return self._hash.hexdigest()

    def close(self) -> None:
        """Let the helper finish and end (harmless when there is none); later pieces start
        another. What the helper failed with (a piece it could not hash) is raised here, as
        it would have been by :meth:`update` in the writer's thread."""
        pending, thread = self._queue, self._thread
        if pending is not None and thread is not None:
            self._queue = self._thread = None
            pending.put(None)
            thread.join()
        if self._failed is not None:  # for good: the digest would leave that piece out
            raise self._failed

    def _start(self) -> bool:
        import queue

        pending: queue.Queue[bytes | memoryview | None] = queue.Queue(maxsize=_QUEUED)
        thread = helper_thread(self._run, "ctxrules-hash", args=(pending,))
        try:
            thread.start()
        except RuntimeError:  # no thread to be had: hashed here, as a small blob is
            return False
        self._queue, self._thread = pending, thread
        return True

    def _run(self, pending: queue.Queue[bytes | memoryview | None]) -> None:
        # After a failure the pieces are still taken (the writer never waits on a full queue)
        # but no longer hashed: the digest would be wrong, and close() raises instead.
        while (piece := pending.get()) is not None:
            if self._failed is None:
                try:
                    self._hash.update(piece)
                except BaseException as exc:  # handed to close()
                    self._failed = exc
