"""Shell-output compressors: rules in packs that shorten a command's output, truthfully.

The public entry point is :func:`ctxrules.compressors.api.compress_tool_output`.
"""

from __future__ import annotations
