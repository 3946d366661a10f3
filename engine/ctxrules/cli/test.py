"""``ctxrules test PACK... [--require-tests]``: run the test cases packs carry."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ctxrules.cli.io import add_search_path
from ctxrules.cli.output import write_stdout
from ctxrules.compressors.testing import run_compressor_tests
from ctxrules.engine import Engine
from ctxrules.errors import PackError, PackNotFound
from ctxrules.packtests import CaseResult, run_pack_tests
from ctxrules.printable import printable
from ctxrules.validation.validate import collect_files


def register(sub: Any) -> None:
    p = sub.add_parser(
        "test",
        help="run the tests packs carry",
        description="Run the test cases each PACK (a file, a folder searched for pack "
        "files, or builtin:NAME) declares in its own file: pack-level "
        "cases (tests:) and its compressors' inline tests. Exit 1 when a "
        "case fails.",
    )
    p.add_argument("packs", nargs="+", metavar="PACK")
    p.add_argument("--inherited", action="store_true", help="also run the cases the packs it extends declare")
    p.add_argument("--require-tests", action="store_true", help="fail a pack whose own file declares no test cases")
    add_search_path(p)
    p.set_defaults(func=run)


def _expand(refs: list[str], outside: list[Path]) -> list[tuple[str, str | None]]:
    """The packs ``refs`` name, each with the folder named that it was found below (None for
    a pack named itself); symlinks in a folder to files outside it go to ``outside``."""
    out: list[tuple[str, str | None]] = []
    for ref in refs:
        if ref.startswith("builtin:"):
            out.append((ref, None))
        else:
            folder = ref if Path(ref).is_dir() else None
            out.extend((str(p), folder) for p in collect_files([ref], outside=outside))
    return out


def _compressor_cases(engine: Any, require_tests: bool, inherited: bool, seen: set[tuple[str, str, str]]) -> list[Any]:
    """The inline tests of the pack's compressors (ctxrules.compressors.testing); a test that
    several packs inherit (each fragment and builtin:default) runs once per invocation."""
    out: list[CaseResult] = []
    cases = run_compressor_tests(
        engine.pack, require_tests=require_tests, registry=engine.registry, inherited=inherited
    )
    for case in cases:
        key = (case.source, case.compressor, case.id)
        if key in seen:
            continue
        seen.add(key)
        status = "passed" if case.passed else "failed"
        out.append(
            CaseResult(f"compressor:{case.compressor}", case.id, status, case.message, case.ms, kind="compressor")
        )
    return out


def run(args: argparse.Namespace) -> int:
    results: list[CaseResult] = []
    seen: set[tuple[str, str, str]] = set()
    outside: list[Path] = []
    refs = _expand(args.packs, outside)
    for link in outside:
        message = "a symlink to a file outside the folder; the file is not read (CR100)"
        results.append(CaseResult(link.as_posix(), "(load)", "failed", message))
    for ref, folder in refs:
        shown = ref if ref.startswith("builtin:") else Path(ref).as_posix()
        # As `validate FOLDER`: a pack found below a named folder may read anywhere in it.
        search_path = [*args.search_path, folder] if folder is not None else args.search_path
        try:
            engine = Engine.load(ref, search_path=search_path)
        except PackNotFound:
            raise  # a missing pack is a usage error (exit 2), as a missing path is
        except PackError as exc:
            results.append(CaseResult(shown, "(load)", "failed", str(exc)))
            continue
        own = engine.pack.docs.get(engine.pack.files[-1]) if engine.pack.files else None
        declared = bool(own and isinstance(own.data, dict) and own.data.get("tests"))
        # A compressor fragment's tests are its compressors' inline tests.
        declared = declared or bool(
            own
            and isinstance(own.data, dict)
            and any(isinstance(c, dict) and c.get("tests") for c in own.data.get("compressors") or [])
        )
        cases = run_pack_tests(engine, inherited=args.inherited)
        cases.extend(_compressor_cases(engine, args.require_tests, args.inherited, seen))
        if args.require_tests and not declared:
            cases.append(CaseResult(engine.pack.name, "(tests)", "failed", f"{shown} declares no tests"))
        results.extend(cases)
    for r in results:
        label = {"passed": "PASS", "failed": "FAIL", "skipped": "SKIP"}[r.status]
        line = f"{label} {r.pack}::{r.id}" + (f" ({r.ms:.0f} ms)" if r.ms else "")
        if r.message:
            line += f": {r.message}"
        write_stdout(printable(line) + "\n")  # one line per case; ids and messages quote the pack
    passed = sum(r.status == "passed" for r in results)
    failed = sum(r.status == "failed" for r in results)
    skipped = sum(r.status == "skipped" for r in results)
    write_stdout(f"{passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else "") + "\n")
    return 1 if failed else 0
