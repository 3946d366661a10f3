"""The resolved pack as YAML, optionally with each value's origin as a trailing comment."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml

from ctxrules.packs.source import Origin, escape_token

# Characters YAML prints as they are but a terminal does not show in the order they have: the
# bidirectional marks, embeddings, overrides and isolates. A string holding one is written
# double-quoted with every non-ASCII character escaped, which reads back the same.
_BIDI = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _scalar(value: Any) -> str:
    """One value on one line (a string that PyYAML would fold is written double-quoted)."""
    if isinstance(value, str) and _BIDI.search(value):
        return yaml.safe_dump(value, default_style='"', width=1_000_000, allow_unicode=False).removesuffix("\n")
    text = yaml.safe_dump(value, default_flow_style=True, width=1_000_000, allow_unicode=True)
    # A bare scalar ends with a line break, sometimes after a document end marker ('...').
    # Strip only those: str.strip() would also eat a value's own '\xa0' or '\x85'.
    text = text.removesuffix("\n").removesuffix("\n...")
    if any(brk in text for brk in "\n\r\x85\u2028\u2029"):  # all line breaks to YAML
        text = yaml.safe_dump(value, default_style='"', width=1_000_000, allow_unicode=True)
        text = text.removesuffix("\n")
    return text


# What a literal block (``|``) cannot hold: characters YAML does not print, and line breaks
# other than '\n' (YAML would read them as line breaks and change the text).
_NOT_IN_BLOCK = re.compile(
    "[^\t\n\x20-\x7e\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]|[\u2028\u2029\ufeff]|" + _BIDI.pattern
)


def _as_block(value: Any) -> bool:
    """True for text written best as a literal block: several lines that come back unchanged."""
    if not isinstance(value, str):
        return False
    body = value.removesuffix("\n")
    return (
        "\n" in body
        and not body.startswith((" ", "\t", "\n"))
        and not body.endswith("\n")
        and _NOT_IN_BLOCK.search(value) is None
    )


def to_yaml(data: Any, origins: Mapping[str, Origin] | None = None) -> str:
    """Block-style YAML of ``data`` (key order kept); ``origins`` adds ``# file:line`` comments."""
    lines: list[str] = []

    def note(pointer: str) -> str:
        if origins is None or pointer not in origins:
            return ""
        return f"  # {origins[pointer]}"

    def emit(value: Any, indent: int, pointer: str) -> None:
        pad = "  " * indent
        if isinstance(value, dict):
            for k, v in value.items():
                child = f"{pointer}/{escape_token(str(k))}"
                key = _scalar(str(k))
                if (isinstance(v, dict) and v) or (isinstance(v, list) and v):
                    lines.append(f"{pad}{key}:{note(child)}")
                    emit(v, indent + 1, child)
                elif _as_block(v):
                    lines.append(f"{pad}{key}: |{'' if v.endswith(chr(10)) else '-'}{note(child)}")
                    lines.extend(f"{pad}  {ln}" if ln else "" for ln in v.rstrip("\n").split("\n"))
                else:
                    lines.append(f"{pad}{key}: {_scalar(v)}{note(child)}")
        elif isinstance(value, list):
            for i, v in enumerate(value):
                child = f"{pointer}/{i}"
                if isinstance(v, dict) and v:
                    start = len(lines)
                    emit(v, indent + 1, child)
                    first = lines[start]
                    lines[start] = f"{pad}- {first[len(pad) + 2 :]}"
                elif isinstance(v, list) and v:
                    lines.append(f"{pad}-{note(child)}")
                    emit(v, indent + 1, child)
                elif _as_block(v):
                    lines.append(f"{pad}- |{'' if v.endswith(chr(10)) else '-'}{note(child)}")
                    lines.extend(f"{pad}  {ln}" if ln else "" for ln in v.rstrip("\n").split("\n"))
                else:
                    lines.append(f"{pad}- {_scalar(v)}{note(child)}")
        else:
            lines.append(f"{pad}{_scalar(value)}{note(pointer)}")

    emit(data, 0, "")
    return "\n".join(lines) + "\n"
