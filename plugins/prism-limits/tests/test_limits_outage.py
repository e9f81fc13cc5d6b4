"""Redis goes away under three gateways: each keeps limits as configured, and when Redis
answers again counting resumes fleet-wide with budgets rebuilt from the ledger, once.

The gateways share a Redis of the test's own (killed and restarted on the same
port) and one PostgreSQL ledger: budgets are rebuilt from the ledger, and a
fleet's gateways must all write the same one.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import aiohttp
import asyncpg
import openai
import pytest
import redis.asyncio as aioredis
from prism_fake_upstream import Fault
from prism_limits.fleet import FleetCounters
from prism_limits.limits import format_money
from prism_limits.plugin import limiter_of
from prism_redis.testing import PrivateRedis

from prism_proxy.testing import eventually

from .conftest import catalog

HI = [{"role": "user", "content": "hi"}]
PLUGINS = ["openai", "limits", "billing", "redis"]
#: acme's total budget, as its counter is named in Redis (under the prefix).
ACME_TOTAL = "limits:organisation:acme:*:budget:0"


@pytest.fixture
async def redis_up(private_redis: PrivateRedis) -> PrivateRedis:
    """prism-redis's private Redis, started (the tests kill and start it again)."""
    await private_redis.started()
    return private_redis


async def start_fleet(
    prism_gateway: Any, prism_fake: Any, url: str, prefix: str, ledger_url: str, mode: str
) -> list[Any]:
    sections = {
        "billing": {"ledger_url": ledger_url},
        "redis": {
            "url": url,
            "key_prefix": prefix,
            # Generous, so that a loaded machine does not look like an outage; a short
            # sync_s so that the gateways see Redis answer again soon after it does.
            "timeout_ms": 2000,
            "sync_s": 0.05,
        },
        "limits": {"on_shared_state_loss": mode},
    }
    return [
        await prism_gateway(catalog(prism_fake), sections=sections, load_plugins=PLUGINS)
        for _ in range(3)
    ]


def fleet_of(gw: Any) -> FleetCounters:
    limiter = limiter_of(gw.gateway.current)
    assert limiter is not None and limiter.fleet is not None
    return limiter.fleet


async def settled(gateways: list[Any]) -> None:
    for gw in gateways:
        await fleet_of(gw).settled()


async def outcome(gw: Any, who: str = "k@acme") -> str:
    """``served``, or the error code the caller got."""
    try:
        async with gw.openai(default_headers={"x-test-key": who}) as client:
            await client.chat.completions.create(model="m", messages=HI, max_tokens=5)
    except openai.APIStatusError as err:
        return f"{err.status_code} {err.code}"
    return "served"


async def readyz(gw: Any) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session:
        async with session.get(gw.url + "/readyz") as response:
            assert response.status == 200
            body: dict[str, Any] = await response.json()
            return body


async def ledger_nanos(url: str, org: str) -> int:
    conn = await asyncpg.connect(url)
    try:
        total = await conn.fetchval(
            "SELECT COALESCE(SUM(cost_nanos), 0) FROM ledger "
            "WHERE org = $1 AND traffic = 'customer' AND provider IS NOT NULL",
            org,
        )
    finally:
        await conn.close()
    return int(total)


async def redis_spent(url: str, prefix: str) -> int | None:
    client = aioredis.Redis.from_url(url, decode_responses=True)
    try:
        spent = await client.hget(f"{prefix}:{ACME_TOTAL}", "spent")
    finally:
        await client.aclose()
    return None if spent is None else int(spent)


async def returned(gateways: list[Any], times: int) -> None:
    """Wait until every gateway rebased ``times`` after Redis answered again."""
    await eventually(
        lambda: all(fleet_of(gw).returns >= times for gw in gateways),
        timeout_s=15,
        what="every gateway rebased after Redis answered again",
    )


