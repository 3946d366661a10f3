"""The vault (content-addressed store) and the elision-marker grammar."""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ctxrules.errors import CtxrulesError
from ctxrules.private_files import UnsafePathError
from ctxrules.vault import (
    MARKER_KINDS,
    MARKER_RE,
    Marker,
    Vault,
    VaultError,
    format_marker,
    parse_marker,
    parse_markers,
    parse_ref,
    split_lines,
)


@pytest.fixture
def vault(tmp_path: Path) -> Vault:
    return Vault.for_session(tmp_path / "session")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- storing --------------------------------------------------------------------------------


def test_put_text_id_is_sha256_of_utf8_bytes(vault: Vault) -> None:
    text = "héllo\r\nwörld ✓"
    vault_id = vault.put_text(text)
    assert vault_id == _sha(text.encode("utf-8"))
    assert vault.get(vault_id) == text.encode("utf-8")
    assert vault.get_text(vault_id) == text


def test_put_bytes_id_is_sha256_of_raw_bytes_and_keeps_media_type(vault: Vault) -> None:
    data = bytes(range(256)) * 3
    vault_id = vault.put_bytes(data, media_type="image/png")
    assert vault_id == _sha(data)
    assert vault.get(vault_id) == data
    assert vault.media_type(vault_id) == "image/png"
    assert vault.media_type(vault.put_text("plain")) is None


