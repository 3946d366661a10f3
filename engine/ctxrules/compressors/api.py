"""Compress the output of a shell command with the compressor rules of a pack.

:func:`compress_tool_output` is what the ``tool_output.filter`` stage (level (a), results of
``shell``-role tools) and ``ctxrules compress`` call: it finds the pack's rule for the
command (:mod:`ctxrules.compressors.rules`), runs its steps, enforces the engine's
truthfulness rules (:mod:`ctxrules.compressors.apply`) and stores the full output in the vault
so that every marker resolves to the exact original.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctxrules.compressors.apply import Window, apply_rule, apply_rule_window, is_failure, split_output
from ctxrules.compressors.argv import parse_command
from ctxrules.compressors.large import EarlyScan, Growing, Large, scan_middle_soon
from ctxrules.compressors.rules import CompressorError, compile_rules, select_rule
from ctxrules.patterns import Pattern, PatternTimeout
from ctxrules.patterns import compile as patterns_compile

if TYPE_CHECKING:
    from ctxrules.plugins import Registry
    from ctxrules.vault import Vault

__all__ = [
    "CompressResult",
    "CompressorError",
    "CompressorSkipped",
    "compress_large",
    "compress_text",
    "compress_tool_output",
    "text_id",
]


@dataclass(frozen=True)
class CompressResult:
    """A compressed output: ``text`` replaces the original, whose exact bytes are in the vault
    under ``vault_id`` (every marker in ``text`` points there).

    ``elided`` counts original lines that no output line stands for; ``failed`` is the
    engine's verdict on the run (non-zero exit code, or unknown and failure-looking output).
    """

    text: str
    rule_id: str
    vault_id: str
    lines_before: int
    lines_after: int
    elided: int = 0
    markers: int = 0
    failed: bool = False
    exit_code: int | None = None


MARKER_SURCHARGE = 120
"""Bytes added per marker when comparing sizes: a marker's 64 hex digits cost about twice as
many tokens per byte as ordinary output, so a marker counts about twice its length."""


def text_id(text: str) -> str:
    """The vault id ``Vault.put_text(text)`` will return (sha256 of its UTF-8 bytes)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _exit_code_patterns(pack: Mapping[str, Any]) -> tuple[Pattern, ...]:
    """The pack's ``tools.exit_code`` regexes (validated already; a bad one is skipped)."""
    tools = pack.get("tools")
    patterns = tools.get("exit_code") if isinstance(tools, Mapping) else None
    if not isinstance(patterns, list):
        return ()
    return _compiled(tuple(p for p in patterns if isinstance(p, str)))


@lru_cache(maxsize=32)
def _compiled(patterns: tuple[str, ...]) -> tuple[Pattern, ...]:
    out = []
    for pattern in patterns:
        try:
            out.append(patterns_compile(pattern))
        except re.error:
            continue
    return tuple(out)


def compress_text(
    pack: Mapping[str, Any],
    command: str,
    output: str,
    exit_code: int | None,
    *,
    vault_id: str | None = None,
    registry: Registry,
    lossless: bool = False,
    rule_id: str | None = None,
) -> CompressResult | None:
    """Like :func:`compress_tool_output` but stores nothing: the caller stores the original
    under ``vault_id`` (default: :func:`text_id` of ``output``) when it uses the result.

    ``rule_id`` forces that rule instead of the matching one (for a rule's own tests).
    Returns None when no rule matches or the result would not be smaller than ``output``.
    """
    if not isinstance(output, str):
        raise TypeError(f"output must be str, got {type(output).__name__}")
    if not output:
        return None
    rules = compile_rules(pack, registry)
    if not rules:
        return None
    # The pipeline asks again about the same outputs on every call of a session; the answer is
    # a pure function of these inputs, so it is remembered (strings are keys by value, and their
    # hashes are cached by Python, so a repeat costs a dict lookup).
    key = (id(rules), _exit_code_patterns(pack), command, output, exit_code, vault_id, lossless, rule_id)
    hit = _RESULTS.get(key)
    if hit is not None and hit[0] is rules:
        return hit[1]
    result = _compress_uncached(
        rules, pack, command, output, exit_code, vault_id=vault_id, lossless=lossless, rule_id=rule_id
    )
    if len(_RESULTS) >= _RESULTS_LIMIT:
        _RESULTS.clear()
    _RESULTS[key] = (rules, result)
    return result


class CompressorSkipped(CompressorError):
    """A rule's pattern timed out on this output (see :mod:`ctxrules.patterns`): nothing is
    compressed, and the caller keeps the original."""


_RESULTS: dict[tuple[Any, ...], tuple[Any, CompressResult | None]] = {}
_RESULTS_LIMIT = 8192


def _compress_uncached(
    rules: Any,
    pack: Mapping[str, Any],
    command: str,
    output: str,
    exit_code: int | None,
    *,
    vault_id: str | None,
    lossless: bool,
    rule_id: str | None,
) -> CompressResult | None:
    parsed = parse_command(command or "")
    failed = is_failure(exit_code, output)
    if rule_id is not None:
        rule = next((r for r in rules if r.id == rule_id), None)
        if rule is None:
            raise CompressorError(f"no compressor with id '{rule_id}'")
    else:
        if parsed is None:
            return None
        rule = select_rule(rules, parsed, exit_code, failed)
        if rule is None:
            return None
    try:
        applied = apply_rule(
            rule,
            output,
            command=command or "",
            argv=parsed.argv if parsed else (),
            exit_code=exit_code,
            vault_id=vault_id or text_id(output),
            lossless=lossless,
            keep=_exit_code_patterns(pack),
        )
    except PatternTimeout as exc:  # the output stays as it is; the next call skips at once
        raise CompressorSkipped(f"compressor '{rule.id}' skipped: {exc}") from None
    after = len(applied.text.encode("utf-8", "surrogatepass")) + MARKER_SURCHARGE * applied.markers
    if after >= len(output.encode("utf-8", "surrogatepass")):
        return None
    return CompressResult(
        text=applied.text,
        rule_id=rule.id,
        vault_id=vault_id or text_id(output),
        lines_before=applied.lines_before,
        lines_after=applied.lines_after,
        elided=applied.elided,
        markers=applied.markers,
        failed=applied.failed,
        exit_code=exit_code,
    )


