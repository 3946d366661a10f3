"""The ctxrules pytest plugin: assemble prompts from a pack and snapshot them as text files.

Installed with ctxrules (entry point ``pytest11``), so any project that has ctxrules and
pytest gets these without configuration:

- option ``--ctxrules-pack PACK`` / ini ``ctxrules_pack`` (default ``builtin:default``): the
  pack the fixtures use; a relative path is taken from the rootdir;
- fixture ``ctxrules_pack`` (session): that pack, resolved and validated;
- fixture ``assemble_prompt``: ``assemble_prompt(mode, model=None, *, entry=None,
  variables=None, pack=None) -> AssembledPrompt``;
- fixture ``prompt_snapshot``: syrupy's ``snapshot`` storing each prompt as a ``.txt`` file
  (needs syrupy; ``pytest --snapshot-update`` refreshes the files);
- :func:`prompt_cases`: ``pytest.param`` cases for every mode x ``models:`` entry of a pack,
  plus "no entry", to parametrize a snapshot test with one file per combination.

Importing this module is cheap: ctxrules' engine and syrupy load only when a fixture is used.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from ctxrules.packs.loader import ResolvedPack
    from ctxrules.prompts.assemble import AssembledPrompt

__all__ = ["NO_ENTRY", "assemble_prompt", "ctxrules_pack", "prompt_cases", "prompt_snapshot"]

NO_ENTRY = "no-entry"
DEFAULT_PACK = "builtin:default"
_PACKS: dict[str, ResolvedPack] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ctxrules", "ctxrules prompt assembly")
    group.addoption(
        "--ctxrules-pack",
        dest="ctxrules_pack",
        default=None,
        metavar="PACK",
        help="pack the ctxrules fixtures assemble prompts from (path or builtin:NAME; "
        f"default: ini ctxrules_pack, else {DEFAULT_PACK})",
    )
    parser.addini(
        "ctxrules_pack", help=f"pack for the ctxrules fixtures (default {DEFAULT_PACK})", default=""
    )


def load(ref: str, rootdir: Path | None = None) -> ResolvedPack:
    """The validated pack ``ref`` (memoized per process); relative paths from ``rootdir``."""
    from ctxrules.packs.validated import load_pack

    if not ref.startswith("builtin:") and rootdir is not None and not Path(ref).is_absolute():
        ref = str(rootdir / ref)
    if ref not in _PACKS:
        _PACKS[ref] = load_pack(ref)
    return _PACKS[ref]


def _configured(config: pytest.Config) -> str:
    given = config.getoption("ctxrules_pack", default=None)
    if given:
        return str(given)
    try:
        ini = config.getini("ctxrules_pack")
    except ValueError:  # the plugin's ini key is not registered (fixtures imported directly)
        ini = ""
    return str(ini) if ini else DEFAULT_PACK


@pytest.fixture(scope="session")
def ctxrules_pack(request: pytest.FixtureRequest) -> ResolvedPack:
    """The pack named by ``--ctxrules-pack`` / ``ctxrules_pack`` (default builtin:default)."""
    from ctxrules.errors import CtxrulesError

    ref = _configured(request.config)
    try:
        return load(ref, Path(str(request.config.rootpath)))
    except CtxrulesError as exc:
        raise pytest.UsageError(f"ctxrules: cannot load pack {ref}: {exc}") from None


@pytest.fixture
def assemble_prompt(
    ctxrules_pack: ResolvedPack, request: pytest.FixtureRequest
) -> Callable[..., AssembledPrompt]:
    """``assemble_prompt(mode, model=None, *, entry=None, variables=None, pack=None)``:
    the assembled prompt; ``entry`` picks a ``models:`` entry by id (``"no-entry"``: none),
    ``pack`` another pack than the configured one."""
    from ctxrules.prompts.assemble import assemble

    rootdir = Path(str(request.config.rootpath))

    def run(
        mode: str,
        model: str | None = None,
        *,
        entry: str | None = None,
        variables: Mapping[str, Any] | None = None,
        pack: str | None = None,
    ) -> AssembledPrompt:
        resolved = load(pack, rootdir) if pack else ctxrules_pack
        chosen = None if entry == NO_ENTRY else entry
        return assemble(resolved, mode=mode, model=model, entry=chosen, variables=variables)

    return run


@pytest.fixture
def prompt_snapshot(snapshot: Any) -> Any:
    """syrupy's ``snapshot`` storing prompts as readable ``.txt`` files (one per assertion)."""
    from ctxrules.testing.snapshot import PromptSnapshotExtension

    return snapshot.use_extension(PromptSnapshotExtension)


def prompt_cases(pack: str = DEFAULT_PACK, *, rootdir: str | Path | None = None) -> list[Any]:
    """``pytest.param(mode, entry, id="MODE-ENTRY")`` for every mode x ``models:`` entry of
    ``pack``, plus ``"no-entry"`` for models that match none. Use with
    ``@pytest.mark.parametrize(("mode", "entry"), prompt_cases("path/to/pack.yaml"))``."""
    from ctxrules.plugins import default_registry
    from ctxrules.prompts.assemble import prompt_set

    resolved = load(pack, Path(rootdir) if rootdir is not None else Path.cwd())
    ps = prompt_set(resolved, default_registry())
    return [
        pytest.param(mode, entry, id=f"{mode}-{entry}")
        for mode in ps.mode_names()
        for entry in [*ps.entry_ids(), NO_ENTRY]
    ]
