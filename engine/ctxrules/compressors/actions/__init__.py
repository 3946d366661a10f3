"""The built-in compressor actions, registered through ``ctxrules_register_actions``.

Each module is a plugin in :data:`ctxrules.plugins.BUILTIN_PLUGINS`, exactly like a
third-party one: ``text`` (line rewrites and filters), ``select`` (which lines survive) and
``structure`` (grouping, JSON). The contract every action follows is in
:mod:`ctxrules.compressors.lines`; the options of each are documented in its JSON schema and in
docs/compressors.md.
"""

from __future__ import annotations
