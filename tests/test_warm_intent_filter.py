"""The warm-turn shortcuts of ``compress.intent`` and ``tool_output.filter``: each skips work
only where the skipped work cannot change the outcome, and decides like the full work."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
from compress_kit import make_ctx as intent_ctx
from compress_kit import step as intent_step
from compress_kit import system
from compress_kit import user as intent_user
from filtering_kit import Msg, make_ctx, step, user

from ctxrules import toolroles
from ctxrules.carry import ALIKE_EDITS, Carry
from ctxrules.patterns import Pattern
from ctxrules.stages import compress_intent, tool_output_filter
from ctxrules.stages.compress_intent import IntentStage, extract_terms
from ctxrules.stages.filter_common import result_digest
from ctxrules.stages.tool_output_filter import ToolOutputFilter, _Run
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
    ("Tracebac\u212a (most recent call last)", True),  # IGNORECASE folds the Kelvin sign to "k"
    # A Python traceback whose last line names no "Error:" at a line start (the header's
    # "\b" after ")" never matched before the ":" that follows it).
    ("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\nKeyError: 'a'\n", True),
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


# --- ToolRoles.exit_code: a pattern runs only on a text that holds its literal ----------------

_EXIT_PATTERNS = (
    r"Exit code:? (\d+)",
    r"<returncode>(-?\d+)</returncode>",
    r"(?i)exit code (-?\d+)",
    r"(?i)STATUS=(\d+)",
    r"(?x) rc \s* = \s* (\d+)",
    r"(?i:done) with (\d+)",
    r"^(\d+)$|failed \((\d+)\)",  # no top-level literal: always runs
    # What re's parser takes for literals and the regex engine that runs the patterns does
    # not: fuzzy matching ("exot code 3" matches), a POSIX class.
    r"(?:exit){e<=1} code (\d+)",
    r"status[[:space:]]was (\d+)",
)
_EXIT_TEXTS = [
    "file_1.txt\n" * 20,
    "Exit code: 2",
    "exit code 0\n",
    "EXIT CODE -1",
    "Process finished. eXiT cOdE 3",
    "<returncode>7</returncode>",
    "status=4 and Status=5",
    "rc = 9",
    "DONE with 1",
    "42",
    "it failed (3)",
    "ex\u0130t code 5",  # non-ASCII: the folded literal is not tested, the pattern runs
    "\u212aEEP: exit code 6",
    "Exit code: ",
    "exot code 3",
    "status\twas 8",
]


def _plain_exit_code(roles: ToolRoles, text: str) -> int | None:
    """exit_code as it was: every pattern searched in order."""
    for pat in roles.exit_patterns:
        m = pat.search(text)
        if m:
            try:
                return int(m.group(1))
            except (IndexError, ValueError, TypeError):
                continue
    return None


@pytest.mark.parametrize("text", _EXIT_TEXTS)
def test_exit_code_reads_what_every_pattern_searched_in_order_reads(text: str) -> None:
    roles = toolroles._compile((), _EXIT_PATTERNS)
    assert roles.exit_code(text) == _plain_exit_code(roles, text)


def test_a_pattern_whose_literal_the_text_lacks_is_not_searched(monkeypatch: pytest.MonkeyPatch) -> None:
    searched: list[str] = []
    search = Pattern.search

    def counting(self: Pattern, text: str) -> Any:
        searched.append(self.pattern)
        return search(self, text)

    monkeypatch.setattr(Pattern, "search", counting)
    roles = toolroles._compile((), _EXIT_PATTERNS)
    assert roles.exit_code("file_1.txt\n" * 20) is None
    # The one without a top-level literal, and those whose literals re reads otherwise.
    assert searched == [r"^(\d+)$|failed \((\d+)\)", r"(?:exit){e<=1} code (\d+)", r"status[[:space:]]was (\d+)"]
    searched.clear()
    assert roles.exit_code("all done: EXIT CODE 3") == 3
    assert searched == [r"(?i)exit code (-?\d+)"]


# --- extract_terms: the regexes only on texts that can hold a term ----------------------------


def test_texts_without_a_dot_before_a_letter_or_a_slash_skip_the_regexes_they_cannot_match(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    regexes = {name: _Counting(getattr(compress_intent, name)) for name in ("_PATH_RE", "_BARE_FILE_RE", "_MODULE_RE")}
    for name, counting in regexes.items():
        monkeypatch.setattr(compress_intent, name, counting)
    compress_intent._TEXT_TERMS.clear()
    assert extract_terms("no dot and no slash here") == ([], [])
    assert extract_terms("Sentences end. With a dot... (and a space)./") == ([], [])
    assert sum(c.calls for c in regexes.values()) == 0
    # A dot without a slash: no path can be there, a bare file or a module can.
    assert extract_terms("edit setup.cfg, then ctxrules.stages is next.") == (["setup.cfg"], ["ctxrules.stages"])
    assert regexes["_PATH_RE"].calls == 0 and regexes["_BARE_FILE_RE"].calls == 1
    assert extract_terms("see src/x.py and a/b") == (["src/x.py"], [])
    assert regexes["_PATH_RE"].calls == 1
    compress_intent._TEXT_TERMS.clear()


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


# --- tool_output.filter: the sent digests carried as a set ------------------------------------

BIG = "".join(f"collecting item {i} ... ok\n" for i in range(3000))


def _grow(history: list[Msg], n: int, output: str = "ok") -> list[Msg]:
    return [*history, *step(f"t{n}", output)]


def test_the_sent_set_is_carried_while_state_holds_the_list_the_stage_left(tmp_path: Path) -> None:
    stage = ToolOutputFilter({"compressors": False})
    state: dict[str, Any] = {}
    history: list[Msg] = [{"role": "system", "content": "sys"}, user("fix it"), *step("a", BIG)]
    history = stage(history, make_ctx(tmp_path, state=state)).messages
    for n in range(4):
        history = _grow(history, n, BIG if n % 2 else "ok")
        ctx = make_ctx(tmp_path, state=state, cache_hot=True)
        before, keys = _Run(stage, history, ctx)._sent_before()
        assert before == set(state["sent"])
        memo = stage._last_sent.get(ctx.session_id)
        assert memo is not None and before is memo.members  # carried, not built again
        sent_results = [m for m in history if m["role"] == "tool" and result_digest(m) in before]
        assert keys == {m["tool_call_id"] for m in sent_results} and len(sent_results) == len(before)
        history = stage(history, ctx).messages
        assert stage._last_sent.get(ctx.session_id).members == set(state["sent"])  # type: ignore[union-attr]


@pytest.mark.parametrize("edit", ["drop", "add"])
def test_a_sent_list_put_in_state_by_someone_else_is_read_not_the_carried_set(tmp_path: Path, edit: str) -> None:
    """Another worker committed a turn: ``state['sent']`` is another list. The warm stage must
    decide by it, like a fresh stage given the same state, not by the set it carried."""
    first: list[Msg] = [{"role": "system", "content": "sys"}, user("fix it"), *step("a", BIG)]
    warm = ToolOutputFilter({"compressors": False})
    state: dict[str, Any] = {}
    # The big output is pinned (the newest step): left alone, and remembered as sent.
    first = warm(first, make_ctx(tmp_path, state=state)).messages
    sent = list(state["sent"])
    assert len(sent) == 1
    # Another worker's state: without that digest ("drop"), or this very list again as a new
    # object after a stage that had never seen it ("add", the carried set being emptied).
    ctx = make_ctx(tmp_path, state=state, cache_hot=True)
    if edit == "drop":
        state["sent"] = []
    else:
        state["sent"] = list(sent)
        warm._last_sent.get(ctx.session_id).members.clear()  # type: ignore[union-attr]
    history = _grow(first, 1)  # the big output is no longer pinned
    fresh_state = copy.deepcopy(state)
    got = warm(history, ctx)
    want = ToolOutputFilter({"compressors": False})(history, make_ctx(tmp_path, state=fresh_state, cache_hot=True))
    assert [a.kind for a in got.actions] == [a.kind for a in want.actions]
    assert [a.kind for a in got.actions] == (["reduce"] if edit == "drop" else ["hot_cache_bypass"])
    assert got.messages == want.messages and state == fresh_state


def test_a_new_result_whose_call_id_no_sent_result_has_is_not_digested(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stage = ToolOutputFilter({"compressors": False})
    state: dict[str, Any] = {}
    history: list[Msg] = [{"role": "system", "content": "sys"}, user("fix it"), *step("a", BIG)]
    history = stage(history, make_ctx(tmp_path, state=state)).messages
    digested: list[Msg] = []
    digest = tool_output_filter.result_digest

    def counting(msg: Msg) -> str:
        digested.append(msg)
        return digest(msg)

    monkeypatch.setattr(tool_output_filter, "result_digest", counting)
    history = _grow(_grow(history, 1), 2)  # "t1" is examined: new, no longer pinned
    stage(history, make_ctx(tmp_path, state=state, cache_hot=True))
    assert all(m.get("tool_call_id") != "t1" for m in digested)


def test_results_with_the_same_digest_seed_are_sent_alike_whatever_their_call_ids(tmp_path: Path) -> None:
    """The digest is taken of the call id, a separator and the content: a call id holding
    the separator gives another result's seed. Such a result is already sent, as a fresh
    stage says; the warm stage's look at the call ids first must not tell otherwise."""
    warm = ToolOutputFilter({"compressors": False})
    state: dict[str, Any] = {}
    history: list[Msg] = [{"role": "system", "content": "sys"}, user("fix it"), *step("a\x1fb", BIG)]
    history = warm(history, make_ctx(tmp_path, state=state)).messages  # pinned: remembered as sent
    history = [*history, *step("a", "b\x1f" + BIG), *step("last", "ok")]
    fresh_state = copy.deepcopy(state)
    got = warm(history, make_ctx(tmp_path, state=state, cache_hot=True))
    want = ToolOutputFilter({"compressors": False})(history, make_ctx(tmp_path, state=fresh_state, cache_hot=True))
    assert [(a.kind, a.detail) for a in got.actions] == [(a.kind, a.detail) for a in want.actions]
    assert [a.kind for a in got.actions] == ["hot_cache_bypass"] and "2 output(s)" in got.actions[0].detail
    assert got.messages == want.messages and state == fresh_state


