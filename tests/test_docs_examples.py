"""Every rule-pack example in the README and the docs is a pack that validates and whose test
cases pass, run through the real CLI as a user who copies it would run it.

A block that is a whole pack (``apiVersion:``) is written as is; a block that shows some keys
(``prompts:``, ``compressors:`` ...) gets the pack header and ``extends: [builtin:default]``
(unless it extends something itself), the way the docs say to use it. The input files the
examples name (``examples/agent-session.json``, ``fixtures/pytest/failures.txt``) are put next
to the pack from the bundled data, where a user keeps their own; so are the template files
(``prompts/*.md.j2``) and the example packs of ``docs/examples/`` that blocks extend. A block
none of whose top-level keys is a pack key is another tool's file (a litellm ``config.yaml``)
and is left out.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "docs" / "reference").glob("*.md"))]
HEADER = "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: docs-example, version: 1.0.0}\n"
_BLOCK = re.compile(r"^```ya?ml\n(.*?)^```", re.M | re.S)


PACK_KEYS = set(json.loads((REPO / "schemas" / "rulepack.v1.schema.json").read_text(encoding="utf-8"))["properties"])


def yaml_examples() -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for m in _BLOCK.finditer(text):
            line = text[: m.start()].count("\n") + 1
            data = yaml.safe_load(m.group(1))
            if isinstance(data, dict) and not set(data) & PACK_KEYS:
                continue  # another tool's configuration
            out.append((f"{doc.relative_to(REPO).as_posix()}:{line}", m.group(1)))
    return out


EXAMPLES = yaml_examples()


def as_pack(body: str) -> str:
    data = yaml.safe_load(body)
    assert isinstance(data, dict), "a YAML example in the docs is a pack or some of its keys"
    if "apiVersion" in data:
        return body
    return HEADER + ("" if "extends" in data else "extends: [builtin:default]\n") + body


@pytest.mark.parametrize("example", sorted((REPO / "docs" / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_example_pack_files_validate_and_their_tests_pass(cli, example: Path) -> None:  # type: ignore[no-untyped-def]
    code, out, err = cli("validate", str(example))
    assert code == 0 and "0 error(s)" in out, out + err
    code, out, err = cli("test", str(example))
    assert code == 0, out + err


def test_the_docs_hold_the_examples_this_test_runs() -> None:
    assert len(EXAMPLES) >= 13, [where for where, _ in EXAMPLES]
    assert sum("tests:" in body for _, body in EXAMPLES) >= 2


@pytest.mark.parametrize(("where", "body"), EXAMPLES, ids=[w for w, _ in EXAMPLES])
def test_docs_example_validates_and_its_tests_pass(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, body: str
) -> None:
    shutil.copytree(REPO / "rules" / "examples", tmp_path / "examples")
    shutil.copytree(REPO / "rules" / "compressors" / "fixtures", tmp_path / "fixtures")
    shutil.copytree(REPO / "rules" / "prompts", tmp_path / "prompts")
    for example in (REPO / "docs" / "examples").glob("*.yaml"):
        shutil.copy(example, tmp_path / example.name)
    (tmp_path / "pack.yaml").write_text(as_pack(body), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("validate", "pack.yaml")
    assert code == 0, f"{where}:\n{out}{err}"
    assert "0 error(s)" in out, out
    code, out, err = cli("test", "pack.yaml")
    assert code == 0, f"{where}:\n{out}{err}"
    declared = len(re.findall(r"^\s*- id: ", body.split("tests:", 1)[1], re.M)) if "tests:" in body else 0
    summary = out.splitlines()[-1]
    assert summary == f"{declared} passed, 0 failed", f"{where}: the example's own cases only\n{out}"
