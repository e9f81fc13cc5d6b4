"""The PostgreSQL ledger (``[prism:billing] ledger_url``): schema, and a group-committing writer.

The same contract as the SQLite ledger (:mod:`.ledger`): ``record`` returns
only once the transaction holding its row has committed; one writer task
takes every row queued while the previous commit ran and writes them in one
transaction; a request id is written once (``ON CONFLICT DO NOTHING`` on the
primary key), however many replicas or retries settle it.  A failed commit
fails exactly the rows of its batch; the next batch gets a fresh try (the
pool replaces broken connections), so billing resumes when PostgreSQL does.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Any

import asyncpg

from prism_proxy import redact_url

from .ledger import GroupCommit
from .queries import PgConnection
from .rows import COLUMNS, LedgerRow

__all__ = ["PG_SCHEMA_VERSION", "PostgresLedgerWriter", "ensure_schema"]

log = logging.getLogger("prism.billing")

#: Bump with a migration step in :func:`ensure_schema` when the table changes.
PG_SCHEMA_VERSION = 1

#: Each column's PostgreSQL type.  Timestamps stay ISO 8601 text, as in the
#: SQLite ledger, so queries and exports read the same strings from both.
PG_TYPES: dict[str, str] = {
    "request_id": "TEXT",
    "ts": "TEXT",
    "day": "TEXT",
    "key_id": "TEXT",
    "org": "TEXT",
    "model": "TEXT",
    "endpoint": "TEXT",
    "stream": "BOOLEAN",
    "traffic": "TEXT",
    "outcome": "TEXT",
    "status": "INTEGER",
    "error_code": "TEXT",
    "provider": "TEXT",
    "upstream_model": "TEXT",
    "input_tokens": "BIGINT",
    "cached_input_tokens": "BIGINT",
    "cache_creation_tokens": "BIGINT",
    "output_tokens": "BIGINT",
    "estimated": "BOOLEAN",
    "unpriced": "BOOLEAN",
    "cost_nanos": "BIGINT",
    "attempts": "INTEGER",
    "duration_ms": "BIGINT",
    "usage_suspect": "BOOLEAN",
    "region": "TEXT",
}
_NULLABLE = frozenset({"key_id", "org", "error_code", "provider", "upstream_model", "region"})
assert tuple(PG_TYPES) == COLUMNS, "PG_TYPES must list COLUMNS in order"

_COLUMN_DEFS = ",\n    ".join(
    f"{name} {kind}"
    + (" PRIMARY KEY" if name == "request_id" else "")
    + ("" if name in _NULLABLE else " NOT NULL")
    for name, kind in PG_TYPES.items()
)
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS prism_ledger_schema (
    only_row BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (only_row),
    version INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS ledger (
    {_COLUMN_DEFS}
);
CREATE INDEX IF NOT EXISTS ledger_by_day ON ledger (traffic, day);
"""
#: Any advisory-lock key will do, as long as every replica uses the same one.
_SCHEMA_LOCK = 0x70726973_6D6C6467  # "prismldg"
# One statement for the whole batch: parallel arrays, unnested into rows.  The
# status ("INSERT 0 n") says how many were new; duplicates are skipped.
_ARRAYS = ", ".join(f"${i}::{PG_TYPES[c]}[]" for i, c in enumerate(COLUMNS, 1))
_INSERT = (
    f"INSERT INTO ledger ({', '.join(COLUMNS)}) "
    f"SELECT * FROM unnest({_ARRAYS}) "
    "ON CONFLICT (request_id) DO NOTHING"
)


class SchemaTooNew(Exception):
    """The database holds a ledger schema newer than this prism-billing understands."""


async def ensure_schema(conn: PgConnection) -> int:
    """Create (or migrate) the ledger schema; returns the version found before (0: fresh).

    Serialised with an advisory lock, so replicas starting together do not race.
    """
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _SCHEMA_LOCK)
        await conn.execute(_SCHEMA)
        found = await conn.fetchval("SELECT version FROM prism_ledger_schema")
        version = int(found) if found is not None else 0
        if version > PG_SCHEMA_VERSION:
            raise SchemaTooNew(
                f"ledger schema {version} is newer than this prism-billing "
                f"understands ({PG_SCHEMA_VERSION})"
            )
        # Migrations from older versions go here, one step per version.
        if version == 0:
            await conn.execute(
                "INSERT INTO prism_ledger_schema (version) VALUES ($1)", PG_SCHEMA_VERSION
            )
        elif version < PG_SCHEMA_VERSION:
            await conn.execute("UPDATE prism_ledger_schema SET version = $1", PG_SCHEMA_VERSION)
    return version


def _columns(rows: list[LedgerRow]) -> list[list[Any]]:
    """The batch as one array per column, for ``unnest``."""
    tuples = [row.as_tuple() for row in rows]
    return [[values[i] for values in tuples] for i in range(len(COLUMNS))]


class PostgresLedgerWriter(GroupCommit):
    """The PostgreSQL ledger's writer in this process: a small pool, one commit at a time."""

    def __init__(
        self,
        url: str,
        *,
        max_batch_rows: int = 1000,
        counters: collections.Counter[str] | None = None,
        min_size: int = 1,
        max_size: int = 4,
        timeout_s: float = 10.0,
    ) -> None:
        super().__init__(redact_url(url), max_batch_rows=max_batch_rows, counters=counters)
        self.url = url
        self._min_size = min_size
        self._max_size = max_size
        #: Seconds to wait for a connection, or for one statement.
        self.timeout_s = timeout_s
        self.pool: asyncpg.Pool | None = None

    async def start(self) -> None:
        """Open the pool and create or migrate the schema; raises if PostgreSQL says no."""
        self.pool = await asyncpg.create_pool(
            self.url,
            min_size=self._min_size,
            max_size=self._max_size,
            timeout=self.timeout_s,
            command_timeout=self.timeout_s,
        )
        async with self.pool.acquire(timeout=self.timeout_s) as conn:
            before = await ensure_schema(conn)
        if before == 0:
            log.info("ledger %s: schema %d created", self.name, PG_SCHEMA_VERSION)
        self._begin("prism-billing-pg-ledger")

    async def close(self) -> None:
        """Write everything queued, then close the pool."""
        await self._drain()
        if self.pool is not None:
            try:
                await asyncio.wait_for(self.pool.close(), self.timeout_s)
            except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                self.pool.terminate()

    async def _write(self, rows: list[LedgerRow]) -> int:
        """One transaction for the whole batch; returns how many rows were new."""
        assert self.pool is not None
        async with self.pool.acquire(timeout=self.timeout_s) as conn:
            async with conn.transaction():
                status = await conn.execute(_INSERT, *_columns(rows))
        return int(status.rsplit(" ", 1)[-1])
