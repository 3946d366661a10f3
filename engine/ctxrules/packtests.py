"""Pack-level test cases (``tests:`` in a pack), run by ``ctxrules test``.

A case runs the pack's pipeline on an input file (relative to the pack file that declares the
case) in a fresh temporary session and checks ``expect``: ``fits`` (the output fits the usable
window), ``contains`` / ``not_contains`` (strings in the output messages' text), ``stages_ran``
(pipeline ids that ran), ``max_tokens`` (prompt tokens after the run), ``tier`` (the tier
measured before the run). ``ctxrules test PACK`` runs the cases the pack's own file declares
(``--inherited`` adds its parents'). ``skip_if_missing: true`` skips a case whose input file is absent
(cases on data that only some checkouts have, for instance) instead of failing it.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctxrules.errors import CtxrulesError, UsageError
from ctxrules.messages import message_text

if TYPE_CHECKING:
    from ctxrules.engine import Engine
    from ctxrules.packs.loader import ResolvedPack
    from ctxrules.packs.source import Origin


@dataclass
class CaseResult:
    pack: str
    id: str
    status: str  # passed | failed | skipped
    message: str = ""
    ms: float = 0.0
    kind: str = "pack"


def _output_text(messages: list[dict[str, Any]]) -> str:
    parts = []
    for m in messages:
        parts.append(message_text(m))
        for call in m.get("tool_calls") or []:
            fn = call.get("function") or {}
            parts.append(str(fn.get("name", "")) + " " + str(fn.get("arguments", "")))
    return "\n".join(parts)


def _input_path(engine: Engine, case_index: int, rel: str, key: str = "input") -> Path:
    """The file a case names, resolved; raises OutsideRoots when it is outside the pack."""
    from ctxrules.packs.confine import check_inside

    origin = engine.pack.origins().get(f"/tests/{case_index}/{key}")
    real = engine.pack.real_paths.get(origin.file) if origin else None
    base = real.parent if real else engine.pack.base_dir()
    return check_inside(engine.pack.roots, base, rel, f"test {key}")


def _read_json(path: Path) -> Any:
    """A test's input file, read as ``ctxrules run --input`` reads one: an error names the file
    and the line and column or JSON pointer (it is a ``UsageError``)."""
    from ctxrules.json_files import parse_json
    from ctxrules.packs.confine import MAX_INPUT_BYTES, read_limited

    raw = read_limited(path, MAX_INPUT_BYTES, what=f"test input {path.name!r}")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: not UTF-8 (byte {exc.start})") from None
    return parse_json(text, str(path))


def run_case(engine: Engine, index: int, case: dict[str, Any]) -> CaseResult:
    pack = engine.pack.name
    ident = str(case.get("id"))
    started = time.perf_counter()

    def done(status: str, message: str = "") -> CaseResult:
        return CaseResult(pack, ident, status, message, (time.perf_counter() - started) * 1000)

    from ctxrules.packs.confine import FileRefused, OutsideRoots

    try:
        path = _input_path(engine, index, str(case.get("input")))
    except OutsideRoots as exc:
        if case.get("skip_if_missing"):
            return done("skipped", f"{exc} (allow its folder with --search-path DIR to run it)")
        return done("failed", str(exc))
    except (OSError, ValueError) as exc:
        return done("failed", f"input {case.get('input')!r} is not a usable path ({exc})")
    if not path.exists():
        if case.get("skip_if_missing"):
            return done("skipped", f"input not found: {path}")
        return done("failed", f"input not found: {path}")
    try:
        data = _read_json(path)
        tools = None
        if case.get("tools"):
            tools = _read_json(_input_path(engine, index, str(case["tools"]), "tools"))
        with tempfile.TemporaryDirectory(prefix="ctxrules-test-") as tmp:
            session = engine.session(
                Path(tmp) / "session", model=str(case.get("model", "gpt-4o")), window=case.get("window"), private=True
            )
            result = session.prepare(data, tools)
    except (OutsideRoots, FileRefused) as exc:
        return done("failed", str(exc))
    except OSError as exc:  # a folder, a file that cannot be read: said as `run --input` says it
        return done("failed", f"{exc.filename or path}: cannot read: {exc.strerror or exc}")
    except UsageError as exc:  # the input itself (not UTF-8, not JSON): said as `run --input` says it
        return done("failed", str(exc))
    except (ValueError, CtxrulesError) as exc:
        return done("failed", f"{type(exc).__name__}: {exc}")
    return done(*_check(case.get("expect") or {}, result.messages, result.report))


def _check(expect: dict[str, Any], messages: list[dict[str, Any]], report: dict[str, Any]) -> tuple[str, str]:
    problems: list[str] = []
    after = report["after"]
    if "fits" in expect and bool(after["fits"]) != bool(expect["fits"]):
        problems.append(
            f"fits is {after['fits']} ({after['tokens']} tokens, usable {report['budget']['usable_window']})"
        )
    text = _output_text(messages) if ("contains" in expect or "not_contains" in expect) else ""
    for s in expect.get("contains") or []:
        if s not in text:
            problems.append(f"output does not contain {s!r}")
    for s in expect.get("not_contains") or []:
        if s in text:
            problems.append(f"output contains {s!r}")
    ran = {st["id"] for st in report["stages"] if st["ran"]}
    for sid in expect.get("stages_ran") or []:
        if sid not in ran:
            why = next(
                (st.get("skipped") or st.get("error") for st in report["stages"] if st["id"] == sid),
                "not in the pipeline",
            )
            problems.append(f"stage {sid!r} did not run ({why})")
    if "max_tokens" in expect and after["tokens"] > expect["max_tokens"]:
        problems.append(f"{after['tokens']} tokens > max_tokens {expect['max_tokens']}")
    if "tier" in expect and report["before"]["tier"] != expect["tier"]:
        problems.append(f"tier before was {report['before']['tier']}, expected {expect['tier']}")
    return ("failed", "; ".join(problems)) if problems else ("passed", "")


def declared_in(pack: ResolvedPack, pointer: str, origins: Mapping[str, Origin] | None = None) -> bool:
    """Whether the pack's own file (the last one applied) wrote the item at ``pointer`` or any
    field of it: a case a child overrides is the child's case too."""
    if not pack.files:
        return True
    own = pack.files[-1]
    origins = origins if origins is not None else pack.origins()
    prefix = pointer + "/"
    return any(o.file == own for p, o in origins.items() if p == pointer or p.startswith(prefix))


def run_pack_tests(engine: Engine, *, inherited: bool = False) -> list[CaseResult]:
    """The ``tests:`` cases the pack's own file declares; with ``inherited``, its parents' too
    (a pack that extends ``builtin:default`` does not re-run the built-in cases as its own)."""
    origins = engine.pack.origins()
    return [
        run_case(engine, i, case)
        for i, case in enumerate(engine.pack.data.get("tests") or [])
        if isinstance(case, dict) and (inherited or declared_in(engine.pack, f"/tests/{i}", origins))
    ]
