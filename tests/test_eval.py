"""``ctxrules eval``: the cache model's rules, the cost and cache figures against a computation
by hand, retention probes, the invariants' exit code, the outputs people read."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from browser_kit import screenshot_pixels
from conftest import REPO, TRANSCRIPTS, transcript_path

from ctxrules.cli.main import run as cli_run
from ctxrules.eval.caching import AutomaticPrefixCache, Block, BlockChain, BreakpointCache, blocks_of
from ctxrules.eval.checks import pairing_problems, pin_problems
from ctxrules.eval.probes import ProbeExtractor, check_probes, context_text
from ctxrules.models import lookup_model
from ctxrules.tokens import TokenCounter
from ctxrules.toolroles import tool_roles

Msg = dict[str, Any]


def words(seed: str, n: int) -> str:
    """About ``n`` tokens of distinct words (o200k: one token per " wNNN" chunk or so)."""
    return " ".join(f"{seed}{i}" for i in range(n))


def call(cid: str, name: str, **args: Any) -> Msg:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def transcript(seed: str) -> list[Msg]:
    return [
        {"role": "system", "content": "You are a careful coding agent."},
        {"role": "user", "content": f"Fix the parser in src/{seed}.py. " + words(seed, 900)},
        {"role": "assistant", "content": None, "tool_calls": [call("a1", "Bash", command="pytest -q")]},
        {
            "role": "tool",
            "tool_call_id": "a1",
            "content": "FAILED test_x.py::test_p - boom\n1 failed, 3 passed in 0.2s\nExit code 1",
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [call("a2", "Edit", file_path=f"src/{seed}.py", old_string="a", new_string="b")],
        },
        {"role": "tool", "tool_call_id": "a2", "content": "edited " + words("edit", 300)},
        {"role": "user", "content": "Now run the tests again."},
        {"role": "assistant", "content": "Done: 4 passed."},
    ]


def run_cli(*args: str) -> int:
    return cli_run(list(args))


def eval_json(tmp_path: Path, transcripts: dict[str, list[Msg]], *args: str, code: int = 0) -> dict[str, Any]:
    """Write ``transcripts`` (name -> messages) as files, run ``ctxrules eval ARGS --quiet
    --json`` on them, check its exit code, and return the JSON it wrote."""
    paths = []
    for name, msgs in transcripts.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(msgs))
        paths.append(str(path))
    out = tmp_path / "eval.json"
    assert run_cli("eval", *args, "--quiet", "--json", str(out), *paths) == code
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def by_plan(data: dict[str, Any]) -> dict[str, Any]:
    return {t["plan"]: t for t in data["totals"]}


# --- the cache rules ---------------------------------------------------------------------------


def test_automatic_prefix_caching_counts_from_1024_tokens_in_128_token_steps() -> None:
    cache = AutomaticPrefixCache()
    first = [Block("p1", 600, False), Block("p2", 500, False), Block("p3", 900, False)]
    assert cache.request(first, 0.0).read == 0  # nothing seen yet
    # 1,100 shared tokens (two blocks): read in 128-token steps from 1,024.
    use = cache.request([*first[:2], Block("q3", 50, False)], 10.0)
    assert (use.prompt, use.read, use.write) == (1150, 1024, 0)
    assert cache.request(first, 20.0).read == 1920  # 2,000 shared -> 15 * 128
    assert cache.request([Block("p1", 600, False), Block("r2", 10, False)], 30.0).read == 0  # < 1,024
    # Entries expire after ten minutes without use.
    assert cache.request(first, 30.0 + 601).read == 0


def test_breakpoint_caching_reads_and_writes_up_to_cache_control_breakpoints() -> None:
    cache = BreakpointCache()
    one = [Block("s", 1000, False), Block("m1", 500, True), Block("m2", 600, True)]
    use = cache.request(one, 0.0)
    assert (use.read, use.write, use.uncached) == (0, 2100, 0)
    two = [*one[:2], Block("m2", 600, False), Block("m3", 300, True)]
    use = cache.request(two, 60.0)
    # The longest earlier breakpoint prefix it still has ends at m1 (m2 lost its breakpoint,
    # but m3's chain covers it: it is written now).
    assert (use.read, use.write, use.uncached) == (1500, 900, 0)
    # Five minutes without a hit: the entries are gone.
    assert cache.request(two, 60.0 + 301).read == 0
    # A prefix under 1,024 tokens is never cached.
    small = BreakpointCache()
    tiny = [Block("t", 900, True)]
    assert small.request(tiny, 0).write == 0 and small.request(tiny, 1).read == 0


def test_blocks_ignore_where_the_breakpoints_are() -> None:
    msg = {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    marked = {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}
    plain, with_mark = blocks_of([msg], [5]), blocks_of([marked], [5])
    assert plain[0].chain == with_mark[0].chain
    assert not plain[0].breakpoint and with_mark[0].breakpoint


# --- figures against a computation by hand -----------------------------------------------------


def test_cost_and_cached_share_match_a_hand_computation(tmp_path: Path) -> None:
    info = lookup_model("gpt-4o")
    # The known price: gpt-4o input $2.50 / M tokens, cached input $1.25 / M.
    assert (info.input_cost_per_token, info.cache_read_input_token_cost) == (2.5e-06, 1.25e-06)
    counter = TokenCounter.for_model(info)
    data = eval_json(
        tmp_path,
        {seed: transcript(seed) for seed in ("alpha", "beta")},
        "--baseline",
        "none",
        "--model",
        "gpt-4o",
        "--window",
        "128000",
    )
    calls = [c for c in data["calls"] if c["plan"] == "none"]
    expected_usd = 0.0
    expected_sent = expected_read = 0
    for seed in ("alpha", "beta"):
        msgs = transcript(seed)
        counts = counter.count_each(msgs)
        # Assistant messages at 2, 4 and 7: calls send msgs[:2], msgs[:4], msgs[:7]; each call
        # extends the last, so the shared prefix is the whole previous request.
        prompts = [sum(counts[:2]), sum(counts[:4]), sum(counts[:7])]
        reads = [0]
        for prev in prompts[:-1]:
            reads.append(prev // 128 * 128 if prev >= 1024 else 0)
        mine = [c for c in calls if c["transcript"] == seed]
        assert [c["prompt"] for c in mine] == prompts
        assert [c["read"] for c in mine] == reads
        for prompt, read, c in zip(prompts, reads, mine, strict=True):
            usd = (prompt - read) * 2.5e-06 + read * 1.25e-06
            assert c["usd"] == pytest.approx(usd, rel=1e-9)
            expected_usd += usd
        expected_sent += sum(prompts)
        expected_read += sum(reads)
    (total,) = data["totals"]
    assert total["tokens_sent"] == expected_sent and total["cache_read"] == expected_read
    assert total["cached_share"] == pytest.approx(expected_read / expected_sent, abs=1e-6)
    assert total["usd"] == pytest.approx(expected_usd, abs=1e-6)
    assert total["overflows"] == 0 and total["calls"] == 6


def test_a_pack_that_changes_nothing_costs_what_the_raw_history_costs(tmp_path: Path) -> None:
    totals = by_plan(
        eval_json(
            tmp_path,
            {"t": transcript("gamma")},
            "--pack",
            "builtin:default",
            "--baseline",
            "none",
            "--model",
            "gpt-4o",
            "--window",
            "128000",
        )
    )
    pack, raw = totals["builtin:default"], totals["none"]
    assert pack["tokens_sent"] == raw["tokens_sent"] and pack["usd"] == pytest.approx(raw["usd"])
    assert pack["compactions"] == 0 and pack["invariant_violations"] == 0


def test_a_window_the_raw_history_does_not_fit_counts_overflows_and_loses_the_probes(tmp_path: Path) -> None:
    msgs = transcript("delta")
    counts = TokenCounter.for_model(lookup_model("gpt-4o")).count_each(msgs)
    # The usable window (8192 reserved for the reply) holds the first call, not the others.
    window = 8192 + sum(counts[:2]) + 10
    data = eval_json(
        tmp_path,
        {"t": msgs},
        "--pack",
        "builtin:default",
        "--baseline",
        "none",
        "--model",
        "gpt-4o",
        "--window",
        str(window),
    )
    totals = by_plan(data)
    assert totals["none"]["overflows"] == 2 and totals["none"]["tokens_sent"] == sum(counts[:2])
    raw_calls = [c for c in data["calls"] if c["plan"] == "none" and not c["fits"]]
    assert len(raw_calls) == 2
    assert all(c["usd"] == 0 and all(v["kept"] == 0 for v in c["retention"].values()) for c in raw_calls)


# --- probes and invariants ---------------------------------------------------------------------


def test_probes_come_from_the_original_transcript_and_markers_recover_them() -> None:
    from ctxrules.packs.validated import load_pack

    msgs = transcript("eps")
    extractor = ProbeExtractor(msgs, tool_roles(load_pack("builtin:default").data))
    probes = {(p.category, p.text) for p in extractor.probes(7)}
    assert ("anchor", msgs[1]["content"]) in probes
    assert ("latest_ask", "Now run the tests again.") in probes
    assert ("edited_files", "src/eps.py") in probes
    assert ("commands", "pytest -q") in probes
    assert ("errors", "FAILED test_x.py::test_p - boom") in probes
    assert ("test_status", "1 failed, 3 passed in 0.2s") in probes
    # A context that lost the failing result but holds a marker whose vault item has it.
    vid = "ab" * 32
    context = context_text(
        [
            *msgs[:3],
            {
                "role": "tool",
                "tool_call_id": "a1",
                "content": f"[ctxrules:elided kind=lines count=3 ref=vault://{vid}]",
            },
            *msgs[4:7],
        ]
    )
    found = check_probes(extractor.probes(7), context, lambda v: msgs[3]["content"] if v == vid else None)
    assert found.recoverable["errors"] == 1 and found.recoverable["test_status"] == 1
    assert found.lost["errors"] == 0 and found.kept["anchor"] == 1


def test_the_invariant_checks_find_broken_pairing_and_lost_pins() -> None:
    msgs = transcript("zeta")
    assert pairing_problems(msgs) == [] and pin_problems(msgs, msgs) == []
    orphan = [*msgs[:2], msgs[3], *msgs[4:]]
    assert any("answers no call" in p for p in pairing_problems(orphan))
    twice = [*msgs[:4], dict(msgs[3]), *msgs[4:]]
    assert any("answered 2 times" in p for p in pairing_problems(twice))
    reused = [
        *msgs[:4],
        {**msgs[4], "tool_calls": [call("a1", "Bash", command="ls")]},
        {"role": "tool", "tool_call_id": "a1", "content": "x"},
    ]
    assert any("used before" in p for p in pairing_problems(reused))
    assert pin_problems(msgs, [msgs[0], *msgs[2:]]) == ["the human anchor is not in the output unchanged"]
    # A user message that only looks like a spill marker, with a length int() refuses.
    fake = f"[ctxrules:elided kind=lines count=1 ref=vault://{'ab' * 32} reason=spill chars={'9' * 5000}]"
    quoting = [*msgs, {"role": "user", "content": fake}]
    assert pin_problems(quoting, quoting) == []


def test_a_cache_breakpoint_on_a_pinned_message_is_no_change(tmp_path: Path) -> None:
    """On Anthropic models the cache stage puts a breakpoint on the system prompt and on recent
    messages: a string content becomes one text part with ``cache_control``. The model reads the
    same text, but the pin check compared the objects, and every call of a replay of a
    transcript with string contents was an invariant broken (exit 1)."""
    msgs = transcript("mu")

    def marked(msg: Msg) -> Msg:
        part = {"type": "text", "text": msg["content"], "cache_control": {"type": "ephemeral"}}
        return {**msg, "content": [part]}

    output = [marked(msgs[0]), marked(msgs[1]), *msgs[2:6], marked(msgs[6])]
    assert pin_problems(msgs[:7], output) == []
    edited = {**marked(msgs[0]), "content": [{"type": "text", "text": "You are someone else."}]}
    assert pin_problems(msgs[:7], [edited, *output[1:]]) == ["the leading system messages changed"]
    totals = by_plan(eval_json(tmp_path, {"t": msgs}, "--pack", "builtin:default", "--model", "claude-sonnet-4-5"))
    assert totals["builtin:default"]["invariant_violations"] == 0


def test_an_invariant_broken_on_a_call_of_a_pack_exits_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ctxrules.eval.replay as replay

    monkeypatch.setattr(replay, "Pairing", lambda: lambda out: ["message 3: broken on purpose"])
    totals = by_plan(
        eval_json(
            tmp_path,
            {"t": transcript("eta")},
            "--pack",
            "builtin:default",
            "--baseline",
            "none",
            "--model",
            "gpt-4o",
            "--window",
            "128000",
            code=1,
        )
    )
    assert totals["builtin:default"]["invariant_violations"] == 3  # one per call
    assert totals["none"]["invariant_violations"] == 0  # baselines are measured, not judged


def test_bad_inputs_are_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli("eval", "--model", "gpt-4o", str(tmp_path)) == 2
    assert "at least one --pack or --baseline" in capsys.readouterr().err
    (tmp_path / "x.json").write_text('{"not": "a transcript"}')
    assert run_cli("eval", "--baseline", "none", "--model", "gpt-4o", str(tmp_path)) == 2
    err = capsys.readouterr().err
    assert "not a transcript" in err and "no transcript among the inputs" in err
    assert run_cli("eval", "--baseline", "none", "--model", "gpt-4o", str(tmp_path / "gone")) == 2
    assert run_cli("eval", "--baseline", "none", "--model", "no-such-model-xyz", str(tmp_path)) == 2


@pytest.mark.parametrize(
    ("body", "words_"),
    [
        ('[{"role": "user", "content": "hi"}, {"role": "assistant", "content": NaN}]', "NaN"),
        ('{"messages": [{"role": "user", "content": "hi"}, 5]}', "expected an object"),
        ('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": 5}]}', "tool_calls"),
        ("[" * 200 + "]" * 200, "nested"),
        ('[{"role": "user", "content": "hi"}, {"content": "no role"}]', "message 1: missing 'role'"),
        ('[{"role": "user", "content": "hi"}, "hello"]', "message 1: expected an object, got string"),
    ],
    ids=[
        "nan",
        "not-an-object",
        "tool-calls-not-a-list",
        "deep",
        "a-list-item-without-role",
        "a-list-item-not-an-object",
    ],
)
def test_a_damaged_transcript_is_a_usage_error_naming_it_not_a_broken_pack(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, words_: str
) -> None:
    """Read and checked as `ctxrules run` reads its input: exit 2 naming the file, never an
    internal error, never exit 1 blaming the pack for a transcript it was never given."""
    (tmp_path / "bad.json").write_text(body)
    (tmp_path / "good.json").write_text(json.dumps(transcript("g")))
    code = run_cli("eval", "--pack", "builtin:default", "--model", "gpt-4o", "--quiet", str(tmp_path))
    err = capsys.readouterr().err
    assert code == 2 and "bad.json" in err and words_ in err, err
    assert "internal error" not in err and "invariants broke" not in err


def test_a_timestamp_no_clock_shows_is_ignored(tmp_path: Path) -> None:
    msgs = transcript("t")
    msgs[2] = {**msgs[2], "timestamp": 10**400}
    msgs[4] = {**msgs[4], "created_at": "0001-01-01T00:00:00+14:00"}
    data = eval_json(tmp_path, {"t": msgs}, "--pack", "builtin:default", "--model", "gpt-4o")
    assert by_plan(data)["builtin:default"]["calls"] > 0


def test_an_iso_timestamp_outside_1970_to_9999_is_ignored_as_a_number_is() -> None:
    # A number outside the range was ignored, an ISO string was not: "0001-01-01T00:00:00Z"
    # became a clock 62 billion seconds before the call before it, and the cache model
    # counted every entry as expired.
    from ctxrules.eval.replay import _EPOCH, _clock

    for stamp in ("0001-01-01T00:00:00Z", "1969-12-31T23:59:59Z", "9999-12-31T23:59:59-14:00", -1, 10**12):
        assert _clock([{"timestamp": stamp}], 0, 2, 20.0) == _EPOCH + 40.0, stamp
    assert _clock([{"timestamp": "2024-01-01T00:00:00Z"}], 0, 2, 20.0) == 1704067200.0


def test_transcripts_with_the_same_file_name_keep_their_own_rows(tmp_path: Path) -> None:
    """`a/t.json` and `b/t.json`: two rows named by their paths, each with its own calls; the
    same file named twice is replayed once."""
    for folder, turns in (("a", 1), ("b", 3)):
        (tmp_path / folder).mkdir()
        msgs = transcript(folder)[:2]
        for n in range(turns):
            msgs += [{"role": "assistant", "content": f"step {n}"}, {"role": "user", "content": f"go on {n}"}]
        (tmp_path / folder / "t.json").write_text(json.dumps(msgs))
    out = tmp_path / "eval.json"
    a, b = str(tmp_path / "a" / "t.json"), str(tmp_path / "b")
    code = run_cli("eval", "--baseline", "none", "--model", "gpt-4o", "--quiet", "--json", str(out), a, b, a)
    assert code == 0
    rows = {r["transcript"]: r["calls"] for r in json.loads(out.read_text())["transcripts"]}
    assert rows == {"a/t": 1, "b/t": 3}


def test_json_on_stdout_is_the_json_alone_and_one_place_for_two_files_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--json -` printed the table first, so stdout did not parse; `--json F --html F` wrote the
    page over the JSON, after the whole replay."""
    (tmp_path / "t.json").write_text(json.dumps(transcript("t")))
    base = ("eval", "--baseline", "none", "--model", "gpt-4o", "--quiet")
    assert run_cli(*base, "--json", "-", str(tmp_path / "t.json")) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["transcripts"] and "tokens sent" in err
    same = tmp_path / "same.out"
    assert run_cli(*base, "--json", str(same), "--html", str(same), str(tmp_path / "t.json")) == 2
    out, err = capsys.readouterr()
    assert "--json and --html both write to the same file" in err and out == ""
    assert not same.exists()


