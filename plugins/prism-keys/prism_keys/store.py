"""The key database (SQLite): organisations with tags and settings, keys with scopes and hashes.

Written by ``prism keys ...`` and read by the gateway's refresh task.  Every
write bumps one revision number in the same transaction, so a gateway polls
a single row and reloads only when something changed.  A key's text is never
stored, only its SHA-256 (see :mod:`prism_keys.tokens`).

The CLI opens the file for each command.  A gateway opens it once, at
start-up (:meth:`KeyStore.open`), and re-reads it on that one connection until
it stops: a refresh needs no new file handle, so revocations keep taking
effect when the process has run out of them (thousands of slow connections).
No transaction stays open between calls, so every read sees what other
processes committed before it began.

Schema versions (``PRAGMA user_version``): 1 ``orgs``, ``keys``, ``revision``;
2 adds ``org_settings`` (org, name, value text); 3 adds ``key_settings``
(key_id, name, value text), whose rows go with their key if it is ever
deleted; 4 adds expiry, rotation, last use, disabled organisations and the
audit log (:mod:`.admin_schema`).  Opening a database creates what is missing (every statement is
``IF NOT EXISTS``), so an older file is migrated in place the first time a
newer prism-keys opens it, and a file made by a newer version than this one
is refused.

All functions are blocking; the gateway calls them from a worker thread.
"""

from __future__ import annotations

import calendar
import contextlib
import enum
import logging
import os
import re
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import orjson

from .admin_schema import migrate_sqlite
from .tokens import NewKey, new_key

__all__ = [
    "KeyRow",
    "KeyStore",
    "Loaded",
    "LoadedKey",
    "InvalidName",
    "OrgRow",
    "Revoked",
    "check_name",
    "grouped",
]

SCHEMA_VERSION = 4
_SCHEMA = """
CREATE TABLE IF NOT EXISTS orgs (
    name    TEXT PRIMARY KEY,
    tags    TEXT NOT NULL DEFAULT '[]',
    created TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS keys (
    id      TEXT PRIMARY KEY,
    org     TEXT NOT NULL REFERENCES orgs(name),
    scopes  TEXT NOT NULL,
    hash    TEXT NOT NULL UNIQUE,
    created TEXT NOT NULL,
    revoked TEXT
);
CREATE TABLE IF NOT EXISTS revision (
    id    INTEGER PRIMARY KEY CHECK (id = 1),
    value INTEGER NOT NULL
);
INSERT OR IGNORE INTO revision (id, value) VALUES (1, 0);
CREATE TABLE IF NOT EXISTS org_settings (
    org   TEXT NOT NULL REFERENCES orgs(name),
    name  TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (org, name)
);
CREATE TABLE IF NOT EXISTS key_settings (
    key_id TEXT NOT NULL REFERENCES keys(id) ON DELETE CASCADE,
    name   TEXT NOT NULL,
    value  TEXT NOT NULL,
    PRIMARY KEY (key_id, name)
);
"""
#: The keys a gateway holds: expired ones too (answered ``key_expired``), and those of
#: disabled organisations (answered ``org_disabled``), to whoever holds their text.
ACTIVE_KEYS = (
    "SELECT k.id, k.hash, k.org, o.tags, k.scopes, k.expires_at, k.previous_hash, "
    "k.previous_until, o.disabled FROM {keys} k JOIN {orgs} o ON o.name = k.org "
    "WHERE k.revoked IS NULL"
)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,63}")
_BUSY_TIMEOUT_S = 10

log = logging.getLogger("prism.keys")


class InvalidName(ValueError):
    """An organisation name or tag outside the allowed syntax."""


def check_name(kind: str, value: str) -> str:
    """Org names and tags: 1-64 characters, letters, digits and ``. _ : / @ + -``."""
    if not _NAME.fullmatch(value):
        raise InvalidName(
            f"invalid {kind} {value!r}: use 1-64 letters, digits or . _ : / @ + - "
            "(starting with a letter or digit)"
        )
    return value


