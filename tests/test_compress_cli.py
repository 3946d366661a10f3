"""``ctxrules compress``: proxy mode (a real child process, real exit codes and pipes) and filter
mode (in-process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from ctxrules.vault import parse_markers

FIXTURES = REPO / "rules" / "compressors" / "fixtures"
ENGINE = str(REPO / "engine")


def ctxrules(
    *argv: str, tmp: Path, stdin: bytes | None = None, shell_suffix: str | None = None
) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONPATH": ENGINE, "CTXRULES_STATE": str(tmp / "state")}
    env.pop("CTXRULES_DEBUG", None)
    base = [sys.executable, "-m", "ctxrules.cli.main", *argv]
    if shell_suffix is not None:
        line = " ".join(_quote(a) for a in base) + " " + shell_suffix
        return subprocess.run(
            ["sh", "-c", line],
            capture_output=True,
            env=env,
            cwd=tmp,
            input=stdin,
            timeout=120,
            check=False,
        )
    return subprocess.run(base, capture_output=True, env=env, cwd=tmp, input=stdin, timeout=120, check=False)


def _quote(arg: str) -> str:
    return "'" + arg.replace("'", "'\"'\"'") + "'"


@pytest.fixture
def noisy(tmp_path: Path) -> Path:
    """A program printing 300 lines with one failure in the middle, exiting with $1."""
    script = tmp_path / "noisy.py"
    script.write_text(
        "import sys\n"
        "for i in range(300):\n"
        "    print(f'step {i}: copying asset number {i} to the build folder')\n"
        "    if i == 150:\n"
        "        print('error: asset 150 is corrupt', file=sys.stderr, flush=True)\n"
        "    sys.stdout.flush()\n"
        "sys.exit(int(sys.argv[1]))\n",
        encoding="utf-8",
    )
    return script


def test_proxy_prints_compressed_output_and_keeps_the_full_one(tmp_path: Path, noisy: Path) -> None:
    proc = ctxrules("compress", "--", sys.executable, str(noisy), "0", tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.decode()
    assert "error: asset 150 is corrupt" in out  # stderr merged, failure kept from the middle
    markers = parse_markers(out)
    assert markers and len(out) < 300 * 40
    vault = tmp_path / "state" / "default"
    got = ctxrules("vault", "get", markers[0].ref, "--session", str(vault), tmp=tmp_path)
    assert got.returncode == 0
    first, last = markers[0].lines  # type: ignore[misc]
    assert got.stdout.decode().count("\n") == last - first + 1
    full = ctxrules("vault", "get", markers[0].vault_id, "--session", str(vault), tmp=tmp_path)
    assert full.stdout.decode().count("copying asset number") == 300


def test_proxy_exits_with_the_command_code_and_keeps_the_tail(tmp_path: Path, noisy: Path) -> None:
    proc = ctxrules("compress", "--", sys.executable, str(noisy), "3", tmp=tmp_path)
    assert proc.returncode == 3
    out = proc.stdout.decode()
    for i in range(290, 300):
        assert f"step {i}: copying asset number {i}" in out


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["--", "ctxrules-no-such-program-4711"], 127, "command not found"),
        (["--pack", "nope.yaml", "--", "true"], 125, "pack file not found"),
        (["--", "sh", "-c", "exit 7"], 7, ""),
        (["--", "sh", "-c", "kill -TERM $$"], 143, ""),
    ],
)
def test_proxy_exit_codes(tmp_path: Path, argv: list[str], code: int, message: str) -> None:
    proc = ctxrules("compress", *argv, tmp=tmp_path)
    assert proc.returncode == code
    assert message in proc.stderr.decode()
    assert b"Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("store", "message"),
    [
        (["--store", "bogus://x"], "[CR145] unknown store URL 'bogus://x'"),
        (["--store", "file://a", "--state", "b"], "[CR145] give --store URL or --state DIR, not both"),
    ],
)
@pytest.mark.parametrize("raw", [[], ["--raw"]], ids=["compressed", "raw"])
def test_a_bad_store_is_125_and_runs_nothing(tmp_path: Path, store: list[str], message: str, raw: list[str]) -> None:
    proc = ctxrules("compress", *store, *raw, "--", "sh", "-c", "touch ran; echo hi", tmp=tmp_path)
    assert proc.returncode == 125, proc.stderr
    assert message in proc.stderr.decode() and b"Traceback" not in proc.stderr
    assert not (tmp_path / "ran").exists() and proc.stdout == b""
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--max-output", "0"], "argument --max-output"),
        (["--exit-code", "x"], "argument --exit-code"),
        (["--no-such-option"], "unrecognized arguments: --no-such-option"),
        (["--pack", ""], "an empty value"),
    ],
)
def test_a_usage_error_before_the_command_is_125_in_proxy_mode_and_2_in_filter_mode(
    tmp_path: Path, options: list[str], message: str
) -> None:
    """`compress -- CMD` exits with CMD's code: its own usage error was 2, which `make`'s own
    failures use too. It is 125 there, like a bad pack (and `env`, `timeout`); CMD does not
    run. Filter mode has no command's code to mix it with: 2, as every other verb."""
    proc = ctxrules("compress", *options, "--", "sh", "-c", "touch ran; exit 2", tmp=tmp_path)
    assert proc.returncode == 125, proc.stderr
    assert message in proc.stderr.decode() and b"Traceback" not in proc.stderr
    assert not (tmp_path / "ran").exists()
    proc = ctxrules("compress", *options, "--command", "make", "--input", "-", tmp=tmp_path, stdin=b"x\n")
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr.decode()


