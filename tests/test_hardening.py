"""Failure shapes found in review: each once let a broken answer through as a success."""

from __future__ import annotations

import asyncio

import aiohttp
import openai
import orjson
import pytest
from prism_fake_upstream import Fault

from prism_proxy import hookimpl

MESSAGES = [{"role": "user", "content": "hi"}]


async def raw_upstream(answer: bytes) -> tuple[asyncio.Server, str]:
    """An HTTP server that reads one request and answers ``answer`` verbatim, then hangs up."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            (
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ),
            0,
        )
        await reader.readexactly(length)
        writer.write(answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"


def one_line(kind: str, url: str) -> dict:
    """Model ``m`` served by one binding, ``a/x``."""
    return {
        "providers": {"a": {"kind": kind, "base_url": url}},
        "models": {"m": {"chain": [{"provider": "a", "model": "x"}]}},
    }


def two_lines(kind: str, first_url: str, second_url: str) -> dict:
    return {
        "providers": {
            "first": {"kind": kind, "base_url": first_url},
            "second": {"kind": kind, "base_url": second_url},
        },
        "models": {
            "m": {
                "retries": 0,
                "chain": [
                    {"provider": "first", "model": "a"},
                    {"provider": "second", "model": "b"},
                ],
            }
        },
    }


CUT = (
    b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{"id": "chat'
)
HTML = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 35\r\n\r\n"
    b"<html>upstream proxy error</html>\r\n"
)


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.parametrize("answer", [CUT, HTML], ids=["cut-body", "html"])
async def test_a_200_that_is_not_an_answer_fails_over(prism_fake, prism_gateway, kind, answer):
    server, url = await raw_upstream(answer)
    try:
        gw = await prism_gateway(two_lines(kind, url, prism_fake.base_url("ok")))
        raw = await gw.openai().chat.completions.with_raw_response.create(
            model="m", messages=MESSAGES
        )
    finally:
        server.close()
    assert raw.parse().choices[0].message.content.startswith("Hello from b")
    assert raw.headers["x-prism-attempt-log"].startswith("first/a transient 200")


async def test_402_payment_required_is_permanent(prism_fake, prism_gateway):
    prism_fake.script(
        "pay", [Fault(status=402, body={"error": {"message": "Insufficient credits"}})]
    )
    gw = await prism_gateway(
        two_lines("openai", prism_fake.base_url("pay"), prism_fake.base_url("ok"))
    )
    raw = await gw.openai().chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
    assert raw.headers["x-prism-attempt-log"].startswith("first/a permanent 402")


class Observer:
    def __init__(self, delay: float = 0.0) -> None:
        self.seen: list[tuple[str, str | None]] = []
        self.delay = delay

    @hookimpl
    def prism_on_attempt(self, call, attempt):
        self.seen.append((attempt.binding.id, attempt.outcome))
        return asyncio.sleep(self.delay) if self.delay else None


async def test_a_cancelled_anthropic_attempt_is_cancelled_not_ok(prism_fake, prism_gateway):
    observer = Observer()
    prism_fake.script("slow", [Fault(first_token_delay_s=5)])
    catalog = one_line("anthropic", prism_fake.base_url("slow"))
    gw = await prism_gateway(catalog, plugins=[(observer, "observer")])
    async with aiohttp.ClientSession() as session:
        with pytest.raises(asyncio.TimeoutError):
            await session.post(
                gw.url + "/v1/messages",
                json={"model": "m", "max_tokens": 9, "messages": MESSAGES, "stream": True},
                timeout=aiohttp.ClientTimeout(total=0.5),
            )
    for _ in range(100):
        if observer.seen:
            break
        await asyncio.sleep(0.02)
    assert observer.seen == [("a/x", "cancelled")]


async def test_a_client_leaving_during_a_slow_observer_still_drops_the_upstream(
    prism_fake, prism_gateway
):
    prism_fake.script("s", [Fault(token_delay_s=0.2)])
    catalog = one_line("openai", prism_fake.base_url("s"))
    gw = await prism_gateway(catalog, plugins=[(Observer(delay=2.0), "slow")])
    async with aiohttp.ClientSession() as session:
        with pytest.raises(asyncio.TimeoutError):
            await session.post(
                gw.base_url + "/chat/completions",
                json={"model": "m", "messages": MESSAGES, "stream": True},
                timeout=aiohttp.ClientTimeout(total=0.5),
            )
    for _ in range(50):
        if prism_fake.dropped("s"):
            break
        await asyncio.sleep(0.05)
    assert prism_fake.dropped("s") == 1


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/chat/completions"])
async def test_an_error_event_meaning_bad_request_is_a_400_not_a_200(
    prism_fake, prism_gateway, path
):
    prism_fake.script(
        "a",
        [Fault(stream_error={"type": "invalid_request_error", "message": "prompt is too long"})],
    )
    gw = await prism_gateway(one_line("anthropic", prism_fake.base_url("a")))
    async with aiohttp.ClientSession() as session:
        async with session.post(
            gw.url + path,
            json={"model": "m", "max_tokens": 9, "messages": MESSAGES, "stream": True},
        ) as response:
            body = await response.json()
    assert response.status == 400
    assert "prompt is too long" in orjson.dumps(body).decode()


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/chat/completions"])
async def test_a_cut_anthropic_stream_bills_what_was_delivered(
    prism_fake, prism_gateway, recorder, path
):
    prism_fake.script("a", [Fault(die_after_chunks=40, text=" ".join(["word"] * 200))])
    gw = await prism_gateway(one_line("anthropic", prism_fake.base_url("a")))
    async with aiohttp.ClientSession() as session:
        async with session.post(
            gw.url + path,
            json={"model": "m", "max_tokens": 900, "messages": MESSAGES, "stream": True},
        ) as response:
            await response.read()
    [(_, settlement)] = recorder.settled
    assert settlement.outcome == "error"
    assert settlement.usage.estimated
    assert settlement.usage.output_tokens >= 40  # 40 words of 5 characters were delivered
    assert settlement.usage.input_tokens > 0  # as reported by message_start


async def test_a_malformed_chunk_after_content_ends_the_stream_with_an_error(prism_gateway):
    first = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
    bad = b'data: {"id":"c","choices":[1]}\n\n'
    body = first + bad
    answer = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )
    server, url = await raw_upstream(answer)
    try:
        gw = await prism_gateway(one_line("openai", url))
        stream = await gw.openai().chat.completions.create(
            model="m", messages=MESSAGES, stream=True
        )
        with pytest.raises(openai.APIError):
            await asyncio.wait_for(_drain(stream), 5)
    finally:
        server.close()


async def _drain(stream) -> None:
    async for _ in stream:
        pass
