"""The spill API: put any large output (MCP results, hook output over 2,500 tokens,
background-process logs) in the vault and get back a marker and a preview within a budget.

The preview follows the output's structure:

- one JSON object or array (MCP tools answer with minified single-line JSON) becomes its
  skeleton (``ctxrules.stages.reduce.json_skeleton``: keys, the first and last items, short
  strings), the richest that fits the budget, after a ``kind=json`` marker line;
- text keeps whole lines from the head and the tail (two thirds head, one third tail) and puts
  the elision marker between them, with the elided line range, so the agent can read any part
  back (`ctxrules vault get ID --lines A:B`); when no whole line fits (one huge line), the
  lines are clipped to head + tail characters with a marker for each clipped line.

Text within the budget is returned as it is (and still stored, so the id is always valid).
``bytes`` are stored byte-identical and previewed as UTF-8 with replacement characters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ctxrules.stages.reduce.json_skeleton import JsonLimits, parse_json_document, reduce_json
from ctxrules.vault import format_marker, parse_markers, split_lines

if TYPE_CHECKING:
    from ctxrules.tokens import TokenCounter
    from ctxrules.vault import Vault

DEFAULT_PREVIEW_TOKENS = 2_500
PREVIEW_JSON_LIMITS = JsonLimits(depth=6, keys=24, items=24, string_chars=200)
"""Where a JSON preview starts; the limits tighten until the skeleton fits the budget, so the
preview is the richest skeleton of that sequence within it."""


@dataclass(frozen=True)
class Spilled:
    vault_id: str
    marker: str
    preview: str
    lines_total: int
    lines_elided: int
    tokens_before: int
    tokens_after: int
    format: str = "text"
    """``json`` when the preview is the document's skeleton, else ``text``."""

    @property
    def text(self) -> str:
        """What to put in the context instead of the output."""
        return self.preview


def spill(
    vault: Vault, text: str | bytes, *, kind: str, counter: TokenCounter, preview_tokens: int = DEFAULT_PREVIEW_TOKENS
) -> Spilled:
    if isinstance(preview_tokens, bool) or not isinstance(preview_tokens, int) or preview_tokens < 1:
        raise ValueError(f"preview_tokens must be a positive whole number, got {preview_tokens!r}")
    if isinstance(text, bytes | bytearray | memoryview):
        raw = bytes(text)
        vault_id = vault.put_bytes(raw)
        text = raw.decode("utf-8", errors="replace")  # line numbers stay: b"\n" is kept
    elif isinstance(text, str):
        vault_id = vault.put_text(text)
    else:
        raise TypeError(f"spill() takes the output as str or bytes, got {type(text).__name__}")
    lines = [ln.decode("utf-8", errors="surrogatepass") for ln in split_lines(text.encode("utf-8", "surrogatepass"))]
    before = counter.count_text(text)
    if before <= preview_tokens:
        marker = format_marker("lines", 0, vault_id, source=kind)
        return Spilled(vault_id, marker, text, len(lines), 0, before, before)
    structured = _json_preview(
        text, vault_id, kind=kind, counter=counter, budget=preview_tokens, lines_total=len(lines), before=before
    )
    if structured is not None:
        return structured
    whole = _whole_lines(text, lines, vault_id, kind=kind, counter=counter, budget=preview_tokens, before=before)
    if whole is not None:
        return whole
    return _clipped_lines(
        text, vault_id, kind=kind, counter=counter, budget=preview_tokens, lines_total=len(lines), before=before
    )


def _json_preview(
    text: str, vault_id: str, *, kind: str, counter: TokenCounter, budget: int, lines_total: int, before: int
) -> Spilled | None:
    """The skeleton of a JSON document within ``budget`` (``None``: not JSON, or even the
    top level alone does not fit)."""
    if text.lstrip()[:1] not in ("{", "["):
        return None
    value = parse_json_document(text)
    if value is None:
        return None
    # The marker's count is known only after the skeleton; reserve the widest one.
    widest = format_marker("json", before, vault_id, source=kind, chars=len(text))
    room = budget - counter.count_text(widest + "\n")
    if room < 1:
        return None
    js = reduce_json(
        value,
        text,
        vault_id=vault_id,
        budget_tokens=room,
        count=counter.count_text,
        limits=PREVIEW_JSON_LIMITS,
        embed_marker=False,
    )
    if js is None or counter.count_text(js.text) > room:
        return None
    marker = format_marker("json", js.elided, vault_id, source=kind, chars=len(text))
    preview = f"{marker}\n{js.text}"
    return Spilled(
        vault_id, marker, preview, lines_total, lines_total, before, counter.count_text(preview), format="json"
    )


def _whole_lines(
    text: str, lines: list[str], vault_id: str, *, kind: str, counter: TokenCounter, budget: int, before: int
) -> Spilled | None:
    """Whole lines from the head (2/3) and the tail (1/3); ``None`` when not one line fits."""
    # The marker is part of the preview: its cost (at the widest line numbers) comes off first.
    widest = format_marker("lines", len(lines), vault_id, lines=(len(lines), len(lines)), source=kind)
    room = max(0, budget - counter.count_text(widest + "\n"))
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
    for ln in reversed(lines[len(head) :]):
        cost = counter.count_text(ln)
        if used + cost > tail_budget:
            break
        tail.insert(0, ln)
        used += cost
    if not head and not tail:
        return None
    first, last = len(head) + 1, len(lines) - len(tail)
    elided = max(0, last - first + 1)
    marker = format_marker("lines", elided, vault_id, lines=(first, last) if elided else None, source=kind)
    head_text = "".join(head)
    if head_text and not head_text.endswith("\n"):
        head_text += "\n"
    preview = f"{head_text}{marker}\n{''.join(tail)}"
    return Spilled(vault_id, marker, preview, len(lines), elided, before, counter.count_text(preview))


def _clipped_lines(
    text: str, vault_id: str, *, kind: str, counter: TokenCounter, budget: int, lines_total: int, before: int
) -> Spilled:
    """Lines too long to keep whole: head + tail characters of each kept line, a marker for
    each clipped line and one for the lines in between (``reduce_lines``)."""
    from ctxrules.stages.reduce.text_lines import reduce_lines

    reduced = reduce_lines(
        text,
        vault_id=vault_id,
        budget_tokens=budget,
        count=counter.count_text,
        head_share=2 / 3,
        marker_fields={"source": kind},
        tokens=before,
    )
    if reduced is None:  # pragma: no cover - the caller saw the text over the budget
        marker = format_marker("lines", 0, vault_id, source=kind)
        return Spilled(vault_id, marker, text, lines_total, 0, before, before)
    first = next(iter(parse_markers(reduced.text)), None)
    marker = (
        reduced.text[first.span[0] : first.span[1]]
        if first is not None
        else format_marker("lines", lines_total, vault_id, source=kind)
    )
    return Spilled(
        vault_id,
        marker,
        reduced.text,
        lines_total,
        reduced.lines_elided + reduced.lines_clipped,
        before,
        counter.count_text(reduced.text),
    )
