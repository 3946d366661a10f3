"""A syrupy extension that stores one assembled prompt per ``.txt`` file.

Each snapshot file holds exactly the prompt text (plus a final newline), so a change to a
section or a discipline shows in review as a plain text diff, and ``pytest --snapshot-update``
rewrites it. Used through the ``prompt_snapshot`` fixture of :mod:`ctxrules.testing.pytest_plugin`.
"""

from __future__ import annotations

from typing import Any

from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode

from ctxrules.prompts.assemble import AssembledPrompt

__all__ = ["PromptSnapshotExtension"]


class PromptSnapshotExtension(SingleFileSnapshotExtension):
    """Stores an :class:`AssembledPrompt` (or a plain string) as UTF-8 text, one file each."""

    file_extension = "txt"
    _write_mode = WriteMode.TEXT

    def serialize(self, data: Any, **kwargs: Any) -> str:
        if isinstance(data, AssembledPrompt):
            data = data.text
        if not isinstance(data, str):
            raise TypeError(f"prompt snapshots hold text; got {type(data).__name__} (pass an AssembledPrompt or a str)")
        return data if data.endswith("\n") else data + "\n"
