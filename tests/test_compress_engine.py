"""The compressor engine: rule choice, markers, and the truthfulness rules no rule can switch off
(ctxrules.compressors.api / apply / rules)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from ctxrules.compressors.api import compress_text, compress_tool_output, text_id
from ctxrules.compressors.apply import looks_failed
from ctxrules.compressors.lines import Line, Lines
from ctxrules.compressors.rules import FAILURE_TAIL, CompressorError
from ctxrules.hookspecs import hookimpl
from ctxrules.plugins import build_plugin_manager, collect, default_registry
from ctxrules.vault import Vault, parse_markers, split_lines

REGISTRY = default_registry()  # the built-in actions; a test with a plugin builds its own


def rule(steps: list[dict[str, Any]], argv: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "id": extra.pop("id", "r"),
        "match": {"argv": argv or ["tool"]},
        "steps": steps,
        **extra,
    }


def pack(*rules: dict[str, Any]) -> dict[str, Any]:
    return {"compressors": list(rules)}


def numbered(n: int, fmt: str = "line {i} with some text to make it worth eliding") -> str:
    return "".join(fmt.format(i=i) + "\n" for i in range(1, n + 1))


HEAD5 = [{"use": "head", "with": {"lines": 5}}]


def test_no_rule_no_result() -> None:
    assert compress_text(pack(rule(HEAD5)), "other x", numbered(100), 0, registry=REGISTRY) is None
    assert compress_text({}, "tool", numbered(100), 0, registry=REGISTRY) is None
    assert compress_text(pack(rule(HEAD5)), "", numbered(100), 0, registry=REGISTRY) is None
    assert compress_text(pack(rule(HEAD5)), "tool", "", 0, registry=REGISTRY) is None


def test_every_elision_leaves_a_marker_naming_the_full_output(tmp_path: Path) -> None:
    output = numbered(100)
    vault = Vault(tmp_path)
    result = compress_tool_output(pack(rule(HEAD5)), "cd x && tool --flag", output, 0, vault, registry=REGISTRY)
    assert result is not None
    assert result.rule_id == "r" and result.vault_id == text_id(output)
    assert result.lines_before == 100 and result.elided == 95
    [marker] = parse_markers(result.text)
    assert marker.kind == "lines" and marker.count == 95 and marker.lines == (6, 100)
    assert marker.vault_id == result.vault_id
    assert vault.get(marker.vault_id) == output.encode()
    assert b"".join(split_lines(output.encode())[5:]) == vault.get_lines(marker.vault_id, 6, 100)


def test_a_failing_run_keeps_its_last_lines_whatever_the_rule_says() -> None:
    output = numbered(100)
    result = compress_text(pack(rule(HEAD5)), "tool", output, 2, registry=REGISTRY)
    assert result is not None and result.failed
    shown = result.text.splitlines()
    for i in range(100 - FAILURE_TAIL + 1, 101):
        assert f"line {i} with some text to make it worth eliding" in shown
    [marker] = parse_markers(result.text)
    assert marker.lines == (6, 100 - FAILURE_TAIL)


def test_a_rule_may_keep_a_longer_failure_tail() -> None:
    result = compress_text(pack(rule(HEAD5, failure_tail=30)), "tool", numbered(100), 1, registry=REGISTRY)
    assert result is not None
    assert "line 71 with some text to make it worth eliding" in result.text


def test_a_successful_run_may_lose_its_tail() -> None:
    result = compress_text(pack(rule(HEAD5)), "tool", numbered(100), 0, registry=REGISTRY)
    assert result is not None and "line 100 " not in result.text


def test_unknown_exit_code_is_judged_by_the_output() -> None:
    benign = numbered(100)
    failing = benign + "error: the build failed\n"
    assert not looks_failed(benign) and looks_failed(failing)
    assert compress_text(pack(rule(HEAD5)), "tool", benign, None, registry=REGISTRY).failed is False  # type: ignore[union-attr]
    result = compress_text(pack(rule(HEAD5)), "tool", failing, None, registry=REGISTRY)
    assert result is not None and result.failed and "error: the build failed" in result.text


def test_a_failure_is_never_summarized_as_success() -> None:
    steps = [
        {
            "use": "short_circuit",
            "with": {"when": "done", "unless": ["^$never"], "message": "all good"},
        }
    ]
    output = numbered(50) + "done\n"
    assert compress_text(pack(rule(steps)), "tool", output, 0, registry=REGISTRY).text.startswith("all good")  # type: ignore[union-attr]
    failed = compress_text(pack(rule(steps)), "tool", output, 1, registry=REGISTRY)
    assert failed is None or "all good" not in failed.text


def test_lossless_rules_drop_nothing() -> None:
    steps = [
        {"use": "strip_ansi"},
        {"use": "drop", "with": {"patterns": ["noise"]}},
        {"use": "collapse_repeats"},
    ]
    output = "\x1b[1mtitle\x1b[0m\n" + "noise line that is long enough to matter\n" * 3 + "same\n" * 40
    result = compress_text(pack(rule(steps, lossless=True)), "tool", output, 0, registry=REGISTRY)
    assert result is not None
    assert parse_markers(result.text) == []
    assert result.text.count("noise line that is long enough to matter") == 3
    assert "title" in result.text and "same (x40)" in result.text


def test_raw_equivalent_lossless_call_restores_everything() -> None:
    result = compress_text(pack(rule(HEAD5)), "tool", numbered(30), 0, lossless=True, registry=REGISTRY)
    assert result is None  # nothing dropped and nothing rewritten: no smaller than the input


def test_never_larger_than_the_input() -> None:
    steps = [{"use": "replace", "with": {"pattern": "^", "with": "a much longer prefix "}}]
    assert compress_text(pack(rule(steps)), "tool", numbered(20), 0, registry=REGISTRY) is None
    # A marker that costs more than the lines it replaces is no gain either.
    assert (
        compress_text(
            pack(rule([{"use": "drop", "with": {"patterns": ["^b$"]}}])), "tool", "a\nb\nc\n", 0, registry=REGISTRY
        )
        is None
    )


def test_blank_lines_leave_without_a_marker() -> None:
    output = "".join(f"entry {i} with enough text to be kept here\n\n\n\n" for i in range(40))
    result = compress_text(
        pack(rule([{"use": "squeeze_blank", "with": {"max_run": 0}}])), "tool", output, 0, registry=REGISTRY
    )
    assert result is not None and parse_markers(result.text) == []
    assert result.text.count("entry") == 40


def test_many_elided_runs_share_at_most_max_markers() -> None:
    output = "".join(("drop me, I am noise number %d\n" if i % 5 == 0 else "keep %d\n") % i for i in range(300))
    steps = [{"use": "drop", "with": {"patterns": ["^drop me"]}}]
    for limit in (1, 2, 5):
        result = compress_text(pack(rule(steps, max_markers=limit)), "tool", output, 0, registry=REGISTRY)
        assert result is not None
        markers = parse_markers(result.text)
        assert len(markers) == limit
        assert sum(m.count for m in markers) == 60 == result.elided
        covered = [i for m in markers for i in range(m.lines[0], m.lines[1] + 1)]  # type: ignore[index]
        dropped = [i + 1 for i in range(300) if i % 5 == 0]
        assert set(dropped) <= set(covered)


def test_the_most_specific_rule_wins_then_pack_order() -> None:
    p = pack(
        rule(HEAD5, argv=["*"], id="generic"),
        rule(HEAD5, argv=["git"], id="git"),
        rule(HEAD5, argv=["git", "log"], id="git-log"),
        rule(HEAD5, argv=["git", "log"], id="second"),
    )
    assert compress_text(p, "git log -n 3", numbered(50), 0, registry=REGISTRY).rule_id == "git-log"  # type: ignore[union-attr]
    assert compress_text(p, "git status", numbered(50), 0, registry=REGISTRY).rule_id == "git"  # type: ignore[union-attr]
    assert compress_text(p, "ls", numbered(50), 0, registry=REGISTRY).rule_id == "generic"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("condition", "exit_code", "applies"),
    [
        ("zero", 0, True),
        ("zero", 1, False),
        ("nonzero", 3, True),
        ("nonzero", 0, False),
        (2, 2, True),
        (2, 1, False),
        ([1, 2], 2, True),
        ([1, 2], None, False),
        ("zero", None, True),
    ],
)
def test_exit_code_conditions(condition: Any, exit_code: int | None, applies: bool) -> None:
    r = {"id": "r", "match": {"argv": ["tool"], "exit_code": condition}, "steps": HEAD5}
    result = compress_text(pack(r), "tool", numbered(60), exit_code, registry=REGISTRY)
    assert (result is not None) is applies


def test_disabled_rules_do_not_apply() -> None:
    assert compress_text(pack(rule(HEAD5, enabled=False)), "tool", numbered(60), 0, registry=REGISTRY) is None


def _plugin_registry(fn: Callable[[Lines], Any], schema: Mapping[str, Any] | None = None) -> Any:
    class Plugin:
        @staticmethod
        @hookimpl
        def ctxrules_register_actions(register: Callable[..., None]) -> None:
            register("acme.odd", lambda options: fn, schema, "a test action")

    pm, infos = build_plugin_manager([("acme", Plugin())], entry_points=False)
    return collect(pm, infos)


def test_a_third_party_action_is_a_peer_of_the_builtins() -> None:
    registry = _plugin_registry(lambda lines: [ln for ln in lines if int(ln.split()[1]) % 2])
    p = pack(rule([{"use": "acme.odd"}]))
    result = compress_text(p, "tool", numbered(40), 0, registry=registry)
    assert result is not None and "line 3 " in result.text and "line 4 " not in result.text
    assert len(parse_markers(result.text)) == 2


def test_rules_built_with_one_registry_are_not_used_for_another_at_its_address(monkeypatch: pytest.MonkeyPatch) -> None:
    # Compiled rules were cached by the registry's id without keeping the registry alive: a
    # registry built later at the same address ran the first one's actions. Every object
    # here gets the same id, as a registry built where a collected one was would.
    import ctxrules.compressors.rules as rules_module

    monkeypatch.setattr(rules_module, "id", lambda obj: 1, raising=False)
    p = pack(rule([{"use": "acme.odd"}]))
    first = _plugin_registry(lambda lines: [ln for ln in lines if int(ln.split()[1]) % 2])
    assert compress_text(p, "tool", numbered(40), 0, registry=first) is not None
    second = _plugin_registry(lambda lines: [ln for ln in lines if not int(ln.split()[1]) % 2])
    for compressors in (p, pack(rule([{"use": "acme.odd"}]))):  # the same rules list, an equal one
        result = compress_text(compressors, "tool", numbered(40), 0, registry=second)
        assert result is not None and "line 4 " in result.text and "line 3 " not in result.text


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (lambda lines: "not a list", "must return a list of str"),
        (lambda lines: [1, 2], "must return a list of str"),
        (lambda lines: 1 / 0, "ZeroDivisionError"),
        (lambda lines: [Line("x", (1, 999))], "claims original lines 1-999"),
    ],
)
def test_a_misbehaving_action_names_rule_and_step(fn: Callable[[Lines], Any], message: str) -> None:
    registry = _plugin_registry(fn)
    with pytest.raises(CompressorError, match=message) as err:
        compress_text(
            pack(rule([{"use": "strip_ansi"}, {"use": "acme.odd"}])),
            "tool",
            numbered(5),
            0,
            registry=registry,
        )
    assert "compressor 'r'" in str(err.value)


def test_unknown_action_at_run_time_is_a_clear_error() -> None:
    with pytest.raises(CompressorError, match=r"unknown action 'dorp'.*did you mean 'drop'"):
        compress_text(pack(rule([{"use": "dorp"}])), "tool", numbered(5), 0, registry=REGISTRY)


def test_odd_text_round_trips_through_the_vault(tmp_path: Path) -> None:
    output = "ünïcode ✓\r\n" * 3 + "lone \udc80 surrogate\n" + numbered(60) + "no newline at end"
    vault = Vault(tmp_path)
    result = compress_tool_output(pack(rule(HEAD5)), "tool", output, 0, vault, registry=REGISTRY)
    assert result is not None
    assert vault.get_text(result.vault_id) == output
    [marker] = parse_markers(result.text)
    assert marker.lines == (6, 65)
    assert not result.text.endswith("\n")


def test_the_exit_code_line_is_never_elided() -> None:
    p = {**pack(rule(HEAD5)), "tools": {"exit_code": [r"Exit code:? (\d+)"]}}
    output = "Exit code 0\n" + numbered(100)
    result = compress_text(
        {**p, "compressors": [rule([{"use": "tail", "with": {"lines": 3}}])]}, "tool", output, 0, registry=REGISTRY
    )
    assert result is not None and result.text.startswith("Exit code 0\n")
    assert "line 100 " in result.text and "line 50 " not in result.text
