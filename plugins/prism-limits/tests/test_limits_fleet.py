"""Three gateways sharing Redis count every limit once: exact across the fleet."""

from __future__ import annotations

import asyncio
import sqlite3
from decimal import Decimal
from typing import Any

import openai
from prism_fake_upstream import Fault
from prism_limits.plugin import limiter_of

from prism_proxy import SHARED_STATE

from .conftest import catalog

HI = [{"role": "user", "content": "hi"}]
PLUGINS = ["openai", "limits", "billing", "redis"]


async def fleet(prism_gateway: Any, prism_fake: Any, prism_redis: Any, tmp_path: Any) -> list[Any]:
    gateways = []
    for number in range(3):
        gateways.append(
            await prism_gateway(
                catalog(prism_fake),
                sections={
                    "billing": {"ledger_path": str(tmp_path / f"ledger{number}.sqlite")},
                    # Generous: a loaded test machine must not look like a Redis outage.
                    "redis": {
                        "url": prism_redis.url,
                        "key_prefix": prism_redis.prefix,
                        "timeout_ms": 5000,
                    },
                },
                load_plugins=PLUGINS,
            )
        )
    return gateways


async def call_all(gateways: list[Any], key: str, count: int, **body: Any) -> list[Any]:
    """``count`` calls at once, spread over the gateways in turn."""

    async def one(gw: Any) -> Any:
        async with gw.openai(default_headers={"x-test-key": key}) as client:
            return await client.chat.completions.with_raw_response.create(
                model="m", messages=HI, **body
            )

    return await asyncio.gather(
        *(one(gateways[n % len(gateways)]) for n in range(count)), return_exceptions=True
    )


async def settled(gateways: list[Any]) -> None:
    for gw in gateways:
        limiter = limiter_of(gw.gateway.current)
        assert limiter is not None and limiter.fleet is not None
        await limiter.fleet.settled()


def split(outcomes: list[Any]) -> tuple[list[Any], list[Any]]:
    served = [o for o in outcomes if not isinstance(o, BaseException)]
    refused = [o for o in outcomes if isinstance(o, openai.RateLimitError)]
    assert len(served) + len(refused) == len(outcomes), [
        o for o in outcomes if isinstance(o, BaseException) and o not in refused
    ]
    return served, refused


async def test_rpm_on_one_key_is_exact_across_three_gateways(
    prism_gateway, prism_fake, prism_redis, callers, tmp_path
):
    callers.key("shared", rpm="30")
    gateways = await fleet(prism_gateway, prism_fake, prism_redis, tmp_path)
    served, refused = split(await call_all(gateways, "shared", 90))
    assert len(served) == 30 and len(refused) == 60
    assert prism_fake.hits("a") == 30
    # Every gateway served some: the limit is the fleet's, not divided up front.
    by_gateway = {raw.http_request.url.port for raw in served}
    assert len(by_gateway) == 3
    assert all("key shared rpm 30" in err.message for err in refused)
    # One round trip per call to Redis at admission, whatever the number of limits.
    trips = [gw.gateway.current.services.get(SHARED_STATE).round_trips for gw in gateways]
    assert sum(t.get("limits_admit", 0) for t in trips) == 90


async def test_max_parallel_is_never_exceeded_fleet_wide(
    prism_gateway, prism_fake, prism_redis, callers, tmp_path
):
    callers.org("acme", max_parallel="4")
    prism_fake.script("a", [Fault(first_token_delay_s=0.5)] * 12)
    gateways = await fleet(prism_gateway, prism_fake, prism_redis, tmp_path)
    served, refused = split(await call_all(gateways, "k@acme", 12))
    assert len(served) == 4 and len(refused) == 8
    assert prism_fake.hits("a") == 4
    # Settled calls gave their slots back.
    served, _ = split(await call_all(gateways, "k@acme", 3))
    assert len(served) == 3


async def test_fifty_concurrent_callers_never_overspend_a_budget(
    prism_gateway, prism_fake, prism_redis, callers, tmp_path
):
    # Each call reserves its worst case (about 0.002) and really costs about 0.00002.
    callers.org("acme", budget="0.01/day")
    gateways = await fleet(prism_gateway, prism_fake, prism_redis, tmp_path)
    prism_fake.script("a", [Fault(first_token_delay_s=0.2)] * 50)
    served, refused = split(await call_all(gateways, "k@acme", 50, max_tokens=1000))
    assert served and refused
    assert all(err.code == "budget_exceeded" for err in refused)
    spent = sum(_costs(tmp_path / f"ledger{n}.sqlite") for n in range(3))
    assert 0 < spent <= Decimal("0.01")
    # Reservations given back: sequential calls now fit again.
    await settled(gateways)  # settlements in shared state are not awaited by the caller
    served, _ = split(await call_all(gateways[:1], "k@acme", 2, max_tokens=1000))
    assert len(served) == 2


async def test_tpm_is_corrected_by_the_usage_at_settlement_fleet_wide(
    prism_gateway, prism_fake, prism_redis, callers, tmp_path
):
    callers.org("acme", tpm="500")
    gateways = await fleet(prism_gateway, prism_fake, prism_redis, tmp_path)
    prism_fake.script("a", [Fault(first_token_delay_s=0.3)] * 2)
    # Each reserves its prompt and max_tokens 200: two fit at once, not four...
    served, refused = split(await call_all(gateways, "k@acme", 4, max_tokens=200))
    assert len(served) == 2 and len(refused) == 2
    await settled(gateways)
    # ...but each really used a few tokens, so after settlement there is room again.
    served, _ = split(await call_all(gateways, "k@acme", 2, max_tokens=200))
    assert len(served) == 2


def _costs(path: Any) -> Decimal:
    conn = sqlite3.connect(path)
    try:
        (total,) = conn.execute("SELECT COALESCE(SUM(cost_nanos), 0) FROM ledger").fetchone()
    finally:
        conn.close()
    return Decimal(total).scaleb(-9)
