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

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Final, Literal

from ctxrules.errors import UsageError

__all__ = ["TOKEN_KINDS", "TokenUsage", "UsageFormat", "as_mapping", "is_failed_response", "parse_usage", "reply_text"]

TOKEN_KINDS: Final = (
    "prompt",
    "completion",
    "cached",
    "cache_write",
    "reasoning",
    "citation",
    "total",
)
# No call reports more tokens than this (a thousand trillion); larger counts are input errors,
# refused before they reach the prices (floats) and the ledgers.
MAX_TOKENS: Final = 10**15
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
            if value > MAX_TOKENS:
                raise UsageError(f"token count '{name}' is {value}, more than one call can have ({MAX_TOKENS:.0e})")
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
    """Whether ``obj`` is the body of a failed call (an ``error`` and no usage, or a null one):
    record nothing."""
    if not isinstance(obj, Mapping):
        try:
            obj = as_mapping(obj)
        except UsageError:
            return False
    # ``"usage": null`` is no usage (an SDK object's None attribute is not read either).
    has_usage = any(obj.get(k) is not None for k in ("usage", "usageMetadata", "usage_metadata"))
    return not has_usage and obj.get("error") not in (None, False, "")


def reply_text(response: object) -> str:
    """The text a model's reply is counted by when its usage is missing (``session.complete``,
    a cache probe): the first choice's content and its tool calls' names and arguments."""

    def get(obj: Any, name: str) -> Any:
        return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)

    choices = get(response, "choices") or [None]
    reply = get(choices[0], "message") if choices[0] is not None else None
    if reply is None:
        return ""
    content = get(reply, "content")
    parts = [content] if isinstance(content, str) else []
    for call in get(reply, "tool_calls") or []:
        fn = get(call, "function")
        parts.extend(p for p in (get(fn, "name"), get(fn, "arguments")) if isinstance(p, str))
    return "".join(parts)


def parse_usage(obj: object, fmt: UsageFormat = "auto") -> TokenUsage:
    """The usage of a response (or of a bare usage object) in ctxrules' convention.

    ``fmt`` names the shape when the keys alone are ambiguous; ``auto`` recognizes it by its
    keys. ``obj`` may be a dict or an SDK object (litellm's ``ModelResponse`` / ``Usage``, the
    openai and anthropic SDKs' responses, usage objects and streaming events): see
    :func:`as_mapping`. Raises :class:`UsageError` naming what was wrong when nothing usable is
    there.
    """
    obj = as_mapping(obj)
    if is_failed_response(obj):
        raise UsageError("the response is an error and carries no usage: a failed call records nothing")
    inner = _usage_part(obj)
    detected = _detect(inner) if fmt == "auto" else fmt
    if fmt != "auto" and not _SHAPE_KEYS[fmt] & inner.keys():
        # A response with none of the named shape's counts (a stream without include_usage,
        # another provider's usage) is no call of zero tokens.
        keys = ", ".join(sorted(str(k) for k in inner)) or "none"
        raise UsageError(
            f"no token counts of the {fmt} shape found (keys: {keys}); expected one of "
            + ", ".join(sorted(_SHAPE_KEYS[fmt]))
            + " (--shape auto recognizes the shape by its keys)"
        )
    if detected is None:
        keys = ", ".join(sorted(str(k) for k in inner)) or "none"
        if _is_stream_chunk(obj):
            raise UsageError(
                "this streaming chunk carries no usage: only the stream's last chunk does "
                "(OpenAI: stream_options={'include_usage': True}; Anthropic: the message_delta "
                "event); record that one"
            )
        raise UsageError(
            "no token counts found (keys: " + keys + "); expected e.g. prompt_tokens/"
            "completion_tokens (OpenAI), input_tokens/output_tokens (Anthropic), "
            "promptTokenCount (Gemini) or prompt/completion (ctxrules)"
        )
    parser = _PARSERS[detected]
    return parser(inner)


# --- objects ----------------------------------------------------------------------------------

# The usage attributes an SDK object may expose without ``model_dump`` (read by name).
_USAGE_ATTRIBUTES: Final = (
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "prompt_tokens_details",
    "completion_tokens_details",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "prompt_cache_hit_tokens",
    "reasoning_tokens",
    "citation_tokens",
    "input_tokens",
    "output_tokens",
    "input_tokens_details",
    "output_tokens_details",
    "promptTokenCount",
    "candidatesTokenCount",
    "thoughtsTokenCount",
    "cachedContentTokenCount",
    "totalTokenCount",
    "toolUsePromptTokenCount",
    "prompt_token_count",
    "candidates_token_count",
    "thoughts_token_count",
    "cached_content_token_count",
    "total_token_count",
    "tool_use_prompt_token_count",
    "cached_tokens",
    "cache_creation_tokens",
    "cache_write_tokens",
    *TOKEN_KINDS,
)
_CONTAINERS: Final = ("usage", "usageMetadata", "usage_metadata", "message")


