"""Compressor rules compiled from a pack, and the choice of the rule for a command.

Matching (docs/compressors.md "Matching"): ``match.argv`` is a list of patterns. The first is
matched against the program's basename; the following ones that do not start with ``-`` must
match the leading positional arguments in order (the subcommand, then its subcommand:
``[git, stash, list]``); the ones that start with ``-`` must match some option anywhere. Each
pattern is a glob (``*``, ``?``, ``[...]``), and ``|`` separates alternatives (``npm|pnpm``).
``match.exit_code`` narrows a rule to an exit code, a list of them, ``zero`` or ``nonzero``.

The most specific matching rule wins (the number of non-``*`` patterns, plus one for an exit
code condition); among equally specific rules, the first in pack order. A pack therefore
overrides a built-in rule by giving a more specific one, or by reusing its id.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any

from ctxrules.compressors.argv import CommandLine, positionals
from ctxrules.compressors.failures import (
    DEFAULT_FAILURES,
    FAILURES_MAX,
    FailurePattern,
    compile_failures,
)
from ctxrules.compressors.limits import MAX_STEPS
from ctxrules.diagnostics import did_you_mean
from ctxrules.errors import CtxrulesError

if TYPE_CHECKING:
    from ctxrules.compressors.lines import Lines
    from ctxrules.plugins import Registry

__all__ = [
    "DEFAULT_MAX_MARKERS",
    "FAILURE_TAIL",
    "CompiledRule",
    "CompressorError",
    "compile_rules",
    "select_rule",
]

FAILURE_TAIL = 10
"""Lines at the end of a failing run that are always kept (a rule may ask for more)."""

DEFAULT_MAX_MARKERS = 2
"""Markers one output carries at most; more elided runs are merged into wider markers."""


class CompressorError(CtxrulesError):
    """A compressor rule could not be built or an action misbehaved; names rule and step."""


@dataclass(frozen=True)
class Step:
    action: str
    run: Callable[[Lines], Sequence[str]]


def _alternatives(pattern: str) -> tuple[str, ...]:
    return tuple(p for p in pattern.split("|") if p) or ("",)


def _glob_any(value: str, alternatives: tuple[str, ...]) -> bool:
    return any(fnmatchcase(value, alt) for alt in alternatives)


@dataclass(frozen=True)
class ArgvPattern:
    program: tuple[str, ...]
    subcommands: tuple[tuple[str, ...], ...]
    flags: tuple[tuple[str, ...], ...]

    @classmethod
    def parse(cls, patterns: Sequence[str]) -> ArgvPattern:
        program = _alternatives(patterns[0])
        subs = tuple(_alternatives(p) for p in patterns[1:] if not p.startswith("-"))
        flags = tuple(_alternatives(p) for p in patterns[1:] if p.startswith("-"))
        return cls(program, subs, flags)

    @property
    def specificity(self) -> int:
        parts = [self.program, *self.subcommands, *self.flags]
        return sum(1 for alts in parts if alts != ("*",))

    def matches(self, argv: tuple[str, ...]) -> bool:
        if not argv or not _glob_any(argv[0], self.program):
            return False
        if self.subcommands:
            pos = positionals(argv)
            if len(pos) < len(self.subcommands):
                return False
            if not all(_glob_any(arg, alts) for arg, alts in zip(pos, self.subcommands, strict=False)):
                return False
        if self.flags:
            options = [a for a in argv[1:] if a.startswith("-")]
            # `--oneline` matches `--oneline`; `-n` also matches `-n20` and `--format` `--format=x`.
            expanded = options + [a.split("=", 1)[0] for a in options if "=" in a]
            for alts in self.flags:
                if not any(_glob_any(opt, alts) for opt in expanded):
                    return False
        return True


@dataclass(frozen=True)
class CompiledRule:
    id: str
    order: int
    argv: ArgvPattern
    exit_code: Any
    steps: tuple[Step, ...]
    lossless: bool
    failure_tail: int
    max_markers: int
    failures: tuple[FailurePattern, ...] = ()
    failures_max: int = FAILURES_MAX

    @property
    def specificity(self) -> int:
        return self.argv.specificity + (1 if self.exit_code is not None else 0)

    def accepts_exit(self, exit_code: int | None, failed: bool) -> bool:
        cond = self.exit_code
        if cond is None:
            return True
        if cond == "zero":
            return not failed
        if cond == "nonzero":
            return failed
        if exit_code is None:
            return False
        if isinstance(cond, list):
            return exit_code in cond
        return bool(exit_code == cond)


def _build_steps(rule_id: str, steps: Sequence[Any], registry: Registry) -> tuple[Step, ...]:
    if len(steps) > MAX_STEPS:  # validate reports it (CR014); a pack loaded without is refused here
        raise CompressorError(f"compressor '{rule_id}' has {len(steps):,} steps; the limit is {MAX_STEPS}")
    built: list[Step] = []
    for i, step in enumerate(steps):
        if not isinstance(step, Mapping) or not isinstance(step.get("use"), str):
            raise CompressorError(f"compressor '{rule_id}', step {i + 1}: a step is {{use: ACTION, with: {{...}}}}")
        name = step["use"]
        action = registry.actions.get(name)
        if action is None:
            hint = did_you_mean(name, list(registry.actions))
            raise CompressorError(
                f"compressor '{rule_id}', step {i + 1}: unknown action '{name}'" + (f"; {hint}" if hint else "")
            )
        options = dict(step.get("with") or {})
        try:
            fn = action.configure(options)
        except CtxrulesError:
            raise
        except Exception as exc:  # a bad option the schema could not catch (e.g. a regex group)
            raise CompressorError(f"compressor '{rule_id}', step {i + 1} ({name}): {exc}") from exc
        built.append(Step(name, fn))
    return tuple(built)


def _compile(compressors: list[Any], registry: Registry) -> tuple[CompiledRule, ...]:
    rules: list[CompiledRule] = []
    for order, item in enumerate(compressors):
        if not isinstance(item, Mapping) or item.get("enabled") is False:
            continue
        rule_id = str(item.get("id", f"#{order}"))
        match = item.get("match") or {}
        argv = match.get("argv") if isinstance(match, Mapping) else None
        if not argv:
            continue  # a rule without argv patterns matches nothing (validate reports it)
        declared = item.get("failures")
        patterns = DEFAULT_FAILURES if declared is None else list(declared)
        try:
            failures = compile_failures(patterns)
        except (re.error, ValueError) as exc:  # validate reports it as CR130 with the pointer
            raise CompressorError(f"compressor '{rule_id}': failure pattern does not compile: {exc}") from exc
        rules.append(
            CompiledRule(
                id=rule_id,
                order=order,
                argv=ArgvPattern.parse([str(a) for a in argv]),
                exit_code=match.get("exit_code"),
                steps=_build_steps(rule_id, item.get("steps") or [], registry),
                lossless=bool(item.get("lossless", False)),
                failure_tail=max(FAILURE_TAIL, int(item.get("failure_tail", FAILURE_TAIL))),
                max_markers=max(1, int(item.get("max_markers", DEFAULT_MAX_MARKERS))),
                failures=failures,
                failures_max=max(1, int(item.get("failures_max", FAILURES_MAX))),
            )
        )
    return tuple(rules)


_CACHE: dict[tuple[int, str], tuple[Registry, tuple[CompiledRule, ...]]] = {}
# The last lists seen, by identity: a resolved pack's data is read-only by convention, so the
# same list object means the same rules and serializing it again can be skipped. The lists
# and registries are kept alive here, so an id is never reused while it is cached (a registry
# gone and another built at its address would otherwise get rules built with the first one's
# actions).
_BY_IDENTITY: dict[tuple[int, int], tuple[list[Any], Registry, tuple[CompiledRule, ...]]] = {}


def compile_rules(pack: Mapping[str, Any], registry: Registry) -> tuple[CompiledRule, ...]:
    """The pack's compressor rules, built once per (registry, rules) and cached."""
    compressors = pack.get("compressors") or []
    if not isinstance(compressors, list) or not compressors:
        return ()
    hit = _BY_IDENTITY.get((id(registry), id(compressors)))
    if hit is not None and hit[0] is compressors and hit[1] is registry:
        return hit[2]
    rules = _compile_cached(compressors, registry)
    if len(_BY_IDENTITY) > 16:
        _BY_IDENTITY.clear()
    _BY_IDENTITY[(id(registry), id(compressors))] = (compressors, registry, rules)
    return rules


def _compile_cached(compressors: list[Any], registry: Registry) -> tuple[CompiledRule, ...]:
    stripped = [
        {k: v for k, v in c.items() if k not in ("tests", "description")} if isinstance(c, Mapping) else c
        for c in compressors
    ]
    key = (id(registry), json.dumps(stripped, sort_keys=True, default=str))
    found = _CACHE.get(key)
    if found is None or found[0] is not registry:
        if len(_CACHE) > 64:
            _CACHE.clear()
        found = _CACHE[key] = (registry, _compile(compressors, registry))
    return found[1]


def select_rule(
    rules: Sequence[CompiledRule], command: CommandLine, exit_code: int | None, failed: bool
) -> CompiledRule | None:
    """The most specific rule that matches; the first in pack order among equals."""
    best: CompiledRule | None = None
    for rule in rules:
        if not rule.argv.matches(command.argv) or not rule.accepts_exit(exit_code, failed):
            continue
        if best is None or rule.specificity > best.specificity:
            best = rule
    return best
