"""The built-in compressors on real outputs: the fixtures captured for them, the shared RTK
corpus (Maven, Gradle, sbt, dotnet, ctest, docker compose, ... by path) and every shell result
of the 22 real agent transcripts.

"A plain head/tail is not a compressor": for every built-in rule, some key line of one of its
captured outputs lies where a head + tail with the same character budget as the compressed
output would have cut it, and the rule keeps it.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from conftest import COMMAND_OUTPUTS, REPO, transcript_paths

from ctxrules.compressors.api import compress_text, text_id
from ctxrules.compressors.apply import split_output
from ctxrules.compressors.argv import parse_command
from ctxrules.compressors.rules import FAILURE_TAIL, compile_rules, select_rule
from ctxrules.compressors.testing import check_invariants
from ctxrules.packs.validated import load_pack
from ctxrules.plugins import default_registry
from ctxrules.toolroles import call_name, calls_by_result, shell_command, tool_roles

RTK = COMMAND_OUTPUTS / "rtk"
FIXTURES = REPO / "rules" / "compressors" / "fixtures"


@cache
def default_pack() -> dict[str, Any]:
    return load_pack("builtin:default").data


def builtin_rules() -> list[dict[str, Any]]:
    return [r for r in default_pack()["compressors"] if isinstance(r, dict)]


def _cases(rule: dict[str, Any]) -> list[tuple[str, str, int, list[str]]]:
    out = []
    for case in rule.get("tests") or []:
        if "input" not in case:
            continue
        path = (REPO / "rules" / "compressors" / case["input"]).resolve()
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
        command = case.get("command") or " ".join(rule["match"]["argv"])
        out.append((text, command, case.get("exit_code", 0), list(case.get("contains") or [])))
    return out


@pytest.mark.parametrize("rule_id", [r["id"] for r in builtin_rules()])
def test_every_builtin_rule_keeps_key_lines_a_head_and_tail_would_cut(rule_id: str) -> None:
    rule = next(r for r in builtin_rules() if r["id"] == rule_id)
    kept_from_the_middle = []
    for text, command, exit_code, contains in _cases(rule):
        result = compress_text(default_pack(), command, text, exit_code, registry=default_registry())
        if result is None:
            continue
        assert result.rule_id == rule_id
        half = len(result.text) / 2
        for needle in contains:
            start = text.find(needle)
            if start >= half and start + len(needle) <= len(text) - half and needle in result.text:
                kept_from_the_middle.append(needle)
    assert kept_from_the_middle, (
        f"no test of '{rule_id}' shows a key line that a plain head + tail of the same size would have cut"
    )


def test_every_builtin_rule_has_tests_on_captured_files() -> None:
    for rule in builtin_rules():
        assert any("input" in c for c in rule.get("tests") or []), rule["id"]


def test_every_captured_fixture_is_indexed_with_its_command() -> None:
    index = {}
    for line in (FIXTURES / "INDEX.tsv").read_text(encoding="utf-8").splitlines():
        name, code, command = line.split("\t", 2)
        index[name] = (int(code), command)
    files = {p.relative_to(FIXTURES).as_posix() for p in FIXTURES.glob("*/*.txt")}
    assert files == set(index)


# --- the shared RTK corpus, by path ---------------------------------------------------------

_RTK_COMMANDS = [
    (r"^mvn_", "mvn test"),
    (r"^gradlew_", "./gradlew build"),
    (r"^sbt_", "sbt test"),
    (r"^build_failed", "dotnet build"),
    (r"^test_failed", "dotnet test"),
    (r"^uv_run_pytest", "uv run pytest"),
    (r"^pytest", "pytest -q"),
    (r"^ctest", "ctest"),
    (r"^make_", "make"),
    (r"^docker_compose_up", "docker compose up -d"),
    (r"^glab_ci_trace", "glab ci trace"),
    (r"^glab_release", "glab release list"),
]
_FAILED_NAME = re.compile(r"fail|error|no_pom")
_KEY = re.compile(
    r"(?i)^(?:\[ERROR\].*\b(?:FAIL|ERROR)|FAILED\b|ERROR\b|E\s{2,}\S|error\b|.*\berror(?:\[\w+\])?:"
    r"|.*\bFAILED\b|.*\bfailed\b)"
)


def _rtk_files() -> list[Path]:
    return sorted(RTK.glob("*.txt")) if RTK.is_dir() else []


def _rtk_command(name: str) -> str:
    return next((cmd for pattern, cmd in _RTK_COMMANDS if re.search(pattern, name)), "cat output.txt")


@pytest.mark.corpus
@pytest.mark.parametrize("path", _rtk_files(), ids=lambda p: p.name)
def test_rtk_corpus_outputs_keep_their_failure_lines(path: Path) -> None:
    text = path.read_text(encoding="utf-8", errors="surrogateescape")
    exit_code = 1 if _FAILED_NAME.search(path.name) else 0
    command = _rtk_command(path.name)
    result = compress_text(default_pack(), command, text, exit_code, registry=default_registry())
    if result is None:
        return
    assert check_invariants(text, result.text, exit_code, text_id(text), FAILURE_TAIL) == []
    ansi = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
    for line in split_output(text)[0]:
        plain = ansi.sub("", line).strip()
        if plain and _KEY.match(plain):
            assert plain in result.text or plain.split(":", 1)[-1].strip() in result.text, plain


@pytest.mark.corpus
def test_rtk_pytest_failure_through_uv_keeps_the_failing_test() -> None:
    path = RTK / "uv_run_pytest_failure.txt"
    if not path.is_file():
        pytest.fail("the corpus has no command-outputs/rtk/*.txt", pytrace=False)
    text = path.read_text(encoding="utf-8")
    command = "cd app && uv run pytest"
    rules = compile_rules(default_pack(), default_registry())
    chosen = select_rule(rules, parse_command(command), 1, True)  # type: ignore[arg-type]
    assert chosen is not None and chosen.id == "pytest"
    # 28 lines: too short for the markers to pay off, so the output stays as it is; padded
    # with the same session 20 times over, the failure and the summary survive compression.
    assert compress_text(default_pack(), command, text, 1, registry=default_registry()) is None
    result = compress_text(default_pack(), command, text * 20, 1, registry=default_registry())
    assert result is not None and result.rule_id == "pytest"
    assert "1 failed, 1 passed" in result.text
    assert any(line.startswith("FAILED ") for line in result.text.splitlines())


# --- every shell result of the real agent transcripts --------------------------------------


def _shell_results() -> list[tuple[str, str, str, int | None]]:
    roles = tool_roles(default_pack())
    out = []
    for path in transcript_paths():
        data = json.loads(path.read_text(encoding="utf-8"))
        messages = data if isinstance(data, list) else data.get("messages", [])
        for index, call in calls_by_result(messages).items():
            if roles.role_of(call_name(call)) != "shell":
                continue
            command = shell_command(call)
            content = messages[index].get("content")
            if isinstance(content, list):
                content = "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
            if command and isinstance(content, str) and content:
                out.append((path.name, command, content, roles.exit_code(content)))
    return out


@pytest.mark.corpus
def test_transcript_shell_results_stay_truthful() -> None:
    results = _shell_results()
    assert len(results) > 100
    rules = compile_rules(default_pack(), default_registry())
    compressed = 0
    for name, command, content, exit_code in results:
        parsed = parse_command(command)
        assert parsed is None or select_rule(rules, parsed, exit_code, False) is not None  # generic
        result = compress_text(default_pack(), command, content, exit_code, registry=default_registry())
        if result is None:
            continue
        compressed += 1
        problems = check_invariants(content, result.text, exit_code, text_id(content), FAILURE_TAIL)
        assert problems == [], (name, command, problems)
    assert compressed > 0
