"""The ``pricing`` and ``spend`` services (``prism_proxy.PRICING``, ``SPEND``), from billing.

:class:`BillingPricing` prices a line's usage with the very :class:`~.prices.PriceBook`
the generation bills with, so what a consumer counts is what the ledger row
records, to the nano-unit.  :class:`LedgerSpend` sums the ledger itself, the
SQLite file or the PostgreSQL database, so that a consumer's counters can be
rebuilt from the truth.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import asyncpg
import attrs

from prism_proxy import Binding, Spend, SpendSnapshot, SpendTotals, Usage

from .ledger import LedgerWriter, open_for_reading
from .pg_ledger import PostgresLedgerWriter
from .prices import PriceBook
from .queries import POSTGRES, SQLITE, Dialect

__all__ = ["BillingPricing", "LedgerSpend", "since_bounds", "spend_sql"]


@attrs.frozen
class BillingPricing:
    """The ``pricing`` service: the generation's prices, as billing charges them."""

    #: The currency the prices are in (``[prism:billing] currency``).
    currency: str
    prices: PriceBook

    def priced(self, binding: Binding) -> bool:
        """Does ``binding`` carry a price?  (An unpriced line is billed 0.)"""
        return self.prices.price_of(binding) is not None

    def cost(self, binding: Binding, usage: Usage | None) -> int:
        """What the ledger row of a call ``binding`` served with ``usage`` records, in nanos.

        The row's own computation (:func:`~.rows.build_row`): the line's price
        applied to the usage (None: the request fee alone), or 0 unpriced.
        """
        price = self.prices.price_of(binding)
        return 0 if price is None else price.cost_nanos(usage)


def since_bounds(since: datetime.datetime | None) -> tuple[str, str] | None:
    """``(ts, day)`` as the ledger writes them, for rows settled at or after ``since``.

    A naive ``since`` is taken as UTC (the ledger's time); an aware one is
    converted.  The ledger stamps rows to the millisecond (cut, not rounded),
    so ``since`` is cut the same way: a row stamped in ``since``'s
    millisecond counts.
    """
    if since is None:
        return None
    if since.tzinfo is None:
        since = since.replace(tzinfo=datetime.UTC)
    moment = since.astimezone(datetime.UTC).replace(tzinfo=None)
    # isoformat pads the year to four digits (strftime's %Y does not, below 1000).
    return moment.isoformat(timespec="milliseconds") + "Z", moment.date().isoformat()


def _served_clauses(
    dialect: Dialect, since: datetime.datetime | None, params: list[Any]
) -> list[str]:
    """WHERE clauses for served customer rows settled at or after ``since``; appends
    their parameters to ``params``."""
    params.append("customer")
    # Served: a line answered (the row names it).  Rows of calls nothing served
    # (every binding failed, refused, passed through) cost 0 and are no spend.
    return [
        f"traffic = {dialect.param(len(params))}",
        "provider IS NOT NULL",
        *_since_clauses(dialect, since, params),
    ]


def _since_clauses(
    dialect: Dialect, since: datetime.datetime | None, params: list[Any]
) -> list[str]:
    bounds = since_bounds(since)
    if bounds is None:
        return []
    ts, day = bounds
    params += [day, ts]
    # ``day`` lets the (traffic, day) index narrow the scan; ``ts`` is exact.  Both
    # are fixed-width ISO text; PostgreSQL compares ``ts`` bytewise, as SQLite does.
    stamp = 'ts COLLATE "C"' if dialect is POSTGRES else "ts"
    return [
        f"day >= {dialect.param(len(params) - 1)}",
        f"{stamp} >= {dialect.param(len(params))}",
    ]


def spend_sql(
    dialect: Dialect,
    since: datetime.datetime | None,
    recent_since: datetime.datetime | None = None,
) -> tuple[str, list[Any]]:
    """Served customer rows settled at or after ``since``, summed per (org, key_id, model).

    With ``recent_since``, the same statement (one snapshot) also returns one row
    per counted call settled at or after it, naming its request id (the sums'
    rows have none).
    """
    params: list[Any] = []
    where = " AND ".join(_served_clauses(dialect, since, params))
    sql = (
        "SELECT org, key_id, model, COUNT(*), "
        "COALESCE(SUM(input_tokens + output_tokens), 0), COALESCE(SUM(cost_nanos), 0), "
        f"NULL FROM ledger WHERE {where} GROUP BY org, key_id, model"
    )
    if recent_since is not None:
        # Rows counted above: settled at or after both bounds.
        recent = _served_clauses(dialect, since, params)
        recent += _since_clauses(dialect, recent_since, params)
        sql += (
            " UNION ALL SELECT org, key_id, model, 0, 0, 0, request_id "
            f"FROM ledger WHERE {' AND '.join(recent)}"
        )
    return sql, params


