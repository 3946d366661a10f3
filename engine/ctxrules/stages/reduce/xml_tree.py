"""The shape of an XML document: its element tree within depth / children / text limits.

Documents with a DOCTYPE (entity declarations) are never parsed: they are treated as text, so
no entity expansion can blow up. What is cut is said in XML comments where it was cut, and the
result is well-formed XML headed by a comment that carries the marker.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ctxrules.stages.reduce.text_lines import Count
from ctxrules.vault import format_marker

__all__ = ["XmlLimits", "XmlReduction", "parse_xml_document", "reduce_xml"]


@dataclass(frozen=True)
class XmlLimits:
    depth: int = 4
    children: int = 6
    text_chars: int = 120

    def tighter(self) -> XmlLimits:
        return XmlLimits(
            depth=max(1, self.depth - 1) if self.children <= 3 else self.depth,
            children=max(1, self.children * 2 // 3),
            text_chars=max(24, self.text_chars // 2),
        )


@dataclass(frozen=True)
class XmlReduction:
    text: str
    elided: int


def parse_xml_document(text: str) -> ET.Element | None:
    """The root element when ``text`` is one well-formed XML document without a DOCTYPE."""
    stripped = text.strip()
    if not stripped.startswith("<") or not stripped.endswith(">"):
        return None
    if "<!DOCTYPE" in stripped[:4096].upper() or "<!ENTITY" in stripped.upper():
        return None
    try:
        return ET.fromstring(stripped)
    except (ET.ParseError, ValueError, RecursionError):
        return None


def _clip(text: str | None, limit: int, counter: list[int]) -> str | None:
    if text is None:
        return None
    text = text.strip()
    if len(text) > limit:
        counter[0] += 1
        return f"{text[:limit]}… (+{len(text) - limit} chars)"
    return text or None


def _comment(text: str) -> ET.Element[Any]:
    # "--" may not appear inside an XML comment.
    return ET.Comment(" " + text.replace("--", "- -") + " ")


def _prune(elem: ET.Element, level: int, limits: XmlLimits, counter: list[int]) -> ET.Element:
    attrib = {k: _clip(v, limits.text_chars, counter) or "" for k, v in elem.attrib.items()}
    out = ET.Element(elem.tag, attrib)
    out.text = _clip(elem.text, limits.text_chars, counter)
    children = [c for c in elem if isinstance(c.tag, str)]
    if not children:
        return out
    if level >= limits.depth:
        counter[0] += 1
        out.append(_comment(f"{len(children)} child elements elided: {_tags(children)}"))
        return out
    limit = limits.children
    head, tail = children, []
    if len(children) > limit:
        n_head = max(1, limit - limit // 3)
        head = children[:n_head]
        tail = children[len(children) - (limit - n_head) :] if limit > n_head else []
    for child in head:
        kept = _prune(child, level + 1, limits, counter)
        kept.tail = None
        out.append(kept)
    more = len(children) - len(head) - len(tail)
    if more > 0:
        counter[0] += more
        elided = children[len(head) : len(children) - len(tail)]
        out.append(_comment(f"{more} more elements: {_tags(elided)}"))
    for child in tail:
        kept = _prune(child, level + 1, limits, counter)
        kept.tail = None
        out.append(kept)
    return out


def _tags(elements: list[ET.Element]) -> str:
    counts = Counter(str(e.tag) for e in elements)
    return ", ".join(f"<{tag}> x{n}" for tag, n in counts.most_common(6))


def reduce_xml(
    root: ET.Element, original: str, *, vault_id: str, budget_tokens: int, count: Count, limits: XmlLimits | None = None
) -> XmlReduction | None:
    """The pruned tree of ``root`` within ``budget_tokens`` (limits tighten until it fits)."""
    current = limits or XmlLimits()
    original_tokens = count(original)
    best: XmlReduction | None = None
    for _ in range(10):
        counter = [0]
        pruned = _prune(root, 1, current, counter)
        ET.indent(pruned, space=" ")
        body = ET.tostring(pruned, encoding="unicode")
        if counter[0] == 0 and original_tokens <= budget_tokens:
            return None
        removed = max(0, original_tokens - count(body))
        marker = format_marker("tokens", removed, vault_id, format="xml", elements=counter[0])
        text = f"<!-- {marker} -->\n{body}"
        best = XmlReduction(text, counter[0])
        if count(text) <= budget_tokens:
            return best
        stricter = current.tighter()
        if stricter == current:
            break
        current = stricter
    return best
