"""``compress.dedup``, ``compress.truncate``, ``compress.remove`` and the anti-thrashing guard."""

from __future__ import annotations

import hashlib
import json
import types
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from compress_kit import (
    clone,
    conversation,
    expand,
    filler,
    make_ctx,
    recovers,
    restore,
    step,
    system,
    text_of,
    user,
)
from conftest import TRANSCRIPTS
from invariants import pairing_problems

from ctxrules.errors import PackError
from ctxrules.messages import is_injected, is_real_user
from ctxrules.pipeline.context import StageContext
from ctxrules.stages.base import StageOutcome, options_schema_for
from ctxrules.stages.compress_common import View, cut_text
from ctxrules.stages.compress_dedup import STAGE_TYPE as DEDUP
from ctxrules.stages.compress_dedup import Dedup, normalized_digest
from ctxrules.stages.compress_remove import STAGE_TYPE as REMOVE
from ctxrules.stages.compress_remove import Remove
from ctxrules.stages.compress_truncate import STAGE_TYPE as TRUNCATE
from ctxrules.stages.compress_truncate import Truncate
from ctxrules.structure import pinned_indices
from ctxrules.vault import parse_markers

Msg = dict[str, Any]
NO_GUARD = {"min_saving_ratio": 0.0}


def run(stage: Any, messages: list[Msg], ctx: StageContext) -> StageOutcome:
    before = clone(messages)
    out = stage(messages, ctx)
    assert messages == before, "the stage mutated its input"
    return out


def window_for(messages: list[Msg], tmp_path: Path, over: int, tier: str = "monitor") -> int:
    """A window whose ``tier`` threshold lies ``over`` tokens below the size of ``messages``."""
    probe = make_ctx(tmp_path)
    share = probe.budget.thresholds[tier]
    return int((probe.count(messages) - over) / share) + probe.budget.reserve_output


def changed(before: list[Msg], after: list[Msg]) -> list[int]:
    return [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a is not b]


# --- dedup --------------------------------------------------------------------------------------


def dup_history(copies: int = 4, lines: int = 80) -> list[Msg]:
    """The same `git status` output several times among distinct steps."""
    same = filler(lines, "status")
    out: list[Msg] = [system(), user("Clean up the repo.")]
    for n in range(copies):
        out += step(f"dup_{n}", same, command="git status")
        out += step(f"other_{n}", filler(lines, f"o{n}"), command=f"work {n}")
    out += step("last", "done")
    return out


def test_dedup_replaces_older_copies_and_names_the_newer(tmp_path: Path) -> None:
    msgs = dup_history()
    ctx = make_ctx(tmp_path, window=16_000, tail_budget=0.05)
    out = run(Dedup(NO_GUARD), msgs, ctx)
    idx = {m.get("tool_call_id"): i for i, m in enumerate(msgs)}
    newest = idx["dup_3"]
    assert out.messages[newest] is msgs[newest]
    replaced = [i for i in changed(msgs, out.messages)]
    assert replaced and set(replaced) <= {idx["dup_0"], idx["dup_1"], idx["dup_2"]}
    for i in replaced:
        (marker,) = parse_markers(text_of(out.messages[i]))
        assert marker.extra["duplicate_of"] == "dup_3"
        assert ctx.vault.get_text(marker.vault_id) == text_of(msgs[i])
        assert out.messages[i]["tool_call_id"] == msgs[i]["tool_call_id"]
    assert all(a.kind == "dedup" and a.vault_id and a.tokens_saved > 0 for a in out.actions)


