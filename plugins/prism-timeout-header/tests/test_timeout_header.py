"""x-prism-timeout-ms through the real gateway, against a stalling fake upstream."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from prism_fake_upstream import Fault
from prism_timeout_header import TimeoutPolicy, apply_header

from prism_proxy import ConfigError, ManualClock, config_from_mapping
from prism_proxy.testing import eventually

MESSAGES = [{"role": "user", "content": "hi"}]


def catalog(fake) -> dict:
    return {
        "providers": {
            "slow": {"kind": "openai", "base_url": fake.base_url("slow-one")},
            "fast": {"kind": "openai", "base_url": fake.base_url("fast-one")},
        },
        "models": {
            "m": {"chain": [{"provider": "slow", "model": "a"}, {"provider": "fast", "model": "b"}]}
        },
    }


async def post(
    gw, headers: dict[str, str], fake: Any = None, clock: ManualClock | None = None, *stalls: float
):
    """The answer, and how long the gateway's clock ran while it was awaited.

    With ``clock`` (the gateway's and the fake's), each of the ``stalls``
    passes once the slow line has the request it stalls (and not before).
    """
    clock_at = clock.now() if clock is not None else 0.0
    async with aiohttp.ClientSession() as session, asyncio.timeout(10):
        answer = asyncio.ensure_future(
            session.post(
                gw.base_url + "/chat/completions",
                json={"model": "m", "messages": MESSAGES},
                headers=headers,
            )
        )
        for hit, stall_s in enumerate(stalls, 1):
            assert clock is not None
            await eventually(lambda: fake.hits("slow-one") == hit)  # noqa: B023
            clock.advance(stall_s)
        async with await answer as response:
            await response.read()
            return response, (clock.now() - clock_at if clock is not None else None)


async def clocked(prism_gateway, fake, clock: ManualClock, **kwargs: Any):
    """A gateway whose clock, and its fake's, is ``clock``."""
    fake.clock = clock
    return await prism_gateway(catalog(fake), clock=clock, **kwargs)


def attempt_ms(response) -> list[int]:
    log = response.headers["x-prism-attempt-log"].split("; ")
    return [int(entry.rsplit(" ", 1)[1].removesuffix("ms")) for entry in log]


async def test_short_timeout_fails_over_without_a_timeout_retry(
    prism_fake, prism_gateway, prism_clock
):
    prism_fake.script("slow-one", [Fault(stall_s=30), Fault(stall_s=30)])
    gw = await clocked(prism_gateway, prism_fake, prism_clock)
    # One 1.5 s timeout (kept up to a tenth late), no retry of it (below the 60 s default).
    response, _ = await post(gw, {"x-prism-timeout-ms": "1500"}, prism_fake, prism_clock, 1.6)
    assert response.status == 200
    assert 1500 <= attempt_ms(response)[0] <= 1600
    assert response.headers["x-prism-timeout-ms"] == "1500"
    assert prism_fake.hits("slow-one") == 1
    assert response.headers["x-prism-attempt-log"].startswith("slow/a timeout - ")
    assert response.headers["x-prism-provider"] == "fast"


async def test_timeout_at_the_default_is_retried_once(prism_fake, prism_gateway, prism_clock):
    prism_fake.script("slow-one", [Fault(stall_s=30), Fault(stall_s=30), Fault(stall_s=30)])
    gw = await clocked(prism_gateway, prism_fake, prism_clock, config={"attempt_timeout_ms": 1000})
    response, elapsed = await post(
        gw, {"x-prism-timeout-ms": "1000"}, prism_fake, prism_clock, 1.1, 1.1
    )
    assert response.status == 200
    assert prism_fake.hits("slow-one") == 2  # at most one timeout retry, then failover
    assert [1000 <= ms <= 1100 for ms in attempt_ms(response)[:2]] == [True, True]
    assert 1.9 < elapsed < 6


@pytest.mark.parametrize("value", ["abc", "1.5", "1500ms", "-200", "+1500", " "])
async def test_garbage_is_ignored_and_said_so(prism_fake, prism_gateway, prism_clock, value):
    prism_fake.script("slow-one", [Fault(stall_s=0.3)])
    gw = await clocked(prism_gateway, prism_fake, prism_clock, config={"attempt_timeout_ms": 1000})
    response, _ = await post(gw, {"x-prism-timeout-ms": value}, prism_fake, prism_clock, 0.3)
    assert response.status == 200
    assert response.headers["x-prism-timeout-ignored"] == "not a whole number of milliseconds"
    # The default applied: the slow binding was waited for and served.
    assert response.headers["x-prism-provider"] == "slow"


async def test_value_is_clamped_to_the_bounds(prism_fake, prism_gateway):
    gw = await prism_gateway(
        catalog(prism_fake),
        sections={"timeout-header": {"timeout_min_ms": 2000, "timeout_max_ms": 90000}},
    )
    low, _ = await post(gw, {"x-prism-timeout-ms": "5"})
    high, _ = await post(gw, {"x-prism-timeout-ms": "999999"})
    assert low.headers["x-prism-timeout-ms"] == "2000"
    assert high.headers["x-prism-timeout-ms"] == "90000"


async def test_disabled_plugin_leaves_the_header_inert(prism_fake, prism_gateway, prism_clock):
    prism_fake.script("slow-one", [Fault(stall_s=1.2)])
    gw = await clocked(
        prism_gateway, prism_fake, prism_clock, config={"disable": "timeout-header"}
    )
    response, elapsed = await post(
        gw, {"x-prism-timeout-ms": "1000"}, prism_fake, prism_clock, 1.2
    )
    assert response.headers["x-prism-provider"] == "slow"
    assert elapsed > 1.1
    assert "x-prism-timeout-ms" not in response.headers


def test_policy_unit():
    policy = TimeoutPolicy(default_ms=60000, min_ms=1000, max_ms=300000)
    assert apply_header(policy, None) is None
    applied = apply_header(policy, "30000")
    assert (applied.timeout_ms, applied.timeout_retry, applied.ignored) == (30000, False, None)
    applied = apply_header(policy, "60000")
    assert applied.timeout_retry is True
    assert apply_header(policy, "12.5").timeout_ms == 60000


def test_bad_bounds_are_config_errors():
    config = config_from_mapping(
        {"catalog": "c.toml"}, {"timeout-header": {"timeout_min_ms": 500}}, source="prism.ini"
    )
    with pytest.raises(ConfigError, match=r"prism\.ini: \[prism:timeout-header\] timeout_min_ms"):
        TimeoutPolicy.from_config(config)
    config = config_from_mapping(
        {"catalog": "c.toml"}, {"timeout-header": {"timeout_max_ms": 2000}}, source="prism.ini"
    )
    with pytest.raises(ConfigError, match="attempt_timeout_ms"):
        TimeoutPolicy.from_config(config)
    config = config_from_mapping({"catalog": "c.toml"}, {"timeout-header": {"nope": 1}}, source="x")
    with pytest.raises(ConfigError, match="unknown key"):
        TimeoutPolicy.from_config(config)
