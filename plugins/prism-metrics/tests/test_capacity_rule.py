"""The capacity rule on an injected clock: peaks per minute, the reserve, k, and its signals."""

from __future__ import annotations

import asyncio
import logging
import sys

import aiohttp
from prism_fake_upstream import Fault

from .conftest import chat, scrape, value

LINES = ("a", "b", "c")


class Clock:
    def __init__(self) -> None:
        self.now = 6000.0

    def __call__(self) -> float:
        return self.now


def catalog(fake) -> dict:
    return {
        "providers": {n: {"kind": "openai", "base_url": fake.base_url(n)} for n in LINES},
        "models": {
            "m": {
                "chain": [
                    {"provider": "a", "model": "up-a", "max_concurrency": 4},
                    {"provider": "b", "model": "up-b", "max_concurrency": 4},
                    {"provider": "c", "model": "up-c", "max_concurrency": 2},
                ]
            },
            # One line: no tier to judge.
            "solo": {"chain": [{"provider": "a", "model": "up-a", "max_concurrency": 4}]},
        },
    }


def write_ini(tmp_path, fake) -> object:
    (tmp_path / "catalog.toml").write_text(
        f'[providers.a]\nkind = "openai"\nbase_url = "{fake.base_url("a")}"\n'
        '[models.solo]\nchain = [ { provider = "a", model = "up-a" } ]\n'
    )
    ini = tmp_path / "prism.ini"
    ini.write_text("[prism]\ncatalog = catalog.toml\n")
    return ini


async def get(url: str, path: str) -> dict:
    async with aiohttp.ClientSession() as session:
        async with session.get(url + path) as response:
            return await response.json()


async def test_the_rule_fires_below_k_and_clears_when_the_peak_leaves_the_window(
    prism_fake, prism_gateway, caplog
):
    clock = Clock()
    gw = await prism_gateway(
        catalog(prism_fake),
        sections={"metrics": {"capacity_k": "2", "capacity_window_s": "600"}},
        clock=clock,
        load_plugins=["openai", "metrics"],
    )
    # Three calls in flight on a at once: a's peak is 3 this minute.
    prism_fake.script("a", [Fault(stall_s=0.3)] * 3)
    await asyncio.gather(*(chat(gw.url) for _ in range(3)))
    caplog.set_level(logging.WARNING, "prism.metrics")

    report = await get(gw.url, "/prism/capacity")
    assert report["lines"]["a/up-a"] == {
        "max_concurrency": 4, "minutes": 10, "p50": 0, "p95": 3, "p99": 3, "max": 3,
    }  # fmt: skip
    tier = report["tiers"][0]
    # Losing a: b and c could take (4 - 0) + (2 - 0) = 6 more; 6 / 3 = 2.0.
    assert tier["lines"]["a/up-a"] == {"peak": 3, "reserve": 6, "ratio": 2.0}
    assert tier["alerts_above_k"] == 2.0
    assert report["firing"] == []  # 6 is not below 2 x 3

    # One more in flight on a next minute: peak 4, reserve 6 < 2 x 4: the rule fires.
    clock.now += 60
    prism_fake.script("a", [Fault(stall_s=0.3)] * 4)
    await asyncio.gather(*(chat(gw.url) for _ in range(4)))
    text = await scrape(gw.url)
    labels = {"model": "m", "provider": "a", "upstream_model": "up-a"}
    assert value(text, "prism_capacity_alert", **labels) == 1
    assert value(text, "prism_capacity_reserve_ratio", **labels) == 1.5
    assert value(text, "prism_capacity_alert", provider="b") == 0
    board = await get(gw.url, "/prism/board.json")
    assert any(b["kind"] == "capacity" and "a/up-a" in b["text"] for b in board["banners"])
    firing = [r.message for r in caplog.records if "cannot absorb" in r.message]
    assert len(firing) == 1  # one line per change, however often it is judged
    await scrape(gw.url)
    assert len([r for r in caplog.records if "cannot absorb" in r.message]) == 1

    # Ten minutes later the peak has left the window: the rule clears, once.
    clock.now += 601
    text = await scrape(gw.url)
    assert value(text, "prism_capacity_alert", **labels) == 0
    assert [r.message for r in caplog.records if "again" in r.message] == [
        "capacity: tier m can absorb losing a/up-a again"
    ]


async def test_without_k_the_rule_is_off_and_the_cli_says_where_k_would_alert(
    prism_fake, prism_gateway, tmp_path
):
    clock = Clock()
    gw = await prism_gateway(catalog(prism_fake), clock=clock, load_plugins=["openai", "metrics"])
    prism_fake.script("a", [Fault(stall_s=0.3)] * 4)
    await asyncio.gather(*(chat(gw.url) for _ in range(4)))
    assert value(await scrape(gw.url), "prism_capacity_alert") == 0
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "prism_proxy.cli", "capacity", "--url", gw.url,
        "--config", str(write_ini(tmp_path, prism_fake)),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    text = out.decode()
    assert "capacity_k is not set: the rule is off" in text
    assert "tier m: alerts for any k above 1.5" in text
    assert "losing a/up-a: reserve 6 for peak 4 (ratio 1.50)" in text
    assert "solo" not in text  # one line: no tier


async def test_with_redis_the_peaks_are_the_fleets(prism_fake, prism_gateway, prism_redis):
    sections = {
        "metrics": {"capacity_k": "1"},
        # A second before Redis counts as down: a busy machine's pause is not an outage here.
        "redis": {"url": prism_redis.url, "key_prefix": prism_redis.prefix, "timeout_ms": 1000},
    }
    one, two = [
        await prism_gateway(
            catalog(prism_fake), sections=sections, load_plugins=["openai", "metrics", "redis"]
        )
        for _ in range(2)
    ]
    # Two calls in flight on a through each gateway: the fleet's peak is 4.
    prism_fake.script("a", [Fault(stall_s=0.3)] * 4)
    await asyncio.gather(*(chat(gw.url) for gw in (one, two, one, two)))

    async def fleet_peak() -> int:
        return int((await get(one.url, "/prism/capacity"))["lines"]["a/up-a"]["max"])

    for _ in range(50):
        if await fleet_peak() == 4:
            break
        await asyncio.sleep(0.1)
    assert await fleet_peak() == 4
    report = await get(one.url, "/prism/capacity")
    # Losing a: (4 - 0) + (2 - 0) = 6 for a peak of 4.
    assert report["tiers"][0]["lines"]["a/up-a"]["ratio"] == 1.5


async def test_with_no_limited_line_the_cli_says_why_the_table_is_empty(
    prism_fake, prism_gateway, tmp_path
):
    unlimited = {
        "providers": {"a": {"kind": "openai", "base_url": prism_fake.base_url("a")}},
        "models": {"solo": {"chain": [{"provider": "a", "model": "up-a"}]}},
    }
    gw = await prism_gateway(unlimited, load_plugins=["openai", "metrics"])
    await chat(gw.url, "solo")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "prism_proxy.cli", "capacity", "--url", gw.url,
        "--config", str(write_ini(tmp_path, prism_fake)),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    text = out.decode()
    assert (
        "(none: no chain line of the gateway's catalog sets max_concurrency, and peaks are "
        "kept only for lines that do)" in text
    )
    assert (
        "no tier to judge: the rule judges a model whose chain has two or more lines, "
        "every one with max_concurrency" in text
    )
