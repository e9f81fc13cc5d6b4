"""Responses kept in PostgreSQL (asyncpg), shared by every replica.

One table, ``prism_responses``, created when missing.  Expiries are wall
time (every replica's clock, so keep them in sync, as for the ledger).
Expired rows are deleted now and then by a ``put``; a read never returns one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import asyncpg

from prism_proxy import StoredResponse, WallClock, redact_url

__all__ = ["PostgresResponseStore"]

#: One put in this many also deletes what has expired.
PURGE_EVERY = 100

_SCHEMA = """
CREATE TABLE IF NOT EXISTS prism_responses (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS prism_responses_expiry ON prism_responses (expires_at);
"""


class PostgresResponseStore:
    """A :class:`prism_proxy.ResponseStore` in the PostgreSQL database at ``url``."""

    engine = "postgres"

    def __init__(self, url: str, clock: Callable[[], float], ttl_s: float) -> None:
        self._url = url
        self.ttl_s = ttl_s
        self._wall = WallClock(clock)
        self._pool: asyncpg.Pool | None = None
        self._puts = 0

    def __repr__(self) -> str:
        return f"PostgresResponseStore({redact_url(self._url)!r})"

    def now(self) -> float:
        return self._wall()

    async def lifecycle(self) -> AsyncIterator[None]:
        try:
            yield
        finally:
            pool, self._pool = self._pool, None
            if pool is not None:
                await pool.close()

    async def _connected(self) -> asyncpg.Pool:
        # Opened on first use: a database that is down at start-up only fails the calls
        # that need it (503), not the gateway.
        if self._pool is None:
            pool = await asyncpg.create_pool(self._url, min_size=1, max_size=4, timeout=10)
            async with pool.acquire() as connection:
                await connection.execute(_SCHEMA)
            if self._pool is None:
                self._pool = pool
            else:
                await pool.close()
        return self._pool

    async def put(self, stored: StoredResponse) -> None:
        pool = await self._connected()
        self._puts += 1
        async with pool.acquire() as connection:
            await connection.execute(
                "INSERT INTO prism_responses (id, owner, expires_at, data) "
                "VALUES ($1, $2, $3, $4) ON CONFLICT (id) DO UPDATE SET owner = $2, "
                "expires_at = $3, data = $4",
                stored.id,
                stored.owner,
                stored.expires_at,
                stored.to_json().decode(),
            )
            if self._puts % PURGE_EVERY == 0:
                await connection.execute(
                    "DELETE FROM prism_responses WHERE expires_at <= $1", self.now()
                )

    async def get(self, response_id: str, owner: str) -> StoredResponse | None:
        pool = await self._connected()
        row = await pool.fetchrow(
            "SELECT expires_at, data FROM prism_responses "
            "WHERE id = $1 AND owner = $2 AND expires_at > $3",
            response_id,
            owner,
            self.now(),
        )
        if row is None:
            return None
        return StoredResponse.from_json(response_id, owner, row["expires_at"], row["data"])

    async def delete(self, response_id: str, owner: str) -> bool:
        pool = await self._connected()
        status = await pool.execute(
            "DELETE FROM prism_responses WHERE id = $1 AND owner = $2 AND expires_at > $3",
            response_id,
            owner,
            self.now(),
        )
        return str(status) != "DELETE 0"
