"""A structured handover extracted from a sub-agent's result: done, todo, risks, files.

Deterministic and offline (no LLM): sub-agents usually end with a markdown report, so the
extraction reads its structure.

- **Sections**: a heading (``## Next steps``, ``**Risks:**``, ``Done:``) assigns the bullet and
  numbered items under it to a category by its words (see ``_regexes``).
- **Item markers** anywhere: ``- [x]``/✅/✓ mean done, ``- [ ]``/``TODO``/``FIXME`` mean todo,
  ``Warning:``/``Risk:``/``Caveat:``/⚠ mean a risk.
- **Done fallback**: with no done section, lines that open with a past-tense action verb
  (``Added``, ``Fixed``, ``Created`` ...) are taken as done.
- **Files**: paths that have a directory part or a known source-file extension, in order of
  first mention, with ``:line`` suffixes and URLs left out.

Each category keeps at most ``max_items`` items of at most 160 characters, in order, without
duplicates.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from typing import NamedTuple

__all__ = ["Handover", "extract_handover", "render_handover"]

_ITEM_CHARS = 160

_EXTENSIONS = (
    "py|pyi|js|jsx|mjs|cjs|ts|tsx|go|rs|rb|ex|exs|erl|java|kt|kts|scala|c|h|cc|cpp|hpp|cs|"
    "swift|m|mm|php|pl|lua|r|jl|dart|vue|svelte|sh|bash|zsh|ps1|sql|md|rst|txt|json|jsonl|"
    "yaml|yml|toml|ini|cfg|conf|xml|html|htm|css|scss|sass|less|proto|graphql|gradle|lock|"
    "env|dockerfile|tf|hcl|nix|ipynb|csv|tsv|heex|eex|leex|pony|zig|nim|ml|mli|hs|clj|cljs"
)


class _Regexes(NamedTuple):
    section_words: dict[str, re.Pattern[str]]
    heading: re.Pattern[str]
    bullet: re.Pattern[str]
    checked: re.Pattern[str]
    unchecked: re.Pattern[str]
    risk: re.Pattern[str]
    done_verb: re.Pattern[str]
    path: re.Pattern[str]
    known_ext: re.Pattern[str]
    version: re.Pattern[str]
    dotted_word: re.Pattern[str]


# Compiled on first use, not at import: this module is imported with every stage module
# (``validate`` among others), and only a compaction that reduces a sub-agent result runs it.
@cache
def _regexes() -> _Regexes:
    section_words: dict[str, re.Pattern[str]] = {
        "todo": re.compile(
            r"\b(to-?dos?|next steps?|remaining|follow[- ]?ups?|pending|open (items|questions)|"
            r"recommend\w*|still (needed|to do)|not (yet )?(done|implemented)|action items|"
            r"what'?s left|left to do|suggest\w*|future work)\b",
            re.I,
        ),
        "risks": re.compile(
            r"\b(risks?|caveats?|warnings?|issues?|concerns?|limitations?|known (issues|problems)|"
            r"blockers?|blocked|gotchas?|problems?|failures?|errors?|breaking)\b",
            re.I,
        ),
        "done": re.compile(
            r"\b(done|completed?|finished|summary|changes( made)?|what (i|was) (did|done|changed)|"
            r"implemented|implementation|fixe[sd]|accomplished|results?|findings|work performed|"
            r"modifications?|created|updated|added)\b",
            re.I,
        ),
    }
    heading = re.compile(
        r"^\s*(?:#{1,6}\s+(?P<md>.+?)\s*#*\s*$|\*\*(?P<bold>[^*]{2,80})\*\*:?\s*$|"
        r"(?P<colon>[A-Z][\w ./&'()-]{1,60}):\s*$)"
    )
    bullet = re.compile(r"^\s*(?:[-*•+]|\d{1,3}[.)])\s+(?P<body>.+)$")
    checked = re.compile(r"^\s*(?:[-*+]\s+)?\[[xX]\]\s+(?P<body>.+)$|^\s*(?:✅|✓|✔)\s*(?P<mark>.+)$")
    unchecked = re.compile(r"^\s*(?:[-*+]\s+)?\[ \]\s+(?P<body>.+)$|\b(?:TODO|FIXME)\b:?\s*(?P<todo>.+)$")
    risk = re.compile(
        r"^\s*(?:[-*+]\s+)?(?:⚠️?|\*\*)?\s*(?:warning|risk|caveat|careful|danger)\b\**:\s*(?P<body>.+)$", re.I
    )
    done_verb = re.compile(
        r"^\s*(?:[-*•+]|\d{1,3}[.)])?\s*(?:\*\*)?(?P<body>(?:Added|Created|Fixed|Implemented|Updated|"
        r"Removed|Refactored|Renamed|Moved|Wrote|Ran|Verified|Tested|Replaced|Deleted|Migrated|"
        r"Installed|Configured|Changed|Extracted|Merged|Resolved|Completed)\b.+)$"
    )
    path = re.compile(
        r"(?<![\w/.:@-])(?P<path>(?:\.{1,2}/|/|~/)?(?:[\w@.+-]+/)*[\w@+-][\w@.+-]*\.(?P<ext>[A-Za-z0-9]{1,10}))"
        r"(?::\d+(?::\d+)?)?(?![\w/])"
    )
    known_ext = re.compile(rf"(?:{_EXTENSIONS})", re.I)
    version = re.compile(r"^v?\d+(?:\.\d+)+$")
    # A whitespace-delimited word holding a dot, tried only where a word starts: linear even
    # on a long word without one (see _path_matches).
    dotted_word = re.compile(r"(?<!\S)[^\s.]*\.\S*")
    return _Regexes(
        section_words, heading, bullet, checked, unchecked, risk, done_verb, path, known_ext, version, dotted_word
    )


@dataclass(frozen=True)
class Handover:
    done: list[str] = field(default_factory=list)
    todo: list[str] = field(default_factory=list)
    risks: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)


def _clean(text: str) -> str:
    text = re.sub(r"\*\*|__|`", "", text)
    text = " ".join(text.split())
    if len(text) > _ITEM_CHARS:
        text = text[: _ITEM_CHARS - 1] + "…"
    return text


def _section_of(title: str) -> str | None:
    # Order matters: "Remaining issues" is a todo, "Known issues" a risk, "Summary" done.
    for category in ("todo", "risks", "done"):
        if _regexes().section_words[category].search(title):
            return category
    return None


class _Collector:
    def __init__(self, max_items: int) -> None:
        self.max_items = max_items
        self.items: dict[str, list[str]] = {"done": [], "todo": [], "risks": []}
        self.seen: set[str] = set()

    def add(self, category: str, text: str) -> None:
        item = _clean(text)
        if not item or item.lower() in self.seen or len(self.items[category]) >= self.max_items:
            return
        self.seen.add(item.lower())
        self.items[category].append(item)


def extract_handover(text: str, *, max_items: int = 8, max_files: int = 20) -> Handover:
    """The handover of a sub-agent result (see the module docstring for the rules)."""
    found = _Collector(max_items)
    verbs: list[str] = []
    section: str | None = None
    in_code = False
    rx = _regexes()
    for raw in text.splitlines():
        if raw.lstrip().startswith("```"):
            in_code = not in_code
            continue
        if in_code or not raw.strip():
            continue
        # Each pattern needs a character or word the line often lacks: tested first, it spares
        # most lines most of the regex calls (a sub-agent result has hundreds of lines).
        heading = rx.heading.match(raw) if "#" in raw or "**" in raw or raw.rstrip().endswith(":") else None
        if heading and not rx.bullet.match(raw):
            title = heading.group("md") or heading.group("bold") or heading.group("colon") or ""
            section = _section_of(title)
            continue
        checked = rx.checked.match(raw) if "[" in raw or _has_check_mark(raw) else None
        unchecked = rx.unchecked.search(raw) if "[ ]" in raw or "TODO" in raw or "FIXME" in raw else None
        risk = rx.risk.match(raw) if ":" in raw else None
        if checked:
            found.add("done", checked.group("body") or checked.group("mark") or "")
        elif unchecked:
            found.add("todo", unchecked.group("body") or unchecked.group("todo") or "")
        elif risk:
            found.add("risks", risk.group("body"))
        elif section is not None and (bullet := rx.bullet.match(raw)):
            found.add(section, bullet.group("body"))
        elif (verb := rx.done_verb.match(raw)) is not None:
            verbs.append(verb.group("body"))
    if not found.items["done"]:
        for line in verbs:
            found.add("done", line)
    return Handover(found.items["done"], found.items["todo"], found.items["risks"], _files(text, max_files))


def _has_check_mark(line: str) -> bool:
    # str.isascii() reads a flag of the string: most lines are ASCII, and then none is there.
    return not line.isascii() and ("\u2705" in line or "\u2713" in line or "\u2714" in line)


def _path_matches(text: str) -> Iterator[re.Match[str]]:
    """``_regexes().path.finditer(text)``, run only over the words that hold a dot.

    Every character a path match can hold is a non-space (``\\w``, ``@.+-/~:`` and digits)
    and it needs a dot before its extension, so a match lies inside one whitespace-delimited
    word that holds a dot. The pattern's look-behind and look-ahead see a space, or the end of
    the text, at a word's edges either way, so scanning each such word on its own (``pos`` /
    ``endpos`` within the whole text) finds the same matches in the same order. The full scan
    tries the pattern at every word start of a sub-agent's report; most words hold no dot."""
    rx = _regexes()
    for word in rx.dotted_word.finditer(text):
        yield from rx.path.finditer(text, word.start(), word.end())


def _files(text: str, limit: int) -> list[str]:
    files: list[str] = []
    seen: set[str] = set()
    rx = _regexes()
    for match in _path_matches(text):
        path = match.group("path")
        ext = match.group("ext")
        if "://" in text[max(0, match.start() - 12) : match.end()]:
            continue  # part of a URL
        if ext.isdigit() or rx.version.match(path):
            continue  # 3.11, v1.2.3
        if "/" not in path and not rx.known_ext.fullmatch(ext):
            continue  # e.g., example.com, Foo.bar (an attribute access)
        if path not in seen:
            seen.add(path)
            files.append(path)
            if len(files) >= limit:
                break
    return files


def render_handover(handover: Handover) -> str:
    """The handover as a few plain lines (empty categories say so)."""
    out: list[str] = []
    for name in ("done", "todo", "risks"):
        items: list[str] = getattr(handover, name)
        if items:
            out.append(f"{name}:")
            out.extend(f"- {item}" for item in items)
        else:
            out.append(f"{name}: (none found)")
    out.append("files: " + (", ".join(handover.files) if handover.files else "(none found)"))
    return "\n".join(out)
