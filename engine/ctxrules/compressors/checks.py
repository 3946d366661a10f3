"""Semantic checks of a resolved pack's ``compressors:`` (called by ``ctxrules validate``).

The JSON Schema checks each file's shape; this module checks what needs the plugins or the
merged result:

- CR043: a compressor without ``match.argv`` or without ``steps`` after merging;
- CR014: a compressor has more than :data:`~ctxrules.compressors.limits.MAX_STEPS` steps
  (the steps past the limit are not checked);
- CR061: a step names an unknown action (with a did-you-mean), or its ``with:`` does not
  match the action's option schema, or the action rejects its options when built (at the
  option, for an :class:`~ctxrules.compressors.limits.OptionError`: a format width over the
  limit, a bad escape in a replacement, ...);
- CR070: a regular expression option (``format: regex``) does not compile;
- CR013: a test gives both ``input`` and ``input_text``;
- CR040: two tests of one compressor share an id;
- CR130: a ``failures`` pattern does not compile;
- CR131: a ``failures`` pattern matches an empty line, so it would protect every line.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from ctxrules.compressors.limits import MAX_STEPS, OptionError
from ctxrules.diagnostics import Reporter, Severity, did_you_mean
from ctxrules.validation.quick import remembered
from ctxrules.validation.regexes import check_pattern, format_checker, pattern_problem, regex_values

if TYPE_CHECKING:
    from ctxrules.hookspecs import ActionType
    from ctxrules.plugins import Registry

__all__ = ["check_compressors"]


def _check_step(rep: Reporter, registry: Registry, rule_id: str, step: Mapping[str, Any], base: str) -> None:
    name = step.get("use")
    if not isinstance(name, str):
        return  # the schema reports a missing or non-string `use`
    action = registry.actions.get(name)
    if action is None:
        rep.add(
            "CR061",
            f"compressor '{rule_id}': unknown action '{name}'",
            f"{base}/use",
            did_you_mean(name, list(registry.actions)) or "actions: " + ", ".join(sorted(registry.actions)),
        )
        return
    options = step.get("with", {})
    if not isinstance(options, Mapping):
        return  # the schema reports the wrong type
    for finding in _step_findings(registry, name, action, options):
        finding.replay(rep, base)


class _Finding(NamedTuple):
    """One diagnostic of a step, its pointer relative to the step."""

    code: str
    message: str
    pointer: str
    hint: str | None
    severity: Severity
    at_key: bool

    def replay(self, rep: Reporter, base: str) -> None:
        rep.add(self.code, self.message, base + self.pointer, self.hint, self.severity, at_key=self.at_key)


class _Recorder:
    """A :class:`~ctxrules.validation.regexes.Findings` that keeps what is added."""

    def __init__(self) -> None:
        self.found: list[_Finding] = []

    def add(
        self,
        code: str,
        message: str,
        pointer: str,
        hint: str | None = None,
        severity: Severity = "error",
        *,
        at_key: bool = False,
    ) -> None:
        self.found.append(_Finding(code, message, pointer, hint, severity, at_key))


def _frozen(value: Any) -> Hashable:
    """``value`` (plain YAML data) as a hashable key that tells apart what JSON Schema does
    (``1``, ``1.0`` and ``True``; a key ``1`` and a key ``'1'``) and keeps mapping order."""
    if isinstance(value, Mapping):
        return ("{", tuple((_frozen(k), _frozen(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return ("[", tuple(_frozen(v) for v in value))
    return (type(value).__name__, value)


def _step_findings(
    registry: Registry, name: str, action: ActionType, options: Mapping[str, Any]
) -> tuple[_Finding, ...]:
    """What checking ``options`` against ``action`` finds, with pointers relative to the step.
    Remembered on the registry by (action, options): a pack that extends fragments validated
    in the same run names each of their steps twice, and the verdict depends on nothing else."""
    try:
        key: Hashable = ("compressor step", name, _frozen(options))
        hash(key)
    except TypeError:  # an unhashable scalar cannot come from YAML; check it afresh
        key = None
    if key is not None and key in registry.checked:
        found: tuple[_Finding, ...] = registry.checked[key]
        return found
    rec = _Recorder()
    _judge_step(rec, registry, name, action, options)
    found = tuple(rec.found)
    if key is not None:
        registry.checked[key] = found
    return found


def _validator(registry: Registry, name: str, action: ActionType) -> Any:
    """The compiled JSON-schema validator of ``action``'s options, one per registry."""
    key = ("action validator", name)
    validator = registry.checked.get(key)
    if validator is None:
        import jsonschema

        validator = jsonschema.Draft202012Validator(dict(action.options_schema), format_checker=format_checker())
        registry.checked[key] = validator
    return validator


