"""A pytest plugin shipped with prism-redis (entry point ``pytest11``): Redis for tests.

- ``prism_redis``: this test's own key prefix on the Redis at
  :data:`REDIS_SERVER` (a :class:`RedisUnderTest`); its keys are deleted after.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import attrs
import pytest

__all__ = ["REDIS_SERVER", "RedisUnderTest"]

#: The Redis server tests use.
REDIS_SERVER = "127.0.0.1:6379"


@attrs.frozen
class RedisUnderTest:
    """A Redis URL and a key prefix no other test uses."""

    url: str
    prefix: str


@pytest.fixture
async def prism_redis() -> AsyncIterator[RedisUnderTest]:
    """This test's own key prefix on the Redis at :data:`REDIS_SERVER`; its keys go after.

    Skips the test when no server answers.
    """
    import secrets

    import redis.asyncio as aioredis

    url = f"redis://{REDIS_SERVER}/0"
    client = aioredis.Redis.from_url(url, socket_connect_timeout=5)
    try:
        await client.ping()
    except (OSError, aioredis.RedisError) as exc:
        await client.aclose()
        pytest.skip(f"Redis is not reachable at {REDIS_SERVER}: {exc}")
    prefix = f"prism-test-{secrets.token_hex(6)}"
    try:
        yield RedisUnderTest(url, prefix)
    finally:
        keys = [key async for key in client.scan_iter(match=f"{prefix}:*", count=1000)]
        if keys:
            await client.delete(*keys)
        await client.aclose()
