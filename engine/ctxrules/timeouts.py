"""Stream-timeout analysis: each tool's effective limit, and the overrides that cannot work.

A pack's ``timeouts:`` describes the agent runtime's stream timers (the seed's
"stream timeouts and tool heartbeat"):

- ``chunk_ms``: the longest silence between two chunks of the stream. It is **global**: a tool
  that runs silently is aborted when it passes, whatever its own limit, unless the tool
  *heartbeats* (yields a preliminary result more often, see :mod:`ctxrules.heartbeat`) and is
  listed in ``heartbeat.tools``;
- ``step_ms``: the work budget of one step (model call plus its tools), from the step's start;
  the runtime arms the step timer at ``step_ms + compaction_allowance_ms``, because compaction
  runs inside the step, before the model call, and must not eat the tools' budget;
- ``tool_ms``: the default limit of one tool call; ``tools``: per-tool limits (name or glob),
  which raise or lower **only** the tool limit;
- ``total_ms``: the ceiling of a whole run.

A tool's **effective limit** is the minimum of every limit that applies to it. An override
above that minimum cannot take effect: ``ctxrules validate`` warns (CR091) with the numbers,
as it does when the compaction ceiling (``summarizer.total_s``) is not allowed for in the step
(CR092) and when a heartbeat is too slow for the chunk limit (CR093).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ctxrules.printable import printable

__all__ = [
    "DEFAULT_SUMMARIZER_TOTAL_S",
    "EffectiveLimit",
    "TimeoutFinding",
    "TimeoutPolicy",
    "format_ms",
    "lint_timeouts",
    "timeouts_table",
]

DEFAULT_SUMMARIZER_TOTAL_S: Final = 600.0
"""The summarizer's ceiling when the pack does not set ``summarizer.total_s``."""

DEFAULT_ROW: Final = "(default)"


def format_ms(ms: float | None) -> str:
    """``120000`` -> ``120 s``; ``None`` -> ``-`` (no limit)."""
    if ms is None:
        return "-"
    seconds = ms / 1000
    return f"{seconds:g} s"


@dataclass(frozen=True)
class EffectiveLimit:
    """One tool's limit: what the pack configured for it and what actually ends it."""

    tool: str
    configured_ms: int | None
    configured_by: str
    effective_ms: int | None
    bound_by: str | None
    applies: Mapping[str, int]
    heartbeat: bool

    @property
    def ineffective(self) -> bool:
        """The configured tool limit is above what another limit allows: it cannot take effect."""
        return (
            self.configured_ms is not None and self.effective_ms is not None and self.configured_ms > self.effective_ms
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "tool": self.tool,
            "configured_ms": self.configured_ms,
            "configured_by": self.configured_by,
            "effective_ms": self.effective_ms,
            "bound_by": self.bound_by,
            "applies": dict(self.applies),
            "heartbeat": self.heartbeat,
            "ineffective": self.ineffective,
        }


@dataclass(frozen=True)
class TimeoutFinding:
    """A lint result: diagnostic code, JSON pointer into the pack, message and hint."""

    code: str
    pointer: str
    message: str
    hint: str


