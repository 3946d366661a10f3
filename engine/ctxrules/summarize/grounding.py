"""Deterministic word overlap: is a claim grounded in what the user wrote?

Text is reduced to **content words**: lower-cased tokens of letters/digits (with ``_``, and
``.``/``/``/``-`` inside a token, so ``test_api.py`` and ``src/app.ts`` stay whole and also
count by their parts), at least 3 characters long or a number, minus a stop-word list, with a
light suffix stemming (``tests``/``testing``/``tested`` → ``test``). Each CJK character counts as
a word (no segmentation needed for overlap).

``overlap(claim, source)`` is the share of the claim's distinct content words found in the
source (used to match summary entries with each other when merging).

:class:`GroundingSource` answers the auditor's question, "does this claim come from what the
user wrote?", more strictly, because a long source (a pasted issue, an agent harness's earlier
summary) contains most everyday words somewhere:

- **weights**: words of :data:`COMMON_WORDS` (everyday English and generic programming
  vocabulary: *file*, *fix*, *value*, *test*, ...) weigh :data:`COMMON_WEIGHT` (0.1); every
  other content word (names, identifiers, domain terms) weighs 1;
- **passage**: the claim is scored against the best window of :data:`PASSAGE_WORDS` (80)
  consecutive content words of the source, not against all of it: a grounded claim comes from
  one place, not from words scattered over pages;
- **score** = weight of the claim's words found in that best window / weight of all its words.

Calibrated on the real transcripts (tests/test_summarize_audit.py): plausible goals score
0.67-1.0 against their own conversation, goals of other projects at most 0.42.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import cache, lru_cache
from typing import TYPE_CHECKING

__all__ = [
    "COMMON_WEIGHT",
    "COMMON_WORDS",
    "PASSAGE_WORDS",
    "GroundingSource",
    "content_words",
    "overlap",
    "shared_words",
    "word_sequence",
]


# Compiled on first use, not at import: every stage module imports this one (through the
# summarizer), and only an audit or a merge of summaries runs it.
@cache
def _token_patterns() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """(a token, a single CJK character)."""
    return (
        re.compile(r"[A-Za-z0-9_]+(?:[./-][A-Za-z0-9_]+)*|[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]"),
        re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]"),
    )


# Function words and the verbs every request uses ("please make it work"): sharing them says
# nothing about whether two texts talk about the same thing.
_STOP = frozenset(
    [
        "a",
        "about",
        "above",
        "after",
        "again",
        "against",
        "all",
        "also",
        "am",
        "an",
        "and",
        "any",
        "are",
        "aren",
        "as",
        "at",
        "be",
        "because",
        "been",
        "before",
        "being",
        "below",
        "between",
        "both",
        "but",
        "by",
        "can",
        "cannot",
        "could",
        "did",
        "didn",
        "do",
        "does",
        "doesn",
        "doing",
        "don",
        "down",
        "during",
        "each",
        "few",
        "for",
        "from",
        "further",
        "had",
        "has",
        "have",
        "having",
        "he",
        "her",
        "here",
        "hers",
        "herself",
        "him",
        "himself",
        "his",
        "how",
        "i",
        "if",
        "in",
        "into",
        "is",
        "isn",
        "it",
        "its",
        "itself",
        "just",
        "let",
        "me",
        "more",
        "most",
        "my",
        "myself",
        "no",
        "nor",
        "not",
        "now",
        "of",
        "off",
        "on",
        "once",
        "only",
        "or",
        "other",
        "ought",
        "our",
        "ours",
        "ourselves",
        "out",
        "over",
        "own",
        "same",
        "she",
        "should",
        "so",
        "some",
        "such",
        "than",
        "that",
        "the",
        "their",
        "theirs",
        "them",
        "themselves",
        "then",
        "there",
        "these",
        "they",
        "this",
        "those",
        "through",
        "to",
        "too",
        "under",
        "until",
        "up",
        "very",
        "was",
        "wasn",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "while",
        "who",
        "whom",
        "why",
        "will",
        "with",
        "won",
        "would",
        "you",
        "your",
        "yours",
        "yourself",
        "yourselves",
        "please",
        "thanks",
        "thank",
        "okay",
        "ok",
        "yes",
        "yeah",
        "sure",
        "hi",
        "hello",
        "hey",
        "need",
        "needs",
        "want",
        "wants",
        "like",
        "make",
        "makes",
        "made",
        "get",
        "gets",
        "got",
        "use",
        "used",
        "using",
        "should",
        "shall",
        "may",
        "might",
        "must",
        "one",
        "two",
        "also",
        "still",
        "then",
        "via",
        "per",
        "etc",
        "new",
        "something",
        "anything",
        "everything",
        "thing",
        "things",
        "way",
        "able",
        "sure",
        "lets",
        "let's",
        "its",
        "it's",
        "i'm",
        "we're",
        "you're",
        "user",
        "users",
        "assistant",
        "agent",
        "task",
        "tasks",
        "work",
        "working",
        "done",
        "do",
        "does",
    ]
)


@lru_cache(maxsize=8192)
def _stem(word: str) -> str:
    if not word.isalpha() or len(word) <= 4:
        return word
    for suffix, keep in (
        ("ies", "y"),
        ("ied", "y"),
        ("ing", ""),
        ("ed", ""),
        ("es", ""),
        ("s", ""),
    ):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            stem = word[: len(word) - len(suffix)] + keep
            if suffix == "es" and not re.search(r"(?:ss|sh|ch|x|z)$", stem):
                stem = word[:-1]  # "files" -> "file", but "fixes" -> "fix"
            if suffix in ("ing", "ed") and len(stem) >= 2 and stem[-1] == stem[-2] and stem[-1] not in "lsz":
                stem = stem[:-1]  # "running" -> "run", "stopped" -> "stop"
            return stem
    return word


def _words_of_token(token: str, cjk: re.Pattern[str]) -> Iterable[str]:
    lowered = token.lower()
    if cjk.fullmatch(lowered):
        yield lowered
        return
    parts = re.split(r"[./_-]", lowered) if re.search(r"[./_-]", lowered) else []
    # Numbers count from two digits ("42", "4.2"); the single digits of a version string or a
    # list ("1.", "2.") say nothing about the topic.
    if (len(lowered) >= 3 or (lowered.isdigit() and len(lowered) >= 2)) and lowered not in _STOP:
        yield _stem(lowered)
    for part in parts:
        if len(part) >= 3 and part not in _STOP:
            yield _stem(part)


def word_sequence(text: str) -> list[str]:
    """The content words of ``text`` in order (with repeats)."""
    token, cjk = _token_patterns()
    return [w for t in token.findall(text) for w in _words_of_token(t, cjk)]


def content_words(text: str) -> frozenset[str]:
    """The distinct content words of ``text`` (see the module docstring)."""
    token, cjk = _token_patterns()
    return frozenset(w for t in token.findall(text) for w in _words_of_token(t, cjk))


def shared_words(claim: str, source: str | frozenset[str]) -> frozenset[str]:
    source_words = source if isinstance(source, frozenset) else content_words(source)
    return content_words(claim) & source_words


def overlap(claim: str, source: str | frozenset[str]) -> float:
    """The share of ``claim``'s content words that also occur in ``source`` (0 when the claim
    has none)."""
    words = content_words(claim)
    if not words:
        return 0.0
    source_words = source if isinstance(source, frozenset) else content_words(source)
    return len(words & source_words) / len(words)


_COMMON_TEXT = """
able about access action actually add added address after again against all allow already
also although always among amount another answer any anything api app apply approach area
argument arguments around array ask attribute attributes available back bad base based basic
because become before begin behavior behaviour being best better between big bit block body
both bottom branch break bug build built but button call called calls can case cases cause
caused change changed changes character check checked class classes clean clear click close
code collection column command commands comment commit common compare complete condition
config configuration consider contain contains content context continue convert copy correct
correctly could count create created current data date debug default define defined delete
describe description detail details different directory document documentation does done
down during each easy edit either element else empty end enough entry environment equal
error errors even event every example exception exist existing expect expected explain extra
fail failed failing fails failure false feature field fields file files find first fix fixed
fixes follow following form format found free full function functions get give given global
good got great group handle handler happen has have help here high how however idea
implement implementation import important include included including incorrect index info
information input inside install instead instance into issue issues item items its just keep
key kind know large last later least left length less let level library like line lines link
list little load local location log long look looks lot main make many match may mean
message method methods might mode model module more most move much must name names need
needed new next node none normal not note nothing now null number object objects off old
once one only open option optional options order other output over own package page part
pass passed path pattern place point possible post print problem problems process project
property provide put python query question quite raise raised raises range rather read real
reason record reference regression related release remove replace report request required
result results return returns right root rule run running runs same save second see seems
select send server service set setting settings should show side similar simple since single
size small solution some something source space specific start state status step still stop
string structure such support sure system table take task test tested testing tests text
than that the their them then there these thing think this those though through time too
tool top true try type types under update use used user using valid value values variable
version view want way well what when where whether which while why will window with within
without work working works world would write wrong yes yet
"""


@cache
def common_words() -> frozenset[str]:
    """Everyday English and generic programming words: they weigh little in grounding (also
    importable as :data:`COMMON_WORDS`; built on first use, not at import)."""
    return frozenset({_stem(w) for w in _COMMON_TEXT.split()} | set(_COMMON_TEXT.split()))


if TYPE_CHECKING:
    COMMON_WORDS: frozenset[str]


def __getattr__(name: str) -> frozenset[str]:
    if name == "COMMON_WORDS":  # PEP 562: computed on first access
        return common_words()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


COMMON_WEIGHT = 0.1
PASSAGE_WORDS = 80


def _weight(word: str) -> float:
    return COMMON_WEIGHT if word in common_words() else 1.0


class GroundingSource:
    """A source text prepared for scoring claims against its best passage."""

    def __init__(self, text: str, *, window: int = PASSAGE_WORDS) -> None:
        self.text = text
        self.window = max(1, window)
        self.sequence = word_sequence(text)
        self.words = frozenset(self.sequence)

    def score(self, claim: str) -> float:
        """Weighted share of ``claim``'s content words found in the best passage (0..1)."""
        weights = {w: _weight(w) for w in content_words(claim)}
        total = sum(weights.values())
        if not total:
            return 0.0
        if not weights.keys() & self.words:
            return 0.0
        if len(self.sequence) <= self.window:
            return sum(v for w, v in weights.items() if w in self.words) / total
        best = 0.0
        counts: dict[str, int] = {}
        seq = self.sequence
        for i, word in enumerate(seq):
            counts[word] = counts.get(word, 0) + 1
            if i >= self.window:
                old = seq[i - self.window]
                counts[old] -= 1
                if not counts[old]:
                    del counts[old]
            if word in weights:  # the window's score can only rise when a claim word enters
                found = sum(v for w, v in weights.items() if w in counts)
                if found > best:
                    best = found
                    if best >= total:
                        break
        return best / total
