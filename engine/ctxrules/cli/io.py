"""Reading and writing the message files the CLI takes (``-`` is stdin/stdout)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from ctxrules.errors import UsageError


def read_json(path: str) -> Any:
    """Parse a JSON file (or stdin for ``-``); errors name the file, line and column."""
    name = "<stdin>" if path == "-" else path
    try:
        raw = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except FileNotFoundError:
        raise UsageError(f"{name}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{name}: is a directory, expected a JSON file") from None
    except OSError as exc:
        raise UsageError(f"{name}: cannot read: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{name}: not UTF-8 (byte {exc.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{name}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None


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
        "--search-path", action="append", default=[], metavar="DIR",
        help="a folder, besides the pack's own, that packs may read from (extends:, template "
             "file:, test inputs); repeatable",
    )
