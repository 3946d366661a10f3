"""Benchmark of the built-in compressors over real outputs.

Inputs: the outputs captured in rules/compressors/fixtures/ (commands and exit codes from
INDEX.tsv) and the corpus's command outputs ($CTXRULES_CORPUS/command-outputs/rtk/*.txt). Per
command family it prints tokens before and after (gpt-4o's o200k_base, exact); the share of
failure lines kept (the lines matching the failure patterns of the rule that compresses the
output; must be 100%: a line the engine could only count, beyond a rule's cap, shows in the
`counted` column); and the share of key lines kept next to the share a plain head + tail of
the same character budget keeps (the baseline, measured in the same run). Throughput is
measured on all inputs together, against a baseline that only splits, hashes and joins the
same texts (the floor of any compressor).

To compare two versions on the same failure lines: `--dump-failures F` writes them (per
input, by line number), `--failures F` reads them instead of asking the rules, and
`--fixtures DIR` benchmarks another tree's captured outputs.

Run: PYTHONPATH=engine python tests/bench_compress.py [--repeat N]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "engine"))

from conftest import COMMAND_OUTPUTS  # noqa: E402

from ctxrules.compressors.api import compress_text  # noqa: E402
from ctxrules.compressors.apply import is_failure  # noqa: E402
from ctxrules.compressors.argv import parse_command  # noqa: E402
from ctxrules.compressors.rules import compile_rules, select_rule  # noqa: E402
from ctxrules.models import lookup_model  # noqa: E402
from ctxrules.packs.validated import load_pack  # noqa: E402
from ctxrules.plugins import default_registry  # noqa: E402
from ctxrules.tokens import TokenCounter  # noqa: E402
from ctxrules.vault import parse_markers  # noqa: E402

FIXTURES = REPO / "rules" / "compressors" / "fixtures"
RTK = COMMAND_OUTPUTS / "rtk"

# Lines an agent needs: failures, locations, outcomes, the names of what changed.
KEY = re.compile(
    r"(?i)(?:\b(?:error|errors|fatal|failed|failure|panic|panicked|exception|warning|unmet|"
    r"conflict)\b(?![.\w])|^FAILED |^ERROR |^E {2,}|traceback|\S+\.\w+:\d+|^\s*--> |"
    r"\b\d+ (?:passed|failed)\b|"
    r"^test result:|successfully|^diff --git |^commit |^\s*(?:modified|deleted|new file|renamed|"
    r"both modified):|^Step \d+/\d+|exited \([1-9])"
)
ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")

RTK_COMMANDS = [
    (r"^mvn_", "mvn test"),
    (r"^gradlew_", "./gradlew build"),
    (r"^sbt_", "sbt test"),
    (r"^build_failed", "dotnet build"),
    (r"^test_failed", "dotnet test"),
    (r"^uv_run_pytest", "uv run pytest"),
    (r"^pytest", "pytest -q"),
    (r"^ctest", "ctest"),
    (r"^make_", "make"),
    (r"^docker_compose", "docker compose up -d"),
    (r"^glab", "glab ci trace"),
]


def inputs(fixtures: Path) -> list[tuple[str, str, str, str, int]]:
    """(id, family, command, text, exit code) for every captured and corpus output."""
    out = []
    for line in (fixtures / "INDEX.tsv").read_text(encoding="utf-8").splitlines():
        name, code, command = line.split("\t", 2)
        text = (fixtures / name).read_text(encoding="utf-8", errors="replace")
        out.append((name, name.split("/")[0], command, text, int(code)))
    for path in sorted(RTK.glob("*.txt")) if RTK.is_dir() else []:
        command = next((c for p, c in RTK_COMMANDS if re.search(p, path.name)), "cat out.txt")
        code = 1 if re.search(r"fail|error|no_pom", path.name) else 0
        family = "rtk:" + command.split()[0].lstrip("./")
        text = path.read_text(encoding="utf-8", errors="replace")
        out.append(("rtk/" + path.name, family, command, text, code))
    return out


def failure_line_numbers(pack: dict[str, object], command: str, text: str, code: int) -> list[int]:
    """Lines of ``text`` matching the failure patterns of the rule that compresses it."""
    from ctxrules.compressors.failures import failure_lines

    parsed = parse_command(command)
    rules = compile_rules(pack, default_registry())
    rule = select_rule(rules, parsed, code, is_failure(code, text)) if parsed else None
    if rule is None or not getattr(rule, "failures", ()):
        return []
    return sorted(failure_lines(rule.failures, text.split("\n")))


def key_lines(text: str) -> list[str]:
    lines = (ANSI.sub("", line).strip() for line in text.split("\n"))
    return [line for line in lines if line and KEY.search(line)]


_WORDS = re.compile(r"\w+")
_PATH_PREFIX = re.compile(r"^\S+\.\w+:(?=\d)")


def words(text: str) -> str:
    return " ".join(_WORDS.findall(text))


def kept(line: str, output_words: str) -> bool:
    """Whether the line's words survive in order: rewrites that only squeeze spaces or move a
    file name into a group header (`path:12: msg` -> `path` + `  12: msg`) still count."""
    return words(_PATH_PREFIX.sub("", line)) in output_words


def head_tail(text: str, budget: int) -> str:
    return text[: budget // 2] + text[len(text) - budget // 2 :]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="passes for the throughput numbers")
    parser.add_argument("--fixtures", type=Path, default=FIXTURES, help="captured outputs folder")
    parser.add_argument("--failures", type=Path, help="read the failure lines from this file")
    parser.add_argument("--dump-failures", type=Path, help="write the failure lines to this file")
    args = parser.parse_args()
    pack = load_pack("builtin:default").data
    counter = TokenCounter.for_model(lookup_model("gpt-4o"))
    items = inputs(args.fixtures)
    given = json.loads(args.failures.read_text(encoding="utf-8")) if args.failures else None
    dumped: dict[str, list[int]] = {}

    # files, tokens before, after, failure lines, kept, counted, key lines, kept, head+tail
    rows: dict[str, list[float]] = defaultdict(lambda: [0.0] * 9)
    for ident, family, command, text, code in items:
        result = compress_text(pack, command, text, code, registry=default_registry())
        output = result.text if result is not None else text
        row = rows[family]
        row[0] += 1
        row[1] += counter.count_text(text)
        row[2] += counter.count_text(output)
        failures = given.get(ident, []) if given else failure_line_numbers(pack, command, text, code)
        dumped[ident] = failures
        originals = text.split("\n")
        ours = words(output)
        counted_ranges = [m.lines for m in parse_markers(output) if m.lines and "failures" in m.extra]
        for n in failures:
            row[3] += 1
            if words(ANSI.sub("", originals[n - 1])) in ours:
                row[4] += 1
            elif any(a <= n <= b for a, b in counted_ranges):
                row[5] += 1
        keys = key_lines(text)
        baseline = words(head_tail(text, len(output)))
        row[6] += len(keys)
        row[7] += sum(kept(k, ours) for k in keys)
        row[8] += sum(kept(k, baseline) for k in keys)
    if args.dump_failures:
        args.dump_failures.write_text(json.dumps(dumped, indent=0), encoding="utf-8")

    print(
        f"{'family':<14}{'files':>6}{'tokens before':>15}{'after':>9}{'saved':>7}"
        f"{'failure lines':>15}{'kept':>7}{'counted':>9}{'key lines':>11}{'kept':>7}"
        f"{'head+tail':>11}"
    )
    total = [0.0] * 9
    for family in sorted(rows):
        row = rows[family]
        total = [a + b for a, b in zip(total, row, strict=True)]
        _print_row(family, row)
    print("-" * 111)
    _print_row("all", total)

    texts = [(command, text, code) for _, _, command, text, code in items]
    size_mb = sum(len(t.encode("utf-8")) for _, t, _ in texts) / 1e6
    started = time.perf_counter()
    for _ in range(args.repeat):
        for command, text, code in texts:
            compress_text(pack, command, text, code, registry=default_registry())
    ours_s = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(args.repeat):
        for _command, text, _code in texts:
            hashlib.sha256(text.encode("utf-8")).hexdigest()
            "\n".join(text.split("\n"))
    floor = time.perf_counter() - started
    print(
        f"\nthroughput over {len(texts)} outputs ({size_mb:.2f} MB) x {args.repeat}: "
        f"{size_mb * args.repeat / ours_s:.1f} MB/s "
        f"(baseline split+hash+join: {size_mb * args.repeat / floor:.1f} MB/s)"
    )


def _print_row(name: str, row: list[float]) -> None:
    files, before, after, fails, fails_kept, fails_counted, keys, kept_ours, kept_ht = row
    saved = 100 * (before - after) / before if before else 0.0
    fail_share = f"{100 * fails_kept / fails:.0f}%" if fails else "-"
    share = 100 * kept_ours / keys if keys else 100.0
    share_ht = 100 * kept_ht / keys if keys else 100.0
    print(
        f"{name:<14}{int(files):>6}{int(before):>15,}{int(after):>9,}{saved:>6.0f}%"
        f"{int(fails):>15}{fail_share:>7}{int(fails_counted):>9}"
        f"{int(keys):>11}{share:>6.0f}%{share_ht:>10.0f}%"
    )


if __name__ == "__main__":
    main()
