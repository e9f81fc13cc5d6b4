"""The ``principals`` service: who an organisation or a key id is, for operator commands.

prism-keys provides it whenever keys are configured (``db_path`` or
``db_url``).  A gateway that serves answers from the key ring it
authenticates with, so an answer is exactly what a call carries now
(settings parsed by this generation's declarations, cached per snapshot,
stale until the ring's next refresh like the calls).  A generation nobody
started (``prism limits show`` builds one from the configuration and never
serves with it) has no snapshot: the service then reads the two or three
rows it needs itself, without writing anything (no file created, no schema
migrated), on a connection of its own that it closes before answering.

An organisation is known when the key database has it: ``prism keys create``
(a key, revoked since or not) or ``prism keys org-tags --set`` made it, as
``prism keys orgs`` lists it.  Only those can hold settings.  A key is known
while it is active: a revoked key's settings apply to nothing.  Answers hold
key ids, never key text or hashes.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Mapping
from pathlib import Path

import asyncpg
import attrs

from prism_proxy import Generation, Principal

from .auth import AUTH_PLUGIN_NAME, KeysAuth, Owner, SettingsParser
from .keyring import NO_SETTINGS
from .pg_store import PG_SCHEMA_VERSION, SchemaTooNew, _schema_version
from .settings import KeysSettings
from .store import SCHEMA_VERSION, _loads

__all__ = ["KeysPrincipals", "StoredKey", "StoredOrg", "read_stored"]

#: How long a lookup waits for a locked SQLite file or for PostgreSQL.
_TIMEOUT_S = 10.0


@attrs.frozen
class StoredOrg:
    """An organisation as stored: its tags and its settings (text, not parsed)."""

    name: str
    tags: tuple[str, ...]
    settings: Mapping[str, str]


@attrs.frozen
class StoredKey:
    """An active key as stored, without its hash: its organisation, scopes and settings."""

    key_id: str
    org: StoredOrg
    scopes: tuple[str, ...]
    settings: Mapping[str, str]


Stored = StoredOrg | StoredKey | None


@attrs.define(eq=False)
class KeysPrincipals:
    """:class:`prism_proxy.Principals` over one generation's keys."""

    generation: Generation
    settings: KeysSettings
    #: Parses what the service read itself, when no auth object is registered.
    _parser: SettingsParser | None = attrs.field(default=None, init=False)

    async def organisation(self, org: str) -> Principal | None:
        auth = self._auth()
        if auth is not None and auth.ring.loaded:
            return auth.organisation(org)
        stored = await read_stored(self.settings, org=org)
        if not isinstance(stored, StoredOrg):
            return None
        return self._org_principal(stored, auth)

    async def key(self, key_id: str) -> Principal | None:
        auth = self._auth()
        if auth is not None and auth.ring.loaded:
            return auth.key(key_id)
        stored = await read_stored(self.settings, key_id=key_id)
        if not isinstance(stored, StoredKey):
            return None
        org = self._org_principal(stored.org, auth)
        return attrs.evolve(
            org,
            key_id=stored.key_id,
            scopes=frozenset(stored.scopes),
            key_settings=self._parser_for(auth).parse(Owner("key", key_id), stored.settings),
        )

    def _auth(self) -> KeysAuth | None:
        # Looked up when asked: the service is made before prism_generation
        # registers the auth object (a consumer may ask for it first).
        auth = self.generation.plugin(AUTH_PLUGIN_NAME)
        return auth if isinstance(auth, KeysAuth) else None

    def _parser_for(self, auth: KeysAuth | None) -> SettingsParser:
        """The auth's parser (one log line per problem for both), else one of our own."""
        if auth is not None:
            return auth.parser
        if self._parser is None:
            self._parser = SettingsParser(self.generation.org_settings)
        return self._parser

    def _org_principal(self, stored: StoredOrg, auth: KeysAuth | None) -> Principal:
        owner = Owner("organisation", stored.name)
        return Principal(
            org=stored.name,
            org_tags=frozenset(stored.tags),
            settings=self._parser_for(auth).parse(owner, stored.settings),
            key_settings=NO_SETTINGS,
        )