def test_an_output_replaced_in_place_is_sent_under_its_own_call_id(tmp_path: Path) -> None:
    """A list that does not extend the last one (its newest step replaced by another) takes the
    sent memo's other path, which edits the memo where outputs changed: the new output's call
    id must join the keys, or the warm stage would take it for never sent."""
    warm = ToolOutputFilter({"compressors": False})
    state: dict[str, Any] = {}
    base: list[Msg] = [{"role": "system", "content": "sys"}, user("fix it")]
    warm([*base, *step("a", BIG)], make_ctx(tmp_path, state=state))
    replaced = [*base, *step("b", BIG + "one more line\n")]  # pinned: remembered as sent
    warm(replaced, make_ctx(tmp_path, state=state))
    memo = warm._last_sent.get("")
    assert memo is not None and "b" in memo.keys
    history = [*replaced, *step("last", "ok")]
    fresh_state = copy.deepcopy(state)
    got = warm(history, make_ctx(tmp_path, state=state, cache_hot=True))
    want = ToolOutputFilter({"compressors": False})(history, make_ctx(tmp_path, state=fresh_state, cache_hot=True))
    assert [a.kind for a in got.actions] == [a.kind for a in want.actions] == ["hot_cache_bypass"]
    assert got.messages == want.messages and state == fresh_state