def _totals(records: Iterable[Sequence[Any]]) -> dict[tuple[str | None, str | None, str], Spend]:
    # int(): PostgreSQL sums BIGINT columns as NUMERIC (Decimal); both are whole.
    return {
        (org, key_id, model): Spend(calls=int(calls), tokens=int(tokens), nanos=int(nanos))
        for org, key_id, model, calls, tokens, nanos, request_id in records
        if request_id is None
    }


def _snapshot(records: Sequence[Sequence[Any]]) -> SpendSnapshot:
    recent: dict[tuple[str | None, str | None, str], set[str]] = {}
    for org, key_id, model, *_, request_id in records:
        if request_id is not None:
            recent.setdefault((org, key_id, model), set()).add(request_id)
    return SpendSnapshot(_totals(records), {owner: frozenset(ids) for owner, ids in recent.items()})


def _read_sqlite(path: Path, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
    conn = open_for_reading(path)
    try:
        return list(conn.execute(sql, params))
    finally:
        conn.close()


@attrs.frozen
class LedgerSpend:
    """The ``spend`` service: the ledger's totals, read from the ledger billing writes."""

    writer: LedgerWriter | PostgresLedgerWriter

    async def spend_since(self, since: datetime.datetime | None) -> SpendTotals:
        """Customer calls a line served, settled at or after ``since`` (None: ever), summed.

        Keyed by ``(org, key_id, model)`` as the rows hold them: ``org`` and
        ``key_id`` None for an anonymous caller or a key without an
        organisation; ``model`` the name the call resolved to, which is the
        catalog model's name (or, for a caller who pinned a line, its
        ``provider/upstream-model``).  ``calls`` counts the served rows
        (unpriced lines included, at 0), ``tokens`` their input + output tokens
        as billed, ``nanos`` their ``cost_nanos``.  Operator traffic (probes,
        preflight) and calls nothing served are not counted.

        ``since`` is UTC when naive and is cut to the millisecond, as the rows'
        stamps are (see :func:`since_bounds`).

        Only committed rows are counted.  A row is committed before its call's
        answer completes, but a call still settling (its row in the
        group-commit queue) and, on PostgreSQL, rows held in a gateway's spool
        while the database was unreachable are not in the ledger yet: they
        are counted by a later read, once committed or replayed (they keep
        their settle time, so a later ``spend_since`` with the same ``since``
        finds them).

        The SQLite file is read on a worker thread, never on the event loop.
        Raises the engine's error when the ledger cannot be read:
        ``sqlite3.Error`` or ``OSError`` (no ledger file yet) for SQLite;
        ``OSError``, ``TimeoutError`` or an ``asyncpg`` error for PostgreSQL.
        """
        return _totals(await self._read(since, None))

    async def spend_snapshot(
        self, since: datetime.datetime | None, recent_since: datetime.datetime
    ) -> SpendSnapshot:
        """:meth:`spend_since` and the request ids of the rows it counts that were
        settled at or after ``recent_since``, read by one statement (one snapshot
        of the ledger: a call is in both or in neither)."""
        return _snapshot(await self._read(since, recent_since))

    async def _read(
        self, since: datetime.datetime | None, recent_since: datetime.datetime | None
    ) -> list[tuple[Any, ...]]:
        writer = self.writer
        if isinstance(writer, PostgresLedgerWriter):
            sql, params = spend_sql(POSTGRES, since, recent_since)
            return await _fetch_pg(writer, sql, params)
        sql, params = spend_sql(SQLITE, since, recent_since)
        return await asyncio.to_thread(_read_sqlite, writer.path, sql, params)


async def _fetch_pg(
    writer: PostgresLedgerWriter, sql: str, params: list[Any]
) -> list[tuple[Any, ...]]:
    """One statement (one snapshot), on a connection of the writer's pool.

    Without a pool (the writer not started yet, or PostgreSQL away since
    start-up), on a connection of its own: the answer or the engine's error.
    """
    pool = writer.pool
    if pool is None:
        conn = await asyncpg.connect(
            writer.url, timeout=writer.timeout_s, command_timeout=writer.timeout_s
        )
        try:
            return [tuple(record) for record in await conn.fetch(sql, *params)]
        finally:
            await conn.close()
    async with pool.acquire(timeout=writer.timeout_s) as lent:
        return [tuple(record) for record in await lent.fetch(sql, *params)]
