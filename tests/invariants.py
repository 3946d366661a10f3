"""Independent checkers of the invariants of docs/reference/concepts.md, used by property and corpus tests.

They deliberately do not reuse ctxrules' own pairing or pinning code: a bug there must not be
able to hide itself.
"""

from __future__ import annotations

import json
import re
from typing import Any

MARKER = re.compile(r"\[ctxrules:elided [^\]]*?ref=vault://([0-9a-f]{12,64})(?:#L(\d+)-L(\d+))?[^\]]*\]")


def pairing_problems(messages: list[dict[str, Any]]) -> list[str]:
    """Invariant 1: each call answered exactly once in the block right after; no orphans."""
    problems = []
    i = 0
    while i < len(messages):
        m = messages[i]
        if m.get("role") == "tool":
            problems.append(f"message {i}: tool result outside a call block")
            i += 1
            continue
        if m.get("role") == "assistant" and m.get("tool_calls"):
            ids = [c.get("id") for c in m["tool_calls"]]
            if any(not isinstance(x, str) or not x for x in ids):
                problems.append(f"message {i}: call without id")
            j = i + 1
            answered: list[str] = []
            while j < len(messages) and messages[j].get("role") == "tool":
                answered.append(messages[j].get("tool_call_id"))
                j += 1
            if sorted(map(str, answered)) != sorted(map(str, ids)):
                problems.append(f"message {i}: calls {ids} answered by {answered}")
            i = j
            continue
        if m.get("role") == "assistant" and "tool_calls" in m and not m["tool_calls"]:
            problems.append(f"message {i}: empty tool_calls list")
        i += 1
    return problems


def text_of(m: dict[str, Any]) -> str:
    c = m.get("content")
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        return "".join(p.get("text", "") for p in c if isinstance(p, dict))
    return ""


_SIGNED_TAG = re.compile(r'\s*<ctxrules:[a-z][a-z0-9_.-]*[^>\n]* sig="[0-9a-f]{16}"/?>')


def real_user_indices(messages: list[dict[str, Any]]) -> list[int]:
    """User messages that do not open with a signed ``<ctxrules:KIND ... sig="...">`` tag (the
    signature itself is not checked here: generated inputs do not forge one)."""
    return [i for i, m in enumerate(messages) if m.get("role") == "user" and not _SIGNED_TAG.match(text_of(m))]


# Fields of the OpenAI chat message schema a repair may set on a message it builds.
_SCHEMA_FIELDS = frozenset({"role", "content", "tool_calls", "tool_call_id", "name"})


def added_fields(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[str]:
    """Invariant 8: no output message carries a field that no input message had (beyond the
    schema's own), in the message or in its tool calls."""
    known = set(_SCHEMA_FIELDS).union(*(m.keys() for m in before))
    known_call = {"id", "type", "function"}.union(
        *(c.keys() for m in before for c in m.get("tool_calls") or [] if isinstance(c, dict))
    )
    problems = []
    for i, m in enumerate(after):
        extra = sorted(set(m) - known)
        extra_calls = sorted({k for c in m.get("tool_calls") or [] if isinstance(c, dict) for k in c} - known_call)
        if extra or extra_calls:
            problems.append(f"message {i}: added fields {extra + extra_calls}")
    return problems


def id_problems(messages: list[dict[str, Any]]) -> list[str]:
    """Invariant 7: tool-call ids unique across the whole output; arguments valid JSON."""
    problems = []
    seen: dict[str, int] = {}
    for i, m in enumerate(messages):
        for call in m.get("tool_calls") or []:
            cid = call.get("id")
            if cid in seen:
                problems.append(f"message {i}: call id {cid!r} already used in message {seen[cid]}")
            seen[cid] = i
            args = (call.get("function") or {}).get("arguments")
            if isinstance(args, str):
                try:
                    json.loads(args)
                except ValueError:
                    problems.append(f"message {i}: call {cid!r}: arguments are not valid JSON")
    return problems


def pinned_of(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Invariant 2's pinned messages, by their own simple reading of docs/reference/concepts.md."""
    out = []
    i = 0
    while i < len(messages) and messages[i].get("role") in ("system", "developer"):
        out.append(messages[i])
        i += 1
    users = real_user_indices(messages)
    if users:
        out.append(messages[users[0]])
        out.append(messages[users[-1]])
    last_assistant = max((k for k, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
    if last_assistant is not None:
        out.append(messages[last_assistant])
        ids = {c.get("id") for c in messages[last_assistant].get("tool_calls") or []}
        out.extend(
            m for m in messages[last_assistant + 1 :] if m.get("role") == "tool" and m.get("tool_call_id") in ids
        )
    return out


def without_cache_markers(m: dict[str, Any]) -> dict[str, Any]:
    """``m`` as it was before ``cache.markers``: that finalize stage may add ``cache_control``
    (and turn a string content into one text part to carry it) but never changes text."""
    out = {k: v for k, v in m.items() if k != "cache_control"}
    content = out.get("content")
    if isinstance(content, list):
        parts = [{k: v for k, v in p.items() if k != "cache_control"} if isinstance(p, dict) else p for p in content]
        out["content"] = parts
        if len(parts) == 1 and isinstance(parts[0], dict) and set(parts[0]) == {"type", "text"}:
            out["content"] = parts[0]["text"]
    return out


def survives(m: dict[str, Any], out: list[dict[str, Any]]) -> bool:
    """Invariant 2 for one pinned message: it is in ``out``, cache markers aside."""
    want = without_cache_markers(m)
    return any(without_cache_markers(o) == want for o in out)


def vault_texts(vault: Any) -> list[str]:
    out = []
    for vid in vault.list_ids():
        try:
            out.append(vault.get(vid).decode("utf-8", errors="surrogatepass"))
        except Exception:  # media
            continue
    return out


def lost_contents(before: list[dict[str, Any]], after: list[dict[str, Any]], vault: Any) -> list[str]:
    """Invariant 3: every content that left the context is in the vault (as text or inside the
    JSON of a removed span)."""
    present = {text_of(m) for m in after}
    # A message may keep its text while a part of it (an image, a reasoning field) becomes a
    # marker next to that text: its text is then inside the new text, not equal to it.
    blob = "\x00".join(present)
    stored = vault_texts(vault)
    lost = []
    for m in before:
        t = text_of(m)
        if not t or t in present or t in blob:
            continue
        encoded = json.dumps(t, ensure_ascii=False)[1:-1]
        encoded_ascii = json.dumps(t)[1:-1]
        if not any(t in s or encoded in s or encoded_ascii in s for s in stored):
            lost.append(t[:80])
    return lost


def markers_resolve(messages: list[dict[str, Any]], vault: Any) -> list[str]:
    problems = []
    for m in messages:
        for match in MARKER.finditer(text_of(m)):
            vid, a, b = match.group(1), match.group(2), match.group(3)
            try:
                data = vault.get_lines(vid, int(a), int(b)) if a else vault.get(vid)
            except Exception as exc:
                problems.append(f"{match.group(0)}: {exc}")
                continue
            if not data and not a:
                problems.append(f"{match.group(0)}: empty")
    return problems