@pytest.mark.parametrize(
    ("argv", "code"),
    [(["--", "sh", "-c", "touch ran"], 125), (["--command", "make", "--input", "-"], 2)],
    ids=["proxy", "filter"],
)
def test_a_closed_standard_output_is_an_error_not_a_traceback(tmp_path: Path, argv: list[str], code: int) -> None:
    # `ctxrules compress ... >&-`: Python starts with sys.stdout None.
    proc = ctxrules("compress", *argv, tmp=tmp_path, stdin=b"error: x\n", shell_suffix=">&-")
    assert proc.returncode == code, proc.stderr
    assert b"standard output is closed" in proc.stderr
    assert b"Traceback" not in proc.stderr and b"internal error" not in proc.stderr
    assert not (tmp_path / "ran").exists()


def test_not_executable_is_126(tmp_path: Path) -> None:
    script = tmp_path / "plain.sh"
    script.write_text("echo hi\n", encoding="utf-8")
    script.chmod(0o644)
    proc = ctxrules("compress", "--", str(script), tmp=tmp_path)
    assert proc.returncode == 126 and b"not executable" in proc.stderr


def test_a_command_that_cannot_start_is_named_for_what_is_wrong(tmp_path: Path) -> None:
    """A script whose interpreter is missing was "command not found" (it is there); a folder
    "not executable"; an empty CMD (`-- "$UNSET"`) "permission denied"; a name with an escape
    sequence or a non-UTF-8 byte was written to the terminal as it is (ESC [ 2 J cleared it)."""
    script = tmp_path / "build.sh"
    script.write_text("#!/nonexistent/interpreter\necho hi\n", encoding="utf-8")
    script.chmod(0o755)
    cases = [
        (
            [str(script)],
            127,
            f"{script}: cannot run: the interpreter its #! line names (#!/nonexistent/interpreter) is not found",
        ),
        ([str(tmp_path)], 126, f"{tmp_path}: cannot run: it is a folder"),
        ([""], 127, "'': command not found"),
        (["\x1b[2Jctxrules-no-such-4711"], 127, "\\x1b[2Jctxrules-no-such-4711: command not found"),
        ([os.fsdecode(b"\xffctxrules-no-such-4711")], 127, "\\xffctxrules-no-such-4711: command not found"),
    ]
    for argv, code, message in cases:
        proc = ctxrules("compress", "--", *argv, tmp=tmp_path)
        assert proc.returncode == code, proc.stderr
        assert proc.stderr.decode() == f"ctxrules: {message}\n"
        assert b"\x1b" not in proc.stderr


