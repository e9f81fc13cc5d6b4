"""One transaction on the key database, the same way on SQLite and PostgreSQL, for administration.

Administrative writes are rare and small, so each runs on a connection of
its own, opened for it and closed after: no pool to size, nothing to close
at shutdown.  SQL is written once with ``?`` placeholders and ``{table}``
names; the PostgreSQL side numbers the placeholders and prefixes the
tables.  Every write that changes what gateways hold bumps the revision in
the same transaction (PostgreSQL also NOTIFYs), as the CLI's writes do.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol

import asyncpg
import attrs

from .pg_store import CHANNEL, ensure_schema
from .settings import KeysSettings
from .store import _ensure_schema, _new_connection

__all__ = ["AdminDb", "Tx"]

_TABLES = ("orgs", "keys", "org_settings", "key_settings", "audit", "revision")
_TIMEOUT_S = 10.0
_PLACEHOLDER = re.compile(r"\?")


class Tx(Protocol):
    """One open transaction: it commits when the block ends, rolls back on an error."""

    async def execute(self, sql: str, *params: Any) -> int:
        """Run one statement; the number of rows it changed."""
        ...

    async def fetch(self, sql: str, *params: Any) -> list[tuple[Any, ...]]: ...

    async def bump(self) -> None:
        """Tell gateways something they hold changed (the revision, in this transaction)."""
        ...


@attrs.define(eq=False)
class _SqliteTx:
    conn: sqlite3.Connection

    async def execute(self, sql: str, *params: Any) -> int:
        cursor = await asyncio.to_thread(self.conn.execute, _sqlite(sql), params)
        return int(cursor.rowcount)

    async def fetch(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        def run() -> list[tuple[Any, ...]]:
            return [tuple(r) for r in self.conn.execute(_sqlite(sql), params).fetchall()]

        return await asyncio.to_thread(run)

    async def bump(self) -> None:
        await self.execute("UPDATE {revision} SET value = value + 1 WHERE id = 1")


@attrs.define(eq=False)
class _PgTx:
    conn: Any

    async def execute(self, sql: str, *params: Any) -> int:
        status: str = await self.conn.execute(_pg(sql), *params)
        last = status.rsplit(" ", 1)[-1]
        return int(last) if last.isdigit() else 0

    async def fetch(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in await self.conn.fetch(_pg(sql), *params)]

    async def bump(self) -> None:
        value = await self.conn.fetchval(
            "UPDATE prism_keys_revision SET value = value + 1 RETURNING value"
        )
        await self.conn.execute("SELECT pg_notify($1, $2)", CHANNEL, str(value))


def _sqlite(sql: str) -> str:
    return sql.format(**{name: name for name in _TABLES})


def _pg(sql: str) -> str:
    numbers = iter(range(1, 1000))
    named = sql.format(**{name: f"prism_keys_{name}" for name in _TABLES})
    return _PLACEHOLDER.sub(lambda _: f"${next(numbers)}", named)


@attrs.define(eq=False)
class AdminDb:
    """Transactions on the key database ``settings`` names."""

    settings: KeysSettings
    #: Whether the schema is known to be current (the key ring's lifecycle checked it).
    checked: bool = False

    @property
    def engine(self) -> str:
        return "postgresql" if self.settings.db_url is not None else "sqlite"

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Tx]:
        if self.settings.db_url is not None:
            async with self._pg() as tx:
                yield tx
        else:
            assert self.settings.db_path is not None
            async with self._sqlite(self.settings.db_path) as stx:
                yield stx

    @contextlib.asynccontextmanager
    async def _pg(self) -> AsyncIterator[Tx]:
        assert self.settings.db_url is not None
        conn = await asyncpg.connect(
            self.settings.db_url, timeout=_TIMEOUT_S, command_timeout=_TIMEOUT_S
        )
        try:
            if not self.checked:
                await ensure_schema(conn)
                self.checked = True
            async with conn.transaction():
                yield _PgTx(conn)
        finally:
            await conn.close()

    @contextlib.asynccontextmanager
    async def _sqlite(self, path: Path) -> AsyncIterator[Tx]:
        def connect() -> sqlite3.Connection:
            conn = _new_connection(path, shared=True)
            try:
                if not self.checked:
                    with conn:
                        _ensure_schema(conn, path)
                conn.execute("BEGIN IMMEDIATE")  # writers queue here, not at COMMIT
            except BaseException:
                conn.close()
                raise
            return conn

        conn = await asyncio.to_thread(connect)
        self.checked = True
        try:
            yield _SqliteTx(conn)
            await asyncio.to_thread(conn.commit)
        except BaseException:
            await asyncio.to_thread(conn.rollback)
            raise
        finally:
            await asyncio.to_thread(conn.close)
