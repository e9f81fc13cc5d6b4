"""Each aiohttp internal Prism relies on, checked against the installed aiohttp.

One test per name in :data:`prism_proxy.aiohttp_internals.INTERNALS`, on a
plain aiohttp server on a loopback port (so that a name aiohttp dropped fails
its own test, not every test that serves): an aiohttp upgrade that removes or
reshapes one fails here by name.  The aliases are read as Prism reads them,
through :mod:`prism_proxy.aiohttp_internals`; a missing one raises
``AiohttpInternalMissing`` naming it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import re
import socket
import tomllib
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web, web_protocol
from aiohttp.http import HttpProcessingError, RawRequestMessage
from aiohttp.streams import EMPTY_PAYLOAD, StreamReader
from packaging.requirements import Requirement

from prism_proxy import aiohttp_internals
from prism_proxy.aiohttp_internals import (
    SUPPORTED,
    AiohttpInternalMissing,
    BadHttpMessage,
    DeferredHeadersResponse,
    ErrInfo,
    HandlerInternals,
    Internal,
    LineTooLong,
    SiteInternals,
)
from prism_proxy.server import listen

ROOT = Path(__file__).resolve().parents[1]
GET = b"GET /%s HTTP/1.1\r\nHost: x\r\n\r\n"
#: The same, last on its connection.
LAST = b"GET /%s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def state(obj: object, alias: str) -> Any:
    """Read ``alias`` (an attribute of HandlerInternals or SiteInternals) off a plain
    aiohttp object, through the descriptor Prism's subclasses use."""
    on = HandlerInternals if isinstance(obj, web.RequestHandler) else SiteInternals
    return inspect.getattr_static(on, alias).__get__(obj, type(obj))


@contextlib.asynccontextmanager
async def aiohttp_server(handler: Handler) -> AsyncIterator[tuple[web.AppRunner, int]]:
    """aiohttp's own server (no Prism subclass) on a loopback port, every path to ``handler``."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield runner, runner.addresses[0][1]
    finally:
        await runner.cleanup()


async def send(port: int, raw: bytes) -> bytes:
    """Write ``raw`` in one write and read the answers until the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


def statuses(raw: bytes) -> list[int]:
    # A rejected message is answered as HTTP/1.0 (aiohttp never parsed its version).
    return [int(code) for code in re.findall(rb"HTTP/1\.[01] (\d{3}) ", raw)]


async def test_the_core_pins_aiohttp_below_its_next_major_release() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = [Requirement(dep) for dep in project["dependencies"] if dep.startswith("aiohttp")]
    assert [str(pin) for pin in pins] == [str(Requirement(SUPPORTED))]
    assert pins[0].specifier.contains(version("aiohttp"))
    assert not pins[0].specifier.contains("4.0")


async def test_every_internal_is_in_this_aiohttp() -> None:
    assert [i.where for i in aiohttp_internals.INTERNALS if not i.present()] == []
    assert aiohttp_internals.missing() == []


async def test_handler_loop_is_the_connections_loop() -> None:
    seen: dict[str, object] = {}

    async def handler(request: web.Request) -> web.Response:
        seen["loop"] = state(request.protocol, "aio_loop")
        return web.Response(text="ok")

    async with aiohttp_server(handler) as (_, port):
        assert statuses(await send(port, LAST % b"x")) == [200]
    assert seen["loop"] is asyncio.get_running_loop()


async def test_handler_manager_is_its_server_and_none_means_unregistered() -> None:
    seen: dict[str, object] = {}

    async def handler(request: web.Request) -> web.Response:
        seen["manager"] = state(request.protocol, "aio_manager")
        return web.Response(text="ok")

    async with aiohttp_server(handler) as (runner, port):
        await send(port, LAST % b"x")
        assert seen["manager"] is runner.server
        # What a connection refused at the cap relies on: with no manager, a
        # handler that never registered loses its connection without error.
        assert runner.server is not None
        refused = runner.server()
        inspect.getattr_static(HandlerInternals, "aio_manager").__set__(refused, None)
        assert state(refused, "aio_manager") is None
        refused.connection_lost(None)
        assert runner.server.connections == []