def test_raw_drops_nothing(tmp_path: Path, noisy: Path) -> None:
    proc = ctxrules("compress", "--raw", "--", sys.executable, str(noisy), "0", tmp=tmp_path)
    assert proc.returncode == 0
    assert proc.stdout.decode().count("copying asset number") == 300
    assert b"ctxrules:elided" not in proc.stdout


def test_stats_go_to_stderr_with_real_token_counts(tmp_path: Path, noisy: Path) -> None:
    proc = ctxrules("compress", "--stats", "--", sys.executable, str(noisy), "0", tmp=tmp_path)
    err = proc.stderr.decode()
    assert "tokens" in err and "gpt-4o, exact" in err and "vault://" in err
    assert "tokens" not in proc.stdout.decode().splitlines()[0]


def test_a_pipeline_gets_the_real_lines(tmp_path: Path, noisy: Path) -> None:
    piped = ctxrules("compress", "--", sys.executable, str(noisy), "0", tmp=tmp_path, shell_suffix="| cat")
    assert piped.stdout.decode().count("copying asset number") == 300
    forced = ctxrules(
        "compress",
        "--always",
        "--",
        sys.executable,
        str(noisy),
        "0",
        tmp=tmp_path,
        shell_suffix="| cat",
    )
    assert parse_markers(forced.stdout.decode())
    to_file = ctxrules(
        "compress",
        "--",
        sys.executable,
        str(noisy),
        "0",
        tmp=tmp_path,
        shell_suffix="> out.txt; cat out.txt",
    )
    assert parse_markers(to_file.stdout.decode())  # a file is not a pipeline


def test_pipeline_status_survives(tmp_path: Path, noisy: Path) -> None:
    proc = ctxrules(
        "compress",
        "--",
        sys.executable,
        str(noisy),
        "4",
        tmp=tmp_path,
        shell_suffix="| cat > /dev/null; exit 0",
    )
    assert proc.returncode == 0  # the shell's; the point is that nothing hangs or crashes
    assert b"Traceback" not in proc.stderr


@pytest.mark.parametrize("size", ["small", "large"])
@pytest.mark.parametrize("stdout", ["reader gone", "disk full"])
def test_an_output_that_cannot_be_printed_keeps_the_command_code(tmp_path: Path, size: str, stdout: str) -> None:
    # Small: compressed, then printed; large (one line longer than a window): copied out from
    # the vault entry being written, which is then dropped.
    script = "print('step\\n' * 3000)" if size == "small" else "print('x' * 9_000_000)"
    env = {**os.environ, "PYTHONPATH": ENGINE, "CTXRULES_STATE": str(tmp_path / "state")}
    argv = [sys.executable, "-m", "ctxrules.cli.main", "compress", "--", sys.executable, "-c", script + "; exit(3)"]
    if stdout == "disk full":
        if not Path("/dev/full").exists():
            pytest.skip("no /dev/full")
        with open("/dev/full", "wb") as full:
            proc = subprocess.run(argv, stdout=full, stderr=subprocess.PIPE, env=env, cwd=tmp_path, timeout=120)
    else:
        read, write = os.pipe()
        os.close(read)  # nobody reads: not a pipeline, and the write gets EPIPE
        try:
            proc = subprocess.run(argv, stdout=write, stderr=subprocess.PIPE, env=env, cwd=tmp_path, timeout=120)
        finally:
            os.close(write)
    assert proc.returncode == 3, proc.stderr
    assert b"internal error" not in proc.stderr
    assert (b"not printed: No space left" in proc.stderr) == (stdout == "disk full")
    assert list((tmp_path / "state").rglob(".tmp-*")) == []


def test_stream_copies_live_to_stderr(tmp_path: Path, noisy: Path) -> None:
    proc = ctxrules("compress", "--stream", "--", sys.executable, str(noisy), "0", tmp=tmp_path)
    assert proc.stderr.decode().count("copying asset number") == 300
    assert parse_markers(proc.stdout.decode())


