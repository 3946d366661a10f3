"""Hostile packs through the real CLI: nothing outside the pack is read, nothing hangs.

Each test writes a pack an attacker could commit to a repository, runs ``python -m
ctxrules.cli.main`` on it in a subprocess (with a generous timeout: a hang fails the test) and
checks the clean outcome: the documented exit code, a one-line located message, no traceback,
and none of the target's content in the output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from ctxrules import patterns

REPO = Path(__file__).resolve().parents[1]
HEAD = "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: hostile, version: 1.0.0}\n"
SECRET = "ctxrules-s3cret-value-4711"  # planted in the environment and in files outside the pack


def ctxrules(*argv: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO / "engine"),
        "CTXRULES_STATE": str(cwd / "state"),
        "CTXRULES_TEST_SECRET": SECRET,
    }
    env.pop("CTXRULES_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "ctxrules.cli.main", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def clean(proc: subprocess.CompletedProcess[str]) -> str:
    """stdout+stderr, after checking that neither holds a traceback or a leaked secret."""
    both = proc.stdout + proc.stderr
    assert "Traceback" not in both and "internal error" not in both, both
    assert SECRET not in both, "content from outside the pack was printed"
    assert "root:x:0:0" not in both, "/etc/passwd was printed"
    return both


def write(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(HEAD + textwrap.dedent(body), encoding="utf-8")
    return path


def write_prompt(folder: Path, template: str) -> Path:
    """``p.yaml``: a pack whose one prompt mode ``full`` is one section of ``template``."""
    return write(
        folder,
        "p.yaml",
        f"""\
        prompts:
          sections:
            identity: {{tag: identity, template: {json.dumps(template)}}}
          modes:
            full: [identity]
        """,
    )


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A file next to (not inside) the pack's folder, holding the secret."""
    secret = tmp_path / "private" / "notes.md"
    secret.parent.mkdir()
    secret.write_text(f"{SECRET}\n", encoding="utf-8")
    return secret


def _template_pack(folder: Path, target: str) -> Path:
    return write(
        folder,
        "pack/p.yaml",
        f"""\
        prompts:
          sections:
            identity: {{tag: identity, file: {json.dumps(target)}}}
          modes:
            full: [identity]
        """,
    )


# -- 1. confinement ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "target",
    ["/etc/passwd", "/proc/self/environ", "../private/notes.md", "../../../../../../../../../../etc/passwd", "link.md"],
)
def test_a_template_file_outside_the_pack_is_refused(tmp_path: Path, outside: Path, target: str) -> None:
    pack = _template_pack(tmp_path, target)
    (pack.parent / "link.md").symlink_to(outside)  # a symlink inside the pack, to outside
    for argv in (
        ["assemble", "--pack", "pack/p.yaml", "--mode", "full", "--model", "gpt-4o"],
        ["validate", "pack/p.yaml"],
    ):
        proc = ctxrules(*argv, cwd=tmp_path)
        out = clean(proc)
        assert proc.returncode == 1, out
        assert "CR100" in out and "outside the pack's folder" in out, out


