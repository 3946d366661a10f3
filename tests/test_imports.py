"""The import graph of ctxrules' own modules: no cycles (counting imports inside functions and
under TYPE_CHECKING, which only hide a cycle), few imports inside functions, and a light
``ctxrules validate``."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[1] / "engine"
PACKAGE = ENGINE / "ctxrules"

# Own-module imports inside functions, per 10K lines of ctxrules (pytest has about 12, pluggy 6).
# Heavy third-party libraries (litellm, tiktoken, tokenizers) stay lazy and are not counted.
MAX_FUNCTION_LEVEL_PER_10K = 15


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ENGINE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _targets(module: str, path: Path, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The ctxrules modules an import statement names (``from pkg import submodule`` names the
    submodule; ``from module import name`` names the module)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            target = ".".join([*base, *([node.module] if node.module else [])])
        else:
            target = node.module or ""
        names = [f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target for a in node.names]
    out = []
    for name in names:
        while name not in MODULES and "." in name:
            name = name.rsplit(".", 1)[0]
        if name in MODULES and name != module and name.split(".")[0] == "ctxrules":
            out.append(name)
    return out


def _imports(tree: ast.AST) -> list[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import with where it sits: ``top``, ``function`` or ``type_checking``."""
    found: list[tuple[ast.Import | ast.ImportFrom, str]] = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                found.append((child, where))
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                visit(child, "function" if where == "top" else where)
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for stmt in child.body:
                    visit(ast.Module(body=[stmt], type_ignores=[]), "type_checking")
                for stmt in child.orelse:
                    visit(ast.Module(body=[stmt], type_ignores=[]), where)
            else:
                visit(child, where)

    visit(tree, "top")
    return found


def import_graph() -> tuple[dict[str, set[str]], list[str], int]:
    """(module -> the ctxrules modules it imports anywhere, the function-level import sites,
    the number of lines)."""
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    function_level: list[str] = []
    lines = 0
    for module, path in MODULES.items():
        source = path.read_text(encoding="utf-8")
        lines += len(source.splitlines())
        for node, where in _imports(ast.parse(source)):
            targets = _targets(module, path, node)
            edges[module].update(targets)
            if targets and where == "function":
                function_level.append(f"{path.relative_to(ENGINE)}:{node.lineno}")
    return edges, function_level, lines


def cycle_groups(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    groups: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups


def test_the_cycle_finder_finds_a_cycle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycle_groups(edges) == [["a", "b", "c"]]


def test_the_import_scan_sees_function_and_type_checking_imports() -> None:
    tree = ast.parse("import os\nif TYPE_CHECKING:\n    import a\ndef f():\n    import b\n")
    assert [where for _, where in _imports(tree)] == ["top", "type_checking", "function"]


def test_no_import_cycles_among_ctxrules_modules() -> None:
    edges, _, _ = import_graph()
    groups = cycle_groups(edges)
    described = ["; ".join(f"{a} -> {b}" for a in g for b in sorted(edges[a] & set(g))) for g in groups]
    assert groups == [], "import cycles (counting function-level and TYPE_CHECKING imports):\n" + "\n".join(described)


def test_few_imports_of_ctxrules_modules_inside_functions() -> None:
    _, sites, lines = import_graph()
    density = len(sites) * 10_000 / lines
    assert density <= MAX_FUNCTION_LEVEL_PER_10K, (
        f"{len(sites)} function-level imports of ctxrules modules in {lines} lines ({density:.1f} per 10K; "
        f"at most {MAX_FUNCTION_LEVEL_PER_10K}): import at module level, or cut the cycle that forces it:\n"
        + "\n".join(sites)
    )


_PROBE = """
import json, sys
from ctxrules.cli.main import run
code = run(sys.argv[1:])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def test_validate_does_not_import_the_tokenizer_or_the_pipeline(tmp_path: Path) -> None:
    pack = Path(__file__).resolve().parents[1] / "rules"
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, "validate", "--format", "json", str(pack)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ENGINE), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["code"] == 0
    loaded = result["modules"]
    assert "ctxrules.validation.validate" in loaded  # the probe did run the validation
    heavy = [
        m
        for m in loaded
        if m == "ctxrules.tokens"
        or m.startswith(("ctxrules.pipeline", "ctxrules.engine", "ctxrules.runtime"))
        or m.split(".")[0] in ("tiktoken", "tokenizers", "litellm")
        # structlog (and asyncio, which it imports) only when the application configured it
        or m.split(".")[0] in ("structlog", "asyncio")
    ]
    assert heavy == []


def test_a_verb_loads_only_its_own_cli_module(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, "schema"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ENGINE), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])["modules"]
    # ctxrules.cli.output: how every verb prints (the standard library and ctxrules.errors);
    # ctxrules.cli.stops: how every verb ends on a signal (the standard library and threads).
    cli = sorted(m for m in loaded if m.startswith("ctxrules.cli."))
    assert cli == ["ctxrules.cli.main", "ctxrules.cli.output", "ctxrules.cli.schema", "ctxrules.cli.stops"]


def test_import_ctxrules_is_cheap_and_the_plugin_api_is_at_the_top_level(tmp_path: Path) -> None:
    probe = (
        "import json, sys, ctxrules\n"
        "before = sorted(m for m in sys.modules if m.startswith('ctxrules'))\n"
        "from ctxrules import hookimpl, StageType, StageOutcome, StageContext, Message\n"
        "from ctxrules.hookspecs import hookimpl as spec_impl\n"
        "print(json.dumps({'before': before, 'same': hookimpl is spec_impl,\n"
        "                  'all': sorted(ctxrules.__all__)}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ENGINE), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["before"] == ["ctxrules", "ctxrules._version", "ctxrules.errors"]
    assert result["same"]
    assert {"hookimpl", "StageType", "StageOutcome", "StageContext", "Message"} <= set(result["all"])


def test_import_ctxrules_keeps_a_litellm_imported_after_it_offline(tmp_path: Path) -> None:
    """docs/integrations.md: import ctxrules before litellm and litellm reads its bundled model
    map (offline, a fetch on import waits seconds for its retries); a value set is kept."""
    probe = "import os, ctxrules; print(os.environ.get('LITELLM_LOCAL_MODEL_COST_MAP'))"
    env = {"PYTHONPATH": str(ENGINE), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    for given, expected in ((None, "True"), ("False", "False")):
        extra = {} if given is None else {"LITELLM_LOCAL_MODEL_COST_MAP": given}
        proc = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env={**env, **extra}
        )
        assert proc.returncode == 0 and proc.stdout.strip() == expected, proc.stderr


def test_no_module_imports_a_private_name_of_another() -> None:
    """A name with a leading underscore is its module's own, free to change: another module that
    imports it (cache_markers took json_stream's ``_make_text``) breaks silently when it does.
    What is shared gets a public name."""
    found = []
    for module, path in MODULES.items():
        for node, _where in _imports(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and _targets(module, path, node):
                private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                found += [f"{module}:{node.lineno} imports {name}" for name in private]
    assert found == []


def test_the_session_names_a_store_keeps_for_itself_include_its_key_file() -> None:
    """integrations names the key file by a literal (importing ctxrules.injected would be an
    import cycle): the two must not drift apart."""
    from ctxrules.injected import KEY_FILE
    from ctxrules.integrations import session_name

    assert session_name(KEY_FILE) != KEY_FILE