def test_an_anthropic_request_body_is_replayed_as_its_messages(tmp_path: Path) -> None:
    body = {
        "system": "You are a careful coding agent.",
        "messages": [
            {"role": "user", "content": "Fix the parser. " + words("an", 300)},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {"c": "ls"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a.py b.py"}]},
            {"role": "assistant", "content": "Listed."},
        ],
    }
    data = eval_json(tmp_path, {"anthropic": body}, "--pack", "builtin:default", "--model", "gpt-4o")  # type: ignore[dict-item]
    (row,) = [t for t in data["transcripts"] if t["plan"] == "builtin:default"]
    assert row["calls"] == 2 and row["errors"] == [] and row["invariant_violations"] == 0, row


def test_an_invalid_pack_or_step_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "t.json").write_text(json.dumps(transcript("p")))
    (tmp_path / "bad.yaml").write_text("apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: x}\n")
    assert run_cli("eval", "--pack", str(tmp_path / "bad.yaml"), "--model", "gpt-4o", str(tmp_path / "t.json")) == 2
    assert "bad.yaml" in capsys.readouterr().err
    for step in ("nan", "inf", "0", "-1"):
        assert run_cli("eval", "--baseline", "none", "--model", "gpt-4o", "--step-s", step, str(tmp_path)) == 2
        assert "--step-s" in capsys.readouterr().err


