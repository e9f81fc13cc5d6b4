"""The HTTP server's connections: deadlines, a cap, and the parser's rejections in JSON.

aiohttp closes an idle keep-alive connection, but a connection that trickles
its request head one byte at a time holds a file handle for as long as it
likes, and the parser's own rejections are answered in plain text (echoing
the offending bytes) with a traceback in the log.  :class:`GuardedHandler`
closes both gaps; :class:`GuardedSite` listens with it.

At the cap, slow heads must not crowd out callers: a newcomer takes the place
of the connection that has waited longest for its request head (see
:meth:`ConnectionGuard.make_room`), and is refused only when none may give way.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import resource
import socket
import time
from collections.abc import Callable
from typing import Any, cast

import attrs
import cachetools
from aiohttp import web
from aiohttp.http import HttpVersion10, HttpVersion11, RawRequestMessage
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.streams import EMPTY_PAYLOAD, StreamReader

from .aiohttp_internals import (
    BadHttpMessage,
    ErrInfo,
    HandlerInternals,
    LineTooLong,
    SiteInternals,
)
from .answers import client_wire, error_response
from .call import new_id
from .errors import PrismError
from .record import REQUEST_ID_HEADER

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
#: At the cap, a connection still waiting for its request head is kept this
#: long before a newcomer may take its place (unless the newcomer's own head has
#: arrived whole): time for a caller on a slow link to send its head.
SHED_GRACE_S = 1.0
#: How much of a newcomer's first bytes are looked at for a whole request head.
PEEK_BYTES = 8192
#: How much a connection closed at once may have sent unread (more, and it is reset).
DISCARD_BYTES = 65536
HEAD_END = b"\r\n\r\n"


def default_limit() -> tuple[int, int]:
    """The default connection cap and the open-file soft limit it comes from."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(1, int(soft * FILE_SHARE)), soft


@attrs.frozen
class RawAnswer:
    """A whole HTTP/1.1 answer written straight to a transport (no request was parsed).

    Built once; each one written gets its own request id, as every answer does.
    """

    head: bytes
    tail: bytes

    @classmethod
    def of(cls, status: int, reason: str, err: PrismError) -> RawAnswer:
        body = client_wire(None).error_body(err)
        head = (
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\nServer: {SERVER}\r\n"
            f"{REQUEST_ID_HEADER}: "
        )
        return cls(head.encode("ascii"), b"\r\n\r\n" + body)

    def bytes(self) -> bytes:
        return self.head + new_id("req_").encode("ascii") + self.tail