class Revoked(enum.Enum):
    REVOKED = "revoked"
    ALREADY = "already revoked"
    UNKNOWN = "unknown key id"


@attrs.frozen
class KeyRow:
    """A key as ``prism keys list`` shows it: everything but the hash."""

    key_id: str
    org: str
    scopes: tuple[str, ...]
    created: str
    revoked: str | None


@attrs.frozen
class OrgRow:
    name: str
    tags: tuple[str, ...]
    created: str
    active_keys: int


@attrs.frozen
class LoadedKey:
    """An active key as the gateway holds it in memory."""

    key_id: str
    hash: str = attrs.field(repr=False)
    org: str
    org_tags: tuple[str, ...]
    scopes: tuple[str, ...]
    #: When it stops working (Unix seconds), if ever.
    expires_at: float | None = None
    #: The text it had before a rotation, accepted until ``previous_until``.
    previous_hash: str | None = attrs.field(default=None, repr=False)
    previous_until: float | None = None
    #: Its organisation is disabled: the key is refused (``org_disabled``) until re-enabled.
    org_disabled: bool = False


@attrs.frozen
class Loaded:
    """What a gateway reads on a refresh, all from one read transaction."""

    revision: int
    keys: list[LoadedKey]
    #: Every organisation's settings as stored (text), by organisation then name.
    settings: dict[str, dict[str, str]]
    #: The active keys' own settings as stored (text), by key id then name.
    key_settings: dict[str, dict[str, str]] = attrs.field(factory=dict)
    #: Every organisation (with active keys or not) and its tags, by name.
    orgs: dict[str, tuple[str, ...]] = attrs.field(factory=dict)

    @classmethod
    def from_rows(
        cls,
        revision: int,
        key_rows: Iterable[Sequence[Any]],
        setting_rows: Iterable[Sequence[Any]],
        key_setting_rows: Iterable[Sequence[Any]] = (),
        org_rows: Iterable[Sequence[Any]] = (),
    ) -> Loaded:
        """From ``(id, hash, org, tags, scopes[, expires_at, previous_hash, previous_until,
        org_disabled])``,
        ``(org, name, value)``,
        ``(key_id, name, value)`` and ``(name, tags)`` rows (either store)."""
        keys = [
            LoadedKey(
                r[0],
                r[1],
                r[2],
                _loads(r[3]),
                _loads(r[4]),
                *((parse_time(r[5]), r[6], parse_time(r[7])) if len(r) > 5 else ()),
                *((r[8] is not None,) if len(r) > 8 else ()),
            )
            for r in key_rows
        ]
        return cls(
            revision=revision,
            keys=keys,
            settings=grouped(setting_rows),
            key_settings=grouped(key_setting_rows),
            orgs={r[0]: _loads(r[1]) for r in org_rows},
        )


