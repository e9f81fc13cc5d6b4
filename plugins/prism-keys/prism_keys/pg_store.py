"""The key database in PostgreSQL (``[prism:keys] db_url``): shared by every replica.

The same contract as the SQLite store (:mod:`.store`): keys kept as SHA-256
hashes, organisations with tags and settings, and one revision number bumped
in the same transaction as every change.  Each change also runs
``NOTIFY prism_keys`` in its transaction (delivered only if it commits), so
gateways listening on that channel refresh at once instead of at their next
poll.

:class:`PgKeyStore` is the gateway's side (async, a small pool opened by the
key ring's lifecycle, plus one dedicated connection for ``LISTEN``).
:class:`SyncPgKeyStore` is the CLI's: the same operations as
:class:`~prism_keys.store.KeyStore`, blocking, each on a fresh connection
run through ``asyncio.run``.

Schema versions (the one row of ``prism_keys_schema``): 1 the keys,
organisations, their settings and the revision; 2 adds
``prism_keys_key_settings`` (key_id, name, value text), whose rows go with
their key if it is ever deleted; 3 adds expiry, rotation, last use, disabled
organisations and the audit log (:mod:`.admin_schema`).  :func:`ensure_schema` creates what is
missing and records the version, so an older schema is migrated the first
time a newer prism-keys connects; a newer one is refused.

The URL may hold a password: only :func:`prism_proxy.redact_url`'s
form of it is ever logged or shown.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

import asyncpg
import orjson

from prism_proxy import redact_url

from .admin_schema import migrate_postgres
from .store import (
    ACTIVE_KEYS,
    KeyRow,
    Loaded,
    OrgRow,
    Revoked,
    SettingsTable,
    _now,
    check_name,
    grouped,
)
from .tokens import NewKey, new_key

__all__ = ["CHANNEL", "PG_SCHEMA_VERSION", "PgKeyStore", "SchemaTooNew", "SyncPgKeyStore"]

log = logging.getLogger("prism.keys")

T = TypeVar("T")
#: Bump with a migration step in :func:`ensure_schema` when the tables change.
PG_SCHEMA_VERSION = 3
#: The channel every change is announced on (payload: the new revision).
CHANNEL = "prism_keys"
#: Any advisory-lock key will do, as long as every replica uses the same one.
_SCHEMA_LOCK = 0x70726973_6D6B6579  # "prismkey"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS prism_keys_schema (
    only_row BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (only_row),
    version  INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS prism_keys_revision (
    only_row BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (only_row),
    value    BIGINT NOT NULL
);
INSERT INTO prism_keys_revision (value) VALUES (0) ON CONFLICT DO NOTHING;
CREATE TABLE IF NOT EXISTS prism_keys_orgs (
    name    TEXT PRIMARY KEY,
    tags    TEXT NOT NULL DEFAULT '[]',
    created TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS prism_keys_keys (
    id      TEXT PRIMARY KEY,
    org     TEXT NOT NULL REFERENCES prism_keys_orgs(name),
    scopes  TEXT NOT NULL,
    hash    TEXT NOT NULL UNIQUE,
    created TEXT NOT NULL,
    revoked TEXT
);
CREATE TABLE IF NOT EXISTS prism_keys_org_settings (
    org   TEXT NOT NULL REFERENCES prism_keys_orgs(name),
    name  TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (org, name)
);
CREATE TABLE IF NOT EXISTS prism_keys_key_settings (
    key_id TEXT NOT NULL REFERENCES prism_keys_keys(id) ON DELETE CASCADE,
    name   TEXT NOT NULL,
    value  TEXT NOT NULL,
    PRIMARY KEY (key_id, name)
);
"""
_TIMEOUT_S = 10.0

Conn = Any  # asyncpg.Connection or a pool's connection proxy


class SchemaTooNew(Exception):
    """The database holds a key schema newer than this prism-keys understands."""


async def ensure_schema(conn: Conn) -> None:
    """Create the tables if missing (serialised between replicas); refuse a newer schema.

    Every table is ``IF NOT EXISTS``, so creating what is missing is also the
    migration from an older version: only the recorded version changes then.
    """
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _SCHEMA_LOCK)
        found = await _schema_version(conn)
        if found is not None and found > PG_SCHEMA_VERSION:
            # Checked before creating anything: a newer schema is not ours to touch.
            raise SchemaTooNew(
                f"key schema {found} is newer than this prism-keys understands "
                f"({PG_SCHEMA_VERSION}): upgrade prism-keys"
            )
        await conn.execute(_SCHEMA)
        await migrate_postgres(conn)
        if found is None:
            await conn.execute(
                "INSERT INTO prism_keys_schema (version) VALUES ($1)", PG_SCHEMA_VERSION
            )
        elif found < PG_SCHEMA_VERSION:
            await conn.execute("UPDATE prism_keys_schema SET version = $1", PG_SCHEMA_VERSION)
            log.info("keys: key schema %d migrated to %d", found, PG_SCHEMA_VERSION)


