"""``ctxrules usage add|show|reset|report``: record model usage in the ledgers and show spend.

``add`` records one successful call (counts as options, or a provider response / usage JSON
with ``--response``); a failed call (``--failed``, or an error body) records nothing.
``show`` prints the session (root task), today's and the goal's totals, and with ``--pack``
the budget level, burn rate and ETA. ``reset`` starts a budget dimension afresh (the history
stays in the ledger). ``report`` draws the usage dashboard from the day ledgers. See
docs/budgets.md.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any

from ctxrules.budget.dashboard import Period, load_calls, render_dashboard, summary_text
from ctxrules.budget.ledger import Totals
from ctxrules.budget.policy import BudgetPolicy
from ctxrules.budget.tracker import SessionLedger, checked_epoch
from ctxrules.budget.usage import TokenUsage, is_failed_response
from ctxrules.cli.io import add_search_path, dump, outputs_outside, read_json, write_text
from ctxrules.cli.output import require_stdout, write_stdout
from ctxrules.cli.stores import (
    add_store_options,
    check_session_dir,
    describe_store,
    is_filesystem,
    kept_places,
    session_key,
    store_of,
)
from ctxrules.diagnostics import did_you_mean
from ctxrules.errors import UsageError
from ctxrules.packs.validated import load_pack
from ctxrules.printable import printable
from ctxrules.private_files import check_can_make
from ctxrules.session_store import state_root_from_env
from ctxrules.stores import Log, StoreUsageError, open_store, store_from_options
from ctxrules.stores.filesystem import for_session_dir

MAX_DAYS = 3660  # ten years of days, for `show --days` and `report --days`
KINDS = ("prompt", "completion", "cached", "cache_write", "reasoning", "citation", "total")


def register(sub: Any) -> None:
    p = sub.add_parser(
        "usage",
        help="record model usage and show spend against budgets",
        description="Record model usage in the session, day and goal ledgers, and show "
        "totals, budget levels, burn rate and ETA (docs/budgets.md).",
    )
    usub = p.add_subparsers(dest="usage_verb", metavar="ACTION", parser_class=type(p))
    usub.required = True

    a = usub.add_parser(
        "add",
        help="record one successful model call",
        description="Record one model call. Give the counts as options, or a "
        "response or usage object with --response (OpenAI, Anthropic, "
        "Gemini, litellm shapes). A failed call records nothing.",
    )
    _scope(a)
    a.add_argument("--model", required=True, help="the model that was called (prices come from it)")
    for kind in KINDS:
        a.add_argument(
            f"--{kind.replace('_', '-')}",
            type=_count,
            metavar="N",
            help=f"{kind} tokens" + (" (default: prompt + completion)" if kind == "total" else ""),
        )
    a.add_argument("--response", metavar="FILE", help="a response or usage JSON file ('-' for stdin)")
    a.add_argument(
        "--shape",
        default="auto",
        choices=["auto", "ctxrules", "openai", "responses", "anthropic", "gemini"],
        help="the shape of --response (default: recognized by its keys)",
    )
    a.add_argument("--failed", action="store_true", help="the call failed: record nothing")
    a.add_argument("--tier", help="the router tier the call was made at (simple, standard, reasoning)")
    a.add_argument(
        "--service-tier",
        default="standard",
        choices=["standard", "priority", "flex", "batch"],
        help="the provider's service tier (its prices apply)",
    )
    a.add_argument(
        "--at", type=_epoch, metavar="EPOCH", help="when the call was made, seconds since 1970 UTC (default: now)"
    )
    a.add_argument("--json", action="store_true", help="print the ledger record as JSON")
    a.set_defaults(func=run_add)

    s = usub.add_parser(
        "show",
        help="totals, budget levels, burn rate and ETA",
        description="Show what the session's root task, today and the goal spent; with "
        "--pack, the budget level of each limit, the burn rate and the ETA.",
    )
    _scope(s)
    s.add_argument("--format", choices=["text", "json"], default="text")
    s.add_argument(
        "--days",
        type=_days_count,
        default=0,
        metavar="N",
        help="also list the spend of each of the last N days",
    )
    s.set_defaults(func=run_show)

    r = usub.add_parser(
        "reset",
        help="start a budget dimension afresh",
        description="Reset a budget dimension from now on; the ledger keeps the history.",
    )
    _scope(r)
    r.add_argument("--dimension", required=True, choices=["session", "day", "goal"])
    r.set_defaults(func=run_reset)

    d = usub.add_parser(
        "report",
        help="a usage dashboard from the day ledgers (one self-contained HTML page)",
        description="Daily spend, a drill-down per session, a per-model breakdown, an hour x "
        "weekday heatmap, per-agent cards with sparklines and requests per routing tier, from "
        "every call the state root's day ledgers hold (UTC).",
    )
    add_store_options(d)
    d.add_argument(
        "--days",
        type=_days_count,
        default=30,
        metavar="N",
        help=f"how many days, up to today (default 30; e.g. 7, 30, 365; at most {MAX_DAYS})",
    )
    d.add_argument("--until", metavar="YYYY-MM-DD", help="the last day shown (default: today, UTC)")
    d.add_argument("--html", metavar="OUT", help="write the page here (else a text summary)")
    d.set_defaults(func=run_report)


def run_report(args: argparse.Namespace) -> int:
    from datetime import UTC, date, datetime

    if args.days < 1:
        raise UsageError("--days must be at least 1")
    store = store_of(args)
    if is_filesystem(store) and not store.root.is_dir():  # (one that is a file: store_of said so)
        raise UsageError(f"{store.root}: no such state root (give --state DIR)")
    outputs_outside(kept_places(store, None), html=args.html)  # not over a ledger the page reads
    if args.until:
        try:
            last = date.fromisoformat(args.until)
        except ValueError:
            raise UsageError(f"--until {args.until!r} is not a date (YYYY-MM-DD)") from None
    else:
        last = datetime.now(UTC).date()
    period = Period(last, args.days)
    try:
        _ = (period.start, period.end)  # both ends must be dates the calendar has
    except (OverflowError, ValueError):
        span = f"--until {last.isoformat()} with --days {args.days}"
        raise UsageError(f"{span} reaches outside the years 1 to 9999") from None
    calls, bad = load_calls(store, period)
    if args.html:
        write_text(args.html, render_dashboard(calls, period, state_root=str(describe_store(store)), bad_lines=bad))
        write_stdout(f"wrote {args.html}: {len(calls)} call(s) over {args.days} day(s)\n")
    else:
        write_stdout(printable(summary_text(calls, period), one_line=False))
    return 0


def _scope(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--session",
        metavar="DIR",
        help="session directory, or the session id with a --store URL (default: STATE/default)",
    )
    add_store_options(
        p,
        state_help="state root with day and goal ledgers (default: the session's parent, else .ctxrules or "
        "$CTXRULES_STATE); the same as --store file://DIR",
    )
    p.add_argument("--goal", help="the goal the calls count against")
    p.add_argument("--pack", help="pack whose budgets: (limits, prices, time zone) apply")
    add_search_path(p)


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise argparse.ArgumentTypeError(f"expected a whole number, got {shown!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value}")
    return value


def _days_count(text: str) -> int:
    value = _count(text)
    if value > MAX_DAYS:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_DAYS} days (ten years), got {value}")
    return value


def _epoch(text: str) -> float:
    try:
        return checked_epoch(float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds since 1970, got {text!r}") from None
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _ledger(args: argparse.Namespace, *, reading: bool = False) -> SessionLedger:
    """The ledgers ``--session`` and the store options name; nothing is created. A session
    named below a file is refused (exit 2, ``PATH: Not a directory``). ``reading`` (``show``):
    one that holds nothing yet is said so on stderr, its zero totals still printed (a
    session's first call may be gated on the budgets: the day's and the goal's totals are
    real)."""
    policy = BudgetPolicy()
    if args.pack:
        policy = BudgetPolicy.from_pack(load_pack(args.pack, search_path=args.search_path).data)
    url = store_from_options(args.store, args.state)
    store = open_store(url) if url is not None else None
    if store is not None and not is_filesystem(store):
        key = session_key(store, args.session)
        if reading and args.session and not store.exists(key):
            _nothing_recorded(args.session)
        return SessionLedger(
            None,
            key,
            store=store,
            session=key,
            policy=policy,
            goal=args.goal,
            model=getattr(args, "model", None),
        )
    if args.session:
        session = Path(args.session)
        state = store.root if store is not None else None
        check_session_dir(args.session, state)
    else:
        state = store.root if store is not None else state_root_from_env()
        session = state / "default"
    if session.exists() and not session.is_dir():
        raise UsageError(f"--session {session} is not a directory")
    if args.session:
        _refused(session)
    if state is not None and state.exists() and not state.is_dir():
        # CTXRULES_STATE=/etc/passwd: zero totals read from a root that cannot hold a ledger
        raise UsageError(f"{state}: the state root is not a directory (give --state DIR)")
    if reading and args.session and not for_session_dir(session, state).exists(str(session)):
        _nothing_recorded(args.session)
    return SessionLedger(
        session,
        session.resolve().name,
        state_root=state,
        policy=policy,
        goal=args.goal,
        model=getattr(args, "model", None),
    )


def _refused(session: Path) -> None:
    """Raise the system's refusal of a session path (below a file, ``afile/s``: ENOTDIR, which
    the entry point reports as ``afile/s: Not a directory``, exit 2; a link loop, a name too
    long); nothing for a path that only does not exist yet."""
    with contextlib.suppress(FileNotFoundError):
        session.stat()


def _check_writable(ledger: SessionLedger, logs: list[Log]) -> None:
    """Raise what writing ``logs`` would meet (a folder below a file, a name too long, a folder
    that cannot be written in, a link), before anything is made (filesystem stores)."""
    store = ledger.store
    if not is_filesystem(store):
        return
    for log in logs:
        inside = store.root if log.kind in ("day", "goal") else None  # as the store makes them
        check_can_make(store.log_path(log).parent, inside=inside)


def _nothing_recorded(name: str) -> None:
    """A note that ``--session NAME`` holds no session: a typo, or one that has not begun."""
    sys.stderr.write(
        f"ctxrules: note: --session {printable(name)}: no session there yet, nothing was recorded for it "
        "(a session begins with its first `ctxrules run` or `usage add`)\n"
    )


def run_add(args: argparse.Namespace) -> int:
    given = {k: getattr(args, k) for k in KINDS if getattr(args, k) is not None}
    if args.failed:
        write_stdout("not recorded: a failed call records no usage\n")
        return 0
    if args.response and given:
        raise UsageError("give the counts either as options or with --response, not both")
    # Refused before anything is recorded: a call recorded, then exit 2 for the summary it
    # could not print, would be recorded again by the retry.
    require_stdout()
    ledger = _ledger(args)
    source: Any
    if args.response:
        source = read_json(args.response)
        if is_failed_response(source):
            write_stdout("not recorded: the response is an error (a failed call records no usage)\n")
            return 0
    elif given:
        source = TokenUsage.of(**given)
    else:
        raise UsageError("nothing to record: give --prompt/--completion/... or --response FILE")
    # Every ledger the call goes to can be written, or nothing is made: not the session's folder,
    # nor an empty day ledger left by an add that then failed on the session's.
    at = ledger.clock() if args.at is None else args.at  # one time: the day checked is the one written
    _check_writable(ledger, ledger.call_logs(at))
    rec = ledger.record(
        source,
        source="cli",
        tier=args.tier,
        service_tier=args.service_tier,
        at=at,
        fmt=args.shape,
    )
    if rec is None:  # an error body (answered above already; the ledger's own test agrees)
        write_stdout("not recorded: the response is an error (a failed call records no usage)\n")
        return 0
    if args.json:
        write_stdout(dump(rec))
        return 0
    t, usd = rec["tokens"], rec["usd"]
    cost = "unpriced (no price for this model)" if usd is None else f"${usd['total']:.6f}"
    write_stdout(
        f"recorded {rec['model']}: {t['prompt']} prompt ({t['cached']} cached, {t['cache_write']} "
        f"written), {t['completion']} completion ({t['reasoning']} reasoning), {cost}\n"
    )
    return 0


def run_show(args: argparse.Namespace) -> int:
    import time

    ledger = _ledger(args, reading=True)
    now = time.time()
    status = ledger.status(now)
    day, day_label = ledger.day_entries(now)
    data: dict[str, Any] = {
        "session": {"path": ledger.store.describe(ledger.key), "root": ledger.root_id, **status.totals.as_dict()},
        "day": {"date": day_label, "timezone": ledger.policy.timezone, **Totals.of(day).as_dict()},
        "goal": None if not ledger.goal else {"goal": ledger.goal, **Totals.of(ledger.goal_entries()).as_dict()},
        "budget": status.as_dict(),
        "days": _days(ledger, now, args.days),
    }
    if args.format == "json":
        write_stdout(dump(data))
        return 0
    write_stdout(printable(_render(data), one_line=False))
    return 0


def _days(ledger: Any, now: float, n: int) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        entries, label = ledger.day_entries(now - 86_400 * i)
        t = Totals.of(entries)
        out.append({"date": label, "calls": t.calls, "tokens": t.tokens.total, "usd": round(t.usd, 10)})
    return out


def _render(data: dict[str, Any]) -> str:
    lines = []
    for name, label in (
        ("session", f"session {data['session']['root']}"),
        ("day", f"day {data['day']['date']} ({data['day']['timezone']})"),
        ("goal", f"goal {data['goal']['goal']}" if data["goal"] else ""),
    ):
        t = data[name]
        if t is None:
            continue
        tok = t["tokens"]
        lines.append(
            f"{label}: {t['calls']} calls, ${t['usd']:.6f}"
            + (f" (+{t['unpriced_calls']} unpriced)" if t["unpriced_calls"] else "")
        )
        lines.append("  tokens: " + ", ".join(f"{k} {tok[k]:,}" for k in KINDS))
        lines.append(
            f"  cache: {t['cache_hit_share']:.1%} of prompt tokens cached, saved "
            f"${t['cache_savings_usd']:.6f} ({t['cache_savings_share']:.1%})"
        )
        for model, m in t["by_model"].items():
            lines.append(f"  {model}: {m['calls']} calls, {m['tokens']:,} tokens, ${m['usd']:.6f}")
    b = data["budget"]
    burn = b["burn"]
    lines.append(
        f"burn rate: {burn['tokens_per_min']:,.0f} tokens/min, ${burn['usd_per_min']:.6f}/min "
        f"(last {burn['calls']} calls)"
    )
    lines.append(f"budget level: {b['level'].upper()}")
    for d in b["dimensions"]:
        unit = _usd if d["unit"] == "usd" else _tokens
        eta = "-" if d["eta_s"] is None else f"{d['eta_s'] / 60:,.1f} min"
        lines.append(
            f"  {d['dimension']} ({d['scope']}): {unit(d['spent'])} of {unit(d['limit'])} "
            f"({d['share']:.0%}) {d['level'].upper()}, ETA {eta}"
        )
    for day in data["days"]:
        lines.append(f"  {day['date']}: {day['calls']} calls, {day['tokens']:,} tokens, ${day['usd']:.6f}")
    return "\n".join(lines) + "\n"


def _usd(value: float) -> str:
    return f"${value:,.4f}"


def _tokens(value: float) -> str:
    return f"{int(value):,} tokens"


def run_reset(args: argparse.Namespace) -> int:
    ledger = _ledger(args)
    now = ledger.clock()
    log = ledger.reset_log(args.dimension, now)
    # A reset starts a dimension of what is there afresh: of a session that is not (a typo) it
    # would make that session's folder, or a state root next to it, and say "reset".
    if (args.session or args.dimension == "session") and not ledger.store.exists(ledger.key):
        where = "" if is_filesystem(ledger.store) else f" in {ledger.store.url}"
        raise StoreUsageError(
            "CR147",
            f"no session {printable(args.session or ledger.key)}{where}, nothing was reset "
            "(a session begins with its first `ctxrules run` or `usage add`)",
        )
    root = ledger.state_root
    if args.dimension != "session" and root is not None and not root.is_dir():
        raise UsageError(f"{root}: no such state root, nothing was reset (give --state DIR)")
    if args.dimension == "goal":
        # Likewise of a goal that recorded no call (a typo): it made that goal's ledger.
        goals = ledger.store.logs("goal")
        if log not in goals:
            where = f" in {root}" if root is not None else f" in {ledger.store.url}"
            hint = did_you_mean(log.name, [g.name for g in goals])
            raise UsageError(
                f"no call was recorded for goal {printable(log.name)}{where}, nothing was reset"
                + (f"; {hint}" if hint else "")
            )
    _check_writable(ledger, [log])
    path = ledger.reset(args.dimension, now)
    write_stdout(f"reset the {args.dimension} budget from now on (recorded in {path})\n")
    return 0
