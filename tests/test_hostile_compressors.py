"""Hostile compressor rules through the real CLI: located diagnostics, bounded memory, no hang.

A pack's compressors are data someone else may have written. Their text options (format
strings, ``replace`` replacements) and their number of steps are bounded
(:mod:`ctxrules.compressors.limits`): ``ctxrules validate`` reports a breach at the option
(CR061) or the step (CR014) without formatting or running anything, the same check refuses the
rule when a pack reaches the engine without validation, and what a valid step writes while it
runs is bounded by its input (the step fails: the output is printed unchanged, with a warning).

Every CLI run here is a subprocess under an address-space cap (``RLIMIT_AS``): without the
bounds, each case asked for gigabytes (an OOM kill after 118 s at 24 GB for the first one), so
the cap turns a regression into a MemoryError, a crash or a timeout instead of a dead machine,
and no test depends on how fast the machine is.
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ctxrules.compressors.actions.templates import Replacement
from ctxrules.compressors.limits import (
    FORMAT_WIDTH_MAX,
    MAX_STEPS,
    OUTPUT_GROWTH,
    OUTPUT_SLACK,
    TEMPLATE_MAX,
    OptionError,
)
from ctxrules.patterns import compile as patterns_compile

REPO = Path(__file__).resolve().parents[1]
HEAD = "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: hostile, version: 1.0.0}\n"
CAP = 1024**3  # address space of every CLI run: ctxrules needs a few hundred MB at most


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))


def run(*argv: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``ctxrules ARGV`` in a fresh process under :data:`CAP`."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "engine"), "CTXRULES_STATE": str(cwd / "state")}
    env.pop("CTXRULES_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "ctxrules.cli.main", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=_capped,
        check=False,
    )


def python(code: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python`` running ``code`` on this tree's engine, under :data:`CAP`."""
    return subprocess.run(
        [sys.executable, "-"],
        input=textwrap.dedent(code),  # on standard input: a long one is no argument list too long
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO / "engine")},
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=_capped,
        check=False,
    )


