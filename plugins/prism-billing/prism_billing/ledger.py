"""The SQLite ledger: schema, and one writer that group-commits rows.

Every row a call hands in is queued; one writer task takes everything queued
while the previous commit ran and writes it in one transaction, so concurrent
calls share one fsync.  ``record`` returns only once its row's transaction is
durable (WAL with ``synchronous=FULL`` by default), which is what lets the
core hold a response until its row exists.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from prism_proxy import Generation, Telemetry

from .rows import COLUMNS, LedgerRow

__all__ = [
    "SCHEMA_VERSION",
    "GroupCommit",
    "LedgerClosed",
    "LedgerWriter",
    "connect",
    "open_for_reading",
]

SCHEMA_VERSION = 3
_SCHEMA = """
CREATE TABLE IF NOT EXISTS ledger (
    request_id TEXT NOT NULL PRIMARY KEY,
    ts TEXT NOT NULL,
    day TEXT NOT NULL,
    key_id TEXT,
    org TEXT,
    model TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    stream INTEGER NOT NULL,
    traffic TEXT NOT NULL,
    outcome TEXT NOT NULL,
    status INTEGER NOT NULL,
    error_code TEXT,
    provider TEXT,
    upstream_model TEXT,
    input_tokens INTEGER NOT NULL,
    cached_input_tokens INTEGER NOT NULL,
    cache_creation_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    estimated INTEGER NOT NULL,
    unpriced INTEGER NOT NULL,
    cost_nanos INTEGER NOT NULL,
    attempts INTEGER NOT NULL,
    duration_ms INTEGER NOT NULL,
    usage_suspect INTEGER NOT NULL DEFAULT 0,
    region TEXT
);
CREATE INDEX IF NOT EXISTS ledger_by_day ON ledger (traffic, day);
"""
#: Columns that may hold NULL: their rows bind '' for None (see ``_insert``).
_NULLABLE = frozenset(
    line.split()[0]
    for line in _SCHEMA.splitlines()
    if line.startswith("    ") and "NOT NULL" not in line
)
_VALUES = "(" + ", ".join("NULLIF(?, '')" if c in _NULLABLE else "?" for c in COLUMNS) + ")"
_INSERT = f"INSERT OR IGNORE INTO ledger ({', '.join(COLUMNS)}) VALUES {_VALUES}"
_BUSY_TIMEOUT_MS = 5000


class LedgerClosed(Exception):
    """A row arrived after the ledger was closed (the gateway is stopping)."""


def connect(path: Path, *, synchronous: str = "FULL") -> sqlite3.Connection:
    """Open (creating if needed) the ledger in WAL mode with the schema in place."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise sqlite3.OperationalError(f"{path}: cannot switch to WAL mode (got {mode})")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise sqlite3.DatabaseError(
                f"{path}: ledger schema {version} is newer than this prism-billing "
                f"understands ({SCHEMA_VERSION})"
            )
        conn.executescript(_SCHEMA)
        if 0 < version < 2:
            # Version 1 predates the usage_suspect flag: old rows were never flagged.
            conn.execute("ALTER TABLE ledger ADD COLUMN usage_suspect INTEGER NOT NULL DEFAULT 0")
        if 0 < version < 3:
            # Version 2 predates regions: old rows name none.
            conn.execute("ALTER TABLE ledger ADD COLUMN region TEXT")
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    except BaseException:
        conn.close()
        raise
    return conn


def open_for_reading(path: Path) -> sqlite3.Connection:
    """A connection for queries; it never creates a ledger that is not there."""
    if not path.is_file():
        raise FileNotFoundError(f"no ledger at {path}")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA query_only = ON")
    return conn


