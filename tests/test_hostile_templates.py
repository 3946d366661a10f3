"""Templates Jinja or Python cannot build: nested too deeply, an integer too long to read, a
lone surrogate in the text. Each is a located finding in ``validate`` (exit 1) and the same
clean error in every verb that loads the pack, never a traceback or an "internal error".

The nested templates are generated for every construct that nests (blocks, brackets, operator
and filter chains, attributes, unary operators), far past where any of them fails (2,000
levels), one nesting level per line, so the line a finding names can be checked.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from cli_kit import cli

from ctxrules.diagnostics import Diagnostic
from ctxrules.packs.loader import PackLoader
from ctxrules.packs.validated import resolve_and_validate
from ctxrules.plugins import default_registry
from ctxrules.prompts.assemble import AssemblyError, assemble
from ctxrules.prompts.building import TemplateBuildError
from ctxrules.prompts.environment import make_environment
from ctxrules.validation.validate import validate_resolved

T = TypeVar("T")
HEAD = "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: t, version: 1.0.0}\n"
DEPTH = 2000

# (before, each level's opening, the innermost part, each level's closing, after)
NESTING = {
    "for": ("", "{% for a in [1] %}", "x", "{% endfor %}", ""),
    "if": ("", "{% if 1 %}", "x", "{% endif %}", ""),
    "with": ("", "{% with a = 1 %}", "x", "{% endwith %}", ""),
    "filter block": ("", "{% filter upper %}", "x", "{% endfilter %}", ""),
    "set block": ("", "{% set a %}", "x", "{% endset %}", ""),
    "macro": ("", "{% macro m() %}", "x", "{% endmacro %}", ""),
    "call block": ("{% macro m() %}{{ caller() }}{% endmacro %}", "{% call m() %}", "x", "{% endcall %}", ""),
    "parentheses": ("{{ ", "(", "1", ")", " }}"),
    "lists": ("{{ ", "[", "1", "]", " }}"),
    "dicts": ("{{ ", "{'a': ", "1", "}", " }}"),
    "call arguments": ("{{ ", "range(", "1", ")", " }}"),
    "conditional expressions": ("{{ ", "1 if 1 else ", "1", "", " }}"),
    "not": ("{{ ", "not ", "1", "", " }}"),
    "unary minus": ("{{ ", "-", "1", "", " }}"),
    "additions": ("{{ 1", "", "", "+1", " }}"),
    "powers": ("{{ 1", "", "", "**1", " }}"),
    "ands": ("{{ 1", "", "", " and 1", " }}"),
    "attributes": ("{{ mode", "", "", ".a", " }}"),
    "subscripts": ("{{ mode", "", "", "[0]", " }}"),
    "method calls": ("{{ mode", "", "", ".upper()", " }}"),
    "filters": ("{{ 1", "", "", "|string", " }}"),
}


def nested(kind: str, depth: int = DEPTH) -> str:
    """A template nesting ``kind`` ``depth`` levels deep, a level per line."""
    before, opening, inner, closing, after = NESTING[kind]
    return before + "\n".join([opening] * depth) + inner + "\n".join([closing] * depth) + after


def block_pack(folder: Path, template: str, name: str = "p.yaml") -> Path:
    """A pack whose section ``s`` is ``template`` as a literal block, in mode ``m``: template
    line ``n`` is the pack's line ``7 + n``."""
    body = "\n".join("        " + line for line in template.split("\n"))
    path = folder / name
    path.write_text(
        HEAD + f"prompts:\n  sections:\n    s:\n      template: |\n{body}\n  modes:\n    m: [s]\n", encoding="utf-8"
    )
    return path


def inline_pack(folder: Path, template: str) -> Path:
    """``p.yaml``: section ``s`` is ``template`` as a quoted value on line 6, in mode ``m``."""
    path = folder / "p.yaml"
    path.write_text(
        HEAD + f"prompts:\n  sections:\n    s: {{tag: s, template: {json.dumps(template)}}}\n  modes:\n    m: [s]\n",
        encoding="utf-8",
    )
    return path


def messages(folder: Path) -> Path:
    path = folder / "m.json"
    path.write_text('[{"role": "user", "content": "hi"}]', encoding="utf-8")
    return path


def clean(proc: subprocess.CompletedProcess[str]) -> str:
    """stdout and stderr, checked for a traceback and an internal error."""
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out and "internal error" not in out, out[-3000:]
    return out


RUNTIME_VERBS = {
    "explain": ["explain", "p.yaml"],
    "assemble": ["assemble", "--pack", "p.yaml", "--mode", "m", "--model", "gpt-4o"],
    "run": ["run", "--pack", "p.yaml", "--model", "gpt-4o", "--input", "m.json"],
}
# a finding at the template's own line in the pack: a level per line, so within the section
LOCATED = re.compile(r"^(?:ctxrules: error: )?p\.yaml:(\d+):\d+: error\[CR080\] template cannot be compiled", re.M)


