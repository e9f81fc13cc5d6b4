"""The connection cap under attack, as `prism serve` runs it (on uvloop when installed).

Slow heads from clients that reconnect as soon as they are closed must not
crowd out callers; what is refused is told so in one cheap write, and the log
says it without a flood.  The cases that need no process (who gives way at the
cap) run against the app on a loopback port.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import time
from pathlib import Path

import aiohttp
import orjson
import pytest

from prism_proxy.testing import free_port, serve_process

MESSAGES = [{"role": "user", "content": "hi"}]
#: What a slow client sends, one byte at a time.
SLOW_HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 40 + b"\r\n\r\n"
#: A request whose body never comes: the connection is in the middle of a request.
BODY_PENDING = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: 100\r\n\r\n"
)


async def start_prism(
    tmp_path: Path, fake, **options: object
) -> tuple[asyncio.subprocess.Process, int]:
    port = free_port()
    lines = "".join(f"{name} = {value}\n" for name, value in options.items())
    (tmp_path / "prism.ini").write_text(
        f"[prism]\nlisten = 127.0.0.1:{port}\ncatalog = catalog.toml\n{lines}"
    )
    (tmp_path / "catalog.toml").write_text(
        f'[providers.p]\nkind = "openai"\nbase_url = "{fake.base_url("ok")}"\n'
        '[models.m]\nchain = [ { provider = "p", model = "x" } ]\n'
    )
    return await serve_process(tmp_path / "prism.ini", port), port


async def stop_prism(process: asyncio.subprocess.Process) -> str:
    """SIGTERM, wait, and return what the process logged."""
    process.send_signal(signal.SIGTERM)
    try:
        _, err = await asyncio.wait_for(process.communicate(), 30)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    return err.decode(errors="replace")


def split_answer(raw: bytes) -> tuple[int, dict[str, str], dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(lines[0].split()[1]), headers, orjson.loads(body)


async def read_to_end(reader: asyncio.StreamReader, wait_s: float = 10) -> bytes:
    return await asyncio.wait_for(reader.read(), wait_s)


async def stats(port: int) -> dict[str, int]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        async with session.get(f"http://127.0.0.1:{port}/prism/stats") as response:
            return dict((await response.json())["counters"])


class Trickler(asyncio.Protocol):
    """A client that sends its head a byte at a time and reconnects as soon as it is closed."""

    def __init__(self, swarm: Swarm) -> None:
        self.swarm = swarm
        self.sent = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.swarm.live.add(self)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.swarm.live.discard(self)
        self.swarm.closed += 1
        self.swarm.reconnect()


class Swarm:
    """``size`` trickling clients; one timer writes the next byte of every live one."""

    def __init__(self, port: int, size: int) -> None:
        self.port = port
        self.size = size
        self.live: set[Trickler] = set()
        self.closed = 0
        self.running = True
        self.tasks: set[asyncio.Task[None]] = set()

    def reconnect(self) -> None:
        if self.running:
            task = asyncio.get_running_loop().create_task(self._connect())
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        while self.running:
            try:
                await loop.create_connection(lambda: Trickler(self), "127.0.0.1", self.port)
                return
            except OSError:
                await asyncio.sleep(0.05)

    async def run(self) -> None:
        for _ in range(self.size):
            self.reconnect()
        while self.running:
            await asyncio.sleep(0.2)
            for client in list(self.live):
                if client.transport is not None and client.sent < len(SLOW_HEAD) - 1:
                    client.transport.write(SLOW_HEAD[client.sent : client.sent + 1])
                    client.sent += 1

    async def stop(self) -> None:
        self.running = False
        for task in list(self.tasks):
            task.cancel()
        for client in list(self.live):
            if client.transport is not None:
                client.transport.abort()
        await asyncio.sleep(0)


async def test_callers_get_through_ten_times_the_cap_of_reconnecting_slow_heads(
    prism_fake, tmp_path
):
    process, port = await start_prism(tmp_path, prism_fake, max_connections=40)
    swarm = Swarm(port, 400)
    attack = asyncio.create_task(swarm.run())
    served = 0
    try:
        await asyncio.sleep(1.5)  # the swarm holds every slot and churns
        assert len(swarm.live) >= 40

        async def call() -> bool:
            # A fresh connection per call: each one must get past the cap.
            connector = aiohttp.TCPConnector(force_close=True)
            timeout = aiohttp.ClientTimeout(total=10)
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
                try:
                    async with session.post(
                        f"http://127.0.0.1:{port}/v1/chat/completions",
                        json={"model": "m", "messages": MESSAGES},
                    ) as response:
                        await response.read()
                        return response.status == 200
                except (aiohttp.ClientError, TimeoutError):
                    return False

        for _ in range(10):
            served += sum(await asyncio.gather(*(call() for _ in range(5))))
        print(f"served {served}/50 with {swarm.closed} slow connections closed meanwhile")
    finally:
        await swarm.stop()
        attack.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await attack
        try:
            counters = await stats(port)
        finally:
            log = await stop_prism(process)
    assert served >= 45, (served, counters)
    # The cap held: slow heads gave way to callers or were refused, and said so sparsely.
    assert counters["connections_shed"] > 0 and counters["connections_refused"] > 0
    said = [line for line in log.splitlines() if "refused a connection" in line]
    assert len(said) <= counters["connections_refused"].bit_length()
    assert "Traceback" not in log


async def test_beyond_the_cap_the_refusal_is_written_and_logged_sparsely(prism_fake, tmp_path):
    process, port = await start_prism(tmp_path, prism_fake, max_connections=3)
    busy = []
    try:
        # Three connections in the middle of a request: none may give way.
        for _ in range(3):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(BODY_PENDING)
            busy.append((reader, writer))
        await asyncio.sleep(0.2)
        started = time.monotonic()
        ids = set()
        for _ in range(20):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            try:
                raw = await read_to_end(reader)
            finally:
                writer.close()
            status, headers, body = split_answer(raw)
            assert (status, body["error"]["code"]) == (503, "too_many_connections")
            assert headers["connection"] == "close"
            ids.add(headers["x-prism-request-id"])
        # Every refusal is an answer like any other: its own request id.
        assert len(ids) == 20 and all(i.startswith("req_") for i in ids)
        assert time.monotonic() - started < 10
        for _, writer in busy:
            writer.close()
        await asyncio.sleep(0.2)
        counters = await stats(port)
    finally:
        for _, writer in busy:
            writer.close()
        log = await stop_prism(process)
    assert counters["connections_refused"] == 20
    refusals = [line for line in log.splitlines() if "refused a connection" in line]
    # The 1st, 2nd, 4th, 8th and 16th: said, and said again as it grows.
    assert len(refusals) == 5, refusals
    assert "(16 refused so far" in refusals[-1]
    assert "Traceback" not in log and "AssertionError" not in log


def connect_and_send(port: int, data: bytes) -> socket.socket:
    """Connect and send before the event loop (the server's too) runs again.

    The bytes are waiting when the server accepts the connection.
    """
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(data)
    sock.setblocking(False)
    return sock


async def recv_to_end(sock: socket.socket, wait_s: float = 10) -> bytes:
    loop = asyncio.get_running_loop()
    chunks = []
    async with asyncio.timeout(wait_s):
        while chunk := await loop.sock_recv(sock, 65536):
            chunks.append(chunk)
    return b"".join(chunks)


async def test_a_caller_whose_head_has_arrived_takes_the_place_of_a_slow_head(
    prism_gateway, catalog
):
    gw = await prism_gateway(catalog, config={"max_connections": 3})
    port = gw.listening.port
    slow = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
    for _, writer in slow:
        writer.write(b"GET /healthz HTT")
    await asyncio.sleep(0.1)
    caller = connect_and_send(
        port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    try:
        status, _, body = split_answer(await recv_to_end(caller))
    finally:
        caller.close()
    assert (status, body) == (200, {"status": "alive"})
    # The slow head that had waited longest was told why it was closed.
    status, _, body = split_answer(await read_to_end(slow[0][0]))
    assert (status, body["error"]["code"]) == (503, "too_many_connections")
    for _, writer in slow:
        writer.close()
    assert gw.gateway.counters["connections_shed"] == 1
    assert gw.gateway.counters["connections_refused"] == 0


@pytest.mark.parametrize(
    "second",
    [b"\x00\x01 not http\r\n\r\n", b"GARBAGE"],
    ids=["a bad message", "bytes without an end"],
)
async def test_a_pipelined_request_before_garbage_is_answered_then_the_400(
    prism_gateway, catalog, second
):
    gw = await prism_gateway(catalog)
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.listening.port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" + second)
    try:
        raw = await read_to_end(reader)
    finally:
        writer.close()
    first, _, rest = raw.partition(b'{"status": "alive"}')
    assert first.startswith(b"HTTP/1.1 200 OK\r\n"), raw
    status, _, body = split_answer(rest)
    assert (status, body["error"]["code"]) == (400, "bad_http_message")
    assert gw.gateway.counters["http_rejections"] == 1


@pytest.mark.parametrize(
    "line",
    [b"GET /healthz", b"GET /healthz HTTP/2.0", b"GET /healthz HTTP/0.9"],
    ids=["no version", "HTTP/2.0", "HTTP/0.9"],
)
async def test_a_request_line_that_is_not_http_1_is_a_400(prism_gateway, catalog, line):
    gw = await prism_gateway(catalog)
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.listening.port)
    writer.write(line + b"\r\nHost: x\r\n\r\n")
    try:
        raw = await read_to_end(reader)
    finally:
        writer.close()
    assert raw.startswith(b"HTTP/1."), raw
    status, _, body = split_answer(raw)
    assert (status, body["error"]["code"]) == (400, "bad_http_message")


async def test_a_content_length_over_the_limit_is_refused_before_the_body(prism_gateway, catalog):
    # header_timeout_s is also how long an unread body is drained for: long here,
    # so an answer that waited for it would show.
    gw = await prism_gateway(catalog, config={"max_body_bytes": 4096, "header_timeout_s": 30})
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.listening.port)
    started = time.monotonic()
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 20000000\r\n\r\n{"model": "chat-a", '
    )
    try:
        raw = await read_to_end(reader, 20)
    finally:
        writer.close()
    assert time.monotonic() - started < 5
    status, headers, body = split_answer(raw)
    assert (status, body["error"]["code"], body["error"]["param"]) == (
        413,
        "body_too_large",
        "body",
    )
    assert headers["connection"] == "close"
