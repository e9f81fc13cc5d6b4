"""The key database (SQLite): organisations with tags, keys with scopes and their hashes.

Written by ``prism keys ...`` and read by the gateway's refresh task.  Every
write bumps one revision number in the same transaction, so a gateway polls
a single row and reloads only when something changed.  A key's text is never
stored, only its SHA-256 (see :mod:`prism_keys.tokens`).

All functions are blocking; the gateway calls them from a worker thread.
"""

from __future__ import annotations

import contextlib
import enum
import re
import sqlite3
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import attrs
import orjson

from .tokens import NewKey, new_key

__all__ = [
    "KeyRow",
    "KeyStore",
    "LoadedKey",
    "InvalidName",
    "OrgRow",
    "Revoked",
    "check_name",
]

SCHEMA_VERSION = 1
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
"""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,63}")


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


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@attrs.frozen
class KeyStore:
    path: Path

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(self.path, timeout=10)
        try:
            conn.execute("PRAGMA foreign_keys = ON")
            with conn:  # one transaction: commit on success, roll back on error
                yield conn
        finally:
            conn.close()

    def ensure_schema(self) -> None:
        """Create the tables if missing; refuse a database made by a newer version."""
        with self._connect() as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise sqlite3.DatabaseError(
                    f"{self.path} has schema version {version}; this prism-keys knows "
                    f"{SCHEMA_VERSION}: upgrade prism-keys"
                )
            conn.executescript(_SCHEMA)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

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

    # --- reads ---

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

    def revision(self) -> int:
        with self._connect() as conn:
            value: int = conn.execute("SELECT value FROM revision WHERE id = 1").fetchone()[0]
        return value

    def load_active(self) -> tuple[int, list[LoadedKey]]:
        """The revision and every active key with its org's tags, read in one transaction."""
        with self._connect() as conn:
            revision: int = conn.execute("SELECT value FROM revision WHERE id = 1").fetchone()[0]
            rows = conn.execute(
                "SELECT k.id, k.hash, k.org, o.tags, k.scopes FROM keys k "
                "JOIN orgs o ON o.name = k.org WHERE k.revoked IS NULL"
            ).fetchall()
        return revision, [LoadedKey(r[0], r[1], r[2], _loads(r[3]), _loads(r[4])) for r in rows]


def _bump(conn: sqlite3.Connection) -> None:
    conn.execute("UPDATE revision SET value = value + 1 WHERE id = 1")


def _dumps(items: list[str]) -> str:
    return orjson.dumps(items).decode()


def _loads(text: str) -> tuple[str, ...]:
    return tuple(str(item) for item in orjson.loads(text))