def in_template(line: int | str, template: str) -> bool:
    """Whether pack line ``line`` is one of ``template``'s in a :func:`block_pack` (not, say,
    line 71 of the Python code Jinja generated)."""
    return 8 <= int(line) <= 8 + template.count("\n")


# -- through the CLI -------------------------------------------------------------------------


def test_validate_locates_every_kind_of_deep_nesting(tmp_path: Path) -> None:
    for i, kind in enumerate(NESTING):
        block_pack(tmp_path, nested(kind), f"p{i:02}.yaml")
    proc = cli("validate", ".", cwd=tmp_path, timeout=600)
    out = clean(proc)
    assert proc.returncode == 1, out[-3000:]
    for i, kind in enumerate(NESTING):
        findings = re.findall(rf"^p{i:02}\.yaml:(\d+):\d+: error\[(CR\d+)\] (.*)$", out, re.M)
        assert [code for _, code, _ in findings] == ["CR080"], (kind, findings)
        line, _, message = findings[0]
        assert in_template(line, nested(kind)), (kind, findings)
        assert "nests blocks, brackets, operators, filters or attributes too deeply" in message, (kind, message)
    assert f"{len(NESTING)} files checked: {len(NESTING)} error(s)" in out, out[-500:]


@pytest.mark.parametrize("kind", ["for", "parentheses", "filters", "not", "additions"])
@pytest.mark.parametrize("verb", list(RUNTIME_VERBS))
def test_every_verb_that_loads_the_pack_reports_it_in_one_located_line(tmp_path: Path, kind: str, verb: str) -> None:
    block_pack(tmp_path, nested(kind))
    messages(tmp_path)
    proc = cli(*RUNTIME_VERBS[verb], cwd=tmp_path)
    out = clean(proc)
    assert proc.returncode == 1, out[-3000:]  # an invalid pack (docs/reference/cli.md)
    assert proc.stdout == "", proc.stdout[-3000:]
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-3000:]
    found = LOCATED.search(out)
    assert found and in_template(found.group(1), nested(kind)), out[-3000:]


def test_python_limits_point_at_the_level_past_them_in_a_template_file(tmp_path: Path) -> None:
    """21 nested loops are one too many for Python's compiler: the finding names the template
    file and the 21st loop's line (before: "<template>, line 71", Jinja's generated code)."""
    (tmp_path / "s.j2").write_text(nested("for", 21) + "\n", encoding="utf-8")
    (tmp_path / "p.yaml").write_text(
        HEAD + "prompts:\n  sections:\n    s: {tag: s, file: s.j2}\n  modes:\n    m: [s]\n", encoding="utf-8"
    )
    messages(tmp_path)
    proc = cli("validate", "p.yaml", cwd=tmp_path)
    out = clean(proc)
    assert proc.returncode == 1, out
    assert "s.j2:21:1: error[CR080] template cannot be compiled: it nests" in out, out
    assert "(too many statically nested blocks)" in out and "<template>" not in out, out
    for argv in RUNTIME_VERBS.values():
        proc = cli(*argv, cwd=tmp_path)
        out = clean(proc)
        assert proc.returncode == 1 and out.startswith("ctxrules: error: s.j2:21:1: error[CR080]"), out


@pytest.mark.parametrize(
    "template", ["{{ " + "9" * 4301 + " }}", "{{ 0x" + "f" * 5000 + " }}", "a\n{{ 1 +\n" + "7" * 5000 + " }}"]
)
def test_an_integer_too_long_to_read_is_a_located_error(tmp_path: Path, template: str) -> None:
    inline_pack(tmp_path, template)
    messages(tmp_path)
    line = template.count("\n") + 1
    note = f" (template line {line})"
    for argv in (["validate", "p.yaml"], *RUNTIME_VERBS.values()):
        proc = cli(*argv, cwd=tmp_path)
        out = clean(proc)
        assert proc.returncode == 1, (argv, out)
        assert f"p.yaml:6:27: error[CR080] template cannot be compiled{note}: an integer in it has more digits" in out
        assert "set_int_max_str_digits" not in out, out


@pytest.mark.parametrize("template", ['{{ "\\ud800" }}', "ok\n{{ 'a\\udfffb' }}", "{{ '%c' % 56320 }}"])
def test_a_lone_surrogate_in_a_sections_text_is_a_located_error(tmp_path: Path, template: str) -> None:
    """The YAML holds an escape Jinja turns into a lone surrogate (or a template makes one):
    no UTF-8 prompt can hold it."""
    inline_pack(tmp_path, template)
    messages(tmp_path)
    for argv in (["validate", "p.yaml"], *RUNTIME_VERBS.values()):
        proc = cli(*argv, cwd=tmp_path)
        out = clean(proc)
        assert proc.returncode == 1, (argv, out)
        assert "p.yaml:8:5: error[CR087] mode 'm' does not assemble" in out, (argv, out)
        assert "section 's' (p.yaml:6) writes a lone surrogate" in out and "UnicodeEncodeError" not in out, out


