"""From an agent's shell line to the argv a compressor rule matches (ctxrules.compressors.argv)
and the argv patterns of ``match:`` (ctxrules.compressors.rules.ArgvPattern)."""

from __future__ import annotations

import pytest

from ctxrules.compressors.argv import CommandLine, parse_command, positionals
from ctxrules.compressors.rules import ArgvPattern


@pytest.mark.parametrize(
    ("line", "argv", "piped"),
    [
        ("git status", ("git", "status"), False),
        ("cd app && pytest -q", ("pytest", "-q"), False),
        ("cd app; make -j4 || true", ("make", "-j4"), False),
        ("cat <<'EOF' > notes.txt\nit's done\nEOF\npytest -q", ("pytest", "-q"), False),
        ("FOO=1 BAR='a b' python -m pytest tests/", ("pytest", "tests/"), False),
        ("python3 -X dev -m mypy src", ("mypy", "src"), False),
        ("npx jest --ci", ("jest", "--ci"), False),
        ("npx --yes pnpm@9 install", ("pnpm", "install"), False),
        ("uv run --with rich pytest -x", ("pytest", "-x"), False),
        ("poetry run pytest", ("pytest",), False),
        ("pnpm exec eslint .", ("eslint", "."), False),
        ("sudo -u ci env A=1 timeout 60 cargo test", ("cargo", "test"), False),
        ("time npm install", ("npm", "install"), False),
        ("/usr/bin/git -C repo status", ("git", "-C", "repo", "status"), False),
        ("pytest 2>&1 | tail -40", ("pytest",), True),
        ("cargo build 2>&1 | head -100", ("cargo", "build"), True),
        ("git log --oneline | grep fix", ("grep", "fix"), True),
        ("make > build.log 2>&1", ("make",), False),
        ('pytest; echo "exit=$?"', ("pytest",), False),
        ("# run the tests\npytest -x  # fast", ("pytest", "-x"), False),
        ("grep -rn '#include' src", ("grep", "-rn", "#include", "src"), False),
        ("(cd sub && make)\nnpm test", ("npm", "test"), False),
        ("echo hi", ("echo", "hi"), False),
    ],
)
def test_the_command_whose_output_we_see_is_found(line: str, argv: tuple[str, ...], piped: bool) -> None:
    assert parse_command(line) == CommandLine(argv, piped)


def test_unbalanced_quotes_fall_back_to_the_last_line() -> None:
    parsed = parse_command("make all\npytest -q 'unterminated")
    assert parsed is not None and parsed.program == "pytest"


@pytest.mark.parametrize("line", ["", "   ", "\n\n", "# just a comment"])
def test_empty_lines_have_no_command(line: str) -> None:
    assert parse_command(line) is None


def test_global_options_are_not_taken_for_the_subcommand() -> None:
    assert positionals(("git", "-C", "repo", "-c", "x=y", "status", "--short")) == ["status"]
    assert positionals(("docker", "--context", "prod", "logs", "-f", "web")) == ["logs", "web"]
    assert positionals(("cargo", "+nightly", "test", "--", "--nocapture")) == [
        "test",
        "--nocapture",
    ]


@pytest.mark.parametrize(
    ("pattern", "argv", "matches"),
    [
        (["git", "status"], ("git", "status", "--short"), True),
        (["git", "status"], ("git", "-C", "x", "status"), True),
        (["git", "status"], ("git", "log", "--grep", "status"), False),
        (["git", "diff|show"], ("git", "show", "HEAD"), True),
        (["npm|pnpm", "install|i"], ("pnpm", "i"), True),
        (["npm|pnpm", "install|i"], ("yarn", "install"), False),
        (["docker", "compose", "logs"], ("docker", "compose", "logs", "web"), True),
        (["docker", "compose", "logs"], ("docker", "compose"), False),
        (["rg", "--files"], ("rg", "--files", "src"), True),
        (["rg", "--files"], ("rg", "-n", "x"), False),
        (["git", "log", "--format"], ("git", "log", "--format=%h"), True),
        (["*-gcc"], ("arm-none-eabi-gcc", "-c", "x.c"), True),
        (["*"], ("anything",), True),
    ],
)
def test_argv_patterns(pattern: list[str], argv: tuple[str, ...], matches: bool) -> None:
    assert ArgvPattern.parse(pattern).matches(argv) is matches


def test_a_longer_pattern_is_more_specific() -> None:
    assert ArgvPattern.parse(["*"]).specificity == 0
    assert ArgvPattern.parse(["git"]).specificity < ArgvPattern.parse(["git", "status"]).specificity