def test_the_callers_search_path_allows_a_folder(tmp_path: Path, outside: Path) -> None:
    _template_pack(tmp_path, "../private/notes.md")
    proc = ctxrules(
        "assemble",
        "--pack",
        "pack/p.yaml",
        "--mode",
        "full",
        "--model",
        "gpt-4o",
        "--search-path",
        str(outside.parent),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert SECRET in proc.stdout, "the caller allowed that folder"


@pytest.mark.parametrize("target", ["/etc/passwd", "/etc/shadow", "../private/notes.md", "link.yaml"])
def test_extends_outside_the_pack_is_refused_without_echoing_the_file(
    tmp_path: Path, outside: Path, target: str
) -> None:
    pack = write(tmp_path, "pack/p.yaml", f"extends: {json.dumps(target)}\n")
    (pack.parent / "link.yaml").symlink_to(outside)
    proc = ctxrules("validate", "pack/p.yaml", cwd=tmp_path)
    out = clean(proc)
    assert proc.returncode == 1
    assert "error[CR100]" in out and "p.yaml:4:" in out, out


def test_a_builtin_name_cannot_climb_out_of_the_package(tmp_path: Path) -> None:
    write(tmp_path, "p.yaml", "extends: ['builtin:../../../../../../etc/passwd']\n")
    proc = ctxrules("validate", "p.yaml", cwd=tmp_path)
    out = clean(proc)
    assert proc.returncode == 1 and "CR030" in out, out


def test_pack_test_inputs_outside_the_pack_are_not_read(tmp_path: Path, outside: Path) -> None:
    messages = tmp_path / "private" / "msgs.json"
    messages.write_text(json.dumps([{"role": "user", "content": SECRET}]), encoding="utf-8")
    write(
        tmp_path,
        "pack/p.yaml",
        """\
        tests:
          - {id: leak, input: ../private/msgs.json, expect: {contains: [nothing]}}
        compressors:
          - id: cut
            match: {argv: [tool]}
            steps: [{use: head, with: {lines: 1}}]
            tests:
              - {id: leak2, input: ../private/notes.md, contains: [nothing]}
        """,
    )
    proc = ctxrules("validate", "pack/p.yaml", cwd=tmp_path)
    out = clean(proc)
    assert proc.returncode == 1 and out.count("error[CR100]") == 2, out
    proc = ctxrules("test", "pack/p.yaml", cwd=tmp_path)
    out = clean(proc)
    assert proc.returncode == 1, out


# -- 3. no pack can hang or exhaust the engine -----------------------------------------------

EVIL = "(a+)+$"
OUTPUT = "a" * 40_000 + "b\n"


def test_a_catastrophic_compressor_pattern_is_skipped_not_hung(tmp_path: Path) -> None:
    write(
        tmp_path,
        "p.yaml",
        f"""\
        compressors:
          - id: evil
            match: {{argv: [tool]}}
            steps:
              - use: drop
                with: {{patterns: ['{EVIL}']}}
          - id: evil-short
            match: {{argv: [other]}}
            steps:
              - use: short_circuit
                with: {{when: '(a+)+\\d', message: done, unless: ['x']}}
          - id: linear
            match: {{argv: [third]}}
            steps:
              - use: short_circuit
                with: {{when: '{EVIL}', message: done, unless: ['x']}}
        """,
    )
    (tmp_path / "out.txt").write_text(OUTPUT, encoding="utf-8")
    for command, evil in (("tool", EVIL), ("other", "(a+)+\\d"), ("third", None)):
        started = time.monotonic()
        proc = ctxrules(
            "compress", "--pack", "p.yaml", "--command", command, "--input", "out.txt", cwd=tmp_path, timeout=60
        )
        out = clean(proc)
        assert proc.returncode == 0, out
        assert proc.stdout == OUTPUT, "the output goes out as it was"
        if evil is None:  # `when` is multi-line: `$` means the same on RE2, which is linear
            assert proc.stderr == ""
        else:
            assert "skipped" in proc.stderr and repr(evil) in proc.stderr, proc.stderr
        assert time.monotonic() - started < 40


def _evil_compressor(tmp_path: Path) -> None:
    """p.yaml: a compressor for `tool` whose one pattern backtracks on OUTPUT; out.txt: OUTPUT."""
    write(
        tmp_path,
        "p.yaml",
        f"""\
        compressors:
          - id: evil
            match: {{argv: [tool]}}
            steps:
              - use: drop
                with: {{patterns: ['{EVIL}']}}
        """,
    )
    (tmp_path / "out.txt").write_text(OUTPUT, encoding="utf-8")


def test_compress_remembers_a_timed_out_pattern_across_processes(tmp_path: Path) -> None:
    """Two separate `ctxrules compress` processes: the first times the pattern out, the second
    skips it without running it (its own words on stderr), and both print the same bytes."""
    _evil_compressor(tmp_path)
    argv = ("compress", "--pack", "p.yaml", "--command", "tool", "--input", "out.txt")
    first = ctxrules(*argv, cwd=tmp_path, timeout=60)
    clean(first)
    assert first.returncode == 0 and first.stdout == OUTPUT, first.stderr
    assert "took longer than" in first.stderr and "earlier run" not in first.stderr, first.stderr
    state = json.loads((tmp_path / "state" / "default" / "state.json").read_text(encoding="utf-8"))
    assert state["compress"][patterns.STATE_KEY] == [patterns.compile(EVIL).key]
    second = ctxrules(*argv, cwd=tmp_path, timeout=60)
    clean(second)
    assert second.returncode == 0 and second.stdout == first.stdout
    assert "timed out in an earlier run and is skipped" in second.stderr, second.stderr
    assert "took longer than" not in second.stderr, "the second process ran the pattern again"
    # Proxy mode (running the command) reads the same memory.
    tool = tmp_path / "bin" / "tool"
    tool.parent.mkdir()
    tool.write_text(f"#!/bin/sh\ncat '{tmp_path / 'out.txt'}'\n", encoding="utf-8")
    tool.chmod(0o755)
    proxy = ctxrules("compress", "--pack", "p.yaml", "--", str(tool), cwd=tmp_path, timeout=60)
    clean(proxy)
    assert proxy.returncode == 0 and proxy.stdout == OUTPUT
    assert "timed out in an earlier run and is skipped" in proxy.stderr, proxy.stderr


def test_compress_memory_in_a_symlinked_state_is_refused_not_followed(tmp_path: Path) -> None:
    _evil_compressor(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n", encoding="utf-8")
    (tmp_path / "state" / "default").mkdir(parents=True)
    (tmp_path / "state" / "default" / "state.json").symlink_to(victim)
    proc = ctxrules("compress", "--pack", "p.yaml", "--command", "tool", "--input", "out.txt", cwd=tmp_path)
    clean(proc)
    assert proc.returncode == 0 and proc.stdout == OUTPUT
    assert "symbolic link" in proc.stderr and "not remembered" in proc.stderr, proc.stderr
    assert victim.read_text(encoding="utf-8") == "precious\n"


def test_validate_warns_about_nested_quantifiers(tmp_path: Path) -> None:
    write(
        tmp_path,
        "p.yaml",
        f"""\
        priorities:
          - {{id: evil, match: {{contains: '{EVIL}'}}, priority: critical}}
        """,
    )
    proc = ctxrules("validate", "p.yaml", cwd=tmp_path)
    out = clean(proc)
    assert proc.returncode == 0 and "warning[CR102]" in out and "p.yaml:5:" in out, out
    assert ctxrules("validate", "--strict", "p.yaml", cwd=tmp_path).returncode == 1


def _messages(tmp_path: Path) -> Path:
    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": "tool"})}}
    msgs = [
        {"role": "system", "content": "You help."},
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": OUTPUT},
        {"role": "user", "content": "a" * 30_000 + "b"},
    ]
    path = tmp_path / "msgs.json"
    path.write_text(json.dumps(msgs), encoding="utf-8")
    return path


def test_run_survives_catastrophic_patterns_and_remembers_them(tmp_path: Path) -> None:
    write(
        tmp_path,
        "p.yaml",
        f"""\
        extends: builtin:default
        tools:
          exit_code: ['{EVIL[:-1]}(\\d+)$']
        priorities:
          - {{id: evil, match: {{contains: '{EVIL}'}}, priority: critical}}
        """,
    )
    _messages(tmp_path)
    argv = (
        "run",
        "--pack",
        "p.yaml",
        "--model",
        "gpt-4o",
        "--input",
        "msgs.json",
        "--report",
        "r.json",
        "--session",
        "s",
    )
    started = time.monotonic()
    first = ctxrules(*argv, cwd=tmp_path, timeout=120)
    first_s = time.monotonic() - started
    clean(first)
    assert first.returncode == 0, first.stderr
    report = json.loads((tmp_path / "r.json").read_text(encoding="utf-8"))
    warned = [w for st in report["stages"] for w in st.get("warnings", [])] + [
        st.get("error") or "" for st in report["stages"]
    ]
    assert any("took longer than" in w for w in warned), warned
    assert json.loads(first.stdout), "the conversation is still there"
    state = json.loads((tmp_path / "s" / "state.json").read_text(encoding="utf-8"))
    assert patterns.STATE_KEY in json.dumps(state), "the timeout is remembered with the session"
    started = time.monotonic()
    second = ctxrules(*argv, cwd=tmp_path, timeout=120)
    clean(second)
    assert second.returncode == 0
    report = json.loads((tmp_path / "r.json").read_text(encoding="utf-8"))
    warned = [w for st in report["stages"] for w in st.get("warnings", [])] + [
        st.get("error") or "" for st in report["stages"]
    ]
    assert any("timed out in an earlier run" in w for w in warned), warned
    assert time.monotonic() - started < first_s + 30


@pytest.mark.parametrize(
    ("template", "what"),
    [
        ("{{ 9**99999999 }}", "digits"),
        ("{{ 'x' * 3000000000 }}", "characters"),
        ("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", "operations"),
        ("{{ 'x'|center(3000000000) }}", "limited"),
        (
            "{% set ns = namespace(x='ab') %}{% for i in range(64) %}{% set ns.x = ns.x ~ ns.x %}{% endfor %}",
            "characters",
        ),
        # Each of these is one operation scanning a million characters or items: a million of
        # them ran for hours.
        ("{% set s = 'ab ' * 330000 %}{% for i in range(11) %}{{ s|wordcount }}{% endfor %}", "reads"),
        ("{% set s = 'ab ' * 330000 %}{% for i in range(11) %}{{ s.count('ab') }}{% endfor %}", "reads"),
        ("{% set s = 'ab ' * 330000 %}{% for i in range(11) %}{% if 'z' in s %}{% endif %}{% endfor %}", "reads"),
        ("{% set s = 'ab ' * 330000 %}{% for i in range(11) %}{% if 'z' is in s %}{% endif %}{% endfor %}", "reads"),
        ("{% set l = range(100000)|list %}{% for i in range(101) %}{{ l|sort|first }}{% endfor %}", "reads"),
        (
            "{% set d = dict.fromkeys(range(100000)|list, 1) %}{% for i in range(101) %}"
            "{{ d|dictsort|length }}{% endfor %}",
            "reads",
        ),
    ],
)
def test_templates_cannot_exhaust_the_engine(tmp_path: Path, template: str, what: str) -> None:
    write_prompt(tmp_path, template)
    for argv in (["validate", "p.yaml"], ["assemble", "--pack", "p.yaml", "--mode", "full", "--model", "x"]):
        proc = ctxrules(*argv, cwd=tmp_path, timeout=90)
        out = clean(proc)
        assert proc.returncode == 1, out
        assert "CR103" in out and "exceeds a rendering limit" in out and what in out, out
        first = out.strip().splitlines()[0]
        assert first.startswith(("p.yaml:", "ctxrules: error: p.yaml:")), first


def test_comparisons_and_tests_of_ordinary_values_are_not_bounded_as_calls(tmp_path: Path) -> None:
    """Counting what `in` scans must not treat every compared value as a call's argument: a
    context window of two million is compared, not refused."""
    template = (
        "{% set w = 2000000 %}{% if w >= 1048576 %}big{% endif %} {{ w is gt 1500000 }} "
        "{% for i in range(300000) %}{% if i == 5 %}{% endif %}{% endfor %}"
        "{% if 2 in [1, 2] and 'b' is in 'abc' and 1 < 2 in [2] %}member{% endif %}"
    )
    write_prompt(tmp_path, template)
    proc = ctxrules("assemble", "--pack", "p.yaml", "--mode", "full", "--model", "x", cwd=tmp_path)
    assert proc.returncode == 0, clean(proc)
    assert "big True member" in proc.stdout, proc.stdout


def test_the_sections_of_one_prompt_share_one_budget(tmp_path: Path) -> None:
    """A mode listing a costly section (that writes nothing) again and again: the prompt, not
    each section, is bounded."""
    write(
        tmp_path,
        "p.yaml",
        f"""\
        prompts:
          sections:
            a: {{template: "{{% for i in range(100000) %}}{{% endfor %}}"}}
          modes:
            full: [{", ".join(["a"] * 20)}]
        """,
    )
    for argv in (["validate", "p.yaml"], ["assemble", "--pack", "p.yaml", "--mode", "full", "--model", "x"]):
        proc = ctxrules(*argv, cwd=tmp_path)
        out = clean(proc)
        assert proc.returncode == 1, out
        assert "CR103" in out and "operations" in out, out


@pytest.mark.parametrize("tag", ["include '{}'", "include '{}' with context"])
def test_sections_that_include_each_other_exponentially_are_bounded(tmp_path: Path, tag: str) -> None:
    """21 sections that each include all later ones render 2**20 templates that write nothing
    and call nothing: each include is an operation."""
    n = 21
    lines = ["prompts:", "  sections:"]
    for i in range(n):
        body = "".join("{% " + tag.format(f"s{j}") + " %}" for j in range(i + 1, n)) or "{# leaf #}"
        lines.append(f"    s{i}: {{template: {json.dumps(body)}}}")
    lines += ["  modes:", "    full: [s0]"]
    write(tmp_path, "p.yaml", "\n".join(lines) + "\n")
    for argv in (["validate", "p.yaml"], ["assemble", "--pack", "p.yaml", "--mode", "full", "--model", "x"]):
        proc = ctxrules(*argv, cwd=tmp_path, timeout=300)
        out = clean(proc)
        assert proc.returncode == 1, out
        assert "CR103" in out and "operations" in out, out


@pytest.mark.parametrize(
    "template",
    [
        "{{ ('x' * 100000)|replace('x', 'y' * 100000) }}",
        "{{ ('x' * 100000).replace('x', 'y' * 100000) }}",
        "{{ ('a' * 1000000)|join('b' * 1000000) }}",
        "{{ ('y' * 100000).join('x' * 100000) }}",
        "{{ ('x' * 100000)|list|map('upper')|join('y' * 100000) }}",
        "{{ ('x\\n' * 300000)|indent(1000000) }}",
        "{{ ('x ' * 300000)|wordwrap(1, wrapstring='y' * 100000) }}",
        "{{ ('\\t' * 100000).expandtabs(1000000) }}",
        "{{ ('x' * 100000).translate({120: 'y' * 100000}) }}",
        "{{ ('{0}' * 300000).format('x' * 1000000) }}",
        "{{ ('%s' * 300000) % (('x' * 1000000,) * 300000) }}",
        "{{ (range(1000000)|list)|tojson(indent=1000000) }}",
        "{{ ['x' * 1000000] * 100000 }}",
        "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = ns.l + ['x' * 1000000] %}"
        "{% endfor %}{{ ns.l|length }}",
    ],
)
def test_templates_are_bounded_before_they_allocate(tmp_path: Path, template: str) -> None:
    """Operations whose result is much larger than their input are refused on a bound computed
    from the arguments, before the allocation: under a 2 GB address-space cap, each would be a
    MemoryError (or the machine's memory) if it ran first."""
    import resource

    write_prompt(tmp_path, template)
    cap = 2 * 1024**3

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    proc = subprocess.run(
        [sys.executable, "-m", "ctxrules.cli.main", "validate", "p.yaml"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO / "engine")},
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=limit,
        check=False,
    )
    out = clean(proc)
    assert proc.returncode == 1, out
    assert "CR103" in out and "exceeds a rendering limit" in out and "MemoryError" not in out, out


def test_a_fifo_a_device_and_a_huge_file_are_refused_before_parsing(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    big = tmp_path / "big.yaml"
    big.write_text(HEAD + "# " + "x" * 1_100_000 + "\n", encoding="utf-8")
    for name in ("fifo.yaml", "big.yaml"):
        proc = ctxrules("validate", name, cwd=tmp_path, timeout=60)
        out = clean(proc)
        assert proc.returncode == 1 and "error[CR101]" in out, out
    (tmp_path / "pack").mkdir()
    os.mkfifo(tmp_path / "pack" / "t.md")
    (tmp_path / "pack" / "zero.md").symlink_to("/dev/zero")
    for target, code in (("t.md", "CR101"), ("zero.md", "CR100"), ("/dev/zero", "CR100")):
        _template_pack(tmp_path, target)
        proc = ctxrules("assemble", "--pack", "pack/p.yaml", "--mode", "full", "--model", "x", cwd=tmp_path, timeout=60)
        out = clean(proc)
        assert proc.returncode == 1 and code in out, out


@pytest.mark.parametrize("key", ["input", "tools"])
def test_an_empty_test_file_name_is_a_located_error_not_the_packs_folder(tmp_path: Path, key: str) -> None:
    """`tests[].input: ""` passed validate, and `ctxrules test` read it as the pack's own folder
    ("Is a directory"); an empty value never names a folder."""
    other = "" if key == "input" else "input: in.json, "  # a complete item otherwise
    write(tmp_path, "p.yaml", f'tests:\n  - {{id: a, {other}{key}: ""}}\n')
    for verb in ("validate", "test"):
        proc = ctxrules(verb, "p.yaml", cwd=tmp_path, timeout=60)
        out = clean(proc)
        assert proc.returncode == 1 and "p.yaml:5:" in out and "CR014" in out, (verb, out)
        assert "directory" not in out.lower(), out


def test_a_reserve_of_thousands_of_digits_is_named_in_a_short_line(tmp_path: Path) -> None:
    """`reserve_output` of 4,300 digits (Python still reads it): `run` printed all of them."""
    write(tmp_path, "p.yaml", "extends: [builtin:default]\ncontext:\n  reserve_output: " + "9" * 4300 + "\n")
    (tmp_path / "in.json").write_text('[{"role": "user", "content": "hi"}]')
    proc = ctxrules("run", "--pack", "p.yaml", "--model", "gpt-4o", "--input", "in.json", "--state", "S", cwd=tmp_path)
    assert proc.returncode == 2 and "(4,300 digits)" in proc.stderr, proc.stderr[:300]
    assert len(proc.stderr) < 300 and proc.stderr.count("\n") == 1, proc.stderr[:300]


def test_a_fifo_named_by_extends_is_reported_at_the_extends_line(tmp_path: Path) -> None:
    # It was reported at the FIFO's own 1:1, which says nothing of which pack named it.
    os.mkfifo(tmp_path / "parent.yaml")
    write(tmp_path, "p.yaml", "extends: ./parent.yaml\n")
    proc = ctxrules("validate", "p.yaml", cwd=tmp_path, timeout=60)
    out = clean(proc)
    assert proc.returncode == 1, out
    assert "p.yaml:4:10: error[CR030] ./parent.yaml is a FIFO, not a pack file" in out, out


@pytest.mark.parametrize("value", ["9" * 5000, ".nan", ".inf", "-.inf"])
def test_unusable_numbers_are_a_located_error(tmp_path: Path, value: str) -> None:
    write(tmp_path, "p.yaml", f"context:\n  window: {value}\n")
    proc = ctxrules("validate", "p.yaml", cwd=tmp_path)
    out = clean(proc)
    assert proc.returncode == 1 and "p.yaml:5:11: error[CR104]" in out, out


@pytest.mark.parametrize(
    "number",
    ["0x" + "f" * 3600, "-0x" + "f" * 3600, "0b" + "1" * 15_000, "0" + "7" * 5000, "1" + ":59" * 2500],
    ids=["hex", "negative-hex", "binary", "octal", "base-60"],
)
@pytest.mark.parametrize(
    ("body", "where"),
    [
        ("context:\n  reserve_output: {n}\n", "5:19"),
        ("pipeline:\n  - {{id: t, use: compress.truncate, when: {{at_least: {n}}}}}\n", "5:54"),
        ("tests:\n  - {{name: t, input: in.json, window: {n}}}\n", "5:39"),
    ],
    ids=["value", "quoted-by-a-finding", "pack-test"],
)
def test_an_integer_past_the_digit_limit_in_any_notation_is_a_located_error(
    tmp_path: Path, number: str, body: str, where: str
) -> None:
    """Hex, binary, octal and base-60 integers are built by PyYAML without Python's 4,300-digit
    limit: validate passed them (or died quoting one in a finding), and `explain`, `run` and
    `test` died on the first str() of the value ("internal error: ValueError")."""
    write(tmp_path, "p.yaml", body.format(n=number))
    for verb in ("validate", "explain"):
        proc = ctxrules(verb, "p.yaml", cwd=tmp_path, timeout=60)
        out = clean(proc)
        assert proc.returncode == 1 and f"p.yaml:{where}: error[CR104]" in out, (verb, out[:600])
        assert "internal error" not in out and "Traceback" not in out


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ('  description: "bad \\ud800 text"\n', "6:16"),
        ('prompts:\n  variables:\n    "k\\udc00": {default: x}\n', "8:5"),
        ('  description: "\\ud83d\\ude00 then \\udc01"\n', "6:16"),
    ],
)
def test_a_lone_surrogate_is_a_located_error_in_every_verb(tmp_path: Path, body: str, where: str) -> None:
    head = "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata:\n  name: s\n  version: 1.0.0\n"
    (tmp_path / "p.yaml").write_text(head + body, encoding="utf-8")
    (tmp_path / "m.json").write_text('[{"role": "user", "content": "hi"}]', encoding="utf-8")
    for argv in (
        ("validate", "p.yaml"),
        ("explain", "p.yaml"),
        ("run", "--pack", "p.yaml", "--model", "gpt-4o", "--input", "m.json"),
    ):
        proc = ctxrules(*argv, cwd=tmp_path)
        out = clean(proc)
        assert proc.returncode == 1 and f"p.yaml:{where}: error[CR001]" in out and "lone surrogate" in out, (argv, out)


