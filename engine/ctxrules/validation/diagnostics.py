"""Diagnostics: what ``ctxrules validate`` reports, with stable codes.

A code never changes meaning once released; new checks get new codes. The table below is the
reference docs/reference/codes.md is checked against (``tests/test_docs.py``).
"""

from __future__ import annotations

# Diagnostic, Severity and did_you_mean live in the leaf module ctxrules.diagnostics (the pack
# loader uses them too); they are named here next to the codes they carry.
from ctxrules.diagnostics import Diagnostic, Severity, did_you_mean

__all__ = ["CODES", "Diagnostic", "Severity", "did_you_mean"]

CODES: dict[str, str] = {
    "CR001": "YAML syntax error (including tabs used for indentation)",
    "CR002": "the document is not a YAML mapping with string keys, or another document with content follows it"
    " (empty ones, such as a trailing `---`, may)",
    "CR003": "duplicate key in a mapping",
    "CR010": "unknown key",
    "CR011": "value of the wrong type",
    "CR012": "value not among the allowed values",
    "CR013": "required key missing",
    "CR014": "value out of range or not of the required form",
    "CR015": "not a ctxrules rule pack (apiVersion/kind)",
    "CR020": "metadata.version is not a semantic version",
    "CR021": "metadata.requires is not satisfied by this ctxrules version",
    "CR022": "a version range does not parse",
    "CR030": "extends names a pack that does not exist (nothing there, a folder, a FIFO, a device)",
    "CR031": "extends forms a cycle",
    "CR032": "extends names a built-in pack whose version is out of the requested range",
    "CR040": "duplicate id in an id-keyed list",
    "CR041": "partial item whose id does not exist in any parent",
    "CR042": "before/after names an id that does not exist",
    "CR043": "item incomplete after merging (e.g. a pipeline entry without use)",
    "CR050": "threshold outside (0, 1)",
    "CR051": "thresholds not strictly increasing (monitor < light < full < emergency)",
    "CR052": "reserve_output leaves no usable window",
    "CR060": "unknown stage type",
    "CR061": "stage options (with:) do not match the stage type's schema",
    "CR062": "an essential stage cannot be disabled or reconfigured out of its phase",
    "CR070": "regular expression does not compile",
    "CR080": "Jinja template does not parse",
    "CR081": "template includes a section that does not exist",
    "CR082": "prompt mode names a section that does not exist",
    "CR083": "template uses a variable that prompts.variables does not declare",
    "CR084": "template file not found",
    "CR085": (
        "system-prompt template uses a volatile value (date, time, id, counter, random) that breaks prompt caching"
    ),
    "CR086": "prompt sections include each other in a cycle",
    "CR087": "a prompt mode does not assemble (trial render with the declared defaults)",
    "CR090": "a file or folder could not be read",
    "CR091": "a timeout override cannot take effect: another limit (e.g. the global chunk_ms) ends the tool first",
    "CR092": "compaction time (summarizer.total_s) is not allowed for in the step limit (compaction_allowance_ms)",
    "CR093": "a heartbeat interval is not below the chunk limit it must keep from firing",
    "CR100": "a path the pack names (extends, template file, test input) is outside the pack's folder and search path",
    "CR101": "a pack or template file is not read: not a regular file (FIFO, device), or over the size limit",
    "CR102": "a regular expression repeats a repetition ambiguously (nested quantifiers) on the backtracking engine",
    "CR103": "a template exceeds a rendering limit (operations, characters, integer size) in the trial render",
    "CR104": "a number in the pack is not usable: an integer with too many digits, or .nan / .inf",
    "CR130": "a compressor's failure pattern does not compile",
    "CR131": "a compressor's failure pattern matches an empty line (it would protect every line)",
    "CR140": "a request breaks a rule of its provider's API (ctxrules.formats validators)",
    "CR141": "a request cannot be read in the format given (neither OpenAI nor Anthropic with --format auto)",
    "CR145": "a store cannot be selected (unknown URL scheme, --store with --state, a missing backend extra)",
    "CR146": "a session archive cannot be imported (not an archive, truncated, damaged, or the session exists)",
    "CR147": "the session named is not in the store (sessions export, vault get --session, mcp --session)",
    "CR148": "the Redis store cannot be used (unreachable, no answer in time, a refused command, a bad URL option)",
    "CR149": "a session's prepare lock: held elsewhere past lock_timeout_s (Redis; file:// with it), or lease lost",
    "CR150": "sessions export: the injected messages of the session are signed with a key its store does not hold",
    "CR125": "deprecated key: guards.subagents.max_descendants is an alias of budgets.max_descendants",
}