def test_dedup_does_not_hash_the_same_messages_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A session at a compacting tier runs dedup over the same tool results on every turn; its
    digests are remembered per text, keyed by a sha256 of a long text, so each lookup hashed
    every long output whole again. The same message objects are now answered from the object,
    and an output given a new content is read again."""
    from ctxrules import text_memo

    msgs = dup_history(lines=400)
    assert max(len(text_of(m)) for m in msgs) > text_memo.SHORT_TEXT  # long texts, keyed by digest
    ctx = make_ctx(tmp_path, window=16_000, tail_budget=0.05)
    hashed: list[int] = []

    def counting(data: bytes = b"") -> Any:
        hashed.append(len(data))
        return hashlib.sha256(data)

    # The memo's own hashing only (the vault hashes what it stores too).
    monkeypatch.setattr(text_memo, "hashlib", types.SimpleNamespace(sha256=counting))
    first = run(Dedup(NO_GUARD), msgs, ctx)
    assert hashed  # the first run keys its long texts by digest
    hashed.clear()
    again = run(Dedup(NO_GUARD), msgs, ctx)
    assert hashed == []
    assert [text_of(m) for m in again.messages] == [text_of(m) for m in first.messages]
    i = next(i for i, m in enumerate(msgs) if m.get("tool_call_id") == "dup_0")
    msgs[i] = {**msgs[i], "content": text_of(msgs[i]).replace("status", "changed")}
    third = run(Dedup(NO_GUARD), msgs, ctx)
    assert len(hashed) == 1  # the one new text
    assert third.messages[i] is msgs[i]  # no longer a copy of the newer result


def test_dedup_matches_near_identical_outputs() -> None:
    a = "\x1b[32mPASSED\x1b[0m tests/x.py  \n\n2024-05-01T10:00:01Z done in 0.53s\n"
    b = "PASSED tests/x.py\n2024-06-11T22:13:09Z done in 1.2s"
    assert normalized_digest(a) == normalized_digest(b)
    assert normalized_digest(a, normalize=False) != normalized_digest(b, normalize=False)
    assert normalized_digest("3 passed") != normalized_digest("2 passed")


def test_dedup_leaves_small_outputs_and_exact_mode(tmp_path: Path) -> None:
    msgs = dup_history(lines=3)
    out = run(Dedup({**NO_GUARD, "min_tokens": 100}), msgs, make_ctx(tmp_path, window=9000))
    assert changed(msgs, out.messages) == []


def test_dedup_skips_protected_critical_and_tail(tmp_path: Path) -> None:
    msgs = dup_history()
    idx = {m.get("tool_call_id"): i for i, m in enumerate(msgs)}
    # dup_1 is answered by another tool, which a priority rule makes critical.
    a1 = idx["dup_1"] - 1
    msgs[a1] = {
        **msgs[a1],
        "tool_calls": [{**msgs[a1]["tool_calls"][0], "function": {"name": "Shell2", "arguments": "{}"}}],
    }
    critical = [{"id": "c", "match": {"tool": "Shell2"}, "priority": "critical"}]
    ctx = make_ctx(tmp_path, window=16_000, tail_budget=0.02, protected=[id(msgs[idx["dup_0"]])])
    ctx.pack["priorities"] = critical
    out = run(Dedup(NO_GUARD), msgs, ctx)
    assert changed(msgs, out.messages) == [idx["dup_2"]]
    # A tail that reaches back to dup_2's step keeps it too.
    counts = ctx.counter.count_each(msgs)
    share = (sum(counts[idx["dup_2"] - 1 :]) + 10) / ctx.budget.usable
    ctx = make_ctx(tmp_path, window=16_000, tail_budget=share, protected=[id(msgs[idx["dup_0"]])])
    ctx.pack["priorities"] = critical
    assert View.build(msgs, ctx).tail_start == idx["dup_2"] - 1
    out = run(Dedup(NO_GUARD), msgs, ctx)
    assert changed(msgs, out.messages) == []


def test_dedup_stops_below_target(tmp_path: Path) -> None:
    msgs = dup_history(copies=8)
    ctx = make_ctx(tmp_path, window=54_000, tail_budget=0.02)  # ~3 copies must go
    out = run(Dedup(NO_GUARD), msgs, ctx)
    done = changed(msgs, out.messages)
    assert 0 < len(done) < 7
    assert ctx.below(out.messages, "monitor")
    # One fewer replacement would not have been enough.
    undo = list(out.messages)
    undo[done[-1]] = msgs[done[-1]]
    assert not ctx.below(undo, "monitor")


# --- truncate -----------------------------------------------------------------------------------


def test_truncate_keeps_head_and_tail_and_the_vault_gives_the_middle_back(tmp_path: Path) -> None:
    msgs = conversation(14, lines=120)
    ctx = make_ctx(tmp_path, window=64_000, tail_budget=0.05)
    out = run(Truncate(NO_GUARD), msgs, ctx)
    done = changed(msgs, out.messages)
    assert done
    for i in done:
        old, new = text_of(msgs[i]), text_of(out.messages[i])
        (marker,) = parse_markers(new)
        assert marker.kind == "lines" and marker.lines is not None
        first, last = marker.lines
        assert new.startswith(old.splitlines(keepends=True)[0])
        assert new.endswith(old.splitlines(keepends=True)[-1])
        assert restore(new, ctx.vault) == old
        assert ctx.counter.count_text(new) < 700
        assert last - first + 1 == marker.count
    assert ctx.below(out.messages, "monitor")


def test_truncate_cuts_one_long_line_by_characters(tmp_path: Path) -> None:
    rows = [{"id": i, "name": f"item-{i}", "tags": ["a", "b"]} for i in range(600)]
    blob = json.dumps({"rows": rows})
    msgs = [system(), user("dump it"), *step("c1", blob), *step("c2", "ok"), user("next")]
    ctx = make_ctx(tmp_path, window=16_000, tail_budget=0.01)
    out = run(Truncate(NO_GUARD), msgs, ctx)
    new = text_of(out.messages[3])
    (marker,) = parse_markers(new)
    assert marker.kind == "tokens" and marker.lines is None
    a, b = (int(x) for x in marker.extra["chars"].split("-"))
    assert ctx.vault.get_text(marker.vault_id) == blob
    assert new.startswith(blob[: a - 1]) and new.endswith(blob[b:])
    assert recovers(blob, new, ctx.vault)


def test_truncate_shortens_tool_call_arguments_and_keeps_them_json(tmp_path: Path) -> None:
    content = filler(300, "file")
    msgs = [
        system(),
        user("write it"),
        *step("w1", "File created", name="Write", file_path="src/big.py", content=content),
        *step("c2", "ok"),
        user("thanks"),
    ]
    ctx = make_ctx(tmp_path, window=16_000, tail_budget=0.01)
    out = run(Truncate(NO_GUARD), msgs, ctx)
    call = out.messages[2]["tool_calls"][0]
    args = json.loads(call["function"]["arguments"])
    assert args["file_path"] == "src/big.py"
    assert args["content"] != content and restore(args["content"], ctx.vault) == content
    assert call["id"] == "w1"
    assert pairing_problems(out.messages) == []


def test_truncate_standard_before_important(tmp_path: Path) -> None:
    msgs = [
        system(),
        user("go"),
        *step("old", filler(200, "old")),
        *step("new", filler(200, "new")),
        *step("tail", "ok"),
    ]
    ctx = make_ctx(tmp_path, window=window_for(msgs, tmp_path, 1500), tail_budget=0.01)
    ctx.pack["priorities"] = [
        {"id": "i", "match": {"contains": "new: line"}, "priority": "important"},
        {"id": "s", "match": {}, "priority": "standard"},
    ]
    out = run(Truncate(NO_GUARD), msgs, ctx)
    assert changed(msgs, out.messages) == [3]


def test_truncate_never_touches_pinned_protected_critical_or_tail(tmp_path: Path) -> None:
    msgs = [
        system(filler(150, "sys")),
        user(filler(150, "anchor")),
        *step("p", filler(150, "prot")),
        *step("c", filler(150, "crit") + "CRITICAL"),
        *step("t1", filler(150, "tail")),
        user(filler(150, "latest")),
        *step("n", filler(150, "newest")),
    ]
    probe = make_ctx(tmp_path, window=40_000)
    share = (sum(probe.counter.count_each(msgs[6:])) + 10) / probe.budget.usable
    ctx = make_ctx(tmp_path, window=40_000, tail_budget=share, protected=[id(msgs[3])])
    ctx.pack["priorities"] = [{"id": "c", "match": {"contains": "CRITICAL"}, "priority": "critical"}]
    assert not ctx.below(msgs, "monitor")
    view = View.build(msgs, ctx)
    assert view.tail_start == 6
    out = run(Truncate(NO_GUARD), msgs, ctx)
    assert changed(msgs, out.messages) == [], "only the assistant messages (short) were eligible"
    assert out.actions and out.actions[0].kind == "ineffective"


def test_truncate_is_idempotent_on_its_output(tmp_path: Path) -> None:
    msgs = conversation(14, lines=120)
    ctx = make_ctx(tmp_path, window=64_000, tail_budget=0.05)
    first = run(Truncate(NO_GUARD), msgs, ctx).messages
    again = run(Truncate(NO_GUARD), first, make_ctx(tmp_path, window=64_000, tail_budget=0.05))
    assert again.messages == first and changed(first, again.messages) == []


def test_truncate_options_are_checked() -> None:
    with pytest.raises(PackError, match=r"compress\.truncate: .* must be below max_tokens"):
        Truncate({"max_tokens": 400, "head_tokens": 300, "tail_tokens": 200})


def test_cut_text_reports_nothing_to_gain_for_short_text() -> None:
    assert cut_text("short\n" * 10, 300, 200, 4.0) is None


# --- remove -------------------------------------------------------------------------------------


def test_remove_drops_whole_steps_oldest_first_with_one_placeholder(tmp_path: Path) -> None:
    msgs = conversation(24, lines=60)
    ctx = make_ctx(tmp_path, window=32_000, target="light")
    out = run(Remove(NO_GUARD), msgs, ctx)
    new = out.messages
    assert pairing_problems(new) == []
    placeholders = [m for m in new if is_injected(m)]
    assert len(placeholders) == 1 and placeholders[0]["role"] == "user"
    assert not is_real_user(placeholders[0])
    assert new[:2] == msgs[:2] and new[2] is placeholders[0]
    assert expand(new, ctx.vault) == msgs
    assert ctx.below(new, "light")
    # Hysteresis: one step fewer would not have been enough.
    assert len(out.actions) == 1 and out.actions[0].kind == "remove"
    removed_steps = (len(msgs) - (len(new) - 1)) // 2
    kept_one_more = [*msgs[:2], placeholders[0], *msgs[2 + 2 * (removed_steps - 1) :]]
    assert not ctx.below(kept_one_more, "light")


def test_remove_keeps_pins_tail_protected_and_critical_steps(tmp_path: Path) -> None:
    msgs = conversation(24, lines=60)
    protected_step = msgs[6]  # the assistant message of step 2
    ctx = make_ctx(tmp_path, window=32_000, target="monitor", protected=[id(protected_step)])
    ctx.pack["priorities"] = [
        {"id": "c", "match": {"contains": "s4: line"}, "priority": "critical"},
        {"id": "r", "match": {}, "priority": "standard"},
    ]
    view = View.build(msgs, ctx)
    out = run(Remove(NO_GUARD), msgs, ctx)
    new = out.messages
    assert pairing_problems(new) == []
    assert protected_step in new and msgs[7] in new  # protected step, whole
    assert msgs[11] in new and msgs[10] in new  # critical result and its call
    for i in pinned_indices(msgs):
        assert msgs[i] in new
    for m in msgs[view.tail_start :]:
        assert m in new
    # Kept steps split the removed ones into separate runs.
    assert sum(1 for m in new if is_injected(m)) == 3
    assert expand(new, ctx.vault) == msgs


def test_remove_merges_a_neighbouring_placeholder_into_one_flat_run(tmp_path: Path) -> None:
    msgs = conversation(30, lines=60)
    first = run(Remove(NO_GUARD), msgs, make_ctx(tmp_path, window=40_000, target="light")).messages
    grown = [*first, *[m for n in range(30, 36) for m in step(f"x{n}", filler(60, f"x{n}"))]]
    ctx = make_ctx(tmp_path, window=40_000, target="monitor")
    second = run(Remove(NO_GUARD), grown, ctx).messages
    placeholders = [m for m in second if is_injected(m)]
    assert len(placeholders) == 1
    (marker,) = [mk for mk in parse_markers(text_of(placeholders[0])) if mk.kind == "message"]
    stored = json.loads(ctx.vault.get_text(marker.vault_id))
    assert not any(is_injected(m) for m in stored), "earlier placeholder was flattened"
    assert expand(second, ctx.vault) == [*msgs, *grown[len(first) :]]


def test_remove_in_one_long_autonomous_exchange(tmp_path: Path) -> None:
    """One user message, 200 steps: older steps of the current exchange go like any others."""
    msgs = conversation(200, lines=8)
    ctx = make_ctx(tmp_path, window=32_000, target="light")
    assert ctx.budget.utilization(ctx.count(msgs)) > 0.7
    out = run(Remove(NO_GUARD), msgs, ctx)
    assert ctx.below(out.messages, "light")
    assert out.messages[1] is msgs[1] and out.messages[-2:] == msgs[-2:]
    assert expand(out.messages, ctx.vault) == msgs


def test_remove_placeholder_role_keeps_alternation(tmp_path: Path) -> None:
    """Between a tool result (or the user message) and the next assistant message a user-role
    placeholder merges into that user turn and keeps user/assistant alternation."""
    msgs = conversation(24, lines=60)
    ctx = make_ctx(tmp_path, window=32_000, target="light")
    new = run(Remove(NO_GUARD), msgs, ctx).messages
    for i, m in enumerate(new):
        if is_injected(m):
            assert new[i - 1]["role"] in ("user", "tool")
            assert new[i + 1]["role"] == "assistant"


def test_remove_leaves_the_summary_to_its_stage(tmp_path: Path) -> None:
    """The summary is an assistant message, so a step of its own, but the summary stage owns it
    (re-renders and merges it): the regular removal takes real steps and leaves it in place,
    as it does the notes and its own placeholders; only the emergency pass may take it. It
    once went first (the oldest step), so the turn after a compaction that ended at ``full``
    put a ``removed`` placeholder in the summary's place."""
    from ctxrules.messages import injected_kind, mark_injected

    msgs = conversation(24, lines=60)
    summary = mark_injected(
        {"role": "assistant", "content": "User goal: fix the build.\n" + filler(40, "sum")}, "summary"
    )
    msgs[2:2] = [summary, user("continue")]
    ctx = make_ctx(tmp_path, window=32_000, target="light")
    new = run(Remove(NO_GUARD), msgs, ctx).messages
    assert ctx.below(new, "light")
    assert summary in new
    assert [injected_kind(m) for m in new if is_injected(m)] == ["summary", "removed"]
    assert pairing_problems(new) == []


