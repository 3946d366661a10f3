"""Outputs too large to hold: captured into the vault as they stream, compressed from windows.

``ctxrules compress`` keeps a command's output in memory up to :data:`SPILL_BYTES`; beyond
that, :class:`Capture` streams it into a vault entry being written (a temporary file, hashed as
it grows, see :class:`ctxrules.vault.VaultWriter`) and holds only bounded parts of it:

- the **head** and the **tail** windows (:data:`WINDOW_BYTES` each, cut at line ends): the
  rule's steps run on those lines alone, with their true line numbers;
- from the **middle**, read back from the file once the rule is known (:func:`scan_middle`;
  on a thread of its own while the rule's steps run on the windows, :func:`scan_middle_soon`),
  the lines that match one of the rule's failure patterns or the pack's exit-code patterns,
  with the lines around them the patterns protect, so the engine's rules (failure lines put
  back, the exit-code line kept; :mod:`ctxrules.compressors.apply`) still hold for the whole
  output. At most :data:`MAX_KEPT` such lines keep their text; the numbers of further matches
  are kept, and the markers count them (``failures=N``). Every other line of the middle is
  elided, and its marker points into the vault entry, which holds the exact bytes.

The middle is searched in blocks of :data:`BLOCK_BYTES`: a block of plain ASCII text goes
through RE2 first (linear time; on such text its classes mean what Python's do), which finds the
few candidate lines the patterns are then tried on one by one. Patterns RE2 cannot take, or
that look beyond the end of a line (``\\A``, ``\\Z``, lookarounds), and blocks with other
characters are searched line by line.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import contextvars
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ctxrules.compressors.failures import FailurePattern, combined_matcher
from ctxrules.compressors.lines import without_escapes
from ctxrules.errors import CtxrulesError
from ctxrules.patterns import PAST_RE2, Pattern, lines_touched, re2_module
from ctxrules.threads import helper_thread
from ctxrules.vault import VaultWriter

__all__ = [
    "BLOCK_BYTES",
    "MAX_BYTES",
    "MAX_KEPT",
    "SPILL_BYTES",
    "SPILL_LINES",
    "WINDOW_BYTES",
    "WINDOW_LINES",
    "Capture",
    "Large",
    "Middle",
    "scan_middle",
    "scan_middle_soon",
]

MAX_BYTES = 1 << 30
"""Output kept at most (``ctxrules compress --max-output``): the vault entry stops growing
there, and what comes after is not kept (:attr:`Capture.dropped`). An endless command (``yes``,
a looping test) filled the disk before; memory was bounded already."""

SPILL_BYTES = 8 * 1024 * 1024
"""Output up to this size is held in memory and compressed whole; larger output streams to
the vault and is compressed from its windows."""

WINDOW_BYTES = 1024 * 1024
"""Size of the head and of the tail window of a large output (whole lines)."""

BLOCK_BYTES = 1024 * 1024
"""How much of the middle is read and searched at a time."""

SPILL_LINES = 200_000
"""Output of more lines than this streams to the vault too, whatever its size: a line held
costs far more than its bytes once it is split (8 MB of empty lines are millions of them)."""

WINDOW_LINES = 25_000
"""The head and the tail window hold at most this many lines each, for the same reason."""

MAX_KEPT = 10_000
"""Matching lines of the middle whose text is held at most (the lines around them come on top)."""

# ASCII characters Python's \s matches and RE2's does not, and the escape that starts terminal
# sequences (lines are matched without those): a block holding one is searched line by line.
_NOT_RE2_SAFE = [c.encode("ascii") for c in PAST_RE2 + "\x1b"]  # one by one: `in` runs at memchr speed
_LOOKS_PAST_LINE = re.compile(r"\\[AZz]|\(\?<?[=!]|\[\[:")
_SCOPABLE = re.compile(r"^\(\?([imsx]+)\)")


@dataclass
class Large:
    """A captured output held in part; ``writer`` holds all of it (not yet committed)."""

    writer: VaultWriter
    size: int
    head: bytes
    """Whole lines from the start (lines 1..``head_lines``)."""
    head_lines: int
    tail: bytes
    """Whole lines from the end (lines ``tail_first``..``total_lines``)."""
    tail_first: int
    total_lines: int
    trailing: bool
    """Whether the output ends with a newline."""
    early: EarlyScan | None = None
    """The scan of the middle started while the output streamed in, when the caller offered one."""

    @property
    def vault_id(self) -> str:
        return self.writer.vault_id

    @property
    def middle(self) -> tuple[int, int]:
        """Byte range of the lines between the windows."""
        return len(self.head), self.size - len(self.tail)


class Capture:
    """Collects an output chunk by chunk: in memory up to ``limit`` bytes, then into the vault
    entry that ``open_writer`` starts (with bounded head and tail windows in memory).

    When the vault cannot be written, everything stays in memory (:attr:`error` says why), so
    the output is never lost: the caller prints it whole. With ``overflow``, only up to the
    spill limit: past it, what is held (and what reached the vault entry) goes to ``overflow``,
    and so does every later chunk (:attr:`overflowed`; the caller prints them as they come, and
    :meth:`finish` returns nothing). Held whole, a full disk mid-spill made ``compress`` hold
    the whole output, then split it into lines: gigabytes of memory for a 60 MB output.

    ``early``, when given, is called once the output spills, with the entry's path, where its
    middle starts, that line's number and the :class:`Growing` that tracks the writing; what it
    returns (a scan of the middle following the writer, see :func:`early_scan`) ends up in
    :attr:`Large.early`. The middle is then searched while the command still prints, on the
    core the capture leaves idle, instead of after it.

    ``max_bytes``: the first that many bytes are kept, the rest is counted in :attr:`dropped`
    and goes nowhere (the output then ends there, as far as the vault and the rule know).
    """

    def __init__(
        self,
        open_writer: Callable[[], VaultWriter],
        *,
        limit: int = SPILL_BYTES,
        window: int = WINDOW_BYTES,
        early: Callable[[Path, int, int, Growing], EarlyScan | None] | None = None,
        limit_lines: int = SPILL_LINES,
        window_lines: int = WINDOW_LINES,
        max_bytes: int = MAX_BYTES,
        overflow: Callable[[bytes], None] | None = None,
    ) -> None:
        if limit < 2 * window or limit_lines < 2 * window_lines:
            raise ValueError("the spill limit must hold both windows")
        if max_bytes < 1:
            raise ValueError("max_bytes must be at least 1")
        self.max_bytes = max_bytes
        self.dropped = 0
        """Bytes written after the first ``max_bytes``: not kept."""
        self._open_writer = open_writer
        self._limit = limit
        self._window = window
        self._limit_lines = limit_lines
        self._window_lines = window_lines
        self._chunks: list[bytes] = []
        self._held = 0
        self._held_lines = 0
        self._writer: VaultWriter | None = None
        self._head = b""
        # The last chunks written, at least `window` bytes of them when there are: the tail
        # window is cut from them at the end (kept as the chunks, not copied into one buffer).
        self._recent: collections.deque[bytes] = collections.deque()
        self._recent_size = 0
        self._newlines = 0
        self._last = b""
        self.size = 0
        self.error: CtxrulesError | None = None
        self._start_early = early
        self._growing: Growing | None = None
        self._early: EarlyScan | None = None
        self._overflow = overflow
        self.overflowed = False
        """Whether the output went to ``overflow`` (the vault could not be written)."""

    def write(self, chunk: bytes) -> None:
        if not chunk:
            return
        room = self.max_bytes - self.size
        if len(chunk) > room:
            self.dropped += len(chunk) - max(room, 0)
            if room <= 0:
                return
            chunk = chunk[:room]
        self.size += len(chunk)
        self._last = chunk[-1:]
        if self.overflowed:
            self._pass(chunk)
            return
        if self._writer is None:
            self._chunks.append(chunk)
            self._held += len(chunk)
            self._held_lines += newlines(chunk)
            if self._held > self._limit or self._held_lines > self._limit_lines:
                if self.error is None:
                    self._spill()
                if self.error is not None and self._overflow is not None and self._writer is None:
                    self._begin_overflow()
            return
        self._stream(chunk)

    def finish(self) -> bytes | Large:
        """The whole output (held in memory), or a :class:`Large` one; nothing when it went
        to ``overflow``."""
        if self.overflowed:
            return b""
        writer = self._writer
        if writer is None:
            data = b"".join(self._chunks)
            self._chunks = []
            return data
        # All of it is written: its way to the disk starts now, while it is compressed (a
        # writer may offer this; see ctxrules.stores.BlobWriter).
        sync_soon = getattr(writer, "sync_soon", None)
        if callable(sync_soon):
            sync_soon()
        trailing = self._last == b"\n"
        total = self._newlines + (0 if trailing else 1)
        head = self._head_window()
        tail = b"".join(self._recent)[-self._window :]
        # The window starts inside a line unless it starts the output: keep whole lines only.
        tail = tail[tail.find(b"\n") + 1 :] if b"\n" in tail[:-1] else b""
        tail_newlines = tail.count(b"\n")
        if tail_newlines > self._window_lines:  # short lines: the last window_lines of them
            end = len(tail) - 1 if trailing else len(tail)
            for _ in range(self._window_lines):
                end = tail.rfind(b"\n", 0, end)
            tail = tail[end + 1 :]
            tail_newlines = tail.count(b"\n")
        tail_first = self._newlines - tail_newlines + 1 if tail else total + 1
        if self._growing is not None:
            self._growing.finish(self.size - len(tail))  # where the middle ends
        return Large(writer, self.size, head, head.count(b"\n"), tail, tail_first, total, trailing, self._early)

    def discard(self) -> None:
        """Drop the vault entry being written (the output went out in full)."""
        self._stop_early()  # before the entry goes: the scan has it open
        if self._writer is not None:
            self._writer.discard()

    def _stop_early(self) -> None:
        if self._early is not None:
            self._early.stop()
        elif self._growing is not None:
            self._growing.stop()
        self._growing = self._early = None

    # -- internals -------------------------------------------------------------------------

    def _spill(self) -> None:
        try:
            writer = self._open_writer()
        except CtxrulesError as exc:
            self.error = exc
            return
        data = b"".join(self._chunks)
        self._chunks = []
        self._held = 0
        self._writer = writer
        self._head = data[: self._window]
        if self._start_early is not None:
            self._begin_early(writer)
        self._stream(data)

    def _begin_overflow(self) -> None:
        self.overflowed = True
        chunks, self._chunks, self._held = self._chunks, [], 0
        for chunk in chunks:
            self._pass(chunk)

    def _pass(self, data: bytes) -> None:
        if data and self._overflow is not None:
            self._overflow(data)

    def _pass_file(self, writer: VaultWriter) -> None:
        """What reached the entry being written, a block at a time."""
        left = writer.size
        with open(writer.path, "rb") as handle:
            while left > 0:
                block = handle.read(min(left, BLOCK_BYTES))
                if not block:
                    break
                left -= len(block)
                self._pass(block)

    def _begin_early(self, writer: VaultWriter) -> None:
        start = self._start_early
        assert start is not None
        head = self._head_window()  # as finish() cuts it
        growing = Growing(self._window)
        try:
            early = start(Path(writer.path), len(head), head.count(b"\n") + 1, growing)
        except Exception:  # no thread to be had, a rule that does not build: the scan comes after
            growing.stop()
            return
        if early is not None:
            self._growing, self._early = growing, early

    def _head_window(self) -> bytes:
        """The whole lines of the head window: at most ``window`` bytes, ``window_lines`` lines."""
        head = self._head
        if head.count(b"\n") <= self._window_lines:
            return head[: head.rfind(b"\n") + 1]
        end = -1
        for _ in range(self._window_lines):  # short lines: the first window_lines of them
            end = head.find(b"\n", end + 1)
        return head[: end + 1]

    def _stream(self, data: bytes) -> None:
        writer = self._writer
        assert writer is not None
        before = writer.size
        try:
            writer.write(data)
        except CtxrulesError as exc:
            # A full disk: take back what reached the file and hold everything from now on
            # (or pass it all to ``overflow``, a block at a time).
            self.error = exc
            self._writer = None
            rest = data[writer.size - before :]
            self._stop_early()  # before the entry goes: the scan has it open
            try:
                if self._overflow is not None:
                    self.overflowed = True
                    self._pass_file(writer)
                    self._pass(rest)
                    return
                written = Path(writer.path).read_bytes()[: writer.size] if writer.size else b""
            finally:
                writer.discard()
            self._chunks = [written, rest]
            self._held = len(written) + len(rest)
            return
        if self._growing is None:
            self._newlines += newlines(data)
        else:
            # Counted in marks of _MARK_BYTES: a block the scan skips holds whole marks, whose
            # counts it takes from here, and counts only its two ends again.
            sizes, counts = [], []
            size = before
            for at in range(0, len(data), _MARK_BYTES):
                piece = data[at : at + _MARK_BYTES]
                size += len(piece)
                self._newlines += newlines(piece)
                sizes.append(size)
                counts.append(self._newlines)
            self._growing.grew(sizes, counts)
        recent = self._recent
        recent.append(data)
        self._recent_size += len(data)
        while self._recent_size - len(recent[0]) >= self._window:
            self._recent_size -= len(recent.popleft())


class _Stopped(Exception):
    """The entry an early scan followed was dropped (or its scan is not wanted any more)."""


class Growing:
    """How far a vault entry being written may be read by a scan of its middle that follows
    the writer (:func:`scan_middle` with ``follow``). The capture reports each size it reached
    (:meth:`grew`), then where the middle ends (:meth:`finish`), or that the entry is gone
    (:meth:`stop`). Until the end is known the scan reads whole blocks only, and only those
    ending more than ``margin`` bytes (the tail window) before what is written: a block it
    reads then is the very block it would read with the end known, so what it finds is the
    same. It also keeps the newline counts the capture makes: a scan that skips a block
    without a match counts its lines from them instead of counting them again."""

    def __init__(self, margin: int) -> None:
        self._cond = threading.Condition()
        self._margin = margin
        self._ready = 0
        self._want = 0  # the size the waiting scan needs (no wake-up before it is reached)
        # Sizes reached, and the newlines in the file up to each (appended to only).
        self._sizes: list[int] = []
        self._newlines: list[int] = []
        self._end: int | None = None
        self._stopped = False

    def grew(self, sizes: list[int], newlines: list[int]) -> None:
        """The file now holds ``sizes[-1]`` bytes; ``newlines[i]`` of its first ``sizes[i]``
        bytes are newlines (``sizes`` ascending, after every size reported before)."""
        if not sizes:
            return
        with self._cond:
            self._sizes += sizes
            self._newlines += newlines
            self._ready = size = sizes[-1]
            if size >= self._want:
                self._cond.notify_all()

    def finish(self, end: int) -> None:
        with self._cond:
            self._end = end
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def count_newlines(self, data: bytes | bytearray, offset: int) -> int:
        """``data.count(b"\\n")`` for ``data``, the bytes of the file from ``offset`` on: the
        capture's counts for the whole pieces it wrote inside, counting only the ends."""
        end = offset + len(data)
        with self._cond:  # the capture appends to both lists under it
            sizes = self._sizes
            first = bisect.bisect_left(sizes, offset)  # the first size reached at or after offset
            last = bisect.bisect_right(sizes, end) - 1  # the last one at or before the end
            if first >= last:
                return newlines(data)
            inside = self._newlines[last] - self._newlines[first]
            first_size, last_size = sizes[first], sizes[last]
            # The scan asks about later bytes only: what lies before is not needed again
            # (the lists stay short however long the output grows).
            del sizes[:first], self._newlines[:first]
        return newlines(data[: first_size - offset]) + inside + newlines(data[last_size - offset :])

    @property
    def end(self) -> int | None:
        """Where the middle ends, once :meth:`finish` said so."""
        return self._end

    def next_read(self, pos: int, block: int) -> tuple[int, bool]:
        """(bytes to read at ``pos``, whether more follow them), once that is known."""
        with self._cond:
            while True:
                if self._stopped:
                    raise _Stopped
                if self._end is not None:
                    n = max(0, min(block, self._end - pos))
                    return n, pos + n < self._end
                if pos + block < self._ready - self._margin:
                    return block, True
                self._want = pos + block + self._margin + 1
                self._cond.wait()


