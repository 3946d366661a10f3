"""``ctxrules usage add|show|reset``: round trip through the ledgers, failed calls, budgets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ctxrules.budget.pricing import price_call, rates_for
from ctxrules.budget.usage import TokenUsage


def show(cli, *args: str) -> dict:  # type: ignore[no-untyped-def]
    code, out, err = cli("usage", "show", "--format", "json", *args)
    assert code == 0, err
    return json.loads(out)


def test_add_and_show_round_trip(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    state = str(tmp_path / "st")
    code, out, err = cli(
        "usage",
        "add",
        "--state",
        state,
        "--model",
        "gpt-4o",
        "--prompt",
        "1200",
        "--completion",
        "300",
        "--cached",
        "1000",
        "--reasoning",
        "100",
        "--json",
    )
    assert code == 0, err
    rec = json.loads(out)
    u = TokenUsage.of(prompt=1200, completion=300, cached=1000, reasoning=100)
    cost = price_call(u, rates_for("gpt-4o"))
    assert cost is not None and rec["usd"]["total"] == pytest.approx(cost.total)
    resp = tmp_path / "resp.json"
    resp.write_text(
        json.dumps(
            {
                "id": "msg_1",
                "usage": {
                    "input_tokens": 20,
                    "output_tokens": 80,
                    "cache_read_input_tokens": 3000,
                    "cache_creation_input_tokens": 500,
                },
            }
        )
    )
    code, out, err = cli("usage", "add", "--state", state, "--model", "claude-sonnet-4-5", "--response", str(resp))
    assert code == 0, err
    assert "3520 prompt (3000 cached, 500 written)" in out
    data = show(cli, "--state", state)
    s = data["session"]
    assert s["calls"] == 2
    assert s["tokens"] == {
        "prompt": 4720,
        "completion": 380,
        "cached": 4000,
        "cache_write": 500,
        "reasoning": 100,
        "citation": 0,
        "total": 5100,
    }
    claude = price_call(
        TokenUsage.of(prompt=3520, completion=80, cached=3000, cache_write=500),
        rates_for("claude-sonnet-4-5"),
    )
    assert claude is not None
    assert s["usd"] == pytest.approx(cost.total + claude.total)
    assert set(s["by_model"]) == {"gpt-4o", "claude-sonnet-4-5"}
    assert data["day"]["calls"] == 2  # the same calls in today's day ledger
    code, out, _ = cli("usage", "show", "--state", state)
    assert code == 0 and "session default: 2 calls" in out and "cached 4,000" in out


def test_failed_calls_record_no_usage(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    state = str(tmp_path / "st")
    code, out, _ = cli("usage", "add", "--state", state, "--model", "gpt-4o", "--prompt", "900", "--failed")
    assert code == 0 and "not recorded" in out
    err_body = tmp_path / "err.json"
    err_body.write_text(json.dumps({"error": {"message": "Overloaded", "type": "overloaded_error"}}))
    code, out, _ = cli("usage", "add", "--state", state, "--model", "gpt-4o", "--response", str(err_body))
    assert code == 0 and "not recorded" in out
    # A gateway's error body may carry a null usage: still a failed call, not "no token counts".
    err_body.write_text(json.dumps({"error": {"message": "Overloaded"}, "usage": None, "usageMetadata": None}))
    code, out, err = cli("usage", "add", "--state", state, "--model", "gpt-4o", "--response", str(err_body))
    assert code == 0 and "not recorded" in out, err
    assert show(cli, "--state", state)["session"]["calls"] == 0
    assert not (tmp_path / "st" / "default" / "ledger.jsonl").exists()


def test_bad_input_is_one_line_exit_2(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    state = str(tmp_path / "st")
    for argv, needle in [
        (["--prompt", "5", "--cached", "9"], "exceed the prompt"),
        ([], "nothing to record"),
        (["--response", str(tmp_path / "missing.json")], "no such file"),
        (["--prompt", "5", "--response", "-"], "not both"),
        (["--prompt", "5", "--goal", "../x"], "goal name"),
    ]:
        code, _, err = cli("usage", "add", "--state", state, "--model", "gpt-4o", *argv)
        assert code == 2 and needle in err and "Traceback" not in err, (argv, err)
    code, _, err = cli("usage", "add", "--state", state, "--model", "gpt-4o", "--prompt", "-4")
    assert code == 2 and "expected a number >= 0" in err


_NO_USAGE = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "model": "gpt-4o",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
}


@pytest.mark.parametrize(
    ("body", "shape"),
    [
        (_NO_USAGE, "openai"),  # a stream read back without include_usage
        ({"type": "message", "role": "assistant", "content": []}, "anthropic"),
        ({"foo": 1}, "gemini"),
        ({"output": 5}, "responses"),
        ({}, "ctxrules"),
        ({"usage": {"prompt_tokens": 10, "completion_tokens": 3}}, "anthropic"),  # another shape's counts
    ],
)
def test_a_named_shape_without_its_counts_records_nothing(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path, body: dict[str, object], shape: str
) -> None:
    """`--shape auto` refused these; naming the shape recorded a call of zero tokens, exit 0:
    spend under-counted, a budget that never trips."""
    response = tmp_path / "r.json"
    response.write_text(json.dumps(body))
    state = tmp_path / "st"
    code, _, err = cli("usage", "add", "--state", str(state), "--session", str(state / "s"), "--model", "gpt-4o",
                       "--response", str(response), "--shape", shape)  # fmt: skip
    assert code == 2 and f"no token counts of the {shape} shape found" in err, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not [f for f in state.rglob("*.jsonl") if f.stat().st_size], "a call was recorded"


@pytest.mark.parametrize("choices", ["1", "1.5", "true", '{"a": 1}'])
def test_choices_that_are_no_list_are_said_in_one_line(cli, tmp_path: Path, choices: str) -> None:  # type: ignore[no-untyped-def]
    """`{"choices": 1}` was "internal error: TypeError"."""
    response = tmp_path / "r.json"
    response.write_text(f'{{"choices": {choices}}}')
    code, _, err = cli(
        "usage", "add", "--state", str(tmp_path / "st"), "--model", "gpt-4o", "--response", str(response)
    )
    assert code == 2 and "no token counts found" in err and "internal error" not in err, err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["add", "--prompt", "1", "--at", "1e20"], "up to the year 9999"),
        (["add", "--prompt", "1", "--at", "99999999999999999"], "up to the year 9999"),
        (["add", "--prompt", "1", "--at", "nan"], "up to the year 9999"),
        (["add", "--prompt", "1", "--at", "-1"], "since 1970"),
        (["add", "--prompt", "1", "--at", "soon"], "since 1970"),
        (["add", "--prompt", "1" + "0" * 20], "more than one call can have"),
        (["add", "--prompt", "1" + "0" * 5000], "expected a whole number"),
        (["add", "--response", "RESP"], "more than one call can have"),
        (["show", "--days", "99999999"], "at most 3660 days"),
        (["report", "--days", "99999999"], "at most 3660 days"),
        (["report", "--until", "0001-01-01"], "outside the years 1 to 9999"),
        (["report", "--until", "9999-12-31"], "outside the years 1 to 9999"),
    ],
)
def test_times_and_counts_outside_the_calendar_are_refused(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path, argv: list[str], needle: str
) -> None:
    state = tmp_path / "st"
    code, _, err = cli("usage", "add", "--state", str(state), "--model", "gpt-4o", "--prompt", "1")
    assert code == 0, err
    before = sorted((p, p.read_bytes()) for p in state.rglob("*.jsonl"))
    resp = tmp_path / "resp.json"
    resp.write_text('{"prompt_tokens": 1e300, "completion_tokens": 1}')
    argv = [str(resp) if a == "RESP" else a for a in argv]
    extra = ["--model", "gpt-4o"] if argv[0] == "add" else []
    code, _, err = cli("usage", argv[0], "--state", str(state), *extra, *argv[1:])
    assert code == 2 and needle in err, err
    assert "internal error" not in err and "Traceback" not in err and len(err) < 2000
    assert sorted((p, p.read_bytes()) for p in state.rglob("*.jsonl")) == before  # nothing recorded


@pytest.mark.parametrize("price", ["1.0e+300", "1.0e+299"])
def test_a_cost_no_call_can_have_is_refused_and_sums_stay_finite(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path, price: str
) -> None:
    # 1e300 USD per million: one call's cost is inf; 1e299: each call is finite, their sum not.
    pack = tmp_path / "pack.yaml"
    pack.write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: b, version: 1.0.0}\n"
        f'budgets:\n  session: {{usd: 5}}\n  prices: {{"acme-*": {{input: {price}, output: 1}}}}\n'
    )
    state = tmp_path / "st"
    add = ("usage", "add", "--state", str(state), "--pack", str(pack), "--model", "acme-x", "--prompt", "9" + "0" * 14)
    for _ in range(2):
        code, _, err = cli(*add)
        assert code == 2 and "more than one call can cost" in err, err
        assert "internal error" not in err and "Traceback" not in err
    assert not list(state.rglob("*.jsonl"))  # nothing recorded
    data = show(cli, "--state", str(state), "--pack", str(pack))  # strict JSON: no Infinity
    assert data["session"]["usd"] == 0 and data["budget"]["level"] == "ok"


def test_show_with_a_pack_reports_levels_and_reset_clears_them(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pack = tmp_path / "pack.yaml"
    pack.write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: b, version: 1.0.0}\n"
        "budgets:\n  session: {tokens: 1000}\n  goal: {tokens: 5000}\n"
    )
    session = str(tmp_path / "st" / "run-1")
    for _ in range(3):
        assert (
            cli(
                "usage",
                "add",
                "--session",
                session,
                "--goal",
                "g",
                "--model",
                "gpt-4o",
                "--prompt",
                "300",
            )[0]
            == 0
        )
    data = show(cli, "--session", session, "--goal", "g", "--pack", str(pack))
    b = data["budget"]
    assert b["level"] == "warning" and b["eco"] is True
    assert {(d["dimension"], d["level"]) for d in b["dimensions"]} == {
        ("session", "warning"),
        ("goal", "ok"),
    }
    assert data["goal"]["tokens"]["prompt"] == 900
    code, out, _ = cli("usage", "reset", "--session", session, "--dimension", "session")
    assert code == 0 and "reset the session budget" in out
    after = show(cli, "--session", session, "--goal", "g", "--pack", str(pack))
    assert after["budget"]["level"] == "ok" and after["session"]["calls"] == 0
    assert after["goal"]["calls"] == 3  # other dimensions keep counting
    code, _, err = cli("usage", "reset", "--session", session, "--dimension", "goal")
    assert code == 2 and "needs a goal" in err


def test_names_from_ledgers_and_reports_print_as_escapes(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A model name (or any recorded string) holding terminal escapes or a bidi override is
    shown as its escapes by `usage show`, `usage report` and `ctxrules report`: the ledger and
    the report are data, and printing them must not act on the terminal."""
    state = str(tmp_path / "st")
    model = "gpt-4o\x1b]0;owned\x07\x1b[2J\u202e"
    code, _, err = cli("usage", "add", "--state", state, "--model", model, "--prompt", "10")
    assert code == 2 and "no model name has" in err  # not a model name: refused on the way in
    code, _, err = cli("usage", "add", "--state", state, "--model", "gpt-4o", "--prompt", "10")
    assert code == 0, err
    # A ledger written by another tool (or by hand) may hold it all the same.
    for ledger in (tmp_path / "st").rglob("*.jsonl"):
        ledger.write_text(ledger.read_text().replace('"gpt-4o"', json.dumps(model)))
    code, shown, err = cli("usage", "show", "--state", state)
    assert code == 0, err
    code, summary, err = cli("usage", "report", "--state", state, "--days", "2")
    assert code == 0, err
    assert "\\x1b]0;owned\\x07\\x1b[2J\\u202e" in summary
    report = tmp_path / "report.json"
    chat = tmp_path / "in.json"
    chat.write_text(json.dumps([{"role": "user", "content": "hi"}]))
    code, _, err = cli(
        "run", "--pack", "builtin:default", "--model", "gpt-4o", "--input", str(chat), "--report", str(report),
        "--output", str(tmp_path / "out.json"), "--state", state,
    )  # fmt: skip
    assert code == 0, err
    data = json.loads(report.read_text())
    data["warnings"] = [*data.get("warnings", []), "stage \x1b[31mred\x1b[0m said \u202eevil"]
    report.write_text(json.dumps(data))
    code, table, err = cli("report", str(report))
    assert code == 0, err
    for out in (shown, summary, table):
        assert not any(c in out for c in "\x1b\x07\u202e"), out


