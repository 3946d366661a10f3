"""Semantic checks of a resolved pack, and validation of files and folders for the CLI."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ctxrules.compressors.checks import check_compressors
from ctxrules.diagnostics import Diagnostic, Reporter, did_you_mean
from ctxrules.errors import UsageError
from ctxrules.packs.confine import MAX_PACK_BYTES
from ctxrules.packs.loader import BUILTIN_PREFIX, BUILTIN_REF, PackLoader, ResolvedPack, builtin_names, builtin_path
from ctxrules.packs.source import escape_token
from ctxrules.printable import printable, shown_int
from ctxrules.stages.base import options_schema_for
from ctxrules.types import THRESHOLD_NAMES
from ctxrules.validation.quick import remembered
from ctxrules.validation.regexes import check_pattern, format_checker, regex_values
from ctxrules.validation.templates import check_prompts

if TYPE_CHECKING:
    from ctxrules.plugins import Registry


class FileProblems:
    """The per-file diagnostics one ``validate`` run has reported, by shown file name, and the
    files among them with errors (and with errors that stop the semantic checks): a file that
    many packs extend is looked at once, not once per pack (each pack of a chain of N files
    walked all the files below it)."""

    def __init__(self) -> None:
        self.reported: set[str] = set()
        self.with_errors: set[str] = set()
        self.unreadable: set[str] = set()  # a problem of _UNREADABLE: no semantic check

    def new(self, loader: PackLoader, files: list[str]) -> list[Diagnostic]:
        """The diagnostics of those of ``files`` not reported yet (now reported)."""
        out: list[Diagnostic] = []
        for shown in set(files).difference(self.reported):
            self.reported.add(shown)
            for p in _paths_of(loader, shown):
                found = loader.read(p)[1]
                out.extend(found)
                if any(d.severity == "error" for d in found):
                    self.with_errors.add(shown)
                    if any(d.code in _UNREADABLE for d in found if d.severity == "error"):
                        self.unreadable.add(shown)
        return out


# Per-file problems after which the merged pack is not checked further (it was not read whole).
_UNREADABLE = frozenset(("CR001", "CR002", "CR003", "CR090", "CR101", "CR104"))


def validate_resolved(
    pack: ResolvedPack, loader: PackLoader, registry: Registry, seen: FileProblems | None = None
) -> list[Diagnostic]:
    """Every diagnostic of ``pack``: per-file ones from each file read, then semantic ones.
    Stage types, actions, filters and option schemas are those of ``registry``. With ``seen``
    (one per run), the per-file ones of files reported before in the run are left out."""
    if not pack.merged:  # extends meet a cycle: nothing merged to check (its files' problems are in)
        return _sorted_unique(list(pack.diagnostics))
    out: list[Diagnostic] = list(pack.diagnostics)
    files = seen if seen is not None else FileProblems()
    out.extend(files.new(loader, pack.files))
    if any(d.severity == "error" and d.code in _UNREADABLE for d in out) or not files.unreadable.isdisjoint(pack.files):
        return _sorted_unique(out)
    rep = Reporter(pack)
    rep.schema_ok = not any(d.severity == "error" for d in out) and files.with_errors.isdisjoint(pack.files)
    data = pack.data
    _check_context(rep, data.get("context"), "/context")
    for i, entry in enumerate(data.get("models") or []):
        if isinstance(entry, dict) and isinstance(entry.get("context"), dict):
            merged = _deep(data.get("context") or {}, entry["context"])
            _check_context(rep, merged, f"/models/{i}/context", own=entry["context"])
    _check_pipeline(rep, data, pack, registry)
    _check_regexes(rep, data)
    # compressors: step options against each action's plugin schema (CR061/CR070/CR043)
    check_compressors(rep, data, registry)
    check_prompts(rep, pack, registry)
    _check_timeouts(rep, data)
    _check_spawn_cap(rep, data)
    _check_budgets(rep, data)
    _check_named_files(rep, pack, loader.verdicts)
    _check_model_names(rep, data)
    return _sorted_unique(out + rep.out)


def _check_model_names(rep: Reporter, data: dict[str, Any]) -> None:
    """CR014 for a model name holding a control character, a bidirectional mark or a lone
    surrogate (no model has one): a test case failed on it only when run, and a summarizer or
    router model was sent as it was."""

    def check(value: Any, pointer: str) -> None:
        if isinstance(value, str) and value and printable(value) != value:
            rep.add(
                "CR014",
                f"model name '{printable(value)}' holds a character no model name has (shown escaped)",
                pointer,
            )

    for i, case in enumerate(data.get("tests") or []):
        if isinstance(case, dict):
            check(case.get("model"), f"/tests/{i}/model")
    summarizer = data.get("summarizer")
    if isinstance(summarizer, dict):
        for key in ("model", "fallback"):
            check(summarizer.get(key), f"/summarizer/{key}")
        lite = summarizer.get("lite_models")
        for family, name in lite.items() if isinstance(lite, dict) else ():
            check(name, f"/summarizer/lite_models/{escape_token(str(family))}")
    router = data.get("router")
    tiers = router.get("tiers") if isinstance(router, dict) else None
    for tier, spec in tiers.items() if isinstance(tiers, dict) else ():
        if isinstance(spec, dict):
            check(spec.get("model"), f"/router/tiers/{escape_token(str(tier))}/model")


def _check_named_files(rep: Reporter, pack: ResolvedPack, verdicts: dict[Any, Any]) -> None:
    """CR100 for test inputs that lie outside the pack's roots (templates and parents are
    checked where they are read). ``verdicts`` keeps each path's verdict for the run: a
    fragment's test inputs are checked again in every pack that extends it."""
    from ctxrules.packs.confine import HINT, OutsideRoots, check_inside

    def verdict(base: Path, value: str, what: str) -> str | None:
        key = ("named file", pack.roots, base, value, what, os.getcwd())  # base may be relative
        if key not in verdicts:
            try:
                check_inside(pack.roots, base, value, what)
                verdicts[key] = None
            except OutsideRoots as exc:
                verdicts[key] = str(exc)
            except (OSError, ValueError):
                verdicts[key] = None  # not a usable path: the test run says so
        found: str | None = verdicts[key]
        return found

    def check(value: Any, pointer: str, what: str) -> None:
        if not isinstance(value, str) or not value:
            return
        origin = rep.origin(pointer)
        real = pack.real_paths.get(origin.file)
        problem = verdict(real.parent if real else pack.base_dir(), value, what)
        if problem is not None:
            rep.add("CR100", problem, pointer, HINT)

    for i, case in enumerate(pack.data.get("tests") or []):
        # A case that may be skipped is skipped when its input is outside (ctxrules test says
        # so): built-in packs carry such cases on a corpus the caller may allow.
        if isinstance(case, dict) and case.get("skip_if_missing") is not True:
            for key in ("input", "tools"):
                check(case.get(key), f"/tests/{i}/{key}", f"test {key}")
    for i, rule in enumerate(pack.data.get("compressors") or []):
        for k, case in enumerate(rule.get("tests") or [] if isinstance(rule, dict) else []):
            if isinstance(case, dict):
                check(case.get("input"), f"/compressors/{i}/tests/{k}/input", "test input")


