"""The ctxrules pytest plugin: assemble prompts from a pack and snapshot them as text files.

Installed with ctxrules (entry point ``pytest11``), so any project that has ctxrules and
pytest gets these without configuration:

- the pack the fixtures use, the first of: the marker ``@pytest.mark.ctxrules_pack(PACK)`` on
  the test (its class or module), which :func:`prompt_cases` puts on every case it makes; the
  option ``--ctxrules-pack PACK``; the ini key ``ctxrules_pack``; ``builtin:default``. A
  relative path is always taken from the pytest rootdir, wherever pytest is started;
- fixture ``ctxrules_pack``: that pack, resolved and validated;
- fixture ``assemble_prompt``: ``assemble_prompt(mode, model=None, *, entry=None,
  variables=None, pack=None) -> AssembledPrompt``;
- fixture ``prompt_snapshot``: syrupy's ``snapshot`` storing each prompt as a ``.txt`` file
  (needs syrupy; ``pytest --snapshot-update`` refreshes the files);
- :func:`prompt_cases`: ``pytest.param`` cases for every mode x ``models:`` entry of a pack,
  plus "no entry", to parametrize a snapshot test with one file per combination.

Importing this module is cheap: ctxrules' engine and syrupy load only when a fixture is used.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from ctxrules.packs.loader import ResolvedPack
    from ctxrules.prompts.assemble import AssembledPrompt

__all__ = ["NO_ENTRY", "assemble_prompt", "ctxrules_pack", "prompt_cases", "prompt_snapshot"]

# ctxrules.prompts.assemble.NO_ENTRY, spelled out: this module loads nothing of the engine until
# a fixture runs (tests/test_prompts_plugin.py checks the two agree).
NO_ENTRY = "no-entry"
DEFAULT_PACK = "builtin:default"
MARKER = "ctxrules_pack"
SNAPSHOT_DIR = "__snapshots__"  # syrupy's folder of snapshot files, next to each test module
_PACKS: dict[str, ResolvedPack] = {}
# The configs of the pytest sessions running in this process (pytester nests them): the rootdir
# of the innermost one is where prompt_cases, called while modules are collected, resolves paths.
_CONFIGS: list[pytest.Config] = []


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(pack): the pack the ctxrules fixtures use for this test (a path "
        "relative to the rootdir, or builtin:NAME)",
    )
    _CONFIGS.append(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    if config in _CONFIGS:
        _CONFIGS.remove(config)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Snapshot folders hold data, never tests. A prompt snapshot is named after its test
    (``test_prompt[...].txt``), which pytest's doctest plugin collects by default
    (``--doctest-glob`` is ``test*.txt``): a ``>>>`` line in a prompt ran as Python on the next
    ``pytest``, and a snapshot that is not UTF-8 stopped the whole run at collection."""
    try:  # below the rootdir only: a project kept in a folder of that name is still collected
        parts = collection_path.relative_to(config.rootpath).parts
    except ValueError:
        parts = (collection_path.name,)
    return True if SNAPSHOT_DIR in parts else None


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
    parser.addini("ctxrules_pack", help=f"pack for the ctxrules fixtures (default {DEFAULT_PACK})", default="")


def _rootdir(config: pytest.Config | None = None) -> Path:
    config = config or (_CONFIGS[-1] if _CONFIGS else None)
    return Path(str(config.rootpath)) if config is not None else Path.cwd()


def _key(ref: str, rootdir: Path) -> str:
    if ref.startswith("builtin:") or Path(ref).is_absolute():
        return ref
    return str((rootdir / ref).resolve())


def load(ref: str, rootdir: Path | None = None) -> ResolvedPack:
    """The validated pack ``ref`` (memoized per process); a relative path is taken from
    ``rootdir`` (default: the running pytest's rootdir, else the working directory)."""
    from ctxrules.packs.validated import load_pack

    key = _key(ref, rootdir if rootdir is not None else _rootdir())
    if key not in _PACKS:
        _PACKS[key] = load_pack(key)
    return _PACKS[key]


def _configured(config: pytest.Config, node: pytest.Item | None = None) -> str:
    marker = node.get_closest_marker(MARKER) if node is not None else None
    if marker is not None:
        if len(marker.args) != 1 or not isinstance(marker.args[0], str | Path):
            raise pytest.UsageError(f"@pytest.mark.{MARKER} takes one pack: a path or builtin:NAME")
        return str(marker.args[0])
    given = config.getoption("ctxrules_pack", default=None)
    if given:
        return str(given)
    try:
        ini = config.getini("ctxrules_pack")
    except ValueError:  # the plugin's ini key is not registered (fixtures imported directly)
        ini = ""
    return str(ini) if ini else DEFAULT_PACK


def _load_for(config: pytest.Config, ref: str) -> ResolvedPack:
    from ctxrules.errors import CtxrulesError

    try:
        return load(ref, _rootdir(config))
    except CtxrulesError as exc:
        _keep_snapshots(config)
        raise pytest.UsageError(f"ctxrules: cannot load pack {ref}: {exc}") from None


def _keep_snapshots(config: pytest.Config | None) -> None:
    """A pack that does not load makes its prompt tests fail to collect or run; syrupy would then
    take their snapshots for unused ones and delete them under ``--snapshot-update`` (every
    prompt snapshot gone because of a typo in the pack). Its ``--snapshot-disable-unused`` is
    turned on for the session instead."""
    if config is not None and hasattr(config.option, "disable_unused_snapshots"):
        config.option.disable_unused_snapshots = True


