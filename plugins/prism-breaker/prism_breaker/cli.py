"""``prism breaker list|quarantine|cap|release|audit``: operator commands on the state store.

The CLI writes to the same store the gateway uses (the SQLite file, or the
shared store a plugin such as prism-redis provides), so it works whether or
not a gateway is running, and needs no admin token: access to the store is
the permission.  A running gateway picks up what the CLI wrote within
``refresh_s`` (it polls the store for changes off the hot path; a shared
store also tells it at once).
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from prism_proxy import (
    GATEWAY,
    AuditEntry,
    BreakerStore,
    Catalog,
    Commands,
    Config,
    Override,
    create_app,
)

from .hooks import hooks_of
from .overrides import (
    OverrideError,
    audit_subjects,
    build_override,
    check_target,
    iso,
    override_json,
    subject,
)
from .reports import audit_json
from .settings import MEMORY, Settings
from .sqlite_store import StoreError

__all__ = ["add_commands"]

Action = Callable[[argparse.Namespace, Settings, Catalog, BreakerStore], Awaitable[int]]


def add_commands(commands: Commands) -> None:
    parser = commands.add(
        "breaker", "inspect the per-binding breakers and set operator overrides", _run
    )
    actions = parser.add_subparsers(dest="breaker_action", required=True, metavar="ACTION")

    listing = _action(actions, "list", "every binding's persisted state and the active overrides")
    listing.add_argument("--json", action="store_true", help="machine-readable output")

    quarantine = _action(
        actions, "quarantine", "stop all ordinary traffic to a scope until released"
    )
    _scope(quarantine)
    _why(quarantine)

    cap = _action(actions, "cap", "limit a scope's in-flight attempts (may expire)")
    _scope(cap)
    cap.add_argument("--max-in-flight", type=int, required=True, metavar="N")
    cap.add_argument("--expires", metavar="WHEN", help="duration (2h) or ISO 8601 time")
    _why(cap)

    release = _action(actions, "release", "end an override")
    release.add_argument("id", help="the override id (ovr_...)")
    release.add_argument("--owner", default=None, help="who releases it (default: you)")
    release.add_argument("--reason", default="released", help="why")

    audit = _action(actions, "audit", "the decision log, newest first")
    audit.add_argument("--binding", metavar="PROVIDER/MODEL", help="only this binding")
    audit.add_argument("--limit", type=int, default=50, metavar="N")
    audit.add_argument("--json", action="store_true", help="machine-readable output")


def _action(
    actions: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help: str
) -> argparse.ArgumentParser:
    parser = actions.add_parser(name, help=help, description=help)
    # SUPPRESS: a --config given before the action must not be reset by this one.
    parser.add_argument("--config", metavar="PATH", default=argparse.SUPPRESS, help="config file")
    return parser


def _scope(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--binding", metavar="PROVIDER/MODEL", help="one catalog line")
    group.add_argument("--provider", metavar="NAME", help="every binding of a provider")
    group.add_argument("--model", metavar="UPSTREAM", help="every binding of an upstream model")


def _why(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--reason", required=True, help="why (recorded in the audit log)")
    parser.add_argument("--owner", default=None, help="who owns the decision (default: you)")
    parser.add_argument(
        "--review-by", metavar="WHEN", help="duration (7d) or ISO 8601 time; default 7 days"
    )


def _run(args: argparse.Namespace, config: Config) -> int:
    generation = create_app(config)[GATEWAY].current
    hooks = hooks_of(generation)
    if hooks is None:
        print(f"prism breaker: {config.source}: the breaker is disabled", file=sys.stderr)
        return 2
    settings, store, catalog = hooks.settings, hooks.breaker.store, generation.catalog
    if store.fleet is None and settings.state_path == MEMORY:
        print(
            f"prism breaker: {config.source}: [prism:breaker] state_path is in memory; "
            "there is no state file to read or write",
            file=sys.stderr,
        )
        return 2
    action: Action = _ACTIONS[args.breaker_action]

    async def main() -> int:
        await store.open()
        try:
            return await action(args, settings, catalog, store)
        finally:
            await store.close()

    try:
        return asyncio.run(main())
    except StoreError as exc:
        print(f"prism breaker: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a shared store that does not answer
        print(f"prism breaker: {store.description}: {exc}", file=sys.stderr)
        return 2


async def _list(
    args: argparse.Namespace, settings: Settings, catalog: Catalog, store: BreakerStore
) -> int:
    now = time.time()
    records = {r.binding: r for r in await store.load_bindings()}
    overrides = await store.active_overrides()
    bindings: list[dict[str, Any]] = []
    for binding in catalog.bindings.values():
        record = records.get(binding.id)
        bindings.append(
            {
                "binding": binding.id,
                "state": record.state if record else "eligible",
                "cause": record.cause if record else "no transition recorded",
                "since": iso(record.since) if record else None,
                "isolated_until": (
                    iso(record.isolated_until)
                    if record and record.state == "isolated" and record.isolated_until
                    else None
                ),
                "revision": record.revision if record else 0,
                "overrides": [o.id for o in overrides if o.covers(binding)],
            }
        )
    if args.json:
        out = {
            "bindings": bindings,
            "overrides": [override_json(o, now) for o in overrides],
            "overdue_reviews": [o.id for o in overrides if o.review_overdue(now)],
        }
        print(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())
        return 0
    print(f"state: {store.description}")
    for b in bindings:
        until = f" until {b['isolated_until']}" if b["isolated_until"] else ""
        marks = f" [{', '.join(b['overrides'])}]" if b["overrides"] else ""
        since = f" since {b['since']}" if b["since"] else ""
        print(f"{b['binding']}  {b['state']}{until}{since}  {b['cause']}{marks}")
    if overrides:
        print("overrides:")
    for o in overrides:
        overdue = "  REVIEW OVERDUE" if o.review_overdue(now) else ""
        limit = f" max_in_flight={o.max_in_flight}" if o.kind == "cap" else ""
        expires = f" expires {iso(o.expires_at)}" if o.expires_at else ""
        if o.expired(now):
            expires += " (EXPIRED: no longer applied)"
        print(
            f"{o.id}  {o.kind}{limit} {o.scope}:{o.target}  owner {o.owner}  "
            f"review by {iso(o.review_by)}{expires}{overdue}  reason: {o.reason}"
        )
    return 0


async def _quarantine(
    args: argparse.Namespace, settings: Settings, catalog: Catalog, store: BreakerStore
) -> int:
    return await _add(args, settings, catalog, store, "quarantine")


async def _cap(
    args: argparse.Namespace, settings: Settings, catalog: Catalog, store: BreakerStore
) -> int:
    return await _add(args, settings, catalog, store, "cap")


async def _add(
    args: argparse.Namespace,
    settings: Settings,
    catalog: Catalog,
    store: BreakerStore,
    kind: str,
) -> int:
    scope, target = next(
        (name, value)
        for name in ("binding", "provider", "model")
        if (value := getattr(args, name)) is not None
    )
    now = time.time()
    try:
        override = build_override(
            kind=kind,
            scope=scope,
            target=target,
            reason=args.reason,
            owner=args.owner or getpass.getuser(),
            created_at=now,
            review_by=args.review_by,
            review_default_s=settings.review_default_s,
            max_in_flight=getattr(args, "max_in_flight", None),
            expires=getattr(args, "expires", None),
        )
        check_target(override, catalog.bindings)
    except OverrideError as err:
        flag = scope if err.field == "target" else err.field.replace("_", "-")
        print(f"prism breaker {kind}: --{flag}: {err.problem}", file=sys.stderr)
        return 1
    about = subject(override)
    await store.add_override(
        override,
        AuditEntry(
            at=now,
            actor=override.owner,
            action=kind,
            subject=about,
            cause=override.reason,
            evidence=await _recorded_states(store, catalog, override),
            override_id=override.id,
        ),
    )
    print(f"{override.id}  {kind} {about}  review by {iso(override.review_by)}")
    return 0


async def _release(
    args: argparse.Namespace, settings: Settings, catalog: Catalog, store: BreakerStore
) -> int:
    active = {o.id: o for o in await store.active_overrides()}
    found = active.get(args.id)
    if found is None:
        print(f"prism breaker release: no active override {args.id!r}", file=sys.stderr)
        return 1
    owner = args.owner or getpass.getuser()
    ended = await store.end_override(
        args.id,
        AuditEntry(
            at=time.time(),
            actor=owner,
            action="release",
            subject=subject(found),
            cause=args.reason,
            evidence=await _recorded_states(store, catalog, found),
            override_id=args.id,
        ),
    )
    if ended is None:
        print(f"prism breaker release: {args.id!r} was ended meanwhile", file=sys.stderr)
        return 1
    print(f"released {args.id}")
    return 0


async def _audit(
    args: argparse.Namespace, settings: Settings, catalog: Catalog, store: BreakerStore
) -> int:
    subjects = None
    if args.binding is not None:
        binding = catalog.bindings.get(args.binding)
        if binding is None:
            print(
                f"prism breaker audit: --binding: no {args.binding!r} in the catalog",
                file=sys.stderr,
            )
            return 1
        subjects = audit_subjects(binding)
    entries = await store.audit(subjects=subjects, limit=max(1, min(args.limit, 10_000)))
    if args.json:
        print(orjson.dumps([audit_json(e) for e in entries], option=orjson.OPT_INDENT_2).decode())
        return 0
    for e in entries:
        change = f"{e.from_state} -> {e.to_state}" if e.action == "transition" else e.action
        ref = f" {e.override_id}" if e.override_id else ""
        print(f"{iso(e.at)}  {e.subject}  {change}{ref}  by {e.actor}: {e.cause}")
    return 0


async def _recorded_states(
    store: BreakerStore, catalog: Catalog, override: Override
) -> dict[str, Any]:
    """The persisted state of the covered bindings: the evidence the CLI has."""
    records = {r.binding: r for r in await store.load_bindings()}
    out: dict[str, Any] = {}
    for binding in catalog.bindings.values():
        if override.covers(binding):
            r = records.get(binding.id)
            out[binding.id] = (
                {"state": r.state, "cause": r.cause, "revision": r.revision}
                if r
                else {"state": "eligible", "cause": "no transition recorded", "revision": 0}
            )
    return {"bindings": out, "source": "cli (persisted state)"}


_ACTIONS: dict[str, Action] = {
    "list": _list,
    "quarantine": _quarantine,
    "cap": _cap,
    "release": _release,
    "audit": _audit,
}