# --- compress.intent: the carry goes on over messages the last turn changed in form only ------


def _marked(msg: Msg) -> Msg:
    """``msg`` as cache.markers hands it back with a breakpoint on it."""
    content = msg.get("content")
    if not isinstance(content, str):
        return dict(msg)
    return {**msg, "content": [{"type": "text", "text": content, "cache_control": {"type": "ephemeral"}}]}


def _edited(msg: Msg) -> Msg:
    """``msg`` with another text: what it mentions changes."""
    content = msg.get("content")
    text = content if isinstance(content, str) else ""
    return {**msg, "content": text.replace("src/app.py", "src/other.py") + " now see src/app.py"}


def _intent_session() -> list[Msg]:
    msgs: list[Msg] = [system(), intent_user("fix the crash in src/app.py and ctxrules.stages.base")]
    for k in range(14):
        name = "src/app.py" if k % 3 == 0 else f"lib/m{k}.py"
        msgs.append(
            {
                "role": "assistant",
                "content": f"Step {k}: reading the next file." if k % 2 else None,
                "tool_calls": [
                    {
                        "id": f"c{k}",
                        "type": "function",
                        "function": {"name": "Read", "arguments": f'{{"path": "{name}"}}'},
                    }
                ],
            }
        )
        out = "Error: exit code 1" if k % 5 == 4 else f"contents of {name}\n" + "x = 1\n" * 50
        msgs.append({"role": "tool", "tool_call_id": f"c{k}", "content": out})
    return msgs


