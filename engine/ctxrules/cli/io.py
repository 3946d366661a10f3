"""Reading and writing the message files the CLI takes (``-`` is stdin/stdout)."""

from __future__ import annotations

import json
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
