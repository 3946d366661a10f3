"""The ``ctxrules`` command: one module per verb, each registering itself in :data:`VERBS`."""