async def _schema_version(conn: Conn) -> int | None:
    """The recorded schema version, or None in a database without one yet."""
    if not await conn.fetchval("SELECT to_regclass('prism_keys_schema') IS NOT NULL"):
        return None
    found = await conn.fetchval("SELECT version FROM prism_keys_schema")
    return int(found) if found is not None else None


async def _bump(conn: Conn) -> None:
    """(In the change's transaction.)  The new revision, announced when it commits."""
    value = await conn.fetchval("UPDATE prism_keys_revision SET value = value + 1 RETURNING value")
    await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, str(value))


async def _revision(conn: Conn) -> int:
    return int(await conn.fetchval("SELECT value FROM prism_keys_revision"))


async def _load_active(conn: Conn) -> Loaded:
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        revision = await _revision(conn)
        rows = await conn.fetch(ACTIVE_KEYS.format(keys="prism_keys_keys", orgs="prism_keys_orgs"))
        setting_rows = await conn.fetch("SELECT org, name, value FROM prism_keys_org_settings")
        key_setting_rows = await conn.fetch(
            "SELECT s.key_id, s.name, s.value FROM prism_keys_key_settings s "
            "JOIN prism_keys_keys k ON k.id = s.key_id WHERE k.revoked IS NULL"
        )
        org_rows = await conn.fetch("SELECT name, tags FROM prism_keys_orgs")
    return Loaded.from_rows(revision, rows, setting_rows, key_setting_rows, org_rows)


class PgKeyStore:
    """The gateway's side: a pool for reads and a connection that LISTENs for changes."""

    def __init__(self, url: str, *, timeout_s: float = _TIMEOUT_S) -> None:
        self._url = url
        #: The database as it may be logged: the URL without its password.
        self.name = redact_url(url)
        self.timeout_s = timeout_s
        #: Kept for the key ring's sake (the SQLite store's file generation); constant here.
        self.generation = 0
        self._pool: asyncpg.Pool | None = None
        self._listener: asyncpg.Connection | None = None
        self._on_change: Callable[[], None] | None = None

    async def open(self) -> None:
        """Open the pool and create or check the schema; raises if PostgreSQL says no."""
        pool = await asyncpg.create_pool(
            self._url,
            min_size=1,
            max_size=2,
            timeout=self.timeout_s,
            command_timeout=self.timeout_s,
        )
        try:
            async with pool.acquire(timeout=self.timeout_s) as conn:
                await ensure_schema(conn)
        except BaseException:
            await pool.close()
            raise
        self._pool = pool

    async def close(self) -> None:
        await self.stop_listening()
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    def _require(self) -> asyncpg.Pool:
        if self._pool is None:
            raise RuntimeError("the PostgreSQL key store is not open")
        return self._pool

    async def revision(self) -> int:
        async with self._require().acquire(timeout=self.timeout_s) as conn:
            return await _revision(conn)

    async def load_active(self) -> Loaded:
        async with self._require().acquire(timeout=self.timeout_s) as conn:
            return await _load_active(conn)

    # --- LISTEN ---

    @property
    def listening(self) -> bool:
        return self._listener is not None and not self._listener.is_closed()

    async def listen(self, on_change: Callable[[], None]) -> None:
        """LISTEN on a connection of its own; ``on_change`` runs on every notification.

        Raises if it cannot connect; a broken listener is noticed with
        :attr:`listening` and started again by calling this once more.
        """
        await self.stop_listening()
        self._on_change = on_change
        conn = await asyncpg.connect(self._url, timeout=self.timeout_s)
        try:
            await conn.add_listener(CHANNEL, self._notified)
        except BaseException:
            await conn.close()
            raise
        self._listener = conn

    def _notified(self, conn: object, pid: int, channel: str, payload: object) -> None:
        if self._on_change is not None:
            self._on_change()

    async def stop_listening(self) -> None:
        conn, self._listener = self._listener, None
        if conn is not None and not conn.is_closed():
            try:
                await conn.close(timeout=self.timeout_s)
            except Exception:
                conn.terminate()