def test_files_are_sharded_and_private(vault: Vault) -> None:
    vault_id = vault.put_text("secret token: abc")
    path = vault.root / vault_id[:2] / vault_id
    assert path.is_file()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(vault.root.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(vault.root.parent.stat().st_mode) == 0o700  # the session dir we created


def test_files_are_private_even_with_a_permissive_umask(vault: Vault) -> None:
    old = os.umask(0)
    try:
        vault_id = vault.put_text("x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((vault.root / vault_id[:2] / vault_id).stat().st_mode) == 0o600
    assert stat.S_IMODE(vault.root.stat().st_mode) == 0o700


def test_put_is_idempotent_and_does_not_rewrite(vault: Vault) -> None:
    first = vault.put_text("same")
    path = vault.root / first[:2] / first
    before = path.stat()
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    assert vault.put_text("same") == first
    after = path.stat()
    assert after.st_ino == before.st_ino
    assert after.st_mtime_ns == 1_000_000_000
    assert vault.list_ids() == [first]


def test_put_repairs_a_corrupt_entry(vault: Vault) -> None:
    vault_id = vault.put_text("original")
    path = vault.root / vault_id[:2] / vault_id
    path.write_bytes(b"tampered")
    with pytest.raises(VaultError, match="corrupt"):
        vault.get(vault_id)
    assert vault.put_text("original") == vault_id
    assert vault.get(vault_id) == b"original"


def test_writes_leave_no_temporary_files(vault: Vault) -> None:
    for i in range(20):
        vault.put_text(f"item {i}")
    leftovers = [p for p in vault.root.rglob("*") if p.is_file() and p.name.startswith(".")]
    assert leftovers == []
    assert len(vault.list_ids()) == 20


def test_concurrent_puts_of_the_same_content_agree(vault: Vault) -> None:
    ids: list[str] = []
    errors: list[BaseException] = []

    def put() -> None:
        try:
            ids.append(vault.put_text("race" * 10_000))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=put) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(set(ids)) == 1
    assert vault.get(ids[0]) == ("race" * 10_000).encode()


def test_a_file_where_the_session_directory_belongs_is_refused(tmp_path: Path) -> None:
    # a file where the vault's session directory belongs: refused as not ctxrules' own
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(UnsafePathError, match="file: it is not a directory"):
        Vault(tmp_path / "file" / "vault").put_text("x")
    assert (tmp_path / "file").read_text() == "not a directory"


def test_empty_text_and_lone_surrogates_are_storable(vault: Vault) -> None:
    assert vault.get(vault.put_text("")) == b""
    odd = "broken \ud83d emoji"
    assert vault.get_text(vault.put_text(odd)) == odd


# --- reading by id or prefix ----------------------------------------------------------------


def test_get_accepts_a_unique_prefix_of_twelve_digits(vault: Vault) -> None:
    vault_id = vault.put_text("prefix me")
    assert vault.get(vault_id[:12]) == b"prefix me"
    assert vault.get(vault_id[:12].upper()) == b"prefix me"
    assert vault.get(f"vault://{vault_id}") == b"prefix me"
    assert vault.resolve(vault_id[:20]) == vault_id
    assert vault.exists(vault_id) and vault.exists(vault_id[:12])


def test_prefix_shorter_than_twelve_is_refused(vault: Vault) -> None:
    vault_id = vault.put_text("short")
    with pytest.raises(VaultError, match="too short"):
        vault.get(vault_id[:11])


def test_ambiguous_prefix_is_refused(vault: Vault) -> None:
    # Plant two entries sharing 12 digits (finding a real sha256 collision on 48 bits is
    # not practical in a test); they are laid out exactly as the vault writes them.
    vault.put_text("seed")
    shard = vault.root / "ab"
    shard.mkdir(mode=0o700, exist_ok=True)
    for tail in ("0" * 52, "1" * 52):
        (shard / ("abcdefabcdef" + tail)).write_bytes(b"x")
    with pytest.raises(VaultError, match="ambiguous"):
        vault.get("abcdefabcdef")
    assert vault.exists("abcdefabcdef")


def test_unknown_id_is_not_found(vault: Vault) -> None:
    with pytest.raises(VaultError, match=r"is missing from .*not found"):
        vault.get("0" * 64)
    with pytest.raises(VaultError, match=r"is missing from .*no entry starts with it"):
        vault.get("0" * 12)
    assert not vault.exists("0" * 64)
    assert vault.list_ids() == []


@pytest.mark.parametrize(
    "bad",
    [
        "../../etc/passwd",
        "..",
        "/etc/passwd",
        "abcdefabcdef/../x",
        "abcdefabcdefg",
        "abcdef abcdef",
        "a" * 65,
        "",
        "vault://",
        "abcdefabcdef\x00",
    ],
)
def test_malformed_ids_are_rejected_before_touching_the_filesystem(vault: Vault, bad: str) -> None:
    with pytest.raises(VaultError):
        vault.get(bad)
    with pytest.raises(VaultError):
        vault.exists(bad)


@pytest.mark.parametrize("bad", ["a" * 10_000_000, "z" * 10_000_000])
def test_a_huge_malformed_id_is_named_cut_in_the_error(vault: Vault, bad: str) -> None:
    # The whole argument was echoed: a 10 MB line on stderr, or in a model's recall result.
    with pytest.raises(VaultError) as err:
        vault.get(bad)
    assert len(str(err.value)) < 300 and "10,000,000 characters" in str(err.value)


def test_vault_error_is_a_handled_error() -> None:
    assert issubclass(VaultError, CtxrulesError)


def test_read_verifies_content_against_its_id(vault: Vault) -> None:
    vault_id = vault.put_text("verify me")
    (vault.root / vault_id[:2] / vault_id).write_bytes(b"verify m3")
    with pytest.raises(VaultError, match="corrupt"):
        vault.get(vault_id[:16])


def test_list_ids_ignores_sidecars_and_strangers(vault: Vault) -> None:
    a = vault.put_text("a")
    b = vault.put_bytes(b"\x89PNG", media_type="image/png")
    (vault.root / "README").write_text("not an entry")
    (vault.root / a[:2] / ".tmp-abandoned").write_bytes(b"")
    assert vault.list_ids() == sorted([a, b])
    assert list(vault) == sorted([a, b])


# --- line ranges ----------------------------------------------------------------------------


def test_get_lines_is_byte_exact_with_crlf_and_no_trailing_newline(vault: Vault) -> None:
    data = b"one\r\ntwo\nthree\r\nfour"
    vault_id = vault.put_bytes(data)
    assert vault.get_lines(vault_id, 1, 1) == b"one\r\n"
    assert vault.get_lines(vault_id, 2, 3) == b"two\nthree\r\n"
    assert vault.get_lines(vault_id, 4, 4) == b"four"
    assert vault.get_lines(vault_id, 1, 4) == data


def test_a_lone_carriage_return_is_not_a_line_break(vault: Vault) -> None:
    vault_id = vault.put_text("progress 10%\rprogress 100%\ndone\n")
    assert vault.get_lines(vault_id, 1, 1) == b"progress 10%\rprogress 100%\n"
    assert vault.get_lines(vault_id, 2, 2) == b"done\n"


def test_get_lines_rejects_ranges_outside_the_content(vault: Vault) -> None:
    vault_id = vault.put_text("a\nb\n")
    with pytest.raises(VaultError, match="2 lines"):
        vault.get_lines(vault_id, 2, 3)
    with pytest.raises(VaultError, match="invalid line range"):
        vault.get_lines(vault_id, 0, 1)
    with pytest.raises(VaultError, match="invalid line range"):
        vault.get_lines(vault_id, 2, 1)


@pytest.mark.parametrize("block", [1, 2, 3, 5, 1 << 20])
def test_copy_to_passes_on_what_get_and_get_lines_return_whatever_the_block_size(
    vault: Vault, block: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``copy_to`` (``vault get``) finds a line range a block at a time: a range that starts
    or ends at, before or after a block's edge is the bytes :meth:`Vault.get_lines` cuts."""
    import ctxrules.vault

    monkeypatch.setattr(ctxrules.vault, "_BLOCK", block)
    for data in (b"one\r\ntwo\nthree\r\nfour", b"a\n\n\nb\n", b"\n", b"x"):
        vault_id = vault.put_bytes(data)
        total = len(split_lines(data))
        for first in range(1, total + 1):
            for last in range(first, total + 1):
                got: list[bytes] = []
                vault.copy_to(vault_id, got.append, (first, last))
                assert b"".join(got) == vault.get_lines(vault_id, first, last), (data, first, last)
        whole: list[bytes] = []
        vault.copy_to(vault_id[:12], whole.append)
        assert b"".join(whole) == data
        with pytest.raises(VaultError, match=f"{total} lines"):
            vault.copy_to(vault_id, whole.append, (1, total + 1))


def test_copy_to_refuses_a_damaged_item_before_passing_on_a_byte(vault: Vault) -> None:
    vault_id = vault.put_text("a\nb\n")
    (vault.root / vault_id[:2] / vault_id).write_bytes(b"a\nc\n")
    got: list[bytes] = []
    for lines in (None, (1, 1)):
        with pytest.raises(VaultError, match="is corrupt"):
            vault.copy_to(vault_id, got.append, lines)
    assert got == []


def test_a_number_longer_than_18_digits_makes_no_marker_and_no_pointer() -> None:
    ref = "vault://" + "ab" * 32
    for number in ("9" * 19, "9" * 5000):
        assert parse_markers(f"[ctxrules:elided kind=lines count={number} ref={ref}]") == []
        assert parse_markers(f"[ctxrules:elided kind=lines count=1 ref={ref}#L1-L{number}]") == []
        with pytest.raises(VaultError, match="invalid vault pointer"):
            parse_ref(f"{ref}#L1-L{number}")
    (marker,) = parse_markers(f"[ctxrules:elided kind=lines count={'9' * 18} ref={ref}#L1-L{'9' * 18}]")
    assert marker.count == 10**18 - 1 and marker.lines == (1, 10**18 - 1)


def test_get_lines_of_a_large_entry_holds_about_the_entry_once(vault: Vault) -> None:
    # ``ctxrules compress`` stores outputs far larger than memory would hold split into lines;
    # `vault get --lines` reads a range of one back without a list of all its lines.
    import tracemalloc

    data = b"".join(b"%07d\n" % i for i in range(1_000_000))  # 8 MB of short lines
    vault_id = vault.put_bytes(data)
    tracemalloc.start()
    try:
        got = vault.get_lines(vault_id, 500_001, 500_003)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got == b"0500000\n0500001\n0500002\n"
    assert peak < 2 * len(data)


@given(st.lists(st.sampled_from(["a", "b", "\n", "\r\n", "\r", "é"]), max_size=40))
def test_split_lines_reassembles_exactly(pieces: list[str]) -> None:
    data = "".join(pieces).encode()
    lines = split_lines(data)
    assert b"".join(lines) == data
    assert all(line.endswith(b"\n") for line in lines[:-1])
    assert len(lines) == data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)


# --- markers --------------------------------------------------------------------------------

VID = _sha(b"marker")


def test_format_marker_matches_the_design_grammar() -> None:
    assert format_marker("lines", 120, VID) == (f"[ctxrules:elided kind=lines count=120 ref=vault://{VID}]")
    assert format_marker("lines", 3, VID, lines=(10, 12)) == (
        f"[ctxrules:elided kind=lines count=3 ref=vault://{VID}#L10-L12]"
    )


def test_parse_markers_finds_markers_in_text_with_spans() -> None:
    marker = format_marker("json", 7, VID, tool="Bash")
    text = f"head\n{marker}\ntail {marker}"
    found = parse_markers(text)
    assert [m.kind for m in found] == ["json", "json"]
    assert text[found[0].span[0] : found[0].span[1]] == marker
    assert found[1].extra == {"tool": "Bash"}
    assert MARKER_RE.search(text) is not None


def test_parser_accepts_fields_in_any_order_and_quoted_values() -> None:
    text = f'[ctxrules:elided note="two words ] here" ref=vault://{VID}#L2-L5 count=4 kind=lines tool=Bash]'
    (marker,) = parse_markers(text)
    assert marker == Marker(
        kind="lines",
        count=4,
        vault_id=VID,
        lines=(2, 5),
        extra={"note": "two words ] here", "tool": "Bash"},
        span=(0, len(text)),
    )
    assert marker.ref == f"vault://{VID}#L2-L5"


def test_parser_accepts_kinds_added_later() -> None:
    (marker,) = parse_markers(f"[ctxrules:elided kind=audio count=1 ref=vault://{VID}]")
    assert marker.kind == "audio"


@pytest.mark.parametrize(
    "text",
    [
        "[ctxrules:elided kind=lines count=3]",
        f"[ctxrules:elided kind=lines ref=vault://{VID}]",
        f"[ctxrules:elided count=3 ref=vault://{VID}]",
        f"[ctxrules:elided kind=lines count=x ref=vault://{VID}]",
        "[ctxrules:elided kind=lines count=3 ref=vault://../../etc]",
        f"[ctxrules:elided kind=lines count=3 ref=vault://{VID}#L5-L2]",
        f"[ctxrules:elided kind=lines kind=json count=3 ref=vault://{VID}]",
        f"[ctxrules:elidedkind=lines count=3 ref=vault://{VID}]",
    ],
)
def test_malformed_markers_are_not_markers(text: str) -> None:
    assert parse_markers(text) == []
    with pytest.raises(VaultError):
        parse_marker(text)


def test_format_marker_rejects_what_the_grammar_cannot_carry() -> None:
    with pytest.raises(ValueError, match="kind"):
        format_marker("bogus", 1, VID)
    with pytest.raises(ValueError, match="count"):
        format_marker("lines", -1, VID)
    with pytest.raises(ValueError, match="vault id"):
        format_marker("lines", 1, VID[:12])
    with pytest.raises(ValueError, match="line range"):
        format_marker("lines", 1, VID, lines=(3, 2))
    with pytest.raises(ValueError, match="field name"):
        format_marker("lines", 1, VID, **{"ref": "x"})


def test_parse_ref_splits_id_and_range() -> None:
    assert parse_ref(f"vault://{VID}#L3-L9") == (VID, (3, 9))
    assert parse_ref(VID[:12]) == (VID[:12], None)
    with pytest.raises(VaultError):
        parse_ref("vault://nothex")


_field_names = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True).filter(
    lambda k: k not in {"kind", "count", "ref", "lines"}
)


