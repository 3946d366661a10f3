"""The optional LLM judge (``ctxrules eval --judge MODEL``): at the last call of each transcript,
a model answers the probe questions from the prepared context alone, and each answer is graded
against the original probe texts.

Grading is deterministic: an answer passes when it holds at least :data:`PASS_SCORE` of a
probe's content words (the words the summary audit grounds a goal with: lower-cased, paths and
identifiers whole and by their parts, stop words out). One call per (transcript, plan); without
``--judge`` nothing here runs and nothing needs the network.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ctxrules.eval.probes import CATEGORIES, Probe
from ctxrules.llm import call_within, load_litellm
from ctxrules.summarize.grounding import content_words

__all__ = ["PASS_SCORE", "QUESTIONS", "grade", "judge_request", "parse_answers"]

PASS_SCORE = 0.5
JUDGE_TIMEOUT_S = 120.0  # the whole answer of one judge call, in seconds (--judge-timeout)
QUESTIONS: Mapping[str, str] = {
    "anchor": "What did the user first ask for? Quote it as closely as you can.",
    "latest_ask": "What is the user's latest request? Quote it as closely as you can.",
    "edited_files": "Which files have been edited so far? List their paths.",
    "errors": "What were the most recent error messages? Quote the error lines.",
    "commands": "Which shell commands ran most recently? List them verbatim.",
    "test_status": "What was the outcome of the last test run (its summary or exit status line)?",
}
_JSON = re.compile(r"\{.*\}", re.S)


def judge_request(context: Sequence[Mapping[str, Any]], categories: Sequence[str]) -> list[dict[str, Any]]:
    """The messages of the judge call: the prepared context, then one question per category."""
    asked = {c: QUESTIONS[c] for c in categories}
    question = (
        "Answer from the conversation above only, as one JSON object whose keys are "
        f"{', '.join(asked)} and whose values are strings:\n" + "\n".join(f"- {k}: {q}" for k, q in asked.items())
    )
    return [*(dict(m) for m in context), {"role": "user", "content": question}]


def parse_answers(text: str) -> dict[str, str]:
    """The answers in the judge's reply (``{}`` when it holds no JSON object)."""
    match = _JSON.search(text or "")
    if match is None:
        return {}
    try:
        value = json.loads(match.group(0))
    except (ValueError, RecursionError):  # a reply nested past the parser's stack is no answer
        return {}
    if not isinstance(value, dict):
        return {}
    return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in value.items()}


def grade(probes: Sequence[Probe], answers: Mapping[str, str]) -> dict[str, dict[str, int]]:
    """Per category, probes the answers hold (``passed``) and do not (``failed``)."""
    out = {c: {"passed": 0, "failed": 0} for c in CATEGORIES}
    said: dict[str, set[str]] = {}
    for probe in probes:
        if probe.category not in said:
            said[probe.category] = set(content_words(answers.get(probe.category, "")))
        wanted = set(content_words(probe.text))
        ok = bool(wanted) and len(wanted & said[probe.category]) >= PASS_SCORE * len(wanted)
        out[probe.category]["passed" if ok else "failed"] += 1
    return out


def ask(model: str, messages: list[dict[str, Any]], *, api_base: str | None, timeout_s: float = JUDGE_TIMEOUT_S) -> str:
    """One completion through litellm (imported only here), given up after ``timeout_s``
    seconds however the server answers (:func:`ctxrules.llm.call_within`): a judge that
    never finishes its answer costs the replay that long, not for ever."""
    litellm = load_litellm()
    kwargs: dict[str, Any] = {"model": model, "messages": messages, "temperature": 0, "timeout": timeout_s}
    if api_base:
        kwargs["api_base"] = api_base
        kwargs.setdefault("api_key", os.environ.get("CTXRULES_JUDGE_API_KEY", "unused"))
    response = call_within(litellm.completion, kwargs, timeout_s, name="ctxrules-judge")
    return str(response.choices[0].message.content or "")
