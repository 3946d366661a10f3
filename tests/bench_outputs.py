"""Output comparison: what ``builtin:default`` makes of every real transcript, saved or compared.

    python tests/bench_outputs.py --save DIR      # record the outputs of this tree
    python tests/bench_outputs.py --compare DIR   # exit 1 when an output differs from DIR's

A performance change must not change what the model is sent. Every transcript of the corpus
(``$CTXRULES_CORPUS/transcripts``) runs through ``builtin:default`` with gpt-4o at 32K, 64K
and 128K windows, each case in a fresh session (on a memory-backed directory when there is
one), two ways:

- ``cold``: one ``prepare`` of the whole transcript;
- ``warm``: ``prepare`` of the first half, then of three quarters, then of the whole, in one
  session, so the reuse of the previous output (prefix, counts, stage state) is compared too.

Per case it keeps the output messages, tools and request options (``result.messages``,
``result.tools``, ``result.request``) and their SHA-256 over a canonical JSON form. ``--compare``
prints one line per case and, for a mismatch, a unified diff of the first differing message.
The clock and the key that signs injected tags are fixed, and no summarizer model is reachable
(provider keys are removed from the environment), so two runs of the same tree produce the
same outputs.

Not a pytest test: a full pass takes a minute or two.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "engine"))
sys.path.insert(0, str(HERE))
from conftest import TRANSCRIPTS, transcript_paths  # noqa: E402  (the corpus: $CTXRULES_CORPUS)

MODEL = "gpt-4o"
WINDOWS = (32_000, 64_000, 128_000)
CLOCK = 1_750_000_000.0  # fixed: stages that look at the time see the same time in every run
MODES = ("cold", "warm")


def _quiet_environment() -> None:
    """No summarizer model reachable: the deterministic checkpoint summarizes (the pack's
    documented behaviour without credentials), so outputs do not depend on a network."""
    for name in list(os.environ):
        upper = name.upper()
        if upper.endswith(("_API_KEY", "_API_BASE", "_BASE_URL")) or upper.startswith("CTXRULES_LOG"):
            del os.environ[name]
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _scratch() -> Path:
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="ctxrules-bench-outputs-", dir=base))


def run_case(engine: Any, root: Path, history: list[Any], window: int, mode: str, tag: str) -> dict[str, Any]:
    # The state root holds the fixed injection key (signatures of injected tags repeat).
    session = engine.session(root / tag, model=MODEL, window=window, state_root=root / "state")
    if mode == "cold":
        steps = [len(history)]
    else:
        n = len(history)
        steps = [max(1, n // 2), max(1, (3 * n) // 4), n]
    result = None
    for i, upto in enumerate(steps):
        result = session.prepare(history[:upto], clock=CLOCK + 60 * i)
    assert result is not None
    return {
        "messages": result.messages,
        "tools": result.tools,
        "request": result.request,
        "tokens_after": result.report["after"]["tokens"],
        "tier_after": result.report["after"]["tier"],
    }


def collect(only: list[str]) -> dict[str, dict[str, Any]]:
    from ctxrules import Engine

    engine = Engine.load("builtin:default")
    root = _scratch()
    # A fixed key for the signatures of injected tags (a fresh session would make a random one),
    # so that two runs of the same tree compare equal; every case's session is still fresh.
    key = root / "state" / "injection.key"
    key.parent.mkdir(mode=0o700)
    key.write_text(hashlib.sha256(b"bench_outputs").hexdigest() + "\n", encoding="ascii")
    key.chmod(0o600)
    out: dict[str, dict[str, Any]] = {}
    paths = [p for p in transcript_paths() if not only or any(o in p.name for o in only)]
    if not paths:
        raise SystemExit(f"no transcripts found in {TRANSCRIPTS} (set CTXRULES_CORPUS)")
    started = time.perf_counter()
    try:
        for path in paths:
            history = json.loads(path.read_text(encoding="utf-8"))
            for window in WINDOWS:
                for mode in MODES:
                    key = f"{path.stem}@{window // 1000}K-{mode}"
                    case = run_case(engine, root, history, window, mode, key)
                    payload = {k: case[k] for k in ("messages", "tools", "request")}
                    case["digest"] = hashlib.sha256(canonical(payload).encode("utf-8")).hexdigest()
                    out[key] = case
    finally:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    print(f"{len(out)} cases from {len(paths)} transcripts in {time.perf_counter() - started:.1f} s")
    return out


def save(cases: dict[str, dict[str, Any]], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    index = {}
    for key, case in cases.items():
        (folder / f"{key}.json").write_text(canonical(case), encoding="utf-8")
        index[key] = {k: case[k] for k in ("digest", "tokens_after", "tier_after")} | {
            "messages": len(case["messages"])
        }
    (folder / "index.json").write_text(json.dumps(index, indent=1, sort_keys=True), encoding="utf-8")
    print(f"saved {len(cases)} outputs to {folder}")


def _first_difference(old: dict[str, Any], new: dict[str, Any]) -> str:
    """A unified diff of the first part that differs (a message, the tools or the request)."""
    for part in ("messages", "tools", "request"):
        a, b = old[part], new[part]
        if a == b:
            continue
        if part == "messages":
            head = f"messages: {len(a)} before, {len(b)} now\n" if len(a) != len(b) else ""
            for i, (x, y) in enumerate(zip(a, b, strict=False)):
                if x != y:
                    return head + _diff(f"messages[{i}]", x, y)
            i = min(len(a), len(b))
            return head + _diff(f"messages[{i}:]", a[i:], b[i:])
        return _diff(part, a, b)
    return "(no difference in messages, tools or request)"


def _diff(label: str, a: Any, b: Any, limit: int = 60) -> str:
    lines = list(
        difflib.unified_diff(
            json.dumps(a, indent=1, sort_keys=True, ensure_ascii=False).splitlines(),
            json.dumps(b, indent=1, sort_keys=True, ensure_ascii=False).splitlines(),
            f"{label} (saved)",
            f"{label} (now)",
            lineterm="",
            n=2,
        )
    )
    more = f"\n    ... {len(lines) - limit} more diff lines" if len(lines) > limit else ""
    return "\n".join("    " + line for line in lines[:limit]) + more


def compare(cases: dict[str, dict[str, Any]], folder: Path) -> int:
    index = json.loads((folder / "index.json").read_text(encoding="utf-8"))
    bad = 0
    for key in sorted(set(index) | set(cases)):
        if key not in cases:
            if not _only_filter_skipped(key):
                print(f"MISSING  {key}: in the saved outputs, not run now")
            continue
        if key not in index:
            print(f"NEW      {key}: not in the saved outputs")
            bad += 1
            continue
        now, saved = cases[key], index[key]
        if now["digest"] == saved["digest"]:
            print(f"same     {key}  {now['tokens_after']:>7} tokens, {len(now['messages'])} messages")
            continue
        bad += 1
        old = json.loads((folder / f"{key}.json").read_text(encoding="utf-8"))
        print(
            f"DIFFERS  {key}: tokens {saved['tokens_after']} -> {now['tokens_after']}, "
            f"messages {saved['messages']} -> {len(now['messages'])}, "
            f"tier {saved['tier_after']} -> {now['tier_after']}"
        )
        print(_first_difference(old, now))
    print(f"{len(cases) - bad} of {len(cases)} outputs identical to {folder}")
    return 1 if bad else 0


_ONLY: list[str] = []


def _only_filter_skipped(key: str) -> bool:
    return bool(_ONLY) and not any(o in key for o in _ONLY)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--save", type=Path, metavar="DIR", help="write the outputs of this tree to DIR")
    group.add_argument("--compare", type=Path, metavar="DIR", help="compare the outputs with those saved in DIR")
    parser.add_argument("--only", action="append", default=[], help="transcripts whose name contains this")
    args = parser.parse_args(argv)
    if args.compare and not (args.compare / "index.json").is_file():
        # Checked before the minutes the corpus takes, not found by a traceback after them.
        parser.error(f"--compare {args.compare}: no index.json there (make one with --save DIR)")
    _quiet_environment()
    _ONLY.extend(args.only)
    cases = collect(args.only)
    if args.save:
        save(cases, args.save)
        return 0
    return compare(cases, args.compare)


if __name__ == "__main__":
    sys.exit(main())