class EarlyScan:
    """A scan of the middle of an entry being written (:class:`Growing`), started while the
    output streams in, for the failure and exit-code patterns of the rule the output is
    expected to get (``failures``, ``keep``); the rule chosen in the end :meth:`take` s it."""

    def __init__(
        self,
        path: Path,
        start: int,
        first_line: int,
        failures: Sequence[FailurePattern],
        keep: Sequence[Pattern],
        growing: Growing,
        *,
        block: int = BLOCK_BYTES,
    ) -> None:
        self.failures, self.keep = tuple(failures), tuple(keep)
        self._growing = growing
        self._where = (path, start, first_line, block)
        self._result = scan_middle_soon(
            path, (start, -1), first_line, self.failures, self.keep, follow=growing, block=block
        )

    def take(self, failures: Sequence[FailurePattern], keep: Sequence[Pattern]) -> Callable[[], Middle] | None:
        """The scan's result (a function that waits for it) when the rule chosen in the end
        searches for the same patterns; None, and the scan is stopped, when it does not. A
        scan that failed is done again by that function, in its caller's context (a pattern
        that timed out is remembered there), instead of handing on the failure."""
        if tuple(failures) != self.failures or tuple(keep) != self.keep:
            self.stop()
            return None
        waiting = self._result
        path, start, first_line, block = self._where
        growing = self._growing

        def result() -> Middle:
            try:
                return waiting()
            except Exception:
                end = growing.end
                if end is None:  # never finished: not a middle anyone can ask for
                    raise
                return scan_middle(path, (start, end), first_line, failures, keep, block=block)

        return result

    def stop(self) -> None:
        """Not wanted (or its result is in): the scan ends at its next block, and this waits
        for that, so that the entry is no longer open when it is committed or dropped."""
        self._growing.stop()
        with contextlib.suppress(Exception):
            self._result()