# --- guard --------------------------------------------------------------------------------------


def test_guard_skips_small_cycles_counts_them_and_warns(tmp_path: Path) -> None:
    msgs = dup_history(copies=2, lines=20)
    state: dict[str, Any] = {}
    stage = Dedup({"min_saving_tokens": 5000, "warn_after": 2})
    for n in (1, 2):
        out = run(stage, msgs, make_ctx(tmp_path, window=9000, state=state, tail_budget=0.01))
        assert changed(msgs, out.messages) == []
        assert out.actions[0].kind == "ineffective"
        assert "less than the minimum of 5000" in out.actions[0].detail
        assert state["ineffective_streak"] == n
        assert bool(out.warnings) == (n == 2)
    out = run(Dedup(NO_GUARD), msgs, make_ctx(tmp_path, window=9000, state=state, tail_budget=0.01))
    assert changed(msgs, out.messages) and state["ineffective_streak"] == 0
    assert state["ineffective_total"] == 2 and state["effective_total"] == 1


def test_guard_ratio_scales_with_the_window(tmp_path: Path) -> None:
    msgs = dup_history(copies=2, lines=20)
    window = window_for(msgs, tmp_path, 100)
    out = run(Dedup({"min_saving_ratio": 0.2}), msgs, make_ctx(tmp_path, window=window, tail_budget=0.01))
    assert changed(msgs, out.messages) == [] and out.actions[0].kind == "ineffective"
    out = run(Dedup({"min_saving_ratio": 0.02}), msgs, make_ctx(tmp_path, window=window, tail_budget=0.01))
    assert changed(msgs, out.messages) == [3]


