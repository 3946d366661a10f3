"""Run the inline ``tests:`` of a pack's compressor rules (what ``ctxrules test`` does for them).

A test names a captured output (``input``, relative to the pack file that declares the test,
or ``input_text``), the ``command`` that produced it and its ``exit_code`` (default 0). It
passes when

- the command selects *this* compressor (a test of a rule that another rule shadows fails);
- the engine's truthfulness rules hold on the result: never larger than the input, every
  marker parses and points at the full output, a failing run keeps its last lines, every
  line matching the rule's ``failures`` patterns is in the output (its words, in order: a
  rewrite may squeeze or carry them) or inside a marker that counts failure lines;
- every ``contains`` text appears, no ``not_contains`` text does, the output equals
  ``expected`` (``{vault_id}`` stands for the full output's id) and compressed tokens /
  original tokens (gpt-4o tokenizer) is at most ``max_ratio``.

When a rule saves nothing on an input the output is the input itself; the expectations are
checked on it all the same.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctxrules.compressors.api import compress_text, text_id
from ctxrules.compressors.apply import is_failure, split_output
from ctxrules.compressors.argv import parse_command
from ctxrules.compressors.failures import failure_lines
from ctxrules.compressors.rules import CompiledRule, CompressorError, compile_rules, select_rule
from ctxrules.errors import CtxrulesError
from ctxrules.models import lookup_model
from ctxrules.patterns import PatternTimeout
from ctxrules.tokens import TokenCounter
from ctxrules.vault import parse_markers

if TYPE_CHECKING:
    from ctxrules.packs.loader import ResolvedPack
    from ctxrules.packs.source import Origin
    from ctxrules.plugins import Registry

__all__ = [
    "TOKEN_MODEL",
    "CaseResult",
    "check_failures",
    "check_invariants",
    "run_compressor_tests",
]

TOKEN_MODEL = "gpt-4o"
"""The tokenizer ``max_ratio`` is measured with (o200k_base, exact and offline)."""

_GLOB = re.compile(r"[*?\[|]")


@dataclass(frozen=True)
class CaseResult:
    """The outcome of one compressor test. ``id`` is the test's id (``#N`` when it has none,
    ``<missing>`` for a compressor without tests under ``--require-tests``)."""

    id: str
    compressor: str
    passed: bool
    message: str = ""
    source: str = ""
    ratio: float | None = None
    ms: float = 0.0


def _count_tokens(text: str) -> int:
    return TokenCounter.for_model(lookup_model(TOKEN_MODEL)).count_text(text)


def check_invariants(original: str, output: str, exit_code: int | None, vault_id: str, failure_tail: int) -> list[str]:
    """The engine's truthfulness rules, checked from the outside (empty list: all hold)."""
    problems: list[str] = []
    if len(output.encode("utf-8", "surrogatepass")) > len(original.encode("utf-8", "surrogatepass")):
        problems.append("the output is larger than the input")
    total = len(split_output(original)[0])
    for marker in parse_markers(output):
        if marker.vault_id != vault_id:
            problems.append(f"marker points at {marker.vault_id}, not at the full output {vault_id}")
        elif marker.lines is not None and marker.lines[1] > total:
            problems.append(f"marker range L{marker.lines[0]}-L{marker.lines[1]} is past the output's {total} lines")
    ours = sum(1 for m in parse_markers(output) if m.vault_id == vault_id)
    if output.count("[ctxrules:elided") - ours > original.count("[ctxrules:elided"):
        problems.append("the output holds a marker that does not parse")
    if is_failure(exit_code, original):
        # A failing run keeps its last lines: no marker may cover any of them (a kept line may
        # be rewritten, e.g. grouped under its file name, so the text itself is not compared).
        tail_start = max(1, total - failure_tail + 1)
        for marker in parse_markers(output):
            if marker.lines is not None and marker.lines[1] >= tail_start:
                problems.append(
                    f"failing run lost one of its last {failure_tail} lines "
                    f"(marker L{marker.lines[0]}-L{marker.lines[1]})"
                )
    return problems


_WORDS = re.compile(r"\w+")
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


def _words(text: str) -> str:
    return " ".join(_WORDS.findall(_ESCAPES.sub("", text)))