def _write(conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> int:
    """One transaction for the whole batch; returns how many rows were new.

    A batch that fits one statement is one multi-row INSERT in autocommit: a
    statement is its own transaction, durable when it returns.  It is also one
    trip into SQLite, so this thread gives the interpreter lock back once while
    SQLite writes and syncs, and needs it back once: under load every time it
    waits for the lock is a wait behind the event loop, up to a switch interval.
    """
    before = conn.total_changes
    per_statement = max(1, conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // len(COLUMNS))
    chunks = [rows[start : start + per_statement] for start in range(0, len(rows), per_statement)]
    if len(chunks) == 1:
        _insert(conn, chunks[0])
        return conn.total_changes - before
    conn.execute("BEGIN IMMEDIATE")
    try:
        for chunk in chunks:
            _insert(conn, chunk)
        conn.execute("COMMIT")
    except BaseException:
        # A failed COMMIT (disk full) can leave the transaction open; the next
        # batch must start clean.
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return conn.total_changes - before


#: What a row's None and bools are bound as. Python's sqlite3 binds only exact
#: int, float, str and bytes directly; None and bool go through its adaptation
#: protocol, whose failed lookups cost more than the rest of a value's binding
#: (about 16k instructions a row, with the interpreter lock held).
_BINDABLE: dict[Any, Any] = {None: "", True: 1, False: 0}


def _insert(conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
    """One multi-row INSERT of ``rows``."""
    sql = _INSERT + ", " * (len(rows) > 1) + ", ".join([_VALUES] * (len(rows) - 1))
    bindable = _BINDABLE
    # '' becomes NULL again in the statement (NULLIF), in the columns that may
    # hold NULL; none of them ever holds ''.
    conn.execute(
        sql,
        [
            bindable[value] if value is None or value.__class__ is bool else value
            for row in rows
            for value in row
        ],
    )


class GroupCommit(abc.ABC):
    """Rows queued by calls, written by one task in batches: group commit.

    Rows queued while a commit runs go into the next transaction together,
    so concurrent calls share one commit; ``record`` returns only once its
    row's transaction is durable.  A failed commit fails exactly the rows of
    its batch and leaves the writer ready for the next.  Subclasses say how
    a batch is written (:meth:`_write`) and when the writer starts.
    """

    def __init__(
        self, name: str, *, max_batch_rows: int, counters: collections.Counter[str] | None
    ) -> None:
        #: The ledger as it may be logged (a path, or a URL without its password).
        self.name = name
        #: Where commit times go (each generation hands its own; they share one exporter).
        self.telemetry = Telemetry()
        self._max_batch = max_batch_rows
        self.counters: collections.Counter[str] = (
            counters if counters is not None else collections.Counter()
        )
        self._queue: collections.deque[tuple[LedgerRow, asyncio.Future[None]]] = collections.deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        #: With more calls in flight than rows queued, a commit waits this long for
        #: their rows (PostgreSQL's ``commit_delay``): one fsync for more calls.
        self.commit_delay_s = 0.0
        self._calls_in_flight: Callable[[], int] = lambda: 0
        #: While a commit waits for more rows: done once every call in flight has queued one.
        self._enough: asyncio.Future[None] | None = None

    def serve(self, generation: Generation, commit_delay_s: float) -> None:
        """Write for ``generation`` now: its telemetry, its calls in flight, its delay."""
        self.telemetry = generation.telemetry
        self.commit_delay_s = commit_delay_s
        self._calls_in_flight = lambda: generation.in_flight

    @abc.abstractmethod
    async def _write(self, rows: list[LedgerRow]) -> int:
        """One transaction for the whole batch; returns how many rows were new."""

    def _begin(self, task_name: str) -> None:
        self._task = asyncio.create_task(self._run(), name=task_name)

    def record(self, row: LedgerRow) -> asyncio.Future[None]:
        """Queue ``row``; the future is done once the transaction holding it is committed.

        A plain future, not a coroutine: a call's settling waits on it without
        a task of its own (it fails with :class:`LedgerClosed` once closed).
        """
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._closing or self._task is None:
            future.set_exception(
                LedgerClosed(f"ledger closed; row for {row.request_id} not written")
            )
            return future
        queue = self._queue
        queue.append((row, future))
        self._wake.set()
        enough = self._enough
        if (
            enough is not None
            and not enough.done()  # the delay may have run out before the writer resumed
            and len(queue) >= min(self._max_batch, self._calls_in_flight())
        ):
            # Nothing else is on its way: waiting longer would only leave the CPU idle.
            enough.set_result(None)
        return future

    async def _drain(self) -> None:
        """Write everything queued, then stop the writing task."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task

    async def _gather(self) -> None:
        """Wait up to ``commit_delay_s`` for the rows of the calls in flight, no longer."""
        loop = asyncio.get_running_loop()
        enough = self._enough = loop.create_future()
        timer = loop.call_later(self.commit_delay_s, _set_once, enough)
        try:
            await enough
        finally:
            timer.cancel()
            self._enough = None

    async def _run(self) -> None:
        batch: list[tuple[LedgerRow, asyncio.Future[None]]] = []
        try:
            while True:
                if not self._queue:
                    if self._closing:
                        return
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                if (
                    self.commit_delay_s
                    and not self._closing
                    and len(self._queue) < min(self._max_batch, self._calls_in_flight())
                ):
                    # Other calls are on their way to settling: their rows share this commit.
                    await self._gather()
                take = min(len(self._queue), self._max_batch)
                batch = [self._queue.popleft() for _ in range(take)]
                started = time.perf_counter()
                try:
                    added = await self._write([row for row, _ in batch])
                except Exception as exc:
                    # The store gone, a connection cut, a full disk, a value out of
                    # range: these rows were not committed, and their callers are told
                    # so (the core logs each failed settlement, one line per call).
                    self.counters["billing_write_errors"] += 1
                    _settle_all(batch, exc)
                    continue
                self.counters["billing_commits"] += 1
                self.counters["billing_rows"] += added
                self.telemetry.observe("prism_ledger_commit_seconds", time.perf_counter() - started)
                _settle_all(batch, None)
        finally:
            # Never leave a caller waiting on a commit that will not happen.
            stopped = LedgerClosed("ledger writer stopped")
            _settle_all(batch, stopped)
            _settle_all(list(self._queue), stopped)
            self._queue.clear()


class LedgerWriter(GroupCommit):
    """The SQLite ledger's only writer: one thread owns the connection, one task feeds it."""

    def __init__(
        self,
        path: Path,
        *,
        synchronous: str = "FULL",
        max_batch_rows: int = 1000,
        counters: collections.Counter[str] | None = None,
    ) -> None:
        super().__init__(str(path), max_batch_rows=max_batch_rows, counters=counters)
        self.path = path
        self._synchronous = synchronous
        # One thread: sqlite3 connections belong to the thread that made them.
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="prism-billing-ledger")
        self._conn: sqlite3.Connection | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._conn = await loop.run_in_executor(
            self._executor, lambda: connect(self.path, synchronous=self._synchronous)
        )
        self._begin("prism-billing-ledger")

    async def close(self) -> None:
        """Write everything queued, then close the connection and its thread."""
        await self._drain()
        conn = self._conn
        if conn is not None:
            await asyncio.get_running_loop().run_in_executor(self._executor, conn.close)
        self._executor.shutdown(wait=True)

    async def _write(self, rows: list[LedgerRow]) -> int:
        conn = self._conn
        assert conn is not None
        tuples = [row.as_tuple() for row in rows]
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, _write, conn, tuples
        )


def _set_once(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _settle_all(
    batch: list[tuple[LedgerRow, asyncio.Future[None]]], error: BaseException | None
) -> None:
    for _, future in batch:
        if future.done():
            continue
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)
