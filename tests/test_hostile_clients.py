"""Hostile clients: slow and idle connections, too many of them, and bytes that are not HTTP.

Every case goes through the real server on a loopback port with raw sockets,
because the point is what the server does before any handler runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import aiohttp
import orjson
import pytest

from prism_proxy.connections import RejectionLog

MESSAGES = [{"role": "user", "content": "hi"}]
#: Bytes that must never come back in an answer.
SECRET = b"SECRET-e1a2"


async def send_raw(port: int, data: bytes, *, wait_s: float = 5.0) -> bytes:
    """Write ``data`` on a fresh connection and read until the server closes it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        return await asyncio.wait_for(reader.read(), wait_s)
    finally:
        writer.close()


def split_answer(raw: bytes) -> tuple[int, dict[str, str], dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, orjson.loads(body)


async def chat_ok(gw) -> int:
    async with aiohttp.ClientSession() as session:
        async with session.post(
            gw.base_url + "/chat/completions", json={"model": "chat-a", "messages": MESSAGES}
        ) as response:
            await response.read()
            return response.status


async def test_trickling_connections_are_closed_while_calls_are_served(prism_gateway, catalog):
    gw = await prism_gateway(catalog, config={"header_timeout_s": 1})
    port = gw.listening.port

    async def trickle() -> float:
        """Send a head one byte at a time; return how long until the server hung up."""
        started = time.monotonic()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100
        try:
            for byte in head:
                if reader.at_eof():
                    break
                writer.write(bytes([byte]))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(reader.read(1), 0.2)
            await asyncio.wait_for(reader.read(), 10)
        except (ConnectionError, TimeoutError):
            pass
        finally:
            writer.close()
        return time.monotonic() - started

    slow = [asyncio.create_task(trickle()) for _ in range(300)]
    await asyncio.sleep(0.3)
    # Normal callers keep being served while the slow heads trickle in.
    statuses = [await chat_ok(gw) for _ in range(10)]
    lasted = await asyncio.gather(*slow)
    assert statuses == [200] * 10
    # Each trickling head would have taken 20 s; the server cut it after ~1 s.
    assert max(lasted) < 8, sorted(lasted)[-5:]
    assert gw.gateway.counters["header_timeouts"] >= 300


async def test_a_connection_that_sends_nothing_is_closed(prism_gateway, catalog):
    gw = await prism_gateway(catalog, config={"header_timeout_s": 0.5})
    started = time.monotonic()
    raw = await send_raw(gw.listening.port, b"", wait_s=10)
    assert time.monotonic() - started < 5
    status, headers, body = split_answer(raw)
    assert (status, body["error"]["code"]) == (408, "request_timeout")
    assert headers["server"] == "prism"
    assert headers["x-prism-request-id"].startswith("req_")


async def test_an_idle_keep_alive_connection_is_closed(prism_gateway, catalog):
    gw = await prism_gateway(catalog, config={"keepalive_timeout_s": 0.5})
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.listening.port)
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert b"200 OK" in head
        started = time.monotonic()
        rest = await asyncio.wait_for(reader.read(), 10)  # EOF once the server closes it
        assert b"alive" in rest
        assert 0.3 < time.monotonic() - started < 5
    finally:
        writer.close()


