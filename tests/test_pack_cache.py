"""The per-process cache of resolved, validated packs (``ctxrules.packs.validated``): a second
``Engine.load`` of an unchanged pack reuses the first one's work, any change below the pack's
folder (a parent, a template) is seen, and callers never share mutable pack data."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from ctxrules import Engine, PackError

PACK = """\
apiVersion: ctxrules/v1
kind: RulePack
metadata: {name: cached, version: 1.0.0}
extends: [./base.yaml]
prompts:
  sections:
    identity: {tag: identity, file: prompts/identity.md.j2}
  modes:
    full: [identity]
"""
BASE = """\
apiVersion: ctxrules/v1
kind: RulePack
metadata: {name: base, version: 1.0.0}
context: {reserve_output: 4096}
"""


def _age(folder: Path, seconds: float = 60.0) -> None:
    """Date every file back, as files that were written a while ago (the cache does not trust
    a file written in the last seconds)."""
    past = time.time() - seconds
    for path in [folder, *folder.rglob("*")]:
        os.utime(path, (past, past))


@pytest.fixture
def pack(tmp_path: Path) -> Path:
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "identity.md.j2").write_text("You are the first.\n", encoding="utf-8")
    (tmp_path / "base.yaml").write_text(BASE, encoding="utf-8")
    (tmp_path / "pack.yaml").write_text(PACK, encoding="utf-8")
    _age(tmp_path)
    return tmp_path / "pack.yaml"


def test_an_unchanged_pack_is_resolved_once(pack: Path) -> None:
    first, second = Engine.load(pack), Engine.load(pack)
    assert second.pack.tree is first.pack.tree  # the cached resolution
    assert second.pack.data == first.pack.data and second.digest == first.digest
    # ... but each engine has its own data: editing one cannot change the other
    second.pack.data["context"]["reserve_output"] = 1
    assert first.pack.data["context"]["reserve_output"] == 4096
    assert Engine.load(pack).pack.data["context"]["reserve_output"] == 4096


def test_a_changed_template_or_parent_is_read_again(pack: Path) -> None:
    assert "first" in Engine.load(pack).assemble("full", "gpt-4o")
    template = pack.parent / "prompts" / "identity.md.j2"
    template.write_text("You are the second one.\n", encoding="utf-8")
    _age(pack.parent, 30)
    assert "second" in Engine.load(pack).assemble("full", "gpt-4o")

    (pack.parent / "base.yaml").write_text(BASE.replace("4096", "2048"), encoding="utf-8")
    _age(pack.parent, 20)
    assert Engine.load(pack).pack.data["context"]["reserve_output"] == 2048


def test_a_pack_made_invalid_is_reported_not_served_from_the_cache(pack: Path) -> None:
    Engine.load(pack)
    (pack.parent / "base.yaml").write_text(BASE.replace("4096", "lots"), encoding="utf-8")
    _age(pack.parent, 30)
    with pytest.raises(PackError, match="reserve_output"):
        Engine.load(pack)


def test_a_file_written_just_now_is_not_cached(pack: Path) -> None:
    (pack.parent / "base.yaml").write_text(BASE.replace("4096", "2048"), encoding="utf-8")  # mtime: now
    first, second = Engine.load(pack), Engine.load(pack)
    assert second.pack.tree is not first.pack.tree
    assert second.pack.data["context"]["reserve_output"] == 2048
