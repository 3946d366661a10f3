"""Semantic versions and the range syntax packs use (``^1``, ``~1.2``, ``>=0.1,<2``, ``1.x``).

Ranges: comparators separated by spaces or commas are ANDed; ``||`` separates alternatives.
``^X.Y.Z`` allows changes that keep the leftmost non-zero part; ``~X.Y.Z`` allows patch
changes (``~X`` allows minor ones); ``X``, ``X.Y``, ``X.x`` and ``*`` are wildcards.
Pre-release versions sort before their release, as SemVer 2.0 says.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ctxrules._version import __version__

_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)(?:\.(?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*))*))?"
    r"(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?$"
)
_PARTIAL = re.compile(r"^v?(\d+|[xX*])(?:\.(\d+|[xX*]))?(?:\.(\d+|[xX*]))?(?:-([0-9A-Za-z.-]+))?$")
_COMPARATOR = re.compile(r"^(\^|~|>=|<=|>|<|==|=)?\s*(.+)$")


class RangeError(ValueError):
    """A version or range that does not parse."""


@dataclass(frozen=True)
class Version:
    major: int
    minor: int
    patch: int
    pre: tuple[int | str, ...] = ()

    def key(self) -> tuple[int, int, int, int, tuple[tuple[int, int | str], ...]]:
        # A release sorts after all of its pre-releases; numeric identifiers before alphanumeric.
        pre = tuple((0, p) if isinstance(p, int) else (1, p) for p in self.pre)
        return (self.major, self.minor, self.patch, 0 if self.pre else 1, pre)

    def __lt__(self, other: Version) -> bool:
        return self.key() < other.key()

    def __le__(self, other: Version) -> bool:
        return self.key() <= other.key()

    def __str__(self) -> str:
        core = f"{self.major}.{self.minor}.{self.patch}"
        return core + ("-" + ".".join(str(p) for p in self.pre) if self.pre else "")


# More digits than any version needs, and far fewer than ``int()`` refuses (4,300).
_MAX_DIGITS = 100


def _num(digits: str) -> int:
    if len(digits) > _MAX_DIGITS:
        raise RangeError(f"a version number of {len(digits):,} digits (at most {_MAX_DIGITS})")
    return int(digits)


def _pre(text: str | None) -> tuple[int | str, ...]:
    if not text:
        return ()
    return tuple(_num(p) if p.isdigit() else p for p in text.split("."))


def parse_version(text: str) -> Version:
    """Parse a full SemVer 2.0 version; raises :class:`RangeError`."""
    m = _SEMVER.match(text.strip())
    if not m:
        raise RangeError(f"'{text}' is not a semantic version (MAJOR.MINOR.PATCH)")
    return Version(_num(m[1]), _num(m[2]), _num(m[3]), _pre(m[4]))


def is_semver(text: object) -> bool:
    """A SemVer 2.0 version whose numbers this module can compare (at most 100 digits each)."""
    if not isinstance(text, str) or _SEMVER.match(text) is None:
        return False
    try:
        parse_version(text)
    except RangeError:
        return False
    return True


def _loose(text: str) -> Version:
    """Versions as engines report them ('0.1' or '0.1.0')."""
    m = _PARTIAL.match(text.strip().split("+", 1)[0])  # build metadata does not order
    if not m or any(p in ("x", "X", "*") for p in m.groups()[:3] if p):
        raise RangeError(f"'{text}' is not a version")
    return Version(_num(m[1]), _num(m[2] or "0"), _num(m[3] or "0"), _pre(m[4]))


Bound = tuple[str, Version]


def _comparator(token: str) -> list[Bound]:
    m = _COMPARATOR.match(token)
    if not m:
        raise RangeError(f"cannot read '{token}'")
    op, rest = m[1] or "", m[2].split("+", 1)[0]
    pm = _PARTIAL.match(rest)
    if not pm:
        raise RangeError(f"'{rest}' is not a version")
    parts = [None if p is None or p in ("x", "X", "*") else _num(p) for p in pm.groups()[:3]]
    pre = _pre(pm[4])
    major, minor, patch = parts
    if major is None:
        if op not in ("", "=", "=="):
            raise RangeError(f"'{token}' compares with a wildcard")
        return []
    low = Version(major, minor or 0, patch or 0, pre)
    if op == "^":
        if major > 0 or minor is None:
            high = Version(major + 1, 0, 0, (0,))
        elif minor > 0 or patch is None:
            high = Version(0, minor + 1, 0, (0,))
        else:
            high = Version(0, 0, patch + 1, (0,))
        return [(">=", low), ("<", high)]
    if op == "~":
        high = Version(major + 1, 0, 0, (0,)) if minor is None else Version(major, minor + 1, 0, (0,))
        return [(">=", low), ("<", high)]
    if op in ("", "=", "=="):
        if minor is None:
            return [(">=", low), ("<", Version(major + 1, 0, 0, (0,)))]
        if patch is None:
            return [(">=", low), ("<", Version(major, minor + 1, 0, (0,)))]
        return [("==", low)]
    if op in (">", "<=") and (minor is None or patch is None):
        # '>1' means past every 1.x; '<=1.2' includes every 1.2.x.
        nxt = Version(major + 1, 0, 0, (0,)) if minor is None else Version(major, minor + 1, 0, (0,))
        return [(">=", nxt)] if op == ">" else [("<", nxt)]
    if op == "<" and (minor is None or patch is None):
        # '<1.2' is below every 1.2.x, its pre-releases included.
        return [("<", Version(major, minor or 0, 0, (0,)))]
    return [(op, low)]


@dataclass(frozen=True)
class VersionRange:
    text: str
    alternatives: tuple[tuple[Bound, ...], ...]

    def contains(self, version: Version | str) -> bool:
        v = version if isinstance(version, Version) else _loose(version)
        return any(all(_holds(v, op, b) for op, b in alt) for alt in self.alternatives)

    def __str__(self) -> str:
        return self.text


def _holds(v: Version, op: str, b: Version) -> bool:
    if op == ">=":
        return b <= v
    if op == ">":
        return b < v
    if op == "<=":
        return v <= b
    if op == "<":
        return v < b
    return v.key() == b.key()


def parse_range(text: str) -> VersionRange:
    """Parse a version range; raises :class:`RangeError` with the part that failed."""
    if not isinstance(text, str) or not text.strip():
        raise RangeError("empty version range")
    alternatives = []
    for alt in text.split("||"):
        # '>= 1.2' is one comparator written with a space: glue operators to what follows.
        tokens = re.sub(r"(\^|~|>=|<=|>|<|==|=)\s+", r"\1", alt.replace(",", " ")).split()
        if not tokens:
            raise RangeError(f"empty alternative in '{text}'")
        bounds: list[Bound] = []
        for tok in tokens:
            bounds.extend(_comparator(tok))
        alternatives.append(tuple(bounds))
    return VersionRange(text, tuple(alternatives))


def check_requires(requires: object) -> str | None:
    """None when ``metadata.requires`` admits this engine, else the reason."""
    if requires is None:
        return None
    try:
        rng = parse_range(str(requires))
    except RangeError as exc:
        return f"metadata.requires does not parse: {exc}"
    if not rng.contains(__version__):
        return f"this pack requires ctxrules {requires}, but this is ctxrules {__version__}"
    return None
