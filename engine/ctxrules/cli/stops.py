"""How the ``ctxrules`` process ends on a stop signal (docs/reference/cli.md): SIGTERM unwinds
like an exception (exit 143) in the verbs that clean up, from the moment the entry point runs,
and a signal that comes once the verb's work is done leaves its exit code as it is.

Imported by the entry point: only the standard library and :mod:`ctxrules.threads`.
"""

from __future__ import annotations

import atexit
import signal

from ctxrules.threads import block_stop_signals


def unwind_on_sigterm() -> None:
    """Make SIGTERM (``timeout``, a process manager stopping the job) unwind like an exception,
    exit status 143: ``finally`` blocks and the handlers that clean up run (a compaction is
    marked as interrupted, a half-spilled vault file is removed) instead of the process
    vanishing mid-write. Call it from the main thread, as a verb starts (the entry point does
    before it imports the verb's modules, which take a good part of a second)."""
    signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def keep_the_exit_code() -> None:
    """Once the interpreter has run its exit handlers, hold SIGINT, SIGTERM and SIGHUP until the
    process has ended. Python puts back the default actions as it starts to tear itself down,
    which for a large verb takes tens of milliseconds: a signal then killed a process whose
    work was done and its output written (exit -2 or -15, not its own code, and a caller
    that looks at the code threw the output away). Registered first, this runs after every
    other exit handler, and after the non-daemon threads were waited for (those stay
    stoppable)."""
    atexit.register(block_stop_signals)
