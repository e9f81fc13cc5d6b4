"""Reading the ledger: filters, usage totals, and row export.

Shared by ``GET /prism/usage`` and ``prism ledger export``.  Days are UTC;
``since`` is inclusive and ``until`` exclusive.  Costs are summed as integer
nano-units, so totals are exact.
"""

from __future__ import annotations

import datetime
import re
import sqlite3
from collections.abc import Iterator, Sequence
from typing import Any

import attrs

from .prices import format_nanos
from .rows import COLUMNS

__all__ = [
    "DIMENSIONS",
    "TRAFFIC_KINDS",
    "Filters",
    "export_rows",
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

    def where(self) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        params: list[Any] = []
        for clause, value in (
            ("day >= ?", self.since),
            ("day < ?", self.until),
            ("traffic = ?", self.traffic),
            ("key_id = ?", self.key_id),
            ("org = ?", self.org),
            ("model = ?", self.model),
        ):
            if value is not None:
                clauses.append(clause)
                params.append(value)
        return (" WHERE " + " AND ".join(clauses) if clauses else ""), params


_SUMS = (
    "COUNT(*)",
    "COUNT(provider)",
    "COALESCE(SUM(estimated), 0)",
    "COALESCE(SUM(input_tokens), 0)",
    "COALESCE(SUM(cached_input_tokens), 0)",
    "COALESCE(SUM(cache_creation_tokens), 0)",
    "COALESCE(SUM(output_tokens), 0)",
    "COALESCE(SUM(cost_nanos), 0)",
)


def _sums(values: Sequence[Any]) -> dict[str, Any]:
    calls, served, estimated, inp, cached, written, out, cost = values
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


def totals(
    conn: sqlite3.Connection, filters: Filters, group_by: Sequence[str]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Totals per group (in group order), and the grand total of the same rows."""
    where, params = filters.where()
    dims = [DIMENSIONS[name] for name in group_by]
    groups: list[dict[str, Any]] = []
    if dims:
        keys = ", ".join(dims)
        sql = (
            f"SELECT {keys}, {', '.join(_SUMS)} FROM ledger{where} GROUP BY {keys} ORDER BY {keys}"
        )
        for record in conn.execute(sql, params):
            group = dict(zip(group_by, record[: len(dims)], strict=True))
            group.update(_sums(record[len(dims) :]))
            groups.append(group)
    total = conn.execute(f"SELECT {', '.join(_SUMS)} FROM ledger{where}", params).fetchone()
    return groups, _sums(total)


EXPORT_FIELDS: tuple[str, ...] = (*(c for c in COLUMNS if c != "cost_nanos"), "cost")


def export_rows(conn: sqlite3.Connection, filters: Filters) -> Iterator[dict[str, Any]]:
    """Every matching row, oldest first, with ``cost`` as a decimal string."""
    where, params = filters.where()
    sql = f"SELECT {', '.join(COLUMNS)} FROM ledger{where} ORDER BY ts, request_id"
    for record in conn.execute(sql, params):
        row = dict(zip(COLUMNS, record, strict=True))
        for flag in ("stream", "estimated", "unpriced", "usage_suspect"):
            row[flag] = bool(row[flag])
        row["cost"] = format_nanos(row.pop("cost_nanos"))
        yield row
