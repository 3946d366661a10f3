"""``ctxrules eval``: what a pack costs, saves and keeps over whole tasks (docs/eval.md).

- :mod:`~ctxrules.eval.replay` — one transcript under one plan, call by call;
- :mod:`~ctxrules.eval.caching` — the providers' documented prompt-cache rules;
- :mod:`~ctxrules.eval.probes` — retention probes from the original transcript;
- :mod:`~ctxrules.eval.checks` — the invariants checked on every call;
- :mod:`~ctxrules.eval.run` — inputs, plans and worker processes;
- :mod:`~ctxrules.eval.report` — totals, the table, JSON and the HTML page.
"""
