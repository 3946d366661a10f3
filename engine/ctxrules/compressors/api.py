"""Compress the output of a shell command with the compressor rules of a pack.

:func:`compress_tool_output` is what the ``tool_output.filter`` stage and ``ctxrules compress``
call: it finds the pack's rule for the command, runs its steps, enforces the engine's
truthfulness rules and stores the full output in the vault.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ctxrules.vault import Vault

__all__ = ["CompressResult", "compress_tool_output"]


@dataclass(frozen=True)
class CompressResult:
    """A compressed output: ``text`` replaces the original, whose bytes are at ``vault_id``."""

    text: str
    rule_id: str
    vault_id: str
    lines_before: int
    lines_after: int


def compress_tool_output(pack: dict[str, Any], command: str, output: str,
                         exit_code: int | None, vault: Vault) -> CompressResult | None:
    """The compressed ``output`` of ``command``, or None when no rule matches or saves anything."""
    return None