@given(
    kind=st.sampled_from(MARKER_KINDS),
    count=st.integers(min_value=0, max_value=10**12),
    data=st.binary(max_size=64),
    lines=st.none() | st.tuples(st.integers(1, 10**6), st.integers(0, 10**6)),
    extra=st.dictionaries(_field_names, st.text(max_size=30), max_size=4),
    prefix=st.text(max_size=20),
    suffix=st.text(max_size=20),
)
def test_marker_round_trip(
    kind: str,
    count: int,
    data: bytes,
    lines: tuple[int, int] | None,
    extra: dict[str, str],
    prefix: str,
    suffix: str,
) -> None:
    vault_id = _sha(data)
    if lines is not None:
        lines = (lines[0], lines[0] + lines[1])
    text = format_marker(kind, count, vault_id, lines=lines, **extra)
    assert "\n" not in text and "\r" not in text
    assert len(text.splitlines()) == 1
    found = parse_markers(prefix + text + suffix)
    ours = [m for m in found if m.span == (len(prefix), len(prefix) + len(text))]
    assert len(ours) == 1
    marker = ours[0]
    assert (marker.kind, marker.count, marker.vault_id, marker.lines) == (
        kind,
        count,
        vault_id,
        lines,
    )
    assert dict(marker.extra) == extra
    assert list(marker.extra) == list(extra)
    assert parse_marker(text) == Marker(kind, count, vault_id, lines, extra, (0, len(text)))


