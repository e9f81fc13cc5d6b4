"""A pytest plugin shipped with prism-redis (entry point ``pytest11``): Redis for tests.

- ``prism_redis``: this test's own key prefix on the Redis at
  :data:`REDIS_SERVER` (a :class:`RedisUnderTest`); its keys are deleted after.
- ``private_redis``: a ``redis-server`` of the test's own (a :class:`PrivateRedis`),
  for tests that kill, pause or restart Redis; not started until the test says so.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import attrs
import pytest

from prism_proxy.testing import free_port

__all__ = ["REDIS_SERVER", "PrivateRedis", "RedisUnderTest"]

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


@attrs.define
class PrivateRedis:
    """A ``redis-server`` of one test's own on a free port, stopped by its process id.

    It asks for a password (tests check it never shows) and writes nothing by
    itself (``--save ''``): :meth:`save` writes a snapshot it loads when
    started again, as a Redis restarted with its data does.
    """

    port: int
    workdir: Path
    password: str = attrs.field(factory=lambda: "pw-" + secrets.token_hex(8))
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@127.0.0.1:{self.port}/0"

    async def started(self) -> None:
        """Start it (again, on the same port) and wait until it answers."""
        import redis.asyncio as aioredis

        self.process = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
                "--requirepass",
                self.password,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = aioredis.Redis.from_url(self.url)
        try:
            for _ in range(500):
                try:
                    if await client.ping():
                        return
                except (OSError, aioredis.RedisError):
                    await asyncio.sleep(0.02)
            raise AssertionError(f"redis-server on port {self.port} did not answer")
        finally:
            await client.aclose()

    async def save(self) -> None:
        """Write its snapshot (loaded when it is started again)."""
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(self.url)
        try:
            await client.save()
        finally:
            await client.aclose()

    def pause(self) -> None:
        """Stop it answering (SIGSTOP): what it is sent waits in its sockets."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        if self.process is not None:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGCONT)  # a paused one dies too
                self.process.kill()
            self.process.wait(10)
            self.process = None


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A Redis of this test's own (:class:`PrivateRedis`), killed after; skips the
    test when ``redis-server`` is not installed."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    server = PrivateRedis(free_port(), tmp_path)
    try:
        yield server
    finally:
        server.kill()
