"""Where the built-in packs and schemas live: inside the wheel, or in the source checkout."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from ctxrules.errors import CtxrulesError

_PACKAGE_DIR = Path(__file__).resolve().parent


@cache
def data_dir(name: str) -> Path:
    """``rules`` or ``schemas``: the wheel's copy (``ctxrules/_data/``) or the checkout's."""
    bundled = _PACKAGE_DIR / "_data" / name
    if bundled.is_dir():
        return bundled
    checkout = _PACKAGE_DIR.parent.parent / name
    if checkout.is_dir():
        return checkout
    raise CtxrulesError(f"ctxrules is installed without its '{name}' folder (looked in {bundled})")


def rules_dir() -> Path:
    return data_dir("rules")


def schema_path(name: str) -> Path:
    return data_dir("schemas") / name
