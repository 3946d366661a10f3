"""Assembling a system prompt: a mode's sections, rendered and wrapped in their XML tags.

``assemble(pack, mode=..., model=..., variables=...)`` returns an :class:`AssembledPrompt`.
What goes in, in order:

1. the sections the mode lists (``prompts.modes.<mode>``), each rendered with Jinja in the
   sandboxed environment of :mod:`ctxrules.prompts.environment`;
2. the discipline section of the ``models:`` entry that matches ``model`` (first glob match on
   the bare or provider-prefixed name), unless the mode says ``discipline: false``.

Every section is wrapped exactly once: ``<tag>\\n<body>\\n</tag>``; sections are separated by
one blank line and the prompt has no trailing newline. A section whose body renders empty is
left out (no empty tags). Bodies are tidied the same way everywhere (see :func:`tidy`), so
editors' trailing spaces or CRLF line ends never reach the prompt.

**Determinism.** The text is a pure function of the pack's prompt data and template sources,
the mode, the matched entry and the variables: no clock, no environment, no dict-order leaks
(variables are scalars; Jinja's ``lipsum`` and ``random`` are removed from the environment).
Results are cached on exactly ``(prompt digest, mode, entry id, variables)``: two models that
match the same entry share one cached prompt, and a repeat costs a dictionary lookup.

**Escaping.** Values the caller supplies are data, not markup: every ``<`` that could start a
tag (``<x``, ``</x``, ``<!``, ``<?``) becomes ``&lt;``, so a variable can neither open nor close
a section. Pack-authored text is trusted but checked: a body that contains one of the prompt's
own tags is an error, which keeps "each tag exactly once" true for every prompt.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ctxrules.diagnostics import did_you_mean
from ctxrules.errors import CtxrulesError
from ctxrules.packs.loader import display_path
from ctxrules.packs.models_match import name_candidates
from ctxrules.plugins import Registry, default_registry
from ctxrules.prompts.building import TemplateBuildError
from ctxrules.prompts.environment import make_environment
from ctxrules.prompts.limits import RenderLimitError, render_budget
from ctxrules.resources import rules_dir

if TYPE_CHECKING:
    from jinja2 import Template

    from ctxrules.packs.loader import ResolvedPack
    from ctxrules.prompts.limits import LimitedEnvironment

__all__ = [
    "DEFAULT_DISCIPLINE_TAG",
    "NO_ENTRY",
    "AssembledPrompt",
    "AssemblyError",
    "PromptSet",
    "RenderedSection",
    "assemble",
    "cache_info",
    "clear_cache",
    "escape_variable",
    "prompt_set",
    "tidy",
]

DEFAULT_DISCIPLINE_TAG = "execution_discipline"
NO_ENTRY = "no-entry"
"""The name of "no models: entry" where an entry id is expected (CLI ``--entry``, snapshot ids)."""
Scalar = str | int | float | bool | None

# A "<" that could begin markup: a tag name (ASCII or not), a closing slash, "<!" or "<?".
# "a < b", "x <= 5" and "<3" are left alone: they cannot open a tag.
_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")
_TAGLIKE = re.compile(r"<(?=[/!?A-Za-z_:]|[^\x00-\x7f])")
_BLANK_RUNS = re.compile(r"\n{3,}")
_CACHE_SIZE = 4096


class AssemblyError(CtxrulesError):
    """A prompt cannot be assembled: unknown mode or variable, or a template that fails.
    ``limit`` is True when a template exceeded a rendering limit (ctxrules.prompts.limits)."""

    exit_code = 2

    def __init__(self, message: str, *, limit: bool = False) -> None:
        super().__init__(message)
        self.limit = limit


def escape_variable(value: str) -> str:
    """``value`` with every tag-opening ``<`` written as ``&lt;`` (see the module docstring)."""
    return _TAGLIKE.sub("&lt;", value)


def tidy(text: str) -> str:
    """The whitespace rules every rendered body follows: CRLF/CR become LF, trailing spaces
    go from every line, runs of blank lines become one, blank lines at both ends go."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    return _BLANK_RUNS.sub("\n\n", text).strip("\n")


