"""Sessions for tests: a state root whose one injection key every session under it signs with,
so that signed tags (synthesized results, notices) compare equal between a warm session and its
reference; and an archive of a session holding every kind of record, made with the real CLI."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def keyed_state_root(tmp_path: Path, seed: str) -> Path:
    """``tmp_path/state`` (0700) holding an ``injection.key`` derived from ``seed``."""
    root = tmp_path / "state"
    root.mkdir(mode=0o700)
    key = root / "injection.key"
    key.write_text(hashlib.sha256(seed.encode()).hexdigest() + "\n", encoding="ascii")
    key.chmod(0o600)
    return root


def export_session(
    ctxrules: Callable[..., subprocess.CompletedProcess[Any]],
    cwd: Path,
    env: dict[str, str],
    *,
    prompt_tokens: int | None = None,
) -> Path:
    """Session ``A/s`` of state root ``A`` (under ``cwd``, after a run made it) with a recorded
    call of ``prompt_tokens`` (when given) and a note added, exported by the real CLI to
    ``cwd/s.ctxs``: an archive with a turn, documents, the key and (with a call) a ledger."""
    if prompt_tokens is not None:
        added = ctxrules("usage", "add", "--model", "gpt-4o", "--prompt", str(prompt_tokens), "--session", "A/s",
                         "--state", "A", cwd=cwd)  # fmt: skip
        assert added.returncode == 0, added.stderr
    note = "import sys\nfrom ctxrules.notes import SessionNotes\nSessionNotes(sys.argv[1]).add('n', tags=['x'])"
    subprocess.run([sys.executable, "-c", note, "A/s"], cwd=cwd, env=env, check=True)
    exported = ctxrules("sessions", "export", "A/s", "--state", "A", "--to", "s.ctxs", cwd=cwd)
    assert exported.returncode == 0, exported.stderr
    return cwd / "s.ctxs"
