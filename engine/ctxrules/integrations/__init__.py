"""Thin layers that put ``Session.prepare`` where agents already run (docs/integrations.md).

Each module imports its framework lazily and, when that is missing, raises an ImportError that
names the extra to install. They map the framework's notion of a session to a ctxrules
session and own no behaviour: the pack decides what happens to the context.
"""

from __future__ import annotations

import hashlib
import re

__all__ = ["session_name"]

_PLAIN_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")


def session_name(raw: str) -> str:
    """A session directory name for an id taken from a request: the id itself when it matches
    ``[A-Za-z0-9._-]{1,128}`` (and is not made of dots only), else its sha256 hex."""
    if _PLAIN_ID.fullmatch(raw) and raw.strip("."):
        return raw
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()
