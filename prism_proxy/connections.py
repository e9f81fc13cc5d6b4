"""The HTTP server's connections: deadlines, a cap, and the parser's rejections in JSON.

aiohttp closes an idle keep-alive connection, but a connection that trickles
its request head one byte at a time holds a file handle for as long as it
likes, and the parser's own rejections are answered in plain text (echoing
the offending bytes) with a traceback in the log.  :class:`GuardedHandler`
closes both gaps; :class:`GuardedSite` listens with it.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
import time
from collections.abc import Callable
from typing import Any

import attrs
import cachetools
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, HttpProcessingError, LineTooLong
from aiohttp.streams import StreamReader

from .answers import error_response
from .errors import PrismError
from .wire import OPENAI

__all__ = ["ConnectionGuard", "GuardedHandler", "GuardedSite", "RejectionLog", "default_limit"]

log = logging.getLogger("prism.http")

#: Share of the open-file soft limit that connections may take by default.  A
#: caller's call in flight holds an upstream connection too, so callers get a bit
#: under half; the rest is for those, state files and the ledger.  Above it a
#: caller gets 503 ``too_many_connections`` at once, instead of the gateway
#: running out of files and failing upstream connects (evidence against
#: upstreams that did nothing wrong).
FILE_SHARE = 0.45
SERVER = "prism"


def default_limit() -> tuple[int, int]:
    """The default connection cap and the open-file soft limit it comes from."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(1, int(soft * FILE_SHARE)), soft


def _raw_answer(status: int, reason: str, err: PrismError) -> bytes:
    """A whole HTTP/1.1 answer written straight to a transport (no request was parsed)."""
    body = OPENAI.error_body(err)
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\nServer: {SERVER}\r\n\r\n"
    )
    return head.encode("ascii") + body


TOO_MANY_CONNECTIONS = _raw_answer(
    503,
    "Service Unavailable",
    PrismError(
        503,
        "too_many_connections",
        "the gateway is at its connection limit; retry shortly",
        type="api_error",
    ),
)
HEAD_TIMEOUT = _raw_answer(
    408,
    "Request Timeout",
    PrismError(408, "request_timeout", "the request line and headers did not arrive in time"),
)


@attrs.define(eq=False)
class RejectionLog:
    """One WARNING line per rejected HTTP message, at most one per peer per second.

    A line after a quiet spell says how many were suppressed before it.
    The peer table is bounded: a flood from many addresses cannot grow it.
    """

    interval_s: float = 1.0
    clock: Callable[[], float] = time.monotonic
    _peers: cachetools.TTLCache[str, list[float]] = attrs.field(
        factory=lambda: cachetools.TTLCache(maxsize=4096, ttl=60.0)
    )

    def rejected(self, peer: str, reason: str) -> None:
        now = self.clock()
        seen = self._peers.get(peer)
        if seen is not None and now - seen[0] < self.interval_s:
            seen[1] += 1
            return
        suppressed = int(seen[1]) if seen is not None else 0
        self._peers[peer] = [now, 0]
        if suppressed:
            log.warning(
                "rejected HTTP message from %s: %s (%d more suppressed)", peer, reason, suppressed
            )
        else:
            log.warning("rejected HTTP message from %s: %s", peer, reason)


@attrs.define(eq=False)
class ConnectionGuard:
    """What every connection of one listener shares: its limits and the open count."""

    header_timeout_s: float
    max_connections: int
    counters: dict[str, int] | None = None
    rejections: RejectionLog = attrs.field(factory=RejectionLog)
    open: int = 0

    def count(self, event: str) -> None:
        if self.counters is not None:
            self.counters[event] = self.counters.get(event, 0) + 1


#: The parser's rejections: the status, the code and a fixed description (the
#: parser's own message quotes the request's bytes, which an answer never echoes).
def _rejection(exc: BaseException | None) -> tuple[int, str, str]:
    if isinstance(exc, LineTooLong):
        return 431, "header_too_large", "a request line or header is too long"
    if isinstance(exc, BadHttpMessage) and "too many headers" in str(exc).lower():
        return 431, "too_many_headers", "the request has too many headers"
    name = type(exc).__name__ if exc is not None else "unknown"
    return 400, "bad_http_message", f"the request is not valid HTTP/1.1 ({name})"


