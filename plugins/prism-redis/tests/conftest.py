"""Shared pieces for the prism-redis tests: gateways sharing one key prefix, a private Redis."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import attrs
import pytest
from prism_redis.testing import PrivateRedis, RedisUnderTest

from prism_proxy.testing import GatewayUnderTest

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


async def breaker_audit(server: PrivateRedis, prefix: str) -> list[dict[str, Any]]:
    """The breaker's audit rows under ``prefix`` in ``server``, newest first."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(server.url, decode_responses=True)
    try:
        rows = await client.lrange(f"{prefix}:breaker:audit", 0, -1)
    finally:
        await client.aclose()
    return [json.loads(row.partition("|")[2]) for row in rows]