@pytest.mark.parametrize("mode", ["share", "open", "closed"])
async def test_redis_dies_each_gateway_keeps_limits_as_configured_and_counting_resumes(
    mode, prism_gateway, prism_fake, prism_postgres, redis_up, callers
):
    callers.org("acme", rpm="30", budget="1/total")
    prefix = f"prism-test-{secrets.token_hex(6)}"
    gateways = await start_fleet(
        prism_gateway, prism_fake, redis_up.url, prefix, prism_postgres, mode
    )
    # Each gateway admits a call after all three did: each saw the fleet of three.
    for _ in range(2):
        for gw in gateways:
            assert await outcome(gw) == "served"
    await settled(gateways)

    redis_up.kill()
    during = [[await outcome(gw) for _ in range(15)] for gw in gateways]
    if mode == "share":
        # Each keeps its share of the fleet's 30 a minute: 30 / 3 gateways.
        assert during == [["served"] * 10 + ["429 rate_limited"] * 5] * 3
    elif mode == "open":
        assert during == [["served"] * 15] * 3
    else:
        assert during == [["503 limits_unavailable"] * 15] * 3
    for gw in gateways:
        ready = await readyz(gw)
        assert ready["shared_state"] == "degraded"
        assert ready["limits"]["state"] == "degraded"
        assert ready["limits"]["counted"] == f"locally ({mode})"
        assert ready["limits"]["gateways"] == 3

    await redis_up.started()  # on the same port, empty
    await returned(gateways, 1)
    for gw in gateways:
        ready = await readyz(gw)
        assert (ready["shared_state"], ready["limits"]["state"]) == ("ok", "ok")
        assert ready["limits"]["counted"] == "fleet"
    # Counted fleet-wide again: one gateway serves the fleet's 30, not its share of 10.
    after = [await outcome(gateways[0]) for _ in range(40)]
    assert after == ["served"] * 30 + ["429 rate_limited"] * 10
    await settled(gateways)
    # The budget was rebuilt from the ledger: every call served counted once.
    assert await redis_spent(redis_up.url, prefix) == await ledger_nanos(prism_postgres, "acme")


async def test_a_redis_back_with_its_data_is_rebased_once_outage_calls_settled(
    prism_gateway, prism_fake, prism_postgres, prism_clock, redis_up, callers
):
    callers.org("acme", budget="1/total")
    prefix = f"prism-test-{secrets.token_hex(6)}"
    gateways = await start_fleet(
        prism_gateway, prism_fake, redis_up.url, prefix, prism_postgres, "share"
    )
    for _ in range(2):
        for gw in gateways:
            assert await outcome(gw) == "served"
    await settled(gateways)
    before = await ledger_nanos(prism_postgres, "acme")
    assert await redis_spent(redis_up.url, prefix) == before

    # Redis stops with its data on disk: what it holds is what was spent until now.
    await redis_up.save()
    redis_up.kill()
    for gw in gateways:
        assert await outcome(gw) == "served"  # counted locally: in the ledger, not in Redis
    # One call still in flight when Redis is back: its upstream waits for the test's clock.
    prism_fake.clock = prism_clock
    prism_fake.script("a", [Fault(first_token_delay_s=5)])
    hits = prism_fake.hits("a")
    slow = asyncio.create_task(outcome(gateways[0]))
    await eventually(lambda: prism_fake.hits("a") == hits + 1, what="the slow call upstream")

    await redis_up.started()  # with the snapshot: the spend of the outage is missing from it
    await returned(gateways, 1)
    assert fleet_of(gateways[0]).settling  # its outage call is still running
    assert not any(fleet_of(gw).settling for gw in gateways[1:])
    # Rebased: the counter is rebuilt from the ledger, the calls of the outage included.
    for gw in gateways:
        assert await outcome(gw) == "served"
    await settled(gateways)
    assert await redis_spent(redis_up.url, prefix) == await ledger_nanos(prism_postgres, "acme")
    # The slow call settles: its cost reaches the ledger, not Redis; rebased once more.
    prism_clock.advance(5)
    assert await slow == "served"
    await eventually(
        lambda: not fleet_of(gateways[0]).settling, what="the rebase once the call settled"
    )
    for gw in gateways:
        assert await outcome(gw) == "served"
    await settled(gateways)
    total = await ledger_nanos(prism_postgres, "acme")
    assert total > before
    # Neither the snapshot's stale spend nor anything counted twice: the ledger's total.
    assert await redis_spent(redis_up.url, prefix) == total


