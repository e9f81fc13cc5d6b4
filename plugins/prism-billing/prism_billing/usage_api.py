"""``GET /prism/usage``: usage and cost totals for operators (admin token required)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import asyncpg
from aiohttp import web

from prism_proxy import GATEWAY, PrismError, admin_handler

from .billing import billing_of
from .ledger import open_for_reading
from .pg_ledger import PostgresLedgerWriter
from .queries import DIMENSIONS, TRAFFIC_KINDS, Filters, parse_day, pg_totals, totals

__all__ = ["DEFAULT_GROUP_BY", "USAGE_PATH", "parse_usage_query", "usage_handler"]

USAGE_PATH = "/prism/usage"
DEFAULT_GROUP_BY = ("org", "key", "model", "day")
_PARAMS = ("since", "until", "group_by", "traffic", "key", "org", "model")


def _bad(param: str, message: str) -> PrismError:
    return PrismError(400, "invalid_usage_query", message, param=param)


def parse_usage_query(query: Mapping[str, str]) -> tuple[Filters, tuple[str, ...]]:
    """Filters and grouping from the query string; every mistake names its parameter."""
    for name in query:
        if name not in _PARAMS:
            # A misspelt filter must not quietly return everyone's totals.
            raise _bad(name, f"unknown parameter {name!r} (known: {', '.join(_PARAMS)})")
    days: dict[str, str | None] = {}
    for name in ("since", "until"):
        value = query.get(name)
        try:
            days[name] = parse_day(value) if value is not None else None
        except ValueError as exc:
            raise _bad(name, f"{name}: {exc}") from None
    raw_group = query.get("group_by")
    if raw_group is None:
        group_by: tuple[str, ...] = DEFAULT_GROUP_BY
    else:
        group_by = tuple(part.strip() for part in raw_group.split(",") if part.strip())
        for part in group_by:
            if part not in DIMENSIONS:
                raise _bad(
                    "group_by",
                    f"group_by: unknown dimension {part!r} (known: {', '.join(DIMENSIONS)})",
                )
        if len(set(group_by)) != len(group_by):
            raise _bad("group_by", "group_by: a dimension is listed twice")
    traffic: str | None = query.get("traffic", "customer")
    if traffic == "all":
        traffic = None
    elif traffic not in TRAFFIC_KINDS:
        raise _bad(
            "traffic",
            f"traffic: expected one of {', '.join(TRAFFIC_KINDS)} or all, got {traffic!r}",
        )
    filters = Filters(
        since=days["since"],
        until=days["until"],
        traffic=traffic,
        key_id=query.get("key"),
        org=query.get("org"),
        model=query.get("model"),
    )
    return filters, group_by


def _read(
    path: Path, filters: Filters, group_by: tuple[str, ...]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    conn = open_for_reading(path)
    try:
        return totals(conn, filters, group_by)
    finally:
        conn.close()


async def _read_pg(
    writer: PostgresLedgerWriter, filters: Filters, group_by: tuple[str, ...]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Totals from the PostgreSQL ledger, on a connection from the writer's pool."""
    pool = writer.pool
    if pool is None:
        raise PrismError(503, "ledger_unavailable", "the ledger is not open")
    try:
        async with pool.acquire(timeout=writer.timeout_s) as conn:
            return await pg_totals(conn, filters, group_by)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise PrismError(
            503,
            "ledger_unavailable",
            f"cannot read the ledger {writer.name}: {type(exc).__name__}",
        ) from None


@admin_handler
async def usage_handler(request: web.Request) -> web.StreamResponse:
    billing = billing_of(request.app[GATEWAY].current)
    if billing is None or not billing.settings.enabled:
        raise PrismError(
            404,
            "billing_off",
            "billing is off: set [prism:billing] ledger_path or ledger_url to enable it",
        )
    filters, group_by = parse_usage_query(request.query)
    writer = billing.writer
    if isinstance(writer, PostgresLedgerWriter):
        groups, total = await _read_pg(writer, filters, group_by)
    else:
        groups, total = await asyncio.to_thread(_read, writer.path, filters, group_by)
    return web.json_response(
        {
            "currency": billing.settings.currency,
            "traffic": filters.traffic or "all",
            "since": filters.since,
            "until": filters.until,
            "group_by": list(group_by),
            "groups": groups,
            "total": total,
        }
    )
