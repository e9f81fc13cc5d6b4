"""Reading the ledger: filters, usage totals, and row export.

Shared by ``GET /prism/usage`` and ``prism ledger export``.  Days are UTC;
``since`` is inclusive and ``until`` exclusive.  Costs are summed as integer
nano-units, so totals are exact.

The SQL is built once for both engines: a :class:`Dialect` says how to write
a parameter (``?`` for SQLite, ``$1`` for PostgreSQL) and how to order text
the same way on both (bytewise, nulls first).  Flags are summed as
``CASE WHEN flag THEN 1 ELSE 0 END``, which both engines accept whether the
column is an INTEGER 0/1 (SQLite) or a BOOLEAN (PostgreSQL).
"""

from __future__ import annotations

import datetime
import re
import sqlite3
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import asyncpg
import attrs
from asyncpg.pool import PoolConnectionProxy

from .prices import format_nanos
from .rows import COLUMNS

__all__ = [
    "DIMENSIONS",
    "POSTGRES",
    "SQLITE",
    "Dialect",
    "TRAFFIC_KINDS",
    "Filters",
    "export_rows",
    "pg_export_rows",
    "pg_totals",
    "parse_day",
    "totals",
]

#: What totals can be grouped by, and the column (or expression) behind each.
DIMENSIONS: dict[str, str] = {
    "key": "key_id",
    "org": "org",
    "model": "model",
    "day": "day",
    "provider": "provider",
    "binding": "provider || '/' || upstream_model",
    "traffic": "traffic",
}
TRAFFIC_KINDS = ("customer", "probe", "preflight")
_DAY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
#: A PostgreSQL connection: on its own, or lent by a pool.
PgConnection = asyncpg.Connection | PoolConnectionProxy
_FLAGS = ("stream", "estimated", "unpriced", "usage_suspect")


@attrs.frozen
class Dialect:
    """What differs between the engines' SQL."""

    name: str
    #: The placeholder for the ``n``-th parameter (from 1).
    placeholder: str
    #: How ORDER BY spells an expression so text sorts bytewise with nulls first.
    order_format: str

    def param(self, n: int) -> str:
        return self.placeholder.format(n=n)

    def order(self, expressions: Sequence[str]) -> str:
        return ", ".join(self.order_format.format(e=e) for e in expressions)


#: SQLite compares text bytewise and sorts nulls first already.
SQLITE = Dialect("sqlite", "?", "{e}")
#: PostgreSQL would sort by the database's locale and put nulls last.
POSTGRES = Dialect("postgresql", "${n}", '({e}) COLLATE "C" NULLS FIRST')


def parse_day(value: str) -> str:
    """A ``YYYY-MM-DD`` calendar day, or ValueError saying what is wrong."""
    if not _DAY.fullmatch(value):
        raise ValueError(f"expected a day as YYYY-MM-DD, got {value!r}")
    try:
        return datetime.date.fromisoformat(value).isoformat()
    except ValueError:
        raise ValueError(f"{value!r} is not a calendar day") from None


@attrs.frozen
class Filters:
    """Which rows to read.  ``traffic`` None reads every kind of traffic."""

    since: str | None = None
    until: str | None = None
    traffic: str | None = "customer"
    key_id: str | None = None
    org: str | None = None
    model: str | None = None

    def where(self, dialect: Dialect = SQLITE) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        params: list[Any] = []
        for clause, value in (
            ("day >= {}", self.since),
            ("day < {}", self.until),
            ("traffic = {}", self.traffic),
            ("key_id = {}", self.key_id),
            ("org = {}", self.org),
            ("model = {}", self.model),
        ):
            if value is not None:
                params.append(value)
                clauses.append(clause.format(dialect.param(len(params))))
        return (" WHERE " + " AND ".join(clauses) if clauses else ""), params


_SUMS = (
    "COUNT(*)",
    "COUNT(provider)",
    "COALESCE(SUM(CASE WHEN estimated THEN 1 ELSE 0 END), 0)",
    "COALESCE(SUM(input_tokens), 0)",
    "COALESCE(SUM(cached_input_tokens), 0)",
    "COALESCE(SUM(cache_creation_tokens), 0)",
    "COALESCE(SUM(output_tokens), 0)",
    "COALESCE(SUM(cost_nanos), 0)",
)


