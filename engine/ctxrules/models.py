"""Model facts (window, prices, tokenizer) read from litellm's bundled registry.

``import litellm`` costs seconds and may reach for the network, so this module never imports
it: the package directory is found with :func:`importlib.util.find_spec` and the registry file
``litellm/model_prices_and_context_window_backup.json`` is parsed once per process, on the
first lookup that needs it.

Name resolution (:func:`lookup_model`), first hit wins:

1. the name exactly as given, then without its leading ``provider/`` segments
   (``openrouter/anthropic/claude-x`` -> ``anthropic/claude-x`` -> ``claude-x``);
2. the same for looser spellings: the base model of a fine-tune (``ft:gpt-4o-mini:org::id`` ->
   ``gpt-4o-mini``), ``4-5`` for ``4.5`` (OpenRouter spells ``claude-sonnet-4.5``), and the
   name without a trailing snapshot date (``claude-sonnet-4-20250514`` -> ``claude-sonnet-4``);
3. a registry key that ends with ``/<one of those names>`` (``gemini-2.5-pro`` ->
   ``gemini/gemini-2.5-pro``), preferring the provider the user named, then an entry that
   declares a window, then the family's own provider (``xai`` for grok), then a chat model;
4. all of the above case-insensitively.

An unknown name raises :class:`UnknownModelError` listing close matches, unless the caller
gives ``window=N``: then the model is described from its name alone (family, tokenizer) with
that window and no prices. A ``window`` given for a known model overrides the registry's.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Final, Literal

from ctxrules.errors import CtxrulesError, UsageError
from ctxrules.printable import printable, shown_repr
from ctxrules.threads import ForkSafeLock

__all__ = [
    "Family",
    "ModelInfo",
    "Tokenizer",
    "UnknownModelError",
    "check_model_name",
    "check_window",
    "classify_model",
    "litellm_package_dir",
    "lookup_model",
    "registry",
    "registry_path",
]

Family = Literal["openai", "anthropic", "gemini", "deepseek", "qwen", "other"]
Tokenizer = Literal["o200k_base", "cl100k_base", "anthropic", "deepseek", "approx"]

EXACT_TOKENIZERS: Final = frozenset({"o200k_base", "cl100k_base"})
REGISTRY_FILE: Final = "model_prices_and_context_window_backup.json"


class UnknownModelError(CtxrulesError):
    """The registry does not know the model and no window was given."""

    def __init__(self, name: str, close_matches: list[str]) -> None:
        hint = f"; close matches: {', '.join(close_matches)}" if close_matches else ""
        super().__init__(
            f"unknown model {shown_repr(name, 120)}{hint} "
            "(to use a model the registry does not list, give its window: --window 128000 on the "
            "command line, window=128000 in Python)"
        )
        self.name = name
        self.close_matches = close_matches


@dataclass(frozen=True)
class ModelInfo:
    """What ctxrules needs to know about a model.

    ``window`` is the override given to :func:`lookup_model`, else the registry's
    ``max_input_tokens``, else its ``max_tokens`` (``None`` if the registry has neither).
    """

    name: str
    key: str | None
    provider: str | None
    max_input_tokens: int | None
    max_output_tokens: int | None
    max_tokens: int | None
    input_cost_per_token: float | None
    output_cost_per_token: float | None
    cache_read_input_token_cost: float | None
    cache_creation_input_token_cost: float | None
    supports_prompt_caching: bool
    family: Family
    tokenizer: Tokenizer
    mode: str | None = None
    window_override: int | None = None

    @property
    def window(self) -> int | None:
        if self.window_override is not None:
            return self.window_override
        if self.max_input_tokens is not None:
            return self.max_input_tokens
        return self.max_tokens

    @property
    def known(self) -> bool:
        """Whether the facts come from the registry (``False``: guessed from the name)."""
        return self.key is not None

    @property
    def exact_tokens(self) -> bool:
        """Whether token counts for this model are exact (OpenAI encodings) or estimates."""
        return self.tokenizer in EXACT_TOKENIZERS


# --------------------------------------------------------------------------- registry file


def litellm_package_dir() -> Path:
    """The directory of the installed ``litellm`` package, found without importing it."""
    try:
        spec = importlib.util.find_spec("litellm")
    except (ImportError, ValueError) as exc:  # a broken or half-imported installation
        raise CtxrulesError(f"cannot locate the litellm package: {exc}") from exc
    if spec is None:
        raise CtxrulesError(
            "litellm is not installed: ctxrules reads model facts and tokenizer files from the "
            "litellm package (pip install 'litellm>=1.80,<1.111')"
        )
    locations = list(spec.submodule_search_locations or [])
    if locations:
        return Path(locations[0])
    if spec.origin:
        return Path(spec.origin).parent
    raise CtxrulesError("cannot locate the litellm package directory (no search location)")


def registry_path() -> Path:
    """Path of the model registry JSON bundled with litellm."""
    return litellm_package_dir() / REGISTRY_FILE


_LOCK = ForkSafeLock()
_REGISTRY: dict[str, dict[str, Any]] | None = None


def registry() -> Mapping[str, Mapping[str, Any]]:
    """The parsed registry (``sample_spec`` removed), read once per process."""
    global _REGISTRY
    reg = _REGISTRY
    if reg is not None:
        return reg
    with _LOCK:
        if _REGISTRY is None:
            path = registry_path()
            try:
                raw = json.loads(path.read_bytes())
            except OSError as exc:
                raise CtxrulesError(f"cannot read the model registry {path}: {exc}") from exc
            except ValueError as exc:
                raise CtxrulesError(f"the model registry {path} is not valid JSON: {exc}") from exc
            if not isinstance(raw, dict):
                raise CtxrulesError(f"the model registry {path} is not a JSON object")
            _REGISTRY = {str(k): v for k, v in raw.items() if k != "sample_spec" and isinstance(v, dict)}
        return _REGISTRY


@dataclass(frozen=True)
class _Index:
    """Lookup tables derived from the registry; ``exact`` maps a spelling to the real key."""

    exact: Mapping[str, str]
    by_suffix: Mapping[str, tuple[str, ...]]  # last segment -> keys with >= 2 segments
    by_base: Mapping[str, tuple[str, ...]]  # _plain_name(key) -> keys
    providers: frozenset[str]


@lru_cache(maxsize=2)
def _index(casefold: bool) -> _Index:
    reg = registry()
    exact: dict[str, str] = {}
    by_suffix: dict[str, list[str]] = {}
    by_base: dict[str, list[str]] = {}
    for key in reg:
        spelled = key.lower() if casefold else key
        exact.setdefault(spelled, key)
        if "/" in spelled:
            by_suffix.setdefault(spelled.rsplit("/", 1)[1], []).append(key)
        by_base.setdefault(_plain_name(spelled), []).append(key)
    providers = frozenset(
        str(entry["litellm_provider"]) for entry in reg.values() if isinstance(entry.get("litellm_provider"), str)
    )
    return _Index(
        exact,
        {k: tuple(v) for k, v in by_suffix.items()},
        {k: tuple(v) for k, v in by_base.items()},
        providers,
    )


# --------------------------------------------------------------------------- classification

_VENDOR_PREFIX = re.compile(r"^(?:[a-z0-9_-]+\.)+(?=[a-z])")
_VENDOR_PREFIX_ANY_CASE = re.compile(r"^(?:[A-Za-z0-9_-]+\.)+(?=[A-Za-z])")
_OPENAI_NAME = re.compile(r"^(?:gpt-|chatgpt-|o[1-9](?:$|[-_.])|grok-)|codex")
_O200K_NAME = re.compile(
    r"^(?:gpt-4o|gpt-4\.1|gpt-4-1(?![0-9])|gpt-41|gpt-(?:[5-9]|[1-9][0-9])|gpt-oss|chatgpt-"
    r"|o[1-9](?:$|[-_.]))|codex"
)
_CL100K_NAME = re.compile(r"^(?:gpt-4|gpt-3\.5|gpt-35)")

_PROVIDER_FAMILY: Final[Mapping[str, Family]] = {
    "openai": "openai",
    "azure": "openai",
    "text-completion-openai": "openai",
    "chatgpt": "openai",
    "xai": "openai",
    "anthropic": "anthropic",
    "gemini": "gemini",
    "deepseek": "deepseek",
    "zai": "deepseek",
    "moonshot": "deepseek",
    "dashscope": "qwen",
}
_NATIVE_SEGMENTS: Final[Mapping[Family, frozenset[str]]] = {
    "openai": frozenset({"openai", "xai", "azure"}),
    "anthropic": frozenset({"anthropic"}),
    "gemini": frozenset({"gemini", "google"}),
    "deepseek": frozenset({"deepseek", "deepseek-ai", "zai", "zai-org", "moonshot", "moonshotai"}),
    "qwen": frozenset({"dashscope", "qwen"}),
    "other": frozenset(),
}


def _base_name(name: str) -> str:
    """The model part of a name: last path segment, lowercase, vendor prefixes dropped.

    ``us.anthropic.claude-x-v1:0`` -> ``claude-x-v1:0``; ``ft:gpt-4o-mini:org::id`` ->
    ``gpt-4o-mini:org::id``.
    """
    base = name.strip().lower().rsplit("/", 1)[-1]
    base = base.removeprefix("ft:")
    return _VENDOR_PREFIX.sub("", base) if "." in base else base


_DEPLOYMENT_SUFFIX = re.compile(r"(?:-v[0-9]+(?::[0-9]+)?|@[0-9a-z-]+|:[0-9]+)$")


def _plain_name(name: str) -> str:
    """The last segment without vendor prefix and deployment suffix, case kept.

    ``bedrock/us.anthropic.claude-sonnet-4-20250514-v1:0`` -> ``claude-sonnet-4-20250514``;
    ``vertex_ai/claude-sonnet-4-5@20250929`` -> ``claude-sonnet-4-5``.
    """
    last = name.strip().rsplit("/", 1)[-1]
    if "." in last:
        last = _VENDOR_PREFIX_ANY_CASE.sub("", last)
    return _DEPLOYMENT_SUFFIX.sub("", last)


def classify_model(name: str, provider: str | None = None) -> tuple[Family, Tokenizer]:
    """Family and tokenizer of a model, guessed from its name (and provider as a fallback)."""
    lowered = name.lower()
    base = _base_name(name)
    family: Family
    if "claude" in lowered:
        family = "anthropic"
    elif "gemini" in base or "gemma" in base:
        family = "gemini"
    elif "deepseek" in base or "glm" in base or "kimi" in base:
        family = "deepseek"
    elif "qwen" in base or "qwq" in base:
        family = "qwen"
    elif _OPENAI_NAME.search(base):
        family = "openai"
    else:
        first = lowered.split("/", 1)[0] if "/" in lowered else None
        family = _PROVIDER_FAMILY.get(provider or "", _PROVIDER_FAMILY.get(first or "", "other"))

    tokenizer: Tokenizer
    if _O200K_NAME.search(base) and not base.startswith(("grok", "gpt-35")):
        tokenizer = "o200k_base"
    elif _CL100K_NAME.search(base):
        tokenizer = "cl100k_base"
    elif family == "anthropic":
        tokenizer = "anthropic"
    elif "deepseek" in base:
        tokenizer = "deepseek"
    else:
        tokenizer = "approx"
    return family, tokenizer


# --------------------------------------------------------------------------- lookup

_DOTTED_VERSION = re.compile(r"(?<=[0-9])\.(?=[0-9])")
_DATE_SUFFIX = re.compile(r"-(?:20[0-9]{2}-?[01][0-9]-?[0-3][0-9])$")


def _suffixes(name: str) -> list[str]:
    parts = name.split("/")
    return ["/".join(parts[i:]) for i in range(len(parts)) if parts[i]]


def _spellings(name: str) -> tuple[list[str], list[str]]:
    """Looser spellings of a name, most faithful first: (same snapshot, without the date)."""
    head, _, last = name.rpartition("/")
    prefix = head + "/" if head else ""
    faithful = [name]
    if last.startswith("ft:") and last.count(":") >= 2:  # ft:gpt-4o-mini:org::id
        faithful.append(prefix + last.split(":")[1])
    for spelled in list(faithful):
        dashed = _DOTTED_VERSION.sub("-", spelled)
        if dashed != spelled:
            faithful.append(dashed)
    undated = [_DATE_SUFFIX.sub("", spelled) for spelled in faithful]
    faithful = list(dict.fromkeys(faithful))
    undated = [s for s in dict.fromkeys(undated) if s not in faithful]
    return faithful, undated


def _pick(name: str, keys: tuple[str, ...], casefold: bool) -> str:
    reg = registry()
    first = name.split("/", 1)[0] if "/" in name else None
    family, _ = classify_model(name)
    native = _NATIVE_SEGMENTS[family]

    def score(key: str) -> tuple[int, int, int, int, int, str]:
        entry = reg[key]
        segments = (key.lower() if casefold else key).split("/")
        named = first is not None and (segments[0] == first or entry.get("litellm_provider") == first)
        has_window = _as_int(entry.get("max_input_tokens")) or _as_int(entry.get("max_tokens"))
        vendors = segments[-1].lower().split(".")[:-1]
        is_native = bool(native.intersection(s.lower() for s in segments[:-1] + vendors))
        chat = entry.get("mode") in ("chat", "responses")
        return (not named, not has_window, not is_native, not chat, len(segments), key)

    return min(keys, key=score)


def _resolve_in(name: str, casefold: bool) -> str | None:
    index = _index(casefold)
    for group in _spellings(name.lower() if casefold else name):
        for variant in group:
            for suffix in _suffixes(variant):
                if suffix in index.exact:
                    return index.exact[suffix]
        for variant in group:
            for suffix in _suffixes(variant):
                bare = suffix.rsplit("/", 1)[-1]
                keys = tuple(
                    k for k in index.by_suffix.get(bare, ()) if (k.lower() if casefold else k).endswith("/" + suffix)
                )
                if keys:
                    return _pick(variant, keys, casefold)
        for variant in group:
            keys = index.by_base.get(_plain_name(variant), ())
            if keys:
                return _pick(variant, keys, casefold)
    return None


@lru_cache(maxsize=4096)
def _resolve(name: str) -> str | None:
    return _resolve_in(name, casefold=False) or _resolve_in(name, casefold=True)


def _close_matches(name: str) -> list[str]:
    index = _index(True)
    lowered = name.lower()
    pool = list(index.exact)
    found = difflib.get_close_matches(lowered, pool, n=5, cutoff=0.6)
    bare = lowered.rsplit("/", 1)[-1]
    if bare != lowered and len(found) < 5:
        for match in difflib.get_close_matches(bare, pool, n=5, cutoff=0.6):
            if match not in found:
                found.append(match)
    return [index.exact[m] for m in found[:5]]


def _as_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if isinstance(value, float) and value.is_integer() and value > 0:
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        number = int(value.strip())
        return number if number > 0 else None
    return None


def _as_float(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    return None


def check_window(window: int | None) -> int | None:
    """``window`` itself when it is ``None`` or a positive integer (not a bool); else a
    :class:`UsageError` saying so."""
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise UsageError(f"window must be a positive integer, not {window!r}")
    return window


def check_model_name(name: object) -> None:
    """Raise :class:`UsageError` unless ``name`` is a non-empty string of printable characters
    (a control, a bidi override or a lone surrogate is in no model name)."""
    if not isinstance(name, str) or not name.strip():
        raise UsageError(f"model name must be a non-empty string, not {name!r}")
    shown = printable(name)
    if shown != name:
        raise UsageError(f"model name '{shown}' holds a character no model name has (shown escaped)")


def lookup_model(name: str, *, window: int | None = None) -> ModelInfo:
    """Describe ``name`` from the registry; ``window`` overrides (or supplies) the window.

    Raises :class:`UnknownModelError` for a name the registry does not know, unless ``window``
    is given. Results are cached per ``(name, window)``, once the window is checked: the cache
    takes ``True`` and ``1.0`` for the ``1`` they equal, and served a window refused as such
    whenever that one had been looked up before.
    """
    return _lookup_model(name, check_window(window))


@lru_cache(maxsize=1024)
def _lookup_model(name: str, window: int | None) -> ModelInfo:
    check_model_name(name)
    key = _resolve(name.strip())
    if key is None:
        if window is None:
            raise UnknownModelError(name, _close_matches(name.strip()))
        first = name.split("/", 1)[0] if "/" in name else None
        provider = first if first is not None and first in _index(False).providers else None
        family, tokenizer = classify_model(name, provider)
        return ModelInfo(
            name=name,
            key=None,
            provider=provider,
            max_input_tokens=None,
            max_output_tokens=None,
            max_tokens=None,
            input_cost_per_token=None,
            output_cost_per_token=None,
            cache_read_input_token_cost=None,
            cache_creation_input_token_cost=None,
            supports_prompt_caching=False,
            family=family,
            tokenizer=tokenizer,
            mode=None,
            window_override=window,
        )
    entry = registry()[key]
    provider_value = entry.get("litellm_provider")
    provider = provider_value if isinstance(provider_value, str) else None
    family, tokenizer = classify_model(key, provider)
    mode = entry.get("mode")
    return ModelInfo(
        name=name,
        key=key,
        provider=provider,
        max_input_tokens=_as_int(entry.get("max_input_tokens")),
        max_output_tokens=_as_int(entry.get("max_output_tokens")),
        max_tokens=_as_int(entry.get("max_tokens")),
        input_cost_per_token=_as_float(entry.get("input_cost_per_token")),
        output_cost_per_token=_as_float(entry.get("output_cost_per_token")),
        cache_read_input_token_cost=_as_float(entry.get("cache_read_input_token_cost")),
        cache_creation_input_token_cost=_as_float(entry.get("cache_creation_input_token_cost")),
        supports_prompt_caching=entry.get("supports_prompt_caching") is True,
        family=family,
        tokenizer=tokenizer,
        mode=mode if isinstance(mode, str) else None,
        window_override=window,
    )