def test_nesting_within_the_limits_still_renders(tmp_path: Path) -> None:
    template = "\n".join(
        [
            nested("for", 19),
            nested("if", 90),
            nested("parentheses", 60),
            nested("additions", 150),
            nested("filters", 150),
            "{{ " + "9" * 4300 + " }}",
            "{{ 0x" + "f" * 3000 + " }}",
            "{{ '\\ud83d\\ude00' }}",
        ]
    )
    block_pack(tmp_path, template)
    proc = cli("validate", "p.yaml", cwd=tmp_path)
    assert proc.returncode == 0, clean(proc)
    proc = cli("assemble", "--pack", "p.yaml", "--mode", "m", "--model", "x", cwd=tmp_path)
    out = clean(proc)
    assert proc.returncode == 0, out
    assert out.startswith("<s>\nxx1\n151\n1\n" + "9" * 4300 + "\n"), out[:200]
    assert "\U0001f600" in proc.stdout, proc.stdout[-100:]


# -- in the API ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(NESTING))
def test_validation_reports_each_kind_at_a_line_of_the_template(tmp_path: Path, kind: str) -> None:
    pack = resolve_and_validate(block_pack(tmp_path, nested(kind)), default_registry())
    found = [(d.code, d.line, d.message) for d in pack.diagnostics]
    assert [code for code, _, _ in found] == ["CR080"], found
    assert in_template(found[0][1], nested(kind)), found


@pytest.mark.parametrize("kind", list(NESTING))
def test_assembling_an_unvalidated_pack_is_an_assembly_error(tmp_path: Path, kind: str) -> None:
    """``assemble`` on a pack resolved without validation (the API allows it): the documented
    ``AssemblyError``, naming the section and the template line."""
    pack = PackLoader().resolve(str(block_pack(tmp_path, nested(kind))))
    with pytest.raises(AssemblyError, match=r"section 's' \(.*p\.yaml:\d+\) does not compile \(template line \d+\)"):
        assemble(pack, mode="m", model="x")


def _findings(path: Path) -> list[Diagnostic]:
    """Every diagnostic of the pack at ``path``, checked now (not a cached result)."""
    loader = PackLoader()
    return validate_resolved(loader.resolve(str(path)), loader, default_registry())


def _deep_call(n: int, call: Callable[[], T]) -> T:
    """``call()`` ``n`` calls deeper than here."""
    return call() if n == 0 else _deep_call(n - 1, call)


@pytest.mark.parametrize("kind", ["with", "additions", "ands", "conditional expressions", "not", "filters"])
def test_a_pack_validated_deep_in_a_stack_has_the_findings_it_has_at_the_top(tmp_path: Path, kind: str) -> None:
    """Just within what builds, checked by a caller already hundreds of calls deep (a host
    application, an integration): the same verdict, and the checks that walk the template
    (variables, includes, volatile values) do not recurse out of stack."""
    depth = {"with": 240, "additions": 190, "ands": 450, "conditional expressions": 450, "not": 450, "filters": 300}
    template = "{{ mode|nosuch }}{% include 'gone' %}{{ now }}\n" + nested(kind, depth[kind])
    pack = inline_pack(tmp_path, template)
    at_top = _findings(pack)
    deep = _deep_call(sys.getrecursionlimit() - 200, lambda: _findings(pack))
    assert sorted(d.code for d in at_top) == ["CR080", "CR081", "CR083", "CR085"], at_top
    assert "filter 'nosuch', which does not exist" in str(at_top)
    assert deep == at_top
    ok = inline_pack(tmp_path, nested(kind, depth[kind]))
    assert _deep_call(sys.getrecursionlimit() - 200, lambda: _findings(ok)) == []


def test_whether_a_template_builds_does_not_depend_on_the_callers_stack() -> None:
    """Jinja builds by recursion: built in the caller's thread, a template that ``validate``
    passes could fail a few hundred calls deeper (in ``run``, in an integration)."""
    env = make_environment()
    fits, too_deep = nested("parentheses", 60), nested("parentheses", DEPTH)
    below = sys.getrecursionlimit() - 100
    assert _deep_call(below, lambda: env.compile(fits)) is not None
    with pytest.raises(TemplateBuildError) as info:
        _deep_call(below, lambda: env.compile(too_deep))
    assert info.value.lineno > 1 and "for Jinja to parse" in str(info.value.message)
