"""Stream-timeout analysis: effective limits, the CR091-CR093 lints, ``explain --timeouts``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ctxrules.packs.validated import load_pack
from ctxrules.timeouts import TimeoutPolicy, lint_timeouts, timeouts_table

REPO = Path(__file__).resolve().parents[1]
SEED = REPO / "docs" / "examples" / "timeouts-seed.yaml"
FIXED = REPO / "docs" / "examples" / "timeouts-fixed.yaml"

SEED_TIMEOUTS = {
    "chunk_ms": 120_000,
    "step_ms": 300_000,
    "tool_ms": 120_000,
    "tools": {"execute": 300_000, "task": 300_000},
    "compaction_allowance_ms": 60_000,
}


def policy(**timeouts: object) -> TimeoutPolicy:
    p = TimeoutPolicy.from_pack({"timeouts": timeouts})
    assert p is not None
    return p


def test_effective_limit_is_the_minimum_of_every_limit_that_applies() -> None:
    p = policy(**SEED_TIMEOUTS)
    shell = p.effective("execute")
    assert shell.applies == {"tools.execute": 300_000, "chunk_ms": 120_000, "step_ms": 300_000}
    assert (shell.configured_ms, shell.effective_ms, shell.bound_by) == (
        300_000,
        120_000,
        "chunk_ms",
    )
    assert shell.ineffective
    # The seed's formula for the shell: min(chunk 120 s, per-tool 300 s, step 300 s) = 120 s.
    assert shell.effective_ms == min(shell.applies.values())
    other = p.effective("Read")
    assert (other.configured_by, other.effective_ms, other.ineffective) == (
        "tool_ms",
        120_000,
        False,
    )


def test_heartbeat_lifts_the_chunk_limit_only_for_its_tools() -> None:
    p = policy(**SEED_TIMEOUTS, heartbeat={"tools": ["exec*"], "interval_ms": 30_000})
    assert p.effective("execute").effective_ms == 300_000
    assert p.effective("execute").bound_by == "step_ms"
    assert "chunk_ms" not in p.effective("execute").applies
    assert p.effective("task").effective_ms == 120_000  # task does not heartbeat


def test_overrides_match_globs_and_total_binds_last() -> None:
    p = policy(tool_ms=60_000, total_ms=90_000, tools={"mcp__*": 200_000, "Bash": 30_000})
    assert p.effective("mcp__github__search").configured_by == "tools.mcp__*"
    assert (p.effective("mcp__x").effective_ms, p.effective("mcp__x").bound_by) == (
        90_000,
        "total_ms",
    )
    assert p.effective("Bash").effective_ms == 30_000  # lowering a tool limit always works
    assert [r.tool for r in timeouts_table(p)] == ["(default)", "mcp__*", "Bash"]


def test_no_limits_means_no_effective_limit() -> None:
    p = policy()
    assert p.effective("x").effective_ms is None and lint_timeouts({"timeouts": {}}) == []
    assert TimeoutPolicy.from_pack({}) is None


def test_seed_case_lint_names_the_numbers() -> None:
    findings = lint_timeouts({"timeouts": SEED_TIMEOUTS})
    assert [(f.code, f.pointer) for f in findings] == [
        ("CR091", "/timeouts/tools/execute"),
        ("CR091", "/timeouts/tools/task"),
    ]
    assert "300000 ms (300 s)" in findings[0].message and "chunk_ms = 120000 ms (120 s)" in findings[0].message
    assert "heartbeat" in findings[0].hint


def test_default_tool_limit_above_chunk_is_flagged_too() -> None:
    findings = lint_timeouts({"timeouts": {"chunk_ms": 120_000, "tool_ms": 180_000}})
    assert [(f.code, f.pointer) for f in findings] == [("CR091", "/timeouts/tool_ms")]


@pytest.mark.parametrize(
    ("pack", "codes"),
    [
        (
            {
                "summarizer": {"total_s": 600},
                "timeouts": {"step_ms": 300_000, "compaction_allowance_ms": 60_000},
            },
            ["CR092"],
        ),
        # A summarize stage without a summarizer block: the summarizer's default ceiling (600 s).
        (
            {
                "pipeline": [{"id": "s", "use": "summarize.structured"}],
                "timeouts": {"step_ms": 300_000},
            },
            ["CR092"],
        ),
        # The seed's numbers: a 60 s summarizer ceiling inside a 60 s allowance is fine.
        (
            {
                "summarizer": {"total_s": 60},
                "timeouts": {"step_ms": 300_000, "compaction_allowance_ms": 60_000},
            },
            [],
        ),
        # No compaction in the pack: nothing to allow for.
        ({"timeouts": {"step_ms": 300_000}}, []),
    ],
)
def test_compaction_allowance_against_the_summarizer_ceiling(pack: dict[str, object], codes: list[str]) -> None:
    findings = lint_timeouts(pack)
    assert [f.code for f in findings] == codes
    if codes:
        assert "600000 ms (600 s" in findings[0].message


def test_validate_warns_on_the_seed_pack_and_not_on_the_fixed_one(cli, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(REPO)
    code, out, _ = cli("validate", "--format", "json", str(SEED.relative_to(REPO)))
    doc = json.loads(out)
    assert code == 0  # warnings do not fail validation
    got = [(d["code"], d["severity"], d["line"]) for d in doc["diagnostics"]]
    assert got == [("CR091", "warning", 19), ("CR091", "warning", 20)]
    code, out, _ = cli("validate", "--strict", str(SEED.relative_to(REPO)))
    assert code == 1, out
    code, out, _ = cli("validate", "--format", "json", str(FIXED.relative_to(REPO)))
    assert [d for d in json.loads(out)["diagnostics"] if d["file"].endswith("timeouts-fixed.yaml")] == []


def test_explain_timeouts_prints_the_table(cli) -> None:  # type: ignore[no-untyped-def]
    code, out, err = cli("explain", "--timeouts", str(SEED))
    assert code == 0, err
    rows = {ln.split()[0]: ln.split() for ln in out.splitlines() if ln.startswith(("execute", "task", "(default)"))}
    assert rows["execute"][:5] == ["execute", "300", "s", "tools.execute", "120"]
    assert "chunk_ms" in rows["execute"] and "override cannot take effect" in out
    assert "step timer 360 s" in out
    assert "warning[CR091]" in out
    code, out, _ = cli("explain", "--timeouts", str(FIXED))
    assert "cannot take effect" not in out
    fixed = next(ln for ln in out.splitlines() if ln.startswith("execute"))
    assert fixed.split()[4:7] == ["300", "s", "step_ms"]


def test_explain_timeouts_shows_a_tool_name_s_control_characters_as_escapes(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Tool names are the pack's: the table and its warnings print an escape sequence or a line
    break in one as its escape, as every other diagnostic does, and the columns stay aligned."""
    pack = tmp_path / "p.yaml"
    pack.write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: p, version: 1.0.0}\n"
        'timeouts: {chunk_ms: 120000, tools: {"ev\\e[2Jil": 300000, "two\\nlines": 300000}}\n',
        encoding="utf-8",
    )
    code, out, err = cli("explain", "--timeouts", str(pack))
    assert code == 0, err
    assert "\x1b" not in out and "two\nlines" not in out
    rows = [ln for ln in out.splitlines() if ln.startswith(("ev", "two"))]
    assert [r.split()[0] for r in rows] == ["ev\\x1b[2Jil", "two\\x0alines"]
    assert len({r.index("300 s") for r in rows}) == 1  # aligned
    assert "warning[CR091] the override tools.ev\\x1b[2Jil" in out