def grouped(rows: Iterable[Sequence[Any]]) -> dict[str, dict[str, str]]:
    """``(owner, name, value)`` rows as ``{owner: {name: value}}``, in the rows' order."""
    found: dict[str, dict[str, str]] = {}
    for owner, name, value in rows:
        found.setdefault(owner, {})[name] = value
    return found


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def format_time(at: float) -> str:
    """Unix seconds as the database keeps times: UTC, ISO 8601, to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def parse_time(text: str | None) -> float | None:
    """A time as :func:`format_time` writes it, in Unix seconds (None stays None)."""
    if text is None:
        return None
    return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")))


@attrs.frozen
class SettingsTable:
    """Where one kind of owner's settings are: the table, and the owners' table and key."""

    name: str
    owner_column: str
    owners: str
    owner_key: str


_ORG_SETTINGS = SettingsTable("org_settings", "org", "orgs", "name")
_KEY_SETTINGS = SettingsTable("key_settings", "key_id", "keys", "id")


@attrs.define(eq=False)
class KeyStore:
    """The key database at ``path``.

    Used as is (the CLI), every call opens the file, runs one transaction and
    closes it.  Between :meth:`open` and :meth:`close` (a gateway), every call
    runs on the one connection :meth:`open` made instead, one call at a time.
    """

    path: Path
    #: Bumped whenever a new long-lived connection is made (:meth:`open`, or the
    #: file was replaced): the new file's revision number may equal the old one's.
    generation: int = attrs.field(default=0, init=False)
    _conn: sqlite3.Connection | None = attrs.field(default=None, init=False, repr=False)
    #: (st_dev, st_ino) of the file ``_conn`` has open.
    _file: tuple[int, int] | None = attrs.field(default=None, init=False, repr=False)
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False, repr=False)

    # --- the gateway's long-lived connection ---

    def open(self) -> None:
        """Create or check the schema and keep the connection for every later call.

        Raises what :meth:`ensure_schema` raises; the store stays closed then.
        """
        with self._lock:
            if self._conn is None:
                self._reopen()

    def close(self) -> None:
        """Close the connection :meth:`open` made (waits for a call in progress)."""
        with self._lock:
            conn, self._conn, self._file = self._conn, None, None
            if conn is not None:
                conn.close()

    def _reopen(self) -> None:
        """(Lock held.)  Connect afresh; the old connection stays on any failure."""
        # The file's identity before connecting: if it is replaced in between, the
        # next call notices and opens it again, rather than never.
        try:
            file: tuple[int, int] | None = _identity(self.path)
        except FileNotFoundError:
            file = None  # connecting creates it
        conn = _new_connection(self.path, shared=True)
        try:
            with conn:
                _ensure_schema(conn, self.path)
            if file is None:
                file = _identity(self.path)
        except BaseException:
            conn.close()
            raise
        old, self._conn, self._file = self._conn, conn, file
        self.generation += 1
        if old is not None:
            old.close()

    def _current(self, held: sqlite3.Connection) -> sqlite3.Connection:
        """(Lock held.)  ``held``, unless the file at ``path`` was replaced since it was opened.

        Checking costs a ``stat`` and no file handle.  Only a replaced file
        (restored from a backup, say) is opened again; if that fails the
        error is raised and the next call tries again.
        """
        if _identity(self.path) == self._file:
            return held
        log.warning("keys: %s was replaced since it was opened; opening it again", self.path)
        self._reopen()
        assert self._conn is not None
        return self._conn

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """One transaction: commit on success, roll back on error."""
        with self._lock:
            held = self._conn
            if held is not None:
                conn = self._current(held)
                try:
                    with conn:
                        yield conn
                finally:
                    # A failed COMMIT leaves the transaction open; the next call
                    # must start a new one, or it would not see others' writes.
                    if conn.in_transaction:
                        with contextlib.suppress(sqlite3.Error):
                            conn.rollback()
                return
        conn = _new_connection(self.path, shared=False)
        try:
            with conn:
                yield conn
        finally:
            conn.close()

    def ensure_schema(self) -> None:
        """Create the tables if missing; refuse a database made by a newer version."""
        with self._connect() as conn:
            _ensure_schema(conn, self.path)

    # --- writes (the CLI) ---

    def create_key(self, org: str, scopes: Iterable[str]) -> NewKey:
        check_name("organisation", org)
        scope_list = list(scopes)
        now = _now()
        with self._connect() as conn:
            conn.execute(
                "INSERT OR IGNORE INTO orgs (name, tags, created) VALUES (?, '[]', ?)", (org, now)
            )
            for _ in range(5):
                made = new_key()
                try:
                    conn.execute(
                        "INSERT INTO keys (id, org, scopes, hash, created) VALUES (?, ?, ?, ?, ?)",
                        (made.key_id, org, _dumps(scope_list), made.hash, now),
                    )
                except sqlite3.IntegrityError:
                    continue  # a 48-bit key id collided: draw again
                _bump(conn)
                return made
        raise sqlite3.IntegrityError("could not draw an unused key id")

    def revoke(self, key_id: str) -> Revoked:
        with self._connect() as conn:
            row = conn.execute("SELECT revoked FROM keys WHERE id = ?", (key_id,)).fetchone()
            if row is None:
                return Revoked.UNKNOWN
            if row[0] is not None:
                return Revoked.ALREADY
            conn.execute("UPDATE keys SET revoked = ? WHERE id = ?", (_now(), key_id))
            _bump(conn)
            return Revoked.REVOKED

    def set_org_tags(self, org: str, tags: Iterable[str]) -> tuple[str, ...]:
        check_name("organisation", org)
        clean = tuple(sorted({check_name("tag", tag) for tag in tags}))
        with self._connect() as conn:
            conn.execute(
                "INSERT INTO orgs (name, tags, created) VALUES (?, ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET tags = excluded.tags",
                (org, _dumps(list(clean)), _now()),
            )
            _bump(conn)
        return clean

    def update_org_settings(
        self, org: str, values: Mapping[str, str], unset: Iterable[str] = ()
    ) -> frozenset[str] | None:
        """Set ``values`` and remove ``unset`` for ``org``, in one transaction.

        The values are stored as given: checking them against the plugins'
        declarations is the caller's job.  Returns the names in ``unset``
        that were set (and are now removed), or None when the organisation
        does not exist (nothing is written then).
        """
        check_name("organisation", org)
        return self._update_settings(_ORG_SETTINGS, org, values, unset)

    def update_key_settings(
        self, key_id: str, values: Mapping[str, str], unset: Iterable[str] = ()
    ) -> frozenset[str] | None:
        """As :meth:`update_org_settings`, for one key (revoked or not); None: no such key."""
        return self._update_settings(_KEY_SETTINGS, key_id, values, unset)

    def _update_settings(
        self, table: SettingsTable, owner: str, values: Mapping[str, str], unset: Iterable[str]
    ) -> frozenset[str] | None:
        # Table and column names come from the two constants below, never from input.
        with self._connect() as conn:
            exists = conn.execute(
                f"SELECT 1 FROM {table.owners} WHERE {table.owner_key} = ?", (owner,)
            ).fetchone()
            if exists is None:
                return None
            removed = set()
            for name in unset:
                cursor = conn.execute(
                    f"DELETE FROM {table.name} WHERE {table.owner_column} = ? AND name = ?",
                    (owner, name),
                )
                if cursor.rowcount:
                    removed.add(name)
            conn.executemany(
                f"INSERT INTO {table.name} ({table.owner_column}, name, value) VALUES (?, ?, ?) "
                f"ON CONFLICT ({table.owner_column}, name) DO UPDATE SET value = excluded.value",
                [(owner, name, value) for name, value in values.items()],
            )
            if values or removed:
                _bump(conn)
        return frozenset(removed)

    # --- reads ---

    def key(self, key_id: str) -> KeyRow | None:
        with self._connect() as conn:
            r = conn.execute(
                "SELECT id, org, scopes, created, revoked FROM keys WHERE id = ?", (key_id,)
            ).fetchone()
        return None if r is None else KeyRow(r[0], r[1], _loads(r[2]), r[3], r[4])

    def key_settings(
        self, *, org: str | None = None, key_id: str | None = None
    ) -> dict[str, dict[str, str]]:
        """Keys' settings as stored (text), by key id then name; revoked keys' too.

        Every key's, or those of ``org``'s keys, or of the key ``key_id``.
        """
        query = (
            "SELECT s.key_id, s.name, s.value FROM key_settings s JOIN keys k ON k.id = s.key_id"
        )
        conditions: list[str] = []
        params: list[str] = []
        if org is not None:
            conditions.append("k.org = ?")
            params.append(org)
        if key_id is not None:
            conditions.append("k.id = ?")
            params.append(key_id)
        if conditions:
            query += " WHERE " + " AND ".join(conditions)
        with self._connect() as conn:
            rows = conn.execute(query + " ORDER BY k.created, k.id, s.name", params).fetchall()
        return grouped(rows)

    def list_keys(self, org: str | None = None) -> list[KeyRow]:
        query = "SELECT id, org, scopes, created, revoked FROM keys"
        params: tuple[str, ...] = ()
        if org is not None:
            query += " WHERE org = ?"
            params = (org,)
        with self._connect() as conn:
            rows = conn.execute(query + " ORDER BY created, id", params).fetchall()
        return [KeyRow(r[0], r[1], _loads(r[2]), r[3], r[4]) for r in rows]

    def list_orgs(self) -> list[OrgRow]:
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT o.name, o.tags, o.created, "
                "(SELECT COUNT(*) FROM keys k WHERE k.org = o.name AND k.revoked IS NULL) "
                "FROM orgs o ORDER BY o.name"
            ).fetchall()
        return [OrgRow(r[0], _loads(r[1]), r[2], r[3]) for r in rows]

    def org_tags(self, org: str) -> tuple[str, ...] | None:
        with self._connect() as conn:
            row = conn.execute("SELECT tags FROM orgs WHERE name = ?", (org,)).fetchone()
        return None if row is None else _loads(row[0])

    def org_settings(self, org: str) -> dict[str, str] | None:
        """The organisation's settings as stored (text), or None when it does not exist."""
        with self._connect() as conn:
            conn.execute("BEGIN")
            if conn.execute("SELECT 1 FROM orgs WHERE name = ?", (org,)).fetchone() is None:
                return None
            rows = conn.execute(
                "SELECT name, value FROM org_settings WHERE org = ? ORDER BY name", (org,)
            ).fetchall()
        return {name: value for name, value in rows}

    def revision(self) -> int:
        with self._connect() as conn:
            value: int = conn.execute("SELECT value FROM revision WHERE id = 1").fetchone()[0]
        return value

    def load_active(self) -> Loaded:
        """The revision, every active key with its org's tags, the orgs' and the keys' settings,
        every organisation's tags.

        Read in one transaction: keys and settings are those of the revision.
        """
        with self._connect() as conn:
            conn.execute("BEGIN")  # a read transaction: the rows are those of the revision
            revision: int = conn.execute("SELECT value FROM revision WHERE id = 1").fetchone()[0]
            rows = conn.execute(ACTIVE_KEYS.format(keys="keys", orgs="orgs")).fetchall()
            setting_rows = conn.execute("SELECT org, name, value FROM org_settings").fetchall()
            key_setting_rows = conn.execute(
                "SELECT s.key_id, s.name, s.value FROM key_settings s "
                "JOIN keys k ON k.id = s.key_id WHERE k.revoked IS NULL"
            ).fetchall()
            org_rows = conn.execute("SELECT name, tags FROM orgs").fetchall()
        return Loaded.from_rows(revision, rows, setting_rows, key_setting_rows, org_rows)


def _new_connection(path: Path, *, shared: bool) -> sqlite3.Connection:
    """``shared``: kept open and used from whichever worker thread runs the call."""
    conn = sqlite3.connect(path, timeout=_BUSY_TIMEOUT_S, check_same_thread=not shared)
    try:
        conn.execute("PRAGMA foreign_keys = ON")
        # Sorts and temporary indexes in memory: a read never needs a temporary file.
        conn.execute("PRAGMA temp_store = MEMORY")
    except BaseException:
        conn.close()
        raise
    return conn


def _ensure_schema(conn: sqlite3.Connection, path: Path) -> None:
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise sqlite3.DatabaseError(
            f"{path} has schema version {version}; this prism-keys knows "
            f"{SCHEMA_VERSION}: upgrade prism-keys"
        )
    conn.executescript(_SCHEMA)
    migrate_sqlite(conn)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def _identity(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _bump(conn: sqlite3.Connection) -> None:
    conn.execute("UPDATE revision SET value = value + 1 WHERE id = 1")


def _dumps(items: list[str]) -> str:
    return orjson.dumps(items).decode()


def _loads(text: str) -> tuple[str, ...]:
    return tuple(str(item) for item in orjson.loads(text))
