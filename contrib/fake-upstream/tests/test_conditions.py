"""Standing conditions: a share of every request misbehaves, drawn per request, seeded."""

from __future__ import annotations

import asyncio

import aiohttp
import openai
import pytest
from prism_fake_upstream import FakeUpstream, Fault

MESSAGES = [{"role": "user", "content": "hello"}]


async def put(session: aiohttp.ClientSession, url: str, body: object) -> aiohttp.ClientResponse:
    async with session.put(url, json=body) as response:
        await response.read()
        return response


async def test_a_condition_answers_every_request_the_script_leaves():
    async with FakeUpstream() as fake, aiohttp.ClientSession() as session:
        url = f"{fake.url}/_fake/condition/p"
        condition = {"errors": {"503": 0.5}, "seed": 3}
        async with session.put(url, json=condition) as response:
            assert await response.json() == {"replaced_draws": 0}
        client = openai.AsyncOpenAI(base_url=fake.base_url("p"), api_key="x", max_retries=0)
        fake.script("p", [Fault(text="scripted")])
        first = await client.chat.completions.create(model="m", messages=MESSAGES)
        assert first.choices[0].message.content == "scripted"
        statuses = []
        for _ in range(40):
            try:
                await client.chat.completions.create(model="m", messages=MESSAGES)
                statuses.append(200)
            except openai.APIStatusError as exc:
                statuses.append(exc.status_code)
        assert set(statuses) == {200, 503}
        assert 10 <= statuses.count(503) <= 30
        # The same seed draws the same answers; the reply counts what the old one answered.
        async with session.put(url, json=condition) as response:
            assert await response.json() == {"replaced_draws": 40}
        again = []
        for _ in range(40):
            try:
                await client.chat.completions.create(model="m", messages=MESSAGES)
                again.append(200)
            except openai.APIStatusError as exc:
                again.append(exc.status_code)
        assert again == statuses
        async with session.delete(url) as response:
            assert await response.json() == {"replaced_draws": 40}
        reply = await client.chat.completions.create(model="m", messages=MESSAGES)
        assert reply.choices[0].message.content.startswith("Hello from m")


async def test_rate_limits_carry_retry_after_and_delays_apply():
    async with FakeUpstream() as fake, aiohttp.ClientSession() as session:
        url = f"{fake.url}/_fake/condition/q"
        await put(session, url, {"errors": {"429": 1.0}, "retry_after_s": 0.25})
        async with session.post(fake.base_url("q") + "/chat/completions", json={}) as response:
            assert response.status == 429
            assert response.headers["Retry-After"] == "1"
            assert response.headers["retry-after-ms"] == "250"
        await put(session, url, {"first_token_delay_s": 0.2})
        client = openai.AsyncOpenAI(base_url=fake.base_url("q"), api_key="x", max_retries=0)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await client.chat.completions.create(model="m", messages=MESSAGES)
        assert loop.time() - started >= 0.2


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"errors": {"503": 1.5}}, "is not a status and a fraction"),
        ({"refuse": 0.6, "empty": 0.6}, "add up to more than 1"),
        ({"latency": 2}, "unknown condition fields: ['latency']"),
        ([], "a condition must be a JSON object"),
    ],
)
async def test_a_bad_condition_is_refused_saying_why(body, message):
    async with FakeUpstream() as fake, aiohttp.ClientSession() as session:
        async with session.put(f"{fake.url}/_fake/condition/r", json=body) as response:
            assert response.status == 400
            assert message in (await response.json())["error"]["message"]


async def test_max_concurrency_queues_in_arrival_order_and_fails_nobody():
    from prism_proxy.clock import ManualClock

    async with FakeUpstream() as fake, aiohttp.ClientSession() as session:
        clock = ManualClock()
        fake.clock = clock
        url = f"{fake.url}/_fake/condition/c"
        await put(session, url, {"max_concurrency": 1, "first_token_delay_s": 5.0})
        post = fake.base_url("c") + "/chat/completions"
        body = {"model": "m", "messages": MESSAGES}
        done: list[int] = []

        async def call(i: int) -> None:
            async with session.post(post, json=body) as response:
                assert response.status == 200
                await response.read()
                done.append(i)

        first = asyncio.create_task(call(1))
        while fake.hits("c") < 1:
            await asyncio.sleep(0.01)
        second = asyncio.create_task(call(2))
        while fake.hits("c") < 2:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        # One answer at a time: the second waits its turn behind the first's 5 s.
        assert clock.pending == [1005.0]
        clock.advance(5.0)
        await first
        while not clock.pending:
            await asyncio.sleep(0.01)
        assert clock.pending == [1010.0] and done == [1]
        clock.advance(5.0)
        await second
        assert done == [1, 2]
        # A replaced condition without a limit lets everyone through at once.
        await put(session, url, {"first_token_delay_s": 5.0})
        both = [asyncio.create_task(call(i)) for i in (3, 4)]
        while len(clock.pending) < 2:
            await asyncio.sleep(0.01)
        clock.advance(5.0)
        await asyncio.gather(*both)
        async with session.put(url, json={"max_concurrency": 0}) as response:
            assert response.status == 400
