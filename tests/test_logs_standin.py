"""Without a structlog configuration, ``ctxrules.logs.get_logger`` hands out a stand-in that
logs the lines structlog's filtering logger would (``event key=value``, bound values first),
with the methods a stage plugin may call on ``ctx.log``."""

from __future__ import annotations

import logging

import pytest

from ctxrules.logs import get_logger, structlog_configured


def test_the_stand_in_writes_event_and_values_and_filters_by_level(caplog: pytest.LogCaptureFixture) -> None:
    assert not structlog_configured()
    caplog.set_level(logging.INFO, logger="ctxrules.standin")
    log = get_logger("ctxrules.standin", session="s1").bind(stage="pairs")
    log.debug("hidden", detail=1)  # below the level: nothing
    log.info("stage.end", ms=1.5, note="two words")
    log.warning("retry %s of %d", "a", 2)
    log.msg("also info")
    log.log(logging.ERROR, "failed", code=7)
    log.try_unbind("stage", "nope").warning("unbound")
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "ctxrules.standin"]
    assert lines == [
        (logging.INFO, "stage.end session=s1 stage=pairs ms=1.5 note='two words'"),
        (logging.WARNING, "retry a of 2 session=s1 stage=pairs"),
        (logging.INFO, "also info session=s1 stage=pairs"),
        (logging.ERROR, "failed session=s1 stage=pairs code=7"),
        (logging.WARNING, "unbound session=s1"),
    ]
    with pytest.raises(KeyError):
        log.unbind("nope")
    assert log.new(x=1).bind(y=2)._context == {"x": 1, "y": 2}
    assert log.is_enabled_for(logging.INFO) and not log.is_enabled_for(logging.DEBUG)


def test_exception_logs_an_error_marked_with_exc_info(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ctxrules.standin2")
    get_logger("ctxrules.standin2").exception("boom")
    [record] = [r for r in caplog.records if r.name == "ctxrules.standin2"]
    assert record.levelno == logging.ERROR and record.getMessage() == "boom exc_info=True"
