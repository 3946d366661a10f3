"""Recognizing an append-only history, so the next turn reuses the last compaction.

The caller passes the full history on every call. When the new history starts with the one the
session saw last, the pipeline runs on *the previous output* plus the appended messages: the
compaction is not redone, and the prefix the provider caches stays byte-identical. Invariant 4
(the pipeline changes nothing on its own output) makes this equal to a fresh run's decisions.

Within one process the session compares the new history with its own copy of the last one;
across processes (``ctxrules run`` twice on one session) it compares per-message digests
stored in ``state.json``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any


def message_digest(message: Mapping[str, Any]) -> str:
    """A stable digest of a message across processes (canonical JSON, sha256)."""
    data = json.dumps(message, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(data.encode("utf-8", errors="surrogatepass")).hexdigest()
