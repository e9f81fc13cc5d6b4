"""``prism limits show|rebase``: what limits apply to whom and what is left; budgets rebuilt.

``show`` builds the generation the configuration describes (as a gateway
would, without serving) and reads:

- who the organisation or key id is, with its settings parsed as a gateway
  parses them, through the ``principals`` service (prism-keys provides it):
  no plugin is imported;
- what each counter holds in the fleet's shared state (Redis, through
  prism-redis), in one read-only round trip; a budget counter the fleet does
  not hold yet, and every budget without shared state, from the ledger
  (the ``spend`` service, prism-billing).

Without shared state rpm, tpm and max_parallel are counted inside each
gateway process, where no command can read them: ``show`` says so.

``rebase`` drops the fleet's budget counters so that each is rebuilt from
the ledger on its next use.  It needs shared state: without it each gateway
process keeps its own counters and rebuilds them from the ledger when it
starts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import math
import sys
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from typing import Any

import attrs
import orjson

from prism_proxy import (
    ANONYMOUS,
    GATEWAY,
    PRINCIPALS,
    SPEND,
    CheckLine,
    Commands,
    Config,
    Generation,
    Principal,
    Principals,
    create_app,
)

from .counting import Ask
from .fleet import FleetCounters, Standing
from .limiter import Limiter
from .limits import BUDGET, METRICS, Kind, Limit, applying, format_money
from .periods import window
from .plugin import limiter_of

__all__ = ["add_commands", "check_lines"]

SUBJECT = "limits"


def add_commands(commands: Commands) -> None:
    parser = commands.add(
        "limits",
        "the limits that apply to an organisation or a key and what is left of them; "
        "rebuild budget counters from the ledger",
        _run,
    )
    actions = parser.add_subparsers(dest="limits_action", required=True, metavar="ACTION")
    show = _action(
        actions,
        "show",
        "the limits of an organisation or a key id (a key's own and its organisation's, per "
        "model too): what is used, what remains, when each resets",
    )
    show.add_argument("who", nargs="?", metavar="ORG|KEY_ID", help="an organisation or a key id")
    kind = show.add_mutually_exclusive_group()
    kind.add_argument("--org", action="store_true", help="ORG|KEY_ID is an organisation")
    kind.add_argument("--key", action="store_true", help="ORG|KEY_ID is a key id")
    kind.add_argument(
        "--anonymous",
        action="store_true",
        help="callers without a key ([prism:limits] limits)",
    )
    show.add_argument("--model", metavar="MODEL", help="only the limits a call on MODEL must fit")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    _action(
        actions,
        "rebase",
        "drop the fleet's budget counters in shared state: each is rebuilt from the ledger "
        "on its next use",
    )


def _action(
    actions: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help: str
) -> argparse.ArgumentParser:
    parser = actions.add_parser(name, help=help, description=help)
    # SUPPRESS: a --config given before the action must not be reset by this one.
    parser.add_argument("--config", metavar="PATH", default=argparse.SUPPRESS, help="config file")
    return parser


class Refused(Exception):
    """What the command cannot do; the message says why.  Exit 2, or 1 for a name that
    was not found (as ``prism keys`` does)."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


def _run(args: argparse.Namespace, config: Config) -> int:
    action = args.limits_action
    try:
        generation = create_app(config)[GATEWAY].current
        limiter = limiter_of(generation)
        if limiter is None:
            raise Refused(f"{config.source}: limits are disabled")
        if action == "rebase":
            return asyncio.run(_closing(limiter, _rebase(generation, limiter)))
        return asyncio.run(_closing(limiter, _show(args, generation, limiter)))
    except Refused as refused:
        print(f"prism limits {action}: {refused}", file=sys.stderr)
        return refused.status


async def _closing(limiter: Limiter, work: Coroutine[Any, Any, int]) -> int:
    try:
        return await work
    finally:
        if limiter.fleet is not None:
            # The link was made for this command alone: nothing else closes its client.
            with contextlib.suppress(Exception):
                await limiter.fleet.link.connect().aclose()


# --- rebase ---


async def _rebase(generation: Generation, limiter: Limiter) -> int:
    fleet = limiter.fleet
    if fleet is None:
        raise Refused(
            "no shared state: each gateway process counts its own limits and rebuilds its "
            "budget counters from the ledger when it starts (restart the gateways to rebase "
            "them); install prism-redis and set [prism:redis] url to share them"
        )
    try:
        dropped = await fleet.rebase()
    except Exception as exc:
        print(f"prism limits rebase: {_where(fleet)} did not answer ({_why(exc)})", file=sys.stderr)
        return 1
    print(
        f"rebased {_where(fleet)}: {dropped} budget counters dropped; each is rebuilt from the "
        "ledger on its next use"
    )
    for line in _ledger_lines(generation):
        print(f"note: {line.text}")
    return 0