# --- schemas ------------------------------------------------------------------------------------


@pytest.mark.parametrize("stage_type", [DEDUP, TRUNCATE, REMOVE], ids=lambda s: s.name)
def test_option_schema_documents_every_option(stage_type: Any) -> None:
    schema = options_schema_for(stage_type)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert stage_type.hysteresis and "target" in schema["properties"]
    for name, prop in schema["properties"].items():
        assert prop.get("title") and prop.get("description"), name
    defaults = {k: v["default"] for k, v in schema["properties"].items() if "default" in v}
    jsonschema.validate(defaults, schema)
    stage_type.factory(defaults)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"no_such_option": 1}, schema)


# --- golden on real transcripts -----------------------------------------------------------------


@pytest.mark.corpus
def test_golden_dedup_on_openhands_transcript(tmp_path: Path) -> None:
    msgs = json.loads((TRANSCRIPTS / "openhands-ponylang__ponyc-4595.json").read_text())
    ctx = make_ctx(tmp_path, window=32_000, tail_budget=0.01)
    out = run(Dedup(NO_GUARD), msgs, ctx)
    done = changed(msgs, out.messages)
    assert done
    # Independently: each replaced result has an identical/near-identical newer tool result.
    for i in done:
        later = [
            j
            for j in range(i + 1, len(msgs))
            if msgs[j]["role"] == "tool" and normalized_digest(text_of(msgs[j])) == normalized_digest(text_of(msgs[i]))
        ]
        assert later
        (marker,) = parse_markers(text_of(out.messages[i]))
        assert marker.extra["duplicate_of"] == msgs[later[-1]]["tool_call_id"]
        assert ctx.vault.get_text(marker.vault_id) == text_of(msgs[i])
    assert sum(a.tokens_saved for a in out.actions) == ctx.count(msgs) - ctx.count(out.messages)