def check_failures(original: str, output: str, rule: CompiledRule) -> list[str]:
    """Failure lines of ``original`` that ``output`` neither shows nor counts in a marker."""
    originals, _ = split_output(original)
    try:
        hits = failure_lines(rule.failures, originals)
    except PatternTimeout as exc:  # the case cannot be judged: it fails, saying why
        return [str(exc)]
    if not hits:
        return []
    words = _words(output)
    counted = [m.lines for m in parse_markers(output) if m.lines and "failures" in m.extra]
    problems: list[str] = []
    for line_no in sorted(hits):
        line = originals[line_no - 1]
        if _words(line) in words or any(a <= line_no <= b for a, b in counted):
            continue
        problems.append(f"failure line {line_no} is neither kept nor counted: {line.strip()!r}")
        if len(problems) >= 3:
            break
    return problems


def _origin_path(pack: ResolvedPack, origins: Mapping[str, Origin], pointer: str) -> Path:
    origin = origins.get(pointer)
    shown = origin.file if origin is not None else (pack.files[-1] if pack.files else "")
    return pack.real_paths.get(shown, Path(shown))


def _read_input(pack: ResolvedPack, origins: Mapping[str, Origin], pointer: str, relative: str) -> str:
    from ctxrules.packs.confine import MAX_INPUT_BYTES, FileRefused, OutsideRoots, check_inside, read_limited

    base = _origin_path(pack, origins, pointer).parent
    try:
        path = check_inside(pack.roots, base, relative, "test input")
        raw = read_limited(path, MAX_INPUT_BYTES, what=f"input {relative}")
    except (OutsideRoots, FileRefused) as exc:
        raise CtxrulesError(str(exc)) from None
    except FileNotFoundError:
        raise CtxrulesError(f"input file not found: {relative} (looked for {base / relative})") from None
    except OSError as exc:
        raise CtxrulesError(f"cannot read input {relative}: {exc.strerror or exc}") from None
    return raw.decode("utf-8", "surrogateescape")


def _default_command(rule: Mapping[str, Any]) -> str | None:
    match = rule.get("match") or {}
    argv = match.get("argv") if isinstance(match, Mapping) else None
    if not argv or any(_GLOB.search(str(a)) for a in argv):
        return None
    return " ".join(str(a) for a in argv)


def _run_case(
    pack: ResolvedPack,
    origins: Mapping[str, Origin],
    registry: Registry,
    index: int,
    rule: Mapping[str, Any],
    case_index: int,
    case: Mapping[str, Any],
) -> CaseResult:
    rule_id = str(rule.get("id"))
    case_id = str(case.get("id") or f"#{case_index + 1}")
    pointer = f"/compressors/{index}/tests/{case_index}"
    origin = origins.get(pointer)
    source = f"{origin.file}:{origin.line}" if origin is not None else ""

    def fail(message: str, ratio: float | None = None) -> CaseResult:
        return CaseResult(case_id, rule_id, False, message, source, ratio)

    try:
        if "input" in case:
            text = _read_input(pack, origins, pointer + "/input", str(case["input"]))
        else:
            text = str(case.get("input_text", ""))
    except CtxrulesError as exc:
        return fail(str(exc))
    command = case.get("command") or _default_command(rule)
    if not command:
        return fail("give `command:`: the rule's argv has globs or alternatives, so there is no default")
    exit_code = case.get("exit_code", 0)
    parsed = parse_command(str(command))
    try:
        rules = compile_rules(pack.data, registry)
        chosen = select_rule(rules, parsed, exit_code, is_failure(exit_code, text)) if parsed else None
        if chosen is None or chosen.id != rule_id:
            what = f"compressor '{chosen.id}'" if chosen is not None else "no compressor"
            return fail(f"command {command!r} (exit {exit_code}) selects {what}, not '{rule_id}'")
        vault_id = text_id(text)
        result = compress_text(pack.data, str(command), text, exit_code, vault_id=vault_id, registry=registry)
    except CompressorError as exc:
        return fail(str(exc))
    output = result.text if result is not None else text
    problems = check_invariants(text, output, exit_code, vault_id, chosen.failure_tail)
    problems.extend(check_failures(text, output, chosen))
    for needle in case.get("contains") or []:
        if needle not in output:
            problems.append(f"output lacks {needle!r}")
    for needle in case.get("not_contains") or []:
        if needle in output:
            problems.append(f"output still contains {needle!r}")
    expected = case.get("expected")
    if isinstance(expected, str) and output != expected.replace("{vault_id}", vault_id):
        problems.append("output differs from `expected`:\n" + _diff(expected.replace("{vault_id}", vault_id), output))
    ratio: float | None = None
    max_ratio = case.get("max_ratio")
    if max_ratio is not None:
        before = _count_tokens(text)
        ratio = _count_tokens(output) / before if before else 1.0
        if ratio > float(max_ratio):
            problems.append(f"token ratio {ratio:.3f} is above max_ratio {max_ratio}")
    if problems:
        return fail("; ".join(problems), ratio)
    return CaseResult(case_id, rule_id, True, "", source, ratio)


