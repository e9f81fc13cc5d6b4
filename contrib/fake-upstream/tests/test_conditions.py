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
