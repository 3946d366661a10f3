"""What an integration asks of a model name before it opens a session for it: whether a session
can be sized for the name (:func:`model_profile`), and, when the integration is made, that its
``model=`` and ``window=`` can be (:func:`check_sizing`)."""

from __future__ import annotations

from typing import Any

from ctxrules.errors import CtxrulesError
from ctxrules.models import check_window, lookup_model
from ctxrules.packs.models_match import effective_context, select_model_entry

__all__ = ["ModelProfile", "check_sizing", "model_profile"]

# (index of the pack's models: entry or None, window, provider, family, tokenizer)
ModelProfile = tuple[int | None, int | None, str | None, str, str]


def model_profile(pack: dict[str, Any], name: str, window: int | None) -> ModelProfile | None:
    """What a session opened for ``name`` under the pack ``pack`` (its data), with ``window=``,
    prepares requests by: the pack's ``models:`` entry that matches it, the window, and the
    provider, family and tokenizer. Two names with one profile get one output (``gpt-4o`` and
    ``openai/gpt-4o``); a request prepared for one profile is not prepared for another (its
    window, its provider's cache markers and call options). None when no session can be sized
    for ``name``: the registry does not know it and neither ``window=`` nor the pack gives a
    window (what the session would fail on), or it is no model name at all."""
    hit = select_model_entry(pack, name) if isinstance(name, str) else None
    context = effective_context(pack, hit[1] if hit else None)
    pack_window = context.get("window")
    own = pack_window if isinstance(pack_window, int) and not isinstance(pack_window, bool) else None
    try:
        info = lookup_model(name, window=window if window is not None else own)
    except CtxrulesError:
        return None
    return (hit[0] if hit else None, info.window, info.provider, info.family, info.tokenizer)


def check_sizing(pack: dict[str, Any], model: str | None, window: int | None) -> None:
    """Refuse, when an integration is made, a ``window=`` that is not a positive integer or a
    ``model=`` no session can be sized for (:func:`model_profile`): accepted, they failed every
    request after, each with its warning or error. Raises the :class:`ctxrules.errors.UsageError`
    or :class:`ctxrules.models.UnknownModelError` (with the names the registry does know) that a
    session would raise for them."""
    check_window(window)
    if model is not None and model_profile(pack, model, window) is None:
        lookup_model(model)  # the registry's error
