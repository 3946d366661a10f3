"""The pipeline runner: budget, tiers, stage ordering and the per-stage context."""