@dataclass(frozen=True)
class TimeoutPolicy:
    """The resolved ``timeouts:`` node (all limits in milliseconds; ``None`` = not set)."""

    chunk_ms: int | None = None
    step_ms: int | None = None
    tool_ms: int | None = None
    total_ms: int | None = None
    tools: Mapping[str, int] = field(default_factory=dict)
    heartbeat_tools: tuple[str, ...] = ()
    heartbeat_interval_ms: int | None = None
    compaction_allowance_ms: int = 0

    @classmethod
    def from_pack(cls, data: Mapping[str, Any] | None) -> TimeoutPolicy | None:
        """The policy of a resolved pack, or ``None`` when it declares no ``timeouts:``."""
        node = (data or {}).get("timeouts")
        if not isinstance(node, Mapping):
            return None
        hb_node, tools_node = node.get("heartbeat"), node.get("tools")
        hb: Mapping[str, Any] = hb_node if isinstance(hb_node, Mapping) else {}
        tools: Mapping[str, Any] = tools_node if isinstance(tools_node, Mapping) else {}
        return cls(
            chunk_ms=_ms(node.get("chunk_ms")),
            step_ms=_ms(node.get("step_ms")),
            tool_ms=_ms(node.get("tool_ms")),
            total_ms=_ms(node.get("total_ms")),
            tools={str(k): ms for k, v in tools.items() if (ms := _ms(v)) is not None},
            heartbeat_tools=tuple(str(t) for t in hb.get("tools") or () if isinstance(t, str)),
            heartbeat_interval_ms=_ms(hb.get("interval_ms")),
            compaction_allowance_ms=_ms(node.get("compaction_allowance_ms")) or 0,
        )

    @property
    def step_timer_ms(self) -> int | None:
        """What the runtime arms for a step: the work budget plus the compaction allowance."""
        return None if self.step_ms is None else self.step_ms + self.compaction_allowance_ms

    def override_for(self, tool: str) -> tuple[str, int] | None:
        """The first ``tools`` entry (name or glob, case-sensitive) matching ``tool``."""
        if tool in self.tools:
            return tool, self.tools[tool]
        for pattern, ms in self.tools.items():
            if fnmatch.fnmatchcase(tool, pattern):
                return pattern, ms
        return None

    def heartbeats(self, tool: str) -> bool:
        return any(fnmatch.fnmatchcase(tool, p) for p in self.heartbeat_tools)

    def effective(self, tool: str | None = None) -> EffectiveLimit:
        """The limit that ends a call of ``tool`` (``None``: a tool without an override)."""
        hit = self.override_for(tool) if tool is not None else None
        configured: int | None
        if hit is not None:
            configured, by = hit[1], f"tools.{hit[0]}"
        else:
            configured, by = self.tool_ms, "tool_ms"
        heartbeat = tool is not None and self.heartbeats(tool)
        applies: dict[str, int] = {}
        if configured is not None:
            applies[by] = configured
        if self.chunk_ms is not None and not heartbeat:
            applies["chunk_ms"] = self.chunk_ms
        if self.step_ms is not None:
            applies["step_ms"] = self.step_ms
        if self.total_ms is not None:
            applies["total_ms"] = self.total_ms
        if not applies:
            return EffectiveLimit(tool or DEFAULT_ROW, configured, by, None, None, applies, heartbeat)
        # Ties go to the limit the user cannot raise per tool (chunk, step, total), since that
        # is the one an override would have to get past.
        order = {"chunk_ms": 0, "step_ms": 1, "total_ms": 2}
        bound = min(applies, key=lambda k: (applies[k], order.get(k, 3)))
        return EffectiveLimit(tool or DEFAULT_ROW, configured, by, applies[bound], bound, applies, heartbeat)


