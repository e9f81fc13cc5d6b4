"""A pytest plugin shipped with prism-billing (entry point ``pytest11``): PostgreSQL for tests.

- ``prism_postgres``: the URL of a fresh, empty database on the server at
  :data:`POSTGRES_SERVER`, dropped after the test.  prism-keys' tests use
  it too (prism-billing is in their ``test`` extra).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest

__all__ = ["POSTGRES_SERVER"]

#: The PostgreSQL server tests use (trust authentication, user ``postgres``).
POSTGRES_SERVER = "127.0.0.1:5432"


@pytest.fixture
async def prism_postgres() -> AsyncIterator[str]:
    """A fresh, empty PostgreSQL database for this test (its URL); dropped at the end.

    Skips the test when no server answers at :data:`POSTGRES_SERVER`.
    """
    import secrets

    import asyncpg

    try:
        admin = await asyncpg.connect(
            f"postgresql://postgres@{POSTGRES_SERVER}/postgres", timeout=5
        )
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        pytest.skip(f"PostgreSQL is not reachable at {POSTGRES_SERVER} as postgres: {exc}")
    name = f"prism_test_{secrets.token_hex(6)}"
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        yield f"postgresql://postgres@{POSTGRES_SERVER}/{name}"
    finally:
        # A test may have closed the database to connections to play an outage.
        with contextlib.suppress(asyncpg.PostgresError):
            await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
