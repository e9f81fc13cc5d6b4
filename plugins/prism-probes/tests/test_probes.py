"""Live probes through the real gateway: early trials, failed contracts, allowance, fleet."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import aiohttp
from prism_fake_upstream import Fault

ADMIN_ENV = "PROBES_TEST_ADMIN"
ADMIN = "probes-admin"
PRICE = {"input": 1000.0, "output": 1000.0}  # per million tokens: a probe costs cents


class Clock:
    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now


def catalog(fake: Any, *, tools: bool = False, priced: bool = False) -> dict:
    x: dict[str, Any] = {"provider": "x", "model": "up-x"}
    if tools:
        x["capabilities"] = ["tools"]
    if priced:
        x["price"] = PRICE
    return {
        "providers": {"x": {"kind": "openai", "base_url": fake.base_url("x")}},
        "models": {"m": {"retries": 0, "chain": [x]}},
    }


async def gateway(prism_gateway, fake, monkeypatch, *, probes: dict, clock=None, **kw) -> Any:
    monkeypatch.setenv(ADMIN_ENV, ADMIN)
    sections = {
        "breaker": {"policies": "consecutive", "consecutive_failures": 1, "isolation_s": 600},
        "probes": {"enabled": "true", "interval_s": 0.1, **probes},
        **kw.pop("sections", {}),
    }
    plugins = kw.pop("load_plugins", ["openai", "breaker", "probes"])
    extra = {"clock": clock} if clock is not None else {}
    return await prism_gateway(
        kw.pop("catalog"),
        config={"admin_token_env": ADMIN_ENV},
        sections=sections,
        load_plugins=plugins,
        **extra,
    )


async def call(url: str, model: str = "m") -> int:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/v1/chat/completions", json=body) as response:
            await response.read()
            return response.status


async def health(url: str) -> dict:
    async with aiohttp.ClientSession() as session:
        async with session.get(url + "/prism/health") as response:
            return await response.json()


async def x_entry(url: str) -> dict:
    return next(e for e in (await health(url))["bindings"] if e["binding"] == "x/up-x")


async def until(check, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not await check():
            await asyncio.sleep(0.05)


async def test_a_passing_probe_opens_the_trial_long_before_the_window_ends(
    prism_fake, prism_gateway, monkeypatch, tmp_path
):
    clock = Clock()  # never advanced: the 600 s isolation window never ends on its own
    gw = await gateway(
        prism_gateway,
        prism_fake,
        monkeypatch,
        catalog=catalog(prism_fake, priced=True),
        clock=clock,
        probes={},
        sections={"billing": {"ledger_path": str(tmp_path / "ledger.sqlite")}},
        load_plugins=["openai", "breaker", "probes", "billing"],
    )
    prism_fake.script("x", [Fault(status=500)])
    assert await call(gw.url) == 503
    assert (await x_entry(gw.url))["state"] == "isolated"

    async def in_trial() -> bool:
        return (await x_entry(gw.url))["state"] == "trial"

    await until(in_trial)  # the upstream recovered; a probe saw it
    entry = await x_entry(gw.url)
    assert entry["cause"] == "probe passed (chat): trial opened early"
    assert entry["probe"]["passed"] is True
    assert entry["counts"] == {"transient": 1, "stale_ignored": 0}  # probes are no evidence
    # Probe rows are in the ledger as probes, outside the customer totals.
    async with aiohttp.ClientSession() as session:
        headers = {"Authorization": f"Bearer {ADMIN}"}
        async with session.get(gw.url + "/prism/usage?group_by=", headers=headers) as r:
            customer = (await r.json())["total"]
        async with session.get(
            gw.url + "/prism/usage?group_by=&traffic=probe", headers=headers
        ) as r:
            probes = (await r.json())["total"]
    assert customer["calls"] == 1  # the customer's failed call
    assert probes["calls"] >= 1


async def test_a_probe_with_an_unparsable_tool_call_fails_and_extends_isolation(
    prism_fake, prism_gateway, monkeypatch
):
    clock = Clock()
    gw = await gateway(
        prism_gateway,
        prism_fake,
        monkeypatch,
        catalog=catalog(prism_fake, tools=True),
        clock=clock,
        probes={"interval_s": 0.2},
    )
    broken = {
        "id": "x", "object": "chat.completion", "created": 0, "model": "up-x",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": None,
            "tool_calls": [{"id": "c", "type": "function",
                            "function": {"name": "get_weather", "arguments": "{city"}}]}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10},
    }  # fmt: skip
    # The customer's failure isolates x; the probe's chat passes, its tool call is broken.
    prism_fake.script("x", [Fault(status=500), Fault(), Fault(body=broken)])
    assert await call(gw.url) == 503
    first = await x_entry(gw.url)

    async def probed() -> bool:
        return "probe" in await x_entry(gw.url)

    await until(probed)
    entry = await x_entry(gw.url)
    assert entry["probe"]["passed"] is False
    assert entry["cause"] == "probe failed: tool: tool arguments do not parse as JSON"
    assert entry["state"] == "isolated" and entry["revision"] > first["revision"]
    assert entry["isolated_until"] > first["isolated_until"]  # one backoff step further


async def test_the_allowance_stops_probing_until_the_hour_rolls(
    prism_fake, prism_gateway, monkeypatch, tmp_path
):
    gw = await gateway(
        prism_gateway,
        prism_fake,
        monkeypatch,
        catalog=catalog(prism_fake, priced=True),
        clock=Clock(),
        # One chat probe is estimated at (120 + 64) x 1000 / 1e6 = 0.184: one fits.
        probes={"allowance_per_hour": 0.2, "probe_opens_trial": "false"},
        sections={"billing": {"ledger_path": str(tmp_path / "ledger.sqlite")}},
        load_plugins=["openai", "breaker", "probes", "billing", "metrics"],
    )
    prism_fake.script("x", [Fault(status=500)] * 10)
    assert await call(gw.url) == 503

    async def paused() -> bool:
        return bool(((await health(gw.url)).get("probes") or {}).get("paused_until"))

    await until(paused)
    hits = prism_fake.hits("x")
    await asyncio.sleep(0.5)  # five more intervals
    assert prism_fake.hits("x") == hits == 2  # the customer's call and one probe
    status = (await health(gw.url))["probes"]
    assert status["probes"] == 1 and 0 < status["spent_this_hour"] <= 0.2
    # The board and the metrics say so too.
    async with aiohttp.ClientSession() as session:
        async with session.get(gw.url + "/prism/board.json") as r:
            banners = (await r.json())["banners"]
        async with session.get(gw.url + "/metrics") as r:
            metrics = await r.text()
    assert any(b["kind"] == "probes" and "allowance is spent" in b["text"] for b in banners)
    assert 'prism_probes_total{provider="x",result="fail",upstream_model="up-x"} 1.0' in metrics
    assert 'result="skipped"' in metrics


async def test_one_probe_per_interval_across_gateways_sharing_redis(
    prism_fake, prism_gateway, monkeypatch, prism_redis
):
    # A second before Redis counts as down: a busy machine's pause is not an outage here.
    redis = {"url": prism_redis.url, "key_prefix": prism_redis.prefix, "timeout_ms": 1000}
    gateways = [
        await gateway(
            prism_gateway,
            prism_fake,
            monkeypatch,
            catalog=catalog(prism_fake),
            probes={"interval_s": 0.5, "probe_opens_trial": "false"},
            sections={"redis": redis},
            load_plugins=["openai", "breaker", "probes", "redis"],
        )
        for _ in range(3)
    ]
    prism_fake.script("x", [Fault(status=500)] * 100)
    assert await call(gateways[0].url) == 503

    async def everyone_isolated() -> bool:
        return all([(await x_entry(gw.url))["state"] == "isolated" for gw in gateways])

    await until(everyone_isolated)
    start = prism_fake.hits("x")
    await asyncio.sleep(2.2)
    probes = prism_fake.hits("x") - start
    # About four intervals: one probe each for the fleet (three gateways alone: ~13).
    assert 2 <= probes <= 6, probes


async def test_one_probe_per_interval_across_three_serve_processes(
    prism_fake, prism_redis, tmp_path
):
    from prism_proxy.testing import free_port, installed_plugins, serve_process

    (tmp_path / "catalog.toml").write_text(
        f'[providers.x]\nkind = "openai"\nbase_url = "{prism_fake.base_url("x")}"\n'
        '[models.m]\nretries = 0\nchain = [ { provider = "x", model = "up-x" } ]\n'
    )
    disable = ", ".join(sorted(set(installed_plugins()) - {"openai", "breaker", "probes", "redis"}))
    processes, urls = [], []
    prism_fake.script("x", [Fault(status=500)] * 100)
    try:
        for i in range(3):
            port = free_port()
            ini = tmp_path / f"p{i}.ini"
            ini.write_text(
                f"[prism]\nlisten = 127.0.0.1:{port}\ncatalog = catalog.toml\n"
                f"log_level = WARNING\nshutdown_grace_s = 1\ndisable = {disable}\n"
                "[prism:breaker]\npolicies = consecutive\nconsecutive_failures = 1\n"
                "isolation_s = 600\nrefresh_s = 0.2\n"
                "[prism:probes]\nenabled = true\ninterval_s = 0.5\nprobe_opens_trial = false\n"
                f"[prism:redis]\nurl = {prism_redis.url}\nkey_prefix = {prism_redis.prefix}\n"
                "sync_s = 0.1\ntimeout_ms = 1000\n"
            )
            log = (tmp_path / f"p{i}.log").open("ab")
            processes.append(await serve_process(ini, port, stderr=log))
            urls.append(f"http://127.0.0.1:{port}")
        assert await call(urls[0]) == 503

        async def everyone_isolated() -> bool:
            return all([(await x_entry(url))["state"] == "isolated" for url in urls])

        await until(everyone_isolated)
        start = prism_fake.hits("x")
        await asyncio.sleep(2.2)
        probes = prism_fake.hits("x") - start
        assert 2 <= probes <= 6, probes  # three processes alone: about 13
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            await asyncio.wait_for(process.wait(), 15)



async def test_a_draining_gateway_sends_no_probe_and_holds_none_against_the_line(
    prism_fake, prism_redis, tmp_path
):
    import signal
    import time

    import redis.asyncio as aioredis

    from prism_proxy.testing import free_port, installed_plugins, serve_process

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    (tmp_path / "catalog.toml").write_text(
        f'[providers.x]\nkind = "openai"\nbase_url = "{prism_fake.base_url("x")}"\n'
        f'[providers.y]\nkind = "openai"\nbase_url = "{prism_fake.base_url("y")}"\n'
        '[models.m]\nretries = 0\n'
        'chain = [ { provider = "x", model = "up-x", capabilities = ["tools"] } ]\n'
        '[models.n]\nchain = [ { provider = "y", model = "up-y", probe = "off" } ]\n'
    )
    disable = ", ".join(sorted(set(installed_plugins()) - {"openai", "breaker", "probes", "redis"}))
    ini = tmp_path / "prism.ini"
    ini.write_text(
        f"[prism]\nlisten = 127.0.0.1:{port}\ncatalog = catalog.toml\n"
        f"shutdown_grace_s = 20\ndisable = {disable}\n"
        "[prism:breaker]\npolicies = consecutive\nconsecutive_failures = 1\n"
        "isolation_s = 600\nrefresh_s = 0.2\n"
        "[prism:probes]\nenabled = true\ninterval_s = 0.2\nprobe_opens_trial = false\n"
        f"[prism:redis]\nurl = {prism_redis.url}\nkey_prefix = {prism_redis.prefix}\n"
        "timeout_ms = 1000\n"
    )
    # x fails slowly, to the customer and to every probe (chat, then tool) alike; a
    # customer's call to y outlasts the probe in flight at SIGTERM, so the drain does too.
    prism_fake.script("x", [Fault(status=500, stall_s=1.0)] * 100)
    prism_fake.script("y", [Fault(stall_s=4.0)])
    log = tmp_path / "serve.log"
    process = await serve_process(ini, port, stderr=log.open("ab"))
    try:
        assert await call(url) == 503

        async def isolated() -> bool:
            return (await x_entry(url))["state"] == "isolated"

        await until(isolated)
        slow = asyncio.ensure_future(call(url, "n"))

        async def customer_in_flight() -> bool:
            return prism_fake.hits("y") == 1

        await until(customer_in_flight)
        sent = prism_fake.hits("x")

        async def fixture_in_flight() -> bool:
            return prism_fake.hits("x") > sent

        await until(fixture_in_flight)  # a probe's fixture has just reached x
        sent, stopped_at = prism_fake.hits("x"), time.time()
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 30) == 0
        assert await slow == 200  # the drain waited for the customer
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    # The fleet's audit has no isolation the stop made: every row predates the SIGTERM.
    client = aioredis.Redis.from_url(prism_redis.url, decode_responses=True)
    try:
        rows = await client.lrange(f"{prism_redis.prefix}:breaker:audit", 0, -1)
    finally:
        await client.aclose()
    audit = [json.loads(row.partition("|")[2]) for row in rows]
    assert audit and all(a["subject"] == "x/up-x" for a in audit)
    assert [a["at"] for a in audit if a["at"] >= stopped_at] == []
    # Nothing went out once draining began, and the probe then in flight was dropped.
    assert prism_fake.hits("x") == sent
    text = log.read_text()
    drain = text[text.index("draining:") :]
    assert re.search(r"probes: x/up-x \([a-z ]+\) dropped: the gateway is draining", drain)
    assert not re.search(r"probes: x/up-x \([a-z ]+\) failed", drain)
    assert "ClientConnector" not in text
