"""``store = redis``: the fleet shares hits through prism-redis; a Redis down is a miss."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from prism_proxy import ConfigError
from prism_proxy.testing import eventually, free_port

from .conftest import HI, catalog

PLUGINS = ["openai", "anthropic", "cache", "redis"]


async def chat(gw: Any) -> Any:
    async with gw.openai(max_retries=0) as client:
        return await client.chat.completions.with_raw_response.create(
            model="m", messages=HI, temperature=0
        )


def sections(url: str, prefix: str) -> dict[str, Any]:
    return {
        "cache": {"store": "redis"},
        "redis": {"url": url, "key_prefix": prefix, "timeout_ms": 2000},
    }


async def test_two_gateways_share_hits(prism_gateway, prism_fake, prism_redis):
    config = sections(prism_redis.url, prism_redis.prefix)
    one = await prism_gateway(catalog(prism_fake), sections=config, load_plugins=PLUGINS)
    two = await prism_gateway(catalog(prism_fake), sections=config, load_plugins=PLUGINS)
    first = await chat(one)
    assert first.headers["x-prism-cache"] == "miss"

    import redis.asyncio as aioredis

    # The write goes out after the answer: wait until Redis holds it, bounded.
    client = aioredis.Redis.from_url(prism_redis.url)
    try:
        for _ in range(100):
            keys = [key async for key in client.scan_iter(match=f"{prism_redis.prefix}:cache:*")]
            if keys:
                break
            await asyncio.sleep(0.02)
        assert len(keys) == 1
        ttl_ms = await client.pttl(keys[0])
        assert 0 < ttl_ms <= 300_000  # bounded: it expires with the TTL
    finally:
        await client.aclose()
    hit = await chat(two)
    assert hit.headers["x-prism-cache"] == "hit"
    assert hit.parse().choices[0].message.content == first.parse().choices[0].message.content
    assert hit.headers["x-prism-provider"] == "a"
    assert prism_fake.hits("a") == 1


async def test_a_redis_that_does_not_answer_is_a_miss_never_an_error(prism_gateway, prism_fake):
    config = sections(f"redis://127.0.0.1:{free_port()}/0", "prism-test-down")
    gw = await prism_gateway(catalog(prism_fake), sections=config, load_plugins=PLUGINS)
    for _ in range(3):
        raw = await chat(gw)
        assert raw.status_code == 200
        assert raw.headers["x-prism-cache"] == "miss"
    await eventually(lambda: prism_fake.hits("a") == 3)


async def test_store_redis_without_prism_redis_is_refused(prism_gateway, prism_fake):
    with pytest.raises(ConfigError, match=r"\[prism:cache\] store"):
        await prism_gateway(
            catalog(prism_fake),
            sections={"cache": {"store": "redis"}},
            load_plugins=["openai", "anthropic", "cache"],
        )


def test_prism_check_says_whether_the_cache_is_on(tmp_path, capsys):
    from prism_proxy.cli import main
    from prism_proxy.testing import installed_plugins

    others = sorted(set(installed_plugins()) - {"openai", "cache"})
    (tmp_path / "catalog.toml").write_text(
        '[providers.a]\nkind = "openai"\nbase_url = "http://127.0.0.1:9/v1"\n'
        '[models.m]\nchain = [{ provider = "a", model = "up" }]\n'
    )
    ini = tmp_path / "prism.ini"
    ini.write_text(
        f"[prism]\ncatalog = catalog.toml\ndisable = {', '.join(others)}\n"
        "[prism:cache]\nstore = memory\n"
    )
    assert main(["check", "--offline", "--config", str(ini)]) == 0
    assert "cache: on, memory" in capsys.readouterr().out