def compress(pack: str, source: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run("compress", "--pack", pack, "--state", str(cwd / "S"), "--command", "foo", "--input", source, cwd=cwd)


def clean(proc: subprocess.CompletedProcess[str]) -> str:
    both = proc.stdout + proc.stderr
    assert "Traceback" not in both and "internal error" not in both, both
    assert "MemoryError" not in both, both
    return both


def pack_with_steps(folder: Path, steps: str, name: str = "p.yaml") -> Path:
    """``name``: one compressor for ``foo`` whose ``steps:`` block is ``steps`` (YAML lines)."""
    path = folder / name
    body = "compressors:\n  - id: c\n    match: {argv: [foo]}\n    steps:\n" + textwrap.indent(steps, "      ")
    path.write_text(HEAD + body, encoding="utf-8")
    return path


def where(path: Path, needle: str) -> str:
    """``file:line:col`` of the first ``needle`` in ``path``, as diagnostics give it."""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if needle in line:
            return f"{path.name}:{number}:{line.index(needle) + 1}"
    raise AssertionError(f"{needle!r} is not in {path}")


# -- 1. format strings -------------------------------------------------------------------------

FORMAT_STEPS = {
    # action: (the step, with the option's value last and alone on its line; what the value is)
    "collapse_repeats": "- use: collapse_repeats\n  with:\n    format: {value}\n",
    "group": "- use: group\n  with:\n    pattern: '^(?P<key>[^:]+):(?P<rest>.*)$'\n    header: {value}\n",
    "carry": "- use: carry\n  with:\n    header: '^(?P<file>\\S+):$'\n    pattern: '^(?P<l>\\d+)'\n    with: {value}\n",
    "short_circuit": "- use: short_circuit\n  with:\n    when: '^(?P<count>x+)$'\n    message: {value}\n",
}
FIELD = {"collapse_repeats": "count", "group": "key", "carry": "file", "short_circuit": "count"}


@pytest.mark.parametrize("action", sorted(FORMAT_STEPS))
@pytest.mark.parametrize(
    ("spec", "why"),
    [
        (">9999999999", "over the limit of 1,000"),  # took 14 s and 9.8 GB to validate, 0 errors
        (">99999999999", "over the limit of 1,000"),  # was CR061 with an empty reason (MemoryError)
        ("0999999999", "over the limit of 1,000"),
        (".999999", "over the limit of 1,000"),
        (">" + "9" * 900, "900 digits"),
        (">\u0669\u0669\u0669\u0669", "over the limit of 1,000"),  # ARABIC-INDIC DIGIT NINE: a width too
        ("{l}", "may not contain fields"),  # a width taken from the output
    ],
)
def test_a_format_field_beyond_the_limits_is_a_located_cr061(tmp_path: Path, action: str, spec: str, why: str) -> None:
    value = json.dumps("{" + FIELD[action] + ":" + spec + "}")
    pack = pack_with_steps(tmp_path, FORMAT_STEPS[action].format(value=value))
    proc = run("validate", "p.yaml", cwd=tmp_path)
    out = clean(proc)
    assert proc.returncode == 1, out
    assert f"{where(pack, value)}: error[CR061]" in out, out
    assert why in out and "1 error(s)" in out, out


@pytest.mark.parametrize("action", sorted(FORMAT_STEPS))
@pytest.mark.parametrize(
    ("template", "why"),
    [
        ("{FIELD.__class__}", "without attribute or index lookups"),
        ("{FIELD[0]}", "without attribute or index lookups"),
        ("{}", "{}"),
        ("{0}", "{0}"),
        ("{FIELD!x}", "unknown conversion"),
        ("{FIELD", "not a valid format string"),
        ("x" * (TEMPLATE_MAX + 1), "1,001 characters long; the limit is 1,000"),
    ],
)
def test_format_strings_take_plain_fields_only(tmp_path: Path, action: str, template: str, why: str) -> None:
    value = json.dumps(template.replace("FIELD", FIELD[action]))
    pack = pack_with_steps(tmp_path, FORMAT_STEPS[action].format(value=value))
    proc = run("validate", "p.yaml", cwd=tmp_path)
    out = clean(proc)
    assert proc.returncode == 1, out
    assert f"{where(pack, value[:40])}: error[CR061]" in out and why in out, out


def test_the_fuzzers_format_width_pack_is_refused_by_compress_too(tmp_path: Path) -> None:
    """/tmp/fuzzA/min/fmtwidth2.yaml, as a user runs it: OOM-killed after 118 s at 24 GB."""
    pack = pack_with_steps(tmp_path, '- {use: collapse_repeats, with: {format: "{count:>9999999999}"}}\n')
    (tmp_path / "in2.txt").write_text("x\nx\n", encoding="utf-8")
    proc = compress("p.yaml", "in2.txt", tmp_path)
    out = clean(proc)
    assert proc.returncode != 0 and proc.stdout == "", out
    location = where(pack, '"{count')
    assert f"{location}: error[CR061]" in out and "over the limit of 1,000" in out, out


RUN_WITHOUT_VALIDATION = """
from ctxrules.compressors.api import compress_text
from ctxrules.compressors.rules import CompressorError
from ctxrules.plugins import default_registry

steps = {steps}
pack = {{"compressors": [{{"id": "c", "match": {{"argv": ["foo"]}}, "steps": steps}}]}}
try:
    result = compress_text(pack, "foo", {text!r}, 0, registry=default_registry())
except CompressorError as exc:
    print("refused:", exc)
else:
    print("result:", None if result is None else result.text)
"""


@pytest.mark.parametrize(
    ("step", "why"),
    [
        ({"use": "collapse_repeats", "with": {"format": "{count:>9999999999}"}}, "over the limit of 1,000"),
        ({"use": "collapse_repeats", "with": {"format": "{line.__class__}"}}, "attribute or index"),
        (
            {"use": "carry", "with": {"header": "^(?P<file>\\S+):$", "pattern": "^(?P<l>\\d+)", "with": "{file:>{l}}"}},
            "may not contain fields",
        ),
        ({"use": "short_circuit", "with": {"when": "(?P<a>x)", "message": "{a:>999999999}"}}, "over the limit"),
        ({"use": "group", "with": {"pattern": "(?P<key>x)", "header": "{key:.99999999}"}}, "over the limit"),
        ({"use": "replace", "with": {"pattern": "(x)", "with": "\\1" * 300_000}}, "the limit is 1,000"),
        ({"use": "replace", "with": {"pattern": "(x)", "with": "\\q"}}, "bad escape \\q"),
    ],
)
def test_a_pack_that_skips_validation_cannot_use_the_option_either(tmp_path: Path, step: object, why: str) -> None:
    """The engine builds each action with the same checks: a pack handed to the Python API
    without validation gets the rule refused (``CompressorError``: ``ctxrules compress`` and the
    ``tool_output.filter`` stage print the output unchanged with a warning), nothing formatted."""
    proc = python(RUN_WITHOUT_VALIDATION.format(steps=json.dumps([step]), text="x\nx\n" * 2000), tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("refused: compressor 'c', step 1") and why in proc.stdout, proc.stdout


def test_everyday_format_strings_keep_working(tmp_path: Path) -> None:
    pack_with_steps(
        tmp_path,
        textwrap.dedent(
            """\
            - use: collapse_repeats
              with: {format: '{line!r:<12} [x{count:>4,}] {{literal}}'}
            - use: group
              with: {pattern: '^(?P<key>[a-z]+[.]py):(?P<rest>.*)$', header: '== {key:^12} =='}
            - use: short_circuit
              with: {when: '^all (?P<n>\\d+) ok$', message: '{{ok}}: {n:>5.3} passed'}
            """
        ),
    )
    lines = ["same"] * 1500 + ["a.py:1: e", "a.py:9: f", "b.py:2: g"] + ["x"] * 200
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    proc = compress("p.yaml", "in.txt", tmp_path)
    out = clean(proc)
    assert proc.returncode == 0, out
    assert proc.stdout.splitlines()[:6] == [
        f"{'same'!r:<12} [x{1500:>4,}] {{literal}}",
        f"== {'a.py':^12} ==",
        "  1: e",
        "  9: f",
        "b.py:2: g",
        f"{'x'!r:<12} [x{200:>4,}] {{literal}}",
    ]
    (tmp_path / "ok.txt").write_text("." * 400 + "\nall 12345 ok\n", encoding="utf-8")
    proc = compress("p.yaml", "ok.txt", tmp_path)
    assert clean(proc) and proc.stdout.startswith("{ok}:   123 passed\n[ctxrules:elided kind=lines count=2 "), (
        proc.stdout
    )


def test_carry_keeps_its_templates_and_a_literal_brace(tmp_path: Path) -> None:
    pack_with_steps(
        tmp_path,
        "- use: carry\n"
        "  with: {header: '^In (?P<file>\\S+) line', pattern: '^ *(?P<rest>SC\\d+.*)$',\n"
        "         with: '{file}: {rest} {{x}}'}\n"
        "- {use: collapse_repeats}\n",
    )
    text = "In a.sh line 3:\n" + "  SC2086 quote this\n" * 60 + "In b.sh line 1:\n  SC1000 odd\n"
    (tmp_path / "in.txt").write_text(text, encoding="utf-8")
    proc = compress("p.yaml", "in.txt", tmp_path)
    out = clean(proc)
    assert proc.returncode == 0, out
    assert proc.stdout.splitlines() == [
        "In a.sh line 3:",
        "a.sh: SC2086 quote this {x} (x60)",
        "In b.sh line 1:",
        "b.sh: SC1000 odd {x}",
    ], out


# -- 2. what a step writes -------------------------------------------------------------------

GROWING = {
    # a valid step that writes far more than it reads; the input it runs on
    "replace": (
        "- {use: replace, with: {pattern: '(x+)', with: '" + "\\1" * 400 + "'}}\n",
        ("x" * 1000 + "\n") * 2000,  # 800 MB of output: 400 copies of each line
    ),
    "carry": (
        "- {use: carry, with: {header: '^(?P<file>f\\S+)$', pattern: '^(?P<n>\\d+)$', with: '{file}:{n}'}}\n",
        "f" + "n" * 1_000_000 + "\n" + "".join(f"{i}\n" for i in range(25_000)),  # 25 GB: the name on each line
    ),
    "short_circuit": (
        "- {use: short_circuit, with: {when: '(?s)(?P<a>.+)', unless: [zzz], message: '" + "{a}" * 300 + "'}}\n",
        ("x" * 1000 + "\n") * 2000,  # 600 MB: the whole output 300 times
    ),
    "group": (
        "- {use: group, with: {pattern: '^(?P<key>k):(?P<rest>.*)$', indent: '" + "i" * 1000 + "'}}\n",
        "k:a\n" * 100_000,  # 100 MB: a 1,000-character indent on each line
    ),
    "collapse_repeats": (
        "- {use: collapse_repeats, with: {format: '" + "{count:>999}" * 80 + "'}}\n",
        "x\nx\ny\n" * 60_000,  # 4.8 GB: 80,000 characters for each pair of lines
    ),
}


@pytest.mark.parametrize("action", sorted(GROWING))
def test_a_step_that_would_grow_the_output_past_its_bound_fails_with_a_warning(tmp_path: Path, action: str) -> None:
    steps, text = GROWING[action]
    pack_with_steps(tmp_path, steps)
    assert clean(run("validate", "p.yaml", cwd=tmp_path)).endswith("0 error(s), 0 warning(s)\n")
    (tmp_path / "in.txt").write_text(text, encoding="utf-8")
    proc = compress("p.yaml", "in.txt", tmp_path)
    out = clean(proc)
    assert proc.returncode == 0, out
    assert proc.stdout == text, "the output is printed as it was"
    assert f"step 1 ({action}) failed: OutputTooLarge: {action} would write more than" in proc.stderr, out
    assert f"({OUTPUT_GROWTH} times its input of" in proc.stderr, out


def test_a_step_within_its_bound_still_grows_lines(tmp_path: Path) -> None:
    """Tabs expanded to 8 spaces are 8 times their input (the bound), a prefix on short lines
    fits the slack; a later step brings the output under the input's size."""
    pack_with_steps(
        tmp_path,
        "- {use: replace, with: {pattern: '\\t', with: '        '}}\n"
        "- {use: replace, with: {pattern: '^', with: '[ok] '}}\n"
        "- {use: head, with: {lines: 3}}\n",
    )
    (tmp_path / "in.txt").write_text("\t\t\n" * 300, encoding="utf-8")
    proc = compress("p.yaml", "in.txt", tmp_path)
    out = clean(proc)
    assert proc.returncode == 0 and "warning" not in proc.stderr, out
    assert proc.stdout.splitlines()[:3] == ["[ok] " + " " * 16] * 3


def test_the_budget_is_the_documented_one() -> None:
    from ctxrules.compressors.actions.templates import OutputBudget
    from ctxrules.compressors.limits import OutputTooLarge

    budget = OutputBudget(["abc", ""], "replace")  # 3 + 1 + 0 + 1 characters
    budget.charge(OUTPUT_GROWTH * 5 + OUTPUT_SLACK)
    with pytest.raises(OutputTooLarge, match=r"more than 10,040 characters"):
        budget.charge(1)


# -- 3. replacements ---------------------------------------------------------------------------


def test_the_fuzzers_expanding_replacement_is_refused_at_validate(tmp_path: Path) -> None:
    """/tmp/fuzzA/min/expand.yaml: 16 s and 1.8 GB for 2,000 lines of x."""
    value = json.dumps("\\1" * 300_000)
    pack = pack_with_steps(tmp_path, f"- use: replace\n  with:\n    pattern: '(x)'\n    with: {value}\n")
    (tmp_path / "in.txt").write_text("x\n" * 2000, encoding="utf-8")
    for proc in (run("validate", "p.yaml", cwd=tmp_path), compress("p.yaml", "in.txt", tmp_path)):
        out = clean(proc)
        assert proc.returncode == 1, out
        assert f"{where(pack, value[:20])}: error[CR061]" in out, out
        assert "'with' is 600,000 characters long; the limit is 1,000" in out, out


@pytest.mark.parametrize(
    ("template", "why"),
    [
        ("\\q", "bad escape \\q"),
        ("\\d", "bad escape \\d"),
        ("\\E", "bad escape \\E"),
        ("ab\\", "lone backslash"),
        ("\\x4", "incomplete escape \\x4"),
        ("\\N{NO SUCH CHARACTER}", "names no character"),
        ("\\N-", "bad escape \\N"),
        ("\\2", "refers to group 2"),
        ("\\g<2>", "refers to group 2"),
        ("\\g<nope>", "refers to group 'nope'"),
        ("\\g<a b>", "bad character in group name"),
        ("\\g<>", "without a group name"),
        ("\\g<1", "without its closing >"),
        ("\\g1", "\\g without <name>"),
    ],
)
def test_a_bad_replacement_is_a_located_cr061_at_validate(tmp_path: Path, template: str, why: str) -> None:
    """They passed validate and failed on the first matching line of a compress."""
    value = json.dumps(template)
    pack = pack_with_steps(tmp_path, f"- use: replace\n  with:\n    pattern: '(?P<a>x)'\n    with: {value}\n")
    proc = run("validate", "p.yaml", cwd=tmp_path)
    out = clean(proc)
    assert proc.returncode == 1, out
    assert f"{where(pack, value)}: error[CR061] action 'replace': 'with' " in out and why in out, out


# The regex module ran every replacement with a backslash until now; ctxrules parses them as it
# does and must give the same text for every template it accepts, and refuse the ones it refuses.
TEMPLATES = [
    "",
    "plain",
    "\\1",
    "<\\1|\\2>",
    "\\g<0>",
    "\\g<1>\\g<word>",
    "\\g<01>",
    "\\g<\u0661>",  # ARABIC-INDIC DIGIT ONE: a digit int() reads
    "\\0",
    "\\07",
    "\\012x",
    "\\141",
    "\\18",
    "\\19x",
    "\\777",
    "\\12",
    "\\n\\t\\r\\a\\b\\f\\v",
    "\\\\1",
    "\\-\\.\\ \\é",
    "\\x41\\u00e9\\U0001F600",
    "\\N{EM DASH}\\N{LATIN SMALL LETTER A}",
    "\\q",
    "\\x4",
    "\\g<+1>",
    "\\g< 1>",
    "\\g<99>",
    "\\3",
    "\\g<word",
    "\\N{}",
    "\\",
]


@pytest.mark.parametrize("template", TEMPLATES)
def test_replacements_read_as_the_regex_module_reads_them(template: str) -> None:
    import regex  # type: ignore[import-untyped]

    pattern = r"(?P<word>[a-z]+)(\d)?"
    ours = patterns_compile(pattern)
    theirs = regex.compile(pattern, regex.VERSION0)
    line = "abc1 de, f"
    try:
        expected: str | None = theirs.sub(template, line)
    except (regex.error, IndexError):
        expected = None
    try:
        replacement = Replacement(template, ours.groups, ours.groupindex)
    except OptionError as exc:
        assert expected is None, f"refused what regex accepts: {exc}"
        assert exc.option == "with"
        return
    assert expected is not None, "accepted what regex refuses"
    assert ours.sub(replacement.expand, line) == expected


# -- 4. steps ----------------------------------------------------------------------------------


def test_more_steps_than_the_limit_are_a_located_error(tmp_path: Path) -> None:
    """/tmp/fuzzA/min/steps.yaml: 20,000 steps cost 12 s on 2,000 lines."""
    pack = pack_with_steps(tmp_path, "- {use: strip_ansi}\n" * 20_000)
    proc = run("validate", "p.yaml", cwd=tmp_path)
    out = clean(proc)
    assert proc.returncode == 1, out
    first_over = 3 + 4 + MAX_STEPS + 1  # HEAD, the rule's four lines, then the steps
    assert f"p.yaml:{first_over}:9: error[CR014] compressor 'c' has 20,000 steps; the limit is 100" in out, out
    assert out.count("error[") == 1, out
    assert pack.exists()


def test_the_limit_of_steps_is_allowed(tmp_path: Path) -> None:
    pack_with_steps(tmp_path, "- {use: strip_ansi}\n" * (MAX_STEPS - 1) + "- {use: head, with: {lines: 2}}\n")
    (tmp_path / "in.txt").write_text("line\n" * 2000, encoding="utf-8")
    assert run("validate", "p.yaml", cwd=tmp_path).returncode == 0
    proc = compress("p.yaml", "in.txt", tmp_path)
    out = clean(proc)
    assert proc.returncode == 0 and proc.stdout.startswith("line\nline\n[ctxrules:elided"), out


def test_a_pack_that_skips_validation_cannot_have_more_steps(tmp_path: Path) -> None:
    proc = python(RUN_WITHOUT_VALIDATION.format(steps="[{'use': 'strip_ansi'}] * 20_000", text="x\n" * 2000), tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "refused: compressor 'c' has 20,000 steps; the limit is 100"


# -- the built-in packs ------------------------------------------------------------------------


def test_the_builtin_packs_stay_within_the_limits(tmp_path: Path) -> None:
    proc = run("validate", str(REPO / "rules"), cwd=tmp_path)
    assert proc.returncode == 0, clean(proc)
    import yaml

    for path in sorted((REPO / "rules" / "compressors").glob("*.yaml")):
        for rule in yaml.safe_load(path.read_text(encoding="utf-8")).get("compressors") or []:
            steps = rule.get("steps") or []
            assert len(steps) <= MAX_STEPS // 5, (path.name, rule["id"])  # far below the limit
            for step in steps:
                for value in (step.get("with") or {}).values():
                    if isinstance(value, str):
                        assert len(value) <= TEMPLATE_MAX // 4, (path.name, rule["id"])
                        for digits in re.findall(r"\{[a-z]+:[^}]*?(\d+)", value):
                            assert int(digits) <= FORMAT_WIDTH_MAX, (path.name, rule["id"])
