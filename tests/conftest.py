"""Shared fixtures. Tests run against the source tree (``engine/``), not a stale install; the
installed wheel is tested on its own in ``test_wheel.py``."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
from hypothesis import settings

# The real redis-server fixtures (redis_server, redis_url, own_redis) for the Redis store's tests.
from redis_server import own_redis, redis_cluster, redis_cluster_url, redis_server, redis_url  # noqa: F401

REPO = Path(__file__).resolve().parents[1]

# Property tests check behaviour, not speed: a first example that pays for lazy imports on a
# loaded machine must not fail on Hypothesis' 200 ms deadline (timings live in the benchmarks).
settings.register_profile("ctxrules", deadline=None)
settings.load_profile("ctxrules")
sys.path.insert(0, str(REPO / "engine"))

# The real test data: 22 recorded agent sessions (transcripts/*.json, OpenAI chat messages) and
# real command outputs (command-outputs/). It is not part of the repository. CTXRULES_CORPUS
# names its folder; the default is where the development checkout keeps it, and this is the
# only place that default is written.
CORPUS = Path(os.environ.get("CTXRULES_CORPUS") or REPO.parent / "shared" / "corpus")
TRANSCRIPTS = CORPUS / "transcripts"
COMMAND_OUTPUTS = CORPUS / "command-outputs"
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(autouse=True)
def _close_a_library_event_loop() -> Iterator[None]:
    """litellm's synchronous completion sets an event loop on the calling thread
    (``asyncio.get_event_loop()``) and never closes it; the next ``asyncio.run`` replaces it,
    and the garbage collector then reports an unclosed loop in whichever test comes next."""
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            loop = asyncio.get_event_loop_policy().get_event_loop()
        except RuntimeError:  # none set (asyncio.set_event_loop(None) was called before)
            return
    if not loop.is_running():
        loop.close()
        asyncio.set_event_loop(None)


def corpus_present() -> bool:
    return TRANSCRIPTS.is_dir() and COMMAND_OUTPUTS.is_dir()


def transcript_paths() -> list[Path]:
    return sorted(p for p in TRANSCRIPTS.glob("*.json") if p.name != "stats.json")


def _corpus_absent(reason: str) -> NoReturn:
    """Skip for want of the corpus, or fail under ``CI=true`` (CI has the corpus: a silent skip
    there would hide a loss of coverage)."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but the corpus is missing: {reason}", pytrace=False)
    pytest.skip(reason)


def require_corpus(what: str) -> None:
    """For a test that builds its input from the whole corpus: skip (fail under ``CI=true``)
    when it is absent, rather than run on an empty one."""
    if not corpus_present():
        _corpus_absent(f"{what} is built from the real corpus; set CTXRULES_CORPUS (not found: {CORPUS})")


def transcript_path(name: str) -> Path:
    """The file of the corpus transcript ``name`` (with or without ``.json``); the test skips,
    saying which, when the corpus does not hold it."""
    path = TRANSCRIPTS / (name if name.endswith(".json") else f"{name}.json")
    if not path.is_file():
        _corpus_absent(f"the corpus transcript {path.name} is missing; set CTXRULES_CORPUS (looked in {TRANSCRIPTS})")
    return path


def load_transcript(name: str) -> list[dict[str, Any]]:
    """The messages of the corpus transcript ``name`` (with or without ``.json``); the test
    skips, saying which, when the corpus does not hold it."""
    path = transcript_path(name)
    data = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(data, list), path
    return data


def pytest_configure(config: pytest.Config) -> None:
    # The plugin registers its marker itself; a source checkout without the entry point
    # installed imports its fixtures directly (tests/test_prompts_snapshots.py).
    config.addinivalue_line("markers", "ctxrules_pack(pack): the pack the ctxrules fixtures use")
    config.addinivalue_line(
        "markers",
        "corpus: needs the real corpus named by CTXRULES_CORPUS (skipped without it; "
        "under CI=true its absence fails the test)",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Tests marked ``corpus`` skip with one reason per module when the corpus is absent, and
    fail instead under ``CI=true`` (CI has the corpus: a silent skip there would hide a loss of
    coverage). Runs before pytest's own skip marks, so an empty parameter set built from the
    absent corpus fails under CI too."""
    if item.get_closest_marker("corpus") is None or corpus_present():
        return
    module = item.path.name
    reason = (
        f"{module} replays the real corpus (agent transcripts and command outputs); "
        f"set CTXRULES_CORPUS to its folder (not found: {CORPUS})"
    )
    _corpus_absent(reason)


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    """Run the CLI in-process: ``code, out, err = cli("validate", "rules/")``."""
    from ctxrules.cli.main import run

    def invoke(*argv: str) -> tuple[int, str, str]:
        try:
            code = run(list(argv))
        except SystemExit as exc:  # argparse usage errors
            code = int(exc.code or 0)
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return invoke
