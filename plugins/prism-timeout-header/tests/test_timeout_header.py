"""x-prism-timeout-ms through the real gateway, against a stalling fake upstream."""

from __future__ import annotations

import time

import aiohttp
import pytest
from prism_fake_upstream import Fault
from prism_timeout_header import TimeoutPolicy, apply_header

from prism_proxy import ConfigError, config_from_mapping

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


async def post(gw, headers: dict[str, str]):
    async with aiohttp.ClientSession() as session:
        started = time.monotonic()
        async with session.post(
            gw.base_url + "/chat/completions",
            json={"model": "m", "messages": MESSAGES},
            headers=headers,
        ) as response:
            await response.read()
            return response, time.monotonic() - started


async def test_short_timeout_fails_over_without_a_timeout_retry(prism_fake, prism_gateway):
    prism_fake.script("slow-one", [Fault(stall_s=30), Fault(stall_s=30)])
    gw = await prism_gateway(catalog(prism_fake))
    response, elapsed = await post(gw, {"x-prism-timeout-ms": "1500"})
    assert response.status == 200
    assert 1.4 < elapsed < 4  # one 1.5 s timeout, no retry of it (below the 60 s default)
    assert response.headers["x-prism-timeout-ms"] == "1500"
    assert prism_fake.hits("slow-one") == 1
    assert response.headers["x-prism-attempt-log"].startswith("slow/a timeout - ")
    assert response.headers["x-prism-provider"] == "fast"


async def test_timeout_at_the_default_is_retried_once(prism_fake, prism_gateway):
    prism_fake.script("slow-one", [Fault(stall_s=30), Fault(stall_s=30), Fault(stall_s=30)])
    gw = await prism_gateway(catalog(prism_fake), config={"attempt_timeout_ms": 1000})
    response, elapsed = await post(gw, {"x-prism-timeout-ms": "1000"})
    assert response.status == 200
    assert prism_fake.hits("slow-one") == 2  # at most one timeout retry, then failover
    assert 1.9 < elapsed < 6


@pytest.mark.parametrize("value", ["abc", "1.5", "1500ms", "-200", "+1500", " "])
async def test_garbage_is_ignored_and_said_so(prism_fake, prism_gateway, value):
    prism_fake.script("slow-one", [Fault(stall_s=0.3)])
    gw = await prism_gateway(catalog(prism_fake), config={"attempt_timeout_ms": 1000})
    response, _ = await post(gw, {"x-prism-timeout-ms": value})
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


async def test_disabled_plugin_leaves_the_header_inert(prism_fake, prism_gateway):
    prism_fake.script("slow-one", [Fault(stall_s=1.2)])
    gw = await prism_gateway(catalog(prism_fake), config={"disable": "timeout-header"})
    response, elapsed = await post(gw, {"x-prism-timeout-ms": "1000"})
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
