"""``prism check``: is billing on, and does its PostgreSQL ledger answer (read-only)?"""

from __future__ import annotations

import asyncpg

from prism_proxy import CheckLine

from .pg_ledger import PG_SCHEMA_VERSION
from .settings import PLUGIN_NAME, BillingSettings

__all__ = ["check_ledger"]

SUBJECT = "billing"
#: Seconds to wait for PostgreSQL: to connect, then for each statement.
TIMEOUT_S = 5.0


async def check_ledger(settings: BillingSettings, offline: bool) -> list[CheckLine]:
    if not settings.enabled:
        return [
            CheckLine(
                SUBJECT,
                f"off: no [prism:{PLUGIN_NAME}] section names a ledger; calls are not recorded",
            )
        ]
    what = f"on, ledger {settings.ledger_name}"
    url = settings.ledger_url
    if url is None:
        assert settings.ledger_path is not None
        found = "exists" if settings.ledger_path.is_file() else "created when prism serve starts"
        return [CheckLine(SUBJECT, f"{what} (SQLite file, {found})")]
    if offline:
        return [CheckLine(SUBJECT, f"{what}: not contacted (--offline)")]
    try:
        return [await _postgres(what, url)]
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        return [CheckLine.unreachable(SUBJECT, what, exc, url)]


async def _postgres(what: str, url: str) -> CheckLine:
    conn = await asyncpg.connect(url, timeout=TIMEOUT_S, command_timeout=TIMEOUT_S)
    try:
        # Read-only: prism check may run against the production ledger.
        async with conn.transaction(readonly=True):
            table = await conn.fetchval("SELECT to_regclass('ledger') IS NOT NULL")
            schema = await conn.fetchval("SELECT to_regclass('prism_ledger_schema') IS NOT NULL")
            if not table:
                return CheckLine(
                    SUBJECT, f"{what}: reachable, no ledger table yet (prism serve creates it)"
                )
            version = (
                await conn.fetchval("SELECT max(version) FROM prism_ledger_schema")
                if schema
                else None
            )
            insert = await conn.fetchval("SELECT has_table_privilege('ledger', 'INSERT')")
    finally:
        await conn.close()
    if version is not None and version > PG_SCHEMA_VERSION:
        return CheckLine(
            SUBJECT,
            f"{what}: reachable, but its schema {version} is newer than this prism-billing "
            f"understands ({PG_SCHEMA_VERSION})",
            ok=False,
        )
    if not insert:
        return CheckLine(
            SUBJECT, f"{what}: reachable, but this user may not insert into table ledger", ok=False
        )
    return CheckLine(SUBJECT, f"{what}: reachable, table ledger present and writable")
