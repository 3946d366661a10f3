"""The seven token kinds of one model call, read from whatever shape a provider reports.

ctxrules keeps usage in one convention (the one litellm normalizes every provider to):

- ``prompt``: every input token, **including** the cached ones and the ones written to the cache;
- ``completion``: every output token, **including** the reasoning ones;
- ``cached``: prompt tokens read from the provider's prompt cache;
- ``cache_write``: prompt tokens written to the cache (Anthropic's cache creation);
- ``reasoning``: completion tokens spent on hidden reasoning;
- ``citation``: citation tokens (Perplexity), billed apart from the prompt;
- ``total``: as reported, else ``prompt + completion``.

:func:`parse_usage` accepts a whole response or its usage object, in the OpenAI
chat-completions and Responses shapes, litellm's, Anthropic's, Gemini's, DeepSeek's and
Perplexity's, and ctxrules' own (the seven names above). A failed call has no usage:
:func:`is_failed_response` tells the caller not to record one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Final, Literal

from ctxrules.errors import UsageError

__all__ = ["TOKEN_KINDS", "TokenUsage", "UsageFormat", "is_failed_response", "parse_usage"]

TOKEN_KINDS: Final = (
    "prompt",
    "completion",
    "cached",
    "cache_write",
    "reasoning",
    "citation",
    "total",
)
UsageFormat = Literal["auto", "ctxrules", "openai", "responses", "anthropic", "gemini"]


@dataclass(frozen=True)
class TokenUsage:
    """Token counts of one call (or a sum of calls) in ctxrules' convention (module docstring)."""

    prompt: int = 0
    completion: int = 0
    cached: int = 0
    cache_write: int = 0
    reasoning: int = 0
    citation: int = 0
    total: int = 0

    @classmethod
    def of(
        cls,
        *,
        prompt: int = 0,
        completion: int = 0,
        cached: int = 0,
        cache_write: int = 0,
        reasoning: int = 0,
        citation: int = 0,
        total: int | None = None,
    ) -> TokenUsage:
        """Checked construction; ``total`` defaults to ``prompt + completion``.

        Raises :class:`UsageError` for negative counts, more cached/written tokens than prompt
        tokens, or more reasoning tokens than completion tokens: such numbers would price a
        call wrongly, so they are refused rather than recorded.
        """
        values = {
            "prompt": prompt,
            "completion": completion,
            "cached": cached,
            "cache_write": cache_write,
            "reasoning": reasoning,
            "citation": citation,
            "total": prompt + completion if total is None else total,
        }
        for name, value in values.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise UsageError(f"token count '{name}' must be a whole number >= 0, got {value!r}")
        if cached + cache_write > prompt:
            raise UsageError(
                f"cached ({cached}) + cache_write ({cache_write}) tokens exceed the "
                f"prompt tokens ({prompt}); prompt counts every input token, cached ones included"
            )
        if reasoning > completion:
            raise UsageError(
                f"reasoning tokens ({reasoning}) exceed the completion tokens ({completion}); "
                "completion counts every output token, reasoning ones included"
            )
        return cls(**values)

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(*(a + b for a, b in zip(self.as_tuple(), other.as_tuple(), strict=True)))

    def as_tuple(self) -> tuple[int, int, int, int, int, int, int]:
        return (
            self.prompt,
            self.completion,
            self.cached,
            self.cache_write,
            self.reasoning,
            self.citation,
            self.total,
        )

    def as_dict(self) -> dict[str, int]:
        # Not dataclasses.asdict: that deep-copies every field, and a report builds several.
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def uncached_prompt(self) -> int:
        """Prompt tokens billed at the plain input rate."""
        return max(0, self.prompt - self.cached - self.cache_write)

    @property
    def text_completion(self) -> int:
        """Completion tokens that are not reasoning."""
        return max(0, self.completion - self.reasoning)

    @property
    def cache_hit_share(self) -> float:
        """Share of the prompt served from the cache (0 when there was no prompt)."""
        return self.cached / self.prompt if self.prompt else 0.0


def is_failed_response(obj: object) -> bool:
    """Whether ``obj`` is the body of a failed call (an ``error`` and no usage): record nothing."""
    if not isinstance(obj, Mapping):
        return False
    has_usage = any(k in obj for k in ("usage", "usageMetadata", "usage_metadata"))
    return not has_usage and obj.get("error") not in (None, False, "")


def parse_usage(obj: object, fmt: UsageFormat = "auto") -> TokenUsage:
    """The usage of a response (or of a bare usage object) in ctxrules' convention.

    ``fmt`` names the shape when the keys alone are ambiguous; ``auto`` recognizes it by its
    keys. Raises :class:`UsageError` naming what was wrong when nothing usable is there.
    """
    if not isinstance(obj, Mapping):
        raise UsageError(f"usage must be a JSON object, got {_kind(obj)}")
    if is_failed_response(obj):
        raise UsageError(
            "the response is an error and carries no usage: a failed call records nothing"
        )
    inner = obj
    for key in ("usage", "usageMetadata", "usage_metadata"):
        if isinstance(obj.get(key), Mapping):
            inner = obj[key]
            break
    detected = _detect(inner) if fmt == "auto" else fmt
    if detected is None:
        keys = ", ".join(sorted(str(k) for k in inner)) or "none"
        raise UsageError(
            "no token counts found (keys: " + keys + "); expected e.g. prompt_tokens/"
            "completion_tokens (OpenAI), input_tokens/output_tokens (Anthropic), "
            "promptTokenCount (Gemini) or prompt/completion (ctxrules)"
        )
    parser = _PARSERS[detected]
    return parser(inner)


