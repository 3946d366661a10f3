"""Diagnostics point at the line and column of the key or item in the file that wrote it, and
their JSON pointers address that file's own document, merged-pack diagnostics included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

HEAD = "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: mine, version: 1.0.0}\n"


def diagnostics(cli, path: Path) -> list[tuple[str, str, int, int, str]]:  # type: ignore[no-untyped-def]
    _, out, err = cli("validate", "--format", "json", str(path))
    assert "Traceback" not in err
    return [
        (d["code"], Path(d["file"]).name, d["line"], d["col"], d["pointer"]) for d in json.loads(out)["diagnostics"]
    ]


@pytest.fixture(autouse=True)
def _here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


def test_disabling_an_essential_stage_points_at_the_item_that_does_it(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pack = tmp_path / "p.yaml"
    pack.write_text(
        HEAD + "extends: [builtin:default]\n"
        "pipeline:\n"  # line 5
        "  - id: truncate\n"  # 6
        "    with: {max_tokens: 900}\n"  # 7
        "  - {id: dedup, description: keep}\n"  # 8
        "  - id: ttl\n"  # 9
        "    description: as is\n"  # 10
        "  - id: pairs\n"  # 11
        "    enabled: false\n",
        encoding="utf-8",
    )  # 12
    assert diagnostics(cli, pack) == [("CR062", "p.yaml", 11, 5, "/pipeline/3")]


def test_a_pointer_uses_the_files_own_list_index_not_the_merged_one(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pack = tmp_path / "p.yaml"
    pack.write_text(
        HEAD + "extends: [builtin:default]\npipeline:\n  - id: truncate\n    with: {max_tokns: 900}\n", encoding="utf-8"
    )  # line 7
    [(code, file, line, col, pointer)] = diagnostics(cli, pack)
    assert (code, file, line, col) == ("CR061", "p.yaml", 7, 12)
    assert pointer == "/pipeline/0/with/max_tokns"  # builtin:default has truncate further down


def test_a_parents_mistake_is_reported_in_the_parents_numbering(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "parent.yaml").write_text(
        HEAD + "extends: [builtin:default]\n"
        "pipeline:\n"
        "  - {id: mine, use: compress.truncate, after: outputs,\n"
        "     with: {head_tokens: -3}}\n",
        encoding="utf-8",
    )
    child = tmp_path / "child.yaml"
    child.write_text(
        HEAD + "extends: [./parent.yaml]\npipeline:\n  - {id: extra, use: compress.dedup}\n", encoding="utf-8"
    )
    found = diagnostics(cli, child)
    assert [(c, f, ln, p) for c, f, ln, _, p in found] == [("CR061", "parent.yaml", 7, "/pipeline/0/with/head_tokens")]


def test_a_section_keys_origin_is_its_own_line(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pack = tmp_path / "p.yaml"
    pack.write_text(
        HEAD + "extends: [builtin:default]\n"
        "context:\n"  # line 5
        "  thresholds:\n"  # 6
        "    full: 0.8\n",
        encoding="utf-8",
    )
    code, out, err = cli("explain", str(pack), "--origins")
    assert code == 0, err
    assert "context:  # p.yaml:5\n" in out and "  thresholds:  # p.yaml:6\n" in out, out


def test_a_jinja_error_in_a_block_scalar_points_at_its_real_line(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pack = tmp_path / "p.yaml"
    pack.write_text(
        HEAD + "prompts:\n"
        "  sections:\n"
        "    identity:\n"
        "      tag: identity\n"
        "      template: |\n"  # line 8
        "        You are an agent.\n"  # 9: template line 1
        "        Be brief.\n"  # 10
        "        {% if %}broken\n"  # 11: template line 3
        "  modes:\n    full: [identity]\n",
        encoding="utf-8",
    )
    found = diagnostics(cli, pack)
    assert [(c, f, ln, p) for c, f, ln, _, p in found] == [
        ("CR080", "p.yaml", 11, "/prompts/sections/identity/template")
    ]
