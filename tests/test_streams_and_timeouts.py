"""Stream commit point, first-byte timeout and empty completions, end to end."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from prism_fake_upstream import Fault

MESSAGES = [{"role": "user", "content": "hello"}]


def chain_catalog(fake, *scenarios: str) -> dict:
    return {
        "providers": {s: {"kind": "openai", "base_url": fake.base_url(s)} for s in scenarios},
        "models": {"m": {"chain": [{"provider": s, "model": f"up-{s}"} for s in scenarios]}},
    }


async def streamed_by_ok(gw: Any) -> Any:
    """Ask for a stream, check it is the "ok" line's whole answer; its headers."""
    raw = await gw.openai().chat.completions.with_raw_response.create(
        model="m", messages=MESSAGES, stream=True
    )
    chunks = [chunk async for chunk in raw.parse()]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello from up-ok. This is the fake upstream answering."
    assert raw.headers["x-prism-provider"] == "ok"
    return raw.headers


async def test_stream_dying_before_its_first_content_fails_over(prism_fake, prism_gateway):
    gw = await prism_gateway(chain_catalog(prism_fake, "die0", "ok"))
    headers = await streamed_by_ok(gw)
    assert headers["x-prism-attempt-log"].startswith("die0/up-die0 broken_stream 200")


async def test_stream_dying_after_content_ends_with_an_error_event(
    prism_fake, prism_gateway, recorder
):
    gw = await prism_gateway(chain_catalog(prism_fake, "die3", "ok"))
    async with aiohttp.ClientSession() as session:
        async with session.post(
            gw.base_url + "/chat/completions",
            json={"model": "m", "messages": MESSAGES, "stream": True},
        ) as response:
            body = await response.read()
    events = [e for e in body.split(b"\n\n") if e]
    last = orjson.loads(events[-1].removeprefix(b"data: "))
    assert last["error"]["code"] == "upstream_stream_broken"
    assert b"[DONE]" not in body
    assert prism_fake.hits("ok") == 0  # no second provider spliced in
    [(_, settlement)] = recorder.settled
    assert settlement.outcome == "error"
    assert settlement.usage.estimated and settlement.usage.output_tokens > 0

    # The official SDK surfaces it as an error, not as a clean end.
    stream = await gw.openai().chat.completions.create(model="m", messages=MESSAGES, stream=True)
    with pytest.raises(openai.APIError):
        async for _ in stream:
            pass


async def test_first_byte_timeout_moves_on(prism_fake, prism_gateway):
    prism_fake.script("slowfirst", [Fault(stall_s=30)])
    gw = await prism_gateway(
        chain_catalog(prism_fake, "slowfirst", "ok"), config={"attempt_timeout_ms": 1000}
    )
    started = time.monotonic()
    raw = await gw.openai().chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
    elapsed = time.monotonic() - started
    # One timeout retry on the same binding, then the next binding.
    assert 1.9 < elapsed < 6
    log = raw.headers["x-prism-attempt-log"].split("; ")
    assert [entry.split()[:3] for entry in log] == [
        ["slowfirst/up-slowfirst", "timeout", "-"],
        ["slowfirst/up-slowfirst", "timeout", "-"],
        ["ok/up-ok", "ok", "200"],
    ]
    assert prism_fake.dropped("slowfirst") == 2


async def test_stream_timeout_counts_until_the_first_content(prism_fake, prism_gateway):
    prism_fake.script("lazy", [Fault(first_token_delay_s=30)])
    gw = await prism_gateway(
        chain_catalog(prism_fake, "lazy", "ok"), config={"attempt_timeout_ms": 1000}
    )
    raw = await gw.openai().chat.completions.with_raw_response.create(
        model="m", messages=MESSAGES, stream=True
    )
    [chunk async for chunk in raw.parse()]
    log = raw.headers["x-prism-attempt-log"].split("; ")
    assert [entry.split()[:3] for entry in log] == [
        ["lazy/up-lazy", "timeout", "200"],
        ["lazy/up-lazy", "ok", "200"],
    ]


@pytest.mark.parametrize("stream", [False, True])
async def test_empty_completion_is_flagged(prism_fake, prism_gateway, stream):
    gw = await prism_gateway(chain_catalog(prism_fake, "empty", "ok"))
    raw = await gw.openai().chat.completions.with_raw_response.create(
        model="m", messages=MESSAGES, stream=stream
    )
    if stream:
        [chunk async for chunk in raw.parse()]
    assert raw.headers["x-prism-outcome"] == "empty"
    assert raw.headers["x-prism-attempt-log"].startswith("empty/up-empty empty 200")