class GuardedHandler(web.RequestHandler):
    """aiohttp's connection handler, with the guard's deadlines and cap.

    The head clock runs from a connection's start, and on a kept-alive
    connection from the first byte of each later head, until the head is
    whole.  A head that arrives in one read (the usual case) never starts it.
    """

    __slots__ = ("_admitted", "_body", "_guard", "_head_timer")

    def __init__(self, manager: web.Server, *, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._guard = guard
        self._admitted = False
        self._head_timer: asyncio.TimerHandle | None = None
        self._body: StreamReader | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        guard = self._guard
        if guard.open >= guard.max_connections:
            guard.count("connections_refused")
            self._manager = None  # never registered: connection_lost has nothing to undo
            assert isinstance(transport, asyncio.WriteTransport)
            transport.write(TOO_MANY_CONNECTIONS)
            transport.close()
            return
        guard.open += 1
        self._admitted = True
        super().connection_made(transport)
        self._start_head_clock()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._admitted:
            self._admitted = False
            self._guard.open -= 1
        self._stop_head_clock()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._admitted:
            return
        heads = self._request_count
        super().data_received(data)
        if self._request_count != heads:
            self._stop_head_clock()
            # The newest request's body: bytes that follow belong to it until it ends.
            self._body = self._messages[-1][1] if self._messages else None
        elif (
            self._head_timer is None
            and not self._request_in_progress
            and not self._messages
            and (self._body is None or self._body.is_eof())
        ):
            self._start_head_clock()

    def _start_head_clock(self) -> None:
        self._head_timer = self._loop.call_later(self._guard.header_timeout_s, self._head_late)

    def _stop_head_clock(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        transport = self.transport
        if transport is None or self._request_in_progress or self._messages:
            return
        self._guard.count("header_timeouts")
        transport.write(HEAD_TIMEOUT)
        self.force_close()

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """One JSON answer and one log line; never the parser's message, never a traceback."""
        if request.writer.output_size > 0:
            raise ConnectionError("the answer had started; it cannot become an error")
        if isinstance(exc, HttpProcessingError):
            status, code, text = _rejection(exc)
            peer = self._peer()
            self._guard.rejections.rejected(peer, f"{code}: {type(exc).__name__}")
            self._guard.count("http_rejections")
            err = PrismError(status, code, text)
        elif status == 504:
            err = PrismError(504, "handler_timeout", "the request took too long", type="api_error")
        else:
            self.log_exception("unexpected failure handling a request", exc_info=exc)
            err = PrismError(
                status, "internal_error", "Prism failed unexpectedly", type="api_error"
            )
        response = error_response(err, headers={"Server": SERVER})
        response.force_close()
        return response

    def _peer(self) -> str:
        peer = self.transport.get_extra_info("peername") if self.transport else None
        if isinstance(peer, tuple) and peer:
            return str(peer[0])
        return "unknown"


class GuardedSite(web.BaseSite):
    """A TCP listener whose connections are :class:`GuardedHandler` s.

    It serves on ``sock``, a socket already bound and listening (see
    :func:`prism_proxy.server.bind`): the port is taken before the app's
    start-up runs, so a busy port stops nothing half-started.  Stopping the
    site closes the socket.
    """

    __slots__ = ("_guard", "_handler_args", "_sock")

    def __init__(
        self,
        runner: web.BaseRunner,
        sock: socket.socket,
        *,
        guard: ConnectionGuard,
        keepalive_timeout_s: float,
        backlog: int,
    ) -> None:
        super().__init__(runner, backlog=backlog)
        self._sock = sock
        self._guard = guard
        self._handler_args: dict[str, Any] = {
            "keepalive_timeout": keepalive_timeout_s,
            "access_log": None,
            # A body left unread (an early error answer) is drained no longer than
            # a head may take to arrive, then the connection closes.
            "lingering_time": guard.header_timeout_s,
        }

    @property
    def name(self) -> str:
        host, port = self._sock.getsockname()[:2]
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        guard, args = self._guard, self._handler_args

        def protocol() -> GuardedHandler:
            return GuardedHandler(server, loop=loop, guard=guard, **args)

        self._server = await loop.create_server(protocol, sock=self._sock, backlog=self._backlog)
