"""Properties of every built-in compressor on generated outputs: never larger than the input,
exit-code truthfulness, markers that parse and resolve, and a byte-identical vault round trip."""

from __future__ import annotations

import tempfile
from functools import cache
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxrules.compressors.api import compress_text, compress_tool_output, text_id
from ctxrules.compressors.apply import is_failure, split_output
from ctxrules.compressors.rules import FAILURE_TAIL
from ctxrules.compressors.testing import check_invariants
from ctxrules.packs.validated import load_pack
from ctxrules.plugins import default_registry
from ctxrules.vault import Vault, parse_markers

COMMANDS = [
    "git status",
    "git log -n 50",
    "git diff",
    "git show HEAD",
    "pytest -q",
    "python -m pytest",
    "cargo build",
    "cargo test",
    "npm install",
    "pnpm add x",
    "pip install x",
    "ls -la",
    "find .",
    "tree",
    "grep -rn x .",
    "rg -n x",
    "rg --files",
    "mypy src",
    "ruff check .",
    "npx eslint .",
    "make",
    "gcc -c x.c",
    "python3 app.py",
    "docker build .",
    "docker ps -a",
    "docker logs web",
    "docker compose logs",
    "cd sub && some-unknown-tool --flag | tail -5",
]

_FRAGMENTS = [
    "FAILED tests/test_x.py::test_y - AssertionError",
    "E       assert 1 == 2",
    "error: boom",
    "src/a.py:12: error: Incompatible types  [assignment]",
    "warning: unused variable",
    "ok",
    "test tests::t ... ok",
    "Traceback (most recent call last):",
    '  File "x.py", line 3, in f',
    "ValueError: bad",
    "Compiling foo v0.1.0",
    "Requirement already satisfied: x",
    "",
    "   ",
    "\x1b[31mred\x1b[0m text",
    "50%\r100% done",
    "diff --git a/x b/x",
    "@@ -1 +1 @@",
    "+added",
    "-removed",
    "commit 0123456789abcdef0123456789abcdef01234567",
    '{"a": [1, 2]}',
    "[ctxrules:elided kind=lines count=3]",
    "==== 3 passed in 0.1s ====",
    "ünï ✓ \t tab",
]

line = st.one_of(
    st.sampled_from(_FRAGMENTS),
    st.text(alphabet=st.characters(blacklist_characters="\n", blacklist_categories=("Cs",)), max_size=60),
)
output = st.builds(
    lambda lines, end: "\n".join(lines) + end,
    st.lists(line, min_size=0, max_size=180),
    st.sampled_from(["", "\n"]),
)
exit_code = st.one_of(st.none(), st.sampled_from([0, 0, 1, 2, 101, 128]))


@cache
def default_pack() -> dict[str, Any]:
    return load_pack("builtin:default").data


SETTINGS = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@SETTINGS
@given(command=st.sampled_from(COMMANDS), text=output, code=exit_code)
def test_never_larger_and_markers_resolve(command: str, text: str, code: int | None) -> None:
    result = compress_text(default_pack(), command, text, code, registry=default_registry())
    if result is None:
        return
    assert len(result.text.encode("utf-8", "surrogatepass")) < len(text.encode("utf-8", "surrogatepass"))
    problems = check_invariants(text, result.text, code, text_id(text), FAILURE_TAIL)
    assert problems == []
    total = len(split_output(text)[0])
    new_markers = [m for m in parse_markers(result.text) if m.vault_id == result.vault_id]
    for marker in new_markers:
        assert marker.lines is not None
        first, last = marker.lines
        assert 1 <= first <= last <= total
        assert 1 <= marker.count <= last - first + 1
    assert len(new_markers) == result.markers


@SETTINGS
@given(command=st.sampled_from(COMMANDS), text=output, code=st.sampled_from([1, 2, 101]))
def test_a_failing_run_keeps_its_last_lines(command: str, text: str, code: int) -> None:
    result = compress_text(default_pack(), command, text, code, registry=default_registry())
    if result is None:
        return
    assert result.failed
    lines = split_output(text)[0]
    tail_start = max(1, len(lines) - FAILURE_TAIL + 1)
    for marker in parse_markers(result.text):
        if marker.vault_id == result.vault_id and marker.lines is not None:
            assert marker.lines[1] < tail_start
    # The engine's verdict stands: nothing becomes a one-line success message.
    nonblank_tail = [ln for ln in lines[tail_start - 1 :] if ln.strip()]
    assert len(result.text.splitlines()) >= min(len(nonblank_tail), 1)


@SETTINGS
@given(text=output, code=exit_code)
def test_exit_code_verdict(text: str, code: int | None) -> None:
    result = compress_text(default_pack(), "some-unknown-tool", text, code, registry=default_registry())
    if result is not None:
        assert result.failed is is_failure(code, text)
        if code not in (0, None):
            assert result.failed


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(command=st.sampled_from(COMMANDS), text=output, code=exit_code)
def test_vault_round_trip_is_byte_identical(command: str, text: str, code: int | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        vault = Vault(Path(tmp))
        result = compress_tool_output(default_pack(), command, text, code, vault, registry=default_registry())
        if result is None:
            assert vault.list_ids() == []
            return
        assert vault.get(result.vault_id) == text.encode("utf-8")
        original = text.encode("utf-8").split(b"\n")
        for marker in parse_markers(result.text):
            if marker.vault_id != result.vault_id or marker.lines is None:
                continue
            first, last = marker.lines
            got = vault.get_lines(marker.vault_id, first, last)
            assert got.split(b"\n")[0] == original[first - 1]


@SETTINGS
@given(text=output)
def test_lossless_drops_nothing(text: str) -> None:
    pack = {
        "compressors": [
            {
                "id": "cut",
                "match": {"argv": ["tool"]},
                "lossless": True,
                "steps": [
                    {"use": "drop", "with": {"patterns": ["error|ok"]}},
                    {"use": "head", "with": {"lines": 3}},
                    {"use": "max_lines", "with": {"max": 2}},
                ],
            }
        ]
    }
    result = compress_text(pack, "tool", text, 0, registry=default_registry())
    assert result is None  # every line put back, nothing rewritten: never smaller, so no result
