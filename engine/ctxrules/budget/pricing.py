"""USD cost of a call, from litellm's bundled price data (never importing litellm).

Prices are read from the registry entry :func:`ctxrules.models.lookup_model` resolves, the way
the provider bills them (and the way litellm's own cost calculator reads the same data):

- uncached prompt tokens at ``input_cost_per_token``;
- cached tokens at ``cache_read_input_token_cost`` (absent: the input rate, since a provider
  that publishes no cache price bills cached tokens as ordinary input);
- cache writes at ``cache_creation_input_token_cost`` (absent: the input rate);
- text completion at ``output_cost_per_token``; reasoning tokens at
  ``output_cost_per_reasoning_token`` when the model has one, else the output rate;
- citation tokens at ``citation_cost_per_token`` when the model has one (else not billed);
- long-context tiers: when the prompt is above ``N`` tokens and the entry has
  ``*_above_<N>k_tokens`` rates, those rates apply to every kind (xAI bills from ``N`` on);
- a service tier (``priority``, ``flex``, ``batch``) uses the ``_priority``/``_flex``/
  ``_batches`` variant of each rate where the entry has one.

A pack may declare its own prices (``budgets.prices``, USD per million tokens) for models the
registry does not know or that a contract prices differently; they win over the registry.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, Final

from ctxrules.budget.usage import TokenUsage
from ctxrules.errors import UsageError
from ctxrules.models import UnknownModelError, lookup_model, registry

__all__ = ["SERVICE_TIERS", "Cost", "Rates", "price_call", "rates_for"]

SERVICE_TIERS: Final = ("standard", "priority", "flex", "batch")
_TIER_SUFFIX: Final = {
    "standard": "",
    "priority": "_priority",
    "flex": "_flex",
    "batch": "_batches",
}
_ABOVE: Final = re.compile(r"^input_cost_per_token_above_(\d+)(k?)_tokens$")
_INCLUSIVE_THRESHOLD_PROVIDERS: Final = frozenset({"xai"})
_PER_MILLION: Final = 1_000_000


@dataclass(frozen=True)
class Rates:
    """USD per token for each kind; ``source`` says where they came from."""

    input: float
    output: float
    cache_read: float
    cache_write: float
    reasoning: float
    citation: float
    source: str
    tier_threshold: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Cost:
    """The USD cost of one call (or a sum), by component.

    ``cache_savings`` is net: what the cached tokens saved against the input rate, less the
    premium paid for writing to the cache (negative on a turn that only writes the cache).
    """

    input: float = 0.0
    cache_read: float = 0.0
    cache_write: float = 0.0
    output: float = 0.0
    reasoning: float = 0.0
    citation: float = 0.0
    cache_savings: float = 0.0

    @property
    def total(self) -> float:
        return self.input + self.cache_read + self.cache_write + self.output + self.reasoning + self.citation

    @property
    def savings_share(self) -> float:
        """Net cache savings as a share of what the call would have cost without a cache."""
        uncached = self.total + self.cache_savings
        return self.cache_savings / uncached if uncached > 0 else 0.0

    def __add__(self, other: Cost) -> Cost:
        return Cost(*(a + b for a, b in zip(self.as_tuple(), other.as_tuple(), strict=True)))

    def as_tuple(self) -> tuple[float, float, float, float, float, float, float]:
        return (
            self.input,
            self.cache_read,
            self.cache_write,
            self.output,
            self.reasoning,
            self.citation,
            self.cache_savings,
        )

    def as_dict(self) -> dict[str, float]:
        # Not dataclasses.asdict: that deep-copies every field, and a report builds several.
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["total"] = self.total
        return out


def _parse_threshold(digits: str, k: str) -> int:
    return int(digits) * (1000 if k else 1)


def _rate(entry: Mapping[str, Any], key: str, suffix: str) -> float | None:
    for candidate in (key + suffix, key) if suffix else (key,):
        value = entry.get(candidate)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return None


def _registry_rates(entry: Mapping[str, Any], key: str, prompt_tokens: int, service_tier: str) -> Rates | None:
    suffix = _TIER_SUFFIX[service_tier]
    base_in = _rate(entry, "input_cost_per_token", suffix)
    base_out = _rate(entry, "output_cost_per_token", suffix)
    if base_in is None and base_out is None:
        return None
    inp, out = base_in or 0.0, base_out or 0.0
    read = _rate(entry, "cache_read_input_token_cost", suffix)
    write = _rate(entry, "cache_creation_input_token_cost", suffix)
    reasoning = _rate(entry, "output_cost_per_reasoning_token", suffix)
    # Long-context tiers: the highest threshold the prompt passes sets every rate it names.
    inclusive = entry.get("litellm_provider") in _INCLUSIVE_THRESHOLD_PROVIDERS
    passed: int | None = None
    for k in entry:
        m = _ABOVE.match(k)
        if m is None:
            continue
        threshold = _parse_threshold(m[1], m[2])
        over = prompt_tokens >= threshold if inclusive else prompt_tokens > threshold
        if over and (passed is None or threshold > passed):
            passed = threshold
    if passed is not None:
        tag = f"_above_{passed // 1000}k_tokens" if passed % 1000 == 0 else f"_above_{passed}_tokens"
        alt = [f"_above_{passed}_tokens"] if passed % 1000 == 0 else []

        def tiered(base: str, fallback: float | None) -> float | None:
            for t in (tag, *alt):
                value = _rate(entry, base + t, suffix)
                if value is not None:
                    return value
            return fallback

        inp = tiered("input_cost_per_token", inp) or 0.0
        out = tiered("output_cost_per_token", out) or 0.0
        read = tiered("cache_read_input_token_cost", read)
        write = tiered("cache_creation_input_token_cost", write)
        reasoning = tiered("output_cost_per_reasoning_token", reasoning)
    return Rates(
        input=inp,
        output=out,
        cache_read=inp if read is None else read,
        cache_write=inp if write is None else write,
        reasoning=out if reasoning is None else reasoning,
        citation=_rate(entry, "citation_cost_per_token", suffix) or 0.0,
        source=f"registry:{key}" + (f"@{service_tier}" if service_tier != "standard" else ""),
        tier_threshold=passed,
    )


def _per_token(spec: Mapping[str, Any], key: str, default: float | None = None) -> float | None:
    value = spec.get(key)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value) / _PER_MILLION
    return default


def _pack_rates(prices: Mapping[str, Any] | None, names: list[str]) -> Rates | None:
    """The first ``budgets.prices`` entry whose glob matches one of ``names``.

    Pack prices are USD per million tokens (as price lists print them)."""
    if not prices:
        return None
    for pattern, spec in prices.items():
        if not isinstance(spec, Mapping):
            continue
        if any(fnmatch.fnmatchcase(n, str(pattern)) for n in names):
            get = functools.partial(_per_token, spec)
            inp = get("input") or 0.0
            out = get("output") or 0.0
            return Rates(
                input=inp,
                output=out,
                cache_read=get("cache_read", inp) or 0.0,
                cache_write=get("cache_write", inp) or 0.0,
                reasoning=get("reasoning", out) or 0.0,
                citation=get("citation", 0.0) or 0.0,
                source=f"pack:{pattern}",
            )
    return None


def rates_for(
    model: str,
    *,
    prompt_tokens: int = 0,
    service_tier: str = "standard",
    prices: Mapping[str, Any] | None = None,
) -> Rates | None:
    """The rates that apply to a call of ``model`` with ``prompt_tokens`` of input, or ``None``
    when neither the pack nor the registry prices the model (the call is then unpriced)."""
    if service_tier not in _TIER_SUFFIX:
        raise UsageError(f"unknown service tier {service_tier!r}; one of: {', '.join(SERVICE_TIERS)}")
    try:
        info = lookup_model(model)
    except UnknownModelError:
        info = None
    names = [model] + ([info.key] if info is not None and info.key else [])
    if info is not None and info.provider and info.key and "/" not in info.key:
        names.append(f"{info.provider}/{info.key}")
    own = _pack_rates(prices, names)
    if own is not None:
        return own
    if info is None or info.key is None:
        return None
    return _registry_rates(registry()[info.key], info.key, prompt_tokens, service_tier)


def price_call(usage: TokenUsage, rates: Rates | None) -> Cost | None:
    """The cost of ``usage`` at ``rates`` (``None`` for an unpriced call)."""
    if rates is None:
        return None
    return Cost(
        input=usage.uncached_prompt * rates.input,
        cache_read=usage.cached * rates.cache_read,
        cache_write=usage.cache_write * rates.cache_write,
        output=usage.text_completion * rates.output,
        reasoning=usage.reasoning * rates.reasoning,
        citation=usage.citation * rates.citation,
        cache_savings=usage.cached * (rates.input - rates.cache_read)
        - usage.cache_write * (rates.cache_write - rates.input),
    )
