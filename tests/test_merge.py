"""The merge rules of ``extends`` (README "How packs merge") and the origin of every value."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from ctxrules.packs.loader import PackLoader, ResolvedPack
from ctxrules.packs.merge import ID_LISTS

HEAD = "apiVersion: ctxrules/v1\nkind: RulePack\n"


def write(folder: Path, name: str, body: str, *, head: bool = True) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    body = textwrap.dedent(body)
    if head and not re.search(r"^metadata:", body, re.M):
        # Every pack names itself (CR013); written last so the lines the tests expect stay put.
        body += "" if body.endswith("\n") or not body else "\n"
        body += f"metadata: {{name: {path.stem}, version: 1.0.0}}\n"
    path.write_text((HEAD if head else "") + body, encoding="utf-8")
    return path


def resolve(path: Path, search_path: tuple[Path, ...] = ()) -> ResolvedPack:
    return PackLoader(search_path).resolve(str(path))


def ids(pack: ResolvedPack, key: str = "pipeline") -> list[str]:
    return [item["id"] for item in pack.data.get(key, [])]


def codes(pack: ResolvedPack) -> list[str]:
    return [d.code for d in pack.diagnostics]


@pytest.fixture
def parent(tmp_path: Path) -> Path:
    # Stage types need not exist to merge: resolution does not validate (``validate`` does).
    return write(
        tmp_path,
        "parent.yaml",
        """\
        metadata: {name: parent, version: 1.2.0, description: the parent}
        context:
          window: 100000
          reserve_output: 8192
          thresholds: {monitor: 0.4, light: 0.5, full: 0.7, emergency: 0.9}
        tools:
          roles:
            shell: [Bash, bash]
            file_read: [Read]
          exit_code: ['Exit code (\\d+)', 'rc=(\\d+)']
        pipeline:
          - id: a
            use: x.a
            with: {opts: {k1: 1, k2: 2}, top: 1, list: [1, 2, 3]}
            description: first
          - id: b
            use: x.b
          - id: c
            use: x.c
        priorities:
          - {id: errors, match: {role: tool, error: true}, priority: critical}
          - {id: rest, match: {}, priority: standard}
        models:
          - {id: gpt, match: ["gpt-*", "openai/*"], context: {reserve_output: 4096}}
        """,
    )


# -- overrides -------------------------------------------------------------------------------


def test_child_overrides_a_field_and_keeps_the_rest(tmp_path: Path, parent: Path) -> None:
    child = write(
        tmp_path,
        "child.yaml",
        """\
        extends: ./parent.yaml
        pipeline:
          - id: b
            on_error: fail
        priorities:
          - id: rest
            priority: important
        """,
    )
    pack = resolve(child)
    assert codes(pack) == []
    assert ids(pack) == ["a", "b", "c"]
    assert pack.data["pipeline"][1] == {"id": "b", "use": "x.b", "on_error": "fail"}
    assert pack.data["priorities"][1] == {"id": "rest", "match": {}, "priority": "important"}
    assert [Path(f).name for f in pack.files] == ["parent.yaml", "child.yaml"]


def test_with_merges_deeply(tmp_path: Path, parent: Path) -> None:
    child = write(
        tmp_path,
        "child.yaml",
        """\
        extends: ./parent.yaml
        pipeline:
          - id: a
            with: {opts: {k2: 20, k3: 3}, list: [9]}
        """,
    )
    a = resolve(child).data["pipeline"][0]
    assert a["with"] == {"opts": {"k1": 1, "k2": 20, "k3": 3}, "top": 1, "list": [9]}
    assert a["use"] == "x.a" and a["description"] == "first"


def test_maps_merge_deeply_and_later_wins(tmp_path: Path, parent: Path) -> None:
    child = write(
        tmp_path,
        "child.yaml",
        """\
        extends: ./parent.yaml
        context:
          thresholds: {full: 0.75}
        tools:
          roles:
            shell: [terminal]
        """,
    )
    data = resolve(child).data
    assert data["context"] == {
        "window": 100000,
        "reserve_output": 8192,
        "thresholds": {"monitor": 0.4, "light": 0.5, "full": 0.75, "emergency": 0.9},
    }
    # other lists are replaced as a whole, never concatenated
    assert data["tools"]["roles"] == {"shell": ["terminal"], "file_read": ["Read"]}
    assert data["tools"]["exit_code"] == ["Exit code (\\d+)", "rc=(\\d+)"]


def test_other_lists_are_replaced(tmp_path: Path, parent: Path) -> None:
    child = write(
        tmp_path,
        "child.yaml",
        """\
        extends: ./parent.yaml
        tools:
          exit_code: ['status (\\d+)']
        models:
          - id: gpt
            match: ["gpt-4o"]
        """,
    )
    data = resolve(child).data
    assert data["tools"]["exit_code"] == ["status (\\d+)"]
    # a list inside an id-keyed item is replaced too; the item's other fields stay
    assert data["models"] == [{"id": "gpt", "match": ["gpt-4o"], "context": {"reserve_output": 4096}}]


def test_a_map_can_replace_a_scalar_and_back(tmp_path: Path) -> None:
    write(tmp_path, "p.yaml", "budgets: {session: 5}\nrouter: {tiers: {a: 1}}\n")
    child = write(tmp_path, "c.yaml", "extends: ./p.yaml\nbudgets: {session: {usd: 5}}\nrouter: {tiers: off}\n")
    data = resolve(child).data
    assert data["budgets"] == {"session": {"usd": 5}}
    assert data["router"] == {"tiers": False}


# -- appending and placing ---------------------------------------------------------------------


def test_new_complete_item_is_appended(tmp_path: Path, parent: Path) -> None:
    child = write(
        tmp_path,
        "child.yaml",
        """\
        extends: ./parent.yaml
        pipeline:
          - {id: d, use: x.d}
        priorities:
          - {id: recent, match: {within_steps: 5}, priority: important}
        """,
    )
    pack = resolve(child)
    assert codes(pack) == []
    assert ids(pack) == ["a", "b", "c", "d"]
    assert ids(pack, "priorities") == ["errors", "rest", "recent"]


@pytest.mark.parametrize(
    ("placement", "order"),
    [
        ("before: a", ["n", "a", "b", "c"]),
        ("after: a", ["a", "n", "b", "c"]),
        ("before: c", ["a", "b", "n", "c"]),
        ("after: c", ["a", "b", "c", "n"]),
    ],
)
def test_before_and_after_place_a_new_item(tmp_path: Path, parent: Path, placement: str, order: list[str]) -> None:
    child = write(
        tmp_path,
        "child.yaml",
        f"""\
        extends: ./parent.yaml
        pipeline:
          - id: n
            use: x.n
            {placement}
        """,
    )
    pack = resolve(child)
    assert codes(pack) == []
    assert ids(pack) == order
    n = next(i for i in pack.data["pipeline"] if i["id"] == "n")
    assert n == {"id": "n", "use": "x.n"}, "before/after are consumed by the merge"


def test_before_and_after_move_an_existing_item(tmp_path: Path, parent: Path) -> None:
    child = write(
        tmp_path,
        "child.yaml",
        """\
        extends: ./parent.yaml
        pipeline:
          - id: c
            before: a
          - id: a
            after: b
            with: {top: 2}
        """,
    )
    pack = resolve(child)
    assert codes(pack) == []
    assert ids(pack) == ["c", "b", "a"]
    assert pack.data["pipeline"][2]["with"]["top"] == 2


def test_items_placed_relative_to_items_of_the_same_child(tmp_path: Path, parent: Path) -> None:
    child = write(
        tmp_path,
        "child.yaml",
        """\
        extends: ./parent.yaml
        pipeline:
          - {id: m, use: x.m, after: a}
          - {id: n, use: x.n, after: m}
        """,
    )
    assert ids(resolve(child)) == ["a", "m", "n", "b", "c"]


def test_placement_naming_no_item_is_an_error(tmp_path: Path, parent: Path) -> None:
    child = write(
        tmp_path,
        "child.yaml",
        """\
        extends: ./parent.yaml
        pipeline:
          - id: n
            use: x.n
            after: bb
        """,
    )
    pack = resolve(child)
    [d] = pack.diagnostics
    assert (d.code, d.line, d.pointer) == ("CR042", 7, "/pipeline/0/after")
    assert d.file.endswith("child.yaml")
    assert "did you mean 'b'" in (d.hint or "")
    assert "n" in ids(pack), "the item is kept (appended) so nothing silently disappears"


# -- enabled ---------------------------------------------------------------------------------


def test_enabled_false_removes_and_a_grandchild_restores(tmp_path: Path, parent: Path) -> None:
    write(
        tmp_path,
        "child.yaml",
        """\
        extends: ./parent.yaml
        pipeline:
          - {id: b, enabled: false}
          - {id: n, use: x.n, after: b}
        priorities:
          - {id: errors, enabled: false}
        """,
    )
    grandchild = write(
        tmp_path,
        "grandchild.yaml",
        """\
        extends: ./child.yaml
        pipeline:
          - {id: b, enabled: true}
        """,
    )
    child = resolve(tmp_path / "child.yaml")
    assert codes(child) == []
    assert ids(child) == ["a", "n", "c"], "placed after b, which is still there, disabled"
    assert ids(child, "priorities") == ["rest"]
    assert child.disabled == {"pipeline": ["b"], "priorities": ["errors"]}

    restored = resolve(grandchild)
    assert codes(restored) == []
    assert ids(restored) == ["a", "b", "n", "c"], "a restored item is back where it was"
    assert restored.data["pipeline"][1] == {"id": "b", "use": "x.b"}, "'enabled' is consumed"
    assert ids(restored, "priorities") == ["rest"], "only what the grandchild restores comes back"


def test_enabled_false_in_the_same_pack_that_defines_the_item(tmp_path: Path) -> None:
    pack = resolve(
        write(
            tmp_path,
            "p.yaml",
            """\
        pipeline:
          - {id: a, use: x.a, enabled: false}
          - {id: b, use: x.b}
        """,
        )
    )
    assert ids(pack) == ["b"]


def test_disabling_an_id_that_exists_nowhere_is_an_error(tmp_path: Path, parent: Path) -> None:
    pack = resolve(
        write(
            tmp_path,
            "child.yaml",
            """\
        extends: ./parent.yaml
        pipeline:
          - {id: zz, enabled: false}
        """,
        )
    )
    assert codes(pack) == ["CR041"]


# -- partial items -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "item", "missing"),
    [
        ("pipeline", "{id: aa, with: {top: 2}}", "'use'"),
        ("priorities", "{id: eror, match: {}}", "'priority'"),
        ("models", "{id: claude, context: {reserve_output: 1}}", "'match'"),
        ("compressors", "{id: git, match: {argv: [git]}}", "'steps'"),
        ("tests", "{id: t, model: gpt-4o}", "'input'"),
    ],
)
def test_partial_item_with_an_unknown_id_is_an_error(
    tmp_path: Path, parent: Path, key: str, item: str, missing: str
) -> None:
    pack = resolve(write(tmp_path, "child.yaml", f"extends: ./parent.yaml\n{key}:\n  - {item}\n"))
    [d] = pack.diagnostics
    assert (d.code, d.line, d.col, d.pointer) == ("CR041", 5, 5, f"/{key}/0")
    assert d.file.endswith("child.yaml")
    assert missing in d.message
    item_id = re.search(r"id: ([\w-]+)", item)[1]  # type: ignore[index]
    assert item_id not in ids(pack, key), "a partial item is not added"


def test_partial_item_hint_names_the_close_id(tmp_path: Path, parent: Path) -> None:
    pack = resolve(write(tmp_path, "child.yaml", "extends: ./parent.yaml\npriorities:\n  - {id: eror, match: {}}\n"))
    assert "did you mean 'errors'" in (pack.diagnostics[0].hint or "")


def test_id_lists_are_the_documented_ones() -> None:
    assert set(ID_LISTS) == {"pipeline", "priorities", "models", "compressors", "tests"}


# -- metadata and extends ----------------------------------------------------------------------


def test_metadata_is_not_inherited(tmp_path: Path, parent: Path) -> None:
    # A child without metadata (invalid since CR013 requires it, but resolution still runs)
    bare = resolve(write(tmp_path, "bare.yaml", HEAD + "extends: ./parent.yaml\n", head=False))
    assert "metadata" not in bare.data
    assert [d.code for d in bare.diagnostics] == []  # resolution alone does not validate
    own = resolve(write(tmp_path, "own.yaml", "extends: ./parent.yaml\nmetadata: {name: own, version: 2.0.0}\n"))
    assert own.data["metadata"] == {"name": "own", "version": "2.0.0"}, "not even the fields the child leaves out"
    assert own.name == "own"
    assert "extends" not in own.data


def test_extends_as_a_string_or_a_list_and_relative_to_the_file(tmp_path: Path) -> None:
    write(tmp_path, "base/lib/root.yaml", "context: {window: 1000}\n")
    write(tmp_path, "base/mid.yaml", "extends: ./lib/root.yaml\ncontext: {reserve_output: 10}\n")
    top = write(tmp_path, "packs/top.yaml", "extends: [../base/mid.yaml]\n")
    outside = resolve(top)
    assert codes(outside) == ["CR100"], "a parent outside the pack's folder needs the caller's consent"
    pack = resolve(top, (tmp_path / "base",))
    assert codes(pack) == []
    assert pack.data["context"] == {"window": 1000, "reserve_output": 10}
    assert [Path(f).name for f in pack.files] == ["root.yaml", "mid.yaml", "top.yaml"]


def test_diamond_applies_the_shared_parent_once(tmp_path: Path) -> None:
    write(
        tmp_path,
        "d.yaml",
        """\
        context: {window: 1000}
        pipeline:
          - {id: d, use: x.d}
        """,
    )
    write(
        tmp_path,
        "b.yaml",
        """\
        extends: ./d.yaml
        context: {window: 2000}
        pipeline:
          - {id: d, with: {from: b}}
          - {id: b, use: x.b}
        """,
    )
    write(
        tmp_path,
        "c.yaml",
        """\
        extends: ./d.yaml
        pipeline:
          - {id: c, use: x.c}
        """,
    )
    top = write(tmp_path, "a.yaml", "extends: [./b.yaml, ./c.yaml]\n")
    pack = resolve(top)
    assert codes(pack) == []
    assert [Path(f).name for f in pack.files] == ["d.yaml", "b.yaml", "c.yaml", "a.yaml"]
    # Re-applying d after b would have reset both of these.
    assert pack.data["context"]["window"] == 2000
    assert pack.data["pipeline"][0] == {"id": "d", "use": "x.d", "with": {"from": "b"}}
    assert ids(pack) == ["d", "b", "c"]


def test_parents_apply_depth_first_left_to_right(tmp_path: Path) -> None:
    for name, parents in [("b1", []), ("b", ["b1"]), ("c1", []), ("c", ["c1"])]:
        write(
            tmp_path,
            f"{name}.yaml",
            f"""\
            extends: [{", ".join(f"./{p}.yaml" for p in parents)}]
            summarizer: {{model: {name}}}
            pipeline:
              - {{id: {name}, use: x.{name}}}
            """,
        )
    top = write(tmp_path, "a.yaml", "extends: [./b.yaml, ./c.yaml]\n")
    pack = resolve(top)
    assert codes(pack) == []
    assert [Path(f).stem for f in pack.files] == ["b1", "b", "c1", "c", "a"]
    assert ids(pack) == ["b1", "b", "c1", "c"]
    assert pack.data["summarizer"] == {"model": "c"}, "the last parent applied wins"


def test_the_same_parent_listed_twice_applies_once(tmp_path: Path) -> None:
    write(tmp_path, "p.yaml", "pipeline:\n  - {id: p, use: x.p}\n")
    pack = resolve(write(tmp_path, "c.yaml", "extends: [./p.yaml, ././p.yaml]\n"))
    assert codes(pack) == [] and ids(pack) == ["p"]
    assert len(pack.files) == 2


def test_cycle_is_an_error_and_resolution_still_finishes(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", "extends: ./b.yaml\npipeline:\n  - {id: a, use: x.a}\n")
    write(tmp_path, "b.yaml", "extends: ./a.yaml\npipeline:\n  - {id: b, use: x.b}\n")
    pack = resolve(tmp_path / "a.yaml")
    [d] = pack.diagnostics
    assert d.code == "CR031" and d.file.endswith("b.yaml") and d.line == 3
    assert "a.yaml -> " in d.message and d.message.count("->") == 2
    # not merged: what wins would depend on where the cycle is cut (validate says so, CR031)
    assert not pack.merged and pack.data == {} and sorted(Path(f).name for f in pack.files) == ["a.yaml", "b.yaml"]


def test_builtin_parent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # from inside the checkout, rules/ shows as a path
    pack = resolve(
        write(
            tmp_path,
            "c.yaml",
            """\
        extends: builtin:default@^1
        context: {thresholds: {full: 0.75}}
        """,
        )
    )
    assert codes(pack) == []
    assert pack.files[-2] == "builtin:default"  # after its own parents, before the child
    assert all(f.startswith("builtin:") for f in pack.files[:-1])
    assert pack.data["context"]["thresholds"]["full"] == 0.75
    assert "pairs" in ids(pack)


@pytest.mark.parametrize(
    ("ref", "code"),
    [
        ("builtin:default@^2", "CR032"),
        ("builtin:default@>=1 <1.0.0", "CR032"),
        ("builtin:default@^^1", "CR022"),
        ("builtin:nope", "CR030"),
        ("builtin:", "CR030"),
        ("./missing.yaml", "CR030"),
    ],
)
def test_bad_extends(tmp_path: Path, ref: str, code: str) -> None:
    pack = resolve(write(tmp_path, "c.yaml", f"extends: ['{ref}']\n"))
    assert [(d.code, d.line, d.col) for d in pack.diagnostics] == [(code, 3, 11)]


# -- origins ---------------------------------------------------------------------------------


def test_every_resolved_value_has_an_origin(tmp_path: Path, parent: Path) -> None:
    child = write(
        tmp_path,
        "child.yaml",
        """\
        extends: ./parent.yaml
        context: {reserve_output: 4096}
        pipeline:
          - id: a
            with: {opts: {k2: 20}}
          - {id: n, use: x.n, before: b}
        """,
    )
    pack = resolve(child)
    origins = pack.origins()

    def pointers(value: Any, pointer: str = "") -> list[str]:
        out = [pointer]
        if isinstance(value, dict):
            for k, v in value.items():
                out += pointers(v, f"{pointer}/{k}")
        elif isinstance(value, list):
            for i, v in enumerate(value):
                out += pointers(v, f"{pointer}/{i}")
        return out

    for pointer in pointers(pack.data)[1:]:
        assert pointer in origins, pointer
    where = {p: (Path(o.file).name, o.line) for p, o in origins.items()}
    assert where["/context/reserve_output"] == ("child.yaml", 4)
    assert where["/context/window"] == ("parent.yaml", 5)
    assert where["/pipeline/0/with/opts/k2"] == ("child.yaml", 7)
    assert where["/pipeline/0/with/opts/k1"] == ("parent.yaml", 16)
    assert where["/pipeline/0/use"] == ("parent.yaml", 15)
    assert where["/pipeline/1"] == ("child.yaml", 8)  # n, placed before b
    assert where["/pipeline/2/use"] == ("parent.yaml", 19)  # b, inherited


def test_explain_origins(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(
        tmp_path,
        "parent.yaml",
        """\
        metadata: {name: parent, version: 1.0.0}
        context:
          window: 100000
          reserve_output: 8192
        priorities:
          - {id: rest, match: {}, priority: standard}
        """,
    )
    write(
        tmp_path,
        "child.yaml",
        """\
        extends: ./parent.yaml
        metadata: {name: child, version: 1.0.0}
        context:
          reserve_output: 4096
        """,
    )
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("explain", "child.yaml", "--origins")
    assert code == 0, err
    assert re.search(r"^  reserve_output: 4096  # child\.yaml:6$", out, re.M), out
    assert re.search(r"^  window: 100000  # parent\.yaml:5$", out, re.M), out
    assert re.search(r"^    priority: standard  # parent\.yaml:8$", out, re.M), out
    assert re.search(r"^  name: child  # child\.yaml:4$", out, re.M), out
    assert "files applied: parent.yaml, child.yaml" in out
    # without --origins: plain YAML that loads back to the resolved pack
    code, plain_out, _ = cli("explain", "child.yaml")
    assert code == 0
    assert yaml.safe_load(plain_out) == PackLoader().resolve("child.yaml").data