async def test_flushing_the_fleets_keys_mid_period_gives_nobody_a_fresh_budget(
    prism_gateway, prism_fake, prism_postgres, prism_redis, callers
):
    callers.org("acme", budget="1/total")
    gateways = await start_fleet(
        prism_gateway, prism_fake, prism_redis.url, prism_redis.prefix, prism_postgres, "share"
    )
    for gw in gateways:
        assert await outcome(gw) == "served"
    await settled(gateways)
    spent = await ledger_nanos(prism_postgres, "acme")
    # The budget is exactly what was spent: no call fits any more.
    callers.org("acme", budget=f"{format_money(spent)}/total")
    for gw in gateways:
        assert await outcome(gw) == "429 budget_exceeded"

    client = aioredis.Redis.from_url(prism_redis.url)
    try:
        keys = [key async for key in client.scan_iter(match=f"{prism_redis.prefix}:*")]
        assert keys
        await client.delete(*keys)  # FLUSHALL, for this fleet's keys only
    finally:
        await client.aclose()
    for gw in gateways:
        assert await outcome(gw) == "429 budget_exceeded"
    assert await redis_spent(prism_redis.url, prism_redis.prefix) == spent


async def test_a_second_outage_counts_from_the_ledger_not_from_the_first_ones_counters(
    prism_gateway, prism_fake, prism_postgres, redis_up, callers
):
    callers.org("acme", budget="1/total")
    prefix = f"prism-test-{secrets.token_hex(6)}"
    gateways = await start_fleet(
        prism_gateway, prism_fake, redis_up.url, prefix, prism_postgres, "share"
    )
    for gw in [*gateways, *gateways]:
        assert await outcome(gw) == "served"
    await settled(gateways)
    redis_up.kill()
    assert await outcome(gateways[0]) == "served"  # counted in gateway 0's own counters
    counted_then = await ledger_nanos(prism_postgres, "acme")
    await redis_up.started()
    # Gateway 0 served during the outage, so it saw it; the others may have missed a
    # short one (nothing asked them), and one rebase is the whole fleet's.
    await returned(gateways[:1], 1)
    # The fleet spends on between the outages.
    for gw in gateways * 4:
        assert await outcome(gw) == "served"
    await settled(gateways)
    # Gateway 0's share of the budget: what the first outage left it plus a call's
    # reservation, far less than what the fleet spent since.
    share = counted_then + 60_000
    callers.org("acme", budget=f"{format_money(3 * share)}/total")
    redis_up.kill()
    assert await outcome(gateways[0]) == "429 budget_exceeded"


async def test_what_a_dead_gateway_reserved_comes_back_even_after_its_leases_key_expired(
    prism_gateway, prism_fake, prism_postgres, prism_redis, callers
):
    callers.org("acme", budget="1/total")
    gateways = await start_fleet(
        prism_gateway, prism_fake, prism_redis.url, prism_redis.prefix, prism_postgres, "share"
    )
    assert await outcome(gateways[0]) == "served"
    await settled(gateways)
    key = f"{prism_redis.prefix}:{ACME_TOTAL}"
    client = aioredis.Redis.from_url(prism_redis.url, decode_responses=True)
    try:
        # A gateway died holding the whole budget; nobody admitted for two leases since,
        # so the key of the leases expired with every lease in it.
        await client.hset(key, mapping={"reserved": str(10**9), "r:ghost": str(10**9)})
        assert await client.exists(key + ":leases") == 0
        assert await outcome(gateways[1]) == "served"
        assert await client.hget(key, "r:ghost") is None
        assert await client.hget(key, "reserved") == "0"
    finally:
        await client.aclose()


async def test_a_long_call_keeps_its_slot_past_the_life_its_admission_gave_the_key(
    prism_gateway, prism_fake, prism_postgres, prism_redis, prism_clock, callers
):
    callers.org("acme", max_parallel="1")
    gateways = await start_fleet(
        prism_gateway, prism_fake, prism_redis.url, prism_redis.prefix, prism_postgres, "share"
    )
    prism_fake.clock = prism_clock
    prism_fake.script("a", [Fault(first_token_delay_s=5)])
    slow = asyncio.create_task(outcome(gateways[0]))
    await eventually(lambda: prism_fake.hits("a") == 1, what="the slow call upstream")
    key = f"{prism_redis.prefix}:limits:organisation:acme:*:max_parallel"
    fleet = fleet_of(gateways[0])
    client = aioredis.Redis.from_url(prism_redis.url, decode_responses=True)
    try:
        await client.pexpire(key, 1000)  # as if admitted two leases ago
        await fleet.renew(list(fleet.held.values()))  # what the renewal does every lease_s / 3
        assert await client.pttl(key) > 2 * fleet.lease_ms - 5000
        assert await outcome(gateways[1]) == "429 rate_limited"  # the slot is still held
    finally:
        await client.aclose()
    prism_clock.advance(5)
    assert await slow == "served"
