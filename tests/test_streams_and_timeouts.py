"""Stream commit point, first-byte timeout and empty completions, end to end."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from prism_fake_upstream import Fault

from prism_proxy import hookimpl
from prism_proxy.testing import eventually

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


async def test_stream_dying_before_its_first_content_fails_over(
    prism_fake, prism_gateway, prism_clock
):
    gw = await prism_gateway(chain_catalog(prism_fake, "die0", "ok"), clock=prism_clock)
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


def running(call: Awaitable[Any]) -> asyncio.Future[Any]:
    """``call`` running on its own, while the test moves the clock (bounded in real time)."""

    async def bounded() -> Any:
        async with asyncio.timeout(10):
            return await call

    return asyncio.ensure_future(bounded())


async def pace(clock: Any, pause_s: float, reading: asyncio.Future[Any]) -> None:
    """Let each of the fake's pauses of ``pause_s`` pass as it begins, until ``reading`` ends."""
    while True:
        await eventually(lambda: reading.done() or clock.now() + pause_s in clock.pending)
        if reading.done():
            return
        clock.advance(pause_s)


async def test_first_byte_timeout_moves_on(prism_fake, prism_gateway, prism_clock):
    prism_fake.clock = prism_clock
    prism_fake.script("slowfirst", [Fault(stall_s=30)])
    gw = await prism_gateway(
        chain_catalog(prism_fake, "slowfirst", "ok"),
        config={"attempt_timeout_ms": 1000},
        clock=prism_clock,
    )
    answer = running(
        gw.openai().chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
    )
    deadlines = gw.gateway.current.deadlines
    for hit in (1, 2):
        await eventually(lambda: prism_fake.hits("slowfirst") == hit)  # noqa: B023
        prism_clock.advance(0.95)
        assert deadlines.pending == 1  # the attempt's second is not up yet
        prism_clock.advance(0.15)  # a deadline is kept up to a tenth of a second late
    raw = await answer
    # One timeout retry on the same binding, then the next binding.
    log = raw.headers["x-prism-attempt-log"].split("; ")
    assert [entry.split()[:3] for entry in log] == [
        ["slowfirst/up-slowfirst", "timeout", "-"],
        ["slowfirst/up-slowfirst", "timeout", "-"],
        ["ok/up-ok", "ok", "200"],
    ]
    assert all(1000 <= int(entry.split()[3].removesuffix("ms")) <= 1100 for entry in log[:2])
    await eventually(lambda: prism_fake.dropped("slowfirst") == 2)


class AttemptsStarted:
    """The attempts the gateway started, as they go (``status`` once the headers came)."""

    def __init__(self) -> None:
        self.attempts: list[Any] = []

    @hookimpl
    def prism_attempt_start(self, call: Any, attempt: Any) -> None:
        self.attempts.append(attempt)


async def test_stream_timeout_counts_until_the_first_content(
    prism_fake, prism_gateway, prism_clock
):
    prism_fake.clock = prism_clock
    prism_fake.script("lazy", [Fault(first_token_delay_s=30)])
    seen = AttemptsStarted()
    gw = await prism_gateway(
        chain_catalog(prism_fake, "lazy", "ok"),
        config={"attempt_timeout_ms": 1000},
        clock=prism_clock,
        plugins=[(seen, "attempts-started")],
    )
    answer = running(
        gw.openai().chat.completions.with_raw_response.create(
            model="m", messages=MESSAGES, stream=True
        )
    )
    # The headers came at once; then no content within the second.
    await eventually(lambda: bool(seen.attempts) and seen.attempts[0].status == 200)
    prism_clock.advance(1.1)
    raw = await answer
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
    prism_fake, prism_gateway, prism_clock
):
    # The final event arrives, the body's end only later: the caller is not
    # kept waiting for it, and the connection still returns to the pool.
    prism_fake.clock = prism_clock
    prism_fake.script("ok", [Fault(end_delay_s=0.8), Fault()])
    gw = await prism_gateway(chain_catalog(prism_fake, "ok"), clock=prism_clock)
    client = gw.openai()
    async with asyncio.timeout(10):  # the body's end waits for the clock: the caller does not
        stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == "Hello from up-ok. This is the fake upstream answering."
    prism_clock.advance(0.8)  # the end arrives 0.8 s after the final event
    await client.chat.completions.create(model="m", messages=MESSAGES)
    first, second = prism_fake.requests("ok")
    assert first.peer == second.peer


