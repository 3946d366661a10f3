"""Checks of prompt sections, modes and discipline templates in a resolved pack.

| code  | what |
|-------|------|
| CR080 | a template does not parse or compile (syntax, unknown filter, nested too deeply, an |
|       | integer too long to read) |
| CR081 | ``{% include %}`` names a section that does not exist |
| CR082 | a mode names a section that does not exist |
| CR083 | a template uses a variable ``prompts.variables`` does not declare |
| CR084 | a template file cannot be read |
| CR085 | (warning) a template uses a volatile value: dates, ids, counters, random |
| CR086 | sections include each other in a cycle |
| CR087 | a mode does not assemble (trial render of every mode x models: entry) |

Findings inside a template point at the template's own line: the template file and line for
``file:`` sections, the pack line (plus the template line) for inline ones.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ctxrules.diagnostics import Diagnostic, Reporter, Severity, did_you_mean
from ctxrules.packs.confine import HINT, read_pack_text
from ctxrules.packs.source import split_lines
from ctxrules.prompts.assemble import AssemblyError, PromptSet, display_template_path
from ctxrules.prompts.building import TemplateBuildError, find_all, on_a_fresh_stack
from ctxrules.prompts.environment import BUILTIN_VARIABLES, RANDOM_FILTERS, make_environment
from ctxrules.prompts.limits import MAX_TRIAL_OPERATIONS, MAX_TRIAL_RENDERS, trial_spending
from ctxrules.prompts.volatile import find_volatile

if TYPE_CHECKING:
    from collections.abc import Collection

    from jinja2 import nodes

    from ctxrules.packs.loader import ResolvedPack
    from ctxrules.packs.source import Origin
    from ctxrules.plugins import Registry


def template_source(
    pack: ResolvedPack, section: dict[str, Any], pointer: str, origin_file: str
) -> tuple[str | None, str | None, str]:
    """(source, problem, code) of a section: its inline template or its file next to the
    pack (confined to the pack's roots, see :mod:`ctxrules.packs.confine`)."""
    if isinstance(section.get("template"), str):
        return section["template"], None, ""
    rel = section.get("file")
    if not isinstance(rel, str):
        return None, None, ""
    base = pack.real_paths.get(origin_file)
    text, _, code, problem = read_pack_text(pack.roots, base.parent if base else Path.cwd(), rel, "template file")
    return text, problem, code or ""


class _Where:
    """Maps a template line to a file position: the template file's own line for ``file:``
    templates, the pack's line for inline ones.

    Only a literal block scalar (``|``) keeps the template's lines as the file's lines, at the
    block's indentation. Any other inline template (quoted, plain, folded ``>``) is folded or
    unescaped on the way: its template line ``n`` is no file line one can compute from ``n``
    (a ``"\\n"`` escape is a new template line on the same file line), so findings point at
    the value itself and their message names the template line."""

    def __init__(self, pack: ResolvedPack, origin: Origin, inline: bool, rel: str | None) -> None:
        self.origin = origin
        self.inline = inline
        self.file = origin.file
        self.lines: list[str] = []  # the pack's lines, when the template is a literal block
        if inline:
            doc = pack.docs.get(origin.file)
            if doc is not None:
                lines = split_lines(doc.text)
                if 0 < origin.line <= len(lines):
                    head = lines[origin.line - 1][origin.col - 1 :]
                    # an anchor or a tag (`&name |`, `!!str |`) comes before the indicator
                    if _PROPERTIES.sub("", head, count=1).startswith("|"):
                        self.lines = lines
        elif rel is not None:
            base = pack.real_paths.get(origin.file)
            self.file = display_template_path((base.parent if base else pack.base_dir()) / rel)

    @property
    def exact(self) -> bool:
        """Whether a template line is reported at its own file line."""
        return not self.inline or bool(self.lines)

    def at(self, template_line: int | None) -> tuple[str, int, int]:
        line = max(template_line or 1, 1)
        if not self.inline:
            return self.file, line, 1
        if not self.lines:
            return self.file, self.origin.line, self.origin.col
        row = self.origin.line + line
        src = self.lines[row - 1] if row <= len(self.lines) else ""
        return self.file, row, len(src) - len(src.lstrip(" ")) + 1


# node properties before a block scalar's indicator: `&anchor`, `!tag`, `!!str`
_PROPERTIES = re.compile(r"^(?:[&!]\S*[ \t]+)*")


def check_prompts(rep: Reporter, pack: ResolvedPack, registry: Registry) -> None:
    """Report the CR08x findings of ``pack``'s prompts; templates may use ``registry``'s filters."""
    data = pack.data
    prompts = _mapping(data.get("prompts"))
    sections = _mapping(prompts.get("sections"))
    variables = _mapping(prompts.get("variables"))
    templates = _templates_of(data, sections)
    scope = _Scope(
        sections=sections,
        declared=set(variables) | BUILTIN_VARIABLES,
        stable={k for k, v in variables.items() if isinstance(v, dict) and v.get("stable") is True},
        # (a pack without templates, such as a compressor fragment, needs no environment)
        env=make_environment(filters={n: _noop for n in registry.filters}) if templates else None,
    )
    errors_before = sum(d.severity == "error" for d in rep.out)
    includes: dict[str, list[str]] = {}
    for pointer, sec in templates:
        refs = _check_template(rep, pack, scope, pointer, sec)
        if refs is not None and pointer.startswith("/prompts/sections/"):
            includes[pointer.rsplit("/", 1)[1]] = refs
    for cycle in _cycles(includes):
        rep.add(
            "CR086",
            "sections include each other in a cycle: " + " -> ".join([*cycle, cycle[0]]),
            f"/prompts/sections/{cycle[0]}",
            "an include cycle would never finish rendering",
        )
    modes = _mapping(prompts.get("modes"))
    _check_modes(rep, modes, sections)
    # A trial render needs the shape the schema promises (modes: a mapping, ...).
    if rep.schema_ok and sum(d.severity == "error" for d in rep.out) == errors_before:
        _trial_render(rep, pack, registry, modes)


class _Scope(NamedTuple):
    """What every template of a pack is checked against."""

    sections: dict[str, Any]
    declared: set[str]
    stable: set[str]
    env: Any  # the sandboxed Jinja environment, with the registry's filters


def _templates_of(data: dict[str, Any], sections: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(pointer, spec) of every template: the prompt sections, then the models' disciplines."""
    templates = [(f"/prompts/sections/{name}", sec) for name, sec in sections.items() if isinstance(sec, dict)]
    for i, entry in enumerate(data.get("models") or []):
        if isinstance(entry, dict) and isinstance(entry.get("discipline"), dict):
            templates.append((f"/models/{i}/discipline", entry["discipline"]))
    return templates


def _check_template(
    rep: Reporter, pack: ResolvedPack, scope: _Scope, pointer: str, sec: dict[str, Any]
) -> list[str] | None:
    """CR080/CR081/CR083/CR084/CR085 of one template; the sections it includes (None when it
    could not be read, parsed or compiled)."""
    import jinja2
    from jinja2 import nodes

    key = "template" if "template" in sec else "file"
    at = f"{pointer}/{key}"
    origin = rep.origin(at)
    source, problem, code = template_source(pack, sec, at, origin.file)
    if problem:
        rep.add(code, problem, at, HINT if code == "CR100" else None)
        return None
    if source is None:
        return None
    where = _Where(pack, origin, key == "template", sec.get("file") if key == "file" else None)

    def add(code: str, message: str, line: int | None, hint: str | None = None, severity: Severity = "error") -> None:
        file, row, col = where.at(line)
        if not where.exact and (line or 1) > 1 and "(template line" not in message:
            message += f" (template line {line})"  # the position is the value's, not the line's
        rep.out.append(Diagnostic(code, severity, message, file, row, col, rep.file_pointer(at), hint))

    def syntax_error(exc: jinja2.TemplateSyntaxError) -> None:
        # at the template's own line: in its file, or in the pack (a block scalar's lines are
        # the template's lines)
        what = "cannot be compiled" if isinstance(exc, TemplateBuildError) else "does not parse"
        detail = f" (template line {exc.lineno})" if key == "template" else ""
        add("CR080", f"template {what}{detail}: {exc.message}", exc.lineno, getattr(exc, "hint", None))

    env = scope.env
    try:
        ast = env.parse(source)
    except jinja2.TemplateSyntaxError as exc:
        syntax_error(exc)
        return None
    try:
        # Python's own limits (20 nested loops, 200 open brackets) show only when the code
        # Jinja generates is compiled: here, at the template's line, not in the trial render.
        env.compile(source)
    except TemplateBuildError as exc:
        syntax_error(exc)
        return None
    except jinja2.TemplateError:
        pass  # an unknown filter or test: reported below, or by the trial render
    for filt in find_all(ast, nodes.Filter):
        if filt.name not in env.filters:
            hint = (
                "it is random, and prompts must be the same in every process"
                if filt.name in RANDOM_FILTERS
                else did_you_mean(filt.name, list(env.filters))
            )
            add("CR080", f"template uses filter '{filt.name}', which does not exist", filt.lineno, hint)
    refs = sorted(_included(ast))
    for ref in refs:
        if ref not in scope.sections:
            rep.add(
                "CR081",
                f"template includes section '{ref}', which does not exist",
                at,
                did_you_mean(ref, list(scope.sections)),
            )
    for var, line in _undeclared(ast, scope.declared, env.globals):
        add(
            "CR083",
            f"template uses variable '{var}', which prompts.variables does not declare",
            line,
            did_you_mean(var, list(scope.declared)) or f"declare it: prompts.variables.{var}: {{default: ...}}",
        )
    for use in find_volatile(ast, stable=scope.stable):
        add(
            "CR085",
            f"system-prompt template uses {use.what}: {use.why}; a value that changes breaks "
            "the provider's prompt cache on every call",
            use.line,
            "keep the system prompt static and put dynamic content in a user message"
            + (
                " (or declare the variable `stable: true` if it never changes within a session)"
                if use.what.startswith("variable")
                else ""
            ),
            severity="warning",
        )
    return refs


def _check_modes(rep: Reporter, modes: dict[str, Any], sections: dict[str, Any]) -> None:
    """CR082: a mode names a section that does not exist."""
    for mode, spec in modes.items():
        names: Any
        if isinstance(spec, list):
            names, base = spec, f"/prompts/modes/{mode}"
        elif isinstance(spec, dict):
            names, base = spec.get("sections"), f"/prompts/modes/{mode}/sections"
        else:
            continue
        if not isinstance(names, list):
            continue
        for j, name in enumerate(names):
            if isinstance(name, str) and name not in sections:
                rep.add(
                    "CR082",
                    f"mode '{mode}' names section '{name}', which does not exist",
                    f"{base}/{j}",
                    did_you_mean(name, list(sections)),
                )


def _mapping(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _noop(value: object, *args: object, **kwargs: object) -> object:
    return value


def _included(ast: nodes.Template) -> set[str]:
    """The sections ``ast`` includes or imports by a literal name (as
    ``jinja2.meta.find_referenced_templates``, whose walk recursion cannot take every tree)."""
    from jinja2 import nodes

    names: set[str] = set()
    for node in find_all(ast, nodes.Node):
        if not isinstance(node, nodes.Extends | nodes.FromImport | nodes.Import | nodes.Include):
            continue
        target = node.template
        for const in target.items if isinstance(target, nodes.Tuple | nodes.List) else [target]:
            if isinstance(const, nodes.Const) and isinstance(const.value, str):
                names.add(const.value)
    return names


def _undeclared(ast: nodes.Template, declared: set[str], globals_: Collection[str] = ()) -> list[tuple[str, int]]:
    """(name, first template line) of every variable read but neither declared nor assigned."""
    from jinja2 import TemplateAssertionError, meta, nodes

    try:
        # Jinja's compiler walks the tree by recursion: as deep as it was built, on a fresh stack
        missing = on_a_fresh_stack(functools.partial(meta.find_undeclared_variables, ast)) - declared
    except (TemplateAssertionError, RecursionError):
        # Compiling failed (an unknown filter, reported as CR080, before a part too deep to
        # compile): judge from the syntax tree.
        names = list(find_all(ast, nodes.Name))
        assigned = {n.name for n in names if n.ctx in ("store", "param")}
        missing = {n.name for n in names if n.ctx == "load"} - assigned - declared - set(globals_)
    first: dict[str, int] = {}
    for n in find_all(ast, nodes.Name):
        if n.name in missing and n.ctx == "load":
            first[n.name] = min(first.get(n.name, n.lineno), n.lineno)
    return sorted(((name, first.get(name, 1)) for name in missing), key=lambda t: (t[1], t[0]))


def _cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """Include cycles, each starting at its alphabetically first section: one per edge back
    into the path a depth-first walk is on. Each section and include is visited once (listing
    every path would take exponential time on sections that include all later ones). Any
    include cycle yields at least one; in a tangle of cycles not every cycle, nor every section
    on one, is named."""
    seen: set[tuple[str, ...]] = set()
    out: list[list[str]] = []
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path = [start]
        on_path = {start}
        pending = [iter(graph.get(start, []))]
        while pending:
            nxt = next(pending[-1], None)
            if nxt is None:
                pending.pop()
                done.add(path[-1])
                on_path.discard(path.pop())
            elif nxt in on_path:
                cycle = path[path.index(nxt) :]
                k = cycle.index(min(cycle))
                norm = tuple(cycle[k:] + cycle[:k])
                if norm not in seen:
                    seen.add(norm)
                    out.append(list(norm))
            elif nxt in graph and nxt not in done:
                path.append(nxt)
                on_path.add(nxt)
                pending.append(iter(graph.get(nxt, [])))
    return out


def _trial_render(rep: Reporter, pack: ResolvedPack, registry: Registry, modes: dict[str, Any]) -> None:
    """Assemble every mode for no entry and for each models: entry, with the declared defaults
    (a placeholder for required variables): what fails here would fail for every caller."""
    try:
        ps = PromptSet(pack, registry)
    except AssemblyError as exc:
        rep.add("CR087", f"prompts cannot be prepared: {exc}", "/prompts")
        return
    sample = {name: "x" for name, var in ps.variables.items() if var.required}
    reported: set[str] = set()
    pairs = len(modes) * (len(ps.entries) + 1)
    if pairs > MAX_TRIAL_RENDERS:
        rep.add(
            "CR103",
            f"{len(modes)} prompt modes x {len(ps.entries) + 1} models: entries (with no entry) are "
            f"{pairs:,} prompts to check, more than the {MAX_TRIAL_RENDERS:,} a pack may have",
            "/prompts/modes",
            "split the pack, or share sections between fewer modes",
        )
        return
    with trial_spending() as spent:
        for mode, entry in ((m, e) for m in modes for e in [None, *ps.entries]):
            if spent[0] > MAX_TRIAL_OPERATIONS:
                rep.add(
                    "CR103",
                    f"the prompts of all modes and models: entries together do more than "
                    f"{MAX_TRIAL_OPERATIONS:,} template operations (stopped before mode '{mode}')",
                    "/prompts/modes",
                    "make the sections cheaper, or split the pack",
                )
                return
            try:
                ps.render(mode, entry, ps.effective_variables(sample))
            except AssemblyError as exc:
                message = str(exc)
                if message in reported:
                    continue
                reported.add(message)
                who = f"models entry '{entry.id}'" if entry else "a model with no models: entry"
                rep.add(
                    "CR103" if exc.limit else "CR087",
                    f"mode '{mode}' does not assemble for {who}: {message}",
                    f"/prompts/modes/{mode}",
                )