def _protected_by(stage: IntentStage, messages: list[Msg], tmp_path: Path) -> tuple[Any, ...]:
    ctx = intent_ctx(tmp_path, window=400_000, session="s")
    ctx.session_id = "s"
    out = stage(messages, ctx)
    protected = sorted(i for i, m in enumerate(messages) if id(m) in ctx.protected)
    return protected, ctx.state, [a.as_dict() for a in out.actions]


@pytest.mark.parametrize("change", [_marked, _edited])
def test_intent_carried_over_alike_messages_equals_a_full_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: Any
) -> None:
    """Each turn's list is the last one with its newest two messages replaced (by copies with
    a cache breakpoint, or by copies saying something else) and a step appended. The stage that
    carries over must decide like a fresh one; over the breakpoint copies it does carry over."""
    history = _intent_session()
    warm = IntentStage({})
    starts: list[int] = []
    resume = Carry.resume

    def spying(self: Carry[Any], *args: Any, **kwargs: Any) -> Any:
        got = resume(self, *args, **kwargs)
        if self is warm._text_carry:
            starts.append(got[0])
        return got

    monkeypatch.setattr(Carry, "resume", spying)
    current = history[:6]
    for cut in range(8, len(history) + 1, 2):
        current = [*current[:-2], *map(change, current[-2:]), *history[len(current) : cut]]
        assert _protected_by(warm, current, tmp_path) == _protected_by(IntentStage({}), current, tmp_path)
    assert starts and (all(starts[1:]) if change is _marked else not any(starts))


# --- ctxrules.carry: resuming over alike messages --------------------------------------------


def test_a_carry_resumes_over_a_few_alike_objects_only(tmp_path: Path) -> None:
    msgs: list[Msg] = [{"role": "user", "content": f"m{i}"} for i in range(20)]
    carry: Carry[str] = Carry()
    carry.keep("s", msgs, "k", "value")
    grown = [*msgs, {"role": "user", "content": "new"}]

    def same_text(a: Any, b: Any) -> bool:
        return bool(a["content"] == b["content"])

    few = [{**m, "form": 1} if i in (3, 19) else m for i, m in enumerate(grown)]  # not equal: alike
    assert carry.resume("s", few, "k") == (0, None)  # without alike: other objects end it
    assert carry.resume("s", few, "k", alike=same_text) == (20, "value")
    changed = [{**m, "content": "x"} if i == 19 else m for i, m in enumerate(few)]
    assert carry.resume("s", changed, "k", alike=same_text) == (0, None)
    many = [{**m, "form": 1} for m in msgs[: ALIKE_EDITS + 1]] + grown[ALIKE_EDITS + 1 :]
    assert carry.resume("s", many, "k", alike=same_text) == (0, None)
    assert carry.resume("s", msgs[:10], "k", alike=same_text) == (0, None)  # shorter: no prefix
