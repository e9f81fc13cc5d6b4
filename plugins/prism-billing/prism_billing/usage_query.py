"""The ``usage`` service: customer usage summed from the ledger, for the admin API.

The same rows ``prism ledger export`` writes out (customer traffic, UTC
days, ``until`` exclusive), summed per organisation, key, model and day or
hour with the queries ``GET /prism/usage`` runs; ``hour`` is the first 13
characters of a row's UTC stamp (``2026-11-30T16``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import asyncpg
import attrs

from prism_proxy import PrismError, UsageQuery

from .ledger import LedgerWriter, open_for_reading
from .pg_ledger import PostgresLedgerWriter
from .queries import _SUMS, POSTGRES, SQLITE, Dialect, Filters, _group, _sums

__all__ = ["LedgerUsage"]

_COLUMNS = {
    "org": "org",
    "key": "key_id",
    "model": "model",
    "day": "day",
    "hour": "substr(ts, 1, 13)",
}


def _sql(dialect: Dialect, query: UsageQuery) -> tuple[str, str, list[Any]]:
    filters = Filters(
        since=query.since,
        until=query.until,
        traffic="customer",
        key_id=query.key_id,
        org=query.org,
        model=query.model,
    )
    where, params = filters.where(dialect)
    dims = [_COLUMNS[name] for name in query.group_by]
    keys = ", ".join(dims)
    grouped = (
        f"SELECT {keys}, {', '.join(_SUMS)} FROM ledger{where} "
        f"GROUP BY {keys} ORDER BY {dialect.order(dims)}"
    )
    return grouped, f"SELECT {', '.join(_SUMS)} FROM ledger{where}", params


def _read(path: Path, query: UsageQuery) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    grouped, total_sql, params = _sql(SQLITE, query)
    try:
        conn = open_for_reading(path)
    except FileNotFoundError:
        # No call was billed yet: nothing to sum.
        return [], _sums((0,) * len(_SUMS))
    try:
        conn.execute("BEGIN")  # both queries in one snapshot
        groups = [_group(query.group_by, r) for r in conn.execute(grouped, params)]
        total = conn.execute(total_sql, params).fetchone()
        return groups, _sums(total)
    finally:
        conn.close()


@attrs.frozen
class LedgerUsage:
    """:class:`prism_proxy.UsageReport` over the ledger billing writes."""

    currency: str
    writer: LedgerWriter | PostgresLedgerWriter

    async def usage(self, query: UsageQuery) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        writer = self.writer
        if not isinstance(writer, PostgresLedgerWriter):
            return await asyncio.to_thread(_read, writer.path, query)
        pool = writer.pool
        if pool is None:
            raise PrismError(503, "ledger_unavailable", "the ledger is not open")
        grouped, total_sql, params = _sql(POSTGRES, query)
        try:
            async with (
                pool.acquire(timeout=writer.timeout_s) as conn,
                conn.transaction(isolation="repeatable_read", readonly=True),
            ):
                rows: Sequence[Any] = await conn.fetch(grouped, *params)
                total = await conn.fetchrow(total_sql, *params)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise PrismError(
                503,
                "ledger_unavailable",
                f"cannot read the ledger {writer.name}: {type(exc).__name__}",
            ) from None
        assert total is not None
        return [_group(query.group_by, tuple(r)) for r in rows], _sums(tuple(total))
