"""The one place ctxrules imports litellm (lazily: ``import litellm`` costs seconds).

``LITELLM_LOCAL_MODEL_COST_MAP`` is set first so litellm reads its bundled price map instead of
fetching one, and telemetry is off. litellm imports provider modules lazily, sometimes in the
middle of a call, and some of them warn at import time (pydantic, deprecations): those warnings
are litellm's, not the caller's, so they are silenced around the import and around each call
made through :func:`quiet`.

litellm also logs to stderr itself, tracebacks included (a stream chunk its parser refuses is an
ERROR with the pydantic traceback), through its own handler. For the calls ctxrules makes on its
own (the summarizer, cache probes) that output is dropped inside :func:`own_call`: the failure
reaches the report or the probe already, and a CLI's stderr holds no traceback. The caller's own
calls (``session.complete``) keep litellm's logging as the caller configured it.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from ctxrules.reply_limits import capped
from ctxrules.threads import abandon, helper_thread

_LOCK = threading.Lock()
_OWN = threading.local()
LITELLM_LOGGERS = ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy")


class _OwnCallFilter(logging.Filter):
    """Drops litellm's records made in a thread that is inside :func:`own_call`."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(_OWN, "depth", 0)


_FILTER = _OwnCallFilter()


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


@contextlib.contextmanager
def own_call(cancel: threading.Event | None = None, *, streaming: bool = False) -> Iterator[None]:
    """Around a model call ctxrules makes on its own, in the thread that makes (and reads) it:
    litellm's log records of this thread are dropped, the outcome is reported by ctxrules, and
    the replies are read within byte limits (:mod:`ctxrules.reply_limits`); once ``cancel`` is
    set (the caller gave the call up), the next bytes received end the read; ``streaming``:
    see :func:`ctxrules.reply_limits.capped`."""
    for name in LITELLM_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
    _OWN.depth = getattr(_OWN, "depth", 0) + 1
    try:
        with capped(cancel, streaming=streaming):
            yield
    finally:
        _OWN.depth -= 1


def call_within(call: Callable[..., Any], kwargs: dict[str, Any], timeout_s: float, *, name: str) -> Any:
    """``call(**kwargs)`` inside :func:`own_call` on a helper thread named ``name``, given up
    after ``timeout_s`` (plus 1 s of grace) with :class:`TimeoutError`.

    An HTTP ``timeout`` bounds each read, not the whole response: a server (or proxy) that
    trickles whitespace keeps every read short and the call open for as long as it likes. The
    abandoned call ends at the next bytes it receives (:func:`own_call`'s ``cancel``), or at
    the socket's read timeout when none come (the thread is a daemon: it never holds up exit).
    The call sees the caller's context variables (a copy), as it would on the caller's thread:
    a plugin hook (the router's judge) may read them.
    """
    box: dict[str, Any] = {}
    context = contextvars.copy_context()
    cancel = threading.Event()

    def run() -> None:
        try:
            with own_call(cancel), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                box["response"] = context.run(call, **kwargs)
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    worker = helper_thread(run, name)
    worker.start()
    try:
        worker.join(timeout_s + 1.0)
    finally:
        if worker.is_alive():  # given up on: timed out, or the caller was interrupted (SIGTERM)
            cancel.set()  # its next bytes end the read (a trickle would keep it reading)
            abandon(worker)
    if worker.is_alive():
        raise TimeoutError(f"no complete answer within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["response"]


_TRACEBACK = "Traceback (most recent call last)"


def error_text(exc: BaseException, limit: int = 300) -> str:
    """``"<type>: <message>"`` of a model call's exception, on one line, cut to ``limit``.

    litellm puts the Python traceback of its own failure into some messages (a response it
    could not convert); that is where such a message is cut, so no traceback reaches an error
    message, an attempt record or a report.
    """
    message = str(exc)
    cut = message.find(_TRACEBACK)
    if cut >= 0:
        message = message[:cut]
    message = " ".join(message.split())
    if len(message) > limit:
        message = message[:limit] + "…"
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__
