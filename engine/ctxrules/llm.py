"""The one place ctxrules imports litellm (lazily: ``import litellm`` costs seconds).

``LITELLM_LOCAL_MODEL_COST_MAP`` is set first so litellm reads its bundled price map instead of
fetching one, and telemetry is off. litellm imports provider modules lazily, sometimes in the
middle of a call, and some of them warn at import time (pydantic, deprecations): those warnings
are litellm's, not the caller's, so they are silenced around the import and around each call
made through :func:`quiet`.
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from collections.abc import Iterator
from typing import Any

_LOCK = threading.Lock()


def load_litellm() -> Any:
    """``litellm``, imported once, offline-safe and without its import warnings."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    with _LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import litellm

        litellm.telemetry = False
        # litellm prints a "Give Feedback / Get Help" banner to stdout on every failed call: a
        # CLI's stdout holds only its output, and the error reaches the caller anyway.
        litellm.suppress_debug_info = True
        return litellm


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence the import-time warnings of litellm's lazily loaded provider modules."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        yield
