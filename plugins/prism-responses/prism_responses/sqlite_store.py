"""Responses kept in one SQLite file (stdlib ``sqlite3``), for one machine.

Calls run in a worker thread (``asyncio.to_thread``) on one connection,
serialised by a lock, so the event loop never waits on the disk.  WAL mode
lets several workers of one machine share the file.  Expired rows are
deleted now and then by a ``put`` (a read never returns one).
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TypeVar

from prism_proxy import StoredResponse, WallClock

__all__ = ["SqliteResponseStore"]

T = TypeVar("T")
#: One put in this many also deletes what has expired.
PURGE_EVERY = 100

_SCHEMA = """
CREATE TABLE IF NOT EXISTS prism_responses (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    expires_at REAL NOT NULL,
    data BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS prism_responses_expiry ON prism_responses (expires_at);
"""


class SqliteResponseStore:
    """A :class:`prism_proxy.ResponseStore` in the SQLite file ``path``."""

    engine = "sqlite"

    def __init__(self, path: Path, clock: Callable[[], float], ttl_s: float) -> None:
        self.path = path
        self.ttl_s = ttl_s
        self._wall = WallClock(clock)
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._puts = 0

    def now(self) -> float:
        return self._wall()

    async def lifecycle(self) -> AsyncIterator[None]:
        await asyncio.to_thread(self._open)
        try:
            yield
        finally:
            db, self._db = self._db, None
            if db is not None:
                await asyncio.to_thread(db.close)

    def _open(self) -> None:
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA busy_timeout=5000")
        db.executescript(_SCHEMA)
        self._db = db

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        def locked() -> T:
            with self._lock:
                if self._db is None:
                    # Used by a generation that was never started (a command line): open now.
                    self._open()
                assert self._db is not None
                return work(self._db)

        return await asyncio.to_thread(locked)

    async def put(self, stored: StoredResponse) -> None:
        self._puts += 1
        purge = self._puts % PURGE_EVERY == 0
        now = self.now()
        data = stored.to_json()

        def write(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT OR REPLACE INTO prism_responses (id, owner, expires_at, data) "
                "VALUES (?, ?, ?, ?)",
                (stored.id, stored.owner, stored.expires_at, data),
            )
            if purge:
                db.execute("DELETE FROM prism_responses WHERE expires_at <= ?", (now,))

        await self._run(write)

    async def get(self, response_id: str, owner: str) -> StoredResponse | None:
        now = self.now()

        def read(db: sqlite3.Connection) -> tuple[float, bytes] | None:
            row = db.execute(
                "SELECT expires_at, data FROM prism_responses "
                "WHERE id = ? AND owner = ? AND expires_at > ?",
                (response_id, owner, now),
            ).fetchone()
            return None if row is None else (float(row[0]), bytes(row[1]))

        found = await self._run(read)
        if found is None:
            return None
        return StoredResponse.from_json(response_id, owner, found[0], found[1])

    async def delete(self, response_id: str, owner: str) -> bool:
        now = self.now()

        def remove(db: sqlite3.Connection) -> bool:
            cursor = db.execute(
                "DELETE FROM prism_responses WHERE id = ? AND owner = ? AND expires_at > ?",
                (response_id, owner, now),
            )
            return cursor.rowcount > 0

        return await self._run(remove)