# -- results ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RenderedSection:
    """One section as it went into a prompt."""

    name: str
    tag: str
    origin: str
    chars: int
    sha256: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "tag": self.tag,
            "origin": self.origin,
            "chars": self.chars,
            "sha256": self.sha256,
        }


@dataclass(frozen=True)
class AssembledPrompt:
    """An assembled system prompt. ``entry`` is the id of the ``models:`` entry that matched
    (``None``: no entry); ``sha256`` is the hex digest of the UTF-8 text."""

    text: str
    mode: str
    entry: str | None
    sections: tuple[RenderedSection, ...]
    variables: Mapping[str, Scalar]
    sha256: str
    pack_digest: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "models_entry": self.entry,
            "sha256": self.sha256,
            "chars": len(self.text),
            "pack_digest": self.pack_digest,
            "variables": dict(self.variables),
            "sections": [s.as_dict() for s in self.sections],
            "text": self.text,
        }


# -- the compiled prompt data of one pack ------------------------------------------------------


class _Section(NamedTuple):
    name: str
    tag: str
    source: str
    origin: str


class _Mode(NamedTuple):
    name: str
    sections: tuple[str, ...]
    discipline: bool


class _Entry(NamedTuple):
    id: str
    globs: tuple[str, ...]
    discipline: _Section | None


class _Variable(NamedTuple):
    name: str
    default: Scalar
    required: bool


def display_template_path(path: Path) -> str:
    """A template file as diagnostics name it: like a pack file, but a built-in keeps its suffix."""
    shown = display_path(path)
    # display_path names built-in *packs* without their suffix; a template keeps its name.
    if shown.startswith("builtin:"):
        return "builtin:" + path.resolve().relative_to(rules_dir().resolve()).as_posix()
    return shown


def read_template(
    pack: ResolvedPack, spec: Mapping[str, Any], pointer: str, origins: Mapping[str, Any]
) -> tuple[str | None, str, str | None]:
    """(source, origin text, problem) of a section or discipline spec at ``pointer``.

    Inline templates are used as written; ``file:`` is read (UTF-8) relative to the pack file
    that declared it. The origin is ``file:line`` of the template (inline) or the template
    file's path; ``problem`` says why a file could not be read.
    """
    template = spec.get("template")
    if isinstance(template, str):
        o = origins.get(f"{pointer}/template") or origins.get(pointer)
        return template, (f"{o.file}:{o.line}" if o else pointer), None
    rel = spec.get("file")
    if not isinstance(rel, str):
        return None, pointer, None
    from ctxrules.packs.confine import read_pack_text

    o = origins.get(f"{pointer}/file") or origins.get(pointer)
    base = pack.real_paths.get(o.file) if o else None
    folder = base.parent if base else pack.base_dir()
    text, path, _, problem = read_pack_text(pack.roots, folder, rel, "template file")
    if text is None or path is None:
        return None, str(path or folder / rel), problem
    return text, display_template_path(path), None


class _SectionLoader:
    """Jinja loader over the pack's sections: ``{% include "NAME" %}`` includes section NAME."""

    def __init__(self, sources: Mapping[str, str]) -> None:
        self.sources = dict(sources)

    def make(self) -> Any:
        from jinja2 import BaseLoader, TemplateNotFound

        sources = self.sources

        class Loader(BaseLoader):
            def get_source(self, environment: Any, template: str) -> tuple[str, str | None, Any]:
                if template not in sources:
                    raise TemplateNotFound(template)
                return sources[template], None, lambda: True

        return Loader()


