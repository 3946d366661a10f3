"""The per-message token counts a session keeps with its last output (``state.json``'s
``last.output_counts``): a warm turn counts only the messages that are new at their position
and writes their text where it changed, and both must be what counting the whole output gives."""

from __future__ import annotations

import random
from typing import Any

import pytest

from ctxrules.pipeline.prefix import PrefixCache, counts_text, parse_counts
from ctxrules.tokens import TokenCounter


def _message(rng: random.Random) -> dict[str, Any]:
    return {"role": rng.choice(["user", "assistant", "tool"]), "content": "word " * rng.randint(0, 40)}


@pytest.mark.parametrize("seed", range(30))
def test_counts_kept_from_turn_to_turn_are_those_of_the_whole_output(seed: int) -> None:
    rng = random.Random(seed)
    counter = TokenCounter.for_tokenizer("o200k_base")
    cache = PrefixCache()
    output: list[dict[str, Any]] = [_message(rng) for _ in range(rng.randint(1, 90))]
    cache.output, cache.output_counts = output, counter.count_each(output)
    cache.output_counts_text = counts_text(cache.output_counts)
    for turn in range(30):
        output = list(output)
        kind = rng.random()
        if kind < 0.45:  # the newest messages replaced (moved breakpoints), some appended
            for _ in range(rng.randint(1, 3)):
                i = len(output) - 1 - min(rng.randrange(8), len(output) - 1)
                output[i] = _message(rng)
            output.extend(_message(rng) for _ in range(rng.randint(0, 3)))
        elif kind < 0.6:  # some anywhere (a compaction)
            for _ in range(rng.randint(1, 5)):
                output[rng.randrange(len(output))] = _message(rng)
        elif kind < 0.75:  # shorter, then perhaps new ones
            output = output[: rng.randint(1, len(output))]
            output.extend(_message(rng) for _ in range(rng.randint(0, 2)))
        else:  # appended only
            output.extend(_message(rng) for _ in range(rng.randint(0, 4)))
        counts, text = cache.counts_of(output, 1, counter)
        assert counts == counter.count_each(output), f"turn {turn}"
        assert text == counts_text(counts) and parse_counts(text) == counts, f"turn {turn}"
        cache.output, (cache.output_counts, cache.output_counts_text) = output, (counts, text)
