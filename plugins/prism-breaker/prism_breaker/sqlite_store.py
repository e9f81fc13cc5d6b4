"""The default :class:`prism_proxy.BreakerStore`: one SQLite file (stdlib ``sqlite3``).

Calls run in a worker thread (``asyncio.to_thread``) on one connection,
serialised by a lock, so the event loop never waits on the disk.  WAL mode
lets the CLI write overrides while a gateway has the file open; the gateway
notices through ``PRAGMA data_version``, which changes only when another
connection commits.

The connection is opened once (:meth:`SqliteStore.open`, at start-up) and kept
until :meth:`SqliteStore.close`: refreshes and writes need no new file handle,
so they go on working when the process has none left to give.  No transaction
stays open between calls, so each read sees what others committed before it.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import orjson

from prism_proxy import AuditEntry, BindingRecord, Fleet, Override, StoredTransition

from .settings import MEMORY

__all__ = ["SCHEMA_VERSION", "SqliteStore", "StoreError"]

SCHEMA_VERSION = 1
T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS breaker_bindings (
    binding TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    cause TEXT NOT NULL,
    since REAL NOT NULL,
    revision INTEGER NOT NULL,
    isolated_revision INTEGER NOT NULL,
    step INTEGER NOT NULL,
    isolated_until REAL,
    restored_at REAL,
    trial_since REAL
);
CREATE TABLE IF NOT EXISTS breaker_overrides (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    scope TEXT NOT NULL,
    target TEXT NOT NULL,
    reason TEXT NOT NULL,
    owner TEXT NOT NULL,
    created_at REAL NOT NULL,
    review_by REAL NOT NULL,
    expires_at REAL,
    max_in_flight INTEGER,
    ended_at REAL,
    ended_by TEXT,
    end_action TEXT
);
CREATE TABLE IF NOT EXISTS breaker_audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    actor TEXT NOT NULL,
    action TEXT NOT NULL,
    subject TEXT NOT NULL,
    from_state TEXT,
    to_state TEXT,
    cause TEXT NOT NULL,
    evidence TEXT NOT NULL,
    revision INTEGER,
    override_id TEXT
);
CREATE INDEX IF NOT EXISTS breaker_audit_subject ON breaker_audit (subject, id);
"""

_OVERRIDE_COLUMNS = (
    "id, kind, scope, target, reason, owner, created_at, review_by, expires_at, max_in_flight"
)


class StoreError(Exception):
    """The state file cannot be used (unreadable, or written by a newer version)."""