def test_timeout_warnings_name_the_line_of_the_override(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """explain --timeouts starts each warning with file:line:col as validate does, and a tool
    name holding '/' or '~' (an escaped JSON-pointer token) is found at its own line, not at
    the tools: map."""
    pack = tmp_path / "p.yaml"
    pack.write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: p, version: 1.0.0}\n"
        "timeouts:\n  chunk_ms: 120000\n  tools:\n    execute: 300000\n    mcp/fs~read: 300000\n",
        encoding="utf-8",
    )
    code, out, err = cli("explain", "--timeouts", str(pack))
    assert code == 0, err
    warnings = [ln for ln in out.splitlines() if "warning[CR091]" in ln]
    assert [w.split(": warning")[0] for w in warnings] == [f"{pack}:7:14", f"{pack}:8:18"]
    code, out, _ = cli("validate", "--format", "json", str(pack))
    found = [(d["line"], d["col"], d["pointer"]) for d in json.loads(out)["diagnostics"]]
    assert found == [(7, 14, "/timeouts/tools/execute"), (8, 18, "/timeouts/tools/mcp~1fs~0read")]


def test_builtin_default_declares_no_timeouts_and_no_budgets(cli) -> None:  # type: ignore[no-untyped-def]
    data = load_pack("builtin:default").data
    assert "timeouts" not in data and "budgets" not in data
    code, out, _ = cli("explain", "--timeouts", "builtin:default")
    assert code == 0 and "no timeouts: declared" in out
