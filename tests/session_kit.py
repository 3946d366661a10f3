"""Sessions that compare with one another, for tests: a state root whose one injection key
every session under it signs with, so that signed tags (synthesized results, notices) compare
equal between a warm session and its reference."""

from __future__ import annotations

import hashlib
from pathlib import Path


def keyed_state_root(tmp_path: Path, seed: str) -> Path:
    """``tmp_path/state`` (0700) holding an ``injection.key`` derived from ``seed``."""
    root = tmp_path / "state"
    root.mkdir(mode=0o700)
    key = root / "injection.key"
    key.write_text(hashlib.sha256(seed.encode()).hexdigest() + "\n", encoding="ascii")
    key.chmod(0o600)
    return root