def _records(path: Path) -> list[dict]:  # type: ignore[type-arg]
    """The call records of a ledger file (none when it is not there)."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _ledgers(state: Path, session: Path) -> dict[str, int]:
    """How many records the session, day and goal ledgers hold."""
    return {
        "session": len(_records(session / "ledger.jsonl")),
        "day": sum(len(_records(p)) for p in (state / "ledger" / "days").glob("*.jsonl"))
        if (state / "ledger" / "days").is_dir()
        else 0,
        "goal": len(_records(state / "ledger" / "goals" / "g.jsonl")) if (state / "ledger" / "goals").is_dir() else 0,
    }


@pytest.mark.parametrize("blocked", ["days", "goals"])
def test_add_lands_in_every_ledger_or_in_none_and_a_retry_counts_once(tmp_path: Path, blocked: str) -> None:
    """The day (or goal) ledger's folder cannot be made (a file where it belongs): the call is
    recorded nowhere, the session ledger included, and says so; once the folder can be made,
    the retry the user runs counts the call once in each ledger (not twice in the session's)."""
    from cli_kit import cli

    state, session = tmp_path / "st", tmp_path / "st" / "s1"
    (state / "ledger").mkdir(parents=True)
    (state / "ledger" / blocked).write_text("not a folder\n")
    add = ("usage", "add", "--session", str(session), "--goal", "g", "--model", "gpt-4o", "--prompt", "100")
    proc = cli(*add)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and f"ledger/{blocked}" in proc.stderr
    assert _ledgers(state, session) == {"session": 0, "day": 0, "goal": 0}
    (state / "ledger" / blocked).unlink()
    proc = cli(*add, "--json")
    assert proc.returncode == 0, proc.stderr
    assert _ledgers(state, session) == {"session": 1, "day": 1, "goal": 1}
    shown = json.loads(cli("usage", "show", "--session", str(session), "--goal", "g", "--format", "json").stdout)
    assert (shown["session"]["calls"], shown["day"]["calls"], shown["goal"]["calls"]) == (1, 1, 1)


def test_a_write_that_fails_part_way_is_taken_back_out_of_the_ledgers_it_reached(tmp_path: Path) -> None:
    """The session ledger cannot grow (a file size limit, as a full disk refuses the write)
    after the day and goal ledgers took the line: the line is cut back out of them, and the
    command fails with nothing recorded."""
    resource = pytest.importorskip("resource")
    import signal

    from cli_kit import cli

    state, session = tmp_path / "st", tmp_path / "st" / "s1"
    session.mkdir(parents=True)
    # Blank lines (readers skip them) past the limit: the session ledger's append must fail.
    (session / "ledger.jsonl").write_bytes(b"\n" * 8192)
    before = {"session": (session / "ledger.jsonl").read_bytes()}

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit is EFBIG, not a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    add = ("usage", "add", "--session", str(session), "--goal", "g", "--model", "gpt-4o", "--prompt", "100")
    proc = cli(*add, preexec_fn=limited)
    assert proc.returncode == 2, proc.stderr
    assert "nothing was recorded" in proc.stderr and "Traceback" not in proc.stderr
    assert (session / "ledger.jsonl").read_bytes() == before["session"]
    # The day and goal ledgers were made and written to before the session's failed: empty again.
    day_files = list((state / "ledger" / "days").glob("*.jsonl"))
    assert day_files and all(p.read_bytes() == b"" for p in day_files)
    assert (state / "ledger" / "goals" / "g.jsonl").read_bytes() == b""
    proc = cli(*add)
    assert proc.returncode == 0, proc.stderr
    assert _ledgers(state, session) == {"session": 1, "day": 1, "goal": 1}


def test_record_usage_in_python_is_all_or_nothing_too(tmp_path: Path) -> None:
    """``Session.record_usage`` (the same ledgers): an error, and no record anywhere."""
    from ctxrules.engine import Engine
    from ctxrules.errors import CtxrulesError

    state, session_dir = tmp_path / "st", tmp_path / "st" / "s1"
    (state / "ledger").mkdir(parents=True)
    (state / "ledger" / "days").write_text("not a folder\n")
    session = Engine.load("builtin:default").session(str(session_dir), model="gpt-4o")
    with pytest.raises(CtxrulesError, match="ledger/days"):
        session.record_usage({"prompt_tokens": 900, "completion_tokens": 200})
    assert _ledgers(state, session_dir)["session"] == 0
    assert session.ledger.status().totals.calls == 0
    (state / "ledger" / "days").unlink()
    session.record_usage({"prompt_tokens": 900, "completion_tokens": 200})
    assert session.ledger.status().totals.calls == 1 and _ledgers(state, session_dir)["day"] == 1


def test_show_refuses_a_session_below_a_file(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # `--session afile/s` printed "session s: 0 calls" and exit 0: nothing can be recorded there.
    (tmp_path / "afile").write_text("x")
    below = str(tmp_path / "afile" / "s")
    code, out, err = cli("usage", "show", "--session", below, "--state", str(tmp_path / "st"))
    assert (code, out, err) == (2, "", f"ctxrules: error: {below}: Not a directory\n")


def test_show_says_when_the_session_holds_nothing_yet(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # A typo (`--session .ctxrules/run-24`) showed zero totals without a word. They are still
    # shown (the day's and the goal's totals are real, and a session's first call may be gated
    # on them), with a note that names the session.
    state = str(tmp_path / "st")
    assert (
        cli("usage", "add", "--state", state, "--model", "gpt-4o", "--prompt", "10", "--session", f"{state}/a")[0] == 0
    )
    (tmp_path / "plain").mkdir()
    for name in (f"{state}/typo", str(tmp_path / "no" / "such"), str(tmp_path / "plain")):
        code, out, err = cli("usage", "show", "--format", "json", "--state", state, "--session", name)
        assert code == 0, err
        assert err == (
            f"ctxrules: note: --session {name}: no session there yet, nothing was recorded for it "
            "(a session begins with its first `ctxrules run` or `usage add`)\n"
        )
        data = json.loads(out)
        assert (data["session"]["calls"], data["day"]["calls"]) == (0, 1)
    code, out, err = cli("usage", "show", "--format", "json", "--state", state, "--session", f"{state}/a")
    assert (code, err, json.loads(out)["session"]["calls"]) == (0, "", 1)
    assert cli("usage", "show", "--state", state)[2] == ""  # the default session: no --session named


@pytest.mark.parametrize(
    "verb",
    [
        ["usage", "show"],
        ["usage", "add", "--model", "gpt-4o", "--prompt", "1"],
        ["usage", "reset", "--dimension", "session"],
        ["vault", "get", "0123456789ab"],
    ],
    ids=lambda v: " ".join(v[:2]),
)
def test_the_state_root_is_not_a_session(cli, tmp_path: Path, verb: list[str]) -> None:  # type: ignore[no-untyped-def]
    # `--session st --state st` wrote the session's ledger among the state root's own files,
    # a session `sessions scan` and `export` never list.
    state = tmp_path / "st"
    state.mkdir()
    code, out, err = cli(*verb, "--session", f"{state}/", "--state", str(state))
    assert code == 2 and out == "", err
    assert err.startswith(f"ctxrules: error: --session {state}/: that is the state root") and err.count("\n") == 1
    assert list(state.iterdir()) == []
