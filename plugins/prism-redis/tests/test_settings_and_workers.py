"""``[prism:redis]`` checks, the plugin staying out of the way without a URL, and workers."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from prism_proxy import ConfigError, config_from_mapping, create_app
from prism_proxy.testing import free_port, installed_plugins, serve_process

CATALOG = {
    "providers": {"p": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1"}},
    "models": {"m": {"chain": [{"provider": "p", "model": "up"}]}},
}


def build(redis: dict | None) -> object:
    sections = {} if redis is None else {"redis": redis}
    config = config_from_mapping({}, sections, catalog_data=CATALOG)
    return create_app(config)


@pytest.mark.parametrize(
    ("redis", "key", "needle"),
    [
        ({"url": "http://:secret@h:6379"}, "url", "must start with redis://"),
        ({"url": "unix:///tmp/r.sock?password=secret", "sync_s": "0"}, "sync_s", ""),
        ({"url": "redis://:secret@h:6379"}, None, None),
        ({"url": "redis://h", "key_prefix": "has space"}, "key_prefix", "1 to 64"),
        ({"url": "redis://h", "sync_s": "0"}, "sync_s", ""),
        ({"url": "redis://h", "colour": "red"}, "colour", ""),
    ],
)
def test_settings_are_checked_and_the_password_never_shows(redis, key, needle):
    if key is None:
        build(redis)  # a password in the URL is fine, and no connection is made here
        return
    with pytest.raises(ConfigError) as info:
        build(redis)
    assert info.value.key == f"[prism:redis] {key}"
    assert needle in str(info.value)
    assert "secret" not in str(info.value)


def test_where_redis_is_shows_no_password():
    from prism_redis import RedisSettings

    for url in ("redis://:secret@h:6379/0", "unix:///tmp/r.sock?password=secret"):
        assert "secret" not in RedisSettings(url).where


def test_without_a_url_the_plugin_changes_nothing():
    from prism_proxy import GATEWAY, Capacity

    generation = build(None)[GATEWAY].current  # type: ignore[index]
    assert type(generation.capacity) is Capacity
    assert generation.plugin("redis.link") is None
    assert generation.plugin("breaker.store") is None


async def test_two_workers_with_the_breaker_start_when_its_state_is_shared(
    prism_fake, prism_redis, tmp_path
):
    port = free_port()
    disable = ", ".join(sorted(set(installed_plugins()) - {"openai", "breaker", "redis"}))
    (tmp_path / "catalog.toml").write_text(
        f'[providers.p]\nkind = "openai"\nbase_url = "{prism_fake.base_url("ok")}"\n'
        '[models.m]\nchain = [ { provider = "p", model = "up" } ]\n'
    )
    ini = tmp_path / "prism.ini"
    ini.write_text(
        f"[prism]\nlisten = 127.0.0.1:{port}\ncatalog = catalog.toml\nworkers = 2\n"
        f"shutdown_grace_s = 1\ndisable = {disable}\n"
        f"[prism:redis]\nurl = {prism_redis.url}\nkey_prefix = {prism_redis.prefix}\n"
    )
    supervisor = await serve_process(ini, port, stderr=(tmp_path / "serve.log").open("ab"))
    try:
        pids: set[int] = set()
        for _ in range(100):
            connector = aiohttp.TCPConnector(force_close=True)
            async with aiohttp.ClientSession(connector=connector) as session:
                async with session.get(f"http://127.0.0.1:{port}/readyz") as response:
                    body = await response.json()
                    assert body["shared_state"] == "ok"
                    pids.add(body["pid"])
            if len(pids) == 2:
                break
            await asyncio.sleep(0.05)
        assert len(pids) == 2
    finally:
        supervisor.terminate()
        assert await asyncio.wait_for(supervisor.wait(), 15) == 0