# -- the middle -----------------------------------------------------------------------------


def scan_middle(
    path: Path,
    span: tuple[int, int],
    first_line: int,
    failures: Sequence[FailurePattern],
    keep: Sequence[Pattern],
    *,
    max_kept: int = MAX_KEPT,
    block: int = BLOCK_BYTES,
    follow: Growing | None = None,
) -> tuple[dict[int, str], list[int]]:
    """The lines of bytes ``span`` of ``path`` (its first line is number ``first_line``) that
    match a failure or exit-code pattern, with the lines around them the patterns protect:
    ``({number: text}, [numbers of further matches whose text is not held])``. With
    ``follow`` the file is still being written: the span ends where ``follow`` says, once it
    knows (the end given in ``span`` is not used)."""
    kept: dict[int, str] = {}
    lost: list[int] = []
    regexes = [p.regex for p in failures]
    if not regexes and not keep:
        return kept, lost
    before = max((p.before for p in failures), default=0)
    after = max((p.after for p in failures), default=0)
    prefilter = _prefilter(tuple(r.pattern for r in regexes) + tuple(p.pattern for p in keep))
    # As failure_lines does: the pack's patterns as one bounded alternation (RE2, or `regex`
    # with a time limit) first, then each pattern (bounded too) only on the lines it finds.
    anyone = combined_matcher(tuple(regexes)) if regexes else None

    def matches(text: str) -> bool:
        plain = without_escapes(text)
        if anyone is not None and anyone.search(plain) and any(r.search(plain) for r in regexes):
            return True
        return any(p.search(text) for p in keep)

    def piece_matches(text: str) -> bool:  # a piece of a huge line: the bounded matchers only
        plain = without_escapes(text)
        return (anyone is not None and anyone.search(plain) is not None) or any(p.search(text) for p in keep)

    recent: list[tuple[int, str]] = []  # the last `before` lines of the previous block
    owed = 0  # lines still to keep after a match at the end of the previous block
    line_no = first_line
    huge_hit = False
    held = 0  # matches whose text is held; the lines around them come on top, within `room`
    room = max_kept * (1 + before + after)
    count_newlines = follow.count_newlines if follow is not None else _count_newlines
    for kind, raw, offset in _blocks(path, span, block, follow):
        if kind != "lines":  # a piece of one line too long to hold: only its number is kept
            huge_hit = huge_hit or piece_matches(raw.decode("utf-8", "replace"))
            if kind == "line-end":
                if huge_hit:
                    lost.append(line_no)
                line_no += 1
                recent, owed, huge_hit = [], 0, False
            continue
        found = _prefiltered(raw, prefilter)
        if found is not None and not found and not owed:
            # Nothing in this block can match (most of a long output): count its lines and
            # keep the last few, without decoding or splitting it all.
            count, recent = _skim(raw, before, line_no, count_newlines(raw, offset))
            line_no += count
            continue
        # Invalid UTF-8 becomes U+FFFD; a newline is never part of a multi-byte sequence,
        # so the line numbers stay those of the bytes in the vault. (A block the pre-filter
        # searched is ASCII: its matches' byte offsets are offsets in the text too.)
        lines = raw.decode("utf-8", "replace").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        for j in range(min(owed, len(lines))):
            _keep(kept, line_no + j, lines[j], room)
        owed = max(0, owed - len(lines))
        for j in range(len(lines)) if found is None else _candidates(found, lines):
            if not matches(lines[j]):
                continue
            number = line_no + j
            if held >= max_kept:
                lost.append(number)
                continue
            held += 1
            kept[number] = lines[j]
            for k in range(j - before, j):
                if k >= 0:
                    _keep(kept, line_no + k, lines[k], room)
            for n, t in recent:
                if number - before <= n:
                    _keep(kept, n, t, room)
            for k in range(j + 1, min(len(lines), j + 1 + after)):
                _keep(kept, line_no + k, lines[k], room)
            owed = max(owed, j + 1 + after - len(lines))
        recent = [(line_no + k, lines[k]) for k in range(max(0, len(lines) - before), len(lines))]
        line_no += len(lines)
    return kept, lost


