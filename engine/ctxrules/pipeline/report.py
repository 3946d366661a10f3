"""The run report (``schemas/report.v1.schema.json``): what went in, what came out, and why."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ctxrules._version import __version__

if TYPE_CHECKING:
    from ctxrules.engine import Session
    from ctxrules.pipeline.budget import Budget
    from ctxrules.pipeline.runner import RunOutcome

REPORT_VERSION = 1


def build_report(session: Session, *, history_tokens: int, history_len: int, reused: int,
                 outcome: RunOutcome, vault_new: list[str], ms: float,
                 budget: Budget | None = None) -> dict[str, Any]:
    """``budget``: the Budget the pipeline used, when it differs from the session's (eco mode)."""
    budget = budget or session.budget
    tokens_after = outcome.tokens
    util_before = budget.utilization(history_tokens)
    util_after = budget.utilization(tokens_after)
    warnings = list(outcome.warnings)
    after: dict[str, Any] = {"messages": len(outcome.messages), "tokens": tokens_after,
                             "utilization": round(util_after, 6), "tier": budget.tier_of(util_after),
                             "fits": budget.fits(tokens_after)}
    if not after["fits"]:
        reason = (f"the output ({tokens_after} tokens) does not fit the usable window of {budget.usable} "
                  f"tokens ({budget.window} - reserve_output {budget.reserve_output})")
        # The emergency pass says why (what the pinned messages alone take, what it spilled).
        overflow = next((a["detail"] for r in reversed(outcome.records) for a in r.actions
                         if a["kind"] == "overflow"), None)
        after["reason"] = f"{reason}: {overflow}" if overflow else reason
        warnings.append(reason)
    return {
        "version": REPORT_VERSION,
        "ctxrules": __version__,
        "pack": {"name": session.engine.pack.name, "digest": session.engine.digest,
                 "files": session.engine.pack.files},
        "session": {"id": session.id, "path": str(session.path)},
        "model": {
            "name": session.model.name, "registry_key": session.model.key, "provider": session.model.provider,
            "family": session.model.family, "tokenizer": session.model.tokenizer,
            "tokens_are_estimates": session.counter.is_estimate,
            "safety_margin": budget.safety_margin,
            "models_entry": (session.model_entry or {}).get("id"),
        },
        "budget": budget.as_dict(),
        "before": {"messages": history_len, "tokens": history_tokens, "utilization": round(util_before, 6),
                   "tier": budget.tier_of(util_before)},
        "after": after,
        "reused_messages": reused,
        "stages": [r.as_dict() for r in outcome.records],
        "vault_items": vault_new,
        "request": outcome.request,
        "warnings": warnings,
        "ms": round(ms, 3),
    }