@pytest.mark.parametrize("options", [["--stream", "--stats"], ["--stats"]], ids=["stream", "note"])
def test_stream_whose_watcher_went_away_lets_the_command_finish(
    tmp_path: Path, noisy: Path, options: list[str]
) -> None:
    # Standard error's reader is gone (a closed terminal, `2>&1 >out | head`): the live copy
    # and the notes stop, while the command runs to its end and its output is still compressed
    # and printed.
    env = {**os.environ, "PYTHONPATH": ENGINE, "CTXRULES_STATE": str(tmp_path / "state")}
    script = f"{_quote(sys.executable)} {_quote(str(noisy))} 0; touch finished; exit 3"
    argv = [sys.executable, "-m", "ctxrules.cli.main", "compress", *options, "--", "sh", "-c", script]
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=write, env=env, cwd=tmp_path, timeout=120)
    finally:
        os.close(write)
    assert proc.returncode == 3
    assert (tmp_path / "finished").exists()
    out = proc.stdout.decode()
    assert "error: asset 150 is corrupt" in out and parse_markers(out)


def test_a_note_after_the_live_copy_starts_on_its_own_line(tmp_path: Path) -> None:
    # The command's last line has no newline; --stats then writes its note to the same stderr.
    script = "import sys; sys.stdout.write('first\\nno newline at the end')"
    proc = ctxrules("compress", "--stream", "--stats", "--", sys.executable, "-c", script, tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr.decode()
    assert err.startswith("first\nno newline at the end\nctxrules: "), err
    assert err.count("\n") == 3, err  # the copied lines, then one line of note: no blank line
    assert proc.stdout == b"first\nno newline at the end"  # stdout is the command's, unchanged


def test_non_utf8_output_is_kept_byte_for_byte(tmp_path: Path) -> None:
    script = tmp_path / "bytes.py"
    script.write_text(
        "import sys\nfor i in range(200):\n    sys.stdout.buffer.write(b'row %d caf\\xe9 latin-1 bytes here\\n' % i)\n",
        encoding="utf-8",
    )
    proc = ctxrules("compress", "--", sys.executable, str(script), tmp=tmp_path)
    [*_, marker] = parse_markers(proc.stdout.decode())
    got = ctxrules(
        "vault",
        "get",
        marker.vault_id,
        "--session",
        str(tmp_path / "state" / "default"),
        tmp=tmp_path,
    )
    assert got.stdout == b"".join(b"row %d caf\xe9 latin-1 bytes here\n" % i for i in range(200))


def test_a_vault_that_cannot_be_written_prints_the_full_output(tmp_path: Path, noisy: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x", encoding="utf-8")
    proc = ctxrules("compress", "--session", str(blocker), "--", sys.executable, str(noisy), "5", tmp=tmp_path)
    assert proc.returncode == 5
    assert proc.stdout.decode().count("copying asset number") == 300
    assert b"output not compressed" in proc.stderr


# --- filter mode (in-process) ------------------------------------------------------------------


def test_filter_mode_compresses_captured_output(
    cli,
    tmp_path: Path,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CTXRULES_STATE", str(tmp_path))
    code, out, err = cli(
        "compress",
        "--command",
        "python -m pytest",
        "--exit-code",
        "1",
        "--input",
        str(FIXTURES / "pytest" / "failures.txt"),
    )
    assert code == 0, err
    assert "FAILED tests/test_calc.py::test_div_by_zero" in out
    assert "tests/test_bulk_4.py" not in out
    [marker, *_] = parse_markers(out)
    assert (tmp_path / "default" / "vault" / marker.vault_id[:2] / marker.vault_id).is_file()


def test_filter_mode_reads_stdin(
    cli,
    tmp_path: Path,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import io

    data = (FIXTURES / "pip" / "install.txt").read_bytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    code, out, _ = cli(
        "compress",
        "--session",
        str(tmp_path / "s"),
        "--command",
        "pip install rich",
        "--input",
        "-",
    )
    assert code == 0
    assert "Successfully installed" in out and "Looking in indexes" not in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--command", "ls"], "--command needs --input"),
        (["--input", "x.txt"], "need --command"),
        (["--command", "ls", "--input", "missing.txt"], "no such file"),
        (["--command", "ls", "--input", "x", "--", "ls"], "not both"),
        ([], "nothing to run"),
    ],
)
def test_usage_errors(
    cli,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
    argv: list[str],
    message: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("compress", *argv)
    assert code == 2 and message in err
