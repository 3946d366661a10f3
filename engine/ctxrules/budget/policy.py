"""Budget policies as a pack declares them (``budgets:``), and the four levels.

A budget has up to three dimensions, each with a limit in USD, in tokens, or both:
``session`` (the root task: a session and every sub-agent it spawned), ``day`` (every session
under the state root, per calendar day in ``timezone``) and ``goal`` (every session working for a
named goal). Each (dimension, unit) pair is at a level:

=============  ==================================  =========================================
level          when (share = spent / limit)        actions (``levels.<level>``)
=============  ==================================  =========================================
OK             share < ``warning``                 none
WARNING        ``warning`` <= share                cache-safe notice; eco mode (thresholds
                                                   times ``eco_factor``, default 0.8 = -20%)
FINALIZATION   ``finalization`` <= share           notice "answer now"; strip tool calls from
                                                   model output
EXCEEDED       share >= 1                          refuse further calls (``BudgetExceeded``)
=============  ==================================  =========================================

The session's level is the highest level of any pair. Defaults: warning 0.8, finalization
0.95, eco_factor 0.8, max_descendants 20 (docs/budgets.md).
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ctxrules.errors import UsageError

__all__ = [
    "DIMENSIONS",
    "BudgetPolicy",
    "DimensionLimit",
    "Level",
    "LevelActions",
    "lint_budgets",
]

DIMENSIONS: Final = ("session", "day", "goal")
DEFAULT_WARNING: Final = 0.8
DEFAULT_FINALIZATION: Final = 0.95
DEFAULT_ECO_FACTOR: Final = 0.8
DEFAULT_MAX_DESCENDANTS: Final = 20
DEFAULT_BURN_WINDOW_S: Final = 600.0

DEFAULT_WARNING_NOTICE: Final = (
    "Budget notice: the {dimension} budget is {share} used ({spent} of {limit}). Work "
    "economically: keep answers short, avoid tool calls that are not needed, and head for the "
    "end of the task."
)
DEFAULT_FINALIZATION_NOTICE: Final = (
    "Budget almost exhausted: the {dimension} budget is {share} used ({spent} of {limit}). "
    "Do not call any more tools. Answer now with your final result: what is done, what "
    "remains, and anything the user must know to continue."
)


class Level(IntEnum):
    """Budget levels, ordered: a higher level includes the actions of the lower ones."""

    OK = 0
    WARNING = 1
    FINALIZATION = 2
    EXCEEDED = 3

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class DimensionLimit:
    """The limits of one dimension and the shares at which its levels start."""

    name: str
    usd: float | None
    tokens: int | None
    warning: float
    finalization: float

    def level_of(self, share: float) -> Level:
        if share >= 1.0:
            return Level.EXCEEDED
        if share >= self.finalization:
            return Level.FINALIZATION
        if share >= self.warning:
            return Level.WARNING
        return Level.OK


@dataclass(frozen=True)
class LevelActions:
    """What the WARNING/FINALIZATION/EXCEEDED levels do (``budgets.levels``)."""

    warning_notice: str | None = DEFAULT_WARNING_NOTICE
    eco: bool = True
    eco_factor: float = DEFAULT_ECO_FACTOR
    finalization_notice: str | None = DEFAULT_FINALIZATION_NOTICE
    strip_tool_calls: bool = True
    refuse: bool = True


@dataclass(frozen=True)
class BudgetPolicy:
    """The resolved ``budgets:`` node. ``limits`` is empty when the pack sets no limit; the
    ledger still records, and the report still shows cost, cache savings and burn rate."""

    limits: tuple[DimensionLimit, ...] = ()
    actions: LevelActions = field(default_factory=LevelActions)
    timezone: str = "UTC"
    max_descendants: int = DEFAULT_MAX_DESCENDANTS
    burn_window_s: float = DEFAULT_BURN_WINDOW_S
    prices: Mapping[str, Any] = field(default_factory=dict)

    @property
    def tz(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def limit(self, name: str) -> DimensionLimit | None:
        return next((lim for lim in self.limits if lim.name == name), None)

    @classmethod
    def from_pack(cls, data: Mapping[str, Any] | None) -> BudgetPolicy:
        """The policy of a resolved pack (its ``budgets:`` node; absent = no limits)."""
        node = (data or {}).get("budgets")
        spawn_cap = _guards_max_descendants(data)
        if node is None:
            return cls(max_descendants=spawn_cap)
        if not isinstance(node, Mapping):
            raise UsageError("budgets: must be a mapping")
        levels = node.get("levels") or {}
        warning = _share(levels.get("warning", {}).get("at", DEFAULT_WARNING), "budgets.levels.warning.at")
        final = _share(
            levels.get("finalization", {}).get("at", DEFAULT_FINALIZATION),
            "budgets.levels.finalization.at",
        )
        limits = []
        for name in DIMENSIONS:
            dim = node.get(name)
            if not isinstance(dim, Mapping):
                continue
            usd = dim.get("usd")
            tokens = dim.get("tokens")
            if usd is None and tokens is None:
                continue
            w = _share(dim.get("warning", warning), f"budgets.{name}.warning")
            f = _share(dim.get("finalization", final), f"budgets.{name}.finalization")
            if not w < f:
                raise UsageError(f"budgets.{name}: warning ({w}) must be below finalization ({f})")
            limits.append(
                DimensionLimit(
                    name,
                    None if usd is None else float(usd),
                    None if tokens is None else int(tokens),
                    w,
                    f,
                )
            )
        wl, fl, ex = (levels.get(k) or {} for k in ("warning", "finalization", "exceeded"))
        actions = LevelActions(
            warning_notice=_notice(wl, DEFAULT_WARNING_NOTICE),
            eco=bool(wl.get("eco", True)),
            eco_factor=float(wl.get("eco_factor", DEFAULT_ECO_FACTOR)),
            finalization_notice=_notice(fl, DEFAULT_FINALIZATION_NOTICE),
            strip_tool_calls=bool(fl.get("strip_tool_calls", True)),
            refuse=bool(ex.get("refuse", True)),
        )
        if not 0 < actions.eco_factor <= 1:
            raise UsageError(f"budgets.levels.warning.eco_factor must be in (0, 1], got {actions.eco_factor}")
        tz = str((node.get("day") or {}).get("timezone", "UTC")) if isinstance(node.get("day"), Mapping) else "UTC"
        if not _is_zone(tz):
            raise UsageError(f"budgets.day.timezone: {_unknown_zone(tz)}")
        return cls(
            limits=tuple(limits),
            actions=actions,
            timezone=tz,
            max_descendants=int(node.get("max_descendants", spawn_cap)),
            burn_window_s=float(node.get("burn_window_s", DEFAULT_BURN_WINDOW_S)),
            prices=dict(node.get("prices") or {}),
        )


def lint_budgets(data: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """``(pointer, message, hint)`` for what :meth:`BudgetPolicy.from_pack` refuses and the
    schema cannot say: a day time zone that is not an IANA name, and a limited dimension whose
    warning share (its own or ``levels.warning.at``) is not below its finalization share. A pack
    that passes ``ctxrules validate`` must not fail its first budget check."""
    node = data.get("budgets")
    if not isinstance(node, Mapping):
        return []
    out: list[tuple[str, str, str]] = []
    levels: Mapping[str, Any] = node["levels"] if isinstance(node.get("levels"), Mapping) else {}

    def level_at(level: str, default: float) -> Any:
        own = levels.get(level)
        return own.get("at", default) if isinstance(own, Mapping) else default

    for name in DIMENSIONS:
        dim = node.get(name)
        if not isinstance(dim, Mapping) or (dim.get("usd") is None and dim.get("tokens") is None):
            continue
        w = dim.get("warning", level_at("warning", DEFAULT_WARNING))
        f = dim.get("finalization", level_at("finalization", DEFAULT_FINALIZATION))
        if not (_is_share(w) and _is_share(f)) or w < f:
            continue  # a share out of range is the schema's to report
        if "warning" in dim or "finalization" in dim:
            pointer = f"/budgets/{name}/" + ("warning" if "warning" in dim else "finalization")
        else:
            own = levels.get("warning")
            pointer = "/budgets/levels/" + ("warning" if isinstance(own, Mapping) and "at" in own else "finalization")
            pointer += "/at"
        out.append(
            (
                pointer,
                f"budgets.{name}: warning ({w}) must be below finalization ({f})",
                f"the WARNING level must start before FINALIZATION: lower the warning share or raise the finalization "
                f"share of budgets.{name} (or of budgets.levels; defaults {DEFAULT_WARNING} and "
                f"{DEFAULT_FINALIZATION})",
            )
        )
    day = node.get("day")
    tz = day.get("timezone") if isinstance(day, Mapping) else None
    if isinstance(tz, str) and not _is_zone(tz):
        out.append(("/budgets/day/timezone", _unknown_zone(tz), "e.g. timezone: Europe/Berlin"))
    for level in ("warning", "finalization"):
        own = levels.get(level)
        message = own.get("message") if isinstance(own, Mapping) else None
        problem = notice_problem(message) if isinstance(message, str) else None
        if problem is not None:
            out.append(
                (
                    f"/budgets/levels/{level}/message",
                    f"budgets.levels.{level}.message: {problem}",
                    "write plain {dimension}, {share}, {spent}, {limit}, {level}, with widths of at most "
                    f"{NOTICE_WIDTH_MAX:,}",
                )
            )
    return out


NOTICE_WIDTH_MAX: Final = 1000
"""The largest width or precision a field of a budget notice may ask for."""

_SPEC_NUMBER = re.compile(r"\d+")


def notice_problem(template: str) -> str | None:
    """Why ``template`` (a level's ``message``) is not rendered with its values, or None: a
    field that looks something up (``{spent.__class__}``, ``{limit[0]}``) or asks for a width or
    precision over :data:`NOTICE_WIDTH_MAX` (``{share:>9999999999}`` took the process's memory).
    Such a message is sent as it is written; a field it does not know is too."""
    try:
        fields = [(name, spec) for _, name, spec, _ in string.Formatter().parse(template) if name is not None]
    except ValueError:
        return None  # not a format string: sent as written, as before
    for name, spec in fields:
        if "." in name or "[" in name:
            return f"the field {{{name}}} looks something up; a field is a plain name"
        if spec and ("{" in spec or "}" in spec or any(int(n) > NOTICE_WIDTH_MAX for n in _SPEC_NUMBER.findall(spec))):
            shown = f"{{{name}:{spec[:20]}}}"
            return f"the field {shown} asks for a width over {NOTICE_WIDTH_MAX:,} (or one taken from a field)"
    return None


def _is_zone(name: str) -> bool:
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return False
    return True


def _unknown_zone(name: str) -> str:
    return f"unknown time zone {name!r} (use an IANA name such as 'Europe/Berlin' or 'UTC')"


def _is_share(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and 0 < value <= 1


def _guards_max_descendants(data: Mapping[str, Any] | None) -> int:
    """``guards.subagents.max_descendants`` (the runtime's spawn cap), else 20: one number for
    both, unless ``budgets.max_descendants`` says otherwise."""
    guards = (data or {}).get("guards")
    sub = guards.get("subagents") if isinstance(guards, Mapping) else None
    value = sub.get("max_descendants") if isinstance(sub, Mapping) else None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return DEFAULT_MAX_DESCENDANTS


def _share(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise UsageError(f"{where} must be a share in (0, 1], got {value!r}")
    return float(value)


def _notice(level: Mapping[str, Any], default: str) -> str | None:
    if level.get("notice", True) is False:
        return None
    message = level.get("message")
    return message if isinstance(message, str) and message.strip() else default
