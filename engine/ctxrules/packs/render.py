"""The resolved pack as YAML, optionally with each value's origin as a trailing comment."""

from __future__ import annotations

from typing import Any

import yaml

from ctxrules.packs.source import Origin, escape_token


def _scalar(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000, allow_unicode=True)
    text = text.strip()
    if text.endswith("\n..."):
        text = text[:-4].strip()
    return text.removesuffix("...").strip()


def to_yaml(data: Any, origins: dict[str, Origin] | None = None) -> str:
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
                if isinstance(v, dict) and v:
                    lines.append(f"{pad}{key}:{note(child)}")
                    emit(v, indent + 1, child)
                elif isinstance(v, list) and v:
                    lines.append(f"{pad}{key}:{note(child)}")
                    emit(v, indent + 1, child)
                elif isinstance(v, str) and "\n" in v:
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
                    lines[start] = f"{pad}- {first[len(pad) + 2:]}"
                elif isinstance(v, list) and v:
                    lines.append(f"{pad}-{note(child)}")
                    emit(v, indent + 1, child)
                elif isinstance(v, str) and "\n" in v:
                    lines.append(f"{pad}- |{'' if v.endswith(chr(10)) else '-'}{note(child)}")
                    lines.extend(f"{pad}  {ln}" if ln else "" for ln in v.rstrip("\n").split("\n"))
                else:
                    lines.append(f"{pad}- {_scalar(v)}{note(child)}")
        else:
            lines.append(f"{pad}{_scalar(value)}{note(pointer)}")

    emit(data, 0, "")
    return "\n".join(lines) + "\n"