@pytest.mark.corpus
def test_golden_remove_on_the_largest_claude_code_transcript(tmp_path: Path) -> None:
    msgs = json.loads((TRANSCRIPTS / "claudecode-ae4a77f8.json").read_text())
    ctx = make_ctx(tmp_path, window=128_000, target="light")
    view = View.build(msgs, ctx)
    out = run(Remove(NO_GUARD), msgs, ctx)
    assert ctx.below(out.messages, "light")
    assert pairing_problems(out.messages) == []
    assert expand(out.messages, ctx.vault) == msgs
    kept = {id(m) for m in out.messages}
    assert all(id(m) in kept for m in msgs[view.tail_start :])
    assert all(id(msgs[i]) in kept for i in pinned_indices(msgs))
    assert all(id(m) in kept for m in msgs if is_real_user(m))


@pytest.mark.corpus
def test_golden_truncate_on_claude_code_texts_and_arguments(tmp_path: Path) -> None:
    msgs = json.loads((TRANSCRIPTS / "claudecode-ae4a77f8.json").read_text())
    ctx = make_ctx(tmp_path, window=64_000, tail_budget=0.05)
    out = run(Truncate(NO_GUARD), msgs, ctx)
    done = changed(msgs, out.messages)
    cut_args = 0
    for i in done:
        old, new = msgs[i], out.messages[i]
        assert recovers(text_of(old), text_of(new), ctx.vault), i
        for a, b in zip(old.get("tool_calls") or [], new.get("tool_calls") or [], strict=True):
            before = json.loads(a["function"]["arguments"])
            after = json.loads(b["function"]["arguments"])
            assert before.keys() == after.keys()
            for key, value in before.items():
                if value != after[key]:
                    cut_args += 1
                    assert restore(after[key], ctx.vault) == value, (i, key)
    assert cut_args > 0, "Write/Edit arguments are cut too"
    assert sum(a.tokens_saved for a in out.actions) == ctx.count(msgs) - ctx.count(out.messages)
    assert pairing_problems(out.messages) == []


