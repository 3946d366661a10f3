"""Checks of prompt sections, modes and discipline templates in a resolved pack."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctxrules.validation.diagnostics import did_you_mean

if TYPE_CHECKING:
    from ctxrules.packs.loader import ResolvedPack
    from ctxrules.validation.validate import _Reporter


def template_source(pack: ResolvedPack, section: dict[str, Any], pointer: str,
                    origin_file: str) -> tuple[str | None, str | None]:
    """(source, problem) of a section: its inline template or its file next to the pack."""
    if isinstance(section.get("template"), str):
        return section["template"], None
    rel = section.get("file")
    if not isinstance(rel, str):
        return None, None
    base = pack.real_paths.get(origin_file)
    path = (base.parent if base else Path.cwd()) / rel
    try:
        return path.read_text(encoding="utf-8"), None
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"template file {rel!r} cannot be read ({getattr(exc, 'strerror', None) or exc})"


def check_prompts(rep: _Reporter, pack: ResolvedPack) -> None:
    import jinja2
    from jinja2 import meta

    from ctxrules.prompts.environment import BUILTIN_VARIABLES, make_environment

    data = pack.data
    prompts = data.get("prompts") if isinstance(data.get("prompts"), dict) else {}
    sections = prompts.get("sections") if isinstance(prompts.get("sections"), dict) else {}
    variables = prompts.get("variables") if isinstance(prompts.get("variables"), dict) else {}
    declared = set(variables) | BUILTIN_VARIABLES
    env = make_environment()

    templates: list[tuple[str, dict[str, Any]]] = [
        (f"/prompts/sections/{name}", sec) for name, sec in sections.items() if isinstance(sec, dict)]
    for i, entry in enumerate(data.get("models") or []):
        if isinstance(entry, dict) and isinstance(entry.get("discipline"), dict):
            templates.append((f"/models/{i}/discipline", entry["discipline"]))

    for pointer, sec in templates:
        key = "template" if "template" in sec else "file"
        at = f"{pointer}/{key}"
        origin = rep.origin(at)
        source, problem = template_source(pack, sec, at, origin.file)
        if problem:
            rep.add("CR084", problem, at)
            continue
        if source is None:
            continue
        try:
            ast = env.parse(source)
        except jinja2.TemplateSyntaxError as exc:
            rep.add("CR080", f"template does not parse (template line {exc.lineno}): {exc.message}", at)
            continue
        for ref in sorted(r for r in meta.find_referenced_templates(ast) if r is not None):
            if ref not in sections:
                rep.add("CR081", f"template includes section '{ref}', which does not exist", at,
                        did_you_mean(ref, list(sections)))
        for var in sorted(meta.find_undeclared_variables(ast) - declared):
            rep.add("CR083", f"template uses variable '{var}', which prompts.variables does not declare", at,
                    did_you_mean(var, list(declared)) or f"declare it: prompts.variables.{var}: {{default: ...}}")

    modes = prompts.get("modes") if isinstance(prompts.get("modes"), dict) else {}
    for mode, names in modes.items():
        if not isinstance(names, list):
            continue
        for j, name in enumerate(names):
            if isinstance(name, str) and name not in sections:
                rep.add("CR082", f"mode '{mode}' names section '{name}', which does not exist",
                        f"/prompts/modes/{mode}/{j}", did_you_mean(name, list(sections)))