_ORG_SETTINGS = SettingsTable("prism_keys_org_settings", "org", "prism_keys_orgs", "name")
_KEY_SETTINGS = SettingsTable("prism_keys_key_settings", "key_id", "prism_keys_keys", "id")


class SyncPgKeyStore:
    """The CLI's side: :class:`~prism_keys.store.KeyStore`'s operations, blocking.

    Every call connects, runs one transaction and disconnects, through
    ``asyncio.run`` (in a thread of its own when the caller already runs an
    event loop, as a test does).
    """

    def __init__(self, url: str, *, timeout_s: float = _TIMEOUT_S) -> None:
        self._url = url
        self.name = redact_url(url)
        self.timeout_s = timeout_s

    def _run(self, work: Callable[[Conn], Awaitable[T]], *, transaction: bool = True) -> T:
        async def once() -> T:
            conn = await asyncpg.connect(
                self._url, timeout=self.timeout_s, command_timeout=self.timeout_s
            )
            try:
                if not transaction:
                    return await work(conn)
                async with conn.transaction():
                    return await work(conn)
            finally:
                await conn.close()

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(once())
        box: list[T] = []
        failure: list[BaseException] = []

        def in_thread() -> None:
            try:
                box.append(asyncio.run(once()))
            except BaseException as exc:
                failure.append(exc)

        thread = threading.Thread(target=in_thread, name="prism-keys-cli")
        thread.start()
        thread.join()
        if failure:
            raise failure[0]
        return box[0]

    def ensure_schema(self) -> None:
        self._run(ensure_schema, transaction=False)

    # --- writes ---

    def create_key(self, org: str, scopes: Iterable[str]) -> NewKey:
        check_name("organisation", org)
        scope_text = _dumps(list(scopes))

        async def work(conn: Conn) -> NewKey:
            now = _now()
            await conn.execute(
                "INSERT INTO prism_keys_orgs (name, tags, created) VALUES ($1, '[]', $2) "
                "ON CONFLICT (name) DO NOTHING",
                org,
                now,
            )
            for _ in range(5):
                made = new_key()
                try:
                    async with conn.transaction():  # a savepoint: a collision undoes only this
                        await conn.execute(
                            "INSERT INTO prism_keys_keys (id, org, scopes, hash, created) "
                            "VALUES ($1, $2, $3, $4, $5)",
                            made.key_id,
                            org,
                            scope_text,
                            made.hash,
                            now,
                        )
                except asyncpg.UniqueViolationError:
                    continue  # a 48-bit key id collided: draw again
                await _bump(conn)
                return made
            raise RuntimeError("could not draw an unused key id")

        return self._run(work)

    def revoke(self, key_id: str) -> Revoked:
        async def work(conn: Conn) -> Revoked:
            row = await conn.fetchrow(
                "SELECT revoked FROM prism_keys_keys WHERE id = $1 FOR UPDATE", key_id
            )
            if row is None:
                return Revoked.UNKNOWN
            if row[0] is not None:
                return Revoked.ALREADY
            await conn.execute(
                "UPDATE prism_keys_keys SET revoked = $1 WHERE id = $2", _now(), key_id
            )
            await _bump(conn)
            return Revoked.REVOKED

        return self._run(work)

    def set_org_tags(self, org: str, tags: Iterable[str]) -> tuple[str, ...]:
        check_name("organisation", org)
        clean = tuple(sorted({check_name("tag", tag) for tag in tags}))

        async def work(conn: Conn) -> None:
            await conn.execute(
                "INSERT INTO prism_keys_orgs (name, tags, created) VALUES ($1, $2, $3) "
                "ON CONFLICT (name) DO UPDATE SET tags = excluded.tags",
                org,
                _dumps(list(clean)),
                _now(),
            )
            await _bump(conn)

        self._run(work)
        return clean

    def update_org_settings(
        self, org: str, values: Mapping[str, str], unset: Iterable[str] = ()
    ) -> frozenset[str] | None:
        """As :meth:`prism_keys.store.KeyStore.update_org_settings`."""
        check_name("organisation", org)
        return self._update_settings(_ORG_SETTINGS, org, values, unset)

    def update_key_settings(
        self, key_id: str, values: Mapping[str, str], unset: Iterable[str] = ()
    ) -> frozenset[str] | None:
        """As :meth:`prism_keys.store.KeyStore.update_key_settings`."""
        return self._update_settings(_KEY_SETTINGS, key_id, values, unset)

    def _update_settings(
        self, table: SettingsTable, owner: str, values: Mapping[str, str], unset: Iterable[str]
    ) -> frozenset[str] | None:
        # Table and column names come from the two constants below, never from input.
        names = list(unset)

        async def work(conn: Conn) -> frozenset[str] | None:
            found = await conn.fetchval(
                f"SELECT 1 FROM {table.owners} WHERE {table.owner_key} = $1 FOR UPDATE", owner
            )
            if found is None:
                return None
            removed = set()
            for name in names:
                status = await conn.execute(
                    f"DELETE FROM {table.name} WHERE {table.owner_column} = $1 AND name = $2",
                    owner,
                    name,
                )
                if status != "DELETE 0":
                    removed.add(name)
            for name, value in values.items():
                await conn.execute(
                    f"INSERT INTO {table.name} ({table.owner_column}, name, value) "
                    f"VALUES ($1, $2, $3) ON CONFLICT ({table.owner_column}, name) "
                    "DO UPDATE SET value = excluded.value",
                    owner,
                    name,
                    value,
                )
            if values or removed:
                await _bump(conn)
            return frozenset(removed)

        return self._run(work)

    # --- reads ---

    def key(self, key_id: str) -> KeyRow | None:
        async def work(conn: Conn) -> Any:
            return await conn.fetchrow(
                "SELECT id, org, scopes, created, revoked FROM prism_keys_keys WHERE id = $1",
                key_id,
            )

        r = self._run(work)
        return None if r is None else KeyRow(r[0], r[1], _loads(r[2]), r[3], r[4])

    def key_settings(
        self, *, org: str | None = None, key_id: str | None = None
    ) -> dict[str, dict[str, str]]:
        """As :meth:`prism_keys.store.KeyStore.key_settings`."""

        async def work(conn: Conn) -> list[Any]:
            # A NULL filter matches every row: one statement for every case.
            return list(
                await conn.fetch(
                    "SELECT s.key_id, s.name, s.value FROM prism_keys_key_settings s "
                    "JOIN prism_keys_keys k ON k.id = s.key_id "
                    "WHERE ($1::text IS NULL OR k.org = $1) AND ($2::text IS NULL OR k.id = $2) "
                    "ORDER BY k.created, k.id, s.name",
                    org,
                    key_id,
                )
            )

        return grouped(self._run(work))

    def list_keys(self, org: str | None = None) -> list[KeyRow]:
        async def work(conn: Conn) -> list[Any]:
            if org is None:
                return list(
                    await conn.fetch(
                        "SELECT id, org, scopes, created, revoked FROM prism_keys_keys "
                        "ORDER BY created, id"
                    )
                )
            return list(
                await conn.fetch(
                    "SELECT id, org, scopes, created, revoked FROM prism_keys_keys "
                    "WHERE org = $1 ORDER BY created, id",
                    org,
                )
            )

        return [KeyRow(r[0], r[1], _loads(r[2]), r[3], r[4]) for r in self._run(work)]

    def list_orgs(self) -> list[OrgRow]:
        async def work(conn: Conn) -> list[Any]:
            return list(
                await conn.fetch(
                    "SELECT o.name, o.tags, o.created, (SELECT COUNT(*) FROM prism_keys_keys k "
                    "WHERE k.org = o.name AND k.revoked IS NULL) "
                    "FROM prism_keys_orgs o ORDER BY o.name"
                )
            )

        return [OrgRow(r[0], _loads(r[1]), r[2], int(r[3])) for r in self._run(work)]

    def org_tags(self, org: str) -> tuple[str, ...] | None:
        async def work(conn: Conn) -> str | None:
            text: str | None = await conn.fetchval(
                "SELECT tags FROM prism_keys_orgs WHERE name = $1", org
            )
            return text

        text = self._run(work)
        return None if text is None else _loads(text)

    def org_settings(self, org: str) -> dict[str, str] | None:
        async def work(conn: Conn) -> dict[str, str] | None:
            if await conn.fetchval("SELECT 1 FROM prism_keys_orgs WHERE name = $1", org) is None:
                return None
            rows = await conn.fetch(
                "SELECT name, value FROM prism_keys_org_settings WHERE org = $1 ORDER BY name",
                org,
            )
            return {r[0]: r[1] for r in rows}

        return self._run(work)

    def revision(self) -> int:
        return self._run(_revision)

    def load_active(self) -> Loaded:
        return self._run(_load_active, transaction=False)


def _dumps(items: list[str]) -> str:
    return orjson.dumps(items).decode()


def _loads(text: str) -> tuple[str, ...]:
    return tuple(str(item) for item in orjson.loads(text))
