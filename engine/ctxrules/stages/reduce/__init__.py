"""Structure-aware reduction of large tool outputs (used by ``tool_output.filter``).

:func:`detect` tells JSON, XML, delimited tables and plain text apart; :func:`reduce_structured`
shortens a text to a token budget keeping its structure (JSON skeleton, XML tree shape, table
header and first/last rows, text head and tail); :func:`spill_summary` is the short stand-in
for an output that went to the vault whole. Every function here is pure: the caller computes
the vault id of the original (:func:`text_vault_id`), stores it, and the markers written here
point into it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal

from ctxrules.stages.reduce.csv_rows import detect_table, reduce_table
from ctxrules.stages.reduce.handover import Handover, extract_handover, render_handover
from ctxrules.stages.reduce.json_skeleton import JsonLimits, parse_json_document, reduce_json
from ctxrules.stages.reduce.text_lines import Count, line_count, reduce_lines, text_lines
from ctxrules.stages.reduce.xml_tree import XmlLimits, parse_xml_document, reduce_xml
from ctxrules.vault import format_marker

__all__ = [
    "Count",
    "Detected",
    "Format",
    "Handover",
    "JsonLimits",
    "Reduced",
    "detect",
    "extract_handover",
    "handover_text",
    "reduce_lines",
    "reduce_structured",
    "render_handover",
    "spill_summary",
    "text_lines",
    "text_vault_id",
]

Format = Literal["json", "xml", "csv", "text"]


@dataclass(frozen=True)
class Detected:
    """A text's format and its parsed form (JSON value, XML root, table shape, or None)."""

    format: Format
    parsed: Any = None


@dataclass(frozen=True)
class Reduced:
    """A reduced text; ``elided`` counts what was cut (lines, JSON values, XML elements)."""

    text: str
    format: Format
    elided: int
    detail: str


