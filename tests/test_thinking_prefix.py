"""Signed thinking and the prefix it covers, through ``Session.prepare(..., format="anthropic")``.

For models that keep earlier turns' thinking, a signature covers everything before it. With
``thinking.clean``'s ``preserved_thinking: drop`` (the default), a signed block whose prefix a
compaction changed must be gone from the output of *that same call* (not only of the next one),
and the latest assistant turn's thinking is returned byte-exact; with ``pin``, nothing before
the newest signed block changes at all. Checked on a small hand-built request and on a real
corpus transcript converted to Anthropic form by the codec.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import transcript_path
from session_kit import keyed_state_root

from ctxrules import Engine
from ctxrules.formats import anthropic as A

MODEL = "claude-sonnet-4-5"
HEAD = "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: thinking-mode, version: 1.0.0}\n"


def _plain(value: Any) -> Any:
    """``value`` without ``cache_control`` (cache.markers moves breakpoints on every call:
    not a change of the prefix)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _canon(value: Any) -> str:
    return json.dumps(_plain(value), sort_keys=True, ensure_ascii=False)


def _signed(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    if message.get("role") != "assistant" or not isinstance(content, list):
        return []
    return [b for b in content if b.get("type") in ("thinking", "redacted_thinking")]


def _signature(block: dict[str, Any]) -> str:
    return str(block.get("signature") or block.get("data"))


def _last_assistant(body: dict[str, Any]) -> int:
    return max(i for i, m in enumerate(body["messages"]) if m["role"] == "assistant")


def changed_prefixes(body: dict[str, Any], request: dict[str, Any], *, but_latest: bool) -> list[str]:
    """Signed thinking blocks of ``body`` whose preceding prefix (system, tools, the messages
    before the block, the blocks before it in its turn) differs from the one they had in
    ``request``; with ``but_latest``, the latest assistant turn's blocks are not counted."""
    where: dict[str, tuple[int, int]] = {}
    for i, message in enumerate(request["messages"]):
        for block in _signed(message):
            where[_signature(block)] = (i, message["content"].index(block))
    latest = _last_assistant(body)
    found = []
    for i, message in enumerate(body["messages"]):
        if but_latest and i == latest:
            continue
        for block in _signed(message):
            at, pos = where[_signature(block)]
            before = (
                body.get("system"),
                body.get("tools"),
                body["messages"][:i],
                message["content"][: message["content"].index(block)],
            )
            was = (
                request.get("system"),
                request.get("tools"),
                request["messages"][:at],
                request["messages"][at]["content"][:pos],
            )
            if _canon(before) != _canon(was):
                found.append(f"messages[{i}] keeps {_signature(block)} after a changed prefix")
    return found


def latest_thinking_exact(body: dict[str, Any], request: dict[str, Any]) -> bool:
    want = [json.dumps(b, sort_keys=True) for b in _signed(request["messages"][_last_assistant(request)])]
    got = [json.dumps(b, sort_keys=True) for b in _signed(body["messages"][_last_assistant(body)])]
    return bool(want) and got == want


def _engine(tmp_path: Path, mode: str) -> Engine:
    pack = tmp_path / f"{mode}.yaml"
    pack.write_text(
        HEAD + f"extends: [builtin:default]\npipeline:\n  - {{id: thinking, with: {{preserved_thinking: {mode}}}}}\n"
    )
    return Engine.load(pack)


def _think(n: int) -> dict[str, Any]:
    return {"type": "thinking", "thinking": f"plan for step {n}: read the next file", "signature": f"sig-{n}"}


def small_request(steps: int = 12, lines: int = 900, signed: int | None = None) -> dict[str, Any]:
    """A tool loop of ``steps`` turns, each reading a long file (``lines`` x 2 lines); the
    first ``signed`` of them (default: all) carry signed thinking. It ends with the last tool
    result, so the latest assistant turn is the one whose thinking must come back."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Read every module and tell me what calls parse()."}]
    for n in range(steps):
        use = {"type": "tool_use", "id": f"toolu_{n:02d}", "name": "Bash", "input": {"command": f"cat src/mod{n}.py"}}
        thinking = [_think(n)] if signed is None or n < signed else []
        messages.append(
            {"role": "assistant", "content": [*thinking, {"type": "text", "text": f"Reading mod{n}."}, use]}
        )
        body = "\n".join(f"def f{n}_{i}(x):  # line {i} of mod{n}\n    return parse(x) + {i}" for i in range(lines))
        messages.append(
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": body}]}
        )
    return {"model": MODEL, "max_tokens": 4096, "system": "You are a careful coding agent.", "messages": messages}


def _stripped(result: Any) -> list[dict[str, Any]]:
    return [a for s in result.report["stages"] for a in s["actions"] if a["kind"] == "thinking_stripped"]


def test_drop_strips_thinking_whose_prefix_this_call_changed(tmp_path: Path) -> None:
    request = small_request()
    session = _engine(tmp_path, "drop").session(tmp_path / "s", model=MODEL, window=60_000)
    result = session.prepare(request, format="anthropic")
    # tool_output_filter and compress.truncate change tool results between the signed turns.
    assert result.report["before"]["tokens"] > 60_000 > result.report["after"]["tokens"], result.report["after"]
    assert A.validate(result.body, original=request) == []
    assert changed_prefixes(result.body, request, but_latest=True) == []
    assert latest_thinking_exact(result.body, request)
    stripped = _stripped(result)
    assert stripped, "the compaction changed prefixes, so some thinking had to go"
    # Nothing of it was lost: the stripped thinking is in the vault, behind a marker.
    kept = {_signature(b) for m in result.body["messages"] for b in _signed(m)}
    gone = {f"sig-{n}" for n in range(12)} - kept
    vaulted = "".join(session.vault.get_text(a["vault_id"]) for a in stripped)
    assert gone and all(g in vaulted for g in gone)
    assert "sig-0" in kept, "the first turn's prefix (the user's request) did not change: its thinking stays"
    # The next call (the output plus a new turn) keeps the same rule.
    follow = {**result.body, "messages": [*result.body["messages"], {"role": "assistant", "content": "Done."}]}
    follow["messages"].append({"role": "user", "content": "Thanks. Now summarise."})
    again = session.prepare(follow, format="anthropic")
    assert changed_prefixes(again.body, follow, but_latest=True) == []


def test_pin_keeps_everything_before_the_newest_signed_thinking(tmp_path: Path) -> None:
    """The first six turns are signed: they and their results stay as they are, the rest is
    compacted."""
    request = small_request(lines=300, signed=6)
    result = (
        _engine(tmp_path, "pin")
        .session(tmp_path / "s", model=MODEL, window=60_000)
        .prepare(request, format="anthropic")
    )
    assert result.report["after"]["tokens"] < result.report["before"]["tokens"], "what follows was compacted"
    assert A.validate(result.body, original=request, preserved_thinking=True) == []
    assert changed_prefixes(result.body, request, but_latest=False) == []
    newest = 1 + 2 * 5  # the sixth assistant turn
    assert _canon(result.body["messages"][: newest + 1]) == _canon(request["messages"][: newest + 1])
    assert _stripped(result) == []


def test_pin_that_cannot_hold_still_keeps_no_stale_signature(tmp_path: Path) -> None:
    """Every turn signed and far over the window: even the pinned part does not fit, so the
    emergency pass spills pinned tool results; the thinking after them goes, the latest
    turn's stays byte-exact."""
    request = small_request()
    result = (
        _engine(tmp_path, "pin")
        .session(tmp_path / "s", model=MODEL, window=60_000)
        .prepare(request, format="anthropic")
    )
    assert result.report["after"]["tokens"] < 60_000
    assert changed_prefixes(result.body, request, but_latest=True) == []
    assert latest_thinking_exact(result.body, request)


def _corpus_request(every: int, latest: bool, until: float = 1.0) -> dict[str, Any]:
    path = transcript_path("claudecode-ae4a77f8.json")
    history = json.loads(path.read_text(encoding="utf-8"))
    assistants = [i for i, m in enumerate(history) if m["role"] == "assistant"]
    chosen = assistants[: int(len(assistants) * until) : every] + ([assistants[-1]] if latest else [])
    for n, i in enumerate(chosen):
        history[i] = {**history[i], "thinking_blocks": [_think(1000 + n)]}
    return A.encode(history, None, {"model": MODEL, "max_tokens": 4096})


@pytest.mark.corpus
def test_a_real_transcript_in_drop_mode_keeps_no_thinking_after_a_changed_prefix(tmp_path: Path) -> None:
    request = _corpus_request(every=15, latest=True)
    session = _engine(tmp_path, "drop").session(tmp_path / "s", model=MODEL, window=64_000)
    result = session.prepare(request, format="anthropic")
    assert result.report["before"]["tokens"] > 100_000 and result.report["after"]["fits"]
    assert A.validate(result.body, original=request) == []
    assert changed_prefixes(result.body, request, but_latest=True) == []
    assert latest_thinking_exact(result.body, request)
    assert _stripped(result), "compaction changed prefixes before signed turns"
    again = session.prepare(result.body, format="anthropic")
    assert changed_prefixes(again.body, result.body, but_latest=True) == []


@pytest.mark.corpus
def test_a_real_transcript_in_pin_mode_keeps_the_signed_prefix(tmp_path: Path) -> None:
    """Signed thinking in the first fifth of the session: everything up to the newest such
    turn is kept as it is, the rest is compacted to fit."""
    request = _corpus_request(every=10, latest=False, until=0.2)
    session = _engine(tmp_path, "pin").session(tmp_path / "s", model=MODEL, window=64_000)
    result = session.prepare(request, format="anthropic")
    assert result.report["after"]["fits"] and result.report["after"]["tokens"] < result.report["before"]["tokens"]
    assert A.validate(result.body, original=request, preserved_thinking=True) == []
    assert changed_prefixes(result.body, request, but_latest=False) == []
    assert _stripped(result) == []


def _thinking_history(every: int, duplicate_every: int) -> list[dict[str, Any]]:
    """The corpus transcript with signed thinking on every ``every``-th assistant message, and
    on every ``duplicate_every``-th of those litellm's ``reasoning_content`` copy of it."""
    history = json.loads(transcript_path("claudecode-ae4a77f8.json").read_text(encoding="utf-8"))
    assistants = [i for i, m in enumerate(history) if m["role"] == "assistant"]
    for n, i in enumerate(assistants[::every]):
        block = _think(2000 + n)
        extra: dict[str, Any] = {"thinking_blocks": [block]}
        if n % duplicate_every == 0:
            extra["reasoning_content"] = block["thinking"]
        history[i] = {**history[i], **extra}
    return history


@pytest.mark.corpus
@pytest.mark.parametrize("window", [400_000, 48_000])
def test_thinking_read_turn_after_turn_equals_a_session_that_carries_nothing(tmp_path: Path, window: int) -> None:
    """thinking.clean reads each message of a session once (signatures, repeated reasoning,
    prefix digests) and carries that from turn to turn, also over cache breakpoints that
    moved. Every turn of a growing session must get what the same turns get through a new
    engine each, which has nothing in memory to carry (it reads the session back)."""
    history = _thinking_history(every=3, duplicate_every=2)
    cuts = [i + 1 for i in range(200, len(history)) if i + 1 == len(history) or history[i + 1]["role"] != "tool"]
    root = keyed_state_root(tmp_path, "test_thinking_prefix")

    def session(folder: str) -> Any:  # one session id: it is the prompt-cache key the output carries
        return _engine(tmp_path, "drop").session(
            root / folder, model=MODEL, window=window, state_root=root, session_id="s"
        )

    # The warm turns first: a session's first turn forgets what the process remembers per
    # message object (another session may have seen them edited), so a reference turn run
    # between two warm ones would leave them nothing to carry.
    warm = session("warm")
    turns = [(1_760_000_000.0 + 20 * turn, upto) for turn, upto in enumerate(cuts[::2])]
    got = []
    for clock, upto in turns:
        result = warm.prepare(history[:upto], clock=clock)
        state = json.loads((root / "warm" / "state.json").read_text())["stages"]["thinking"]
        got.append((result, state))
    kinds: set[str] = set()
    reused = 0
    for turn, ((clock, upto), (mine, state)) in enumerate(zip(turns, got, strict=True)):
        want = session("reference").prepare(history[:upto], clock=clock)
        assert (mine.messages, mine.tools, mine.request) == (want.messages, want.tools, want.request), f"turn {turn}"
        ours = [s for s in mine.report["stages"] if s["id"] == "thinking"]
        theirs = [s for s in want.report["stages"] if s["id"] == "thinking"]
        assert [(s["ran"], s["tokens_after"]) for s in ours] == [(s["ran"], s["tokens_after"]) for s in theirs]
        assert state == json.loads((root / "reference" / "state.json").read_text())["stages"]["thinking"]
        kinds.update(a["kind"] for s in ours for a in s["actions"])
        reused += mine.report["reused_messages"] > 0
    assert reused >= len(turns) - 2, "the turns did not reuse the last one: nothing was carried"
    assert "reasoning_duplicate_dropped" in kinds, "no repeated reasoning dropped: the case tests less than it says"
    if window < 100_000:
        assert "thinking_stripped" in kinds, "no prefix changed: the case tests less than it says"
