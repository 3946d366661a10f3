"""The warm-turn shortcuts of ``compress.intent`` and ``tool_output.filter``: each skips work
only where the skipped work cannot change the outcome, and decides like the full work."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from compress_kit import make_ctx as intent_ctx
from compress_kit import step as intent_step
from compress_kit import system
from compress_kit import user as intent_user

from ctxrules import toolroles
from ctxrules.stages import compress_intent
from ctxrules.stages.compress_intent import IntentStage, extract_terms
from ctxrules.toolroles import ToolRoles


class _Counting:
    """A compiled regex that counts the searches made with it."""

    def __init__(self, pattern: re.Pattern[str]) -> None:
        self.pattern = pattern
        self.calls = 0

    def search(self, text: str) -> Any:
        self.calls += 1
        return self.pattern.search(text)

    def finditer(self, text: str) -> Any:
        self.calls += 1
        return self.pattern.finditer(text)


# --- ToolRoles.is_error: the error-text regex only where it can match -------------------------

_ERROR_CASES = [
    ("file_1.txt\nfile_2.txt\n", False),
    ("Error: no such file", True),
    ("  ok\nFATAL: disk full", True),
    ("traceback of the call, not an error report", False),  # not the whole phrase
    ("the errors are listed below", False),  # "error" inside a word, not at a line start
    ("<tool_use_error>File has not been read yet</tool_use_error>", True),
    ('{"is_error": true}', True),
    ("no_is_errors here", False),
    ("Exception in thread main", True),
    # Non-ASCII: IGNORECASE lets "İ" match "i", so the words are not looked for there.
    ("EXCEPTİON raised", True),
    ("Tracebac\u212a (most recent call last)", False),  # the Kelvin sign is not a "k" here
    ("résumé: all fine", False),
]


@pytest.mark.parametrize(("text", "failed"), _ERROR_CASES)
def test_is_error_says_what_the_error_regex_says(text: str, failed: bool) -> None:
    assert bool(toolroles._ERROR_TEXT.search(text)) is failed  # the reference
    assert ToolRoles((), ()).is_error(text) is failed


@pytest.mark.parametrize(
    "text",
    [
        "Traceback (most recent call last):\n  File ...",
        "Traceback (most recent call last)x",
        "x\nerror\n",
        "ERROR",
        "warning: " + "a" * 5000 + "\nerror: past the 4,000 characters looked at",
        "\u212aeep calm: ErRoR",
    ],
)
def test_is_error_agrees_with_the_error_regex_on_edge_cases(text: str) -> None:
    assert ToolRoles((), ()).is_error(text) is bool(toolroles._ERROR_TEXT.search(text[:4000]))


def test_an_ascii_text_without_an_error_word_is_not_searched(monkeypatch: pytest.MonkeyPatch) -> None:
    counting = _Counting(toolroles._ERROR_TEXT)
    monkeypatch.setattr(toolroles, "_ERROR_TEXT", counting)
    roles = ToolRoles((), ())
    assert roles.is_error("file_1.txt\n" * 20) is False
    assert counting.calls == 0
    assert roles.is_error("ERROR: it broke") is True and counting.calls == 1
    assert roles.is_error("EXCEPTİON") is True and counting.calls == 2  # non-ASCII: searched


# --- extract_terms: the regexes only on texts that can hold a term ----------------------------


def test_texts_without_a_dot_or_a_slash_skip_the_regexes_they_cannot_match(monkeypatch: pytest.MonkeyPatch) -> None:
    regexes = {name: _Counting(getattr(compress_intent, name)) for name in ("_PATH_RE", "_BARE_FILE_RE", "_MODULE_RE")}
    for name, counting in regexes.items():
        monkeypatch.setattr(compress_intent, name, counting)
    compress_intent._terms.cache_clear()
    assert extract_terms("no dot and no slash here") == ([], [])
    assert sum(c.calls for c in regexes.values()) == 0
    # A dot without a slash: no path can be there, a bare file or a module can.
    assert extract_terms("edit setup.cfg, then ctxrules.stages is next.") == (["setup.cfg"], ["ctxrules.stages"])
    assert regexes["_PATH_RE"].calls == 0 and regexes["_BARE_FILE_RE"].calls == 1
    assert extract_terms("see src/x.py and a/b") == (["src/x.py"], [])
    assert regexes["_PATH_RE"].calls == 1
    compress_intent._terms.cache_clear()


# --- compress.intent: nothing to look for, nothing to match -----------------------------------


def test_an_intent_without_terms_or_failures_matches_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_match(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("nothing to look for: no message is matched")

    monkeypatch.setattr(IntentStage, "_matches", no_match)
    msgs = [system(), intent_user("hello"), *intent_step("a", "ok")]
    ctx = intent_ctx(tmp_path)
    out = IntentStage({})(msgs, ctx)
    assert out.actions == [] and ctx.protected == set()
    assert ctx.state["intent"] == {"files": [], "modules": [], "failed_calls": [], "asked": []}
    assert all(a is b for a, b in zip(out.messages, msgs, strict=True))