# --- shapes -----------------------------------------------------------------------------------


def _detect(u: Mapping[str, Any]) -> UsageFormat | None:
    if "promptTokenCount" in u or "candidatesTokenCount" in u or "prompt_token_count" in u:
        return "gemini"
    if "prompt_tokens" in u or "completion_tokens" in u:
        return "openai"
    if "input_tokens" in u or "output_tokens" in u:
        # The Responses API counts cached tokens inside input_tokens and says so with details;
        # Anthropic counts them apart and names them cache_*_input_tokens.
        if any(
            k in u for k in ("input_tokens_details", "output_tokens_details", "total_tokens")
        ) and not any(k in u for k in ("cache_read_input_tokens", "cache_creation_input_tokens")):
            return "responses"
        return "anthropic"
    if "prompt" in u or "completion" in u:
        return "ctxrules"
    return None


def _int(u: Mapping[str, Any], key: str, where: str = "") -> int:
    value = u.get(key)
    if value is None:
        return 0
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or value < 0
        or value != int(value)
    ):
        raise UsageError(f"usage field '{where}{key}' must be a whole number >= 0, got {value!r}")
    return int(value)


def _details(u: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = u.get(key)
    return value if isinstance(value, Mapping) else {}


def _ctxrules(u: Mapping[str, Any]) -> TokenUsage:
    total = u.get("total")
    return TokenUsage.of(
        prompt=_int(u, "prompt"),
        completion=_int(u, "completion"),
        cached=_int(u, "cached"),
        cache_write=_int(u, "cache_write"),
        reasoning=_int(u, "reasoning"),
        citation=_int(u, "citation"),
        total=None if total is None else _int(u, "total"),
    )


def _openai(u: Mapping[str, Any]) -> TokenUsage:
    prompt = _int(u, "prompt_tokens")
    completion = _int(u, "completion_tokens")
    pd = _details(u, "prompt_tokens_details")
    cd = _details(u, "completion_tokens_details")
    # litellm puts Anthropic's cache counts both at top level and in the details; DeepSeek
    # reports hits and misses at top level.
    cached = (
        _int(pd, "cached_tokens", "prompt_tokens_details.")
        or _int(u, "cache_read_input_tokens")
        or _int(u, "prompt_cache_hit_tokens")
    )
    cache_write = (
        _int(pd, "cache_creation_tokens", "prompt_tokens_details.")
        or _int(pd, "cache_write_tokens", "prompt_tokens_details.")
        or _int(u, "cache_creation_input_tokens")
    )
    reasoning = _int(cd, "reasoning_tokens", "completion_tokens_details.") or _int(
        u, "reasoning_tokens"
    )
    total = u.get("total_tokens")
    return TokenUsage.of(
        prompt=prompt,
        completion=completion,
        cached=cached,
        cache_write=cache_write,
        reasoning=reasoning,
        citation=_int(u, "citation_tokens"),
        total=None if total is None else _int(u, "total_tokens"),
    )


def _responses(u: Mapping[str, Any]) -> TokenUsage:
    prompt = _int(u, "input_tokens")
    completion = _int(u, "output_tokens")
    cached = _int(_details(u, "input_tokens_details"), "cached_tokens", "input_tokens_details.")
    reasoning = _int(
        _details(u, "output_tokens_details"), "reasoning_tokens", "output_tokens_details."
    )
    total = u.get("total_tokens")
    return TokenUsage.of(
        prompt=prompt,
        completion=completion,
        cached=cached,
        reasoning=reasoning,
        total=None if total is None else _int(u, "total_tokens"),
    )


def _anthropic(u: Mapping[str, Any]) -> TokenUsage:
    # Anthropic's input_tokens are only the uncached ones: the prompt is the sum of all three.
    uncached = _int(u, "input_tokens")
    cached = _int(u, "cache_read_input_tokens")
    written = _int(u, "cache_creation_input_tokens")
    completion = _int(u, "output_tokens")
    return TokenUsage.of(
        prompt=uncached + cached + written,
        completion=completion,
        cached=cached,
        cache_write=written,
    )


def _gemini(u: Mapping[str, Any]) -> TokenUsage:
    def pick(camel: str, snake: str) -> int:
        return _int(u, camel) if camel in u else _int(u, snake)

    # Gemini's candidates exclude the thoughts; tool-use prompt tokens are input too.
    prompt = pick("promptTokenCount", "prompt_token_count") + pick(
        "toolUsePromptTokenCount", "tool_use_prompt_token_count"
    )
    thoughts = pick("thoughtsTokenCount", "thoughts_token_count")
    completion = pick("candidatesTokenCount", "candidates_token_count") + thoughts
    cached = pick("cachedContentTokenCount", "cached_content_token_count")
    total_key = "totalTokenCount" if "totalTokenCount" in u else "total_token_count"
    total = u.get(total_key)
    return TokenUsage.of(
        prompt=prompt,
        completion=completion,
        cached=cached,
        reasoning=thoughts,
        total=None if total is None else _int(u, total_key),
    )


_PARSERS: Final = {
    "ctxrules": _ctxrules,
    "openai": _openai,
    "responses": _responses,
    "anthropic": _anthropic,
    "gemini": _gemini,
}


def _kind(value: object) -> str:
    return {list: "a list", str: "a string", type(None): "null"}.get(
        type(value), type(value).__name__
    )
