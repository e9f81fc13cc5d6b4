"""Shared pieces for the prism-redis tests: gateways sharing one key prefix, a private Redis."""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
import signal
import subprocess
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import attrs
import pytest
from prism_redis.testing import RedisUnderTest

from prism_proxy.testing import GatewayUnderTest, free_port

MESSAGES = [{"role": "user", "content": "hello"}]
#: The breaker as these tests want it: quick to trip, slow to hand out a second trial.
BREAKER = {
    "policies": "consecutive",
    "consecutive_failures": 3,
    "isolation_s": 60,
    "trial_spacing_s": 30,
    "trial_min_successes": 3,
    "refresh_s": 0.2,
}


@attrs.frozen
class Answer:
    status: int
    headers: dict[str, str]
    body: Any

    @property
    def provider(self) -> str | None:
        return self.headers.get("x-prism-provider")

    @property
    def log(self) -> str:
        return self.headers.get("x-prism-attempt-log", "")


async def chat(url: str, model: str = "m", **body: Any) -> Answer:
    payload = {"model": model, "messages": MESSAGES, **body}
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/v1/chat/completions", json=payload) as response:
            data: Any = await response.read()
            if response.content_type == "application/json":
                data = await response.json()
            return Answer(response.status, dict(response.headers), data)


async def get_json(url: str, path: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session:
        async with session.get(url + path) as response:
            data: dict[str, Any] = await response.json()
            return data


async def binding_state(url: str, binding: str) -> str:
    health = await get_json(url, "/prism/health")
    return next(b["state"] for b in health["bindings"] if b["binding"] == binding)


async def until(
    predicate: Callable[[], Awaitable[bool]], timeout_s: float = 10.0, every_s: float = 0.02
) -> float:
    """Wait for ``predicate``; returns how long it took."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while not await predicate():
        if loop.time() - start > timeout_s:
            raise AssertionError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(every_s)
    return loop.time() - start


def two_line_catalog(fake: Any, first: str = "x", then: str = "ok", **options: Any) -> dict:
    """Model ``m``: ``first`` (with ``options`` on its line), then ``then``; provider = scenario."""
    return {
        "providers": {n: {"kind": "openai", "base_url": fake.base_url(n)} for n in (first, then)},
        "models": {
            "m": {
                "retries": 0,
                "chain": [
                    {"provider": first, "model": f"up-{first}", **options},
                    {"provider": then, "model": f"up-{then}"},
                ],
            }
        },
    }


StartFleet = Callable[..., Awaitable[list[GatewayUnderTest]]]


@pytest.fixture
def fleet(prism_gateway: Any, prism_redis: RedisUnderTest) -> StartFleet:
    """``await fleet(n, catalog, breaker={...})``: n gateways in this process sharing a prefix."""

    async def start(
        n: int,
        catalog: dict,
        *,
        breaker: dict[str, Any] | None = None,
        redis: dict[str, Any] | None = None,
        url: str | None = None,
    ) -> list[GatewayUnderTest]:
        sections = {
            "redis": {
                "url": url or prism_redis.url,
                "key_prefix": prism_redis.prefix,
                "sync_s": 0.1,
                # A busy test machine can hold Redis up for a few hundred ms; only
                # the tests about outages want one noticed sooner (they say so).
                "timeout_ms": 1000,
                **(redis or {}),
            },
            "breaker": {**BREAKER, **(breaker or {})},
        }
        return [
            await prism_gateway(
                catalog, sections=sections, load_plugins=["openai", "breaker", "redis"]
            )
            for _ in range(n)
        ]

    return start


@attrs.define
class PrivateRedis:
    """A ``redis-server`` of this test's own on a free port, stopped by its process id."""

    port: int
    workdir: Path
    #: It asks for one, so tests can check it never shows.
    password: str = "pw-" + secrets.token_hex(8)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@127.0.0.1:{self.port}/0"

    def start(self) -> None:
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

    async def started(self) -> None:
        self.start()
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(self.url)
        try:

            async def answers() -> bool:
                try:
                    return bool(await client.ping())
                except (OSError, aioredis.RedisError):
                    return False

            await until(answers, timeout_s=10)
        finally:
            await client.aclose()

    def pause(self) -> None:
        """Stop it answering (SIGSTOP): what it is sent waits in its sockets."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    async def audit(self, prefix: str) -> list[dict[str, Any]]:
        """The breaker's audit rows under ``prefix``, newest first."""
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(self.url, decode_responses=True)
        try:
            rows = await client.lrange(f"{prefix}:breaker:audit", 0, -1)
        finally:
            await client.aclose()
        return [json.loads(row.partition("|")[2]) for row in rows]

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            self.process = None


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    server = PrivateRedis(free_port(), tmp_path)
    try:
        yield server
    finally:
        server.kill()
