"""The pack's ``summarizer:`` section, and which models the summarizer calls.

Options (defaults in :data:`DEFAULTS`; every key is documented in docs/summarization.md and in
the rule-pack schema):

- ``model``: ``lite`` (default) — the light model of the session model's family, from
  ``lite_models`` (falls back to the session model when the family has none); ``main`` — the
  session model; or any litellm model name.
- ``fallback``: tried when the summarizer model is missing or fails: ``main`` (default), a
  model name, or ``none`` (straight to the deterministic checkpoint).
- ``api_base`` / ``api_key_env`` / ``provider``: an OpenAI-compatible (or other litellm
  ``provider``) endpoint and the environment variable holding its key; they apply to every
  model the summarizer calls. Without ``api_key_env`` the provider's usual variable is used
  (:data:`PROVIDER_KEY_ENV`).
- ``inactivity_s`` / ``total_s``: progress-aware timeouts (reset by every streamed token /
  ceiling for the whole summarization).
- ``max_output_tokens``: reply budget of one summary.
- ``breaker: {failures, cooldown_s}``: the circuit breaker, per model.
- ``window``: the summarizer model's window, for models the registry does not know.
- ``on_small_window``: ``main`` (default) or ``trim`` — the auxiliary-ratio guard's choice when
  the summarizer's window is too small for the input.

**No credentials, no call.** A model is *callable* when its key variable is set or an
``api_base`` is configured. When no model of the chain is callable, nothing is called (litellm
is not even imported) and the deterministic checkpoint is used at once; the report says why.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ctxrules.models import ModelInfo, UnknownModelError, lookup_model

__all__ = [
    "DEFAULTS",
    "DEFAULT_LITE_MODELS",
    "NO_KEY_PLACEHOLDER",
    "PROVIDER_KEY_ENV",
    "Candidate",
    "SummarizerConfig",
    "resolve_chain",
]

DEFAULT_LITE_MODELS: dict[str, str] = {
    "openai": "gpt-4o-mini",
    "anthropic": "claude-haiku-4-5",
    "gemini": "gemini/gemini-2.5-flash-lite",
    "deepseek": "deepseek-chat",
    "qwen": "dashscope/qwen-turbo",
}
"""The light model per model family when a pack gives no ``lite_models``."""

DEFAULTS: dict[str, Any] = {
    "model": "lite",
    "fallback": "main",
    "inactivity_s": 90.0,
    "total_s": 600.0,
    "max_output_tokens": 4096,
    "breaker": {"failures": 3, "cooldown_s": 300.0},
    "on_small_window": "main",
}

# The environment variable litellm reads for each provider's key; a tuple means "any of".
PROVIDER_KEY_ENV: dict[str, tuple[str, ...]] = {
    "openai": ("OPENAI_API_KEY",),
    "text-completion-openai": ("OPENAI_API_KEY",),
    "azure": ("AZURE_API_KEY", "AZURE_OPENAI_API_KEY"),
    "anthropic": ("ANTHROPIC_API_KEY",),
    "gemini": ("GEMINI_API_KEY", "GOOGLE_API_KEY"),
    "vertex_ai": ("GOOGLE_APPLICATION_CREDENTIALS", "VERTEXAI_PROJECT"),
    "vertex_ai-language-models": ("GOOGLE_APPLICATION_CREDENTIALS", "VERTEXAI_PROJECT"),
    "bedrock": ("AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_ROLE_ARN"),
    "deepseek": ("DEEPSEEK_API_KEY",),
    "dashscope": ("DASHSCOPE_API_KEY",),
    "xai": ("XAI_API_KEY",),
    "mistral": ("MISTRAL_API_KEY",),
    "groq": ("GROQ_API_KEY",),
    "openrouter": ("OPENROUTER_API_KEY",),
    "together_ai": ("TOGETHERAI_API_KEY", "TOGETHER_API_KEY"),
    "fireworks_ai": ("FIREWORKS_AI_API_KEY", "FIREWORKS_API_KEY"),
    "cohere": ("COHERE_API_KEY",),
    "moonshot": ("MOONSHOT_API_KEY",),
    "zai": ("ZAI_API_KEY",),
    "perplexity": ("PERPLEXITYAI_API_KEY", "PERPLEXITY_API_KEY"),
    "cerebras": ("CEREBRAS_API_KEY",),
}
# Local servers that need no key (their default api_base is on this machine).
_KEYLESS_PROVIDERS = frozenset({"ollama", "ollama_chat", "lm_studio", "llamafile"})

NO_KEY_PLACEHOLDER = "ctxrules-no-key"
"""Sent as the key to an ``api_base`` that needs none (OpenAI clients insist on some key)."""

SmallWindowPolicy = Literal["main", "trim"]


@dataclass(frozen=True)
class SummarizerConfig:
    """The resolved ``summarizer:`` section."""

    model: str = "lite"
    fallback: str = "main"
    lite_models: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_LITE_MODELS))
    api_base: str | None = None
    api_key_env: str | None = None
    provider: str | None = None
    inactivity_s: float = 90.0
    total_s: float = 600.0
    max_output_tokens: int = 4096
    breaker_failures: int = 3
    breaker_cooldown_s: float = 300.0
    window: int | None = None
    on_small_window: SmallWindowPolicy = "main"

    @classmethod
    def from_pack(cls, pack: Mapping[str, Any]) -> SummarizerConfig:
        """From a resolved pack (validated already: types are right when present)."""
        section = pack.get("summarizer") or {}
        if not isinstance(section, Mapping):
            section = {}
        merged = {**DEFAULTS, **{k: v for k, v in section.items() if v is not None}}
        breaker = {**DEFAULTS["breaker"], **(merged.get("breaker") or {})}
        lite = section.get("lite_models")
        return cls(
            model=str(merged["model"]),
            fallback=str(merged["fallback"]),
            lite_models=dict(lite) if isinstance(lite, Mapping) else dict(DEFAULT_LITE_MODELS),
            api_base=_str_or_none(merged.get("api_base")),
            api_key_env=_str_or_none(merged.get("api_key_env")),
            provider=_str_or_none(merged.get("provider")),
            inactivity_s=float(merged["inactivity_s"]),
            total_s=float(merged["total_s"]),
            max_output_tokens=int(merged["max_output_tokens"]),
            breaker_failures=int(breaker["failures"]),
            breaker_cooldown_s=float(breaker["cooldown_s"]),
            window=int(merged["window"]) if isinstance(merged.get("window"), int) else None,
            on_small_window="trim" if merged.get("on_small_window") == "trim" else "main",
        )


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) and value.strip() else None


@dataclass(frozen=True)
class Candidate:
    """One model the summarizer may call, with what is needed to call it.

    ``role`` is ``primary`` or ``fallback``; ``name`` the model as resolved (``lite`` and
    ``main`` replaced); ``call_model`` the litellm model string; ``callable`` whether
    credentials are configured (``why_not`` says what is missing); ``window`` the model's
    input window when known.
    """

    role: str
    name: str
    call_model: str
    api_base: str | None
    api_key: str | None = field(default=None, repr=False)
    callable: bool = True
    why_not: str = ""
    window: int | None = None
    max_output: int | None = None
    info: ModelInfo | None = field(default=None, repr=False)
    notes: tuple[str, ...] = ()


def _resolve_name(spec: str, main: ModelInfo, config: SummarizerConfig) -> tuple[str, list[str]]:
    if spec == "main":
        return main.name, []
    if spec == "lite":
        lite = config.lite_models.get(main.family)
        if lite:
            return lite, []
        return main.name, [f"no lite model for the {main.family} family: the session model summarizes"]
    return spec, []


def _lookup(name: str) -> ModelInfo | None:
    try:
        return lookup_model(name)
    except UnknownModelError:
        return None


def _provider_of(call_model: str, info: ModelInfo | None) -> str | None:
    head = call_model.split("/", 1)[0] if "/" in call_model else None
    if head and (head in PROVIDER_KEY_ENV or head in _KEYLESS_PROVIDERS):
        return head
    if info is not None and info.provider:
        return info.provider
    return head


def _candidate(
    role: str,
    name: str,
    config: SummarizerConfig,
    main: ModelInfo,
    env: Mapping[str, str],
    notes: list[str],
) -> Candidate:
    call_model = f"{config.provider or 'openai'}/{name}" if config.api_base and "/" not in name else name
    info = main if name == main.name else _lookup(name)
    window: int | None = None
    if info is not None:
        # The model's own window, not a session's --window budget: the guard asks what the
        # summarizer can read.
        window = info.max_input_tokens or info.max_tokens or info.window
    if role == "primary" and config.window is not None:
        window = config.window
    max_output = info.max_output_tokens if info is not None else None
    api_key: str | None = None
    ok, why = True, ""
    if config.api_key_env:
        api_key = env.get(config.api_key_env) or None
        if api_key is None and not config.api_base:
            ok, why = False, f"{config.api_key_env} is unset and no api_base is configured"
    elif not config.api_base:
        provider = _provider_of(call_model, info)
        if provider in _KEYLESS_PROVIDERS:
            pass
        elif provider in PROVIDER_KEY_ENV:
            names = PROVIDER_KEY_ENV[provider]
            if not any(env.get(n) for n in names):
                ok, why = False, f"{' / '.join(names)} unset and no api_base configured"
        else:
            ok, why = (
                False,
                (
                    f"no API key variable known for provider {provider or 'unknown'!r}: "
                    "set summarizer.api_key_env or summarizer.api_base"
                ),
            )
    if config.api_base and api_key is None:
        api_key = NO_KEY_PLACEHOLDER
    return Candidate(
        role,
        name,
        call_model,
        config.api_base,
        api_key,
        ok,
        why,
        window,
        max_output,
        info,
        tuple(notes),
    )


def resolve_chain(config: SummarizerConfig, main: ModelInfo, env: Mapping[str, str] | None = None) -> list[Candidate]:
    """The models to try, in order: the summarizer model, then its fallback (when different
    and not ``none``)."""
    env = os.environ if env is None else env
    primary_name, notes = _resolve_name(config.model, main, config)
    chain = [_candidate("primary", primary_name, config, main, env, notes)]
    if config.fallback not in ("none", ""):
        fallback_name, fallback_notes = _resolve_name(config.fallback, main, config)
        if fallback_name != primary_name:
            chain.append(_candidate("fallback", fallback_name, config, main, env, fallback_notes))
    return chain