async def read_stored(
    settings: KeysSettings, *, org: str | None = None, key_id: str | None = None
) -> Stored:
    """The organisation ``org``, or the active key ``key_id``, as the key database holds
    them now; None when it holds no such thing.  Raises the database's error."""
    if settings.db_url is not None:
        return await _read_postgres(settings.db_url, org=org, key_id=key_id)
    assert settings.db_path is not None
    return await asyncio.to_thread(_read_sqlite, settings.db_path, org=org, key_id=key_id)


def _read_sqlite(path: Path, *, org: str | None, key_id: str | None) -> Stored:
    if not path.exists():
        return None  # no command and no gateway has made it yet: it holds nobody
    # Read-only: a lookup neither creates nor migrates what it reads.
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=_TIMEOUT_S)
    with contextlib.closing(conn):
        conn.execute("BEGIN")  # one read transaction: the rows agree with each other
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise sqlite3.DatabaseError(
                f"{path} has schema version {version}; this prism-keys knows "
                f"{SCHEMA_VERSION}: upgrade prism-keys"
            )
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not {"orgs", "keys"} <= tables:
            return None  # created, never written to
        scopes: tuple[str, ...] = ()
        if key_id is not None:
            row = conn.execute(
                "SELECT org, scopes FROM keys WHERE id = ? AND revoked IS NULL", (key_id,)
            ).fetchone()
            if row is None:
                return None
            org, scopes = row[0], _loads(row[1])
        assert org is not None
        found = conn.execute("SELECT tags FROM orgs WHERE name = ?", (org,)).fetchone()
        if found is None:
            return None

        def settings_of(table: str, column: str, owner: str) -> dict[str, str]:
            if table not in tables:
                return {}  # an older schema: nothing of the kind was ever set
            query = f"SELECT name, value FROM {table} WHERE {column} = ? ORDER BY name"
            return {r[0]: r[1] for r in conn.execute(query, (owner,))}

        stored_org = StoredOrg(org, _loads(found[0]), settings_of("org_settings", "org", org))
        if key_id is None:
            return stored_org
        return StoredKey(key_id, stored_org, scopes, settings_of("key_settings", "key_id", key_id))


async def _read_postgres(url: str, *, org: str | None, key_id: str | None) -> Stored:
    # A connection of its own, closed before answering: nothing else would close it.
    conn = await asyncpg.connect(url, timeout=_TIMEOUT_S, command_timeout=_TIMEOUT_S)
    try:
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            version = await _schema_version(conn)
            if version is None:
                return None  # no command and no gateway has made the tables yet
            if version > PG_SCHEMA_VERSION:
                raise SchemaTooNew(
                    f"key schema {version} is newer than this prism-keys understands "
                    f"({PG_SCHEMA_VERSION}): upgrade prism-keys"
                )
            scopes: tuple[str, ...] = ()
            if key_id is not None:
                row = await conn.fetchrow(
                    "SELECT org, scopes FROM prism_keys_keys WHERE id = $1 AND revoked IS NULL",
                    key_id,
                )
                if row is None:
                    return None
                org, scopes = row[0], _loads(row[1])
            assert org is not None
            tags = await conn.fetchval("SELECT tags FROM prism_keys_orgs WHERE name = $1", org)
            if tags is None:
                return None
            rows = await conn.fetch(
                "SELECT name, value FROM prism_keys_org_settings WHERE org = $1 ORDER BY name",
                org,
            )
            stored_org = StoredOrg(org, _loads(tags), {r[0]: r[1] for r in rows})
            if key_id is None:
                return stored_org
            # Version 1 had no key settings: none were ever set.
            rows = (
                await conn.fetch(
                    "SELECT name, value FROM prism_keys_key_settings WHERE key_id = $1 "
                    "ORDER BY name",
                    key_id,
                )
                if version >= 2
                else []
            )
            return StoredKey(key_id, stored_org, scopes, {r[0]: r[1] for r in rows})
    finally:
        await conn.close()
