"""The PostgreSQL ledger (``[prism:billing] ledger_url``): schema, and a group-committing writer.

The same contract as the SQLite ledger (:mod:`.ledger`): ``record`` returns
only once the transaction holding its row has committed; one writer
takes every row queued while the previous commit ran and writes them in one
transaction; a request id is written once (``ON CONFLICT DO NOTHING`` on the
primary key), however many replicas or retries settle it.

When PostgreSQL cannot be reached, ``record`` returns once the row is in the
local spool (:mod:`.spool`) instead, and every row after it goes there too
until a background task has replayed the spool into PostgreSQL, in order; the
ledger is then written directly again.  Without a spool, or with one that
cannot take rows, such a batch fails, and :meth:`PostgresLedgerWriter.can_take`
tells the admission check to refuse calls until the ledger is back.  A row
PostgreSQL refuses (a value out of range) fails its batch as before: that is
not an outage, and spooling it would only stall the replay.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from prism_proxy import redact_url

from .ledger import GroupCommit
from .queries import PgConnection
from .rows import COLUMNS, LedgerRow
from .spool import Spool

__all__ = [
    "OUTAGE_ERRORS",
    "PG_SCHEMA_VERSION",
    "LedgerUnavailable",
    "PostgresLedgerWriter",
    "ensure_schema",
]

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


#: PostgreSQL cannot be reached now (refused, cut, timed out, shutting down, out of
#: connections), as opposed to refusing a row: the rows go to the spool and are retried.
OUTAGE_ERRORS: tuple[type[Exception], ...] = (
    OSError,
    TimeoutError,
    asyncpg.InterfaceError,
    # A connection cut mid-statement can leave asyncpg's protocol in a state it reports so.
    asyncpg.InternalClientError,
    asyncpg.PostgresConnectionError,
    asyncpg.OperatorInterventionError,
    asyncpg.InsufficientResourcesError,
    asyncpg.ObjectNotInPrerequisiteStateError,
)


class SchemaTooNew(Exception):
    """The database holds a ledger schema newer than this prism-billing understands."""


class LedgerUnavailable(Exception):
    """Neither PostgreSQL nor the spool could take a row."""


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
        min_size: int = 0,
        max_size: int = 4,
        timeout_s: float = 10.0,
        spool: Spool | None = None,
        retry_s: float = 1.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        super().__init__(redact_url(url), max_batch_rows=max_batch_rows, counters=counters)
        self.url = url
        self._min_size = min_size
        self._max_size = max_size
        #: Seconds to wait for a connection, or for one statement.
        self.timeout_s = timeout_s
        self.pool: asyncpg.Pool | None = None
        #: Where rows go while PostgreSQL cannot take them (None: such rows fail).
        self.spool = spool
        #: Rows go straight to PostgreSQL; false from a failure until the spool is replayed.
        self.direct = True
        #: Why PostgreSQL was last found unreachable (for log lines and errors).
        self.trouble = ""
        #: Seconds between tries to reach PostgreSQL (and replay) while it is away.
        self.retry_s = retry_s
        self._sleep = sleep
        self._away = asyncio.Event()
        self._keeper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Open the spool and the pool, create or migrate the schema; raises if PostgreSQL says no.

        With a spool, PostgreSQL being unreachable does not stop start-up: the
        gateway serves on the spool and replays it once PostgreSQL answers (a
        refusal, such as a wrong password or a missing database, still stops it).
        """
        if self.spool is not None:
            await self.spool.open()
        try:
            await self._open()
        except OUTAGE_ERRORS as exc:
            if self.spool is None:
                raise
            self._went_away(exc)
        if self.spool is not None and self.spool.depth:
            # Rows a previous process spooled: replayed before any row of ours, in order.
            log.warning(
                "spool %s holds %d rows: replaying them into the ledger %s",
                self.spool.path,
                self.spool.depth,
                self.name,
            )
            self.direct = False
            self._away.set()
        self._begin()
        self._keeper = asyncio.create_task(self._keep_up(), name="prism-billing-pg-replay")

    async def _open(self) -> None:
        pool = await asyncpg.create_pool(
            self.url,
            min_size=self._min_size,
            max_size=self._max_size,
            timeout=self.timeout_s,
            command_timeout=self.timeout_s,
        )
        try:
            async with pool.acquire(timeout=self.timeout_s) as conn:
                before = await ensure_schema(conn)
        except BaseException:
            pool.terminate()
            raise
        self.pool = pool
        if before == 0:
            log.info("ledger %s: schema %d created", self.name, PG_SCHEMA_VERSION)

    async def close(self) -> None:
        """Write everything queued (into PostgreSQL or the spool), then close the pool."""
        await self._drain()
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
        if self.spool is not None:
            if self.spool.depth:
                log.warning(
                    "spool %s keeps %d rows: the next spool opened or replayed beside it "
                    "takes them in",
                    self.spool.path,
                    self.spool.depth,
                )
            await self.spool.close()
        if self.pool is not None:
            try:
                await asyncio.wait_for(self.pool.close(), self.timeout_s)
            except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                self.pool.terminate()

    def can_take(self) -> bool:
        """Whether a row settled now would be kept: by PostgreSQL, or else by the spool."""
        return self.direct or (self.spool is not None and self.spool.can_take())

    def report(self) -> dict[str, object]:
        """The ledger's state for ``/readyz``: no names, no paths, no reasons (those are logged)."""
        spool = self.spool
        state = "ok" if self.direct else "spooling" if self.can_take() else "refusing"
        facts: dict[str, object] = {"state": state}
        if spool is not None:
            facts["spool"] = spool.state()
            facts["spool_depth"] = spool.depth
            facts["spool_bytes"] = spool.size
            facts["rows_spooled"] = self.counters["billing_spooled"]
            facts["rows_replayed"] = self.counters["billing_replayed"]
        return facts

    async def _write(self, rows: list[LedgerRow]) -> int:
        """One transaction for the whole batch; returns how many rows were new.

        Rows PostgreSQL cannot be reached for go to the spool (and count 0 here).
        """
        if self.direct:
            try:
                return await self._insert(rows)
            except OUTAGE_ERRORS as exc:
                self._went_away(exc)
        spool = self.spool
        if spool is None:
            raise LedgerUnavailable(f"ledger {self.name} is unreachable ({self.trouble})")
        try:
            await spool.append(rows)
        except OSError:
            raise LedgerUnavailable(
                f"ledger {self.name} is unreachable ({self.trouble}) and {spool.why_not()}"
            ) from None
        self.counters["billing_spooled"] += len(rows)
        return 0

    async def _insert(self, rows: list[LedgerRow]) -> int:
        if self.pool is None:
            await self._open()  # PostgreSQL was away when the gateway started
        assert self.pool is not None
        async with self.pool.acquire(timeout=self.timeout_s) as conn:
            async with conn.transaction():
                status = await conn.execute(_INSERT, *_columns(rows))
        return int(status.rsplit(" ", 1)[-1])

    def _went_away(self, exc: BaseException) -> None:
        self.trouble = f"{type(exc).__name__}: {exc}"
        if self.direct:
            then = f"spooling rows to {self.spool.path}" if self.spool else "refusing calls"
            log.warning(
                "ledger %s unreachable (%s): %s until it is back", self.name, self.trouble, then
            )
        self.direct = False
        self._away.set()

    async def _keep_up(self) -> None:
        """While PostgreSQL is away: try it every ``retry_s``, replay the spool, go direct."""
        while True:
            await self._away.wait()
            try:
                await self._catch_up()
            except OUTAGE_ERRORS as exc:
                self.trouble = f"{type(exc).__name__}: {exc}"
            except (asyncpg.PostgresError, SchemaTooNew) as exc:
                # Reachable but refusing (a role without rights, a newer schema): an
                # operator's to fix; keep spooling and keep asking.
                self.trouble = f"{type(exc).__name__}: {exc}"
                log.error("ledger %s refuses the replay: %s", self.name, self.trouble)
            except Exception:
                # A bug must not leave the gateway spooling for good: log it, try again.
                log.exception("ledger %s: the replay failed", self.name)
            if not self.direct:
                if self.spool is not None:
                    await self.spool.probe()
                await self._sleep(self.retry_s)

    async def _catch_up(self) -> None:
        """Replay the whole spool in order; once it is empty, rows go to PostgreSQL again."""
        if self.pool is None:
            await self._open()
        assert self.pool is not None
        spool = self.spool
        if spool is None:
            async with self.pool.acquire(timeout=self.timeout_s) as conn:
                await conn.fetchval("SELECT 1")
        else:
            await spool.adopt()
            replayed = 0
            while True:
                rows, offset = await spool.read(self._max_batch)
                if rows or offset != spool.replayed_to:
                    added = await self._replay(rows)
                    spool.replayed(len(rows), offset)
                    replayed += len(rows)
                    self.counters["billing_replayed"] += len(rows)
                    self.counters["billing_rows"] += added
                    continue
                # Empty only when nothing was appended since the last read; rows
                # still on their way to the file come round again.
                if await spool.empty_if_replayed() and not spool.pending and not spool.size:
                    break
            if replayed:
                log.info("ledger %s: %d spooled rows replayed", self.name, replayed)
            # A spool that failed while PostgreSQL was away may be fixed by now: the next
            # outage should find it taking rows, not refuse calls.
            await spool.probe()
        if not self.direct:
            log.info("ledger %s is back: writing to it directly", self.name)
        self.direct = True
        self._away.clear()

    async def _replay(self, rows: list[LedgerRow]) -> int:
        """Insert spooled rows; a row PostgreSQL refuses is set aside, not retried forever."""
        if not rows:
            return 0
        try:
            return await self._insert(rows)
        except OUTAGE_ERRORS:
            raise
        except asyncpg.PostgresError:
            pass  # one of them is refused: find it
        added = 0
        for row in rows:
            try:
                added += await self._insert([row])
            except OUTAGE_ERRORS:
                raise
            except asyncpg.PostgresError as exc:
                assert self.spool is not None
                await self.spool.reject(row)
                self.counters["billing_spool_rejected"] += 1
                log.error(
                    "ledger %s refused spooled row %s (%s: %s): kept in %s",
                    self.name,
                    row.request_id,
                    type(exc).__name__,
                    exc,
                    self.spool.rejected_path,
                )
        return added