def test_a_step_that_runs_the_clock_past_the_year_9999_is_exit_2_before_the_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `--step-s 1e308` passed the check (finite) but the third call's clock was infinite:
    # prepare refused it, the replay stopped there and eval exited 1, "an invariant broke".
    (tmp_path / "t.json").write_text(json.dumps(transcript("p")))  # three calls
    args = ("eval", "--pack", "builtin:default", "--model", "gpt-4o", "--quiet", str(tmp_path / "t.json"))
    assert run_cli(*args, "--step-s", "1e308") == 2
    err = capsys.readouterr().err
    assert "--step-s 1e+308 puts the clock of call 3 past the year 9999" in err
    assert run_cli(*args, "--step-s", "86400") == 0  # a day between calls is a time


def test_transcript_text_in_the_table_prints_as_escapes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    msgs = transcript("e")
    msgs[2] = {**msgs[2], "tool_calls": [call("a1", "Bash\x1b[2J\x1b]0;pwned\x07", command="ls")]}
    (tmp_path / "t\u202e.json").write_text(json.dumps(msgs))
    assert run_cli("eval", "--baseline", "none", "--pack", "builtin:default", "--model", "gpt-4o", str(tmp_path)) == 0
    captured = capsys.readouterr()
    assert not any(c in captured.out + captured.err for c in "\x1b\x07\u202e")
    assert "\\u202e" in captured.out


# --- outputs people read -----------------------------------------------------------------------


def _cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO / "engine") + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("CI", None)
    return env


def test_the_progress_bar_shows_on_a_terminal_and_quiet_turns_it_off(tmp_path: Path) -> None:
    path = tmp_path / "theta.json"
    path.write_text(json.dumps(transcript("theta")))

    def stderr_on_a_pty(*extra: str, env: dict[str, str] | None = None) -> tuple[str, str]:
        master, slave = pty.openpty()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ctxrules.cli.main",
                "eval",
                "--baseline",
                "none",
                "--model",
                "gpt-4o",
                "--window",
                "128000",
                *extra,
                str(path),
            ],
            stdout=subprocess.PIPE,
            stderr=slave,
            env={**_cli_env(), **(env or {})},
        )
        os.close(slave)
        chunks = []
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        out, _ = proc.communicate(timeout=120)
        os.close(master)
        return out.decode(), b"".join(chunks).decode(errors="replace")

    out, err = stderr_on_a_pty()
    assert "[####" in err and "theta · none · turn 1/3" in err
    assert "[#" not in out and "baseline none" in out  # stdout carries the table only
    _, quiet = stderr_on_a_pty("--quiet")
    assert "[#" not in quiet
    # Redrawn in place: a carriage return before each state, not its escape "\x0d" (the bar
    # ran on along one line), and each state cut to the terminal's width less one (a longer
    # one wraps, and the carriage return goes back to its last row only).
    assert "\\x0d" not in err and "\r[" in err
    _, narrow = stderr_on_a_pty(env={"COLUMNS": "30"})
    states = [state for state in narrow.split("\r") if state]
    assert states and all(len(state) <= 29 for state in states), states
    assert any(state.startswith("[####") for state in states), states


