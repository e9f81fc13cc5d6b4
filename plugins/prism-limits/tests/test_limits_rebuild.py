"""A budget counter rebuilt from the ledger while calls settle loses no call and counts none twice.

Each rebuild reads the ledger while other calls are between their answer and
their row's commit; the rebuilt counter must still equal the ledger once all
have settled, however often it is dropped and rebuilt.
"""

from __future__ import annotations

import asyncio
import random
from decimal import Decimal
from typing import Any

import aiohttp
import attrs
import pytest
from prism_limits.plugin import limiter_of

from prism_proxy import SpendLedger, SpendSnapshot, SpendTotals, hookimpl

from .conftest import catalog, ledger_nanos

HI = [{"role": "user", "content": "hi"}]
ROUNDS = 12
IN_FLIGHT = 16


@attrs.define
class SlowRead:
    """The ledger's spend service, answering 20 ms after it read."""

    spend: SpendLedger

    async def spend_snapshot(self, since: Any, recent_since: Any) -> SpendSnapshot:
        snapshot = await self.spend.spend_snapshot(since, recent_since)
        await asyncio.sleep(0.02)
        return snapshot

    async def spend_since(self, since: Any) -> SpendTotals:
        return await self.spend.spend_since(since)


class SlowSettlement:
    """Another plugin's settlement taking a while after the ledger committed: the
    limits' count follows it, so a rebuild may read the row before it is counted."""

    @hookimpl
    def prism_settle(self, call: Any, settlement: Any) -> Any:
        return asyncio.sleep(random.random() * 0.02)


async def counted_nanos(gw: Any) -> int:
    """What the gateway's counter holds: the budget less what ``/prism/me`` says remains."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(gw.url + "/prism/me", headers={"x-test-key": "k@acme"}) as response,
    ):
        assert response.status == 200
        (found,) = (await response.json())["limits"]
    return int((Decimal("1000") - Decimal(found["remaining"])).scaleb(9))


@pytest.mark.parametrize("shared", [True, False], ids=["redis", "in-process"])
async def test_rebuilding_under_traffic_counts_every_call_once(
    prism_gateway, prism_fake, prism_redis, prism_plugin, callers, tmp_path, shared
):
    callers.org("acme", budget="1000/day")
    prism_plugin(SlowSettlement(), "test-slow-settlement")
    ledger = tmp_path / "ledger.sqlite"
    sections: dict[str, Any] = {"billing": {"ledger_path": str(ledger)}}
    plugins = ["openai", "limits", "billing"]
    if shared:
        sections["redis"] = {
            "url": prism_redis.url,
            "key_prefix": prism_redis.prefix,
            "timeout_ms": 5000,
        }
        plugins.append("redis")
    gw = await prism_gateway(catalog(prism_fake), sections=sections, load_plugins=plugins)
    limiter = limiter_of(gw.gateway.current)
    assert limiter is not None and (limiter.fleet is not None) is shared
    assert limiter.spend is not None
    # A slow ledger read: calls commit and settle while it runs.
    limiter.spend = SlowRead(limiter.spend)
    async with gw.openai(default_headers={"x-test-key": "k@acme"}) as client:

        async def call() -> None:
            await client.chat.completions.create(model="m", messages=HI, max_tokens=50)

        await call()  # the counter, built once
        for _ in range(ROUNDS):
            burst = [asyncio.ensure_future(call()) for _ in range(IN_FLIGHT)]
            # While the burst answers and settles: drop the counter, and one more call
            # rebuilds it from a ledger read racing those settlements.
            await asyncio.sleep(random.random() * 0.03)
            if limiter.fleet is not None:
                await limiter.fleet.rebase()
            else:
                limiter.local.forget_budgets()
            await asyncio.gather(call(), *burst)
            if limiter.fleet is not None:
                await limiter.fleet.settled()
            assert await counter_held(limiter)
            assert await counted_nanos(gw) == ledger_nanos(ledger)
    assert prism_fake.hits("a") == 1 + ROUNDS * (IN_FLIGHT + 1)


async def counter_held(limiter: Any) -> bool:
    """Does the engine hold the budget's counter (else /prism/me would read the ledger)?"""
    if limiter.fleet is None:
        return bool(limiter.local.budgets)
    client = limiter.fleet.link.connect()
    (key,) = await client.zrange(limiter.fleet.base + "budget-counters", 0, -1)
    return bool(await client.hexists(key, "spent"))
