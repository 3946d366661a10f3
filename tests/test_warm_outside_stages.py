"""What a warm turn remembers outside the stages, and that each memo gives way when it must:
the budget status (ledgers, sub-agents, the day, the burn window, turn_from), the report's
budget section, the compacting stages per tier across a pack reload, the scopes entered
around a prepare, and the state file written through the handle the turn's load looked at."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ctxrules import Engine
from ctxrules.budget.policy import BudgetPolicy
from ctxrules.budget.tracker import SessionLedger
from ctxrules.budget.usage import TokenUsage
from ctxrules.injected import current_key, key_scope
from ctxrules.json_stream import dumps_once, json_text, json_text_sorted, serialise_once
from ctxrules.session_store import SessionStore
from ctxrules.stores.memory import MemoryStore
from ctxrules.tokens import token_ceiling, trusted_objects

T0 = 1_700_000_000.0
HOUR = 3600.0


def _ledger(tmp_path: Path, name: str = "s1", **kw: Any) -> SessionLedger:
    return SessionLedger(tmp_path / "state" / name, name, model="gpt-4o", **kw)


def _usage(prompt: int = 1000) -> TokenUsage:
    return TokenUsage.of(prompt=prompt, completion=10)


# --- the budget status memo ------------------------------------------------------------------


def test_an_unchanged_ledger_gives_the_same_status_without_summing_again(tmp_path: Path) -> None:
    s = _ledger(tmp_path)
    s.record(_usage(), at=T0)
    first = s.status(T0 + 2 * HOUR)  # the call is outside the burn window: nothing depends on the time
    assert first.totals.calls == 1
    assert s.status(T0 + 2 * HOUR + 5) is first
    assert s.status(T0 + 3 * HOUR) is first


def test_a_call_another_writer_records_is_seen_by_the_next_status(tmp_path: Path) -> None:
    s = _ledger(tmp_path)
    s.record(_usage(), at=T0)
    first = s.status(T0 + 2 * HOUR)
    other = _ledger(tmp_path)  # another process on the same session directory
    other.record(_usage(5), at=T0 + 10)
    second = s.status(T0 + 2 * HOUR + 1)
    assert second is not first and second.totals.calls == 2 and second.own_calls == 2


def test_a_recent_call_is_never_answered_from_the_memo(tmp_path: Path) -> None:
    s = _ledger(tmp_path)
    s.record(_usage(), at=T0)
    a = s.status(T0 + 30)
    b = s.status(T0 + 90)
    assert a is not b  # the burn rate depends on the time while the call is in its window
    assert a.burn.span_s != b.burn.span_s or a.burn.tokens_per_min != b.burn.tokens_per_min


def test_an_earlier_time_or_another_turn_start_is_computed_again(tmp_path: Path) -> None:
    s = _ledger(tmp_path)
    s.record(_usage(), at=T0)
    first = s.status(T0 + 2 * HOUR, turn_from=1)
    assert s.status(T0 + 2 * HOUR, turn_from=0) is not first
    again = s.status(T0 + 2 * HOUR, turn_from=0)
    assert s.status(T0 + HOUR + 1, turn_from=0) is not again  # the memo only holds going forward


def test_a_day_budget_starts_afresh_at_midnight(tmp_path: Path) -> None:
    policy = BudgetPolicy.from_pack({"budgets": {"day": {"tokens": 10_000}}})
    s = _ledger(tmp_path, policy=policy)
    midnight = datetime(2026, 3, 2, tzinfo=UTC).timestamp()
    s.record(_usage(4000), at=midnight - 2 * HOUR)
    late = s.status(midnight - 1)
    assert late.dimensions[0].spent == pytest.approx(4010)
    assert s.status(midnight - 0.5) is late
    early = s.status(midnight + 1)
    assert early is not late and early.dimensions[0].spent == 0


def test_a_sub_agent_registered_later_counts_in_the_roots_next_status(tmp_path: Path) -> None:
    root = _ledger(tmp_path, "root")
    root.record(_usage(), at=T0)
    first = root.status(T0 + 2 * HOUR)
    child = _ledger(tmp_path, "child")
    root.register_child(child)
    child.record(_usage(2000), at=T0 + 5)
    second = root.status(T0 + 2 * HOUR + 1)
    assert second is not first and second.totals.calls == 2
    # and a call the child makes after that is seen too
    child.record(_usage(3000), at=T0 + 6)
    assert root.status(T0 + 2 * HOUR + 2).totals.calls == 3


def test_the_memo_follows_a_store_of_another_kind(tmp_path: Path) -> None:
    store = MemoryStore()
    s = SessionLedger(None, "m1", store=store, session="m1", model="gpt-4o")
    s.record(_usage(), at=T0)
    first = s.status(T0 + 2 * HOUR)
    assert s.status(T0 + 2 * HOUR + 1) is first
    other = SessionLedger(None, "m1", store=store, session="m1", model="gpt-4o")
    other.record(_usage(7), at=T0 + 1)
    assert s.status(T0 + 2 * HOUR + 2).totals.calls == 2


def test_each_report_gets_its_own_budget_section(tmp_path: Path) -> None:
    engine = Engine.load("builtin:default")
    session = engine.session(tmp_path / "s", model="gpt-4o")
    history = [{"role": "user", "content": "hello"}]
    one = session.prepare(history)
    one.report["budget_status"]["totals"]["calls"] = 999  # the caller's to change
    history = [*history, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "again"}]
    two = session.prepare(history)
    assert two.report["budget_status"]["totals"]["calls"] == 0
    assert two.report["budget_status"] == json.loads(json.dumps(session.ledger.status().as_dict()))


# --- compacting stages per tier, across a pack reload -----------------------------------------


def test_the_compacting_stages_per_tier_follow_a_reloaded_pack(tmp_path: Path) -> None:
    pack = tmp_path / "pack.yaml"
    body = (
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: tiers, version: 1.0.0}\n"
        "pipeline:\n  - id: trunc\n    use: compress.truncate\n    when: {at_least: %s}\n"
    )
    pack.write_text(body % "full")
    engine = Engine.load(pack)
    assert engine._compacting_at("light") == [] and engine._compacting_at("full") == ["trunc"]
    pack.write_text(body % "light")
    st = pack.stat()
    os.utime(pack, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert engine.refresh()  # reloaded
    assert engine._compacting_at("light") == ["trunc"]


# --- scopes around a prepare ------------------------------------------------------------------


def test_the_prepare_scopes_restore_the_outer_value_also_after_an_error() -> None:
    from ctxrules.tokens import _CEILING, _TRUSTED

    with token_ceiling(100), trusted_objects():
        with pytest.raises(RuntimeError), token_ceiling(5):
            assert _CEILING.get() == 5
            raise RuntimeError("boom")
        assert _CEILING.get() == 100 and _TRUSTED.get() is True
    assert _CEILING.get() is None and _TRUSTED.get() is False
    outer = current_key()
    with key_scope(outer) as key:
        assert key is outer and current_key() is outer


def test_serialise_once_texts_live_only_inside_the_scope() -> None:
    value = {"role": "user", "content": "x"}
    with serialise_once():
        first = dumps_once(value)
        value["content"] = "changed in place"  # not allowed inside; shows the memo is in use
        assert dumps_once(value) is first
    assert dumps_once(value) == json.dumps(value, ensure_ascii=False)


@pytest.mark.parametrize(
    "value",
    [
        {"b": 1, "a": [1.0, True, None, "é\ud800", -0.0, 1e300]},
        {"k": 10**30, "nested": {"z": [], "y": {}}},
        "a string",
        [float("inf"), float("-inf")],
        {1: "int key", None: "null key"},
    ],
)
def test_the_reused_encoder_writes_what_json_dumps_writes(value: Any) -> None:
    def outcome(encode: Any) -> Any:
        try:
            return encode(value)
        except TypeError as exc:  # keys that cannot be sorted: the same refusal
            return type(exc)

    assert outcome(json_text) == outcome(lambda v: json.dumps(v, ensure_ascii=False))
    assert outcome(json_text_sorted) == outcome(lambda v: json.dumps(v, ensure_ascii=False, sort_keys=True))


def test_the_reused_encoder_refuses_what_json_dumps_refuses() -> None:
    with pytest.raises(TypeError, match="not JSON serializable"):
        json_text({"x": object()})


# --- the state file -----------------------------------------------------------------------


def test_a_state_file_replaced_before_a_slow_save_gets_the_new_state(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "s")
    store.save({"stages": {"a": {"n": 1}}}, [{"role": "user", "content": "hi"}])
    assert store.load()["stages"] == {"a": {"n": 1}}  # the turn's load (a memo hit)
    # Replaced behind the lock's back (a restore from a backup), and the turn takes long.
    stranger = tmp_path / "s" / "other.json"
    stranger.write_text(json.dumps({"version": 1, "stages": {"a": {"n": 0}}}))
    os.replace(stranger, tmp_path / "s" / "state.json")
    store._looked = None if store._looked is None else (store._looked[0], store._looked[1] - 1.0)
    store.save({"stages": {"a": {"n": 2}}}, [{"role": "user", "content": "hi"}])
    on_disk = json.loads((tmp_path / "s" / "state.json").read_text())
    assert on_disk["stages"] == {"a": {"n": 2}}
    fresh = SessionStore(tmp_path / "s")
    assert fresh.load()["stages"] == {"a": {"n": 2}}


def test_a_warm_save_writes_the_file_the_load_looked_at(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "s")
    output = [{"role": "user", "content": "hi"}]
    for n in range(3):
        store.load()
        store.save({"stages": {"a": {"n": n}}}, output)
        assert json.loads((tmp_path / "s" / "state.json").read_text())["stages"] == {"a": {"n": n}}
    assert SessionStore(tmp_path / "s").load()["stages"] == {"a": {"n": 2}}


# --- the report header ----------------------------------------------------------------------


def test_the_report_header_follows_a_switch_and_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    session = Engine.load("builtin:default").session(Path("s"), model="gpt-4o")
    history = [{"role": "user", "content": "hello"}]
    first = session.prepare(history).report
    assert first["session"]["path"] == str(tmp_path / "a" / "s") and first["model"]["name"] == "gpt-4o"
    first["model"]["name"] = "edited by the caller"
    session.switch(model="gpt-4o-mini")
    second = session.prepare(history).report
    assert second["model"]["name"] == "gpt-4o-mini"
    monkeypatch.chdir(tmp_path / "b")
    third = session.prepare(history).report
    assert third["session"]["path"] == str(tmp_path / "b" / "s")
    assert third["model"]["name"] == "gpt-4o-mini"