def test_html_is_self_contained_and_renders_in_headless_chromium(tmp_path: Path) -> None:
    inputs = []
    for seed in ("iota", "kappa"):
        path = tmp_path / f"{seed}.json"
        path.write_text(json.dumps(transcript(seed)))
        inputs.append(str(path))
    page = tmp_path / "eval.html"
    assert (
        run_cli(
            "eval",
            "--pack",
            "builtin:default",
            "--baseline",
            "none",
            "--model",
            "gpt-4o",
            "--window",
            "128000",
            "--quiet",
            "--html",
            str(page),
            *inputs,
        )
        == 0
    )
    text = page.read_text()
    assert text.count("<svg") == 3 and "<script" not in text
    for needle in ("http://", "https://", "src=", "@import", "url("):
        assert needle not in text, needle
    pixels = screenshot_pixels(page, tmp_path, width=1200, height=1400, every=5)
    # The first two series colours of the charts are drawn.
    assert bytes.fromhex("2563eb") in pixels and bytes.fromhex("dc2626") in pixels


@pytest.mark.corpus
def test_two_real_transcripts_in_parallel_give_the_same_figures_as_one_process(tmp_path: Path) -> None:
    names = ["minisweagent-django__django-11815.json", "openhands-ponylang__ponyc-4595.json"]
    inputs = [str(TRANSCRIPTS / n) for n in names]
    outs = []
    for jobs in ("1", "2"):
        out = tmp_path / f"e{jobs}.json"
        assert (
            run_cli(
                "eval",
                "--pack",
                "builtin:default",
                "--baseline",
                "none",
                "--model",
                "gpt-4o",
                "--window",
                "32000",
                "--jobs",
                jobs,
                "--quiet",
                "--json",
                str(out),
                *inputs,
            )
            == 0
        )
        data = json.loads(out.read_text())
        outs.append([{k: v for k, v in c.items() if k != "ms"} for c in data["calls"]])
    assert outs[0] == outs[1]
    assert any(c["compacted"] for c in outs[0] if c["plan"] == "builtin:default")


def test_the_judge_answers_from_the_prepared_context_and_is_graded(tmp_path: Path) -> None:
    from llm_server import LLMServer, reply

    msgs = transcript("lambda")
    path = tmp_path / "lambda.json"
    path.write_text(json.dumps(msgs))
    answers = {
        "anchor": msgs[1]["content"],
        "latest_ask": "run the tests again",
        "edited_files": "src/lambda.py",
        "errors": "no errors that I can see",
        "commands": "pytest -q",
        "test_status": "1 failed, 3 passed",
    }
    out = tmp_path / "e.json"
    with LLMServer() as server:
        server.script(reply("Here you go: " + json.dumps(answers)))
        code = run_cli(
            "eval",
            "--baseline",
            "none",
            "--model",
            "gpt-4o",
            "--window",
            "128000",
            "--judge",
            "openai/test-model",
            "--judge-api-base",
            server.base_url,
            "--quiet",
            "--json",
            str(out),
            str(path),
        )
        requests = server.requests
    assert code == 0
    (request,) = requests[:1]
    sent = request.body["messages"]
    # The prepared context of the last call (litellm leaves out an assistant's null content).
    assert [(m["role"], m.get("content")) for m in sent[: len(msgs) - 1]] == [
        (m["role"], m.get("content")) for m in msgs[:-1]
    ]
    assert "test_status" in sent[-1]["content"]
    (total,) = json.loads(out.read_text())["totals"]
    judge = total["judge"]
    assert judge["anchor"] == {"passed": 1, "failed": 0}
    assert judge["edited_files"] == {"passed": 1, "failed": 0}
    assert judge["errors"] == {"passed": 0, "failed": 1}  # graded against the original line
    assert judge["test_status"] == {"passed": 1, "failed": 0}


def _eval_with_a_judge(tmp_path: Path, behaviour: Any, judge_timeout: str) -> tuple[dict[str, Any], float, int]:
    """``eval --judge`` of one small transcript against a judge endpoint that answers with
    ``behaviour``: (the JSON totals of the one plan, seconds taken, requests the judge got),
    after checking the run ended with exit 0 and no traceback."""
    from llm_server import LLMServer

    path = tmp_path / "lambda.json"
    path.write_text(json.dumps(transcript("lambda")))
    out = tmp_path / "e.json"
    with LLMServer() as server:
        server.script(behaviour)
        started = time.monotonic()
        proc = subprocess.run(
            [
                *EVAL_NONE,
                "--window",
                "128000",
                "--judge",
                "openai/test-model",
                "--judge-api-base",
                server.base_url,
                "--judge-timeout",
                judge_timeout,
                "--quiet",
                "--json",
                str(out),
                str(path),
            ],
            capture_output=True,
            text=True,
            timeout=180,
            env=_cli_env(),
        )
        took = time.monotonic() - started
        asked = len(server.requests)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    (total,) = json.loads(out.read_text())["totals"]
    assert total["judge"] is None and total["calls"] > 0
    return total, took, asked


def test_a_judge_that_never_finishes_its_answer_is_given_up_at_the_judge_timeout(tmp_path: Path) -> None:
    """A judge endpoint that sends a space every 0.2 s never lets a read time out: the replay
    waited on it for as long as the server liked (litellm's own timeout bounds each read).
    With ``--judge-timeout 1`` the judge call fails after about a second, the failure is
    reported, and the offline figures are there as without a judge (exit 0)."""
    from llm_server import raw

    total, took, asked = _eval_with_a_judge(tmp_path, raw(b" ", interval_s=0.2, repeat=True), "1")
    assert asked == 1
    assert any("the judge failed: TimeoutError: no complete answer within 1 s" in e for e in total["errors"])
    assert took < 30, took  # the server would trickle for a minute


def test_a_judge_reply_of_hundreds_of_mb_is_refused_at_the_byte_limit(tmp_path: Path) -> None:
    """A judge endpoint answering with a 300 MB body: read whole, litellm's failure path ran
    regular expressions over all of it in the abandoned call's thread, holding the interpreter,
    and the replay stalled for minutes past ``--judge-timeout`` (SIGTERM too). The body is
    refused past the byte limit; the failure is reported and the replay ends (exit 0)."""
    from llm_server import raw

    body = raw(*([b"x" * (1 << 20)] * 300), content_type="application/json")
    total, took, _ = _eval_with_a_judge(tmp_path, body, "60")
    assert any("the judge failed: ReplyRefused: the reply from 127.0.0.1 ran past 4 MiB" in e for e in total["errors"])
    assert took < 45, took


