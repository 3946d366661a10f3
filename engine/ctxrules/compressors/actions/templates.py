"""The text options actions write out, parsed once when the action is built and bounded.

- :class:`FormatTemplate`: a format string over named fields (``collapse_repeats`` ``format``,
  ``group`` ``header``, ``carry`` ``with``, ``short_circuit`` ``message``). Each field is a plain
  name the action provides, with an optional conversion (``!r``) and format spec (``:>5``);
  widths and precisions are numbers of at most :data:`~ctxrules.compressors.limits.FORMAT_WIDTH_MAX`.
  Attribute and index lookups (``{line.__class__}``, ``{file[0]}``), positional fields
  (``{}``, ``{0}``) and fields inside a spec (``{file:{width}}``, a width taken from the output)
  are refused. A template renders field by field, as ``str.format`` would, charging an
  :class:`OutputBudget` for each piece before the next is made.
- :class:`Replacement`: a ``replace`` replacement (``\\1``, ``\\g<name>``), parsed the way the
  ``regex`` module (which ran them) parses templates, so that a bad escape or group is found
  when the step is built (``ctxrules validate``), not on the first line it matches. It expands
  through a function, which charges the budget with each match's size before making it.

Nothing here formats a template to check it: a field's spec is tried on an empty value only
once its widths are known to be small.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ctxrules.compressors.limits import (
    FORMAT_WIDTH_MAX,
    OUTPUT_GROWTH,
    OUTPUT_SLACK,
    TEMPLATE_MAX,
    OptionError,
    OutputTooLarge,
)
from ctxrules.patterns import Match

__all__ = ["FormatTemplate", "OutputBudget", "Replacement", "check_text"]


class OutputBudget:
    """What one call of an action may write: :data:`OUTPUT_GROWTH` times the characters of its
    input lines (each with its newline) plus :data:`OUTPUT_SLACK`. :meth:`charge` before
    making a piece of text; past the budget it raises :class:`OutputTooLarge`."""

    __slots__ = ("action", "left", "limit", "size")

    def __init__(self, lines: Sequence[str], action: str) -> None:
        self.action = action
        self.size = sum(map(len, lines)) + len(lines)
        self.limit = OUTPUT_GROWTH * self.size + OUTPUT_SLACK
        self.left = self.limit

    def charge(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise OutputTooLarge(
                f"{self.action} would write more than {self.limit:,} characters ({OUTPUT_GROWTH} times "
                f"its input of {self.size:,}, plus {OUTPUT_SLACK:,}): stopped"
            )


def check_text(value: str, option: str) -> str:
    """``value``, a text option, when it is at most :data:`TEMPLATE_MAX` characters long."""
    if len(value) > TEMPLATE_MAX:
        raise OptionError(option, f"'{option}' is {len(value):,} characters long; the limit is {TEMPLATE_MAX:,}")
    return value


_CONVERSIONS: dict[str, Callable[[object], str]] = {"r": repr, "s": str, "a": ascii}
_DIGITS = re.compile(r"\d+")


def _shown(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


class FormatTemplate:
    """A format string of option ``option`` over the fields ``fields`` (name: an empty value
    of the type the action passes, ``""`` or ``0``). ``unknown(name)`` words the error for a
    name that is not a field. Raises :class:`OptionError` for anything refused."""

    __slots__ = ("_parts", "text")

    def __init__(
        self,
        text: str,
        option: str,
        fields: Mapping[str, object],
        unknown: Callable[[str], str],
    ) -> None:
        self.text = check_text(text, option)
        try:
            parsed = list(string.Formatter().parse(text))
        except ValueError as exc:
            raise OptionError(option, f"'{option}' is not a valid format string: {exc}") from None
        parts: list[tuple[str, str | None, str | None, str]] = []
        for literal, name, spec, conversion in parsed:
            if name is None:
                parts.append((literal, None, None, ""))
                continue
            field = "{" + name + ("!" + conversion if conversion else "") + (":" + spec if spec else "") + "}"
            if "." in name or "[" in name:
                raise OptionError(
                    option,
                    f"'{option}' uses {_shown(field)}: a field is a plain name, without attribute or index lookups",
                )
            if name not in fields:
                raise OptionError(option, unknown(name))
            if conversion is not None and conversion not in _CONVERSIONS:
                raise OptionError(option, f"'{option}' uses {_shown(field)}: unknown conversion '!{conversion}'")
            spec = spec or ""
            if "{" in spec or "}" in spec:
                raise OptionError(
                    option,
                    f"'{option}' uses {_shown(field)}: a format spec may not contain fields; "
                    f"write widths as numbers (at most {FORMAT_WIDTH_MAX:,})",
                )
            # Every number in a spec is its width or its precision (a fill digit stands apart,
            # before the alignment); Python reads any decimal digit there, not only 0-9.
            for digits in _DIGITS.findall(spec):
                if int(digits) > FORMAT_WIDTH_MAX:  # at most TEMPLATE_MAX digits: int() is cheap
                    number = digits if len(digits) <= 20 else f"of {len(digits):,} digits"
                    raise OptionError(
                        option,
                        f"'{option}' uses {_shown(field)}: a width or precision {number} is over "
                        f"the limit of {FORMAT_WIDTH_MAX:,}",
                    )
            if spec:
                # Small now (widths checked above): try the spec on an empty value of the type
                # the field takes, so that {line:d} is found when the step is built.
                sample = fields[name]
                try:
                    format(_CONVERSIONS[conversion](sample) if conversion else sample, spec)
                except (ValueError, TypeError) as exc:
                    raise OptionError(option, f"'{option}' uses {_shown(field)}: {exc}") from None
            parts.append((literal, name, conversion, spec))
        self._parts = tuple(parts)

    def render(self, values: Mapping[str, Any], budget: OutputBudget) -> str:
        """What ``text.format(**values)`` gives, each piece charged to ``budget`` as it is made."""
        pieces: list[str] = []
        for literal, name, conversion, spec in self._parts:
            if literal:
                budget.charge(len(literal))
                pieces.append(literal)
            if name is not None:
                value = values[name]
                if conversion is not None:
                    value = _CONVERSIONS[conversion](value)
                piece = format(value, spec)
                budget.charge(len(piece))
                pieces.append(piece)
        return "".join(pieces)


# -- replacements ------------------------------------------------------------------------------

# What the `regex` module's template parser (regex._regex_core._compile_replacement) accepts.
_ASCII_LETTERS = frozenset(string.ascii_letters)
_DIGIT_CHARS = frozenset(string.digits)
_OCTAL = frozenset("01234567")
_HEX_DIGITS = frozenset(string.hexdigits)
_CHARACTER_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}
_NAME_CHARS = _ASCII_LETTERS | {" "}


class Replacement:
    """The ``with`` of ``replace`` for a pattern with ``groups`` groups named ``groupindex``:
    literal text and group references, as the ``regex`` module reads a template (``\\1`` to
    ``\\99`` and ``\\g<name>`` refer to groups, ``\\n`` ``\\t`` ``\\x41`` ``\\u00e9``
    ``\\N{EM DASH}`` and octal escapes (``\\0``, ``\\141``) are characters, ``\\\\`` is a backslash, an
    escaped character that is not a letter stays as written, an unknown letter escape is an
    error). Raises :class:`OptionError` (option ``with``) for a template ``regex`` refuses."""

    __slots__ = ("_fixed", "_parts", "_refs", "literal")

    def __init__(self, template: str, groups: int, groupindex: Mapping[str, int]) -> None:
        check_text(template, "with")
        parts: list[str | int] = []
        literal: list[str] = []
        n = len(template)
        i = start = 0

        def fail(message: str) -> OptionError:
            return OptionError("with", f"'with' {message} (at character {start + 1})")

        def group(index: int) -> None:
            if not 0 <= index <= groups:
                raise fail(f"refers to group {index}, which the pattern does not define ({groups} groups)")
            if literal:
                parts.append("".join(literal))
                literal.clear()
            parts.append(index)

        while i < n:
            ch = template[i]
            i += 1
            if ch != "\\":
                literal.append(ch)
                continue
            start = i - 1
            if i >= n:
                raise fail("ends with a lone backslash (write \\\\ for a backslash)")
            ch = template[i]
            i += 1
            if ch in _ASCII_LETTERS:
                if ch in _CHARACTER_ESCAPES:
                    literal.append(_CHARACTER_ESCAPES[ch])
                elif ch in _HEX_ESCAPES:
                    digits = template[i : i + _HEX_ESCAPES[ch]]
                    if len(digits) < _HEX_ESCAPES[ch] or not set(digits) <= _HEX_DIGITS:
                        raise fail(f"has an incomplete escape \\{ch}{_shown(digits, 8)}")
                    code = int(digits, 16)
                    if code > 0x10FFFF:
                        raise fail(f"has an escape \\{ch}{digits} beyond the last character")
                    literal.append(chr(code))
                    i += len(digits)
                elif ch == "g":
                    if template[i : i + 1] != "<":
                        raise fail("has \\g without <name>")
                    end = i + 1
                    while end < n and template[end] not in ">)":
                        end += 1
                    name = template[i + 1 : end]
                    if not name:
                        raise fail("has \\g<> without a group name")
                    if end >= n or template[end] != ">":
                        raise fail(f"has \\g<{_shown(name)} without its closing >")
                    i = end + 1
                    if name.isdigit():
                        try:
                            index = int(name)
                        except ValueError:  # a digit int() does not read, such as '²'
                            raise fail(f"has a bad character in group name {name!r}") from None
                        group(index)
                    elif not name.isidentifier():
                        raise fail(f"has a bad character in group name {_shown(name)!r}")
                    elif name not in groupindex:
                        known = ", ".join(sorted(groupindex)) or "none"
                        raise fail(
                            f"refers to group {name!r}, which the pattern does not define (named groups: {known})"
                        )
                    else:
                        group(groupindex[name])
                elif ch == "N" and (close := _named_end(template, i)) is not None:
                    name = template[i + 1 : close]
                    try:
                        literal.append(unicodedata.lookup(name))
                    except KeyError:
                        raise fail(f"names no character: \\N{{{_shown(name)}}}") from None
                    i = close + 1
                else:
                    raise fail(f"has a bad escape \\{ch}")
            elif ch == "0":
                digits = ch
                while len(digits) < 3 and i < n and template[i] in _OCTAL:
                    digits += template[i]
                    i += 1
                literal.append(chr(int(digits, 8) & 0x1FF))
            elif ch in _DIGIT_CHARS:
                digits = ch
                if i < n and template[i] in _DIGIT_CHARS:
                    digits += template[i]
                    i += 1
                    if i < n and set(digits + template[i]) <= _OCTAL:
                        literal.append(chr(int(digits + template[i], 8) & 0x1FF))
                        i += 1
                        continue
                group(int(digits))
            elif ch == "\\":
                literal.append("\\")
            else:  # an escaped character that is not a letter stays as written
                literal.append("\\" + ch)
        if literal:
            parts.append("".join(literal))
        self._parts: tuple[str | int, ...] = tuple(parts)
        self._refs = tuple(p for p in parts if isinstance(p, int))
        self._fixed = sum(len(p) for p in parts if isinstance(p, str))
        self.literal: str | None = None if self._refs else "".join(p for p in parts if isinstance(p, str))
        """The whole replacement when it refers to no group."""

    def expand(self, found: Match) -> str:
        """The replacement for one match."""
        return "".join(p if isinstance(p, str) else (found.group(p) or "") for p in self._parts)

    def expander(self, budget: OutputBudget) -> Callable[[Match], str]:
        """:meth:`expand` for ``Pattern.sub``, charging ``budget`` with each replacement's size
        (worked out from the groups' spans) before it is made."""
        fixed = self._fixed
        literal = self.literal
        if literal is not None:
            text = literal

            def constant(_found: Match) -> str:
                budget.charge(fixed)
                return text

            return constant
        refs = self._refs
        expand = self.expand

        def expanded(found: Match) -> str:
            size = fixed
            for ref in refs:
                start, end = found.span(ref)
                size += end - start
            budget.charge(size)
            return expand(found)

        return expanded


def _named_end(template: str, start: int) -> int | None:
    """Where the ``}`` of ``\\N{NAME}`` is, when ``{`` is at ``start`` and only letters and
    spaces come between (else ``\\N`` is a bad escape, as in ``regex``)."""
    if template[start : start + 1] != "{":
        return None
    end = start + 1
    while end < len(template) and template[end] in _NAME_CHARS:
        end += 1
    return end if end < len(template) and template[end] == "}" else None