TOO_MANY_CONNECTIONS = RawAnswer.of(
    503,
    "Service Unavailable",
    PrismError(
        503,
        "too_many_connections",
        "the gateway is at its connection limit; retry shortly",
        type="api_error",
    ),
)
HEAD_TIMEOUT = RawAnswer.of(
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
    #: Admitted connections waiting for a request head, the longest waiting first,
    #: with the loop time their wait began.
    waiting: collections.OrderedDict[GuardedHandler, float] = attrs.field(
        factory=collections.OrderedDict
    )
    #: Connections turned away, by event (also in ``counters``, which may be absent).
    turned_away: collections.Counter[str] = attrs.field(factory=collections.Counter)

    def count(self, event: str) -> None:
        if self.counters is not None:
            self.counters[event] = self.counters.get(event, 0) + 1

    def make_room(self, transport: asyncio.BaseTransport, now: float) -> bool:
        """Whether a new connection may be served: under the cap, or at it with room made.

        At the cap, the connection that has waited longest for its request
        head is closed for the newcomer when it has had :data:`SHED_GRACE_S`,
        or at once when the newcomer's whole head has already arrived.  Slow
        heads, however many and however often they reconnect, then hold only
        the slots nobody else needs, while a caller who sends its request gets
        in; connections in the middle of a request are never closed for it.
        """
        if self.open < self.max_connections:
            return True
        oldest = next(iter(self.waiting.items()), None)
        if oldest is None:
            return False
        handler, since = oldest
        # Peeking costs a few system calls: only when it decides anything.
        if now - since < SHED_GRACE_S and not _head_arrived(transport):
            return False
        handler.shed(now - since)
        return True

    def refuse(self, transport: asyncio.BaseTransport) -> None:
        """Turn a newcomer away: no connection could give way to it."""
        said = self._turn_away(transport, "connections_refused")
        if said:
            log.warning(
                "refused a connection from %s: all %d connections are in use "
                "(%d refused so far; counted as connections_refused)",
                _peer(transport),
                self.max_connections,
                said,
            )

    def shed_one(self, transport: asyncio.BaseTransport, waited_s: float) -> None:
        """Close a connection that gave way to a newcomer."""
        said = self._turn_away(transport, "connections_shed")
        if said:
            log.warning(
                "closed a connection from %s after %.1f s without a whole request head, "
                "to admit a new one at the limit of %d (%d so far; counted as "
                "connections_shed)",
                _peer(transport),
                waited_s,
                self.max_connections,
                said,
            )

    def _turn_away(self, transport: asyncio.BaseTransport, event: str) -> int:
        """503 ``too_many_connections``, one write and a close; counted.

        Returns the count so far when it is worth a log line (the 1st, 2nd,
        4th, 8th…: a flood is said, and said again as it grows, in a few
        lines), else 0.
        """
        self.count(event)
        self.turned_away[event] += 1
        _close_with(transport, TOO_MANY_CONNECTIONS.bytes())
        so_far = self.turned_away[event]
        return so_far if so_far & (so_far - 1) == 0 else 0


def _close_with(transport: asyncio.BaseTransport, answer: bytes) -> None:
    """Write ``answer`` and close, so that the peer can read it.

    What the peer sent and nobody read is read and dropped first: closing a
    socket with unread bytes resets the connection, and the reset may reach
    the peer before it has read the answer.
    """
    # Any stream transport writes (uvloop's is no asyncio.WriteTransport subclass);
    # close() sends what was written, then closes.
    stream = cast(asyncio.Transport, transport)
    stream.write(answer)
    _unread(transport, DISCARD_BYTES, consume=True)
    stream.close()


def _declares_body(head: bytes) -> bool:
    # A mention anywhere (even in another header's value) only means no cut.
    lowered = head.lower()
    return b"content-length:" in lowered or b"transfer-encoding:" in lowered


def _peer(transport: asyncio.BaseTransport | None) -> str:
    peer = transport.get_extra_info("peername") if transport is not None else None
    if isinstance(peer, tuple) and peer:
        return str(peer[0])
    return "unknown"


def _head_arrived(transport: asyncio.BaseTransport) -> bool:
    """Whether a new connection's whole request head is already waiting to be read.

    Only looked at (``MSG_PEEK``): the parser reads it as usual.
    """
    return HEAD_END in _unread(transport, PEEK_BYTES, consume=False)


def _unread(transport: asyncio.BaseTransport, size: int, *, consume: bool) -> bytes:
    """Up to ``size`` bytes the peer sent that were not read yet, without waiting.

    Neither asyncio's nor uvloop's socket stand-in offers ``recv``, so a socket
    object borrows the descriptor for one call and gives it back (``detach``:
    it never closes what it does not own).
    """
    sock = transport.get_extra_info("socket")
    if sock is None:
        return b""
    flags = socket.MSG_DONTWAIT if consume else socket.MSG_DONTWAIT | socket.MSG_PEEK
    try:
        borrowed = socket.socket(sock.family, sock.type, 0, sock.fileno())
    except OSError:
        return b""
    try:
        return borrowed.recv(size, flags)
    except OSError:
        return b""
    finally:
        borrowed.detach()


#: The parser's rejections: the status, the code and a fixed description (the
#: parser's own message quotes the request's bytes, which an answer never echoes).
def _rejection(exc: BaseException | None) -> tuple[int, str, str]:
    if isinstance(exc, LineTooLong):
        return 431, "header_too_large", "a request line or header is too long"
    if isinstance(exc, BadHttpMessage) and "too many headers" in str(exc).lower():
        return 431, "too_many_headers", "the request has too many headers"
    name = type(exc).__name__ if exc is not None else "unknown"
    return 400, "bad_http_message", f"the request is not valid HTTP/1.1 ({name})"


class GuardedHandler(HandlerInternals):
    """aiohttp's connection handler, with the guard's deadlines and cap.

    The head clock runs from a connection's start, and on a kept-alive
    connection from the first byte of each later head, until the head is
    whole.  A head that arrives in one read (the usual case) never starts it.
    While it runs, the connection is in the guard's ``waiting`` line: at the
    cap, the first in line gives way to a newcomer.
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
        if not guard.make_room(transport, self.aio_loop.time()):
            self.aio_manager = None  # never registered: connection_lost has nothing to undo
            guard.refuse(transport)
            return
        guard.open += 1
        self._admitted = True
        super().connection_made(transport)
        self._start_head_clock()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._release()
        super().connection_lost(exc)

    def _release(self) -> None:
        """Give the connection's slot back (once), and leave the waiting line."""
        if self._admitted:
            self._admitted = False
            self._guard.open -= 1
        self._stop_head_clock()

    def shed(self, waited_s: float) -> None:
        """Close this connection for a newcomer at the cap; its slot is free at once."""
        transport = self.transport
        self._release()
        if transport is not None:
            self._guard.shed_one(transport, waited_s)
        self.force_close()

    def data_received(self, data: bytes) -> None:
        if not self._admitted:
            return
        heads = self.aio_request_count
        self._feed(data)
        if self.aio_request_count != heads:
            self._stop_head_clock()
            # The newest request's body: bytes that follow belong to it until it ends.
            self._body = self.aio_messages[-1][1] if self.aio_messages else None
        elif (
            self._head_timer is None
            and not self.aio_request_in_progress
            and not self.aio_messages
            and (self._body is None or self._body.is_eof())
        ):
            self._start_head_clock()

    def _feed(self, data: bytes) -> None:
        """Parse ``data``, a head at a time while the heads declare no body.

        The parser drops every request of a read in which it then meets bytes
        that are not HTTP; fed apart, the pipelined requests before such bytes
        are answered, then the 400.  Cutting at a head's end changes nothing
        else (the parser is incremental).  A head with a body is fed with what
        follows it, as before: a body's own framing error must come with its
        head (the parser, meeting it later, drops the body and its handler
        would wait for it), and a body full of blank lines costs one feed.
        """
        start = 0
        # A body's bytes (the usual later read) are not searched.
        while self._body is None or self._body.is_eof():
            cut = data.find(HEAD_END, start) + len(HEAD_END)
            if cut < len(HEAD_END) or cut >= len(data):
                break  # no head ends here, or the read ends with it: one feed
            head = data[start:cut]
            if _declares_body(head):
                break
            heads = self.aio_request_count
            super().data_received(head)
            start = cut
            if self.aio_request_count == heads:
                break  # not a head's end (a body's bytes): the rest in one go
            if not self._vet(heads):
                return  # the connection's last answer is a 400: nothing more is parsed
        heads = self.aio_request_count
        super().data_received(data[start:] if start else data)
        self._vet(heads)

    def _vet(self, heads: int) -> bool:
        """Refuse, in turn, a request that is not HTTP/1.x; False once one is refused.

        The parser takes a request line without a version as HTTP/0.9 (and
        answers in kind), and takes HTTP/2.0 on an HTTP/1 connection; both
        get the parser's own 400 instead.
        """
        queue = self.aio_messages
        for i in range(len(queue) - (self.aio_request_count - heads), len(queue)):
            message = queue[i][0]
            if not isinstance(message, RawRequestMessage):
                return False  # the parser failed: the rest of the connection is not read
            if message.version != HttpVersion11 and message.version != HttpVersion10:
                exc = BadHttpMessage("not an HTTP/1.0 or HTTP/1.1 request")
                # aiohttp's own "the parser rejected this", in the request's place: it is
                # answered by handle_error in turn, after the requests before it.
                queue[i] = (ErrInfo(400, exc, exc.message), EMPTY_PAYLOAD)
                return False
        return True

    def _start_head_clock(self) -> None:
        loop = self.aio_loop
        self._head_timer = loop.call_later(self._guard.header_timeout_s, self._head_late)
        self._guard.waiting[self] = loop.time()

    def _stop_head_clock(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
            self._guard.waiting.pop(self, None)

    def _head_late(self) -> None:
        self._head_timer = None
        self._guard.waiting.pop(self, None)
        transport = self.transport
        if transport is None or self.aio_request_in_progress or self.aio_messages:
            return
        self._guard.count("header_timeouts")
        transport.write(HEAD_TIMEOUT.bytes())
        self.force_close()

    async def finish_response(
        self, request: web.BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        """Send the answer; an answer that closes the connection ends it for the caller at once.

        When the request's body is left unread (a 413, a 408), aiohttp drains
        it for a while before closing, so that an honest caller still sending
        reads its answer instead of a reset.  Sending the end of the stream
        (FIN) right after the answer lets a caller reading until the end (or one
        that lied about its ``Content-Length``) see it whole without waiting for
        that drain.
        """
        sent = await super().finish_response(request, resp, start_time)
        transport = self.transport
        if (
            transport is not None
            and not resp.keep_alive
            and not request.content.is_eof()
            and not transport.is_closing()
            and transport.can_write_eof()
        ):
            transport.write_eof()
        return sent

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
            self._guard.rejections.rejected(_peer(self.transport), f"{code}: {type(exc).__name__}")
            self._guard.count("http_rejections")
            err = PrismError(status, code, text)
        elif status == 504:
            err = PrismError(504, "handler_timeout", "the request took too long", type="api_error")
        else:
            self.log_exception("unexpected failure handling a request", exc_info=exc)
            err = PrismError(
                status, "internal_error", "Prism failed unexpectedly", type="api_error"
            )
        headers = {"Server": SERVER, REQUEST_ID_HEADER: new_id("req_")}
        response = error_response(err, request=request, headers=headers)
        response.force_close()
        return response


class GuardedSite(SiteInternals):
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
        server = self.aio_runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        guard, args = self._guard, self._handler_args

        def protocol() -> GuardedHandler:
            return GuardedHandler(server, loop=loop, guard=guard, **args)

        self.aio_server = await loop.create_server(
            protocol, sock=self._sock, backlog=self.aio_backlog
        )