def test_a_placeholder_restores_its_run_only_while_the_vault_holds_it(tmp_path: Path) -> None:
    """Within one prepare (json_stream.serialise_once) a run just moved out is handed back as it
    was made, but only from a vault that holds it (a removed entry restores nothing, as a read
    of the vault would); after the prepare it is read back from the vault."""
    from ctxrules.json_stream import serialise_once
    from ctxrules.stages.compress_common import make_placeholder, restore_placeholder
    from ctxrules.vault import Vault

    run = [{"role": "assistant", "content": "step one"}, {"role": "user", "content": "ok"}]
    vault = Vault(tmp_path / "vault")
    with serialise_once():
        placeholder, payload = make_placeholder(run, vault=None)
        assert restore_placeholder(placeholder, vault) is None  # not stored in this vault
        vault_id = vault.put_text(payload)
        assert restore_placeholder(placeholder, vault) == run
        assert restore_placeholder(placeholder, Vault(tmp_path / "other")) is None
    run[0]["content"] = "edited later"  # after the prepare: the vault's copy counts
    assert restore_placeholder(placeholder, vault) == json.loads(payload)
    assert json.loads(payload)[0]["content"] == "step one"
    (vault.root / vault_id[:2] / vault_id).unlink()
    assert restore_placeholder(placeholder, vault) is None
