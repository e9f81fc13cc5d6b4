"""The SQLite ledger: schema, and one writer that group-commits rows.

Every row a call hands in is queued; the writer takes everything queued
while the previous commit ran and writes it in one transaction, so concurrent
calls share one fsync.  ``record`` returns only once its row's transaction is
durable (WAL with ``synchronous=FULL`` by default), which is what lets the
core hold a response until its row exists.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
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


class GroupCommit:
    """Rows queued by calls, written in batches, one batch at a time: group commit.

    Rows queued while a commit runs go into the next transaction together,
    so concurrent calls share one commit; ``record`` returns only once its
    row's transaction is durable.  A failed commit fails exactly the rows of
    its batch and leaves the writer ready for the next.  Subclasses say how
    a batch is written (:meth:`_write` or :meth:`_submit`) and when the writer
    starts.

    No task runs the writer: ``record`` and each commit's outcome drive it,
    and a timer is armed only while a commit waits for more rows.  A task woken
    through an event, plus a future and a timer for every wait, cost more per
    commit than SQLite's own work on a batch.
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
        self._started = False
        self._closing = False
        #: With more calls in flight than rows queued, a commit waits this long for
        #: their rows (PostgreSQL's ``commit_delay``): one fsync for more calls.
        self.commit_delay_s = 0.0
        self._calls_in_flight: Callable[[], int] = lambda: 0
        #: The next commit's start, scheduled (or its delay's timer, while ``_waiting``).
        self._pending: asyncio.Handle | None = None
        #: Whether the next commit waits for the rows of the calls in flight.
        self._waiting = False
        #: The batch being committed (empty: none), and when its commit began.
        self._batch: list[tuple[LedgerRow, asyncio.Future[None]]] = []
        self._began = 0.0
        #: Done once closing has written everything queued.
        self._drained: asyncio.Future[None] | None = None

    def serve(self, generation: Generation, commit_delay_s: float) -> None:
        """Write for ``generation`` now: its telemetry, its calls in flight, its delay."""
        self.telemetry = generation.telemetry
        self.commit_delay_s = commit_delay_s
        self._calls_in_flight = lambda: generation.in_flight

    async def _write(self, rows: list[LedgerRow]) -> int:
        """One transaction for the whole batch; returns how many rows were new."""
        raise NotImplementedError

    def _submit(
        self, rows: list[LedgerRow], done: Callable[[int, BaseException | None], None]
    ) -> None:
        """Start writing ``rows``; ``done`` gets, on the loop, rows added or the error."""
        task = asyncio.get_running_loop().create_task(self._write(rows))
        task.add_done_callback(lambda task: _task_outcome(task, done))

    def _begin(self) -> None:
        """Take rows from now on."""
        self._started = True

    def record(self, row: LedgerRow) -> asyncio.Future[None]:
        """Queue ``row``; the future is done once the transaction holding it is committed.

        A plain future, not a coroutine: a call's settling waits on it without
        a task of its own (it fails with :class:`LedgerClosed` once closed).
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        if self._closing or not self._started:
            future.set_exception(
                LedgerClosed(f"ledger closed; row for {row.request_id} not written")
            )
            return future
        queue = self._queue
        queue.append((row, future))
        if self._batch:
            pass  # the commit's outcome takes the rows queued meanwhile
        elif self._pending is None:
            self._schedule(loop, now=False)
        elif self._waiting and len(queue) >= min(self._max_batch, self._calls_in_flight()):
            # Nothing else is on its way: waiting longer would only leave the CPU idle.
            self._pending.cancel()
            self._waiting = False
            self._pending = loop.call_soon(self._flush)
        return future

    def _schedule(self, loop: asyncio.AbstractEventLoop, *, now: bool) -> None:
        """Plan the commit of what is queued: now, this turn of the loop, or after the delay."""
        if (
            self.commit_delay_s
            and not self._closing
            and len(self._queue) < min(self._max_batch, self._calls_in_flight())
        ):
            # Other calls are on their way to settling: their rows share this commit.
            self._waiting = True
            self._pending = loop.call_later(self.commit_delay_s, self._delayed)
        elif now:
            self._flush()
        else:
            # Rows queued in this same turn of the loop join the commit.
            self._pending = loop.call_soon(self._flush)

    def _delayed(self) -> None:
        # A row queued in this same turn of the loop still joins the commit.
        self._waiting = False
        self._pending = asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        """Start committing a batch of what is queued."""
        self._pending = None
        queue = self._queue
        if self._batch or not queue:
            return
        take = min(len(queue), self._max_batch)
        batch = self._batch = [queue.popleft() for _ in range(take)]
        self._began = time.perf_counter()
        try:
            self._submit([row for row, _ in batch], self._committed)
        except Exception as exc:
            self._committed(0, exc)

    def _committed(self, added: int, error: BaseException | None) -> None:
        """On the loop: a batch's outcome, to its callers; then the next batch."""
        batch, self._batch = self._batch, []
        try:
            if error is not None:
                # The store gone, a connection cut, a full disk, a value out of
                # range: these rows were not committed, and their callers are told
                # so (the core logs each failed settlement, one line per call).
                self.counters["billing_write_errors"] += 1
            else:
                self.counters["billing_commits"] += 1
                self.counters["billing_rows"] += added
                self.telemetry.observe(
                    "prism_ledger_commit_seconds", time.perf_counter() - self._began
                )
        finally:
            _settle_all(batch, error)
            if self._queue:
                if self._pending is None:
                    self._schedule(asyncio.get_running_loop(), now=True)
            elif self._closing and self._drained is not None and not self._drained.done():
                self._drained.set_result(None)

    async def _drain(self) -> None:
        """Write everything queued; rows recorded from now on fail."""
        self._closing = True
        if self._waiting and self._pending is not None:
            # Closing waits for nobody.
            self._pending.cancel()
            self._waiting = False
            self._pending = None
            if not self._batch:
                self._flush()
        if not self._batch and not self._queue:
            return
        self._drained = asyncio.get_running_loop().create_future()
        try:
            await self._drained
        finally:
            if self._queue and not self._batch:
                # Never leave a caller waiting on a commit that will not happen.
                stopped = LedgerClosed("ledger writer stopped")
                _settle_all(list(self._queue), stopped)
                self._queue.clear()


