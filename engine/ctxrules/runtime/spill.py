"""The spill API: put any large output (MCP results, hook output over 2,500 tokens,
background-process logs) in the vault and get back a marker and a preview within a budget.

The preview keeps whole lines from the head and the tail (two thirds head, one third tail) and
puts the elision marker between them, with the elided line range, so the agent can read any
part back (`ctxrules vault get ID --lines A:B`). Text within the budget is returned as it is
(and still stored, so the id is always valid).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ctxrules.vault import format_marker, split_lines

if TYPE_CHECKING:
    from ctxrules.tokens import TokenCounter
    from ctxrules.vault import Vault

DEFAULT_PREVIEW_TOKENS = 2_500


@dataclass(frozen=True)
class Spilled:
    vault_id: str
    marker: str
    preview: str
    lines_total: int
    lines_elided: int
    tokens_before: int
    tokens_after: int

    @property
    def text(self) -> str:
        """What to put in the context instead of the output."""
        return self.preview


def spill(vault: Vault, text: str, *, kind: str, counter: TokenCounter,
          preview_tokens: int = DEFAULT_PREVIEW_TOKENS) -> Spilled:
    if preview_tokens < 1:
        raise ValueError("preview_tokens must be positive")
    vault_id = vault.put_text(text)
    lines = [ln.decode("utf-8", errors="surrogatepass") for ln in split_lines(text.encode("utf-8", "surrogatepass"))]
    before = counter.count_text(text)
    if before <= preview_tokens:
        marker = format_marker("lines", 0, vault_id, source=kind)
        return Spilled(vault_id, marker, text, len(lines), 0, before, before)
    # The marker is part of the preview: its cost (at the widest line numbers) comes off first.
    widest = format_marker("lines", len(lines), vault_id, lines=(len(lines), len(lines)), source=kind)
    room = max(0, preview_tokens - counter.count_text(widest + "\n"))
    head_budget = room * 2 // 3
    tail_budget = room - head_budget
    head: list[str] = []
    used = 0
    for ln in lines:
        cost = counter.count_text(ln)
        if used + cost > head_budget:
            break
        head.append(ln)
        used += cost
    tail: list[str] = []
    used = 0
    for ln in reversed(lines[len(head):]):
        cost = counter.count_text(ln)
        if used + cost > tail_budget:
            break
        tail.insert(0, ln)
        used += cost
    first, last = len(head) + 1, len(lines) - len(tail)
    elided = max(0, last - first + 1)
    marker = format_marker("lines", elided, vault_id, lines=(first, last) if elided else None, source=kind)
    head_text = "".join(head)
    if head_text and not head_text.endswith("\n"):
        head_text += "\n"
    preview = f"{head_text}{marker}\n{''.join(tail)}"
    return Spilled(vault_id, marker, preview, len(lines), elided, before, counter.count_text(preview))