def test_a_failing_judge_call_is_reported_and_is_no_broken_invariant_of_the_pack(tmp_path: Path) -> None:
    """With a pack (not only a baseline), a judge call that failed counted as a broken
    invariant: "invariants broke on calls of: builtin:default" and exit 1, though the
    invariants column said 0. It is reported, and the exit code is the invariants' (0)."""
    from llm_server import LLMServer, http_error

    path = tmp_path / "lambda.json"
    path.write_text(json.dumps(transcript("lambda")))
    out = tmp_path / "e.json"
    argv = [*EVAL_NONE[:4], "--pack", "builtin:default", *EVAL_NONE[4:], "--window", "128000", "--quiet"]
    with LLMServer() as server:
        server.script(*[http_error(500, "judge down")] * 20)
        proc = subprocess.run(
            [*argv, "--judge", "openai/test-model", "--judge-api-base", server.base_url, "--json", str(out), str(path)],
            capture_output=True,
            text=True,
            timeout=300,
            env=_cli_env(),
        )
    assert proc.returncode == 0, proc.stderr
    assert "invariants broke" not in proc.stderr and "Traceback" not in proc.stderr
    totals = {t["plan"]: t for t in json.loads(out.read_text())["totals"]}
    pack = totals["builtin:default"]
    assert pack["invariant_violations"] == 0 and any("the judge failed" in e for e in pack["errors"]), pack["errors"]