def _paths_of(loader: PackLoader, shown: str) -> Sequence[Path]:
    return loader.paths_of(shown)  # an index: a scan of every file read made a chain quadratic


def _sorted_unique(diags: list[Diagnostic]) -> list[Diagnostic]:
    seen: set[tuple[Any, ...]] = set()
    out = []
    for d in diags:
        k = (d.code, d.file, d.line, d.col, d.message)
        if k not in seen:
            seen.add(k)
            out.append(d)
    return sorted(out, key=lambda d: d.sort_key)


def _deep(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _deep(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _check_context(rep: Reporter, ctx: Any, base: str, own: dict[str, Any] | None = None) -> None:
    if not isinstance(ctx, dict):
        return
    th = ctx.get("thresholds")
    own_raw = (own or ctx).get("thresholds")
    own_th = own_raw if isinstance(own_raw, dict) else {}
    if isinstance(th, dict):
        present = [
            (k, th[k])
            for k in THRESHOLD_NAMES
            if isinstance(th.get(k), int | float) and not isinstance(th.get(k), bool)
        ]
        for k, v in present:
            if not 0 < v < 1 and (own is None or k in own_th):
                rep.add(
                    "CR050",
                    f"threshold {k} is {v}; thresholds are fractions of the usable window in (0, 1)",
                    f"{base}/thresholds/{k}",
                    "use a fraction, e.g. 0.5 for 50%",
                )
        for (k1, v1), (k2, v2) in pairwise(present):
            if v1 >= v2 and 0 < v1 < 1 and 0 < v2 < 1:
                at = _blame(rep, f"{base}/thresholds", k1, k2, own_th if own is not None else None)
                rep.add(
                    "CR051",
                    f"thresholds must increase: {k1} ({v1}) is not below {k2} ({v2})",
                    f"{base}/thresholds/{at}",
                    "monitor < light < full < emergency",
                )
    window, reserve = ctx.get("window"), ctx.get("reserve_output")
    if isinstance(window, int) and isinstance(reserve, int) and reserve >= window:
        rep.add(
            "CR052",
            f"reserve_output ({shown_int(reserve)}) leaves no usable window of {shown_int(window)} tokens",
            f"{base}/reserve_output",
        )


def _blame(rep: Reporter, base: str, k1: str, k2: str, own: dict[str, Any] | None) -> str:
    """Which of two out-of-order thresholds to point at: the one this pack (or this models:
    entry) wrote, preferring the later one; an inherited value is not where the mistake is."""
    if own is not None:
        return k2 if k2 in own else k1
    mine = rep.pack.files[-1] if rep.pack.files else None
    for k in (k2, k1):
        if rep.origin(f"{base}/{k}").file == mine:
            return k
    return k2


def _check_pipeline(rep: Reporter, data: dict[str, Any], pack: ResolvedPack, registry: Registry) -> None:
    essential = {name for name, st in registry.stages.items() if st.essential}
    for i, stage in enumerate(data.get("pipeline") or []):
        if not isinstance(stage, dict):
            continue
        base = f"/pipeline/{i}"
        use = stage.get("use")
        if use is None:
            rep.add(
                "CR043",
                f"pipeline item '{stage.get('id')}' has no 'use' after merging",
                base,
                "give the stage type with use:, e.g. use: compress.dedup",
            )
            continue
        if not isinstance(use, str):
            continue
        st = registry.stages.get(use)
        if st is None:
            rep.add(
                "CR060",
                f"unknown stage type '{use}'",
                f"{base}/use",
                did_you_mean(use, list(registry.stages)) or "registered: " + ", ".join(sorted(registry.stages)),
            )
            continue
        opts = stage.get("with", {})
        if isinstance(opts, dict):
            schema = options_schema_for(st)
            errors: list[Any] = []
            if remembered(registry.checked, ("stage", use), schema, regex_format=True)(opts) is not True:
                import jsonschema  # only when the quick check is not sure: a third of the run

                validator = jsonschema.Draft202012Validator(schema, format_checker=format_checker())
                errors = list(validator.iter_errors(opts))
            for ptr, pattern in regex_values(schema, opts, f"{base}/with"):
                check_pattern(rep, pattern, ptr, report_errors=False)
            if not errors:
                # A schema checks each option on its own; the stage's factory also checks how
                # they go together (e.g. head + tail within a maximum), so build it once here.
                try:
                    st.factory(dict(opts))
                except Exception as exc:  # any factory error is a problem of these options
                    rep.add("CR061", f"options of '{use}' are rejected: {exc}", f"{base}/with")
            for err in errors:
                ptr = f"{base}/with" + "".join(f"/{p}" for p in err.absolute_path)
                if err.validator == "additionalProperties":
                    known = list(err.schema.get("properties", {}))
                    for k in [k for k in err.instance if k not in known]:
                        rep.add(
                            "CR061",
                            f"stage type '{use}' has no option '{k}'",
                            f"{ptr}/{k}",
                            did_you_mean(k, known)
                            or ("options: " + ", ".join(known) if known else "this stage type takes no options"),
                            at_key=True,
                        )
                elif err.validator == "format":
                    rep.add("CR070", f"regular expression does not compile: {err.instance!r}", ptr)
                else:
                    rep.add("CR061", f"option {ptr[len(base) + 5 :] or 'with'} of '{use}': {err.message}", ptr)
        if use in essential and stage.get("when"):
            rep.add(
                "CR062", f"'{use}' is essential: it runs after every content stage and takes no when:", f"{base}/when"
            )
    disabled_essential = [i for i in pack.disabled.get("pipeline", []) if _uses_essential(pack, i, essential)]
    for ident in disabled_essential:
        o = pack.disabled_at.get("pipeline", {}).get(ident) or rep.origin("/pipeline")
        rep.out.append(
            Diagnostic(
                "CR062",
                "error",
                f"pipeline item '{ident}' runs an essential stage and cannot be disabled",
                o.file,
                o.line,
                o.col,
                o.pointer or "/pipeline",
                "essential stages run whether or not a pack names them",
            )
        )


def _uses_essential(pack: ResolvedPack, ident: str, essential: set[str]) -> bool:
    for doc in pack.docs.values():
        for item in (doc.data or {}).get("pipeline") or []:
            if isinstance(item, dict) and item.get("id") == ident and item.get("use") in essential:
                return True
    return False


def _check_regexes(rep: Reporter, data: dict[str, Any]) -> None:
    from ctxrules import patterns

    def check(pattern: Any, pointer: str, need_group: bool = False) -> None:
        if not check_pattern(rep, pattern, pointer):
            return
        if need_group and isinstance(pattern, str) and patterns.compile(pattern).groups < 1:
            rep.add(
                "CR070",
                f"exit-code pattern {pattern!r} needs a group that captures the code",
                pointer,
                r"e.g. 'Exit code (\d+)'",
            )

    tools = data.get("tools") or {}
    for i, pat in enumerate(tools.get("exit_code") or [] if isinstance(tools, dict) else []):
        check(pat, f"/tools/exit_code/{i}", need_group=True)
    for i, rule in enumerate(data.get("priorities") or []):
        if isinstance(rule, dict) and isinstance(rule.get("match"), dict):
            check(rule["match"].get("contains"), f"/priorities/{i}/match/contains")
    red = data.get("redaction") or {}
    for i, pat in enumerate(red.get("patterns") or [] if isinstance(red, dict) else []):
        if isinstance(pat, dict):
            check(pat.get("regex"), f"/redaction/patterns/{i}/regex")
    router = data.get("router")
    rules = router.get("rules") if isinstance(router, dict) else None
    for rid, rule in (rules or {}).items() if isinstance(rules, dict) else ():
        if isinstance(rule, dict):
            check(rule.get("regex"), f"/router/rules/{escape_token(str(rid))}/regex")


# -- files and folders -------------------------------------------------------------------


def is_pack_file(path: Path) -> bool:
    """In a folder, a YAML file is a pack when it says so at top level (other YAML is skipped).
    What is not a regular file (a FIFO would block the read forever, a device fill memory)
    counts as a pack, so that validation refuses it: CR101. A file over the size limit is read
    only that far: a pack says so there or is none (a large data file is skipped, as a small
    one is; a large pack is refused)."""
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            return True
        with path.open("rb") as f:
            raw = f.read(MAX_PACK_BYTES)
    except OSError:
        return True  # let validation report the read error
    return any(_PACK_KEY.search(text) for text in _readings(raw))


def _readings(raw: bytes) -> list[str]:
    """The text of a file as the pack test reads it: UTF-8, and the UTF-16 and UTF-32 some
    editors save (with or without a byte-order mark) when there are NUL bytes. A pack saved so
    must count as one, for validation to say it is not UTF-8 instead of passing over it; a
    byte-order mark must not hide a key on line 1."""
    texts = [raw.decode("utf-8", errors="replace")]
    if b"\x00" in raw:
        texts += [raw.decode(c, errors="replace") for c in ("utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be")]
    return [t.removeprefix("\ufeff") for t in texts]


# `apiVersion: ctxrules/...` or `kind: RulePack` as a key: block style, flow style
# (`{apiVersion: ctxrules/v1, ...}`) or JSON (`{"kind": "RulePack"}`), keys and values quoted or not.
_Q = "(?:\"|')?"  # an optional quote
_PACK_KEY = re.compile(
    rf"(?:^[ \t]*|[{{,][ \t]*){_Q}(?:apiVersion{_Q}\s*:\s*{_Q}ctxrules/|kind{_Q}\s*:\s*{_Q}RulePack\b)",
    re.M,
)


def collect_files(
    paths: list[str],
    *,
    skip_non_packs: bool = False,
    skipped: list[Path] | None = None,
    outside: list[Path] | None = None,
) -> list[Path]:
    """Files named directly, plus the pack files found below named folders (sorted).
    ``skip_non_packs`` also skips named YAML files that do not declare themselves packs
    (for the pre-commit hook, which passes every changed YAML file); the files passed over
    that way are appended to ``skipped``. A file below a named folder that is a symlink to a
    file outside that folder is not opened: it is appended to ``outside``."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        try:
            is_dir, exists = p.is_dir(), p.exists()
        except OSError as exc:  # e.g. a name too long for the file system
            raise UsageError(f"cannot use {raw!r}: {exc.strerror or exc}") from None
        if is_dir:
            found = sorted(
                q
                for q in p.rglob("*")
                if q.suffix in (".yaml", ".yml")
                and q.is_file()
                and not any(part.startswith(".") for part in q.relative_to(p).parts)
            )
            home = p.resolve()
            for q in found:
                if not q.resolve().is_relative_to(home):
                    if outside is not None:
                        outside.append(q)
                elif is_pack_file(q):
                    out.append(q)
        elif exists and skip_non_packs and not is_pack_file(p):
            if skipped is not None:
                skipped.append(p)
        elif exists:
            out.append(p)
        else:
            raise UsageError(f"no such file or folder: {raw}")
    return out


class ValidationRun(NamedTuple):
    diagnostics: list[Diagnostic]
    files_checked: int
    real_paths: dict[str, Path]  # the real path behind each displayed file name
    files_skipped: int = 0  # named YAML files that are not packs (--skip-non-packs)


def validate_paths(
    paths: list[str], registry: Registry, *, skip_non_packs: bool = False, search_path: Sequence[str] = ()
) -> ValidationRun:
    """Diagnostics for every pack under ``paths`` (each resolved with its parents), the number
    of files checked and skipped, and the real path behind each displayed file name. A pack
    found below a named folder may read from anywhere in that folder; a named file, from its own
    folder (plus ``search_path`` for both, see :mod:`ctxrules.packs.confine`)."""
    loader = PackLoader(search_path)
    skipped: list[Path] = []
    outside: list[Path] = []
    files: list[tuple[Path, Path | None]] = []
    refs: dict[Path, str] = {}  # a built-in pack named as builtin:NAME[@RANGE]: resolved by that name
    for raw in paths:
        if raw.startswith(BUILTIN_PREFIX):
            path = _builtin_file(raw)
            refs[path] = raw
            files.append((path, None))
            continue
        folder = Path(raw) if Path(raw).is_dir() else None
        found = collect_files([raw], skip_non_packs=skip_non_packs, skipped=skipped, outside=outside)
        files.extend((f, folder) for f in found)
    out: list[Diagnostic] = [_outside_folder(f) for f in outside]
    real: dict[str, Path] = {}
    checked: set[Path] = set()  # a file named twice (a folder and a path in it) is one file
    seen = FileProblems()
    for f, folder in files:
        where = f.resolve()
        checked.add(where)
        pack = loader.resolve(refs.get(f, str(where)), root=folder)
        real.update(pack.real_paths)
        # A parent's own problems come back identical from each child and are reported once;
        # what only shows when a child is resolved (a cycle, an order the child breaks) may sit
        # in a parent's lines and must not be dropped for it.
        out.extend(validate_resolved(pack, loader, registry, seen))
    return ValidationRun(_sorted_unique(out), len(checked) + len(outside), real, len(skipped))


def _builtin_file(ref: str) -> Path:
    """The file of the built-in pack ``ref`` names (``builtin:NAME`` or ``builtin:NAME@RANGE``:
    the range is checked against the pack as ``extends`` checks it); a name no built-in pack
    has is a usage error naming those there are."""
    m = BUILTIN_REF.match(ref)
    path = builtin_path(m["name"]) if m is not None else None
    if path is None or not path.is_file():
        there = ", ".join(BUILTIN_PREFIX + n for n in builtin_names())
        raise UsageError(f"no built-in pack '{ref}' (there are: {there})")
    return path


def _outside_folder(link: Path) -> Diagnostic:
    return Diagnostic(
        "CR100",
        "error",
        "a symlink to a file outside the folder being validated; the file is not read",
        str(link),
        hint="validate the file where it lives, or replace the link with the file",
    )


# -- stream timeouts (ctxrules.timeouts; docs/timeouts.md) ---------------------------------


def _check_timeouts(rep: Reporter, data: dict[str, Any]) -> None:
    """CR091-CR093: overrides that cannot take effect, compaction not allowed for in the
    step, a heartbeat too slow for the chunk limit. Warnings: the pack still loads."""
    if not isinstance(data.get("timeouts"), dict):
        return  # nothing to lint (the timeouts module: for the packs that declare some)
    from ctxrules.timeouts import lint_timeouts

    for f in lint_timeouts(data):
        rep.add(f.code, f.message, f.pointer, f.hint, severity="warning")


# -- budgets (docs/budgets.md) ------------------------------------------------------------------


def _check_budgets(rep: Reporter, data: dict[str, Any]) -> None:
    """CR014: a day time zone that is not an IANA name, a warning share not below its
    finalization share: every budget check of such a pack would fail (exit 2, no location)."""
    if not isinstance(data.get("budgets"), dict):
        return
    from ctxrules.budget.policy import lint_budgets  # the budget package: only for packs with budgets

    for pointer, message, hint in lint_budgets(data):
        rep.add("CR014", message, pointer, hint)


# -- sub-agents (docs/budgets.md "Sub-agents") ------------------------------------------------


def _check_spawn_cap(rep: Reporter, data: dict[str, Any]) -> None:
    """CR125: the spawn cap has one key, ``budgets.max_descendants``; the guard key is read as
    its alias (when the budgets key is absent) and flagged so the pack can move."""
    guards = data.get("guards")
    sub = guards.get("subagents") if isinstance(guards, dict) else None
    if not isinstance(sub, dict) or "max_descendants" not in sub:
        return
    budgets = data.get("budgets")
    own = budgets.get("max_descendants") if isinstance(budgets, dict) else None
    if own is None:
        rep.add(
            "CR125",
            "guards.subagents.max_descendants is deprecated: it is read as budgets.max_descendants, the one spawn cap",
            "/guards/subagents/max_descendants",
            f"move it: budgets: {{max_descendants: {sub['max_descendants']}}}",
            severity="warning",
        )
    else:
        rep.add(
            "CR125",
            f"guards.subagents.max_descendants ({sub['max_descendants']}) is deprecated and "
            f"ignored: budgets.max_descendants ({own}) is the spawn cap",
            "/guards/subagents/max_descendants",
            "remove guards.subagents.max_descendants",
            severity="warning",
        )