Middle = tuple[dict[int, str], list[int]]
"""What :func:`scan_middle` finds: ``({number: text}, [numbers of matches not held])``."""


def scan_middle_soon(
    path: Path,
    span: tuple[int, int],
    first_line: int,
    failures: Sequence[FailurePattern],
    keep: Sequence[Pattern],
    *,
    follow: Growing | None = None,
    block: int = BLOCK_BYTES,
) -> Callable[[], Middle]:
    """:func:`scan_middle` started on a thread; the function returned waits for its result
    (or raises what it raised). Reading the file and RE2's search let go of the GIL, so the
    scan of a long middle runs while the caller's thread works on the windows. The thread
    runs in a copy of the caller's context (pattern time limits and what they remember) and is
    a daemon: an interrupted caller does not wait for it."""
    box: list[Middle] = []
    failed: list[BaseException] = []

    def work() -> None:
        try:
            box.append(scan_middle(path, span, first_line, failures, keep, follow=follow, block=block))
        except BaseException as exc:  # handed to whoever waits for the result
            failed.append(exc)

    context = contextvars.copy_context()
    thread = helper_thread(context.run, "ctxrules-middle", args=(work,))
    thread.start()

    def result() -> Middle:
        thread.join()
        if failed:
            raise failed[0]
        return box[0]

    return result


