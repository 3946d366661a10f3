"""How diagnostics are printed: text (with a source excerpt), json, github, sarif 2.1.0."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ctxrules._version import __version__
from ctxrules.printable import encodable, printable
from ctxrules.validation.diagnostics import CODES, Diagnostic

SourceReader = Callable[[str], list[str] | None]


def _read_lines(cache: dict[str, list[str] | None], file: str, real: dict[str, Path]) -> list[str] | None:
    if file not in cache:
        from ctxrules.packs.confine import FileRefused, read_limited
        from ctxrules.packs.source import split_lines

        path = real.get(file)
        try:  # the same rules as for reading the pack: never block on a FIFO, never a huge file
            # A name the loader did not resolve is not followed if it is a symlink: it may be
            # one that validation refused to read (CR100), whose target must not be printed.
            raw = read_limited(path) if path is not None else read_limited(Path(file), follow=False)
            cache[file] = split_lines(raw.decode("utf-8"))
        except (OSError, UnicodeDecodeError, FileRefused):
            cache[file] = None
    return cache[file]


def _excerpt(src: str, at: int, width: int = 100) -> tuple[str, int]:
    """A long source line cut to about ``width`` characters around column ``at`` (0-based)."""
    if len(src) <= width:
        return src, at
    start = max(0, min(at - width // 2, len(src) - width))
    head, tail = ("…" if start else ""), ("…" if start + width < len(src) else "")
    return head + src[start : start + width] + tail, at - start + len(head)


def _columns(text: str) -> int:
    """The terminal columns ``text`` takes: two for an East Asian wide or fullwidth character
    (a pack named in Chinese), none for a combining mark, one for the rest."""
    if text.isascii():
        return len(text)
    import unicodedata  # here: most lines are ASCII, and validate's start-up counts

    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def format_text(
    diags: list[Diagnostic], files_checked: int, real_paths: dict[str, Path] | None = None, files_skipped: int = 0
) -> str:
    cache: dict[str, list[str] | None] = {}
    out: list[str] = []
    for d in diags:
        # What a pack wrote (a key, a name, a file name) is quoted in messages: nothing in them
        # may act on the terminal.
        out.append(f"{printable(encodable(d.file))}:{d.line}:{d.col}: {d.severity}[{d.code}] {printable(d.message)}")
        lines = _read_lines(cache, d.file, real_paths or {})
        if lines is not None and 0 < d.line <= len(lines):
            src, caret = _excerpt(lines[d.line - 1].replace("\t", " "), max(d.col - 1, 0))
            gutter = f"{d.line:>4} | "
            out.append(gutter + printable(src))
            out.append(" " * (len(gutter) + _columns(printable(src[:caret]))) + "^")
        if d.hint:
            out.append(f"  help: {printable(d.hint)}")
    errors = sum(d.severity == "error" for d in diags)
    warnings = sum(d.severity == "warning" for d in diags)
    noun = "file" if files_checked == 1 else "files"
    skipped = f", {files_skipped} skipped (not rule packs)" if files_skipped else ""
    out.append(f"{files_checked} {noun} checked{skipped}: {errors} error(s), {warnings} warning(s)")
    return "\n".join(out) + "\n"


def format_json(diags: list[Diagnostic], files_checked: int, files_skipped: int = 0) -> str:
    doc = {
        "version": 1,
        "files_checked": files_checked,
        "files_skipped": files_skipped,
        "errors": sum(d.severity == "error" for d in diags),
        "warnings": sum(d.severity == "warning" for d in diags),
        "diagnostics": [_encodable(d.as_dict()) for d in diags],
    }
    return json.dumps(doc, indent=2) + "\n"


def _encodable(value: Any) -> Any:
    """A diagnostic's fields with each string :func:`encodable` (a file name with a byte that
    is not UTF-8 named the file; JSON cannot hold the lone surrogate Python reads it as)."""
    if isinstance(value, str):
        return encodable(value)
    if isinstance(value, list):
        return [_encodable(v) for v in value]
    if isinstance(value, dict):
        return {k: _encodable(v) for k, v in value.items()}
    return value


def _gh_escape(text: str, prop: bool = False) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    if prop:
        text = text.replace(":", "%3A").replace(",", "%2C")
    return text


def format_github(diags: list[Diagnostic], files_checked: int) -> str:
    out = []
    for d in diags:
        level = {"error": "error", "warning": "warning"}.get(d.severity, "notice")
        msg = printable(d.message + (f" (help: {d.hint})" if d.hint else ""), one_line=False)
        out.append(
            f"::{level} file={_gh_escape(printable(encodable(d.file)), True)},line={d.line},col={d.col},"
            f"title={_gh_escape(d.code, True)}::{_gh_escape(msg)}"
        )
    return "\n".join(out) + ("\n" if out else "")


def _sarif_uri(file: str) -> str:
    """A file as a URI reference: relative paths percent-encoded (a space or a ':' in a name
    would make an invalid or different URI), absolute ones as file: URIs. What is encoded is
    the name's bytes: a name that is not UTF-8 reaches Python with surrogate escapes."""
    import os
    from urllib.parse import quote_from_bytes

    if file.startswith("builtin:"):
        return file
    if Path(file).is_absolute():
        return Path(file).as_uri()
    return quote_from_bytes(os.fsencode(file))


def format_sarif(diags: list[Diagnostic], files_checked: int) -> str:
    used = sorted({d.code for d in diags})
    rules = [{"id": code, "shortDescription": {"text": CODES.get(code, code)}} for code in used]
    index = {code: i for i, code in enumerate(used)}
    results: list[dict[str, Any]] = []
    for d in diags:
        msg = encodable(d.message + (f"\nhelp: {d.hint}" if d.hint else ""))
        results.append(
            {
                "ruleId": d.code,
                "ruleIndex": index[d.code],
                "level": {"error": "error", "warning": "warning"}.get(d.severity, "note"),
                "message": {"text": msg},
                "locations": [
                    {
                        "physicalLocation": {
                            "artifactLocation": {"uri": _sarif_uri(d.file)},
                            "region": {"startLine": d.line, "startColumn": d.col},
                        }
                    }
                ],
                "properties": {"jsonPointer": encodable(d.pointer)},
            }
        )
    doc = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [
            {
                "tool": {"driver": {"name": "ctxrules", "version": __version__, "rules": rules}},
                "columnKind": "unicodeCodePoints",  # our columns count characters, as YAML marks do
                "results": results,
            }
        ],
    }
    return json.dumps(doc, indent=2) + "\n"


FORMATS = ("text", "json", "github", "sarif")
