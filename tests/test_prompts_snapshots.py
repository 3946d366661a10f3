"""Snapshots of every prompt ``builtin:default`` can produce: one text file per mode x
``models:`` entry (plus "no-entry") under ``__snapshots__/test_prompts_snapshots/``.

A change to a section, a discipline or the assembly shows in review as a plain text diff;
``pytest tests/test_prompts_snapshots.py --snapshot-update`` rewrites the files. The fixtures
come from the ctxrules pytest plugin (imported here as well, so the test also runs from a
source checkout where the plugin's entry point is not installed).
"""

from __future__ import annotations

from typing import Any

import pytest

from ctxrules.testing import pytest_plugin
from ctxrules.testing.pytest_plugin import prompt_cases

# The plugin's fixtures, for a source checkout where its pytest11 entry point is not installed.
assemble_prompt = pytest_plugin.assemble_prompt
ctxrules_pack = pytest_plugin.ctxrules_pack
prompt_snapshot = pytest_plugin.prompt_snapshot


@pytest.mark.parametrize(("mode", "entry"), prompt_cases("builtin:default"))
def test_builtin_default_prompt(mode: str, entry: str, assemble_prompt: Any, prompt_snapshot: Any) -> None:
    prompt = assemble_prompt(mode, entry=entry)
    assert prompt == prompt_snapshot