def _keep(kept: dict[int, str], number: int, text: str, limit: int) -> None:
    """Hold the text of a line around a match (when there is room; it is not a match)."""
    if number not in kept and len(kept) < limit:
        kept[number] = text


def _blocks(
    path: Path, span: tuple[int, int], block: int, follow: Growing | None = None
) -> Iterator[tuple[str, bytes | bytearray, int]]:
    """The bytes of ``span``: ``("lines", data, offset)`` pieces of about ``block`` bytes that
    end at line ends, and for a line longer than four blocks ``("line-part", data, offset)``
    pieces that overlap a little (a match across a cut is still found) and a last
    ``("line-end", data, offset)``; ``offset``: where ``data`` starts in the file."""
    start, end = span
    overlap = 4096
    with open(path, "rb") as handle:
        handle.seek(start)
        pos = start
        carry = b""
        long_line = False
        short = False  # the file ended before the span did
        while True:
            # How much to read, and whether more follows it: from the span, or from the
            # writer being followed, which answers once it knows.
            if short:
                n, more = 0, False
            elif follow is None:
                n = min(block, end - pos)
                more = pos + n < end
            else:
                n, more = follow.next_read(pos, block)
            if n <= 0 and not carry:
                break
            if n > 0 and not carry and not long_line:
                # The usual block: read once, into a buffer cut back to its last whole line;
                # the partial line after it is read again with the next block (no copies).
                buffer = bytearray(n)
                got = handle.readinto(buffer)
                if got < n:
                    del buffer[got:]
                    short, more = True, False
                cut = buffer.rfind(b"\n") + 1 if more else len(buffer)
                if cut:
                    if cut < len(buffer):
                        del buffer[cut:]
                        handle.seek(pos + cut)
                    at, pos = pos, pos + cut
                    yield "lines", buffer, at
                    continue
                pos += len(buffer)  # no whole line in it: held, as below
                carry = bytes(buffer)
                continue
            data = handle.read(n) if n > 0 else b""
            pos += len(data)
            if len(data) < n:
                short, more = True, False
            data = carry + data
            at = pos - len(data)  # where data starts in the file
            carry = b""
            if long_line:
                cut = data.find(b"\n")
                if cut == -1 and more:
                    yield "line-part", data, at
                    carry = data[-overlap:]
                    continue
                cut = len(data) if cut == -1 else cut
                yield "line-end", data[:cut], at
                long_line = False
                data = data[cut + 1 :]
                at += cut + 1
                if not data:
                    continue
            cut = data.rfind(b"\n") + 1 if more else len(data)
            if cut == 0:
                if len(data) <= 4 * block:
                    carry = data
                    continue
                long_line = True
                yield "line-part", data, at
                carry = data[-overlap:]
                continue
            carry = data[cut:]
            yield "lines", data[:cut], at