def _sums(values: Sequence[Any]) -> dict[str, Any]:
    # int(): PostgreSQL sums BIGINT columns as NUMERIC (Decimal); both are whole.
    calls, served, estimated, inp, cached, written, out, cost = (int(v) for v in values)
    return {
        "calls": calls,
        "served_calls": served,
        "estimated_calls": estimated,
        "input_tokens": inp,
        "cached_input_tokens": cached,
        "cache_creation_tokens": written,
        "output_tokens": out,
        "cost": format_nanos(cost),
    }


def totals_sql(
    dialect: Dialect, filters: Filters, group_by: Sequence[str]
) -> tuple[str | None, str, list[Any]]:
    """The per-group query (None without groups), the grand-total query, and their parameters."""
    where, params = filters.where(dialect)
    dims = [DIMENSIONS[name] for name in group_by]
    grouped = None
    if dims:
        keys = ", ".join(dims)
        grouped = (
            f"SELECT {keys}, {', '.join(_SUMS)} FROM ledger{where} "
            f"GROUP BY {keys} ORDER BY {dialect.order(dims)}"
        )
    return grouped, f"SELECT {', '.join(_SUMS)} FROM ledger{where}", params


def _group(group_by: Sequence[str], record: Sequence[Any]) -> dict[str, Any]:
    group = dict(zip(group_by, record[: len(group_by)], strict=True))
    group.update(_sums(record[len(group_by) :]))
    return group


def totals(
    conn: sqlite3.Connection, filters: Filters, group_by: Sequence[str]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Totals per group (in group order), and the grand total of the same rows (SQLite)."""
    grouped, total_sql, params = totals_sql(SQLITE, filters, group_by)
    groups: list[dict[str, Any]] = []
    if grouped is not None:
        groups = [_group(group_by, record) for record in conn.execute(grouped, params)]
    total = conn.execute(total_sql, params).fetchone()
    return groups, _sums(total)


async def pg_totals(
    conn: PgConnection, filters: Filters, group_by: Sequence[str]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """:func:`totals` on a PostgreSQL ledger, both queries in one snapshot."""
    grouped, total_sql, params = totals_sql(POSTGRES, filters, group_by)
    groups: list[dict[str, Any]] = []
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        if grouped is not None:
            groups = [_group(group_by, tuple(r)) for r in await conn.fetch(grouped, *params)]
        total = await conn.fetchrow(total_sql, *params)
    assert total is not None
    return groups, _sums(tuple(total))


EXPORT_FIELDS: tuple[str, ...] = (*(c for c in COLUMNS if c != "cost_nanos"), "cost")


def export_sql(dialect: Dialect, filters: Filters) -> tuple[str, list[Any]]:
    """The export query, oldest first, and its parameters."""
    where, params = filters.where(dialect)
    order = dialect.order(["ts", "request_id"])
    return f"SELECT {', '.join(COLUMNS)} FROM ledger{where} ORDER BY {order}", params


def _export_row(record: Sequence[Any]) -> dict[str, Any]:
    row = dict(zip(COLUMNS, record, strict=True))
    for flag in _FLAGS:
        row[flag] = bool(row[flag])
    row["cost"] = format_nanos(row.pop("cost_nanos"))
    return row


def export_rows(conn: sqlite3.Connection, filters: Filters) -> Iterator[dict[str, Any]]:
    """Every matching row, oldest first, with ``cost`` as a decimal string (SQLite)."""
    sql, params = export_sql(SQLITE, filters)
    for record in conn.execute(sql, params):
        yield _export_row(record)


async def pg_export_rows(conn: PgConnection, filters: Filters) -> AsyncIterator[dict[str, Any]]:
    """:func:`export_rows` on a PostgreSQL ledger, streamed through a server-side cursor."""
    sql, params = export_sql(POSTGRES, filters)
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        async for record in conn.cursor(sql, *params, prefetch=500):
            yield _export_row(tuple(record))
