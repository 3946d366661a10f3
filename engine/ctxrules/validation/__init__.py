"""Pack validation: schema and semantic checks, and the diagnostics they report."""