def _prefiltered(data: bytes | bytearray, prefilter: Any) -> list[Any] | None:
    """The RE2 pre-filter's matches in ``data``, or None when every line must be tried (no
    pre-filter, or text RE2 would read differently from Python's ``re``). The bytes are
    searched as they are (ASCII: the text they decode to): RE2 lets go of the GIL on bytes,
    so the windows' rule runs meanwhile, and no block is decoded only to find nothing."""
    if prefilter is None or not data.isascii() or any(c in data for c in _NOT_RE2_SAFE):
        return None
    return list(prefilter.finditer(data))


def _candidates(found: list[Any], lines: list[str]) -> list[int]:
    """Indexes of the lines of a block (``lines``) that the pre-filter's matches touch."""
    return sorted(lines_touched([m.span() for m in found], lines)) if found else []


def _count_newlines(data: bytes | bytearray, offset: int) -> int:
    return newlines(data)


def newlines(data: bytes | bytearray) -> int:
    """``data.count(b"\n")``, in half the time where lines are long: ``count`` looks at every
    byte, while ``replace`` jumps from one newline to the next and is the faster of the two
    once lines average more than about 32 bytes (slower below: 10x on empty lines). The
    first 4 KiB choose."""
    if len(data) < _SAMPLE_BYTES * 4:
        return data.count(b"\n")
    if data.count(b"\n", 0, _SAMPLE_BYTES) * _LONG_LINE > _SAMPLE_BYTES:
        return data.count(b"\n")
    return len(data) - len(data.replace(b"\n", b""))


