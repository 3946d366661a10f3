"""Defaults are written once: every ``context:`` key's default is declared in the pack schema,
and the engine uses exactly those; the tier names exist once (``ctxrules.types``)."""

from __future__ import annotations

import json
from pathlib import Path

from ctxrules import Engine
from ctxrules.plugins import default_registry
from ctxrules.stages.base import options_schema_for
from ctxrules.types import THRESHOLD_NAMES

SCHEMA = Path(__file__).resolve().parents[1] / "schemas" / "rulepack.v1.schema.json"


def _context_schema() -> dict[str, dict[str, object]]:
    props: dict[str, dict[str, object]] = json.loads(SCHEMA.read_text(encoding="utf-8"))["properties"]["context"][
        "properties"
    ]
    return props


def test_every_context_key_declares_its_default_in_the_schema() -> None:
    props = _context_schema()
    # safety_margin's default is the tokenizer's own margin, which the schema cannot know.
    assert sorted(k for k, v in props.items() if "default" not in v) == ["safety_margin", "thresholds"]
    thresholds = props["thresholds"]["properties"]
    assert isinstance(thresholds, dict)
    assert list(thresholds) == list(THRESHOLD_NAMES)
    assert all("default" in spec for spec in thresholds.values())


def test_a_pack_without_context_gets_the_schema_defaults(tmp_path: Path) -> None:
    pack = tmp_path / "bare.yaml"
    pack.write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: bare, version: 1.0.0}\n", encoding="utf-8"
    )
    props = _context_schema()
    session = Engine.load(pack).session(tmp_path / "s", model="gpt-4o")
    budget = session.budget
    assert budget.reserve_output == props["reserve_output"]["default"]
    assert budget.tail_budget == props["tail_budget"]["default"]
    assert budget.window_source == "registry"  # window: auto
    assert budget.thresholds == {k: v["default"] for k, v in props["thresholds"]["properties"].items()}


def test_stage_tier_options_offer_exactly_the_threshold_tiers() -> None:
    for name, st in default_registry().stages.items():
        for key, spec in options_schema_for(st).get("properties", {}).items():
            enum = spec.get("enum") if isinstance(spec, dict) else None
            if enum and set(enum) & set(THRESHOLD_NAMES):
                assert enum == list(THRESHOLD_NAMES), (name, key)


# Options whose absence means "none" (no cap, nothing ignored, every block, no extra patterns).
_NO_DEFAULT = {
    ("context", "max_matches"),
    ("collapse_repeats", "ignore"),
    ("limit_blocks", "only"),
    ("collapse_progress", "patterns"),
    ("paths", "header"),
}


def test_compressor_action_options_declare_their_defaults_in_their_schema() -> None:
    missing = []
    for name, action in sorted(default_registry().actions.items()):
        schema = action.options_schema
        required = set(schema.get("required", []))
        for key, spec in schema.get("properties", {}).items():
            if key not in required and "default" not in spec and (name, key) not in _NO_DEFAULT:
                missing.append(f"{name}.{key}")
    assert missing == []


def test_an_action_gets_its_schema_defaults_filled_in() -> None:
    action = default_registry().actions["squeeze_blank"]
    out = action.configure({})(["a  ", "", "", "", "b"])  # max_run 1, rstrip true by default
    assert [str(line) for line in out] == ["a", "", "b"]
    assert [str(line) for line in action.configure({"max_run": 2, "rstrip": False})(["a  ", "", "", "", "b"])] == [
        "a  ",
        "",
        "",
        "b",
    ]