async def read_text(stream: Any) -> str:
    return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])


def post_stream(session: aiohttp.ClientSession, gw: Any) -> Any:
    """A streamed chat call to ``gw`` read with plain aiohttp, as bytes arrive."""
    return session.post(
        gw.base_url + "/chat/completions",
        json={"model": "m", "messages": MESSAGES, "stream": True},
    )


async def test_a_stream_gone_silent_after_its_first_content_ends_with_an_error_event(
    prism_fake, prism_gateway, recorder, prism_clock
):
    prism_fake.clock = prism_clock
    prism_fake.script("quiet", [Fault(token_delay_s=30)])
    gw = await prism_gateway(
        chain_catalog(prism_fake, "quiet"),
        config={"attempt_timeout_ms": 1000},
        clock=prism_clock,
    )
    async with aiohttp.ClientSession() as session, asyncio.timeout(10):
        async with post_stream(session, gw) as response:
            first = await response.content.readuntil(b"\n\n")
            silent_from = prism_clock.now()
            # The watchdog is armed when the read after the first content begins.
            await eventually(lambda: silent_from + 1.0 in prism_clock.pending)
            prism_clock.advance(0.9)
            assert not response.content.is_eof()
            prism_clock.advance(0.1)
            body = first + await response.read()
    assert prism_clock.now() - silent_from == pytest.approx(1.0)
    events = [orjson.loads(e.removeprefix(b"data: ")) for e in body.split(b"\n\n") if e]
    assert any(e.get("choices") and e["choices"][0]["delta"].get("content") for e in events)
    assert events[-1]["error"]["code"] == "upstream_stream_broken"
    assert "silent for 1 s" in events[-1]["error"]["message"]
    [(_, settlement)] = recorder.settled
    assert settlement.outcome == "error"
    # The upstream is dropped, not left streaming into nowhere.
    await eventually(lambda: prism_fake.dropped("quiet") == 1)


async def test_a_slow_stream_that_never_pauses_for_long_is_not_cut(
    prism_fake, prism_gateway, prism_clock
):
    # Each pause is shorter than the attempt timeout; the whole answer takes longer.
    prism_fake.clock = prism_clock
    prism_fake.script("steady", [Fault(token_delay_s=0.25)])
    gw = await prism_gateway(
        chain_catalog(prism_fake, "steady"),
        config={"attempt_timeout_ms": 1000},
        clock=prism_clock,
    )
    began = prism_clock.now()
    stream = await gw.openai().chat.completions.create(model="m", messages=MESSAGES, stream=True)
    reading = running(read_text(stream))
    await pace(prism_clock, 0.25, reading)
    text = await reading
    assert prism_clock.now() - began > 1.5
    assert text == "Hello from up-steady. This is the fake upstream answering."


async def test_a_stream_sends_its_headers_with_its_first_event_not_after_it(
    prism_fake, prism_gateway, prism_clock
):
    # Headers leave with the first events, in one write: neither waits for the rest.
    prism_fake.clock = prism_clock
    prism_fake.script("steady", [Fault(token_delay_s=1.0, text="one two three")])
    gw = await prism_gateway(chain_catalog(prism_fake, "steady"), clock=prism_clock)
    began = prism_clock.now()
    async with aiohttp.ClientSession() as session, asyncio.timeout(10):
        async with post_stream(session, gw) as response:
            first = await response.content.readuntil(b"\n\n")
            # Not a moment passed: the next token is a second away, and nobody waited for it.
            assert prism_clock.now() == began
            reading = running(response.read())
            await pace(prism_clock, 1.0, reading)
            rest = await reading
    assert response.headers["Content-Type"].startswith("text/event-stream")
    assert response.headers["x-prism-provider"] == "steady"
    assert first.startswith(b"data: {")
    assert prism_clock.now() - began > 1.5
    assert rest.endswith(b"data: [DONE]\n\n")