async def test_handler_request_count_counts_the_requests_parsed() -> None:
    counts: list[int] = []
    handlers: set[int] = set()

    async def handler(request: web.Request) -> web.Response:
        counts.append(state(request.protocol, "aio_request_count"))
        handlers.add(id(request.protocol))
        return web.Response(text="ok")

    async with aiohttp_server(handler) as (_, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for path in (b"one", b"two"):
                writer.write(GET % path)  # the next only once the answer is read
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
                assert head.startswith(b"HTTP/1.1 200 ")
                await asyncio.wait_for(reader.readexactly(2), 10)  # "ok"
        finally:
            writer.close()
    assert counts == [1, 2]
    assert len(handlers) == 1  # one connection, one handler


async def test_handler_messages_hold_the_parsed_requests_in_line() -> None:
    seen: list[Any] = []

    async def handler(request: web.Request) -> web.Response:
        if request.path == "/first":
            seen.append(list(state(request.protocol, "aio_messages")))
            assert isinstance(state(request.protocol, "aio_messages"), deque)
        return web.Response(text="ok")

    async with aiohttp_server(handler) as (_, port):
        answers = await send(port, GET % b"first" + LAST % b"second")
    assert statuses(answers) == [200, 200]
    [[(message, payload)]] = seen  # the second request, waiting its turn
    assert isinstance(message, RawRequestMessage)
    assert message.path == "/second"
    assert isinstance(payload, StreamReader)


async def test_handler_request_in_progress_while_a_handler_runs() -> None:
    seen: list[bool] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(state(request.protocol, "aio_request_in_progress"))
        return web.Response(text="ok")

    async with aiohttp_server(handler) as (runner, port):
        await send(port, LAST % b"x")
        assert runner.server is not None
        assert state(runner.server(), "aio_request_in_progress") is False  # idle
    assert seen == [True]


async def test_err_info_in_a_requests_place_is_answered_in_turn() -> None:
    async def handler(request: web.Request) -> web.Response:
        if request.path == "/first":
            # What Prism does to a request that is not HTTP/1.x, after the parser took it.
            queue = state(request.protocol, "aio_messages")
            exc = BadHttpMessage("not an HTTP/1.0 or HTTP/1.1 request")
            queue[0] = (ErrInfo(400, exc, exc.message), EMPTY_PAYLOAD)
        return web.Response(text="ok")

    async with aiohttp_server(handler) as (_, port):
        answers = await send(port, GET % b"first" + GET % b"second")
    assert statuses(answers) == [200, 400]
    info = ErrInfo(400, BadHttpMessage("x"), "x")
    assert (info.status, type(info.exc), info.message) == (400, BadHttpMessage, "x")


async def test_bad_http_message_is_the_parsers_rejection_of_too_many_headers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert issubclass(BadHttpMessage, HttpProcessingError)
    assert BadHttpMessage("why").message == "why"
    headers = b"".join(b"X-%d: y\r\n" % i for i in range(200))

    async def handler(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    with caplog.at_level(logging.ERROR, "aiohttp.server"):
        async with aiohttp_server(handler) as (_, port):
            answer = await send(port, b"GET / HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
    assert statuses(answer) == [400]
    [exc] = [r.exc_info[1] for r in caplog.records if r.exc_info]
    assert type(exc) is BadHttpMessage  # Prism tells it apart by its text:
    assert "too many headers" in str(exc).lower()


async def test_line_too_long_is_the_parsers_rejection_of_an_oversized_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert issubclass(LineTooLong, BadHttpMessage)

    async def handler(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    with caplog.at_level(logging.ERROR, "aiohttp.server"):
        async with aiohttp_server(handler) as (_, port):
            answer = await send(port, b"GET / HTTP/1.1\r\nX-Long: " + b"y" * 9000 + b"\r\n\r\n")
    assert statuses(answer) == [400]
    [exc] = [r.exc_info[1] for r in caplog.records if r.exc_info]
    assert isinstance(exc, LineTooLong)


@pytest.mark.parametrize("response_class", [web.StreamResponse, DeferredHeadersResponse])
async def test_send_headers_immediately_holds_headers_for_the_first_write(
    response_class: type[web.StreamResponse],
) -> None:
    assert web.StreamResponse._send_headers_immediately is True
    prepared, go_on = asyncio.Event(), asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        response = response_class()
        await response.prepare(request)
        prepared.set()
        await go_on.wait()
        await response.write(b"first")
        await response.write_eof()
        return response

    loop = asyncio.get_running_loop()
    async with aiohttp_server(handler) as (_, port):
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(LAST % b"x")
            sock.setblocking(False)
            await asyncio.wait_for(prepared.wait(), 10)
            if response_class is web.StreamResponse:
                await asyncio.wait_for(readable(sock), 10)  # the headers come, unasked
            # On loopback a write is in the peer's buffer when it returns: what
            # prepare() sent is there now.
            try:
                early = sock.recv(1, socket.MSG_PEEK)
            except BlockingIOError:
                early = b""
            go_on.set()
            answer = b""
            while chunk := await asyncio.wait_for(loop.sock_recv(sock, 65536), 10):
                answer += chunk
    assert statuses(answer) == [200]
    assert answer.rstrip().endswith(b"first\r\n0")
    # aiohttp's default sends them on prepare; Prism's stream holds them.
    assert early == (b"H" if response_class is web.StreamResponse else b"")


async def readable(sock: socket.socket) -> None:
    """Wait until ``sock`` has bytes to read (without reading them)."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    loop.add_reader(sock.fileno(), ready.set_result, None)
    try:
        await ready
    finally:
        loop.remove_reader(sock.fileno())


@contextlib.asynccontextmanager
async def started_site(backlog: int) -> AsyncIterator[tuple[web.AppRunner, web.TCPSite]]:
    runner = web.AppRunner(web.Application(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=backlog)
    await site.start()
    try:
        yield runner, site
    finally:
        await runner.cleanup()


async def test_site_runner_is_the_runner_it_was_built_with() -> None:
    async with started_site(17) as (runner, site):
        assert state(site, "aio_runner") is runner


async def test_site_backlog_is_the_backlog_it_was_given() -> None:
    async with started_site(17) as (_, site):
        assert state(site, "aio_backlog") == 17


async def test_site_server_is_what_stop_closes() -> None:
    async with started_site(17) as (_, site):
        server = state(site, "aio_server")
        assert isinstance(server, asyncio.AbstractServer)
        assert server.is_serving()
        await site.stop()
        assert not server.is_serving()


def test_handler_takes_the_options_a_site_passes() -> None:
    parameters = inspect.signature(web.RequestHandler.__init__).parameters
    assert list(parameters)[:2] == ["self", "manager"]
    for name in ("loop", "keepalive_timeout", "access_log", "lingering_time"):
        assert parameters[name].kind is inspect.Parameter.KEYWORD_ONLY, name


def test_overridden_handler_methods_keep_their_signatures() -> None:
    finish = inspect.signature(web.RequestHandler.finish_response)
    assert list(finish.parameters) == ["self", "request", "resp", "start_time"]
    assert inspect.iscoroutinefunction(web.RequestHandler.finish_response)
    handle_error = inspect.signature(web.RequestHandler.handle_error)
    assert list(handle_error.parameters) == ["self", "request", "status", "exc", "message"]


async def test_listen_refuses_an_aiohttp_without_a_needed_internal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gone = Internal(web.RequestHandler, "_gone", "3.12", "for this test")
    optional = Internal(web.RequestHandler, "_also_gone", "3.12", "a cost", required=False)
    monkeypatch.setattr(
        aiohttp_internals, "INTERNALS", (*aiohttp_internals.INTERNALS, gone, optional)
    )
    with pytest.raises(AiohttpInternalMissing) as raised:
        await listen(web.Application(), "127.0.0.1", 0, grace_s=0)
    message = str(raised.value)
    assert "RequestHandler._gone, which Prism's HTTP server relies on" in message
    assert message.endswith(f"install {SUPPORTED}")
    assert "_also_gone" not in message  # Prism answers the same without it


def test_a_missing_internal_is_named_where_it_is_used() -> None:
    gone = Internal(web.RequestHandler, "_gone", "3.12", "for this test")
    gone_name = Internal(web_protocol, "_Gone", "3.12", "for this test")

    class Holder:
        aio_gone = aiohttp_internals._take(gone)

    with pytest.raises(AiohttpInternalMissing, match=r"lacks RequestHandler\._gone"):
        Holder().aio_gone  # noqa: B018
    with pytest.raises(AiohttpInternalMissing, match=r"lacks aiohttp\.web_protocol\._Gone"):
        aiohttp_internals._take(gone_name)()