# --- show ---


@attrs.frozen
class Subject:
    """Whose limits: an organisation, a key, or callers without a key."""

    kind: str
    name: str
    principal: Principal


async def _show(args: argparse.Namespace, generation: Generation, limiter: Limiter) -> int:
    model = None
    if args.model is not None:
        found = generation.catalog.resolve(args.model)
        if found is None:
            raise Refused(f"--model: {args.model!r} is not in the catalog")
        model = found.name
    subject = await _subject(args, generation)
    limits = _limits(subject.principal, limiter, model)
    now = limiter.wall()
    asks = [_ask(limit, now) for limit in limits]
    pricing = limiter.pricing
    report = Report(subject, asks, now, currency=pricing.currency if pricing else None)
    status = await report.read(limiter)
    if args.json:
        print(orjson.dumps(report.json(), option=orjson.OPT_INDENT_2).decode())
    else:
        for line in report.lines():
            print(line)
    return status


async def _subject(args: argparse.Namespace, generation: Generation) -> Subject:
    if args.anonymous:
        if args.who is not None:
            raise Refused("give ORG|KEY_ID or --anonymous, not both")
        return Subject("anonymous", "callers without a key", ANONYMOUS)
    who = args.who
    if who is None:
        raise Refused("give ORG|KEY_ID (or --anonymous)")
    principals = _principals(generation)
    if principals is None:
        raise Refused(
            "no loaded plugin says who an organisation or a key id is (the principals "
            "service: prism-keys, with [prism:keys] db_path or db_url); only --anonymous "
            "can be shown"
        )
    try:
        org = None if args.key else await principals.organisation(who)
        key = None if args.org else await principals.key(who)
    except Exception as exc:
        raise Refused(f"who {who!r} is could not be read ({_why(exc)})", 1) from None
    if org is not None and key is not None:
        raise Refused(f"{who!r} is an organisation and a key id: say which with --org or --key")
    if isinstance(org, Principal):
        return Subject("organisation", who, org)
    if isinstance(key, Principal):
        return Subject("key", who, key)
    what = "organisation" if args.org else "active key id" if args.key else "organisation or key id"
    raise Refused(f"no {what} {who!r}", 1)


def _principals(generation: Generation) -> Principals | None:
    return generation.services.get(PRINCIPALS)


def _limits(principal: Principal, limiter: Limiter, model: str | None) -> list[Limit]:
    """Every limit of ``principal`` (for one model: those a call on it must fit)."""

    def on(name: str) -> list[Limit]:
        return applying(
            principal.org,
            principal.key_id,
            principal.settings,
            principal.key_settings,
            limiter.defaults,
            name,
        )

    if model is not None:
        return on(model)
    # Each limit set for one model (NAME@MODEL) is found by asking for that model.
    models = sorted(
        {
            name.partition("@")[2]
            for settings in (principal.settings, principal.key_settings, limiter.defaults)
            for name in settings
            if "@" in name
        }
    )
    found = [limit for limit in on("") if limit.model is None]
    for name in models:
        found += [limit for limit in on(name) if limit.model == name]
    return sorted(
        found,
        key=lambda limit: (
            limit.owner.scope == "key",
            limit.model is not None,
            limit.model or "",
            METRICS.index(limit.metric),
        ),
    )


def _ask(limit: Limit, now: float) -> Ask:
    if limit.kind is not Kind.BUDGET or limit.period is None:
        return Ask(limit, limit.counter, 0)
    span = window(limit.period, now)
    return Ask(limit, f"{limit.counter}:{span.name}", 0, span.end)