def test_marker_points_back_to_byte_identical_content(vault: Vault) -> None:
    original = "line 1\r\nline 2\nline 3"
    vault_id = vault.put_text(original)
    marker = parse_marker(format_marker("lines", 2, vault_id, lines=(2, 3)))
    assert marker.lines is not None
    assert vault.get_lines(marker.vault_id, *marker.lines) == b"line 2\nline 3"
    assert vault.get(marker.vault_id) == original.encode()


def test_a_memory_store_writer_removes_spools_of_dead_writers_and_keeps_held_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The memory (and Redis) store's writer spools to the system's temporary directory: it
    marks its file held, and removes the spools there that no writer holds and nothing has
    touched for an hour (a killed process's); a held one (a live writer, another descriptor
    of this very process too), a fresh one and a file of another name stay."""
    import tempfile
    import time

    from ctxrules import locks
    from ctxrules.stores.memory import MemoryStore

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead, held, fresh, other = (tmp_path / n for n in ("ctxrules-blob-a", "ctxrules-blob-b", "ctxrules-blob-c", "x"))
    for path in (dead, held, fresh, other):
        path.write_bytes(b"part of an output")
        path.chmod(0o600)
    an_hour_ago = time.time() - 3700
    for path in (dead, held, other):
        os.utime(path, (an_hour_ago, an_hour_ago))
    with held.open("rb") as holder:
        locks.hold_shared(holder.fileno())
        store = MemoryStore()
        writer = Vault.of(store, "s").open_writer()
        assert not dead.exists()
        assert held.exists() and fresh.exists() and other.exists()
        writer.write(b"an output")
        spool = [p for p in tmp_path.glob("ctxrules-blob-*") if p not in (held, fresh)]
        assert len(spool) == 1
        with spool[0].open("rb") as probe:
            assert locks.held_elsewhere(probe.fileno())  # the live writer's own mark
        item = writer.commit()
    assert Vault.of(store, "s").get(item) == b"an output"
    assert not spool[0].exists()