def as_mapping(obj: object, *, depth: int = 0) -> Mapping[str, Any]:
    """``obj`` as plain JSON-like data: a Mapping as it is; a pydantic object (litellm, openai,
    anthropic SDKs) through ``model_dump()``; any other object through its usage attributes
    (``usage``, ``prompt_tokens``, ``input_tokens``, ...). Raises :class:`UsageError` for
    anything else (a string, a number, a list, an object with none of those attributes)."""
    if isinstance(obj, Mapping):
        return obj
    if obj is None or isinstance(obj, str | bytes | int | float | list | tuple):
        raise UsageError(f"usage must be a JSON object or a response/usage object, got {_kind(obj)}")
    dump = getattr(obj, "model_dump", None)
    if callable(dump):
        try:
            data = dump()
        except Exception as exc:  # a broken SDK object: say which, not a traceback from inside it
            raise UsageError(
                f"could not read the usage of {type(obj).__name__}: model_dump() failed: {type(exc).__name__}: {exc}"
            ) from exc
        if isinstance(data, Mapping):
            return data
    if depth > 3:
        raise UsageError(f"usage must be a JSON object or a response/usage object, got {_kind(obj)}")
    out: dict[str, Any] = {}
    for name in (*_CONTAINERS, *_USAGE_ATTRIBUTES, "type", "error"):
        try:
            value = getattr(obj, name, None)
        except Exception:  # a property that raises is as good as absent
            continue
        if value is None or callable(value):
            continue
        if isinstance(value, bool | int | float | str | Mapping):
            out[name] = value
        else:
            out[name] = as_mapping(value, depth=depth + 1)
    if not out:
        raise UsageError(
            f"usage must be a JSON object or a response/usage object, got {_kind(obj)} "
            "(it has no usage, prompt_tokens or input_tokens attribute)"
        )
    return out


def _usage_part(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """The usage inside a response, a streaming chunk or an Anthropic ``message_start`` event."""
    for key in ("usage", "usageMetadata", "usage_metadata"):
        if isinstance(obj.get(key), Mapping):
            return obj[key]  # type: ignore[no-any-return]  # Mapping[str, Any] by the check
    message = obj.get("message")
    if obj.get("type") == "message_start" and isinstance(message, Mapping):
        return _usage_part(message)
    return obj


def _is_stream_chunk(obj: Mapping[str, Any]) -> bool:
    kind = obj.get("object") or obj.get("type")
    choices = obj.get("choices")
    return kind in (
        "chat.completion.chunk",
        "content_block_delta",
        "content_block_start",
        "content_block_stop",
        "message_stop",
        "ping",
    ) or (isinstance(choices, list) and any(isinstance(c, Mapping) and "delta" in c for c in choices))


# --- shapes -----------------------------------------------------------------------------------


def _detect(u: Mapping[str, Any]) -> UsageFormat | None:
    if "promptTokenCount" in u or "candidatesTokenCount" in u or "prompt_token_count" in u:
        return "gemini"
    if "prompt_tokens" in u or "completion_tokens" in u:
        return "openai"
    if "input_tokens" in u or "output_tokens" in u:
        # The Responses API counts cached tokens inside input_tokens and says so with details;
        # Anthropic counts them apart and names them cache_*_input_tokens.
        if any(k in u for k in ("input_tokens_details", "output_tokens_details", "total_tokens")) and not any(
            k in u for k in ("cache_read_input_tokens", "cache_creation_input_tokens")
        ):
            return "responses"
        return "anthropic"
    if "prompt" in u or "completion" in u:
        return "ctxrules"
    return None


def _int(u: Mapping[str, Any], key: str, where: str = "") -> int:
    value = u.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise UsageError(f"usage field '{where}{key}' must be a whole number >= 0, got {value!r}")
    if value > MAX_TOKENS:
        raise UsageError(f"usage field '{where}{key}' is {value!r}, more than one call can have ({MAX_TOKENS:.0e})")
    if value != int(value):
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
    reasoning = _int(cd, "reasoning_tokens", "completion_tokens_details.") or _int(u, "reasoning_tokens")
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
    reasoning = _int(_details(u, "output_tokens_details"), "reasoning_tokens", "output_tokens_details.")
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


# The counts each shape's parser reads (the usage object's own keys, details aside).
_SHAPE_KEYS: Final[dict[str, frozenset[str]]] = {
    "ctxrules": frozenset(TOKEN_KINDS) | {"total"},
    "openai": frozenset({"prompt_tokens", "completion_tokens", "total_tokens", "prompt_cache_hit_tokens"}),
    "responses": frozenset({"input_tokens", "output_tokens", "total_tokens"}),
    "anthropic": frozenset({"input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"}),
    "gemini": frozenset(
        {
            "promptTokenCount",
            "candidatesTokenCount",
            "totalTokenCount",
            "prompt_token_count",
            "candidates_token_count",
            "total_token_count",
        }
    ),
}

_PARSERS: Final = {
    "ctxrules": _ctxrules,
    "openai": _openai,
    "responses": _responses,
    "anthropic": _anthropic,
    "gemini": _gemini,
}


def _kind(value: object) -> str:
    return {list: "a list", str: "a string", type(None): "null"}.get(type(value), type(value).__name__)