def test_an_escaped_surrogate_pair_is_the_character_it_encodes(tmp_path: Path) -> None:
    write(tmp_path, "p.yaml", 'prompts:\n  variables:\n    who: {default: "\\ud83d\\ude00"}\n')
    proc = ctxrules("explain", "p.yaml", cwd=tmp_path)
    out = clean(proc)
    assert proc.returncode == 0 and "\U0001f600" in out, out


def test_an_extends_chain_or_cycle_of_any_length_is_no_recursion_error(tmp_path: Path) -> None:
    head = "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: p%d, version: 1.0.0}\n"
    n = 1500  # past Python's recursion limit, which a recursive walk of `extends` hit at ~980
    for i in range(n):
        (tmp_path / f"c{i}.yaml").write_text(head % i + (f"extends: ./c{i + 1}.yaml\n" if i < n - 1 else ""))
        (tmp_path / f"y{i}.yaml").write_text(head % i + f"extends: ./y{(i + 1) % n}.yaml\n")
    proc = ctxrules("validate", "c0.yaml", cwd=tmp_path)
    assert proc.returncode == 0, clean(proc)
    proc = ctxrules("validate", "y0.yaml", cwd=tmp_path)
    out = clean(proc)
    assert proc.returncode == 1 and f"y{n - 1}.yaml:4:10: error[CR031] extends forms a cycle: y0.yaml" in out, out
    assert f"{n - 10} more" in out and len(out) < 2000, out  # a long cycle is named by its ends