class PromptSet:
    """The ``prompts:`` and ``models:`` of one resolved pack, read once and ready to render.

    Build it with :func:`prompt_set` (memoized per pack object). ``digest`` covers everything
    the output depends on: variables and defaults, section tags and template *sources* (files
    included), modes, entries and the template filters' plugin versions.
    """

    def __init__(self, pack: ResolvedPack, registry: Registry) -> None:
        self.pack = pack
        data = pack.data
        origins = pack.origins()
        prompts: dict[str, Any] = data["prompts"] if isinstance(data.get("prompts"), dict) else {}
        self.variables: dict[str, _Variable] = {}
        for name, spec in sorted((prompts.get("variables") or {}).items()):
            spec = spec if isinstance(spec, dict) else {}
            self.variables[name] = _Variable(name, spec.get("default"), bool(spec.get("required", False)))
        self.sections: dict[str, _Section] = {}
        problems: list[str] = []
        for name, spec in (prompts.get("sections") or {}).items():
            if not isinstance(spec, dict):
                continue
            source, origin, problem = read_template(pack, spec, f"/prompts/sections/{name}", origins)
            if problem:
                problems.append(f"section '{name}': {problem}")
                continue
            self.sections[name] = _Section(name, str(spec.get("tag") or name), tidy_source(source or ""), origin)
        self.modes: dict[str, _Mode] = {}
        for name, spec in (prompts.get("modes") or {}).items():
            if isinstance(spec, list):
                self.modes[name] = _Mode(name, tuple(str(s) for s in spec), True)
            elif isinstance(spec, dict):
                self.modes[name] = _Mode(
                    name,
                    tuple(str(s) for s in spec.get("sections") or []),
                    spec.get("discipline", True) is not False,
                )
        self.entries: list[_Entry] = []
        for i, entry in enumerate(data.get("models") or []):
            if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
                continue
            disc = None
            spec = entry.get("discipline")
            if isinstance(spec, dict):
                source, origin, problem = read_template(pack, spec, f"/models/{i}/discipline", origins)
                if problem:
                    problems.append(f"models entry '{entry['id']}' discipline: {problem}")
                else:
                    disc = _Section(
                        f"discipline:{entry['id']}",
                        str(spec.get("tag") or DEFAULT_DISCIPLINE_TAG),
                        tidy_source(source or ""),
                        origin,
                    )
            globs = tuple(g for g in entry.get("match") or [] if isinstance(g, str))
            self.entries.append(_Entry(entry["id"], globs, disc))
        if problems:
            raise AssemblyError("; ".join(problems))
        self._filters = dict(registry.filters)
        self.digest = self._digest(registry.fingerprint())
        self._env: LimitedEnvironment | None = None
        self._compiled: dict[str, Template] = {}
        self._entry_memo: dict[str, _Entry | None] = {}
        self._lock = threading.Lock()

    def _digest(self, filters: str) -> str:
        body = {
            "variables": [[v.name, v.default, v.required] for v in self.variables.values()],
            "sections": {n: [s.tag, s.source] for n, s in sorted(self.sections.items())},
            "modes": {n: [list(m.sections), m.discipline] for n, m in sorted(self.modes.items())},
            "entries": [
                [
                    e.id,
                    list(e.globs),
                    [e.discipline.tag, e.discipline.source] if e.discipline else None,
                ]
                for e in self.entries
            ],
            "filters": filters,
        }
        canonical = json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    # -- lookups ------------------------------------------------------------------------------
    def mode_names(self) -> list[str]:
        return list(self.modes)

    def entry_ids(self) -> list[str]:
        return [e.id for e in self.entries]

    def select_entry(self, model: str) -> _Entry | None:
        """The first entry whose globs match the bare or provider-prefixed ``model``."""
        if model in self._entry_memo:
            return self._entry_memo[model]
        names = name_candidates(model)
        hit = next(
            (e for e in self.entries if any(fnmatchcase(n, g) for g in e.globs for n in names)),
            None,
        )
        if len(self._entry_memo) < 10_000:
            self._entry_memo[model] = hit
        return hit

    def entry(self, ident: str) -> _Entry:
        for e in self.entries:
            if e.id == ident:
                return e
        raise AssemblyError(f"no models: entry with id '{ident}'" + _hint(ident, self.entry_ids()))

    def effective_variables(self, given: Mapping[str, Any] | None) -> dict[str, Scalar]:
        """Declared defaults with ``given`` applied; unknown names, missing required values and
        non-scalar values are errors. Strings are escaped (:func:`escape_variable`)."""
        given = dict(given or {})
        unknown = sorted(k for k in given if k not in self.variables)
        if unknown:
            declared = ", ".join(self.variables) or "none"
            raise AssemblyError(
                f"unknown prompt variable '{unknown[0]}' (declared: {declared})"
                + _hint(unknown[0], list(self.variables))
            )
        out: dict[str, Scalar] = {}
        for name, var in self.variables.items():
            if name in given:
                value = given[name]
            elif var.required:
                raise AssemblyError(
                    f"prompt variable '{name}' is required; give it a value "
                    f"(--var {name}=... or variables={{'{name}': ...}})"
                )
            else:
                value = var.default
            if not isinstance(value, str | int | float | bool) and value is not None:
                raise AssemblyError(
                    f"prompt variable '{name}' must be a string, number, boolean or null, not {type(value).__name__}"
                )
            if isinstance(value, float) and not math.isfinite(value):
                raise AssemblyError(f"prompt variable '{name}' must be a finite number, not {value}")
            if isinstance(value, str) and _SURROGATE.search(value):
                raise AssemblyError(
                    f"prompt variable '{name}' holds a lone surrogate (a byte that is not UTF-8 in --var); "
                    "a prompt must be text UTF-8 can carry"
                )
            out[name] = escape_variable(value) if isinstance(value, str) else value
        return out

    # -- rendering -----------------------------------------------------------------------------
    def _environment(self) -> LimitedEnvironment:
        if self._env is None:
            sources = {n: s.source for n, s in self.sections.items()}
            self._env = make_environment(_SectionLoader(sources).make(), self._filters)
        return self._env

    def _template(self, section: _Section) -> Template:
        compiled = self._compiled.get(section.name)
        if compiled is None:
            env = self._environment()
            if section.name in self.sections:
                compiled = env.get_template(section.name)
            else:
                compiled = env.from_string(section.source)
            self._compiled[section.name] = compiled
        return compiled

    def render(self, mode: str, entry: _Entry | None, variables: Mapping[str, Scalar]) -> AssembledPrompt:
        """Render ``mode`` for ``entry`` with already-effective ``variables`` (no cache)."""
        import jinja2

        spec = self.modes.get(mode)
        if spec is None:
            raise AssemblyError(
                f"no prompt mode '{mode}' (modes: {', '.join(self.modes) or 'none'})" + _hint(mode, list(self.modes))
            )
        parts: list[_Section] = []
        for name in spec.sections:
            section = self.sections.get(name)
            if section is None:
                raise AssemblyError(
                    f"mode '{mode}' names section '{name}', which does not exist" + _hint(name, list(self.sections))
                )
            parts.append(section)
        if spec.discipline and entry is not None and entry.discipline is not None:
            parts.append(entry.discipline)
        context = {**variables, "mode": mode, "model_entry": entry.id if entry else None}
        rendered: list[tuple[_Section, str]] = []
        templates = []
        with self._lock:  # compiled templates are shared; compiling is not thread-safe
            for section in parts:
                try:
                    templates.append(self._template(section))
                except TemplateBuildError as exc:
                    raise AssemblyError(
                        f"section '{_label(section)}' ({section.origin}) does not compile "
                        f"(template line {exc.lineno}): {exc.message}"
                    ) from None
                except jinja2.TemplateError as exc:
                    raise AssemblyError(
                        f"section '{_label(section)}' ({section.origin}) does not compile: {type(exc).__name__}: {exc}"
                    ) from None
        with render_budget():  # the sections of one prompt share one budget
            for section, template in zip(parts, templates, strict=True):
                try:
                    body = tidy(self._environment().render_limited(functools.partial(template.render, context)))
                except RenderLimitError as exc:
                    raise AssemblyError(
                        f"section '{_label(section)}' ({section.origin}) exceeds a rendering limit: {exc}",
                        limit=True,
                    ) from None
                except RecursionError:
                    raise AssemblyError(
                        f"section '{_label(section)}' ({section.origin}) recurses without end: it "
                        "includes itself (directly or through other sections), or a macro calls itself"
                    ) from None
                except Exception as exc:  # template code is the pack's: any failure is the pack's
                    raise AssemblyError(
                        f"section '{_label(section)}' ({section.origin}) does not render: {type(exc).__name__}: {exc}"
                    ) from None
                if _SURROGATE.search(body):
                    body = _utf8_text(section, body)
                if body:
                    rendered.append((section, body))
        _check_tags(rendered)
        text = "\n\n".join(f"<{s.tag}>\n{body}\n</{s.tag}>" for s, body in rendered)
        sections = tuple(
            RenderedSection(
                _label(s),
                s.tag,
                s.origin,
                len(body),
                hashlib.sha256(body.encode("utf-8")).hexdigest(),
            )
            for s, body in rendered
        )
        return AssembledPrompt(
            text,
            mode,
            entry.id if entry else None,
            sections,
            dict(variables),
            hashlib.sha256(text.encode("utf-8")).hexdigest(),
            self.digest,
        )

    def assemble(
        self,
        mode: str,
        *,
        model: str | None = None,
        entry: str | None = None,
        variables: Mapping[str, Any] | None = None,
    ) -> AssembledPrompt:
        """The prompt for ``mode`` and ``model`` (or an explicit ``entry`` id), cached."""
        chosen = self.entry(entry) if entry is not None else (self.select_entry(model) if model else None)
        effective = self.effective_variables(variables)
        key = (
            self.digest,
            mode,
            chosen.id if chosen else None,
            json.dumps(effective, sort_keys=True, ensure_ascii=False, separators=(",", ":")),
        )
        hit = _CACHE.get(key)
        if hit is not None:
            return hit
        result = self.render(mode, chosen, effective)
        _CACHE.put(key, result)
        return result