async def test_a_classifier_judges_a_stream_by_its_committing_chunk(prism_fake, prism_gateway):
    """The relay forwards plain text chunks without building them; a classifier that
    asks for the committing chunk still gets it parsed, and its verdict stands."""
    from prism_proxy import Outcome, Verdict, hookimpl

    seen = []

    class NoGreetings:
        @hookimpl(tryfirst=True)
        def prism_classify(self, call, attempt, result):
            if not result.streaming or result.status != 200:
                return None
            delta = result.json["choices"][0]["delta"]
            seen.append((attempt.binding.provider, delta))
            if attempt.binding.provider == "greeter" and delta.get("content") == "Hello":
                return Verdict(Outcome.PERMANENT, "greetings are not answers")
            return None

    gw = await prism_gateway(
        chain_catalog(prism_fake, "greeter", "ok"), plugins=[(NoGreetings(), "no-greetings")]
    )
    headers = await streamed_by_ok(gw)
    assert headers["x-prism-attempt-log"].startswith("greeter/up-greeter permanent 200")
    # Each line's first text chunk, as the upstream sent it (the role chunk came before).
    assert seen == [("greeter", {"content": "Hello"}), ("ok", {"content": "Hello"})]


async def test_calls_share_one_pooled_upstream_connection(prism_fake, prism_gateway):
    gw = await prism_gateway(chain_catalog(prism_fake, "ok"))
    client = gw.openai()
    for _ in range(3):
        stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        assert [chunk async for chunk in stream]
        await client.chat.completions.create(model="m", messages=MESSAGES)
    peers = {seen.peer for seen in prism_fake.requests("ok")}
    assert len(prism_fake.requests("ok")) == 6
    assert len(peers) == 1, peers


async def test_a_stream_whose_body_ends_late_is_answered_at_once_and_still_pooled(
    prism_fake, prism_gateway
):
    # The final event arrives, the body's end only later: the caller is not
    # kept waiting for it, and the connection still returns to the pool.
    prism_fake.script("ok", [Fault(end_delay_s=0.8), Fault()])
    gw = await prism_gateway(chain_catalog(prism_fake, "ok"))
    client = gw.openai()
    started = time.monotonic()
    stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert time.monotonic() - started < 0.7  # the end arrives 0.8 s after the final event
    assert text == "Hello from up-ok. This is the fake upstream answering."
    await client.chat.completions.create(model="m", messages=MESSAGES)
    first, second = prism_fake.requests("ok")
    assert first.peer == second.peer


def post_stream(session: aiohttp.ClientSession, gw: Any) -> Any:
    """A streamed chat call to ``gw`` read with plain aiohttp, as bytes arrive."""
    return session.post(
        gw.base_url + "/chat/completions",
        json={"model": "m", "messages": MESSAGES, "stream": True},
    )


async def test_a_stream_gone_silent_after_its_first_content_ends_with_an_error_event(
    prism_fake, prism_gateway, recorder
):
    prism_fake.script("quiet", [Fault(token_delay_s=30)])
    gw = await prism_gateway(
        chain_catalog(prism_fake, "quiet"), config={"attempt_timeout_ms": 1000}
    )
    started = time.monotonic()
    async with aiohttp.ClientSession() as session, asyncio.timeout(10):
        async with post_stream(session, gw) as response:
            body = await response.read()
    elapsed = time.monotonic() - started
    assert 0.9 < elapsed < 4
    events = [orjson.loads(e.removeprefix(b"data: ")) for e in body.split(b"\n\n") if e]
    assert any(e.get("choices") and e["choices"][0]["delta"].get("content") for e in events)
    assert events[-1]["error"]["code"] == "upstream_stream_broken"
    assert "silent for 1 s" in events[-1]["error"]["message"]
    [(_, settlement)] = recorder.settled
    assert settlement.outcome == "error"
    for _ in range(40):  # the upstream is dropped, not left streaming into nowhere
        if prism_fake.dropped("quiet"):
            break
        await asyncio.sleep(0.05)
    assert prism_fake.dropped("quiet") == 1


async def test_a_slow_stream_that_never_pauses_for_long_is_not_cut(prism_fake, prism_gateway):
    # Each pause is shorter than the attempt timeout; the whole answer takes longer.
    prism_fake.script("steady", [Fault(token_delay_s=0.25)])
    gw = await prism_gateway(
        chain_catalog(prism_fake, "steady"), config={"attempt_timeout_ms": 1000}
    )
    started = time.monotonic()
    stream = await gw.openai().chat.completions.create(model="m", messages=MESSAGES, stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert time.monotonic() - started > 1.5
    assert text == "Hello from up-steady. This is the fake upstream answering."


async def test_a_stream_sends_its_headers_with_its_first_event_not_after_it(
    prism_fake, prism_gateway
):
    # Headers leave with the first events, in one write: neither waits for the rest.
    prism_fake.script("steady", [Fault(token_delay_s=1.0, text="one two three")])
    gw = await prism_gateway(chain_catalog(prism_fake, "steady"))
    started = time.monotonic()
    async with aiohttp.ClientSession() as session, asyncio.timeout(30):
        async with post_stream(session, gw) as response:
            headers_at = time.monotonic() - started
            first = await response.content.readuntil(b"\n\n")
            first_at = time.monotonic() - started
            rest = await response.read()
            ended_at = time.monotonic() - started
    assert response.headers["Content-Type"].startswith("text/event-stream")
    assert response.headers["x-prism-provider"] == "steady"
    assert first.startswith(b"data: {")
    assert headers_at < 0.8 and first_at < 0.8  # the next token is a second away
    assert ended_at > 1.5
    assert rest.endswith(b"data: [DONE]\n\n")