def _chain(folder: Path, n: int, *, down: bool = False, extra: dict[int, str] | None = None) -> None:
    """``p0.yaml`` ... ``p{n-1}.yaml``, each extending the one before (``down``: the one after),
    with ``extra`` appended to some files. Sorted by name, the files are not in chain order."""
    head = "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: p%d, version: 1.0.0}\n"
    for i in range(n):
        parent = i + 1 if down else i - 1
        body = head % i + (f"extends: [p{parent}.yaml]\n" if 0 <= parent < n else "")
        (folder / f"p{i}.yaml").write_text(body + (extra or {}).get(i, ""), encoding="utf-8")


def _count_loader_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts, from now on, of the pack loader's file reads, ``extends`` entries located and
    merges (what a quadratic walk multiplies)."""
    from ctxrules.packs import loader

    calls = {"read": 0, "locate": 0, "merge": 0}

    def counted(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(loader.PackLoader, "_read", counted("read", loader.PackLoader._read))
    monkeypatch.setattr(loader.PackLoader, "_locate", counted("locate", loader.PackLoader._locate))
    monkeypatch.setattr(loader, "merge_packs", counted("merge", loader.merge_packs))
    return calls


@pytest.mark.parametrize("down", [False, True])
def test_a_folder_of_packs_that_extend_each_other_reads_locates_and_merges_each_file_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, down: bool
) -> None:
    """Each pack of the folder is resolved with its whole chain; the chain was walked, located
    and merged again for each pack (a 1,000-file chain took minutes). Counted, not timed."""
    from ctxrules.plugins import default_registry
    from ctxrules.validation.validate import validate_paths

    n = 300
    _chain(tmp_path, n, down=down)
    calls = _count_loader_calls(monkeypatch)
    run = validate_paths([str(tmp_path)], default_registry())
    assert run.files_checked == n and run.diagnostics == [], run.diagnostics
    # each file read and merged once; located once as the pack named and once as a parent
    assert calls == {"read": n, "locate": 2 * n - 1, "merge": n}, calls


def test_a_folder_of_packs_in_one_extends_cycle_finds_each_reference_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every pack of a cycle walks the whole cycle (each names it from its own file, CR031);
    finding each file again (resolving its path, checking it against the roots) for every pack
    made a 1,000-file cycle take 92 s. Counted, not timed: each reference is found once per
    folder, and each pack's diagnostics are those it has with a loader of its own."""
    from ctxrules.packs import loader
    from ctxrules.plugins import default_registry
    from ctxrules.validation.validate import _sorted_unique, validate_paths, validate_resolved

    n = 120
    _chain(tmp_path, n, extra={0: f"extends: [p{n - 1}.yaml, missing.yaml]\n"})
    registry = default_registry()
    alone = []
    for f in sorted(tmp_path.glob("*.yaml")):
        mine = loader.PackLoader()
        alone.extend(validate_resolved(mine.resolve(str(f), root=tmp_path), mine, registry))
    finds = []
    find = loader.PackLoader._find
    monkeypatch.setattr(loader.PackLoader, "_find", lambda self, ref, *a: finds.append(ref) or find(self, ref, *a))
    run = validate_paths([str(tmp_path)], registry)
    assert run.diagnostics == _sorted_unique(alone)
    codes = sorted({(d.code, Path(d.file).name) for d in run.diagnostics if d.code != "CR031"})
    assert codes == [("CR030", "p0.yaml")], codes
    assert sum(d.code == "CR031" for d in run.diagnostics) == n
    # the n packs named, each parent reference once, and the one that names no file
    assert len(finds) == 2 * n + 1, len(finds)