def tidy_source(source: str) -> str:
    """Template sources with CRLF/CR line ends normalized (a checkout on Windows renders the
    same bytes as one on Linux)."""
    return source.replace("\r\n", "\n").replace("\r", "\n")


def _utf8_text(section: _Section, body: str) -> str:
    """``body`` with each surrogate pair as the character it encodes (as YAML reads an escaped
    pair; a Jinja string escape ``"\\ud83d\\ude00"`` gives two surrogates); a lone one, from a
    string escape such as ``"\\ud800"`` or from ``'%c' % 55296``, is an error: no UTF-8 text (the
    prompt, its digest, a file, a request) can hold it."""
    body = _SURROGATE_PAIR.sub(lambda m: m.group(0).encode("utf-16", "surrogatepass").decode("utf-16"), body)
    lone = _SURROGATE.search(body)
    if lone:
        char = lone.group(0).encode("unicode_escape").decode("ascii")
        line = body.count("\n", 0, lone.start()) + 1
        raise AssemblyError(
            f"section '{_label(section)}' ({section.origin}) writes a lone surrogate ({char}) on line {line} "
            "of its text; a prompt must be text UTF-8 can carry"
        )
    return body


def _label(section: _Section) -> str:
    return section.name


def _hint(word: str, choices: list[str]) -> str:
    hint = did_you_mean(word, choices)
    return f"; {hint}" if hint else ""