class LedgerWriter(GroupCommit):
    """The SQLite ledger's only writer: one thread owns the connection, the loop feeds it.

    The thread is the writer's own, fed through a ``SimpleQueue`` and answering
    with one ``call_soon_threadsafe``: a ``ThreadPoolExecutor`` hand-off (its
    work item, its locked concurrent future chained to an asyncio one) cost
    several times what SQLite spends on a batch of rows, once per commit.
    """

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
        #: Batches for the thread, each with the future its outcome goes to; None: stop.
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        #: Done once the thread has closed the connection and is about to end.
        self._stopped: asyncio.Future[int] | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        opened: asyncio.Future[int] = loop.create_future()
        self._stopped = loop.create_future()
        # One thread: sqlite3 connections belong to the thread that made them.
        self._thread = threading.Thread(
            target=_serve,
            args=(loop, self.path, self._synchronous, self._jobs, opened, self._stopped),
            name="prism-billing-ledger",
            daemon=True,
        )
        self._thread.start()
        await opened
        self._begin()

    async def close(self) -> None:
        """Write everything queued, then close the connection and its thread."""
        await self._drain()
        thread, stopped = self._thread, self._stopped
        if thread is None or stopped is None:
            return
        self._thread = None
        self._jobs.put(None)
        with contextlib.suppress(Exception):
            # The thread's own failure to close was its to report; it has ended either way.
            await stopped
        thread.join()

    def _submit(
        self, rows: list[LedgerRow], done: Callable[[int, BaseException | None], None]
    ) -> None:
        self._jobs.put(([row.as_tuple() for row in rows], done))


#: A batch of row tuples for the writer thread, and what its outcome is handed to on the loop.
_Job = tuple[list[tuple[Any, ...]], Callable[[int, "BaseException | None"], None]]


def _serve(
    loop: asyncio.AbstractEventLoop,
    path: Path,
    synchronous: str,
    jobs: queue.SimpleQueue[_Job | None],
    opened: asyncio.Future[int],
    stopped: asyncio.Future[int],
) -> None:
    """The writer thread: open the ledger, write each batch handed in, close on None."""
    answer = loop.call_soon_threadsafe
    try:
        conn = connect(path, synchronous=synchronous)
    except BaseException as exc:
        answer(_outcome, opened, 0, exc)
        answer(_outcome, stopped, 0, None)
        return
    answer(_outcome, opened, 0, None)
    error: BaseException | None = None
    try:
        while (job := jobs.get()) is not None:
            rows, done = job
            try:
                added = _write(conn, rows)
            except BaseException as exc:  # whatever it was, the batch's callers are told
                answer(done, 0, exc)
            else:
                answer(done, added, None)
    finally:
        try:
            conn.close()
        except Exception as exc:
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
            answer(_outcome, stopped, 0, error)


def _outcome(future: asyncio.Future[int], value: int, error: BaseException | None) -> None:
    """On the loop: hand the thread's outcome to whoever awaits it (if still waiting)."""
    if future.done():
        return
    if error is None:
        future.set_result(value)
    else:
        future.set_exception(error)


def _task_outcome(
    task: asyncio.Task[int], done: Callable[[int, BaseException | None], None]
) -> None:
    """A commit task's outcome, handed on as the writer thread hands its own."""
    if task.cancelled():
        done(0, LedgerClosed("ledger writer stopped"))
    elif (error := task.exception()) is not None:
        done(0, error)
    else:
        done(task.result(), None)


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