def _judge_step(rep: _Recorder, registry: Registry, name: str, action: ActionType, options: Mapping[str, Any]) -> None:
    instance = dict(options)
    quick = remembered(registry.checked, ("action", name), action.options_schema, regex_format=True)
    # jsonschema only when the quick check is not sure (importing it was a third of the run)
    errors = [] if quick(instance) is True else list(_validator(registry, name, action).iter_errors(instance))
    for ptr, pattern in regex_values(action.options_schema, options, "/with"):
        check_pattern(rep, pattern, ptr, report_errors=False)
    for err in errors:
        ptr = "/with" + "".join(f"/{p}" for p in err.absolute_path)
        if err.validator == "additionalProperties":
            known = list(err.schema.get("properties", {}))
            for key in [k for k in err.instance if k not in known]:
                rep.add(
                    "CR061",
                    f"action '{name}' has no option '{key}'",
                    f"{ptr}/{key}",
                    did_you_mean(key, known)
                    or ("options: " + ", ".join(known) if known else "this action takes no options"),
                    at_key=True,
                )
        elif err.validator == "format":
            detail = pattern_problem(err.instance) or "invalid"
            rep.add("CR070", f"regular expression {err.instance!r} does not compile: {detail}", ptr)
        elif err.validator == "required":
            missing = [k for k in err.validator_value if k not in err.instance]
            rep.add("CR061", f"action '{name}' needs option '{missing[0] if missing else '?'}'", ptr)
        else:
            where = ptr[5:].lstrip("/") or "with"
            rep.add("CR061", f"option {where} of action '{name}': {err.message}", ptr)
    if errors:
        return
    try:
        action.configure(options)
    except OptionError as exc:  # one option refused (a format width over the limit, ...): there
        rep.add("CR061", f"action '{name}': {exc}", f"/with/{exc.option}")
    except Exception as exc:  # the action's own check (a group the pattern lacks, ...)
        rep.add("CR061", f"action '{name}' rejects its options: {exc or type(exc).__name__}", "/with")


def _check_tests(rep: Reporter, rule_id: str, tests: list[Any], base: str) -> None:
    seen: dict[str, int] = {}
    for k, case in enumerate(tests):
        if not isinstance(case, Mapping):
            continue
        if "input" in case and "input_text" in case:
            rep.add(
                "CR013",
                f"compressor '{rule_id}' test {k + 1}: give either input or input_text, not both",
                f"{base}/{k}",
            )
        ident = case.get("id")
        if isinstance(ident, str):
            if ident in seen:
                rep.add(
                    "CR040",
                    f"compressor '{rule_id}' has two tests with id '{ident}'",
                    f"{base}/{k}/id",
                )
            else:
                seen[ident] = k


def _matches_empty_line(pattern: str) -> bool:
    """Whether ``pattern`` (one that compiles) finds a match in an empty line: never when its
    shortest match is longer than nothing (most failure patterns); else asked of RE2, where
    the pattern runs there (it means the same there, and compiling it with ``re`` only
    for this was a tenth of validating the built-in packs); of ``re`` otherwise."""
    from ctxrules import patterns

    compiled = patterns.compile(pattern)
    if compiled.shape.min_width > 0:
        return False  # every match is at least that long (the parser's lower bound)
    if compiled.engine == "re2":
        return compiled.search("") is not None
    import re

    return re.compile(pattern).search("") is not None


def _check_failures(rep: Reporter, rule_id: str, patterns: list[Any], base: str) -> None:
    for k, entry in enumerate(patterns):
        pattern = entry.get("pattern") if isinstance(entry, Mapping) else entry
        if not isinstance(pattern, str):
            continue  # the schema reports the type
        where = f"{base}/{k}" + ("/pattern" if isinstance(entry, Mapping) else "")
        # Judged as every pack pattern is, by the module that runs it: it must compile and
        # run in bounded time (CR130), and an ambiguous nested repetition is a warning (CR102).
        problem = pattern_problem(pattern)
        if problem is not None:
            rep.add(
                "CR130",
                f"compressor '{rule_id}': failure pattern {pattern!r} does not compile: {problem}",
                where,
            )
            continue
        check_pattern(rep, pattern, where)
        if _matches_empty_line(pattern):
            rep.add(
                "CR131",
                f"compressor '{rule_id}': failure pattern {pattern!r} matches an empty line, "
                "so every line would be protected",
                where,
                "anchor it on what a failure line holds, e.g. '^FAILED '",
            )


def check_compressors(rep: Reporter, data: Mapping[str, Any], registry: Registry) -> None:
    """Report every problem of ``data['compressors']`` through ``rep.add``."""
    compressors = data.get("compressors")
    if not isinstance(compressors, list):
        return
    for i, rule in enumerate(compressors):
        if not isinstance(rule, Mapping):
            continue
        base = f"/compressors/{i}"
        rule_id = str(rule.get("id", f"#{i}"))
        match = rule.get("match")
        if not isinstance(match, Mapping) or not match.get("argv"):
            rep.add(
                "CR043",
                f"compressor '{rule_id}' has no match.argv after merging: it would never apply",
                base,
                "e.g. match: {argv: [git, status]}",
            )
        steps = rule.get("steps")
        if not isinstance(steps, list) or not steps:
            rep.add(
                "CR043",
                f"compressor '{rule_id}' has no steps after merging",
                base,
                "e.g. steps: [{use: strip_ansi}, {use: max_lines, with: {max: 200}}]",
            )
        else:
            if len(steps) > MAX_STEPS:
                rep.add(
                    "CR014",
                    f"compressor '{rule_id}' has {len(steps):,} steps; the limit is {MAX_STEPS}",
                    f"{base}/steps/{MAX_STEPS}",
                    "every step reads every line: fold steps together (one drop with several patterns)",
                )
            for j, step in enumerate(steps[:MAX_STEPS]):
                if isinstance(step, Mapping):
                    _check_step(rep, registry, rule_id, step, f"{base}/steps/{j}")
        failures = rule.get("failures")
        if isinstance(failures, list):
            _check_failures(rep, rule_id, failures, f"{base}/failures")
        tests = rule.get("tests")
        if isinstance(tests, list):
            _check_tests(rep, rule_id, tests, f"{base}/tests")