@pytest.fixture
def ctxrules_pack(request: pytest.FixtureRequest) -> ResolvedPack:
    """The test's pack: its ``ctxrules_pack`` marker, else ``--ctxrules-pack``, else the
    ``ctxrules_pack`` ini key, else builtin:default (loaded once per process)."""
    node = request.node if isinstance(request.node, pytest.Item) else None
    return _load_for(request.config, _configured(request.config, node))


@pytest.fixture
def assemble_prompt(ctxrules_pack: ResolvedPack, request: pytest.FixtureRequest) -> Callable[..., AssembledPrompt]:
    """``assemble_prompt(mode, model=None, *, entry=None, variables=None, pack=None)``:
    the assembled prompt of the test's pack (see ``ctxrules_pack``); ``entry`` picks a
    ``models:`` entry by id (``"no-entry"``: none), ``pack`` another pack."""
    from ctxrules.prompts.assemble import assemble

    config = request.config

    def run(
        mode: str,
        model: str | None = None,
        *,
        entry: str | None = None,
        variables: Mapping[str, Any] | None = None,
        pack: str | None = None,
    ) -> AssembledPrompt:
        resolved = _load_for(config, pack) if pack else ctxrules_pack
        chosen = None if entry == NO_ENTRY else entry
        return assemble(resolved, mode=mode, model=model, entry=chosen, variables=variables)

    return run


@pytest.fixture
def prompt_snapshot(request: pytest.FixtureRequest) -> Any:
    """syrupy's ``snapshot`` storing prompts as readable ``.txt`` files (one per assertion).

    syrupy is not a dependency of ctxrules: without its pytest plugin, asking for ``snapshot``
    as an argument would fail every test with pytest's "fixture 'snapshot' not found", which
    says nothing of syrupy. The fixture is looked up here instead, after saying what is missing."""
    if not request.config.pluginmanager.hasplugin("syrupy"):
        pytest.fail(
            "the prompt_snapshot fixture needs syrupy's pytest plugin, which is not loaded: "
            "pip install syrupy (and do not disable it with -p no:syrupy)",
            pytrace=False,
        )
    from ctxrules.testing.snapshot import PromptSnapshotExtension

    return request.getfixturevalue("snapshot").use_extension(PromptSnapshotExtension)


def prompt_cases(pack: str = DEFAULT_PACK, *, rootdir: str | Path | None = None) -> list[Any]:
    """``pytest.param(mode, entry, id="MODE-ENTRY")`` for every mode x ``models:`` entry of
    ``pack``, plus ``"no-entry"`` for models that match none. Use with
    ``@pytest.mark.parametrize(("mode", "entry"), prompt_cases("path/to/pack.yaml"))``.

    Each case carries ``@pytest.mark.ctxrules_pack(pack)``, so the fixtures of that test use
    the same pack. A relative ``pack`` is taken from the pytest rootdir (``rootdir`` overrides
    it), as the fixtures take it: starting pytest from a subfolder changes nothing."""
    from ctxrules.errors import CtxrulesError
    from ctxrules.plugins import default_registry
    from ctxrules.prompts.assemble import prompt_set

    base = Path(rootdir) if rootdir is not None else _rootdir()
    try:
        resolved = load(pack, base)
    except CtxrulesError as exc:
        _keep_snapshots(_CONFIGS[-1] if _CONFIGS else None)
        raise pytest.UsageError(f"ctxrules: cannot load pack {pack}: {exc}") from None
    ps = prompt_set(resolved, default_registry())
    mark = getattr(pytest.mark, MARKER)(_key(pack, base))
    pairs = [(mode, entry) for mode in ps.mode_names() for entry in [*ps.entry_ids(), NO_ENTRY]]
    return [
        pytest.param(mode, entry, id=case_id, marks=mark)
        for (mode, entry), case_id in zip(pairs, _case_ids(pairs), strict=True)
    ]


# What a snapshot file's name cannot keep of an id as it is: syrupy leaves out these and control
# characters, pytest writes the rest of what is not printable ASCII as escapes.
_UNSAFE = re.compile(r'[\\/?*:|"<>\x00-\x1f\x7f-\x9f]|[^\x00-\x7f]')
_SYRUPY_DROPS = re.compile(r'[\\/?*:|"<>\x00-\x1f\x7f-\x9f]')


def _file_name(case_id: str) -> str:
    """The snapshot file name an id becomes (pytest's escapes, then syrupy's), as a file system
    that ignores case compares it."""
    return _SYRUPY_DROPS.sub("", case_id.encode("unicode_escape").decode("ascii")).casefold()


_MAX_ID = 150  # syrupy cuts a file name at 255 characters


def _case_ids(pairs: list[tuple[str, str]]) -> list[str]:
    """``MODE-ENTRY`` ids, each naming its own snapshot file: syrupy strips ``/\\:*?"<>|`` from
    a file name, pytest escapes non-ASCII, a file system may ignore case, and ``-`` joins names
    that hold one. An id whose file name another's would share (or that is too long) ends with a
    digest of its mode and entry instead; the others are the plain ``MODE-ENTRY``."""
    import hashlib

    plain = [f"{mode}-{entry}" for mode, entry in pairs]
    files = Counter(_file_name(i) for i in plain)
    out = []
    for (mode, entry), case_id in zip(pairs, plain, strict=True):
        if files[_file_name(case_id)] > 1 or len(case_id) > _MAX_ID:
            digest = hashlib.sha256(json.dumps([mode, entry]).encode("utf-8")).hexdigest()[:10]
            case_id = f"{_UNSAFE.sub('_', case_id)[:_MAX_ID]}-{digest}"
        out.append(case_id)
    return out