def test_a_chain_resolves_as_each_pack_alone_would_errors_included(tmp_path: Path) -> None:
    """What a loader keeps from one pack's resolution for the next changes nothing: each pack
    of a chain with problems in the middle (and a diamond) resolves and validates as it does
    with a loader of its own, and the folder's diagnostics are those of the packs alone."""
    from ctxrules.packs.loader import PackLoader
    from ctxrules.plugins import default_registry
    from ctxrules.validation.validate import _sorted_unique, validate_paths, validate_resolved

    n = 40
    extra = {
        12: "extends: [p11.yaml, missing.yaml]\n",  # replaces the parent list: CR030
        20: "pipeline:\n  - {id: nowhere, with: {a: 1}}\n",  # CR041, in every pack below
        25: "context: {thresholds: {light: 2}}\n",  # CR050, reported for each pack that inherits it
        30: "pipeline:\n  - {id: d, use: compress.dedup, enabled: false}\n",
        31: "extends: [p30.yaml, p27.yaml]\npipeline:\n  - {id: d, enabled: true}\n",  # a diamond
    }
    _chain(tmp_path, n, extra=extra)
    (tmp_path / "p12.yaml").write_text(
        (tmp_path / "p12.yaml").read_text().replace("extends: [p11.yaml]\n", ""), encoding="utf-8"
    )
    (tmp_path / "p31.yaml").write_text(
        (tmp_path / "p31.yaml").read_text().replace("extends: [p30.yaml]\n", ""), encoding="utf-8"
    )
    registry = default_registry()
    shared = PackLoader()
    alone_diags = []
    for f in sorted(tmp_path.glob("*.yaml")):
        mine = PackLoader()
        alone = mine.resolve(str(f), root=tmp_path)
        got = shared.resolve(str(f), root=tmp_path)
        for field in ("name", "data", "files", "diagnostics", "disabled", "real_paths", "roots", "disabled_at"):
            assert getattr(got, field) == getattr(alone, field), (f.name, field)
        assert validate_resolved(got, shared, registry) == validate_resolved(alone, mine, registry), f.name
        alone_diags.extend(validate_resolved(alone, mine, registry))
    found = validate_paths([str(tmp_path)], registry).diagnostics
    assert found == _sorted_unique(alone_diags)
    shown = [(d.code, Path(d.file).name, d.line, d.col) for d in found]
    assert shown == [("CR030", "p12.yaml", 4, 21), ("CR041", "p20.yaml", 6, 5), ("CR050", "p25.yaml", 5, 31)], shown


def test_a_pack_that_extends_a_diamond_resolved_before_keeps_both_sides(tmp_path: Path) -> None:
    """``a`` extends ``[b, c]``, both extending ``d``; ``top`` extends ``a``. Resolved after ``a``
    with the same loader (``ctxrules validate`` of the folder), ``top`` took ``a``'s files from
    what the loader kept of ``a`` and lost ``c``: the side of the diamond whose parent was placed
    already had no record of its own, and was not counted in ``a``'s either."""
    from ctxrules.packs.loader import PackLoader

    head = "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: %s, version: 1.0.0}\n"
    for name, parents in [("d", []), ("b", ["d"]), ("c", ["d"]), ("a", ["b", "c"]), ("top", ["a"])]:
        body = head % name + (f"extends: [{', '.join(p + '.yaml' for p in parents)}]\n" if parents else "")
        body += f"pipeline:\n  - {{id: {name}, use: compress.dedup}}\n"
        (tmp_path / f"{name}.yaml").write_text(body, encoding="utf-8")
    shared = PackLoader()
    shared.resolve(str(tmp_path / "a.yaml"), root=tmp_path)
    got = shared.resolve(str(tmp_path / "top.yaml"), root=tmp_path)
    alone = PackLoader().resolve(str(tmp_path / "top.yaml"), root=tmp_path)
    assert [Path(f).stem for f in got.files] == ["d", "b", "c", "a", "top"] == [Path(f).stem for f in alone.files]
    assert got.data == alone.data and [i["id"] for i in got.data["pipeline"]] == ["d", "b", "c", "a", "top"]


@pytest.mark.parametrize("seed", range(6))
def test_packs_extending_each_other_at_random_resolve_as_each_pack_alone(tmp_path: Path, seed: int) -> None:
    """A random folder of packs whose ``extends`` form a graph without cycles (diamonds, shared
    parents, a parent named twice, a missing file, a broken file), resolved in a random order
    with one loader: every pack resolves as with a loader of its own, and the folder's
    diagnostics are those of the packs alone."""
    import random

    from ctxrules.packs.loader import PackLoader
    from ctxrules.plugins import default_registry
    from ctxrules.validation.validate import _sorted_unique, validate_paths, validate_resolved

    rng = random.Random(seed)
    n = 24
    head = "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: q%d, version: 1.0.0}\n"
    for i in range(n):
        # parents among the packs after it (no cycle), in any order, at times one named twice
        parents = rng.sample(range(i + 1, n), k=min(n - i - 1, rng.choice([0, 1, 1, 2, 2, 3])))
        if parents and rng.random() < 0.1:
            parents.append(parents[0])
        refs = [f"q{p}.yaml" for p in parents] + (["missing.yaml"] if rng.random() < 0.05 else [])
        body = head % i + (f"extends: [{', '.join(refs)}]\n" if refs else "")
        body += f"pipeline:\n  - {{id: s{i}, use: compress.dedup}}\n"
        if rng.random() < 0.1:
            body += f"  - {{id: s{rng.randrange(n)}, with: {{x: 1}}}}\n"  # an item no parent has, maybe
        if rng.random() < 0.05:
            body += "context: {thresholds: {light: 2}}\n"  # CR050 in every pack below it
        if rng.random() < 0.04:
            body += "pipeline: [\n"  # does not parse
        (tmp_path / f"q{i}.yaml").write_text(body, encoding="utf-8")
    registry = default_registry()
    names = [f"q{i}.yaml" for i in range(n)]
    rng.shuffle(names)
    shared = PackLoader()
    alone_diags = []
    for name in names:
        f = tmp_path / name
        mine = PackLoader()
        alone = mine.resolve(str(f), root=tmp_path)
        got = shared.resolve(str(f), root=tmp_path)
        for field in ("name", "data", "files", "diagnostics", "disabled", "real_paths", "roots", "disabled_at"):
            assert getattr(got, field) == getattr(alone, field), (seed, name, field)
        assert dict(got.docs) == dict(alone.docs), (seed, name)
        assert validate_resolved(got, shared, registry) == validate_resolved(alone, mine, registry), (seed, name)
    for f in sorted(tmp_path.glob("*.yaml")):  # the folder's order (a finding in a file that several
        mine = PackLoader()  # packs report keeps the hint of the first: the ids that pack has)
        alone_diags.extend(validate_resolved(mine.resolve(str(f), root=tmp_path), mine, registry))
    assert validate_paths([str(tmp_path)], registry).diagnostics == _sorted_unique(alone_diags), seed


