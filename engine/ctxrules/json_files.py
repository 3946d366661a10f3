"""A JSON file from outside (a message file, a transcript) read within the limits of
:mod:`ctxrules.json_limits`: every error names the file, and the line and column or the JSON
pointer of the value at fault."""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import sys
from typing import Any

from ctxrules.errors import UsageError
from ctxrules.printable import printable

__all__ = ["STDIN_CLOSED", "input_stat", "parse_json", "read_json", "stdin_binary"]

STDIN_CLOSED = "standard input is closed: there is nothing to read for `-`"


def stdin_binary() -> Any:
    """Standard input's bytes, for a file argument ``-``: a usage error when the process
    started with it closed (``<&-``: Python's ``sys.stdin`` is None, and reading it was an
    internal error). A descriptor open only for writing fails at the read (``EBADF``): the
    caller's ``OSError`` handling says so."""
    if sys.stdin is None:
        raise UsageError(STDIN_CLOSED)
    return sys.stdin.buffer


def input_stat(fd: int, name: str) -> os.stat_result:
    """``fstat`` of an opened input file: a usage error unless it is a regular file or a pipe
    (FIFO, socket). A device such as /dev/zero never ends: read whole it filled the memory, or
    the vault until the disk was full."""
    st = os.fstat(fd)
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), name)
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode)):
        raise UsageError(f"{name}: not a regular file")
    return st


def read_json(path: str) -> Any:
    """Parse a JSON file (or stdin for ``-``); errors name the file, line and column, or the
    JSON pointer of the value at fault.

    Refused: a file over :data:`~ctxrules.json_limits.MAX_INPUT_BYTES`, anything that is not
    a regular file or a pipe (a FIFO is read like stdin, up to the same limit), ``NaN`` and
    ``Infinity`` (not JSON), nesting deeper than :data:`~ctxrules.json_limits.MAX_DEPTH` and
    integers of more than :data:`~ctxrules.json_limits.MAX_INT_DIGITS` digits, an object
    that names a key twice (JSON leaves which counts open). Lone
    surrogates (``"\\ud800"``, valid JSON text but not encodable) are replaced with U+FFFD,
    with a warning on stderr naming where (control characters and bidirectional marks in the
    keys it quotes shown as their escapes).
    """
    from ctxrules.json_limits import MAX_INPUT_BYTES

    name = "<stdin>" if path == "-" else path
    limit = MAX_INPUT_BYTES
    try:
        if path == "-":
            raw = stdin_binary().read(limit + 1)
        else:
            with open(path, "rb") as fh:
                st = input_stat(fh.fileno(), name)
                if st.st_size > limit:
                    raise UsageError(f"{name}: {st.st_size} bytes is over the {_mb(limit)} limit for a message file")
                # read(n) allocates n bytes up front: ask for what the file holds (+1 to see
                # a file that grew past the limit meanwhile), not for the limit.
                raw = fh.read(min(limit, st.st_size) + 1 if stat.S_ISREG(st.st_mode) else limit + 1)
    except FileNotFoundError:
        raise UsageError(f"{name}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{name}: is a directory, expected a JSON file") from None
    except OSError as exc:
        raise UsageError(f"{name}: cannot read: {exc.strerror}") from None
    if len(raw) > limit:
        raise UsageError(f"{name}: over the {_mb(limit)} limit for a message file")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{name}: not UTF-8 (byte {exc.start})") from None
    del raw  # not needed while parsing (a 50 MB file would be held three times)
    return parse_json(text, name)


def parse_json(text: str, name: str) -> Any:
    """The JSON document ``text`` read from the file ``name``, with :func:`read_json`'s checks
    and errors (``UsageError`` naming ``name`` and the line and column or JSON pointer)."""
    from ctxrules.json_limits import MAX_DEPTH, MAX_INT_DIGITS, NonFinite, pointer, scan, short_pointer

    try:
        data = json.loads(text, parse_constant=NonFinite, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{name}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None
    except _DuplicateKey:
        try:
            at, key = _first_duplicate(text)
            said = f"{short_pointer(at)}: the key {json.dumps(key)} appears"
        except (RecursionError, ValueError):  # what lies past the duplicate nests too deep, ...
            said = "a key appears"
        raise UsageError(
            printable(f"{name}: {said} twice in one object") + " (JSON leaves which one counts open: say it once)"
        ) from None
    except RecursionError:
        opens = _too_deep_at(text, MAX_DEPTH)
        located = f"{name}:{_line_col(text, opens)}" if opens is not None else name
        raise UsageError(f"{located}: invalid input: nested too deep (more than {MAX_DEPTH} levels)") from None
    except ValueError:  # the one other error json.loads raises: Python's integer digit limit
        raise UsageError(f"{name}: invalid input: an integer literal of more than {MAX_INT_DIGITS} digits") from None
    found = scan(data)
    if found.problems:
        first = found.problems[0]
        raise UsageError(f"{name}: {short_pointer(first.path)}: {first.detail}")
    for where in found.replaced:
        # The pointer quotes the data's keys: escape sequences in one are shown, not acted on.
        shown = printable(f"{name}: {pointer(where)}")
        sys.stderr.write(f"ctxrules: warning: {shown}: a lone surrogate was replaced with U+FFFD\n")
    return found.value


# A JSON string (escapes included) or a bracket: what decides the nesting depth of a document.
_NESTING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)


def _too_deep_at(text: str, limit: int) -> int | None:
    """The offset of the bracket that opens level ``limit + 1`` of ``text`` (None when none
    does): where a document too deep for the parser is located for its error message."""
    depth = 0
    for match in _NESTING.finditer(text):
        char = match.group()
        if char in "[{":
            depth += 1
            if depth > limit:
                return match.start()
        elif char in "]}":
            depth -= 1
    return None


def _line_col(text: str, offset: int) -> str:
    """``line:column`` of ``offset`` in ``text``, both from 1 (as the JSON parser's errors)."""
    line = text.count("\n", 0, offset) + 1
    column = offset - text.rfind("\n", 0, offset)
    return f"{line}:{column}"


def _mb(n: int) -> str:
    return f"{n // (1024 * 1024)} MiB"


class _DuplicateKey(Exception):
    """An object of the file names one key twice."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json.loads keeps the last of two equal keys: {"messages": [...], "messages": []} would run
    # on nothing, and two "content" keys would drop one text without a word.
    out = dict(pairs)
    if len(out) != len(pairs):
        raise _DuplicateKey
    return out


class _Pairs(list[tuple[str, Any]]):
    """An object as parsed, every key kept (to find the duplicate)."""


def _first_duplicate(text: str) -> tuple[tuple[str | int, ...], str]:
    """The JSON path of the first object (depth first, in document order) that names a key
    twice, and the key: read again only on this error path, every pair kept."""
    from ctxrules.json_limits import NonFinite

    root = json.loads(text, parse_constant=NonFinite, object_pairs_hook=_Pairs)
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(root, ())]
    while stack:  # no recursion: the file may nest as deep as the parser went
        value, path = stack.pop()
        if isinstance(value, _Pairs):
            seen: set[str] = set()
            for key, _item in value:
                if key in seen:
                    return path, key
                seen.add(key)
            stack.extend((item, (*path, key)) for key, item in reversed(value))
        elif isinstance(value, list):
            stack.extend((item, (*path, i)) for i, item in reversed(list(enumerate(value))))
    return (), ""