def _check_tags(rendered: list[tuple[_Section, str]]) -> None:
    """Each tag of the prompt must wrap exactly one section and appear nowhere else."""
    seen: dict[str, str] = {}
    for section, _ in rendered:
        other = seen.get(section.tag)
        if other is not None:
            raise AssemblyError(
                f"sections '{other}' and '{_label(section)}' share the tag <{section.tag}>; "
                "each section of a prompt needs its own tag"
            )
        seen[section.tag] = _label(section)
    if not seen:
        return
    pattern = re.compile(r"</?(" + "|".join(re.escape(t) for t in seen) + r")(?=[\s/>])")
    for section, body in rendered:
        m = pattern.search(body)
        if m:
            line = body.count("\n", 0, m.start()) + 1
            raise AssemblyError(
                f"section '{_label(section)}' ({section.origin}) contains '{m.group(0)}' on line "
                f"{line} of its text; a section may not open or close the prompt's own tags "
                "(name the section in words)"
            )


# -- caches ----------------------------------------------------------------------------------


@dataclass
class _LRU:
    size: int
    data: OrderedDict[Any, AssembledPrompt] = field(default_factory=OrderedDict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    hits: int = 0
    misses: int = 0

    def get(self, key: Any) -> AssembledPrompt | None:
        with self.lock:
            value = self.data.get(key)
            if value is None:
                self.misses += 1
                return None
            self.hits += 1
            self.data.move_to_end(key)
            return value

    def put(self, key: Any, value: AssembledPrompt) -> None:
        with self.lock:
            self.data[key] = value
            self.data.move_to_end(key)
            while len(self.data) > self.size:
                self.data.popitem(last=False)


_CACHE = _LRU(_CACHE_SIZE)
_SETS: OrderedDict[tuple[int, int], tuple[ResolvedPack, Registry, PromptSet]] = OrderedDict()
_SETS_LOCK = threading.Lock()


def prompt_set(pack: ResolvedPack, registry: Registry) -> PromptSet:
    """The :class:`PromptSet` of ``pack`` with ``registry``'s template filters, built once per
    pack object and registry."""
    key = (id(pack), id(registry))
    with _SETS_LOCK:
        hit = _SETS.get(key)
        if hit is not None and hit[0] is pack and hit[1] is registry:
            return hit[2]
    built = PromptSet(pack, registry)
    with _SETS_LOCK:
        _SETS[key] = (pack, registry, built)  # both held: their ids cannot be reused meanwhile
        while len(_SETS) > 64:
            _SETS.popitem(last=False)
    return built


def cache_info() -> dict[str, int]:
    """Hits, misses and size of the process-wide prompt cache."""
    with _CACHE.lock:
        return {"hits": _CACHE.hits, "misses": _CACHE.misses, "size": len(_CACHE.data)}


def clear_cache() -> None:
    """Forget every cached prompt and compiled pack (tests and benchmarks)."""
    with _CACHE.lock:
        _CACHE.data.clear()
        _CACHE.hits = _CACHE.misses = 0
    with _SETS_LOCK:
        _SETS.clear()


def assemble(
    pack: ResolvedPack,
    *,
    mode: str,
    model: str | None = None,
    variables: Mapping[str, Any] | None = None,
    entry: str | None = None,
    registry: Registry | None = None,
) -> AssembledPrompt:
    """Assemble the system prompt of ``mode`` for ``model`` from a resolved ``pack``.

    ``entry`` picks a ``models:`` entry by id instead of matching ``model``; with neither, no
    discipline section is added. Raises :class:`AssemblyError` for an unknown mode, an unknown
    or missing variable, or a template that fails to render.

    ``registry``: the plugins whose template filters the templates may use; pass
    ``engine.registry`` for a pack an :class:`~ctxrules.Engine` loaded with ``plugins=``. Without
    it, the installed plugins are used (this function is an entry point, like ``Engine.load``).
    """
    ps = prompt_set(pack, registry if registry is not None else default_registry())
    return ps.assemble(mode, model=model, entry=entry, variables=variables)