def test_a_long_chain_validates_in_linear_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``ctxrules validate`` of a folder of N packs each extending the next: each pack's files
    were spelled out from the chain one by one, and each file's own problems collected again,
    for every pack (5,000 packs took 35 s). Counted, not timed: the walks spell each chain out
    once (one list that all the packs' files are slices of), and the per-file problems of each
    file are collected once per run."""
    from ctxrules.packs import loader
    from ctxrules.plugins import default_registry
    from ctxrules.validation import validate

    n = 400
    _chain(tmp_path, n, down=True, extra={n - 1: "context: {thresholds: {light: 2}}\n"})
    spelled: list[int] = []
    real = loader._spelled

    def counting(walked: Any, attr: str) -> list[Any]:
        before = sum(len(w._spelled) for ws in shared_walks() for w in ws.values())
        out = real(walked, attr)
        spelled.append(sum(len(w._spelled) for ws in shared_walks() for w in ws.values()) - before)
        return out

    loaders: list[Any] = []
    init = loader.PackLoader.__init__

    def tracked(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        loaders.append(self)

    def shared_walks() -> list[dict[Any, Any]]:
        return [ws for ld in loaders for ws in ld._walked.values()]

    collected: list[str] = []
    paths_of = validate._paths_of
    monkeypatch.setattr(loader.PackLoader, "__init__", tracked)
    monkeypatch.setattr(loader, "_spelled", counting)
    monkeypatch.setattr(validate, "_paths_of", lambda ld, shown: collected.append(shown) or paths_of(ld, shown))
    run = validate.validate_paths([str(tmp_path)], default_registry())
    assert run.files_checked == n
    # CR050 from the last file, reported once for the folder (every pack inherits it)
    assert [(d.code, Path(d.file).name) for d in run.diagnostics] == [("CR050", f"p{n - 1}.yaml")], run.diagnostics
    # each walk spelled out once per attribute asked for: at most 3 per file, not one per pack
    assert sum(spelled) <= 3 * n, sum(spelled)
    assert sorted(collected) == sorted({*collected}) and len(collected) == n


def test_what_a_loader_keeps_of_a_chain_that_adds_to_a_nested_map_stays_under_its_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each pack of a chain adds 50 entries to ``budgets.prices`` (maps in a map). Merging copied
    every nested map a pack touches, so each tree the loader kept for the next pack owned a copy
    of all the prices before it, while its weight counted the top-level keys only: 400 such packs
    took 2.8 GB. Counted, not measured: the maps and lists alive in the kept trees (each once,
    however shared) stay under the cap, each kept tree's weight is its real size, every file is
    still merged once, and each pack resolves as it does alone."""
    from ctxrules.packs import loader as loader_module
    from ctxrules.packs.loader import PackLoader

    n, cap = 60, 30_000
    prices = {
        i: "budgets:\n  prices:\n" + "".join(f"    m{i}-{j}: {{input: {j}, output: 1}}\n" for j in range(50))
        for i in range(n)
    }
    _chain(tmp_path, n, extra=prices)
    monkeypatch.setattr(loader_module, "_KEEP_WEIGHT", cap)
    merges = 0
    merge_packs = loader_module.merge_packs

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal merges
        merges += 1
        return merge_packs(*args, **kwargs)

    monkeypatch.setattr(loader_module, "merge_packs", counted)
    shared = PackLoader()
    for i in range(n):  # in chain order, as a folder of p000.yaml ... p059.yaml is validated
        shared.resolve(str(tmp_path / f"p{i}.yaml"), root=tmp_path)
        kept = [w.merged[0] for ws in shared._walked.values() for w in ws.values() if w.merged and w.merged[0]]
        alive, seen, todo = 0, set(), list(kept)
        while todo:
            node = todo.pop()
            if isinstance(node, dict | list) and id(node) not in seen:
                seen.add(id(node))
                alive += 1 + len(node)
                todo.extend(node.values() if isinstance(node, dict) else node)
        assert alive <= cap, (i, alive, len(kept))
    assert merges == n, merges
    assert all(weight == loader_module._weight(w.merged[0]) for w, weight in shared._keeps.items() if w.merged)
    monkeypatch.setattr(loader_module, "merge_packs", merge_packs)
    for f in sorted(tmp_path.glob("*.yaml")):  # by name: not in chain order
        got, alone = shared.resolve(str(f), root=tmp_path), PackLoader().resolve(str(f), root=tmp_path)
        assert (got.data, got.diagnostics, got.files) == (alone.data, alone.diagnostics, alone.files), f.name
        assert len(got.data["budgets"]["prices"]) == 50 * (int(f.stem[1:]) + 1)
    assert 0 < shared._kept <= cap and all(w.merged for w in shared._keeps)


def test_a_parent_resolved_under_other_roots_is_checked_again(tmp_path: Path) -> None:
    """A loader keeps resolutions per set of roots: a parent in a sibling folder is allowed
    when the caller names the common folder, and refused (CR100) when the pack's own folder is
    the root, in either order, with one loader."""
    from ctxrules.packs.loader import PackLoader

    write(tmp_path, "b/parent.yaml", "")
    child = write(tmp_path, "a/child.yaml", "extends: ../b/parent.yaml\n")
    for first_wide in (True, False):
        loader = PackLoader()
        runs = [(tmp_path, []), (None, ["CR100"])]
        for root, codes in runs if first_wide else runs[::-1]:
            pack = loader.resolve(str(child), root=root)
            assert [d.code for d in pack.diagnostics] == codes, (first_wide, root, pack.diagnostics)


@pytest.mark.parametrize(
    ("metadata", "code"),
    [
        ("version: 1.0.{big}", "CR020"),
        ("version: 1.0.0-{big}", "CR020"),
        ("version: 1.0.0, requires: '>={big}'", "CR022"),
    ],
)
def test_a_version_number_of_thousands_of_digits_is_a_located_error(tmp_path: Path, metadata: str, code: str) -> None:
    big = "9" * 5000  # past the 4,300 digits int() reads
    body = f"apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {{name: v, {metadata.format(big=big)}}}\n"
    (tmp_path / "p.yaml").write_text(body, encoding="utf-8")
    (tmp_path / "c.yaml").write_text(HEAD + f"extends: 'builtin:default@^{big}'\n", encoding="utf-8")
    for argv in (("validate", "p.yaml"), ("explain", "p.yaml")):
        proc = ctxrules(*argv, cwd=tmp_path)
        out = clean(proc)
        assert proc.returncode == 1 and f"error[{code}]" in out, (argv, out[:500])
    proc = ctxrules("validate", "c.yaml", cwd=tmp_path)
    out = clean(proc)
    assert proc.returncode == 1 and "c.yaml:4:10: error[CR022]" in out, out[:500]


def test_nothing_a_pack_says_acts_on_the_terminal(tmp_path: Path) -> None:
    """Escape sequences, a carriage return, a bidirectional override and a lone surrogate written
    in a pack reach the terminal as escapes, in every format a person reads."""
    body = (
        "apiVersion: ctxrules/v1\nkind: RulePack\n"
        'metadata: {name: "n\\e]0;owned\\x07", version: 1.0.0, description: "abc \\u202edcba"}\n'
        '"k\\e[2J\\rX\\u202e": 1\n'
    )
    (tmp_path / "p.yaml").write_text(body, encoding="utf-8")
    unsafe = ("\x1b", "\r", "\x07", "\u202e")
    for argv in (("validate", "p.yaml"), ("validate", "--format", "github", "p.yaml"), ("explain", "p.yaml")):
        proc = ctxrules(*argv, cwd=tmp_path)
        out = clean(proc)
        assert proc.returncode == 1 and "unknown key 'k\\x1b[2J\\x0dX\\u202e'" in out, (argv, out)
        assert not any(c in out for c in unsafe), (argv, out)
    (tmp_path / "p.yaml").write_text(body.rsplit('"k', 1)[0], encoding="utf-8")
    proc = ctxrules("explain", "p.yaml", cwd=tmp_path)
    out = clean(proc)
    assert proc.returncode == 0 and not any(c in out for c in unsafe), out
    assert "# pack: n\\x1b]0;owned\\x07 " in out
    # The YAML that explain prints still reads back as the values the pack holds.
    import yaml

    metadata = yaml.safe_load(out)["metadata"]
    assert metadata["name"] == "n\x1b]0;owned\x07" and metadata["description"] == "abc \u202edcba"


def test_a_symlink_in_a_validated_folder_to_a_file_outside_it_is_not_read(tmp_path: Path, outside: Path) -> None:
    target = outside.parent / "pack.yaml"  # a pack, so that reading it would print its lines
    target.write_text(HEAD + f"{SECRET}: 1\n", encoding="utf-8")
    folder = tmp_path / "rules"
    write(folder, "ok.yaml", "")
    (folder / "evil.yaml").symlink_to(target)
    (folder / "notes.yaml").symlink_to(outside)
    (folder / "same.yaml").symlink_to("ok.yaml")  # a link inside the folder is a pack like any other
    for fmt in ("text", "github", "json"):
        proc = ctxrules("validate", "--format", fmt, "rules", cwd=tmp_path)
        out = clean(proc)
        assert proc.returncode == 1, out
        for name in ("evil.yaml", "notes.yaml"):
            assert f"rules/{name}" in out and "CR100" in out, (fmt, out)
        assert "same.yaml" not in out and "ok.yaml" not in out, (fmt, out)
    proc = ctxrules("test", "rules", cwd=tmp_path)
    out = clean(proc)
    assert proc.returncode == 1 and "FAIL rules/evil.yaml::(load)" in out and "CR100" in out, out


def test_a_test_input_nested_past_the_parsers_stack_fails_its_case(tmp_path: Path) -> None:
    write(
        tmp_path,
        "p.yaml",
        "tests:\n  - {id: deep, input: in.json, expect: {fits: true}}\n  - {id: fine, input: ok.json}\n",
    )
    (tmp_path / "in.json").write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    (tmp_path / "ok.json").write_text('[{"role": "user", "content": "hi"}]', encoding="utf-8")
    proc = ctxrules("test", "p.yaml", cwd=tmp_path)
    out = clean(proc)
    assert proc.returncode == 1 and "FAIL hostile::deep" in out and "nested too deep" in out, out
    assert "PASS hostile::fine" in out, out  # the other cases still run


def test_failure_patterns_run_bounded_and_are_judged_like_every_pack_pattern(tmp_path: Path) -> None:
    write(
        tmp_path,
        "p.yaml",
        """\
        compressors:
          - id: slow
            match: {argv: [tool]}
            steps: [{use: head, with: {lines: 3}}]
            # 'b' finds the line; Python's re then took 2**40 steps on it with the second one
            failures: ['b', '(a+)+c', '(a+)+$']
        """,
    )
    (tmp_path / "out.txt").write_text("a" * 40 + "b\n" + "x\n" * 20, encoding="utf-8")
    started = time.monotonic()
    proc = ctxrules("compress", "--pack", "p.yaml", "--command", "tool", "--input", "out.txt", cwd=tmp_path, timeout=60)
    out = clean(proc)
    assert proc.returncode == 0 and proc.stdout.startswith("a" * 40 + "b\n"), out
    assert time.monotonic() - started < 40
    proc = ctxrules("validate", "p.yaml", cwd=tmp_path)
    out = clean(proc)
    assert proc.returncode == 0 and out.count("warning[CR102]") == 1 and "'(a+)+$'" in out, out
    write(
        tmp_path,
        "p.yaml",
        """\
        compressors:
          - id: big
            match: {argv: [tool]}
            steps: [{use: head, with: {lines: 3}}]
            failures: ['(?:x{1000}){1000}']
        """,
    )
    proc = ctxrules("validate", "p.yaml", cwd=tmp_path)
    out = clean(proc)
    assert proc.returncode == 1 and "p.yaml:8:16: error[CR130]" in out and "too large" in out, out
    proc = ctxrules("compress", "--pack", "p.yaml", "--command", "tool", "--input", "out.txt", cwd=tmp_path)
    out = clean(proc)
    assert proc.returncode == 1 and "p.yaml:8:16: error[CR130]" in out, out  # the pack does not load


@pytest.mark.parametrize("pack", ["nope.yaml", "builtin:nope"])
def test_a_pack_that_is_not_there_is_exit_2_in_every_verb(tmp_path: Path, pack: str) -> None:
    (tmp_path / "m.json").write_text('[{"role": "user", "content": "hi"}]', encoding="utf-8")
    write(tmp_path, "child.yaml", "extends: ./nope.yaml\n")  # a missing parent is a pack error
    for argv in (
        ("explain", pack),
        ("test", pack),
        ("run", "--pack", pack, "--model", "gpt-4o", "--input", "m.json"),
        ("assemble", "--pack", pack, "--mode", "full", "--model", "gpt-4o"),
        ("compress", "--pack", pack, "--command", "x", "--input", "m.json"),
        ("eval", "--pack", pack, "--model", "gpt-4o", "m.json"),
    ):
        proc = ctxrules(*argv, cwd=tmp_path)
        out = clean(proc)
        assert proc.returncode == 2 and "nope" in out, (argv, proc.returncode, out)
    proc = ctxrules("run", "--pack", "child.yaml", "--model", "gpt-4o", "--input", "m.json", cwd=tmp_path)
    out = clean(proc)
    assert proc.returncode == 1 and "child.yaml:4:10: error[CR030]" in out, out


def _trial_renders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, modes: int, entries: int, section: str
) -> tuple[int, list[str]]:
    """Validate a pack of ``modes`` modes and ``entries`` models: entries, each mode one
    ``section``; the prompts the trial render assembled, and the CR103 messages."""
    from ctxrules.plugins import default_registry
    from ctxrules.prompts.assemble import PromptSet
    from ctxrules.validation.validate import validate_paths

    lines = ["prompts:", "  sections:", f"    a: {{template: {json.dumps(section)}}}", "  modes:"]
    lines += [f"    m{i}: [a]" for i in range(modes)]
    lines += ["models:"] + [f"  - {{id: e{i}, match: ['e{i}-*']}}" for i in range(entries)]
    write(tmp_path, "p.yaml", "\n".join(lines) + "\n")
    calls = [0]
    render = PromptSet.render

    def counted(self: PromptSet, *args: object, **kwargs: object) -> object:
        calls[0] += 1
        return render(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(PromptSet, "render", counted)
    run = validate_paths([str(tmp_path / "p.yaml")], default_registry())
    return calls[0], [d.message for d in run.diagnostics if d.code == "CR103"]


def test_the_trial_render_of_a_pack_is_bounded_in_prompts_and_in_operations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every mode is tried for every models: entry, each prompt with a budget of its own: a pack
    of a thousand modes and a thousand entries would take hours to check."""
    calls, found = _trial_renders(tmp_path, monkeypatch, 101, 99, "hello")
    assert calls == 0 and len(found) == 1 and "10,100 prompts to check" in found[0], found
    # Costly prompts: the trial as a whole stops at its operation bound, not after 50 x 12.
    costly = "{% for i in range(100000) %}{% endfor %}" * 4
    calls, found = _trial_renders(tmp_path, monkeypatch, 50, 11, costly)
    assert calls <= 60 and len(found) == 1 and "together do more than" in found[0], (calls, found)
    # What a pack of ordinary size needs stays within both bounds.
    calls, found = _trial_renders(tmp_path, monkeypatch, 20, 99, "{% for i in range(1000) %}{{ i }}{% endfor %}")
    assert calls == 20 * 100 and found == []


def _shapes(folder: Path, shape: str, n: int) -> None:
    """Packs ``{name}.yaml`` that extend each other in one of several shapes."""
    head = "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: %s, version: 1.0.0}\n"
    graph: dict[str, list[str]] = {}
    extra: dict[str, str] = {}
    if shape in ("cycle", "tails", "problems"):
        graph = {f"p{i}": [f"p{(i + 1) % n}"] for i in range(n)}
    if shape == "tails":  # chains of three hanging off every fifth file of the ring
        for i in range(0, n, 5):
            graph |= {f"t{i}a": [f"t{i}b"], f"t{i}b": [f"t{i}c"], f"t{i}c": [f"p{i}"]}
    if shape == "problems":  # missing parents, unknown keys, a file extending itself
        for i in range(0, n, 4):
            graph[f"p{i}"].append("nowhere")
        extra = {f"p{i}": "bogus: 1\n" for i in range(0, n, 3)}
        graph["self"] = ["self", "p1"]
    if shape == "several":  # rings of 1 to 7 files, some leading into the next
        c = 0
        while len(graph) < n:
            size = c % 7 + 1
            for j in range(size):
                graph[f"c{c}_{j}"] = [f"c{c}_{(j + 1) % size}"] + ([f"c{c + 1}_0"] if j == 0 and c % 3 == 0 else [])
            c += 1
        graph |= {f"c{c}_{j}": [f"c{c}_{(j + 1) % 2}"] for j in range(2)}
    if shape == "diamond":
        graph = {f"p{i}": [f"p{i + 1}", f"p{i + 2}"] if i + 2 < n else [] for i in range(n)}
    if shape == "chain into a ring":  # each pack extends the next; the last two extend each other
        graph = {f"p{i}": [f"p{i + 1}" if i < n - 1 else f"p{n - 2}"] for i in range(n)}
    for name, parents in graph.items():
        body = head % name + (f"extends: [{', '.join(f'./{p}.yaml' for p in parents)}]\n" if parents else "")
        (folder / f"{name}.yaml").write_text(body + extra.get(name, ""), encoding="utf-8")


def _walked_alone(folder: Path, name: str) -> list[tuple[str, str, int, int, str]]:
    """The CR031 of one pack as a depth-first walk of its files finds them, written out here
    (each file's entries in order; a parent on the walk's stack closes a cycle, named from it)."""
    import yaml

    found = []
    written: dict[str, list[str]] = {}

    def parents(n: str) -> list[str]:
        if n not in written:
            written[n] = yaml.safe_load((folder / f"{n}.yaml").read_text(encoding="utf-8")).get("extends", [])
        return [p[2:-5] for p in written[n]]

    stack: list[str] = []
    done: set[str] = set()

    def walk(n: str) -> None:
        stack.append(n)
        text = (folder / f"{n}.yaml").read_text(encoding="utf-8").splitlines()
        line = next(i for i, t in enumerate(text, 1) if t.startswith("extends:")) if parents(n) else 0
        col = len("extends: [") + 1
        for p in parents(n):
            if not (folder / f"{p}.yaml").exists():
                pass
            elif p in stack:
                names = [f"{x}.yaml" for x in [*stack[stack.index(p) :], p]]
                if len(names) > 12:
                    names = [*names[:6], f"... {len(names) - 11} more ...", *names[-5:]]
                found.append((f"{n}.yaml", "CR031", line, col, " -> ".join(names)))
            elif p not in done:
                walk(p)
            col += len(f"./{p}.yaml, ")
        stack.pop()
        done.add(n)

    walk(name)
    return found


@pytest.mark.parametrize("shape", ["cycle", "tails", "several", "diamond", "problems", "chain into a ring"])
def test_a_folder_of_rings_reports_what_each_pack_alone_reports_reading_each_file_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shape: str
) -> None:
    """A folder whose packs form rings (with tails, several rings, problems in the files) walked
    the whole ring and merged it again for each pack of it (2,000 files: 125 s). Counted, not
    timed: each file is read once, nothing of a ring is merged, every step of the graph is taken
    a bounded number of times; and each pack's diagnostics are those it has validated alone."""
    from ctxrules.plugins import default_registry
    from ctxrules.validation.validate import _sorted_unique, validate_paths

    n = 120
    _shapes(tmp_path, shape, n)
    monkeypatch.chdir(tmp_path)
    registry = default_registry()
    packs = sorted(p.name for p in tmp_path.glob("*.yaml"))
    alone = {name: validate_paths([name], registry).diagnostics for name in packs}
    calls = _count_loader_calls(monkeypatch)
    run = validate_paths(["."], registry)
    assert run.diagnostics == _sorted_unique([d for name in packs for d in alone[name]])
    assert calls["read"] == len(packs), calls
    # a ring's packs are not merged; a diamond's each about once (the old walk: a pack's whole walk)
    assert calls["merge"] <= (2 * len(packs) if shape == "diamond" else 0), calls
    # each pack named, and each extends entry (at most 2 a file) once: the old walk located the
    # whole ring again for each pack of it
    assert calls["locate"] <= 3 * len(packs), calls
    for name in packs:
        mine = [
            (Path(d.file).name, d.code, d.line, d.col, d.message.split(": ", 1)[1])
            for d in alone[name]
            if d.code == "CR031"
        ]
        assert sorted(mine) == sorted(_walked_alone(tmp_path, name[:-5])), name


def test_a_pack_in_a_tangled_set_of_cycles_names_the_cycle_its_walk_closes_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Packs that each extend the next two in a ring: every pack is in every cycle's set. Each
    names the first cycle a depth-first walk from its own file closes (not every entry that
    closes one: that took a walk of the whole set for each pack), every file is read once and
    nothing is merged."""
    from ctxrules.packs import loader
    from ctxrules.plugins import default_registry
    from ctxrules.validation.validate import validate_paths

    n = 60
    head = "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: %s, version: 1.0.0}\n"
    for i in range(n):
        body = head % f"p{i}" + f"extends: [./p{(i + 1) % n}.yaml, ./p{(i + 2) % n}.yaml]\n"
        (tmp_path / f"p{i}.yaml").write_text(body, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    merges = []
    monkeypatch.setattr(loader, "merge_packs", lambda *a, **k: merges.append(a))
    registry = default_registry()
    for i in range(n):
        got = validate_paths([f"p{i}.yaml"], registry).diagnostics
        mine = [(Path(d.file).name, d.code, d.line, d.col, d.message.split(": ", 1)[1]) for d in got]
        assert mine == _walked_alone(tmp_path, f"p{i}")[:1], i
    assert not merges


@pytest.mark.parametrize(
    ("body", "line", "col"),
    [
        ('tests:\n  - {id: a, model: "gpt\\0", input: in.json}\n', 6, 20),
        ('summarizer:\n  model: "gpt-4o\\u202e"\n', 6, 10),
        ('summarizer:\n  fallback: "claude\\x1b[31m"\n', 6, 13),
        ('summarizer:\n  lite_models: {openai: "mini\\u2066"}\n', 6, 25),
        ('router:\n  enabled: true\n  tiers:\n    simple: {model: "gpt\\0"}\n', 8, 21),
    ],
)
def test_a_model_name_no_model_has_is_a_located_error(tmp_path: Path, body: str, line: int, col: int) -> None:
    """A control character, a bidirectional mark or a NUL in a model name passed validate: a
    test case failed on it only when run, and a summarizer or router model went out as it was.
    Validate and every verb that loads the pack say where it is."""
    write(tmp_path, "p.yaml", "extends: [builtin:default]\n" + body)
    (tmp_path / "in.json").write_text('[{"role": "user", "content": "hi"}]')
    for argv in (("validate", "p.yaml"), ("test", "p.yaml"),
                 ("run", "--pack", "p.yaml", "--model", "gpt-4o", "--input", "in.json", "--state", "S")):  # fmt: skip
        proc = ctxrules(*argv, cwd=tmp_path, timeout=60)
        out = clean(proc)
        assert proc.returncode == 1 and f"p.yaml:{line}:{col}:" in out and "CR014" in out, (argv, out)
        assert "holds a character no model name has" in out, out
