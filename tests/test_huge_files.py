"""Files of gigabytes where ctxrules reads (a vault item, a session archive), whole or damaged:
read a block at a time, damage refused in one line with exit 2 before anything is printed or
written, and the peak memory of the process far below the file's size.

The huge files are sparse (``os.truncate``): gigabytes claimed, no disk used, cheap to read.
The peak memory is the child's ``ru_maxrss``, taken by a wrapper process of its own so that
no other child of the test run counts.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_kit import ENGINE

from ctxrules.stores import StoreUsageError
from ctxrules.stores.archive import ArchiveFile, export_session, import_session
from ctxrules.stores.filesystem import FilesystemStore
from ctxrules.stores.memory import MemoryStore
from ctxrules.vault import Vault

MB = 1 << 20
PEAK_BOUND = 200 * MB

# Runs the command given and prints the peak resident size of its process, in bytes (Linux
# counts ru_maxrss in KiB, macOS in bytes).
_PEAK = (
    "import resource, subprocess, sys\n"
    "proc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)\n"
    "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
    "print(proc.returncode, peak * (1 if sys.platform == 'darwin' else 1024))\n"
    "sys.stdout.write(proc.stderr)\n"
)


def ctxrules_peak(*argv: str, cwd: Path) -> tuple[int, int, str]:
    """(exit code, peak RSS in bytes, stderr) of ``ctxrules ARGV`` (of ``sh -c ...`` as it is),
    its stdout discarded."""
    command = list(argv) if argv[0] == "sh" else [sys.executable, "-m", "ctxrules.cli.main", *argv]
    proc = subprocess.run(
        [sys.executable, "-c", _PEAK, *command],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": ENGINE},
        capture_output=True,
        text=True,
        timeout=600,
    )
    first, _, stderr = proc.stdout.partition("\n")
    code, peak = first.split()
    return int(code), int(peak), stderr


def _zeros_id(size: int) -> str:
    digest, block = hashlib.sha256(), bytes(MB)
    for _ in range(size // MB):
        digest.update(block)
    return digest.hexdigest()


def test_vault_get_refuses_a_damaged_item_of_gigabytes_in_bounded_memory(tmp_path: Path) -> None:
    """An item damaged to claim 4 GiB (a sparse file) was read whole before its digest was
    checked: gigabytes of memory, or the OOM killer. It is checked a block at a time now."""
    session = tmp_path / "state" / "s"
    item = Vault.of(FilesystemStore(tmp_path / "state"), str(session)).put_text("line\n" * 1000)
    path = session / "vault" / item[:2] / item
    os.truncate(path, 4 << 30)
    for ident in (item, f"vault://{item[:12]}#L2-L3"):
        code, peak, stderr = ctxrules_peak("vault", "get", ident, "--session", str(session), cwd=tmp_path)
        assert code == 2, stderr
        assert stderr.startswith(f"ctxrules: error: vault entry {item} is corrupt: its content hashes to ")
        assert stderr.endswith(f" ({path})\n") and stderr.count("\n") == 1
        assert peak < PEAK_BOUND, f"peak RSS {peak / MB:.0f} MB"


def test_vault_get_prints_an_item_of_a_gigabyte_in_bounded_memory(tmp_path: Path) -> None:
    """An intact item larger than memory allows (``compress`` of a huge output) was held whole
    by ``vault get``: now it is copied a block at a time, a line range too."""
    session = tmp_path / "state" / "s"
    vault = Vault.of(FilesystemStore(tmp_path / "state"), str(session))
    size = 1 << 30
    item = _zeros_id(size)
    writer = vault.open_writer()
    writer.write(b"")
    writer.discard()
    (session / "vault" / item[:2]).mkdir(mode=0o700)
    path = session / "vault" / item[:2] / item
    path.touch(mode=0o600)
    os.truncate(path, size)  # a gigabyte of zeros, named by its sha256: an intact item
    code, peak, stderr = ctxrules_peak("vault", "get", item[:12], "--session", str(session), cwd=tmp_path)
    assert (code, stderr) == (0, "")
    assert peak < PEAK_BOUND, f"peak RSS {peak / MB:.0f} MB"
    code, peak, stderr = ctxrules_peak("vault", "get", item, "--lines", "1:1", "--session", str(session), cwd=tmp_path)
    assert (code, stderr) == (0, "")
    assert peak < PEAK_BOUND, f"peak RSS {peak / MB:.0f} MB"


def test_reading_a_damaged_item_of_gigabytes_through_the_api_is_bounded_too(tmp_path: Path) -> None:
    """``Vault.get`` (recall, ``sessions export``) checks an item larger than 64 MiB a block
    at a time before reading it whole: a damaged one claiming 4 GiB is refused, not held."""
    session = tmp_path / "state" / "s"
    item = Vault.of(FilesystemStore(tmp_path / "state"), str(session)).put_text("line\n" * 1000)
    os.truncate(session / "vault" / item[:2] / item, 4 << 30)
    probe = (
        "import sys\nfrom ctxrules.vault import Vault, VaultError\n"
        "try:\n    Vault.for_session(sys.argv[1]).get(sys.argv[2])\n"
        "except VaultError as exc:\n    sys.exit(str(exc))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", _PEAK, sys.executable, "-c", probe, str(session), item],
        env={**os.environ, "PYTHONPATH": ENGINE},
        capture_output=True,
        text=True,
        timeout=600,
    )
    first, _, stderr = proc.stdout.partition("\n")
    code, peak = map(int, first.split())
    assert code == 1 and f"vault entry {item} is corrupt" in stderr, stderr
    assert peak < PEAK_BOUND, f"peak RSS {peak / MB:.0f} MB"


def _write_archive(path: Path, item_size: int) -> str:
    """An archive as ``sessions export`` writes it, of one session whose vault holds an item of
    ``item_size`` zero bytes (written a chunk at a time: never whole in memory); the item's id."""
    item = _zeros_id(item_size)
    digest = hashlib.sha256()
    with path.open("wb") as out:

        def put(line: bytes) -> None:
            digest.update(line)
            out.write(line)

        put(b'{"format": "ctxrules-session", "version": 1, "session": "big", "from": "file:///x", "exported": 0}\n')
        put(b'{"kind": "turn", "state": {"version": 1}, "output": null}\n')
        head = f'{{"kind": "blob", "id": "{item}", "media_type": null, "data": "'.encode()
        digest.update(head)
        out.write(head)
        chunk = base64.b64encode(bytes(3 * MB))
        for _ in range(item_size // (3 * MB)):
            digest.update(chunk)
            out.write(chunk)
        rest = base64.b64encode(bytes(item_size % (3 * MB))) + b'"}\n'
        put(rest)
        put(b'{"kind": "ledger", "lines": []}\n')
        end = {"kind": "end", "blobs": 1, "docs": 0, "ledger": 0, "turns": 1, "secrets": 0}
        out.write(json.dumps({**end, "sha256": digest.hexdigest()}).encode() + b"\n")
    return item


def test_sessions_import_reads_an_archive_claiming_gigabytes_in_bounded_memory(tmp_path: Path) -> None:
    """``sessions import`` read the archive whole: a sparse file claiming 4 GiB took that
    memory, for an exit 2. It reads a line at a time now, and a line that cannot parse no
    further than it must; so does an archive extended with gigabytes of NULs after its end."""
    (tmp_path / "sparse.ctxs").touch()
    os.truncate(tmp_path / "sparse.ctxs", 4 << 30)
    _write_archive(tmp_path / "grown.ctxs", 3 * MB)
    with (tmp_path / "grown.ctxs").open("ab") as grown:
        grown.truncate(4 << 30)
    for name, line, why in [("sparse.ctxs", 1, "Expecting value"), ("grown.ctxs", 6, "Expecting value")]:
        code, peak, stderr = ctxrules_peak("sessions", "import", name, "--state", "B", "--session", "B/s", cwd=tmp_path)
        assert code == 2, stderr
        assert stderr.startswith(f"ctxrules: error: [CR146] {name}:{line}: not a ctxrules session archive line ({why}")
        assert stderr.count("\n") == 1
        assert peak < PEAK_BOUND, f"{name}: peak RSS {peak / MB:.0f} MB"
        assert not (tmp_path / "B" / "s").exists()


_HEADER = b'{"format": "ctxrules-session", "version": 1, "session": "big", "from": "file:///x", "exported": 0}\n'
_BLOB_START = b'{"kind": "blob", "id": "' + b"0" * 64 + b'", "media_type": null, "data": "'


@pytest.mark.parametrize(
    ("start", "what", "bound"),
    [
        (b'{"kind": "turn", "state": {"x": "', "a turn record", 576),
        (b'{"kind": "doc", "name": "notes", "data": "', "a document", 342),
        (b'{"kind": "ledger", "lines": ["', "the session ledger", 256),
        (_BLOB_START, "a vault item it cannot stream", 342),
        (b'{"kind": "end", "blobs": 0, "x": "', "the end record", 1),
        (b'{"x": "', "any record", 576),
    ],
)
def test_sessions_import_refuses_a_line_longer_than_export_writes_without_reading_it(
    tmp_path: Path, start: bytes, what: str, bound: int
) -> None:
    """A line that was not a well-formed vault item was read whole when its first megabyte
    parsed so far (a string still open): 2 MiB of text and then gigabytes of NULs (a sparse
    file) took their size in memory. Each line is bounded by what export writes for its kind
    now (the stores' caps), and one past that is refused, naming it, read no further."""
    path = tmp_path / "long.ctxs"
    with path.open("wb") as out:
        out.write(_HEADER + start + b"a" * (2 * MB))
        out.truncate(4 << 30)
    code, peak, stderr = ctxrules_peak(
        "sessions", "import", "long.ctxs", "--state", "B", "--session", "B/s", cwd=tmp_path
    )
    assert (code, stderr) == (
        2,
        f"ctxrules: error: [CR146] {path.name}:2: not a ctxrules session archive line (longer than {bound} MiB, "
        f"more than sessions export writes for {what})\n",
    )
    assert peak < PEAK_BOUND, f"peak RSS {peak / MB:.0f} MB"
    assert not (tmp_path / "B" / "s").exists()


@pytest.mark.parametrize("chunk", [8, 64, 1 << 20])
def test_a_line_as_long_as_its_bound_is_read_one_longer_is_refused(chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound is the line's length without its line end, from a file and a pipe alike: a
    line of exactly that many bytes is parsed as before (here: a turn record the end record
    does not count), one byte more is refused."""
    import ctxrules.stores.archive as archive

    monkeypatch.setattr(archive, "_CHUNK", chunk)
    monkeypatch.setitem(archive._LINE_MAX, b"turn", (3 * MB, "a turn record"))
    for newline in (b"\n", b"\r\n"):
        head = b'{"kind": "turn", "state": {"x": "'
        at_bound = head + b"a" * (3 * MB - len(head) - 3) + b'"}}'
        assert len(at_bound) == 3 * MB
        for line, verdict in [
            (at_bound, "a:4: the end record counts 1 turn record(s), the archive holds 2"),
            (at_bound[:-3] + b'a"}}', "a:3: not a ctxrules session archive line (longer than 3 MiB, more than"),
        ]:
            lines = [_HEADER, b'{"kind": "turn", "state": {}, "output": null}\n', line + newline]
            lines.append(b'{"kind": "end", "blobs": 0, "docs": 0, "ledger": 0, "turns": 1, "secrets": 0}\n')
            data = b"".join(lines)
            for handle in (io.BytesIO(data), io.BufferedReader(_Pipe(data))):
                with pytest.raises(StoreUsageError) as caught, ArchiveFile(handle, "a") as streamed:
                    import_session(MemoryStore(), "t", streamed, where="a")
                assert str(caught.value).startswith(f"[CR146] {verdict}"), (chunk, newline, str(caught.value))


@pytest.mark.parametrize("kind", [b"turn", b"ledger", b"blob"])
def test_export_refuses_a_record_import_would_refuse_as_too_long(kind: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    """Export wrote any record, whatever its length; import refuses one past its kind's bound
    (a turn over 576 MiB, a ledger over 256 MiB), so such an archive could never be read back:
    lost, for a user who removed the session after exporting it. Export refuses it now (CR146,
    naming the record), before the rest is written. A vault item that streams has no bound,
    one that does not (an unusual media type) has its own."""
    import ctxrules.stores.archive as archive
    from ctxrules.stores.base import Log

    bound = 4096
    monkeypatch.setitem(archive._LINE_MAX, kind, (bound, archive._LINE_MAX[kind][1]))
    source = MemoryStore()
    vault = Vault.of(source, "s")
    vault.put_bytes(b"x" * (2 * bound))  # a record that streams: exported at any length
    out = io.BytesIO()
    export_session(source, "s", out, name="s")
    with ArchiveFile(io.BytesIO(out.getvalue()), "a") as archive_file:
        import_session(MemoryStore(), "t", archive_file, where="a")
    if kind == b"turn":
        source.commit_turn("s", {"big": "y" * (2 * bound)}, [])
    elif kind == b"ledger":
        source.append([Log("session", "s")], {"call": "z" * (2 * bound)})
    else:
        vault.put_bytes(b"w" * (2 * bound), "image/x weird")  # not a media type that streams
    with pytest.raises(StoreUsageError) as caught:
        export_session(source, "s", io.BytesIO(), name="s")
    what = archive._LINE_MAX[kind][1]
    assert str(caught.value).startswith(f"[CR146] cannot export s: {what} would take"), str(caught.value)


def test_export_and_import_agree_on_a_line_at_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """A turn record exactly as long as its bound is exported and imported; with a bound one
    byte shorter export refuses the session, as import refuses the archive written before."""
    import ctxrules.stores.archive as archive

    monkeypatch.setattr(archive, "_CHUNK", 64)  # import measures a line past one chunk
    source = MemoryStore()
    source.commit_turn("s", {"note": "y" * 5000}, [{"role": "user", "content": "hi"}])
    out = io.BytesIO()
    export_session(source, "s", out, name="s")
    data = out.getvalue()
    turn = next(line for line in data.splitlines() if line.startswith(b'{"kind": "turn"'))
    monkeypatch.setitem(archive._LINE_MAX, b"turn", (len(turn), "a turn record"))
    export_session(source, "s", io.BytesIO(), name="s")
    with ArchiveFile(io.BytesIO(data), "a") as streamed:
        import_session(MemoryStore(), "t", streamed, where="a")
    monkeypatch.setitem(archive._LINE_MAX, b"turn", (len(turn) - 1, "a turn record"))
    with pytest.raises(StoreUsageError, match="cannot export s: a turn record"):
        export_session(source, "s", io.BytesIO(), name="s")
    with pytest.raises(StoreUsageError, match="longer than"), ArchiveFile(io.BytesIO(data), "a") as streamed:
        import_session(MemoryStore(), "u", streamed, where="a")


def test_sessions_import_streams_a_vault_item_larger_than_memory_allows(tmp_path: Path) -> None:
    """An intact archive whose vault item is 256 MiB (a 342 MB line of base64) was held whole,
    decoded whole: well over a gigabyte. The item is decoded, checked and written a chunk at a
    time now, from a file and from a pipe alike, and arrives intact."""
    item = _write_archive(tmp_path / "big.ctxs", 256 * MB)
    code, peak, stderr = ctxrules_peak(
        "sessions", "import", "big.ctxs", "--state", "B", "--session", "B/s", cwd=tmp_path
    )
    assert (code, stderr) == (0, "")
    assert peak < PEAK_BOUND, f"peak RSS {peak / MB:.0f} MB"
    code, peak, stderr = ctxrules_peak(
        "sh",
        "-c",
        f"cat big.ctxs | {sys.executable} -m ctxrules.cli.main sessions import - --state B --session B/p",
        cwd=tmp_path,
    )
    assert (code, stderr) == (0, "")
    assert peak < PEAK_BOUND, f"peak RSS {peak / MB:.0f} MB"
    for session in ("s", "p"):
        path = tmp_path / "B" / session / "vault" / item[:2] / item
        assert path.stat().st_size == 256 * MB
        with path.open("rb") as fh:
            assert not fh.read(1 << 20).strip(b"\0")
    assert not list((tmp_path / "B").rglob(".tmp-*"))


class _Pipe(io.RawIOBase):
    """A file that cannot seek, as standard input from a pipe."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        return self._data.readinto(buffer)


def _damaged(lines: list[bytes]) -> Iterator[tuple[str, list[bytes]]]:
    """The archive ``lines`` whole and damaged in the ways a transfer or an edit damages it."""
    yield "whole", lines
    yield "crlf", [line.replace(b"\n", b"\r\n") for line in lines]
    yield "no final newline", [*lines[:-1], lines[-1].rstrip(b"\n")]
    for i, line in enumerate(lines):
        yield f"line {i} dropped", lines[:i] + lines[i + 1 :]
        yield f"line {i} cut", [*lines[:i], line[: len(line) // 2]]
        yield f"line {i} cut, the rest kept", [*lines[:i], line[: len(line) // 2] + b"\n", *lines[i + 1 :]]
        if b'"data": "' in line:
            at = line.index(b'"data": "') + 20
            for swap in (b"A", b"*", b"=", b'"', b"\n"):
                if line[at : at + 1] != swap:
                    yield f"line {i} data {swap!r}", [*lines[:i], line[:at] + swap + line[at + 1 :], *lines[i + 1 :]]
            yield f"line {i} tail", [*lines[:i], line.rstrip(b"\n") + b" \n", *lines[i + 1 :]]
    yield "garbage after the end", [*lines, b"\0" * 300]


@pytest.mark.parametrize("chunk", [8, 13, 64, 1 << 20])
def test_an_archive_read_a_chunk_at_a_time_says_what_one_read_whole_says(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Streaming changes no verdict: an archive read from a file a chunk at a time (long lines
    streamed, a pipe copied aside) imports what the same archive read whole imports, and
    refuses damage with the same CR146 message."""
    import ctxrules.stores.archive as archive

    source = MemoryStore()
    vault = Vault.of(source, "s")
    for size in (0, 1, 2, 3, 7, 40, 200, 600, 2000, 5001):  # lines past 512 bytes: streamed
        vault.put_bytes(bytes(range(256)) * (size // 256) + b"x" * (size % 256))
    vault.put_bytes(b"\x89PNG" * 30, "image/png")
    source.write_doc("s", "notes", b'{"notes": []}')
    out = io.BytesIO()
    export_session(source, "s", out, name="s")
    lines = out.getvalue().splitlines(keepends=True)
    monkeypatch.setattr(archive, "_CHUNK", chunk)
    streamed_lines: list[int] = []
    stream_blob = ArchiveFile._stream_blob

    def counting(self: ArchiveFile, *args: Any) -> Any:
        streamed_lines.append(1)
        return stream_blob(self, *args)

    monkeypatch.setattr(ArchiveFile, "_stream_blob", counting)
    for label, damaged in _damaged(lines):
        data = b"".join(damaged)
        verdicts = []
        for handle in (None, io.BytesIO(data), io.BufferedReader(_Pipe(data))):
            target = MemoryStore()
            try:
                if handle is None:
                    counts = import_session(target, "t", data.split(b"\n"), where="a")
                else:
                    with ArchiveFile(handle, "a") as streamed:
                        counts = import_session(target, "t", streamed, where="a")
            except StoreUsageError as exc:
                verdicts.append(str(exc))
                assert not target.exists("t"), label
                continue
            items = {i: target.get_blob("t", i) for i in target.blob_ids("t")}
            verdicts.append((counts, items, [target.blob_media_type("t", i) for i in sorted(items)]))
        assert verdicts[1] == verdicts[0], (label, chunk)
        assert verdicts[2] == verdicts[0], (label, chunk)
        if label == "whole":
            assert verdicts[0][1] == {i: source.get_blob("s", i) for i in source.blob_ids("s")}
    assert bool(streamed_lines) == (chunk < 1 << 20)