@attrs.define
class Report:
    """What ``show`` says: each limit with what its counter holds, and how it was read."""

    subject: Subject
    asks: Sequence[Ask]
    now: float
    currency: str | None = None
    standings: list[Standing | None] = attrs.field(factory=list)
    #: Where each reading came from: ``fleet``, ``ledger`` or None (not readable here).
    sources: list[str | None] = attrs.field(factory=list)
    counted: str = "per process"
    where: str | None = None
    #: The engine and key prefix of the fleet's shared state (None: not shared).
    link: dict[str, str] | None = None
    gateways: int | None = None
    notes: list[str] = attrs.field(factory=list)

    async def read(self, limiter: Limiter) -> int:
        """Read every counter; 1 when shared state or the ledger did not answer."""
        status = 0
        self.standings = [None] * len(self.asks)
        self.sources = [None] * len(self.asks)
        fleet = limiter.fleet
        if fleet is not None:
            self.where = _where(fleet)
            self.link = {"engine": fleet.link.engine, "prefix": fleet.link.prefix}
            try:
                standings, self.gateways = await fleet.standing(self.asks)
                self.counted = "fleet"
                self.standings = list(standings)
                self.sources = ["fleet"] * len(standings)
            except Exception as exc:
                status = 1
                self.counted = "unreadable"
                self.notes.append(
                    f"{self.where} did not answer ({_why(exc)}): rpm, tpm and max_parallel "
                    "not read; budgets from the ledger"
                )
        elif any(ask.limit.kind is not Kind.BUDGET for ask in self.asks):
            self.notes.append(
                "no shared state: rpm, tpm and max_parallel are counted inside each gateway "
                "process, where no command can read them"
            )
        for index, ask in enumerate(self.asks):
            held = self.standings[index]
            if ask.limit.kind is not Kind.BUDGET or (held is not None and held.used is not None):
                continue
            if limiter.spend is None:
                self.notes.append("no ledger (the spend service, prism-billing): budgets unread")
                break
            try:
                spent = await limiter.ledger_spend(ask)
            except Exception as exc:
                status = 1
                self.notes.append(f"the ledger could not be read ({_why(exc)})")
                break
            self.standings[index] = Standing(spent, held.reserved if held is not None else 0)
            self.sources[index] = "ledger"
        return status

    def entries(self) -> Iterable[dict[str, Any]]:
        for ask, found, source in zip(self.asks, self.standings, self.sources, strict=True):
            limit = ask.limit
            entry: dict[str, Any] = {
                "owner": limit.owner.scope,
                "name": limit.owner.name,
                "limit": limit.setting,
                "metric": limit.metric,
                "model": limit.model,
                "source": source,
            }
            used = None if found is None else found.used
            if limit.kind is Kind.BUDGET:
                assert limit.period is not None
                # Reservations of calls in flight are known only to the fleet's counters.
                reserved = found.reserved if found is not None and self.counted == "fleet" else None
                left = None if used is None else max(limit.value - used - (reserved or 0), 0)
                reset = ask.reset_at
                entry |= {
                    "value": format_money(limit.value),
                    "period": limit.period.value,
                    "mode": "soft" if limit.soft else "hard",
                    "used": None if used is None else format_money(used),
                    "reserved": None if reserved is None else format_money(reserved),
                    "remaining": None if left is None else format_money(left),
                    "resets_at": reset,
                    "resets_in_s": None if reset is None else round(max(reset - self.now, 0), 3),
                }
            else:
                entry |= {
                    "value": limit.value,
                    "used": used,
                    "remaining": None if used is None else max(limit.value - used, 0),
                    "resets_in_s": None if found is None else found.frees_in_s,
                }
            yield entry

    def json(self) -> dict[str, Any]:
        principal = self.subject.principal
        return {
            "subject": {
                "kind": self.subject.kind,
                "name": None if self.subject.kind == "anonymous" else self.subject.name,
                "organisation": principal.org,
            },
            "counted": self.counted,
            "shared_state": self.link,
            "gateways": self.gateways,
            "currency": self.currency,
            "limits": list(self.entries()),
            "notes": self.notes,
        }

    def lines(self) -> Iterable[str]:
        subject, principal = self.subject, self.subject.principal
        title = f"{subject.kind} {subject.name}" if subject.kind != "anonymous" else subject.name
        if subject.kind == "key":
            title += f" (organisation {principal.org})" if principal.org else " (no organisation)"
        yield title
        if self.counted == "fleet":
            many = "gateway" if self.gateways == 1 else "gateways"
            yield (
                f"counted across the fleet in {self.where}; {self.gateways} {many} admitted "
                "calls in the last 30 s"
            )
        elif self.counted == "per process":
            yield "counted in each gateway process (no shared state)"
        entries = list(self.entries())
        if not entries:
            yield "no limits apply" + (
                "" if subject.kind == "anonymous" else " (prism keys org-set / set to add some)"
            )
        else:
            money = f" {self.currency}" if self.currency else ""
            rows: list[tuple[str, ...]] = [
                ("owner", "limit", "value", "used", "reserved", "remaining", "resets", "from")
            ]
            rows += [_row(entry, money) for entry in entries]
            yield from _table(rows)
        for note in self.notes:
            yield f"note: {note}"