# A failed `expected:` shows this many lines of the unified diff: the output of a compressor
# test may be thousands of lines, and the first differences are what the author needs.
DIFF_LINES = 40
# ... compared over this many lines of each text from the first difference on: difflib's
# matcher is quadratic when every other line differs (40,000 lines took minutes), and no more
# than DIFF_LINES lines of the diff are shown.
DIFF_WINDOW = 1000
_HUNK = re.compile(r"^@@ -(\d+)(,\d+)? \+(\d+)(,\d+)? @@$")


def _diff(expected: str, output: str) -> str:
    """The first line where ``output`` and ``expected`` part, then their unified diff, at most
    :data:`DIFF_LINES` lines of it and a count of the rest. Lines keep their endings, so a
    difference in line endings or a final newline alone is named too (quoted with escapes)."""
    want, got = expected.splitlines(keepends=True), output.splitlines(keepends=True)
    at = next((i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), min(len(want), len(got)))
    first = f"first difference at line {at + 1}: expected {_line(want, at)}, got {_line(got, at)}\n"
    start = max(at - 2, 0)  # the diff's context before the first difference
    end = start + DIFF_WINDOW
    diff = difflib.unified_diff(want[start:end], got[start:end], "expected", "output", n=2, lineterm="")
    lines = [_shift_hunk(line.rstrip("\r\n"), start) for line in diff]
    rest = f"{len(lines) - DIFF_LINES} more diff lines" if len(lines) > DIFF_LINES else ""
    if len(want) > end or len(got) > end:
        rest += ("; " if rest else "") + f"lines after {end} not compared"
    lines = lines[:DIFF_LINES] + ([f"... {rest}"] if rest else [])
    return first + "\n".join(lines)


def _shift_hunk(line: str, offset: int) -> str:
    """A hunk header of a diff of lines ``offset``.. numbered as lines of the whole texts."""
    m = _HUNK.match(line)
    if m is None or not offset:
        return line
    a, b = int(m[1]) + offset, int(m[3]) + offset
    return f"@@ -{a}{m[2] or ''} +{b}{m[4] or ''} @@"


def _line(lines: list[str], index: int) -> str:
    if index >= len(lines):
        return "the end of the text"
    text = lines[index]
    return repr(text if len(text) <= 200 else text[:200] + "...")


def run_compressor_tests(
    pack: ResolvedPack,
    *,
    require_tests: bool,
    registry: Registry,
    inherited: bool = True,
) -> list[CaseResult]:
    """Every inline test of every compressor in ``pack`` (resolved: inherited ones included),
    with the actions of ``registry`` (the engine's, so that a plugin's actions are tested too);
    with ``inherited=False`` only the tests the pack's own file declares.

    With ``require_tests``, a compressor without tests yields one failed case ``<missing>``
    (without ``inherited``: only a compressor the pack's own file declares).
    """
    from ctxrules.packtests import declared_in

    results: list[CaseResult] = []
    origins = pack.origins()
    for index, rule in enumerate(pack.data.get("compressors") or []):
        if not isinstance(rule, Mapping):
            continue
        cases = [c for c in rule.get("tests") or [] if isinstance(c, Mapping)]
        mine = inherited or declared_in(pack, f"/compressors/{index}", origins)
        if not cases:
            if require_tests and mine:
                origin = origins.get(f"/compressors/{index}")
                results.append(
                    CaseResult(
                        "<missing>",
                        str(rule.get("id")),
                        False,
                        "compressor has no tests (--require-tests)",
                        f"{origin.file}:{origin.line}" if origin else "",
                    )
                )
            continue
        for case_index, case in enumerate(cases):
            if not (inherited or declared_in(pack, f"/compressors/{index}/tests/{case_index}", origins)):
                continue
            started = time.perf_counter()
            result = _run_case(pack, origins, registry, index, rule, case_index, case)
            ms = (time.perf_counter() - started) * 1000
            results.append(dataclasses.replace(result, ms=ms))
    return results