_SAMPLE_BYTES = 4096
_MARK_BYTES = 64 * 1024  # how finely a capture followed by a scan counts newlines (Growing)
_LONG_LINE = 48  # bytes per line from which replace() is clearly the faster


def _skim(data: bytes | bytearray, keep: int, first_line: int, newlines: int) -> tuple[int, list[tuple[int, str]]]:
    """How many lines ``data`` holds (as splitting it at newlines, less a trailing empty piece,
    counts them; ``newlines``: how many it holds) and the text of its last ``keep`` lines with
    their numbers (the first is ``first_line``)."""
    trailing = data.endswith(b"\n")
    count = newlines - trailing + 1 if data else 0
    if keep <= 0 or not count:
        return count, []
    # From the end, without a copy of the block: its last `keep` lines, and the empty piece
    # after a final newline (dropped).
    pieces = data.rsplit(b"\n", keep + trailing)
    if trailing:
        pieces.pop()
    last: list[bytes | bytearray] = list(pieces[-keep:])
    start = first_line + count - len(last)
    return count, [(start + k, line.decode("utf-8", "replace")) for k, line in enumerate(last)]


@lru_cache(maxsize=64)
def _prefilter(patterns: tuple[str, ...]) -> Any:
    """One RE2 multi-line alternation of ``patterns``, or None when one of them cannot go
    (or RE2 is missing: a dependency of ctxrules, but then every block goes line by line)."""
    _re2 = re2_module()  # imported on first use, not on every CLI start
    if _re2 is None or not patterns or any(_LOOKS_PAST_LINE.search(p) for p in patterns):
        return None
    parts = []
    for pattern in patterns:
        flags = _SCOPABLE.match(pattern)
        if flags is not None:
            pattern = f"(?{flags.group(1)}:{pattern[flags.end() :]})"
        elif pattern.startswith("(?") and re.match(r"\(\?[aiLmsux]+\)", pattern):
            return None
        else:
            pattern = f"(?:{pattern})"
        parts.append(pattern)
    options = _re2.Options()
    options.log_errors = False
    try:
        return _re2.compile("(?m)" + "|".join(parts), options)
    except Exception:  # not RE2 syntax: line by line
        return None
