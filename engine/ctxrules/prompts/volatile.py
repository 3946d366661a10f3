"""Finding values in a system-prompt template that change from call to call (lint CR085).

A provider caches a prompt *prefix*: one changed byte in the system prompt makes every later
token a cache miss. A template that prints the date, a timestamp, a request id or a counter
changes the system prompt on every call, or every day, and so pays full price each time. Such
values belong in a user message, after the cached prefix.

What counts as volatile, by what the template shows (the values themselves are only known when
a prompt is assembled):

- a variable whose name says it changes: ``date``, ``now``, ``timestamp``, ``current_time``,
  ``uuid``, ``request_id``, ``counter``, ``turn`` ... (word by word, so ``build_date`` and
  ``requestId`` count, ``update_policy`` does not); a variable declared ``stable: true`` is
  trusted;
- a call or attribute that reads a clock or a random source: ``.now()``, ``.today()``,
  ``.utcnow()``, ``.timestamp()``, ``.strftime(...)``, ``uuid4()``, ``randint(...)`` ...;
- Jinja's own random helpers, ``lipsum()`` and ``|random`` (removed from ctxrules' environment,
  so such a template also fails to render) and any filter whose name reads a clock or a random
  source (``|strftime``, ``|datetimeformat``, ``|shuffle`` ...).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Collection

    from jinja2 import nodes

__all__ = ["VolatileUse", "find_volatile", "volatile_name_reason"]

# Words that, as a part of a name, mean "a different value on every call, session or day".
_TIME_WORDS = frozenset(
    {
        "date",
        "dates",
        "time",
        "times",
        "datetime",
        "now",
        "today",
        "yesterday",
        "tomorrow",
        "timestamp",
        "ts",
        "clock",
        "uptime",
        "elapsed",
        "epoch",
        "year",
        "month",
        "day",
        "weekday",
        "hour",
        "minute",
    }
)
_ID_WORDS = frozenset({"uuid", "guid", "nonce", "ulid"})
_RANDOM_WORDS = frozenset({"random", "rand", "seed", "shuffle", "shuffled"})
_COUNTER_WORDS = frozenset({"counter", "turn", "turns", "iteration", "seq", "sequence", "attempt"})
# "<word>_id" names that differ per request or session (ids of stable things are fine).
_ID_OWNERS = frozenset(
    {
        "request",
        "trace",
        "span",
        "run",
        "message",
        "msg",
        "conversation",
        "session",
        "call",
        "correlation",
        "invocation",
        "execution",
    }
)
# Calls and attributes that read a clock or a random source.
_VOLATILE_CALLS = frozenset(
    {
        "now",
        "today",
        "utcnow",
        "timestamp",
        "isoformat",
        "strftime",
        "time",
        "monotonic",
        "perf_counter",
        "uuid1",
        "uuid4",
        "random",
        "randint",
        "randrange",
        "choice",
        "choices",
        "shuffle",
        "sample",
        "token_hex",
        "token_urlsafe",
        "urandom",
        "lipsum",
    }
)
_VOLATILE_FILTER_WORDS = (
    _TIME_WORDS
    | _ID_WORDS
    | _RANDOM_WORDS
    | {"strftime", "datetimeformat", "dateformat", "timeformat", "humanize", "ago"}
)


@dataclass(frozen=True)
class VolatileUse:
    """One volatile thing a template uses: where (template line), what, and why it is volatile."""

    line: int
    what: str
    why: str


def _words(name: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    return [w for w in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if w]


def volatile_name_reason(name: str) -> str | None:
    """Why a variable or filter called ``name`` looks volatile, or None."""
    words = _words(name)
    for i, w in enumerate(words):
        if w in _TIME_WORDS:
            return "its name says it holds a date or time"
        if w in _ID_WORDS:
            return "its name says it holds a unique id"
        if w in _RANDOM_WORDS:
            return "its name says it is random"
        if w in _COUNTER_WORDS:
            return "its name says it counts calls or turns"
        if w == "id" and i > 0 and words[i - 1] in _ID_OWNERS:
            return f"a {words[i - 1]} id differs from one {words[i - 1]} to the next"
    return None


def find_volatile(ast: nodes.Template, *, stable: Collection[str] = ()) -> list[VolatileUse]:
    """Every volatile use in the parsed template ``ast``, in template order, one per line and name.

    ``stable`` names variables declared ``stable: true``; they are never reported.
    """
    from jinja2 import nodes

    from ctxrules.prompts.building import find_all  # a loop: the tree may be too deep for recursion

    found: dict[tuple[int, str], VolatileUse] = {}

    def add(node: nodes.Node, what: str, why: str) -> None:
        key = (node.lineno, what)
        if key not in found:
            found[key] = VolatileUse(node.lineno, what, why)

    assigned = {n.name for n in find_all(ast, nodes.Name) if n.ctx in ("store", "param")}
    for name_node in find_all(ast, nodes.Name):
        if name_node.ctx != "load" or name_node.name in assigned or name_node.name in stable:
            continue
        if name_node.name == "lipsum":
            add(name_node, "lipsum()", "it generates random text")
            continue
        reason = volatile_name_reason(name_node.name)
        if reason:
            add(name_node, f"variable '{name_node.name}'", reason)
    for filt in find_all(ast, nodes.Filter):
        if filt.name == "random":
            add(filt, "filter 'random'", "it picks a random item")
        elif any(w in _VOLATILE_FILTER_WORDS for w in _words(filt.name)):
            add(
                filt,
                f"filter '{filt.name}'",
                "its name says it formats a date, time, id or random value",
            )
    for attr in find_all(ast, nodes.Getattr):
        if attr.attr in _VOLATILE_CALLS:
            add(attr, f"'.{attr.attr}'", "it reads a clock or a random source")
    for call in find_all(ast, nodes.Call):
        target = call.node
        if isinstance(target, nodes.Name) and target.name in _VOLATILE_CALLS and target.name not in assigned:
            add(call, f"'{target.name}()'", "it reads a clock or a random source")
    return sorted(found.values(), key=lambda u: (u.line, u.what))
