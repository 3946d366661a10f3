"""Model registry: lookups against litellm's bundled JSON, without importing litellm."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ctxrules import models
from ctxrules.errors import CtxrulesError, UsageError
from ctxrules.models import ModelInfo, UnknownModelError, classify_model, lookup_model

ENGINE = Path(__file__).resolve().parents[1] / "engine"


@pytest.fixture(scope="module")
def registry_json() -> dict[str, Any]:
    """The registry file read independently of the module under test."""
    spec = importlib.util.find_spec("litellm")
    assert spec is not None and spec.submodule_search_locations
    path = Path(next(iter(spec.submodule_search_locations)))
    data = json.loads((path / "model_prices_and_context_window_backup.json").read_text("utf-8"))
    assert isinstance(data, dict)
    return data


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PYTHONPATH": str(ENGINE), **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ, check=False)


# --------------------------------------------------------------------------- facts


@pytest.mark.parametrize("name", ["gpt-4o", "claude-sonnet-4-5", "gpt-4", "deepseek-chat"])
def test_window_and_prices_come_from_the_registry(name: str, registry_json: dict[str, Any]) -> None:
    entry = registry_json[name]
    info = lookup_model(name)
    assert info.key == name
    assert info.name == name
    assert info.window == entry["max_input_tokens"]
    assert info.max_input_tokens == entry["max_input_tokens"]
    assert info.max_output_tokens == entry.get("max_output_tokens")
    assert info.provider == entry["litellm_provider"]
    assert info.input_cost_per_token == entry.get("input_cost_per_token")
    assert info.output_cost_per_token == entry.get("output_cost_per_token")
    assert info.cache_read_input_token_cost == entry.get("cache_read_input_token_cost")
    assert info.cache_creation_input_token_cost == entry.get("cache_creation_input_token_cost")
    assert info.supports_prompt_caching is bool(entry.get("supports_prompt_caching"))
    assert info.known


def test_gpt_4o_and_claude_sonnet_4_5(registry_json: dict[str, Any]) -> None:
    gpt = lookup_model("gpt-4o")
    assert gpt.window == registry_json["gpt-4o"]["max_input_tokens"]
    assert (gpt.family, gpt.tokenizer, gpt.exact_tokens) == ("openai", "o200k_base", True)
    claude = lookup_model("claude-sonnet-4-5")
    assert claude.window == registry_json["claude-sonnet-4-5"]["max_input_tokens"]
    assert (claude.family, claude.tokenizer, claude.exact_tokens) == (
        "anthropic",
        "anthropic",
        False,
    )
    assert claude.supports_prompt_caching


def test_window_falls_back_to_max_tokens() -> None:
    info = ModelInfo(
        name="x",
        key="x",
        provider=None,
        max_input_tokens=None,
        max_output_tokens=None,
        max_tokens=4096,
        input_cost_per_token=None,
        output_cost_per_token=None,
        cache_read_input_token_cost=None,
        cache_creation_input_token_cost=None,
        supports_prompt_caching=False,
        family="other",
        tokenizer="approx",
    )
    assert info.window == 4096


# --------------------------------------------------------------------------- resolution


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("openai/gpt-4o", "gpt-4o"),
        ("anthropic/claude-sonnet-4-5", "claude-sonnet-4-5"),
        ("openrouter/anthropic/claude-sonnet-4-5", "claude-sonnet-4-5"),
        ("openrouter/anthropic/claude-sonnet-4.5", "claude-sonnet-4-5"),
        ("openrouter/openai/gpt-4o", "gpt-4o"),
        ("azure/gpt-4o", "azure/gpt-4o"),
        ("GPT-4o", "gpt-4o"),
        ("Anthropic/Claude-Sonnet-4-5", "claude-sonnet-4-5"),
        ("ft:gpt-4o-mini:acme::abc123", "gpt-4o-mini"),
    ],
)
def test_provider_prefixed_and_loose_names(name: str, key: str, registry_json: dict[str, Any]) -> None:
    assert key in registry_json, "registry changed: pick another example"
    info = lookup_model(name)
    assert info.key == key
    assert info.name == name
    assert info.window == registry_json[key]["max_input_tokens"]


def test_bedrock_names_resolve_to_claude(registry_json: dict[str, Any]) -> None:
    key = "anthropic.claude-3-5-sonnet-20240620-v1:0"
    assert key in registry_json
    info = lookup_model("bedrock/" + key)
    assert info.key == key
    assert info.family == "anthropic"
    assert info.tokenizer == "anthropic"


def test_provider_form_found_in_the_registry(registry_json: dict[str, Any]) -> None:
    # "gemma-3-27b-it" is listed only under provider prefixes; the family's own provider wins
    assert "gemma-3-27b-it" not in registry_json
    info = lookup_model("gemma-3-27b-it")
    assert info.key == "gemini/gemma-3-27b-it"
    assert info.family == "gemini"


def test_a_named_provider_is_kept_when_listed(registry_json: dict[str, Any]) -> None:
    assert lookup_model("azure/gpt-4o").provider == registry_json["azure/gpt-4o"]["litellm_provider"]


# --------------------------------------------------------------------------- unknown models


def test_unknown_model_lists_close_matches() -> None:
    with pytest.raises(UnknownModelError) as caught:
        lookup_model("gpt-4oo")
    error = caught.value
    assert isinstance(error, CtxrulesError)
    assert 0 < len(error.close_matches) <= 5
    assert "gpt-4o" in error.close_matches
    assert "gpt-4o" in str(error)
    assert "'gpt-4oo'" in str(error)


def test_unknown_model_without_any_match() -> None:
    with pytest.raises(UnknownModelError) as caught:
        lookup_model("zzzzqqqq-nothing-like-it")
    assert caught.value.close_matches == []
    # Said for both callers: the command line's flag and the API's argument.
    assert "--window 128000 on the command line, window=128000 in Python" in str(caught.value)


def test_window_override_for_unknown_model() -> None:
    info = lookup_model("acme/my-llama-70b", window=32000)
    assert info.window == 32000
    assert info.key is None and not info.known
    assert info.input_cost_per_token is None and info.output_cost_per_token is None
    assert info.max_input_tokens is None
    assert info.tokenizer == "approx"
    guessed = lookup_model("my-claude-distill", window=100_000)
    assert (guessed.family, guessed.tokenizer) == ("anthropic", "anthropic")
    gpt_like = lookup_model("gpt-9-preview-internal", window=50_000)
    assert (gpt_like.family, gpt_like.tokenizer) == ("openai", "o200k_base")


def test_window_override_for_known_model(registry_json: dict[str, Any]) -> None:
    info = lookup_model("gpt-4o", window=32000)
    assert info.window == 32000
    assert info.max_input_tokens == registry_json["gpt-4o"]["max_input_tokens"]
    assert info.key == "gpt-4o"


@pytest.mark.parametrize("window", [0, -5, True, 1.0, 32000.0])
def test_bad_window_is_a_usage_error(window: Any) -> None:
    # The integer each equals looked up first: the cache took True and 1.0 for the 1 they equal
    # and returned its entry instead of refusing them.
    lookup_model("gpt-4o", window=int(window) if int(window) > 0 else None)
    with pytest.raises(UsageError):
        lookup_model("gpt-4o", window=window)


def test_empty_name_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        lookup_model("  ")


# --------------------------------------------------------------------------- classification


@pytest.mark.parametrize(
    ("name", "family", "tokenizer"),
    [
        ("gpt-4o", "openai", "o200k_base"),
        ("gpt-4o-mini-2024-07-18", "openai", "o200k_base"),
        ("gpt-4.1-mini", "openai", "o200k_base"),
        ("gpt-5-mini", "openai", "o200k_base"),
        ("o1-preview", "openai", "o200k_base"),
        ("o3", "openai", "o200k_base"),
        ("o4-mini", "openai", "o200k_base"),
        ("chatgpt-4o-latest", "openai", "o200k_base"),
        ("codex-mini-latest", "openai", "o200k_base"),
        ("azure/gpt-5-codex", "openai", "o200k_base"),
        ("gpt-4", "openai", "cl100k_base"),
        ("gpt-4-turbo", "openai", "cl100k_base"),
        ("gpt-4-1106-preview", "openai", "cl100k_base"),
        ("gpt-3.5-turbo", "openai", "cl100k_base"),
        ("azure/gpt-35-turbo", "openai", "cl100k_base"),
        ("grok-4", "openai", "approx"),
        ("claude-sonnet-4-5", "anthropic", "anthropic"),
        ("bedrock/us.anthropic.claude-3-7-sonnet-20250219-v1:0", "anthropic", "anthropic"),
        ("gemini-2.5-pro", "gemini", "approx"),
        ("gemma-3-27b-it", "gemini", "approx"),
        ("deepseek-chat", "deepseek", "deepseek"),
        ("deepseek/deepseek-reasoner", "deepseek", "deepseek"),
        ("zai/glm-4.6", "deepseek", "approx"),
        ("moonshotai/kimi-k2", "deepseek", "approx"),
        ("qwen3-coder-plus", "qwen", "approx"),
        ("meta-llama/llama-4-maverick", "other", "approx"),
    ],
)
def test_classify_model(name: str, family: str, tokenizer: str) -> None:
    assert classify_model(name) == (family, tokenizer)


def test_provider_decides_when_the_name_does_not() -> None:
    assert classify_model("my-deployment", "anthropic") == ("anthropic", "anthropic")
    assert classify_model("azure/my-deployment")[0] == "openai"


# --------------------------------------------------------------------------- packaging


def test_litellm_is_not_imported_by_lookups() -> None:
    code = (
        "import ctxrules.models as m, sys\n"
        "assert m._REGISTRY is None\n"
        "m.lookup_model('gpt-4o'); m.lookup_model('openrouter/anthropic/claude-sonnet-4-5')\n"
        "print('litellm' in sys.modules, m._REGISTRY is not None)"
    )
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]


def test_registry_is_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    first = models.registry()
    reads: list[Path] = []
    original = Path.read_bytes

    def spy(self: Path) -> bytes:
        reads.append(self)
        return original(self)

    monkeypatch.setattr(Path, "read_bytes", spy)
    assert models.registry() is first
    lookup_model("o3")
    assert reads == []


def test_missing_litellm_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        return None if name == "litellm" else real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(CtxrulesError, match="litellm is not installed"):
        models.litellm_package_dir()


def test_registry_path_is_in_the_litellm_package() -> None:
    path = models.registry_path()
    assert path.name == "model_prices_and_context_window_backup.json"
    assert path.parent.name == "litellm"
    assert path.is_file()
