"""Provider prompt-cache helpers: warm-up and idle keep-alive (``ctxrules.cache.warmup``)."""
