"""Reading and writing the message files the CLI takes (``-`` is stdin/stdout)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from ctxrules.errors import UsageError
from ctxrules.json_files import read_json as read_json  # the verbs read their inputs through it


def write_text(path: str, text: str) -> None:
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{path}: cannot write: {exc.strerror}") from None


def distinct_outputs(**outputs: str | None) -> None:
    """Refuse (usage error) two options that would write to one place: both ``-`` (stdout
    would hold two documents, neither readable) or one file (the second would overwrite the
    first). ``outputs``: option name (``report`` for ``--report``) to the path given, or None."""
    seen: dict[str, str] = {}
    for option, path in outputs.items():
        if path is None:
            continue
        key = "-" if path == "-" else os.path.realpath(path)  # (Path.resolve raises on a link loop)
        if key in seen:
            where = "stdout" if key == "-" else f"the same file ({path})"
            raise UsageError(f"--{seen[key]} and --{option} both write to {where}; give each its own file")
        seen[key] = option


def dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=2) + "\n"


def add_search_path(parser: Any) -> None:
    """``--search-path DIR`` (repeatable) on a verb that loads packs."""
    parser.add_argument(
        "--search-path",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder, besides the pack's own, that packs may read from (extends:, template "
        "file:, test inputs); repeatable",
    )