class SqliteStore:
    """Breaker state in one SQLite file, or in memory for ``:memory:``."""

    #: One process writes a file: nothing to coordinate with.
    fleet: Fleet | None = None

    def __init__(self, path: str) -> None:
        self.path = path
        self.description = "memory (nothing survives a restart)" if path == MEMORY else path
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._data_version: int | None = None

    # -- lifecycle -----------------------------------------------------------

    async def open(self) -> None:
        await asyncio.to_thread(self._open)

    def _open(self) -> None:
        try:
            conn = sqlite3.connect(
                self.path, timeout=5.0, check_same_thread=False, isolation_level=None
            )
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open breaker state {self.path}: {exc}") from None
        try:
            if self.path != MEMORY:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
            # Sorts, temporary indexes and statement journals in memory: no call
            # ever needs a temporary file, that is a file handle.
            conn.execute("PRAGMA temp_store=MEMORY")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path} was written by a newer prism-breaker "
                    f"(schema {version}, this one knows {SCHEMA_VERSION})"
                )
            conn.executescript(_SCHEMA)
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except sqlite3.Error as exc:
            conn.close()
            raise StoreError(f"cannot use breaker state {self.path}: {exc}") from None
        except StoreError:
            conn.close()
            raise
        self._conn = conn
        self._data_version = self._read_data_version(conn)

    def check(self) -> None:
        """Open and close once, synchronously: lets start-up fail before anything listens."""
        if self.path != MEMORY:
            self._open()
            self._close()

    async def close(self) -> None:
        await asyncio.to_thread(self._close)

    def _close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await asyncio.to_thread(self._locked, fn)

    def _locked(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        with self._lock:
            conn = self._conn
            if conn is None:
                raise StoreError(f"breaker state {self.path} is not open")
            try:
                return fn(conn)
            finally:
                # A failed COMMIT (disk full) leaves the transaction open: end it, or
                # every later read would see the file as it was then.
                if conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")

    # -- bindings ------------------------------------------------------------

    async def load_bindings(self) -> list[BindingRecord]:
        def load(conn: sqlite3.Connection) -> list[BindingRecord]:
            rows = conn.execute(
                "SELECT binding, state, cause, since, revision, isolated_revision, step, "
                "isolated_until, restored_at, trial_since FROM breaker_bindings ORDER BY binding"
            ).fetchall()
            return [BindingRecord(*row) for row in rows]

        return await self._run(load)

    async def record_transitions(
        self, transitions: Sequence[StoredTransition]
    ) -> Sequence[BindingRecord]:
        def write(conn: sqlite3.Connection) -> None:
            with _transaction(conn):
                for t in transitions:
                    _insert_audit(conn, t.audit)
                    r = t.record
                    conn.execute(
                        "INSERT INTO breaker_bindings VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                        "ON CONFLICT (binding) DO UPDATE SET state = excluded.state, "
                        "cause = excluded.cause, since = excluded.since, "
                        "revision = excluded.revision, "
                        "isolated_revision = excluded.isolated_revision, step = excluded.step, "
                        "isolated_until = excluded.isolated_until, "
                        "restored_at = excluded.restored_at, trial_since = excluded.trial_since "
                        # Never let an older state overwrite a newer one, whatever the order.
                        "WHERE excluded.revision >= breaker_bindings.revision",
                        (
                            r.binding,
                            r.state,
                            r.cause,
                            r.since,
                            r.revision,
                            r.isolated_revision,
                            r.step,
                            r.isolated_until,
                            r.restored_at,
                            r.trial_since,
                        ),
                    )

        if transitions:
            await self._run(write)
        return ()

    # -- overrides -----------------------------------------------------------

    async def active_overrides(self) -> list[Override]:
        def load(conn: sqlite3.Connection) -> list[Override]:
            rows = conn.execute(
                f"SELECT {_OVERRIDE_COLUMNS} FROM breaker_overrides "
                "WHERE ended_at IS NULL ORDER BY created_at, id"
            ).fetchall()
            return [Override(*row) for row in rows]

        return await self._run(load)

    async def add_override(self, override: Override, audit: AuditEntry) -> None:
        def write(conn: sqlite3.Connection) -> None:
            with _transaction(conn):
                o = override
                conn.execute(
                    f"INSERT INTO breaker_overrides ({_OVERRIDE_COLUMNS}) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        o.id,
                        o.kind,
                        o.scope,
                        o.target,
                        o.reason,
                        o.owner,
                        o.created_at,
                        o.review_by,
                        o.expires_at,
                        o.max_in_flight,
                    ),
                )
                _insert_audit(conn, audit)

        await self._run(write)

    async def end_override(self, override_id: str, audit: AuditEntry) -> Override | None:
        def write(conn: sqlite3.Connection) -> Override | None:
            with _transaction(conn):
                row = conn.execute(
                    f"SELECT {_OVERRIDE_COLUMNS} FROM breaker_overrides "
                    "WHERE id = ? AND ended_at IS NULL",
                    (override_id,),
                ).fetchone()
                if row is None:
                    return None
                conn.execute(
                    "UPDATE breaker_overrides SET ended_at = ?, ended_by = ?, end_action = ? "
                    "WHERE id = ? AND ended_at IS NULL",
                    (audit.at, audit.actor, audit.action, override_id),
                )
                _insert_audit(conn, audit)
                return Override(*row)

        return await self._run(write)

    # -- audit ---------------------------------------------------------------

    async def audit(
        self, *, subjects: Sequence[str] | None = None, limit: int = 100
    ) -> list[AuditEntry]:
        def load(conn: sqlite3.Connection) -> list[AuditEntry]:
            query = (
                "SELECT id, at, actor, action, subject, from_state, to_state, cause, evidence, "
                "revision, override_id FROM breaker_audit"
            )
            params: list[Any] = []
            if subjects is not None:
                query += f" WHERE subject IN ({', '.join('?' * len(subjects))})"
                params += list(subjects)
            query += " ORDER BY id DESC LIMIT ?"
            params.append(limit)
            return [
                AuditEntry(
                    id=row[0],
                    at=row[1],
                    actor=row[2],
                    action=row[3],
                    subject=row[4],
                    from_state=row[5],
                    to_state=row[6],
                    cause=row[7],
                    evidence=orjson.loads(row[8]),
                    revision=row[9],
                    override_id=row[10],
                )
                for row in conn.execute(query, params).fetchall()
            ]

        if subjects is not None and not subjects:
            return []
        return await self._run(load)

    async def changed(self) -> bool:
        def check(conn: sqlite3.Connection) -> bool:
            version = self._read_data_version(conn)
            changed = version != self._data_version
            self._data_version = version
            return changed

        return await self._run(check)

    @staticmethod
    def _read_data_version(conn: sqlite3.Connection) -> int:
        return int(conn.execute("PRAGMA data_version").fetchone()[0])


class _transaction:
    """BEGIN IMMEDIATE ... COMMIT/ROLLBACK: writers queue on the file lock, never half-write."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.conn.execute("COMMIT" if exc_type is None else "ROLLBACK")


def _insert_audit(conn: sqlite3.Connection, entry: AuditEntry) -> None:
    conn.execute(
        "INSERT INTO breaker_audit (at, actor, action, subject, from_state, to_state, cause, "
        "evidence, revision, override_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            entry.at,
            entry.actor,
            entry.action,
            entry.subject,
            entry.from_state,
            entry.to_state,
            entry.cause,
            orjson.dumps(entry.evidence).decode(),
            entry.revision,
            entry.override_id,
        ),
    )