@pytest.mark.parametrize("value", ["0", "-1", "inf", "nan"])
def test_a_judge_timeout_that_is_no_positive_number_is_a_usage_error(tmp_path: Path, value: str) -> None:
    path = tmp_path / "lambda.json"
    path.write_text(json.dumps(transcript("lambda")))
    proc = subprocess.run(
        [*EVAL_NONE, "--judge", "openai/x", "--judge-timeout", value, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=_cli_env(),
    )
    assert proc.returncode == 2
    assert "--judge-timeout must be a positive number of seconds" in proc.stderr


def test_the_trim_baseline_goes_through_litellms_trim_messages(tmp_path: Path) -> None:
    msgs = transcript("mu")
    counts = TokenCounter.for_model(lookup_model("gpt-4o")).count_each(msgs)
    window = 8192 + sum(counts[:2]) + 50
    totals = by_plan(
        eval_json(
            tmp_path,
            {"mu": msgs},
            "--baseline",
            "none",
            "--baseline",
            "trim",
            "--model",
            "gpt-4o",
            "--window",
            str(window),
        )
    )
    assert totals["none"]["overflows"] == 1  # the last call: the edit's long result
    # trim_messages keeps every request within the usable window.
    assert totals["trim"]["overflows"] == 0 and totals["trim"]["calls"] == 3


def test_a_judge_reply_nested_past_the_parsers_stack_is_no_answer() -> None:
    from ctxrules.eval.judge import parse_answers

    assert parse_answers('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}") == {}
    assert parse_answers('Here: {"a": "yes"}') == {"a": "yes"}


# --- hostile inputs and outputs -----------------------------------------------------------------

EVAL_NONE = (sys.executable, "-m", "ctxrules.cli.main", "eval", "--baseline", "none", "--model", "gpt-4o")


def test_a_file_name_that_is_not_utf8_is_shown_by_its_bytes(tmp_path: Path) -> None:
    """A name with a byte that is not UTF-8 (``x\\xff.json``, from an old Latin-1 archive) came
    through as a lone surrogate: the table showed ``\\udcff`` and ``--json``/``--html`` failed
    with an internal error (UnicodeEncodeError) after the whole replay."""
    name = os.fsdecode(b"x\xff.json")
    (tmp_path / name).write_text(json.dumps(transcript("n")))
    out, page = tmp_path / "e.json", tmp_path / "e.html"
    args = ("eval", "--baseline", "none", "--model", "gpt-4o", "--quiet", "--json", str(out), "--html", str(page))
    assert run_cli(*args, str(tmp_path / name)) == 0
    assert [r["transcript"] for r in json.loads(out.read_text(encoding="utf-8"))["transcripts"]] == ["x\\xff"]
    assert "x\\xff" in page.read_text(encoding="utf-8")


def test_two_file_names_that_read_the_same_keep_their_own_rows(tmp_path: Path) -> None:
    # `x\xff.json` (the byte 0xff) and `x\\xff.json` (a backslash, then "xff") both show as
    # `x\xff`: their stems differ, so neither got a path, and they shared one row (the table
    # printed one of them twice, the JSON dropped the other).
    short, long = transcript("s"), [*transcript("l"), {"role": "assistant", "content": "More."}]
    (tmp_path / os.fsdecode(b"x\xff.json")).write_text(json.dumps(short))
    (tmp_path / "x\\xff.json").write_text(json.dumps(long))
    data = eval_json(tmp_path, {}, "--baseline", "none", "--model", "gpt-4o", str(tmp_path))
    rows = {r["transcript"]: r["calls"] for r in data["transcripts"]}
    assert sorted(rows.values()) == [3, 4] and len(rows) == 2, rows
    assert set(rows) == {"x\\xff", "x\\xff (2)"}


def test_a_pipe_named_as_an_input_is_read(tmp_path: Path) -> None:
    """`ctxrules eval ... <(zcat t.json.gz)` names /dev/fd/N, a pipe: it was refused as "no such
    file or folder". A pipe or FIFO named on the command line is read as `run --input` reads
    one; a device is refused as not a regular file (a FIFO inside a folder is still skipped)."""
    read_end, write_end = os.pipe()
    proc = subprocess.Popen(
        [*EVAL_NONE, "--quiet", "--json", "-", f"/dev/fd/{read_end}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_cli_env(),
        pass_fds=(read_end,),
    )
    os.close(read_end)
    with os.fdopen(write_end, "w") as fh:
        fh.write(json.dumps(transcript("p")))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert json.loads(out)["totals"][0]["calls"] == 3
    assert run_cli("eval", "--baseline", "none", "--model", "gpt-4o", "--quiet", "/dev/null") == 2


def test_a_closed_stdout_is_a_usage_error_before_the_replay(tmp_path: Path) -> None:
    """`ctxrules eval ... >&-`: the table (or `--json -`) had nowhere to go, found after the
    whole replay. It is refused before a transcript is read (the lone surrogate's warning,
    given as a transcript is read, never comes)."""
    msgs = transcript("c")
    msgs[1] = {**msgs[1], "content": msgs[1]["content"] + " \ud800"}
    (tmp_path / "t.json").write_text(json.dumps(msgs))  # written as the escape \\ud800
    for extra in ((), ("--json", "-")):
        proc = subprocess.run(
            [*EVAL_NONE, "--quiet", *extra, str(tmp_path / "t.json")],
            stderr=subprocess.PIPE,
            text=True,
            env=_cli_env(),
            preexec_fn=lambda: os.close(1),
            timeout=120,
        )
        assert proc.returncode == 2, proc.stderr
        assert "standard output is closed" in proc.stderr and "internal error" not in proc.stderr
        assert "lone surrogate" not in proc.stderr, proc.stderr


def test_an_output_that_is_one_of_the_transcripts_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--json t.json t.json` (or `--html` onto a transcript in a folder given, or a link to
    one) wrote the results over the transcript it had just replayed."""
    folder = tmp_path / "runs"
    folder.mkdir()
    path = folder / "t.json"
    body = json.dumps(transcript("o"))
    path.write_text(body)
    (tmp_path / "link.json").symlink_to(path)
    os.link(path, tmp_path / "hard.json")
    base = ("eval", "--baseline", "none", "--model", "gpt-4o", "--quiet")
    for option, out, inputs in (
        ("--json", path, (path,)),
        ("--html", path, (folder,)),
        ("--json", tmp_path / "link.json", (folder,)),
        ("--json", tmp_path / "hard.json", (folder,)),
    ):
        assert run_cli(*base, option, str(out), *map(str, inputs)) == 2
        out_, err = capsys.readouterr()
        assert f"{option} {out} is a transcript this run reads" in err, err
        assert "calls replayed" not in out_ + err
        assert path.read_text() == body
    # An earlier result in the folder is not a transcript: it is skipped, and written again.
    assert run_cli(*base, "--json", str(folder / "e.json"), str(folder)) == 0
    assert run_cli(*base, "--json", str(folder / "e.json"), str(folder)) == 0
    assert json.loads((folder / "e.json").read_text())["transcripts"]


def test_bidi_controls_in_names_are_escapes_on_the_page(tmp_path: Path) -> None:
    """A transcript named ``t\\u202e.json`` put a raw override on the page, reversing the rest
    of its table cell and title: the page shows it as its escape, as the table does."""
    (tmp_path / "t\u202e.json").write_text(json.dumps(transcript("b")))
    page = tmp_path / "e.html"
    assert (
        run_cli("eval", "--baseline", "none", "--model", "gpt-4o", "--quiet", "--html", str(page), str(tmp_path)) == 0
    )
    text = page.read_text(encoding="utf-8")
    assert "t\\u202e" in text and "\u202e" not in text


def test_a_closed_stderr_keeps_the_exit_codes(tmp_path: Path) -> None:
    """`ctxrules eval ... 2>&-`: the progress bar's check of stderr (None) failed, and the
    message of that failure could not be written either, so Python exited 1 — eval's "an
    invariant broke" — for a clean run, and 1 for a usage error too. With standard error closed
    the messages go nowhere and the codes stay: 0, and 2 for an unknown model."""
    (tmp_path / "t.json").write_text(json.dumps(transcript("s")))
    for model, code in (("gpt-4o", 0), ("no-such-model-xyz", 2)):
        argv = [*EVAL_NONE[:-1], model, "--quiet", str(tmp_path / "t.json")]
        proc = subprocess.run(
            argv, stdout=subprocess.DEVNULL, env=_cli_env(), preexec_fn=lambda: os.close(2), timeout=120
        )
        assert proc.returncode == code, model


def test_a_folder_that_cannot_be_listed_is_exit_2_naming_it(tmp_path: Path) -> None:
    """A subfolder without read permission was skipped without a word (Path.rglob ignores the
    error): its transcripts were left out of every total. As for a file that cannot be read,
    it is exit 2 naming it. (As root, the capabilities that bypass permissions are dropped.)"""
    import shutil

    (tmp_path / "runs" / "locked").mkdir(parents=True)
    (tmp_path / "runs" / "a.json").write_text(json.dumps(transcript("a")))
    (tmp_path / "runs" / "locked" / "b.json").write_text(json.dumps(transcript("b")))
    prefix: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv to drop CAP_DAC_OVERRIDE")
        caps = "-dac_override,-dac_read_search"
        prefix = [setpriv, f"--bounding-set={caps}", f"--inh-caps={caps}"]
    (tmp_path / "runs" / "locked").chmod(0)
    try:
        proc = subprocess.run(
            [*prefix, *EVAL_NONE, "--quiet", str(tmp_path / "runs")],
            capture_output=True,
            text=True,
            env=_cli_env(),
            timeout=120,
        )
    finally:
        (tmp_path / "runs" / "locked").chmod(0o755)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{tmp_path / 'runs' / 'locked'}: cannot read: Permission denied" in proc.stderr, proc.stderr


def test_a_name_shown_as_escapes_keeps_the_table_aligned(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The columns were measured before a name's controls became escapes (``\\u202e`` is six
    characters for one): that row ran five columns past the others."""
    for name in ("plain", "t\u202e"):
        (tmp_path / f"{name}.json").write_text(json.dumps(transcript(name)))
    assert run_cli("eval", "--baseline", "none", "--model", "gpt-4o", "--quiet", str(tmp_path)) == 0
    lines = capsys.readouterr().out.splitlines()
    rule = next(i for i, line in enumerate(lines) if line.startswith("-----"))
    table = lines[rule - 1 : rule + 4]  # header, rule, two transcripts, total
    assert any("t\\u202e" in line for line in table)
    assert {len(line) for line in table} == {len(lines[rule])}, table


def test_jobs_beyond_the_cpus_or_the_pairs_start_no_more_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # `--jobs 1000` over a folder of a thousand transcripts started a thousand processes, each
    # importing ctxrules and a tokenizer: the machine's memory, not the user's intent.
    from ctxrules.eval import run as eval_run

    monkeypatch.setattr(eval_run.os, "cpu_count", lambda: 4)
    assert [eval_run.workers(j, n) for j, n in ((1000, 10), (3, 10), (8, 2), (1, 0))] == [4, 3, 2, 1]
    path = tmp_path / "one.json"
    path.write_text(json.dumps(transcript("one")))
    assert run_cli("eval", "--baseline", "none", "--model", "gpt-4o", "--jobs", "1000", "--quiet", str(path)) == 0
    assert "(1 job(s))" in capsys.readouterr().out


def test_replayed_sessions_are_kept_in_memory_where_the_machine_has_a_folder_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A replayed session is thrown away: fsyncing its vault items made a long replay wait on the
    # disk for most of its time (2,000 messages: 50 s, 30 of them waiting).
    import tempfile

    from ctxrules.eval import scratch

    used: list[str | None] = []
    real = tempfile.TemporaryDirectory

    def recording(*args: Any, **kwargs: Any) -> Any:
        used.append(kwargs.get("dir"))
        return real(*args, **kwargs)

    monkeypatch.setattr(scratch.tempfile, "TemporaryDirectory", recording)
    path = tmp_path / "one.json"
    path.write_text(json.dumps(transcript("one")))
    assert run_cli("eval", "--pack", "builtin:default", "--model", "gpt-4o", "--quiet", str(path)) == 0
    shm = Path("/dev/shm")
    expected = "/dev/shm" if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK) else None
    assert used and set(used) == {expected}


def test_the_block_chain_of_a_replay_gives_the_blocks_of_each_request() -> None:
    """Call after call, what :class:`BlockChain` reuses of the request before (the same message
    objects at the same places, the same counts and tools) and what it hashes anew add up to
    :func:`blocks_of` of the request alone: appended steps, a message replaced in the middle
    (a compaction), a breakpoint moved, a count changed, other tools, a shorter request."""
    import random

    rng = random.Random(7)
    tools_a = [{"type": "function", "function": {"name": "Bash", "parameters": {}}}]
    tools_b = [{"type": "function", "function": {"name": "Read", "parameters": {}}}]
    pool = [{"role": "user", "content": f"m{i}"} for i in range(40)]
    chain = BlockChain()
    messages: list[dict[str, Any]] = [pool[0]]
    counts = [5]
    tools: list[dict[str, Any]] = tools_a
    for _ in range(300):
        move = rng.randrange(7)
        if move < 3 or len(messages) < 3:  # a step appended
            messages = [*messages, rng.choice(pool)]
            counts = [*counts, rng.randrange(1, 50)]
        elif move == 3:  # a message replaced (the same position, another object)
            i = rng.randrange(len(messages))
            messages = [*messages[:i], {"role": "user", "content": f"new {rng.random()}"}, *messages[i + 1 :]]
        elif move == 4:  # a breakpoint on the last message, or moved on
            last = dict(messages[-1])
            last["content"] = [{"type": "text", "text": str(last["content"]), "cache_control": {"type": "ephemeral"}}]
            messages = [*messages[:-1], last]
        elif move == 5:  # a count changed, or the request shorter
            counts = list(counts)
            counts[rng.randrange(len(counts))] += 1
            if rng.random() < 0.3:
                cut = rng.randrange(1, len(messages))
                messages, counts = messages[:cut], counts[:cut]
        else:  # other tools (or none), same or a new list object
            tools = rng.choice([tools_a, tools_b, [], list(tools_a)])
        tool_tokens = 7 if tools else 0
        assert chain.blocks(messages, counts, tools, tool_tokens) == blocks_of(messages, counts, tools, tool_tokens)


def test_a_message_replaced_in_the_middle_serialises_that_message_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """A compaction that replaced one early message made every message after it serialised
    again on each call: a long replay serialised N²/2 messages (20 s for 2,000 messages)."""
    from ctxrules.eval import caching

    stripped: list[Any] = []
    real = caching._strip

    def counting(value: Any) -> tuple[Any, bool]:
        stripped.append(value)
        return real(value)

    monkeypatch.setattr(caching, "_strip", counting)
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"m{i}"} for i in range(200)]
    chain = BlockChain()
    chain.blocks(messages, [3] * 200)
    new = {"role": "user", "content": "summary"}
    edited = [*messages[:5], new, *messages[6:]]
    stripped.clear()
    blocks = chain.blocks(edited, [3] * 200)
    assert [m for m in stripped if isinstance(m, dict) and "role" in m] == [new]
    assert blocks == blocks_of(edited, [3] * 200)


def test_the_block_chain_goes_on_after_a_call_that_failed_part_way() -> None:
    chain = BlockChain()
    a, b = {"role": "user", "content": "a"}, {"role": "user", "content": "b"}
    chain.blocks([a], [1])
    with pytest.raises(TypeError):
        chain.blocks([a, b, {"role": "user", "content": {1, 2}}], [1, 1, 1])  # not JSON
    assert chain.blocks([a, b], [1, 1]) == blocks_of([a, b], [1, 1])


def test_context_texts_of_a_replay_read_each_message_object_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from ctxrules.eval import probes

    call = {"id": "c", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "pytest -x"}'}}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "fix it"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "content": "1 failed"},
    ]
    texts = probes.ContextTexts()
    assert texts(messages) == probes.context_text(messages)
    grown = [messages[0], {"role": "assistant", "content": "a summary"}, *messages[1:], {"role": "user", "content": ""}]
    read: list[Any] = []
    real = probes._message_part
    monkeypatch.setattr(probes, "_message_part", lambda m: read.append(m) or real(m))
    assert texts(grown) == probes.context_text(grown)
    # context_text reads through the counting stand-in too: the ContextTexts call read only
    # the two new messages, context_text all five.
    assert read[:2] == [grown[1], grown[4]] and len(read) == 2 + len(grown)


@pytest.mark.corpus
def test_two_replays_of_a_compacted_transcript_give_the_same_figures(tmp_path: Path) -> None:
    # Each replay signed its injected tags (summaries, placeholders) with a new random key, and
    # a signature's 16 hex digits tokenize to a count that varies with the key: the prompt
    # tokens and USD of the same transcript and pack differed by a few tokens from run to run.
    path = transcript_path("claudecode-ae4a77f8.json")
    runs = []
    for n in range(2):
        out = tmp_path / f"e{n}.json"
        argv = ["eval", "--pack", "builtin:default", "--model", "gpt-4o", "--window", "32000"]
        assert run_cli(*argv, "--quiet", "--json", str(out), str(path)) == 0
        runs.append([{k: v for k, v in c.items() if k != "ms"} for c in json.loads(out.read_text())["calls"]])
    assert runs[0] == runs[1]
    assert any(c["compacted"] for c in runs[0])


@pytest.mark.parametrize("where", ["missing/eval.json", "."])
def test_an_output_that_cannot_be_written_is_refused_before_the_replay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    # A folder that does not exist (or a folder given as the file) failed only once the whole
    # replay was done: minutes of a long transcript lost to a typo. The transcript here is
    # damaged too: the output is refused before any transcript is read.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken.json").write_text("[{")
    assert run_cli("eval", "--baseline", "none", "--model", "gpt-4o", "--json", where, "broken.json") == 2
    err = capsys.readouterr().err
    assert f"--json {where}: cannot write" in err and "broken.json" not in err, err
    assert not (tmp_path / "missing").exists()


def test_a_worker_killed_mid_run_is_one_clear_error_not_a_crash() -> None:
    # A worker the out-of-memory killer (or a SIGKILL) ended broke the pool: the verb ended in
    # "internal error: BrokenProcessPool ... this is a bug in ctxrules", exit 2 by accident.
    import multiprocessing
    import signal

    from ctxrules.errors import CtxrulesError
    from ctxrules.eval.replay import Plan, Task
    from ctxrules.eval.run import run_tasks

    long = transcript("long")
    for n in range(60):  # enough calls that the workers are still replaying at the first event
        long += [{"role": "user", "content": f"step {n}"}, {"role": "assistant", "content": f"ok {n}"}]
    plan = Plan("builtin:default", "pack", "builtin:default")
    tasks = [Task(f"t{i}", f"t{i}.json", tuple(long), (), plan, "gpt-4o", 32000) for i in range(2)]
    killed: list[int] = []

    def kill_the_workers(*_event: object) -> None:
        if not killed:
            for child in multiprocessing.active_children():
                killed.append(child.pid or 0)
                os.kill(child.pid or 0, signal.SIGKILL)

    with pytest.raises(CtxrulesError, match="worker process ended without its result"):
        run_tasks(tasks, jobs=2, progress=kill_the_workers)
    assert killed


def test_a_pack_that_stops_loading_during_the_run_is_exit_2_not_a_broken_invariant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Each replay loads its pack again; a pack edited into an invalid one after eval checked it
    # ended the run with exit 1, eval's code for "an invariant broke".
    from ctxrules.cli import eval as eval_cli

    (tmp_path / "t.json").write_text(json.dumps(transcript("p")))
    pack = tmp_path / "p.yaml"
    pack.write_text((REPO / "docs/examples/late-compaction.yaml").read_text())
    real_run_tasks = eval_cli.run_tasks

    def edited_meanwhile(*args: Any, **kwargs: Any) -> Any:
        pack.write_text("kind: [broken\n")
        return real_run_tasks(*args, **kwargs)

    monkeypatch.setattr(eval_cli, "run_tasks", edited_meanwhile)
    assert run_cli("eval", "--pack", str(pack), "--model", "gpt-4o", "--quiet", str(tmp_path / "t.json")) == 2
    err = capsys.readouterr().err
    assert "a pack no longer loads" in err and "p.yaml" in err and "Traceback" not in err


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _running(pids: list[int]) -> list[int]:
    """The processes of ``pids`` still running (an ended one nobody reaped yet is a zombie)."""
    running = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            running.append(pid)
    return running


_EVAL_CMD = [sys.executable, "-m", "ctxrules.cli.main", "eval", "--pack", "builtin:default", "--model", "gpt-4o"]


def _long_transcripts(folder: Path, steps: int, marker: str | None = None) -> Path:
    """Two transcripts of ``steps`` exchanges each in ``folder`` (made), the first user message
    starting with ``marker`` (found again in the replays' session folders)."""
    long = transcript("k" if marker is None else "s")
    if marker is not None:
        long[1] = {"role": "user", "content": f"{marker} " + str(long[1]["content"])}
    for n in range(steps):
        long += [{"role": "user", "content": f"step {n}"}, {"role": "assistant", "content": f"ok {n}"}]
    folder.mkdir(exist_ok=True)
    for name in ("a", "b"):
        (folder / f"{name}.json").write_text(json.dumps(long))
    return folder


def _start_eval(folder: Path, **pipes: Any) -> subprocess.Popen[str]:
    """``ctxrules eval --jobs 2`` over ``folder``, started."""
    return subprocess.Popen([*_EVAL_CMD, "--jobs", "2", "--quiet", str(folder)], env=_cli_env(), text=True, **pipes)


def _eval_workers(pid: int) -> list[int]:
    """The replay workers eval ``pid`` started (multiprocessing's spawned children)."""
    return [p for p in _children(pid) if "spawn_main" in Path(f"/proc/{p}/cmdline").read_text()]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_the_workers_end_when_eval_is_killed(tmp_path: Path) -> None:
    # `timeout 60 ctxrules eval --jobs 2`: SIGTERM ended eval outright, and its workers waited
    # for tasks forever, holding its stderr open (a pipe reading it never saw its end).
    import signal
    import time

    _long_transcripts(tmp_path, 1500)  # tens of seconds of replay per pair
    proc = _start_eval(tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 30
        while len(workers) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
            workers = _eval_workers(proc.pid)
        assert len(workers) == 2, "the workers did not start"
        time.sleep(3)  # into the replay (a worker still starting when eval died stayed too)
        proc.send_signal(signal.SIGTERM)
        # eval gives its workers 10 s to unwind before it kills them (eval.run._STOP_GRACE_S): a
        # loaded CI machine used that grace, and a wait of 10 s here timed out. The old code's
        # workers never ended at all.
        proc.wait(timeout=40)
        deadline = time.monotonic() + 10
        while _running(workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _running(workers), "workers outlived eval"
    finally:
        for p in [proc.pid, *workers]:
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
        proc.wait()


def _folders_holding(scratch: Path, marker: str) -> list[Path]:
    """The replay session folders in ``scratch`` whose files hold ``marker``."""
    found = []
    for folder in scratch.glob("ctxrules-eval-*"):
        for item in folder.rglob("*"):
            with contextlib.suppress(OSError):
                if item.is_file() and marker.encode() in item.read_bytes():
                    found.append(folder)
                    break
    return found


def _wait_for_replays(proc: subprocess.Popen[str], scratch: Path, marker: str) -> list[Path]:
    """The session folders of eval ``proc``'s two replays, once both are under way."""
    deadline = time.monotonic() + 60
    while len(_folders_holding(scratch, marker)) < 2 and time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.2)
    left = _folders_holding(scratch, marker)
    assert len(left) == 2, "the replays did not start"
    return left


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_sigterm_stops_the_workers_and_is_exit_143_in_one_line(tmp_path: Path) -> None:
    # SIGTERM ended eval by the signal (-15) with multiprocessing's "leaked semaphore" warning,
    # and its workers, ended by os._exit, left their replay's session folder in /dev/shm
    # (memory until the next boot). Ctrl-C waited for the replays under way to finish.
    import signal
    import tempfile

    from ctxrules.eval.scratch import scratch_dir

    scratch = Path(scratch_dir() or tempfile.gettempdir())
    marker = f"marker-{os.getpid()}-{tmp_path.name}"
    _long_transcripts(tmp_path, 8000, marker)  # a minute of replay per pair
    proc = _start_eval(tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    workers: list[int] = []
    try:
        _wait_for_replays(proc, scratch, marker)
        workers = _eval_workers(proc.pid)
        stopped = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert time.monotonic() - stopped < 10  # not the replays' minute
        assert proc.returncode == 143, err
        assert err == "ctxrules: eval stopped by a signal before the replay ended: nothing was written\n"
        assert out == ""
        assert not _running(workers)
        assert _folders_holding(scratch, marker) == []
    finally:
        for p in [proc.pid, *workers]:
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
        proc.wait()
        for folder in _folders_holding(scratch, marker):  # the old code's leftovers
            shutil.rmtree(folder, ignore_errors=True)


def test_the_folder_of_a_killed_worker_goes_with_the_next_run_and_a_live_one_stays(tmp_path: Path) -> None:
    """A worker killed outright (SIGKILL) cannot remove its replay folder (in /dev/shm: memory
    until the next boot); the next eval removes it, and never the folder of a replay under way
    (here: one held by a process of the test's own) nor one of another name."""
    import signal
    import tempfile

    from ctxrules.eval.scratch import scratch_dir

    scratch = Path(scratch_dir() or tempfile.gettempdir())
    marker = f"marker-{os.getpid()}-{tmp_path.name}"
    long = _long_transcripts(tmp_path / "long", 8000, marker)  # a minute of replay per pair
    holder = subprocess.Popen(  # a live replay's folder, held as eval holds one
        [sys.executable, "-c", "from ctxrules.eval.scratch import session_folder\nimport sys\n"
         "with session_folder() as f:\n    print(f, flush=True)\n    sys.stdin.read()"],
        env=_cli_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    live = Path(holder.stdout.readline().strip()) if holder.stdout else Path()
    other = scratch / f"ctxrules-evaluation-{os.getpid()}"  # not eval's name: never touched
    other.mkdir()
    proc = _start_eval(long, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    workers: list[int] = []
    try:
        left = _wait_for_replays(proc, scratch, marker)
        workers = _eval_workers(proc.pid)
        for p in [proc.pid, *workers]:  # the whole run killed outright: nothing unwinds
            os.kill(p, signal.SIGKILL)
        proc.communicate(timeout=30)
        deadline = time.monotonic() + 30
        while _running(workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sorted(_folders_holding(scratch, marker)) == sorted(left)  # what was left behind
        (tmp_path / "short").mkdir()
        (tmp_path / "short" / "c.json").write_text(json.dumps(transcript("c")))
        nxt = subprocess.run([*_EVAL_CMD, "--quiet", str(tmp_path / "short")], env=_cli_env(),
                             capture_output=True, text=True, timeout=300)  # fmt: skip
        assert nxt.returncode == 0, nxt.stderr
        assert _folders_holding(scratch, marker) == []
        assert live.is_dir() and other.is_dir()
    finally:
        for p in [proc.pid, *workers]:
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
        proc.communicate(timeout=30)
        holder.communicate("", timeout=30)
        other.rmdir()
        for folder in _folders_holding(scratch, marker):  # the old code's leftovers
            shutil.rmtree(folder, ignore_errors=True)
    assert not live.exists()  # the holder removed its own when it ended
