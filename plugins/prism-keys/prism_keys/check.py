"""``prism check``: are API keys required, and does the key database answer (read-only)?"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import asyncpg

from prism_proxy import CheckLine

from .pg_store import PG_SCHEMA_VERSION
from .settings import SECTION, KeysSettings
from .store import SCHEMA_VERSION

__all__ = ["check_keys"]

SUBJECT = "keys"
#: Seconds to wait for PostgreSQL: to connect, then for each statement.
TIMEOUT_S = 5.0


async def check_keys(settings: KeysSettings | None, offline: bool) -> list[CheckLine]:
    if settings is None:
        return [
            CheckLine(
                SUBJECT,
                f"off: no [prism:{SECTION}] section; the gateway answers anyone who can reach it",
            )
        ]
    what = f"on, API keys required, from {settings.name}"
    if settings.db_url is None:
        assert settings.db_path is not None
        return [_sqlite(what, settings.db_path)]
    if offline:
        return [CheckLine(SUBJECT, f"{what}: not contacted (--offline)")]
    try:
        return [await _postgres(what, settings.db_url)]
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        return [CheckLine.unreachable(SUBJECT, what, exc, settings.db_url)]


def _counted(what: str, active: int | None, missing: str = "no key table yet") -> CheckLine:
    if not active:
        # Not a failure (a new deployment checks before its first key), but loud:
        # a gateway started like this refuses every call.
        found = missing if active is None else "no active key"
        return CheckLine(
            SUBJECT, f"{what}, {found}: every call is refused (401) until `prism keys create`"
        )
    return CheckLine(SUBJECT, f"{what}, {active} active key{'s' if active != 1 else ''}")


def _sqlite(what: str, path: Path) -> CheckLine:
    if not path.is_file():
        return _counted(what, None, "no such file yet")
    try:
        # mode=ro: never create, migrate or lock the file a running gateway reads.
        conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=TIMEOUT_S)
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                return CheckLine(
                    SUBJECT,
                    f"{what}: schema {version} is newer than this prism-keys understands "
                    f"({SCHEMA_VERSION})",
                    ok=False,
                )
            table = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'keys'"
            ).fetchone()
            if table is None:
                return _counted(what, None)
            (active,) = conn.execute("SELECT count(*) FROM keys WHERE revoked IS NULL").fetchone()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        return CheckLine(SUBJECT, f"{what}: cannot be read ({type(exc).__name__}: {exc})", False)
    return _counted(what, int(active))


async def _postgres(what: str, url: str) -> CheckLine:
    conn = await asyncpg.connect(url, timeout=TIMEOUT_S, command_timeout=TIMEOUT_S)
    try:
        async with conn.transaction(readonly=True):
            keys = await conn.fetchval("SELECT to_regclass('prism_keys_keys') IS NOT NULL")
            schema = await conn.fetchval("SELECT to_regclass('prism_keys_schema') IS NOT NULL")
            version = (
                await conn.fetchval("SELECT max(version) FROM prism_keys_schema")
                if schema
                else None
            )
            active = (
                await conn.fetchval("SELECT count(*) FROM prism_keys_keys WHERE revoked IS NULL")
                if keys
                else None
            )
    finally:
        await conn.close()
    if version is not None and version > PG_SCHEMA_VERSION:
        return CheckLine(
            SUBJECT,
            f"{what}: reachable, but its schema {version} is newer than this prism-keys "
            f"understands ({PG_SCHEMA_VERSION})",
            ok=False,
        )
    return _counted(f"{what}: reachable", None if active is None else int(active))