def compress_tool_output(
    pack: dict[str, Any],
    command: str,
    output: str,
    exit_code: int | None,
    vault: Vault,
    *,
    registry: Registry,
) -> CompressResult | None:
    """The compressed ``output`` of ``command``, or None when no rule matches or saves anything.

    ``pack`` is a resolved pack's data (``compressors:`` is read); ``command`` the shell line
    as the agent sent it (compound commands match on their last command, see
    :mod:`ctxrules.compressors.argv`); ``exit_code`` None when unknown. The full ``output`` is
    put in ``vault`` before the result is returned, so its markers always resolve.
    ``registry`` holds the actions the rules' steps use (a session passes its engine's).
    Raises :class:`CompressorError` when a rule cannot be built or an action misbehaves.
    """
    result = compress_text(pack, command, output, exit_code, registry=registry)
    if result is None:
        return None
    stored = vault.put_text(output)
    if stored != result.vault_id:  # cannot happen unless the vault's id scheme changes
        raise CompressorError(f"vault stored the output as {stored}, markers say {result.vault_id}")
    return result


def early_scan(
    pack: Mapping[str, Any], command: str, *, registry: Registry, exit_code: int | None = 0
) -> Callable[[Path, int, int, Growing], EarlyScan | None]:
    """What :class:`ctxrules.compressors.large.Capture` calls when ``command``'s output
    spills: a scan of the middle that follows the writer, for the patterns of the rule the
    output would get if it ends with ``exit_code`` (0: the command is still running) and no
    failure in its tail. :func:`compress_large` takes its result
    when the rule it chooses in the end searches for the same patterns (most rules of one
    command share them), and scans again otherwise."""

    def start(path: Path, begin: int, first_line: int, growing: Growing) -> EarlyScan | None:
        try:
            rules = compile_rules(pack, registry)
        except CompressorError:
            return None  # compress_large meets it again and says so
        parsed = parse_command(command or "")
        rule = select_rule(rules, parsed, exit_code, False) if rules and parsed is not None else None
        if rule is None or not (rule.failures or _exit_code_patterns(pack)):
            return None
        return EarlyScan(path, begin, first_line, rule.failures, _exit_code_patterns(pack), growing)

    return start


def compress_large(
    pack: Mapping[str, Any], command: str, large: Large, exit_code: int | None, *, registry: Registry
) -> CompressResult | None:
    """:func:`compress_text` for an output held in part (:mod:`ctxrules.compressors.large`):
    the rule's steps see its head and tail windows, the engine's rules the whole of it. The
    markers point into ``large.writer``'s entry, which the caller commits when it uses the
    result."""
    try:
        return _compress_large(pack, command, large, exit_code, registry)
    finally:
        if large.early is not None:  # its result is in, or not wanted: stop a scan still going
            large.early.stop()


def _compress_large(
    pack: Mapping[str, Any], command: str, large: Large, exit_code: int | None, registry: Registry
) -> CompressResult | None:
    rules = compile_rules(pack, registry)
    parsed = parse_command(command or "")
    if not rules or parsed is None:
        return None
    head, _ = split_output(large.head.decode("utf-8", "replace"))
    tail_text = large.tail.decode("utf-8", "replace")
    tail, _ = split_output(tail_text)
    if not head and not tail:  # lines longer than the windows: nothing a rule could work on
        return None
    rule = select_rule(rules, parsed, exit_code, is_failure(exit_code, tail_text))
    if rule is None:
        return None
    keep = _exit_code_patterns(pack)
    try:
        # The middle was searched as the output came (early_scan) when the rule expected
        # then searches for this rule's patterns; else it is searched while the rule's steps
        # run on the windows (its lines are needed only after them).
        middle = large.early.take(rule.failures, keep) if large.early is not None else None
        if middle is None:
            middle = scan_middle_soon(large.writer.path, large.middle, large.head_lines + 1, rule.failures, keep)
        window = Window(
            lines=[*enumerate(head, 1), *enumerate(tail, large.tail_first)],
            middle=middle,
            total=large.total_lines,
            trailing=large.trailing,
            tail=tail_text,
        )
        applied = apply_rule_window(
            rule, window, command=command, argv=parsed.argv, exit_code=exit_code, vault_id=large.vault_id, keep=keep
        )
    except PatternTimeout as exc:
        raise CompressorSkipped(f"compressor '{rule.id}' skipped: {exc}") from None
    after = len(applied.text.encode("utf-8", "surrogatepass")) + MARKER_SURCHARGE * applied.markers
    if after >= large.size:
        return None
    return CompressResult(
        text=applied.text,
        rule_id=rule.id,
        vault_id=large.vault_id,
        lines_before=applied.lines_before,
        lines_after=applied.lines_after,
        elided=applied.elided,
        markers=applied.markers,
        failed=applied.failed,
        exit_code=exit_code,
    )