async def test_a_stalled_body_is_answered_408_and_closed(prism_gateway, catalog, prism_fake):
    gw = await prism_gateway(catalog, config={"header_timeout_s": 0.5})
    started = time.monotonic()
    raw = await send_raw(
        gw.listening.port,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100\r\n\r\n{"model": "chat-a", ',
        wait_s=10,
    )
    assert time.monotonic() - started < 5
    status, headers, body = split_answer(raw)
    assert (status, body["error"]["code"], body["error"]["param"]) == (
        408,
        "request_timeout",
        "body",
    )
    assert headers["connection"] == "close"
    assert prism_fake.hits("ok") == 0


async def test_connections_beyond_the_cap_are_refused_at_once(prism_gateway, catalog):
    gw = await prism_gateway(catalog, config={"max_connections": 3})
    port = gw.listening.port
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
    for _, writer in held:
        # In the middle of a request (its body still to come): no connection gives way.
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\n")
    try:
        await asyncio.sleep(0.05)
        started = time.monotonic()
        raw = await send_raw(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert time.monotonic() - started < 2
        status, headers, body = split_answer(raw)
        assert (status, body["error"]["code"]) == (503, "too_many_connections")
        assert headers["connection"] == "close"
        assert gw.gateway.counters["connections_refused"] == 1
    finally:
        for _, writer in held:
            writer.close()
    # Once they are gone, callers are served again.
    for _ in range(50):
        await asyncio.sleep(0.02)
        if await chat_ok(gw) == 200:
            break
    else:
        pytest.fail("the gateway never accepted connections again")


BAD_MESSAGES = {
    "bad chunk size": (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\nZZ" + SECRET + b"\r\n{}\r\n0\r\n\r\n",
        400,
        "bad_http_message",
    ),
    "header too large": (
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + SECRET * 2000 + b"\r\n\r\n",
        431,
        "header_too_large",
    ),
    "too many headers": (
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
        + b"".join(b"X-%d: " % i + SECRET + b"\r\n" for i in range(300))
        + b"\r\n",
        431,
        "too_many_headers",
    ),
    "content-length with transfer-encoding": (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        400,
        "bad_http_message",
    ),
    "bad content-length": (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 12"
        + SECRET
        + b"\r\n\r\n",
        400,
        "bad_http_message",
    ),
    "not http": (SECRET + b"\x00\x01 / HTTP/1.1\r\n\r\n", 400, "bad_http_message"),
}


@pytest.mark.parametrize("case", list(BAD_MESSAGES))
async def test_the_parser_s_rejections_are_json(prism_gateway, catalog, prism_fake, case, caplog):
    data, status, code = BAD_MESSAGES[case]
    gw = await prism_gateway(catalog)
    with caplog.at_level(logging.DEBUG):
        raw = await send_raw(gw.listening.port, data)
    got_status, headers, body = split_answer(raw)
    assert (got_status, body["error"]["code"]) == (status, code)
    assert headers["content-type"].startswith("application/json")
    assert headers["server"] == "prism"
    assert headers["x-prism-request-id"].startswith("req_")
    assert SECRET not in raw  # never echoed back
    # One WARNING line naming the peer and the reason; no traceback, no request bytes.
    rejected = [r for r in caplog.records if r.name.startswith("aiohttp") or r.name == "prism.http"]
    assert [r.levelname for r in rejected] == ["WARNING"]
    assert "127.0.0.1" in rejected[0].getMessage() and code in rejected[0].getMessage()
    assert rejected[0].exc_info is None
    assert SECRET.decode() not in caplog.text
    assert prism_fake.hits("ok") == 0


async def test_a_flood_of_bad_messages_logs_one_line(prism_gateway, catalog, caplog):
    gw = await prism_gateway(catalog)
    with caplog.at_level(logging.INFO, logger="prism.http"):
        for _ in range(30):
            await send_raw(gw.listening.port, b"\x00\x01 nonsense\r\n\r\n")
    lines = [r for r in caplog.records if r.name == "prism.http"]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert gw.gateway.counters["http_rejections"] == 30


def test_the_rejection_log_counts_what_it_suppressed(caplog):
    now = [100.0]
    rejections = RejectionLog(clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="prism.http"):
        for _ in range(5):
            rejections.rejected("10.0.0.1", "bad_http_message: BadHttpMethod")
        rejections.rejected("10.0.0.2", "bad_http_message: BadHttpMethod")  # its own budget
        now[0] += 1.0
        rejections.rejected("10.0.0.1", "header_too_large: LineTooLong")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert "10.0.0.2" in lines[1]
    assert "10.0.0.1" in lines[2] and "(4 more suppressed)" in lines[2]


async def test_unknown_paths_and_methods_answer_json(prism_gateway, catalog):
    gw = await prism_gateway(catalog)
    async with aiohttp.ClientSession() as session:
        async with session.get(gw.url + "/v1/nothing-here") as response:
            assert response.status == 404
            assert response.content_type == "application/json"
            assert (await response.json())["error"]["code"] == "not_found"
            assert response.headers["Server"] == "prism"
        async with session.delete(gw.url + "/v1/models") as response:
            assert response.status == 405
            assert response.content_type == "application/json"
            assert (await response.json())["error"]["code"] == "method_not_allowed"
            assert set(response.headers["Allow"].split(", ")) == {"GET", "HEAD"}
        async with session.get(gw.url + "/v1/messages/x", headers={"anthropic-version": "1"}) as r:
            body = await r.json()
            assert r.status == 404 and body["type"] == "error"  # the Anthropic shape


async def test_a_body_that_is_not_json_is_415(prism_gateway, catalog, prism_fake):
    gw = await prism_gateway(catalog)
    async with aiohttp.ClientSession() as session:
        async with session.post(
            gw.base_url + "/chat/completions",
            data=b"model=chat-a",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        ) as response:
            body = await response.json()
    assert response.status == 415
    assert body["error"]["code"] == "unsupported_media_type"
    assert body["error"]["param"] == "Content-Type"
    assert prism_fake.hits("ok") == 0


async def test_responses_do_not_advertise_versions(prism_gateway, catalog):
    gw = await prism_gateway(catalog)
    async with aiohttp.ClientSession() as session:
        for method, path, body in (
            ("POST", "/v1/chat/completions", {"model": "chat-a", "messages": MESSAGES}),
            ("POST", "/v1/chat/completions", {"model": "nope", "messages": MESSAGES}),
            ("GET", "/v1/models", None),
            ("GET", "/healthz", None),
        ):
            async with session.request(method, gw.url + path, json=body) as response:
                assert response.headers["Server"] == "prism", (path, response.status)
