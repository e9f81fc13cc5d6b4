"""Capacity per line: max_concurrency caps the upstream calls in flight; queue_ms may wait."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from prism_fake_upstream import Fault

from prism_proxy import ConfigError, config_from_mapping, create_app

HI = [{"role": "user", "content": "hi"}]


def catalog(fake, **first: object) -> dict:
    return {
        "providers": {
            "a": {"kind": "openai", "base_url": fake.base_url("a")},
            "b": {"kind": "openai", "base_url": fake.base_url("b")},
        },
        "models": {
            "m": {
                "retries": 0,
                "chain": [
                    {"provider": "a", "model": "up-a", **first},
                    {"provider": "b", "model": "up-b"},
                ],
            }
        },
    }


async def chat(gw, **body):
    return await gw.openai().chat.completions.with_raw_response.create(
        model="m", messages=HI, **body
    )


async def test_a_full_line_sends_the_call_on_at_once(prism_fake, prism_gateway):
    prism_fake.script("a", [Fault(first_token_delay_s=0.3)] * 6)
    gw = await prism_gateway(catalog(prism_fake, max_concurrency=2), load_plugins=["openai"])
    answers = await asyncio.gather(*(chat(gw) for _ in range(6)))
    providers = [raw.headers["x-prism-provider"] for raw in answers]
    assert providers.count("a") == 2 and providers.count("b") == 4
    assert prism_fake.hits("a") == 2
    moved = [raw for raw in answers if raw.headers["x-prism-provider"] == "b"]
    assert all(
        raw.headers["x-prism-attempt-log"].startswith("a/up-a skipped full (2 in flight); ")
        for raw in moved
    )


async def test_a_queue_waits_in_turn_for_a_slot(prism_fake, prism_gateway):
    prism_fake.script("a", [Fault(first_token_delay_s=0.15)] * 3)
    gw = await prism_gateway(
        catalog(prism_fake, max_concurrency=1, queue_ms=5000), load_plugins=["openai"]
    )
    answers = await asyncio.gather(*(chat(gw) for _ in range(3)))
    assert [raw.headers["x-prism-provider"] for raw in answers] == ["a", "a", "a"]
    assert prism_fake.hits("b") == 0


async def test_a_queue_waits_no_longer_than_queue_ms(prism_fake, prism_gateway):
    prism_fake.script("a", [Fault(first_token_delay_s=1.0)])
    gw = await prism_gateway(
        catalog(prism_fake, max_concurrency=1, queue_ms=100), load_plugins=["openai"]
    )
    slow = asyncio.create_task(chat(gw))
    await asyncio.sleep(0.2)
    loop = asyncio.get_running_loop()
    started = loop.time()
    raw = await chat(gw)
    assert raw.headers["x-prism-provider"] == "b"
    assert 0.08 < loop.time() - started < 0.9  # waited for its queue, not for the slow call
    assert (await slow).headers["x-prism-provider"] == "a"


async def test_a_served_stream_holds_its_slot_until_it_ends(prism_fake, prism_gateway):
    prism_fake.script("a", [Fault(token_delay_s=0.1, text="one two three four five")])
    gw = await prism_gateway(catalog(prism_fake, max_concurrency=1), load_plugins=["openai"])
    body = {"model": "m", "messages": HI, "stream": True}
    async with aiohttp.ClientSession() as session:
        async with session.post(gw.base_url + "/chat/completions", json=body) as response:
            assert response.headers["x-prism-provider"] == "a"
            await response.content.readline()
            # While the stream runs, the line is full.
            assert (await chat(gw)).headers["x-prism-provider"] == "b"
            await response.read()
    # Its end gave the slot back.
    assert (await chat(gw)).headers["x-prism-provider"] == "a"


async def test_a_failed_attempt_gives_its_slot_back(prism_fake, prism_gateway):
    prism_fake.script("a", [Fault(status=500)] * 3)
    gw = await prism_gateway(catalog(prism_fake, max_concurrency=1), load_plugins=["openai"])
    for _ in range(3):
        raw = await chat(gw)
        assert raw.headers["x-prism-attempt-log"].startswith("a/up-a transient 500")
    assert prism_fake.hits("a") == 3


async def test_health_reports_in_flight_and_queue(prism_fake, prism_gateway):
    prism_fake.script("a", [Fault(first_token_delay_s=0.5)] * 2)
    gw = await prism_gateway(
        catalog(prism_fake, max_concurrency=1, queue_ms=3000),
        load_plugins=["openai", "breaker"],
    )
    calls = [asyncio.create_task(chat(gw)) for _ in range(2)]
    await asyncio.sleep(0.2)
    async with aiohttp.ClientSession() as session:
        async with session.get(gw.url + "/prism/health") as response:
            health = {b["binding"]: b for b in (await response.json())["bindings"]}
    assert health["a/up-a"]["capacity"] == {"max_concurrency": 1, "in_flight": 1, "queued": 1}
    assert health["b/up-b"]["capacity"] is None
    await asyncio.gather(*calls)


@pytest.mark.parametrize(
    ("line", "key", "problem"),
    [
        ({"max_concurrency": 0}, "max_concurrency", "whole number >= 1"),
        ({"queue_ms": 100}, "queue_ms", "needs max_concurrency"),
        ({"max_concurrency": 2, "queue_ms": "1s"}, "queue_ms", "whole number >= 1"),
    ],
)
def test_bad_capacity_settings_stop_start_up(prism_fake, line, key, problem):
    with pytest.raises(ConfigError) as info:
        create_app(config_from_mapping({}, catalog_data=catalog(prism_fake, **line)))
    assert info.value.key == f"models.m.chain[0].{key}"
    assert problem in info.value.problem


async def test_max_concurrency_holds_under_fifty_concurrent_calls(prism_fake, prism_gateway):
    """Counted at the fake: never more than max_concurrency requests in flight at once."""
    prism_fake.script("a", [Fault(first_token_delay_s=0.2)] * 50)
    gw = await prism_gateway(
        catalog(prism_fake, max_concurrency=5, queue_ms=30_000), load_plugins=["openai"]
    )
    answers = await asyncio.gather(*(chat(gw) for _ in range(50)))
    assert [raw.headers["x-prism-provider"] for raw in answers] == ["a"] * 50
    received = sorted(r.received_at for r in prism_fake.requests("a"))
    assert len(received) == 50
    # Each answer takes 0.2 s, so a sixth request can only arrive once one of
    # the five before it is done: any six in a row span most of 0.2 s.
    spans = [received[i + 5] - received[i] for i in range(len(received) - 5)]
    assert min(spans) > 0.15, min(spans)
