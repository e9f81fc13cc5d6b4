"""Prism's HTTP/1.1 client to upstreams: pooling, limits and answers shaped unusually on the wire.

The upstream here is a scripted socket server, because what is tested is the
bytes on the wire (bodies that run to the connection's end, gzip, connections
the upstream drops between calls, header floods), which the fake upstream's
aiohttp server never produces.  Calls go through the real gateway.
"""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import Awaitable, Callable

import aiohttp
import orjson
import pytest

from prism_proxy.upstream_http import HIGH_WATER, UpstreamClient

MESSAGES = [{"role": "user", "content": "hello"}]
ANSWER = orjson.dumps(
    {
        "id": "chatcmpl-wire",
        "object": "chat.completion",
        "created": 1,
        "model": "up",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello from the wire."},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 5, "total_tokens": 6},
    }
)

Answer = Callable[[asyncio.StreamWriter, int], Awaitable[bool]]


def answer_head(body: bytes, *extra: str, length: bool = True, version: str = "1.1") -> bytes:
    lines = [f"HTTP/{version} 200 OK", "Content-Type: application/json", *extra]
    if length:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class WireUpstream:
    """Reads each POST whole, then lets ``answer`` write the bytes (it returns whether
    to keep the connection).  Counts connections, and the most open at once."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.open = 0
        self.most_open = 0
        self.requests = 0
        self.server: asyncio.Server | None = None
        self._handlers: dict[asyncio.Task[None], asyncio.StreamWriter] = {}

    @property
    def base_url(self) -> str:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"

    async def start(self) -> WireUpstream:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers[task] = writer
        self.connections += 1
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                await reader.readexactly(length)
                index, self.requests = self.requests, self.requests + 1
                if not await self.answer(writer, index):
                    return
        finally:
            self.open -= 1
            writer.close()
            self._handlers.pop(task, None)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
        for writer in self._handlers.values():
            writer.transport.abort()  # the handlers end on the EOF, not cancelled
        await asyncio.gather(*self._handlers, return_exceptions=True)


@pytest.fixture
async def wire():
    started: list[WireUpstream] = []

    async def start(answer: Answer) -> WireUpstream:
        upstream = await WireUpstream(answer).start()
        started.append(upstream)
        return upstream

    yield start
    for upstream in started:
        await upstream.close()


def catalog(base_url: str, fallback: str | None = None, **options: object) -> dict:
    providers = {"wire": {"kind": "openai", "base_url": base_url, **options}}
    chain = [{"provider": "wire", "model": "up"}]
    if fallback is not None:
        providers["spare"] = {"kind": "openai", "base_url": fallback}
        chain.append({"provider": "spare", "model": "spare"})
    return {"providers": providers, "models": {"m": {"chain": chain, "retries": 0}}}


async def chat(gw):
    return await gw.openai().chat.completions.with_raw_response.create(model="m", messages=MESSAGES)


async def plain(writer: asyncio.StreamWriter, index: int) -> bool:
    writer.write(answer_head(ANSWER) + ANSWER)
    await writer.drain()
    return True


async def test_sequential_calls_share_one_keep_alive_connection(wire, prism_gateway):
    upstream = await wire(plain)
    gw = await prism_gateway(catalog(upstream.base_url))
    for _ in range(5):
        raw = await chat(gw)
        assert raw.parse().choices[0].message.content == "Hello from the wire."
    assert upstream.requests == 5
    assert upstream.connections == 1


async def test_max_connections_caps_what_is_open_and_the_rest_wait(wire, prism_gateway):
    async def slow(writer: asyncio.StreamWriter, index: int) -> bool:
        await asyncio.sleep(0.2)
        return await plain(writer, index)

    upstream = await wire(slow)
    gw = await prism_gateway(catalog(upstream.base_url, max_connections=2))
    answers = await asyncio.gather(*(chat(gw) for _ in range(6)))
    assert [raw.http_response.status_code for raw in answers] == [200] * 6
    assert upstream.requests == 6
    assert upstream.most_open == 2


async def test_a_gzip_answer_reaches_the_caller_decoded(wire, prism_gateway):
    packed = gzip.compress(ANSWER)

    async def gzipped(writer: asyncio.StreamWriter, index: int) -> bool:
        writer.write(answer_head(packed, "Content-Encoding: gzip") + packed)
        await writer.drain()
        return True

    upstream = await wire(gzipped)
    gw = await prism_gateway(catalog(upstream.base_url))
    raw = await chat(gw)
    assert raw.parse().choices[0].message.content == "Hello from the wire."
    assert raw.parse().usage.completion_tokens == 5


async def test_a_body_that_runs_to_the_connection_end_is_whole(wire, prism_gateway):
    async def until_close(writer: asyncio.StreamWriter, index: int) -> bool:
        writer.write(answer_head(ANSWER, "Connection: close", length=False, version="1.0"))
        writer.write(ANSWER)
        await writer.drain()
        return False

    upstream = await wire(until_close)
    gw = await prism_gateway(catalog(upstream.base_url))
    for _ in range(2):
        raw = await chat(gw)
        assert raw.parse().choices[0].message.content == "Hello from the wire."
    assert upstream.connections == 2  # never reused: it said it would close


async def test_an_upstream_dropping_idle_connections_costs_no_attempt(wire, prism_gateway):
    async def then_hang_up(writer: asyncio.StreamWriter, index: int) -> bool:
        await plain(writer, index)
        return False  # closes without having said so: the pooled connection goes stale

    upstream = await wire(then_hang_up)
    gw = await prism_gateway(catalog(upstream.base_url))
    for _ in range(3):
        raw = await chat(gw)
        await asyncio.sleep(0.05)  # the hang-up arrives before the next call
        assert raw.headers["x-prism-attempts"] == "1"
    assert upstream.connections == 3


@pytest.mark.parametrize(
    "lie",
    [
        pytest.param(
            b"HTTP/1.1 200 OK\r\n" + b"X-Flood: " + b"a" * 70_000 + b"\r\n\r\n", id="flood"
        ),
        pytest.param(answer_head(ANSWER) + ANSWER[:40], id="short-body"),
        pytest.param(b"SMTP ready\r\n\r\n", id="not-http"),
        pytest.param(answer_head(ANSWER, "Content-Encoding: br") + ANSWER, id="unknown-coding"),
    ],
)
async def test_an_answer_that_is_not_one_fails_over(wire, prism_gateway, prism_fake, lie):
    async def liar(writer: asyncio.StreamWriter, index: int) -> bool:
        writer.write(lie)
        await writer.drain()
        return False

    upstream = await wire(liar)
    gw = await prism_gateway(catalog(upstream.base_url, fallback=prism_fake.base_url("ok")))
    raw = await chat(gw)
    assert raw.headers["x-prism-provider"] == "spare"
    first = raw.headers["x-prism-attempt-log"].split("; ")[0].split()
    assert first[:2] == ["wire/up", "transient"]


async def test_a_refused_connect_fails_over(prism_gateway, prism_fake):
    from prism_proxy.testing import free_port

    gw = await prism_gateway(
        catalog(f"http://127.0.0.1:{free_port()}/v1", fallback=prism_fake.base_url("ok"))
    )
    raw = await chat(gw)
    assert raw.headers["x-prism-provider"] == "spare"
    assert raw.headers["x-prism-attempt-log"].split("; ")[0].split()[:2] == [
        "wire/up",
        "transient",
    ]


async def test_a_stream_nobody_reads_buffers_a_bounded_amount(wire):
    big = b"x" * (64 * HIGH_WATER)  # more than the sockets' buffers hold
    sent = asyncio.Event()

    async def flood(writer: asyncio.StreamWriter, index: int) -> bool:
        writer.write(answer_head(big) + big)
        await writer.drain()
        sent.set()
        return True

    upstream = await wire(flood)
    client = UpstreamClient(limit=4, connect_timeout_s=5)
    try:
        response = await client.post(f"{upstream.base_url}/chat/completions", {}, b"{}")
        with pytest.raises(TimeoutError):
            # Reading paused: the upstream cannot finish writing while nobody reads.
            async with asyncio.timeout(0.5):
                await sent.wait()
        received = b"".join([chunk async for chunk in response.iter_chunks()])
        assert received == big
        response.release()
        assert client.open_connections == 1  # read to its end: pooled again
    finally:
        await client.close()


async def test_idle_connections_are_closed_after_idle_s(wire):
    upstream = await wire(plain)
    client = UpstreamClient(limit=4, connect_timeout_s=5, idle_s=0.05)
    try:
        response = await client.post(f"{upstream.base_url}/chat/completions", {}, b"{}")
        assert orjson.loads(await response.read())["id"] == "chatcmpl-wire"
        response.release()
        assert client.open_connections == 1
        async with asyncio.timeout(5):
            while client.open_connections:
                await asyncio.sleep(0.02)
    finally:
        await client.close()


async def test_headers_the_client_owns_are_refused(wire):
    upstream = await wire(plain)
    client = UpstreamClient(limit=1, connect_timeout_s=5)
    try:
        for headers in ({"Content-Length": "1"}, {"X-Bad": "a\r\nInjected: yes"}):
            with pytest.raises(ValueError):
                await client.post(f"{upstream.base_url}/chat/completions", headers, b"{}")
        assert upstream.requests == 0
    finally:
        await client.close()


async def test_a_closed_client_refuses_calls(wire):
    upstream = await wire(plain)
    client = UpstreamClient(limit=1, connect_timeout_s=5)
    await client.close()
    with pytest.raises(aiohttp.ClientConnectionError):
        await client.post(f"{upstream.base_url}/chat/completions", {}, b"{}")


async def test_closing_the_client_fails_what_waits_on_it(wire):
    answered, hold = asyncio.Event(), asyncio.Event()

    async def never(writer: asyncio.StreamWriter, index: int) -> bool:
        if index == 1:
            writer.write(answer_head(ANSWER) + ANSWER[:20])  # a body that never ends
            await writer.drain()
            answered.set()
        await hold.wait()  # the first call gets no answer at all
        return False

    upstream = await wire(never)
    client = UpstreamClient(limit=4, connect_timeout_s=5)
    url = f"{upstream.base_url}/chat/completions"
    try:
        waiting = asyncio.create_task(client.post(url, {}, b"{}"))
        while upstream.requests < 1:
            await asyncio.sleep(0.01)
        response = await client.post(url, {}, b"{}")
        reading = asyncio.create_task(response.read())
        await answered.wait()
        await client.close()
        async with asyncio.timeout(5):  # told at once, not left hanging
            for task in (waiting, reading):
                with pytest.raises(aiohttp.ClientConnectionError):
                    await task
    finally:
        hold.set()