def _row(entry: Mapping[str, Any], money: str) -> tuple[str, ...]:
    scope, name = entry["owner"], entry["name"]
    if scope == "default":  # [prism:limits]: each key without an organisation, or nobody's
        owner = "callers without a key" if name == "anonymous" else f"key {name} (no org)"
    else:
        owner = f"{scope} {name}"
    if entry["metric"] == BUDGET:
        value = f"{entry['value']}{money}/{entry['period']}"
        if entry["mode"] == "soft":
            value += " soft"
        reserved = "-" if entry["reserved"] is None else entry["reserved"]
        reset_at = entry["resets_at"]
        resets = "never (total)" if reset_at is None else _when(reset_at, entry["resets_in_s"])
    else:
        value = str(entry["value"])
        reserved = "-"
        frees = entry["resets_in_s"]
        if entry["metric"] == "max_parallel":
            resets = "as calls end" if entry["used"] is not None else "-"
        else:
            resets = "-" if frees is None else f"in {_duration(frees)}"
    return (
        owner,
        entry["limit"],
        value,
        _shown(entry["used"]),
        reserved,
        _shown(entry["remaining"]),
        resets,
        entry["source"] or "-",
    )


def _shown(value: Any) -> str:
    return "?" if value is None else str(value)


def _when(at: int, in_s: float) -> str:
    moment = datetime.datetime.fromtimestamp(at, datetime.UTC)
    return f"{moment:%Y-%m-%d %H:%M} UTC (in {_duration(in_s)})"


def _duration(seconds: float) -> str:
    whole = max(math.ceil(seconds), 0)
    if whole < 120:
        return f"{whole} s"
    minutes = whole // 60
    if minutes < 120:
        return f"{minutes} min"
    hours = minutes // 60
    if hours < 48:
        return f"{hours} h {minutes % 60} min"
    return f"{hours // 24} d {hours % 24} h"


def _table(rows: Sequence[tuple[str, ...]]) -> Iterable[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        yield "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()


def _where(fleet: FleetCounters) -> str:
    return f"shared state ({fleet.link.engine}, prefix {fleet.link.prefix})"


def _why(exc: BaseException) -> str:
    # The type and the engine's own words; an engine's message names a host, not a password.
    text = str(exc)[:160]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# --- prism check ---


def check_lines(generation: Generation) -> list[CheckLine]:
    """How limits are counted, and what a fleet's budgets need of the ledger."""
    limiter = limiter_of(generation)
    if limiter is None:
        return []
    if limiter.fleet is None:
        lines = [
            CheckLine(
                SUBJECT,
                "counted in each gateway process (no shared state): prism serve --workers N is "
                "refused while limits are on",
            )
        ]
    else:
        lines = [
            CheckLine(
                SUBJECT,
                f"counted across the fleet in {_where(limiter.fleet)}; while it does not "
                f"answer: {limiter.settings.on_shared_state_loss} (on_shared_state_loss)",
            )
        ]
    if limiter.pricing is None:
        return [
            *lines,
            CheckLine(
                SUBJECT, "budgets count nothing: no pricing service (prism-billing, with a ledger)"
            ),
        ]
    return lines + _ledger_lines(generation)


def _ledger_lines(generation: Generation) -> list[CheckLine]:
    limiter = limiter_of(generation)
    if limiter is None or limiter.fleet is None:
        return []
    if limiter.spend is None:
        return [
            CheckLine(
                SUBJECT,
                "budgets across the fleet: no ledger to rebuild them from (the spend service, "
                "prism-billing): a counter Redis loses restarts from 0",
            )
        ]
    if _ledger_shared(generation) is not False:
        return []
    return [
        CheckLine(
            SUBJECT,
            "budgets across the fleet are rebuilt from the ledger, and this gateway's ledger is "
            "its own SQLite file: a rebuild sees only this gateway's spend. Give every gateway "
            "the same PostgreSQL ledger ([prism:billing] ledger_url)",
        )
    ]


def _ledger_shared(generation: Generation) -> bool | None:
    """Do the fleet's gateways write one ledger?  None: cannot tell.

    The spend service does not say (yet); prism-billing's configuration does:
    ``ledger_url`` (PostgreSQL) is shared, ``ledger_path`` (SQLite) is one file
    per gateway.
    """
    if generation.services.provider(SPEND) != "billing":
        return None
    billing = generation.config.section("billing")
    if "ledger_url" in billing:
        return True
    return False if "ledger_path" in billing else None