def text_vault_id(text: str) -> str:
    """The id :meth:`ctxrules.vault.Vault.put_text` gives ``text`` (sha256 of its UTF-8)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def detect(text: str) -> Detected:
    """JSON (one object or array), XML (one element, no DOCTYPE), a delimited table, or text."""
    head = text.lstrip()[:1]
    if head in ("{", "["):
        value = parse_json_document(text)
        if value is not None:
            return Detected("json", value)
    if head == "<":
        root = parse_xml_document(text)
        if root is not None:
            return Detected("xml", root)
    table = detect_table(text)
    if table is not None:
        return Detected("csv", table)
    return Detected("text")


def reduce_structured(
    text: str,
    *,
    vault_id: str,
    budget_tokens: int,
    count: Count,
    json_limits: JsonLimits,
    head_share: float,
    detected: Detected | None = None,
    tokens: int | None = None,
) -> Reduced | None:
    """``text`` reduced to about ``budget_tokens``, by its format; ``None`` when it fits."""
    found = detected or detect(text)
    if found.format == "json":
        js = reduce_json(
            found.parsed,
            text,
            vault_id=vault_id,
            budget_tokens=budget_tokens,
            count=count,
            limits=json_limits,
            marker_fields={"format": "json"},
        )
        if js is not None:
            limits = js.limits
            return Reduced(
                js.text,
                "json",
                js.elided,
                f"JSON skeleton (depth {limits.depth}, {limits.keys} keys, "
                f"{limits.items} items), {js.elided} values elided",
            )
    elif found.format == "xml":
        xr = reduce_xml(
            found.parsed,
            text,
            vault_id=vault_id,
            budget_tokens=budget_tokens,
            count=count,
            limits=XmlLimits(depth=json_limits.depth),
        )
        if xr is not None:
            return Reduced(xr.text, "xml", xr.elided, f"XML tree shape, {xr.elided} elements elided")
    elif found.format == "csv":
        table = found.parsed
        tr = reduce_table(
            text,
            table,
            vault_id=vault_id,
            budget_tokens=budget_tokens,
            count=count,
            head_share=head_share,
            tokens=tokens,
        )
        if tr is not None:
            return Reduced(
                tr.text,
                "csv",
                tr.lines_elided,
                f"table header and first/last rows, {tr.lines_elided} of {table.rows} rows elided",
            )
        return None
    lr = reduce_lines(
        text, vault_id=vault_id, budget_tokens=budget_tokens, count=count, head_share=head_share, tokens=tokens
    )
    if lr is None:
        return None
    return Reduced(
        lr.text,
        "text",
        lr.lines_elided,
        f"head and tail, {lr.lines_elided} of {lr.lines_total} lines elided"
        + (f", {lr.lines_clipped} long lines clipped" if lr.lines_clipped else ""),
    )


# A spilled document's preview starts from the item shape (depth 4) and tightens to the budget:
# a depth-2 view of an MCP answer shows only '"{…} 9 keys"' for every item.
_SPILL_JSON = JsonLimits(depth=4, keys=12, items=4, string_chars=80)


PARSE_CHARS = 8 * 1024 * 1024
"""A spilled JSON document longer than this is previewed by its head and tail, not parsed."""


def spill_summary(
    text: str, *, vault_id: str, count: Count, preview_tokens: int, what: str = "output"
) -> tuple[str, Format]:
    """The stand-in for a content spilled whole: a marker for all of it and a short preview."""
    # Parsing a 50 MB document for its skeleton would take several times its size in Python
    # objects: its head and tail characters are the preview.
    huge_json = len(text) > PARSE_CHARS and text[:4096].lstrip()[:1] in ("{", "[")
    found = Detected("json") if huge_json else detect(text)
    total_lines = line_count(text)
    header = format_marker("lines", total_lines, vault_id, reason="spill", chars=len(text), format=found.format)
    intro = (
        f"This {what} ({len(text):,} chars, {total_lines:,} lines, {found.format}) was "
        "moved to the vault whole; the marker above points to it. Preview:"
    )
    preview = ""
    if found.format == "json" and found.parsed is not None:
        js = reduce_json(
            found.parsed,
            text,
            vault_id=vault_id,
            budget_tokens=preview_tokens,
            count=count,
            limits=_SPILL_JSON,
            embed_marker=False,
        )
        preview = js.text if js is not None else ""
    elif found.format == "xml":
        xr = reduce_xml(
            found.parsed,
            text,
            vault_id=vault_id,
            budget_tokens=preview_tokens,
            count=count,
            limits=XmlLimits(depth=2, children=3, text_chars=60),
        )
        preview = xr.text if xr is not None else ""
    if not preview:
        lr = reduce_lines(
            text,
            vault_id=vault_id,
            budget_tokens=preview_tokens,
            count=count,
            head_share=0.6,
            keep_first=1 if found.format == "csv" else 0,
            tokens=_estimated_tokens(text, count),
        )
        preview = lr.text if lr is not None else text
    return f"{header}\n{intro}\n{preview}", found.format


_SAMPLE_CHARS = 256 * 1024


def _estimated_tokens(text: str, count: Count) -> int | None:
    """For a text spilled whole that is too long to tokenize for a preview's sake, its tokens
    extrapolated from its head and tail (the preview's own tokens are counted exactly; the
    estimate only sets where its layout starts); ``None``: count it."""
    if len(text) <= 4 * _SAMPLE_CHARS:
        return None
    sample = count(text[:_SAMPLE_CHARS]) + count(text[-_SAMPLE_CHARS:])
    return max(1, round(sample * len(text) / (2 * _SAMPLE_CHARS)))


def handover_text(
    text: str, *, vault_id: str, keep_tokens: int, count: Count, max_items: int = 8, tokens: int | None = None
) -> tuple[str, Handover]:
    """A sub-agent result as a structured handover plus its head and tail (``tokens``: the
    result's size when the caller knows it)."""
    handover = extract_handover(text, max_items=max_items)
    lr = reduce_lines(text, vault_id=vault_id, budget_tokens=keep_tokens, count=count, head_share=0.6, tokens=tokens)
    body = lr.text if lr is not None else text
    header = format_marker("lines", len(text_lines(text)), vault_id, reason="subagent", chars=len(text))
    return (
        f"{header}\nSub-agent result ({len(text):,} chars) shortened by ctxrules; full text "
        f"behind the marker above. Structured handover (extracted, not summarized):\n"
        f"{render_handover(handover)}\n--- head and tail of the result ---\n{body}"
    ), handover
