"""The run report (``schemas/report.v1.schema.json``): what went in, what came out, and why."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ctxrules._version import __version__

if TYPE_CHECKING:
    from ctxrules.pipeline.budget import Budget
    from ctxrules.pipeline.runner import RunOutcome

REPORT_VERSION = 1


def report_header(*, pack: dict[str, Any], session: dict[str, Any], model: dict[str, Any]) -> dict[str, Any]:
    """The part of a report that names what ran: the pack (name, digest, files), the session
    (id, path) and the model (name, registry key, provider, family, tokenizer, estimates,
    models entry). Plain data, so the report does not depend on the session object."""
    return {"pack": dict(pack), "session": dict(session), "model": dict(model)}


def build_report(
    header: dict[str, Any],
    *,
    budget: Budget,
    history_tokens: int,
    history_len: int,
    reused: int,
    outcome: RunOutcome,
    vault_new: list[str],
    ms: float,
) -> dict[str, Any]:
    """The run report; ``budget`` is the one the pipeline used (the eco-mode one when scaled)."""
    tokens_after = outcome.tokens
    util_before = budget.utilization(history_tokens)
    util_after = budget.utilization(tokens_after)
    warnings = list(outcome.warnings)
    model = {k: v for k, v in header["model"].items() if k != "models_entry"}
    # The margin is the budget's (eco mode may hand the pipeline another Budget); the key
    # order is the report's documented one.
    model["safety_margin"] = budget.safety_margin
    model["models_entry"] = header["model"].get("models_entry")
    after: dict[str, Any] = {
        "messages": len(outcome.messages),
        "tokens": tokens_after,
        "utilization": round(util_after, 6),
        "tier": budget.tier_of(util_after),
        "fits": budget.fits(tokens_after),
    }
    if not after["fits"]:
        reason = (
            f"the output ({tokens_after} tokens) does not fit the usable window of {budget.usable} "
            f"tokens ({budget.window} - reserve_output {budget.reserve_output})"
        )
        # The emergency pass says why (what the pinned messages alone take, what it spilled).
        overflow = next(
            (a["detail"] for r in reversed(outcome.records) for a in r.actions if a["kind"] == "overflow"), None
        )
        after["reason"] = f"{reason}: {overflow}" if overflow else reason
        failed = [r for r in outcome.records if r.error]
        if failed:
            # What could have made it fit may have failed (a vault that cannot be written).
            after["reason"] += (
                f"; {len(failed)} stage(s) failed: {', '.join(r.id for r in failed)} (first: {failed[0].error})"
            )
        warnings.append(reason)
    return {
        "version": REPORT_VERSION,
        "ctxrules": __version__,
        "pack": header["pack"],
        "session": header["session"],
        "model": model,
        "budget": budget.as_dict(),
        "before": {
            "messages": history_len,
            "tokens": history_tokens,
            "utilization": round(util_before, 6),
            "tier": budget.tier_of(util_before),
        },
        "after": after,
        "reused_messages": reused,
        "stages": [r.as_dict() for r in outcome.records],
        "vault_items": vault_new,
        "request": outcome.request,
        "warnings": warnings,
        "ms": round(ms, 3),
    }