def _ms(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return None
    return int(value)


def timeouts_table(policy: TimeoutPolicy) -> list[EffectiveLimit]:
    """The default row, then one row per ``tools`` entry, then heartbeating tools not listed."""
    rows = [policy.effective(None)]
    rows += [policy.effective(name) for name in policy.tools]
    rows += [policy.effective(name) for name in policy.heartbeat_tools if name not in policy.tools]
    return rows


def _compacts(data: Mapping[str, Any]) -> bool:
    """Whether the pack can run a compaction (an LLM summary) inside a step."""
    for item in data.get("pipeline") or []:
        if isinstance(item, Mapping) and str(item.get("use", "")).startswith("summarize."):
            return True
    return isinstance(data.get("summarizer"), Mapping)


def summarizer_ceiling_s(data: Mapping[str, Any]) -> float:
    node = data.get("summarizer")
    value = node.get("total_s") if isinstance(node, Mapping) else None
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return DEFAULT_SUMMARIZER_TOTAL_S


def lint_timeouts(data: Mapping[str, Any]) -> list[TimeoutFinding]:
    """CR091-CR093 for a resolved pack (nothing when it declares no ``timeouts:``)."""
    from ctxrules.packs.source import escape_token  # the YAML layer: imported to lint, not to run

    policy = TimeoutPolicy.from_pack(data)
    if policy is None:
        return []
    out: list[TimeoutFinding] = []
    for row in timeouts_table(policy):
        if not row.ineffective or row.configured_ms is None or row.effective_ms is None:
            continue
        pointer = "/timeouts/tool_ms" if row.configured_by == "tool_ms" else f"/timeouts/tools/{escape_token(row.tool)}"
        what = (
            "the default tool limit tool_ms" if row.configured_by == "tool_ms" else f"the override {row.configured_by}"
        )
        message = (
            f"{what} = {row.configured_ms} ms ({format_ms(row.configured_ms)}) cannot take effect: "
            f"{row.bound_by} = {row.effective_ms} ms ({format_ms(row.effective_ms)}) ends the call "
            f"first, so its effective limit is {format_ms(row.effective_ms)}"
        )
        if row.bound_by == "chunk_ms":
            hint = (
                "chunk_ms is global (no per-tool form) and keeps running while a tool works "
                "silently: make the tool heartbeat below chunk_ms (ctxrules.heartbeat) and list "
                "it in timeouts.heartbeat.tools, or raise chunk_ms"
            )
        elif row.bound_by == "step_ms":
            hint = "a tool cannot outlive its step: raise step_ms or lower the override"
        else:
            hint = "a tool cannot outlive the run: raise total_ms or lower the override"
        out.append(TimeoutFinding("CR091", pointer, message, hint))
    if policy.step_ms is not None and _compacts(data):
        finding = _compaction_finding(policy, data)
        if finding is not None:
            out.append(finding)
    interval, chunk = policy.heartbeat_interval_ms, policy.chunk_ms
    if interval is not None and chunk is not None and interval >= chunk:
        out.append(
            TimeoutFinding(
                "CR093",
                "/timeouts/heartbeat/interval_ms",
                f"a heartbeat every {interval} ms ({format_ms(interval)}) cannot keep the chunk "
                f"timer chunk_ms = {chunk} ms ({format_ms(chunk)}) from firing",
                f"use an interval well below chunk_ms, e.g. {chunk // 4} ms",
            )
        )
    return out


def _compaction_finding(policy: TimeoutPolicy, data: Mapping[str, Any]) -> TimeoutFinding | None:
    """CR092: the summarizer's ceiling is longer than the step's compaction allowance."""
    ceiling = round(summarizer_ceiling_s(data) * 1000)
    allowance = policy.compaction_allowance_ms
    if allowance >= ceiling or policy.step_ms is None:
        return None
    declared = data.get("timeouts") or {}
    pointer = "/timeouts/compaction_allowance_ms" if "compaction_allowance_ms" in declared else "/timeouts/step_ms"
    message = (
        f"compaction may run {ceiling} ms ({format_ms(ceiling)}, summarizer.total_s) "
        f"inside a step, but compaction_allowance_ms allows {allowance} ms "
        f"({format_ms(allowance)}): a slow compaction eats up to "
        f"{format_ms(ceiling - allowance)} of the tools' step budget "
        f"(step_ms = {policy.step_ms} ms)"
    )
    hint = f"set compaction_allowance_ms to {ceiling} (step timer {policy.step_ms + ceiling} ms)"
    if allowance > 0:
        hint += (
            f", or lower summarizer.total_s to {allowance / 1000:g} (on timeout the "
            "summarizer falls back to a deterministic checkpoint, so compaction still ends)"
        )
    return TimeoutFinding("CR092", pointer, message, hint)


def render_table(
    policy: TimeoutPolicy,
    findings: list[TimeoutFinding] | None = None,
    locate: Callable[[str], str] | None = None,
) -> str:
    """The table ``ctxrules explain --timeouts`` prints; ``locate`` turns a finding's pointer
    into the ``file:line:col`` that starts its line, as in ``ctxrules validate``."""
    lines = [
        f"chunk_ms {format_ms(policy.chunk_ms)} (global)   step_ms {format_ms(policy.step_ms)}"
        + (
            f" + compaction allowance {format_ms(policy.compaction_allowance_ms)} = step timer "
            f"{format_ms(policy.step_timer_ms)}"
            if policy.step_ms is not None
            else ""
        )
        + f"   tool_ms {format_ms(policy.tool_ms)}   total_ms {format_ms(policy.total_ms)}",
        "",
    ]
    rows = [["tool", "configured", "by", "effective", "bound by", "heartbeat", "note"]]
    for r in timeouts_table(policy):
        note = "override cannot take effect" if r.ineffective else ""
        # Tool names are the pack's: an escape sequence or a line break in one is shown as its
        # escape, as every diagnostic shows it (and the columns stay aligned).
        rows.append(
            [
                printable(r.tool),
                format_ms(r.configured_ms),
                printable(r.configured_by) if r.configured_ms is not None else "-",
                format_ms(r.effective_ms),
                r.bound_by or "-",
                "yes" if r.heartbeat else "no",
                note,
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        lines.append("  ".join(c.ljust(widths[i]) for i, c in enumerate(row)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    for f in findings or []:
        where = f"{locate(f.pointer)}: " if locate is not None else ""
        lines.append(printable(f"{where}warning[{f.code}] {f.message}"))
        lines.append(printable(f"  help: {f.hint}"))
    return "\n".join(lines) + "\n"
