"""The HTTP/1.1 client providers reach upstreams with: pooled keep-alive connections.

``aiohttp.ClientSession`` builds a request object, a URL object, a header
multidict, a timer context and a response object per call, in Python: on a
short chat call it cost more CPU than the rest of Prism's own work.  A
provider sends the same few POSTs with headers fixed at start-up, so this
client writes each request as one prepared header block plus the body, and
lets httptools (llhttp, the parser Node.js uses) parse the answer.

What it keeps of aiohttp's client: a pool of keep-alive connections per
provider (at most ``limit`` open, callers beyond it wait for one), a connect
timeout, idle connections closed after ``idle_s``, TLS with the system's
trust store, ``gzip``/``deflate`` answers decoded, the egress proxy of the
environment or the provider's ``proxy`` option (:mod:`.egress`), and aiohttp's exceptions
(``ServerDisconnectedError``, ``ClientPayloadError``,
``ConnectionTimeoutError``, or the ``OSError`` of a failed connect), so a
failed attempt is classified as before.  Against a hostile upstream: the
header block is capped at :data:`MAX_HEADER_BYTES`, a stream's unread bytes
at :data:`HIGH_WATER` (reading pauses until the relay catches up), and an
answer the parser rejects drops the connection.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import zlib
from collections.abc import Mapping
from typing import Any, cast
from urllib.parse import urlsplit

import aiohttp
import attrs
import cachetools
import httptools
from multidict import CIMultiDict, CIMultiDictProxy

from .egress import DIRECT, Egress, Proxy, ProxyError, connect_proxy, open_tunnel

__all__ = ["HIGH_WATER", "MAX_HEADER_BYTES", "UpstreamClient", "WireResponse"]

#: The most header bytes an answer may carry (aiohttp's own limits allow about as much).
MAX_HEADER_BYTES = 64 * 1024
#: Unread answer bytes at which reading pauses until the consumer catches up.
HIGH_WATER = 256 * 1024
#: The most (URL, header set) pairs a pool keeps prepared, the oldest going first.
#: First in, first out rather than least used: an LRU hit hashes its key again to
#: reorder, a tuple of headers on every call, and these keys are few and fixed.
_PREPARED_CACHE = 1024
_ACCEPT_ENCODING = "gzip, deflate"


#: A pool's connections are told apart by the upstream they reach.
_Key = tuple[str, int, bool]
#: A request as a provider makes it: its URL and its headers.
_Request = tuple[str, tuple[tuple[str, str], ...]]
#: Headers the client writes itself, refused in a provider's.
_OWN_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "proxy-authorization"}
)


@attrs.frozen
class _Target:
    """Where a URL's requests go, parsed once."""

    host: str
    port: int
    tls: bool
    #: The egress proxy the requests go through, or None for direct.
    proxy: Proxy | None

    @property
    def key(self) -> _Key:
        return (self.host, self.port, self.tls)


class WireResponse:
    """An upstream answer whose headers have arrived (the ``UpstreamResponse`` contract)."""

    __slots__ = (
        "_chunks",
        "_complete",
        "_connection",
        "_decoder",
        "_error",
        "_paused",
        "_size",
        "_waiter",
        "_whole",
        "headers",
        "status",
    )

    def __init__(self, connection: _Connection, status: int, headers: CIMultiDict[str]) -> None:
        self._connection = connection
        self.status = status
        self.headers: Mapping[str, str] = CIMultiDictProxy(headers)
        self._chunks: collections.deque[bytes] = collections.deque()
        self._size = 0
        self._complete = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        #: Reading the whole body (``read``): never pause, the consumer wants it all.
        self._whole = False
        coding = headers.get("Content-Encoding", "").strip().lower()
        self._decoder: Any = None
        if coding in ("gzip", "x-gzip"):
            self._decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif coding == "deflate":
            self._decoder = zlib.decompressobj()
        elif coding not in ("", "identity"):
            raise aiohttp.ClientPayloadError(f"unsupported Content-Encoding {coding!r}")

    # -- fed by the connection ------------------------------------------------

    def _feed(self, data: bytes) -> None:
        if self._decoder is not None:
            try:
                data = self._decoder.decompress(data)
            except zlib.error:
                self._fail(aiohttp.ClientPayloadError("the body does not decode"))
                return
            if not data:
                return
        self._chunks.append(data)
        self._size += len(data)
        if self._size > HIGH_WATER and not self._whole and not self._paused:
            self._paused = True
            self._connection.pause()
        self._wake()

    def _end(self) -> None:
        if self._decoder is not None:
            tail = self._decoder.flush()
            if tail:
                self._chunks.append(tail)
        self._complete = True
        self._wake()

    def _fail(self, error: BaseException) -> None:
        if self._complete or self._error is not None:
            return
        self._error = error
        self._connection.close()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def _wait(self) -> None:
        waiter = self._waiter = self._connection.loop.create_future()
        await waiter

    def _took(self, size: int) -> None:
        self._size -= size
        if self._paused and self._size <= HIGH_WATER // 4:
            self._paused = False
            self._connection.resume()

    # -- the UpstreamResponse contract ----------------------------------------

    async def read(self) -> bytes:
        if self._paused:
            self._paused = False
            self._connection.resume()
        self._whole = True
        while not self._complete:
            if self._error is not None:
                raise self._error
            await self._wait()
        chunks = self._chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._size = 0
        return body

    def iter_chunks(self) -> WireResponse:
        return self

    def __aiter__(self) -> WireResponse:
        return self

    async def __anext__(self) -> bytes:
        while True:
            chunks = self._chunks
            if chunks:
                # Everything that has arrived, in one piece: the relay's unit of work.
                data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
                chunks.clear()
                self._took(len(data))
                return data
            if self._error is not None:
                raise self._error
            if self._complete:
                raise StopAsyncIteration
            await self._wait()

    def at_eof(self) -> bool:
        return self._complete and not self._chunks

    def close(self) -> None:
        if not self._complete and self._error is None:
            self._error = aiohttp.ClientConnectionError("the answer was closed")
            self._wake()
        self._connection.close()

    def release(self) -> None:
        if self._complete and not self._chunks and self._error is None:
            self._connection.done_with()
        else:
            self._connection.close()


class _Connection(asyncio.Protocol):
    """One keep-alive connection: at most one request on it at a time."""

    def __init__(self, pool: UpstreamClient, key: _Key, via: Proxy | None = None) -> None:
        self.pool = pool
        self.key = key
        #: The proxy that forwards this connection's requests (an http upstream's).
        self.via = via
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        #: Headers are arriving for the answer being received.
        self._headers: CIMultiDict[str] = CIMultiDict()
        self._header_bytes = 0
        #: Set once an answer's headers have arrived (None between requests).
        self._arrived: asyncio.Future[WireResponse] | None = None
        self.response: WireResponse | None = None
        self._until_close = False
        self._keep_alive = False

    # -- asyncio.Protocol ------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.close(aiohttp.ClientPayloadError("the upstream switched protocols"))
        except httptools.HttpParserError as exc:
            self.close(aiohttp.ClientPayloadError(f"not an HTTP answer: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool._lost(self)
        response = self.response
        if response is not None and not response._complete:
            if self._until_close and exc is None:
                response._end()  # the body ran to the connection's end, as it said
            else:
                response._fail(aiohttp.ClientPayloadError("the upstream closed the body early"))
        arrived = self._arrived
        if arrived is not None and not arrived.done():
            arrived.set_exception(aiohttp.ServerDisconnectedError())

    # -- httptools callbacks ---------------------------------------------------

    def on_message_begin(self) -> None:
        self._headers = CIMultiDict()
        self._header_bytes = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value)
        if self._header_bytes > MAX_HEADER_BYTES:
            raise httptools.HttpParserError(f"headers over {MAX_HEADER_BYTES} bytes")
        self._headers.add(name.decode("latin-1"), value.decode("latin-1"))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status < 200:
            return  # an interim answer (100, 103): the real one follows
        if status == 407 and self.via is not None:
            # Only a proxy asks for proxy credentials: the request never left it.
            self.close(ProxyError.refused(self.via, "the request", status))
            return
        headers = self._headers
        self._keep_alive = self.parser.should_keep_alive()
        self._until_close = (
            "Content-Length" not in headers
            and "chunked" not in headers.get("Transfer-Encoding", "").lower()
        )
        arrived = self._arrived
        if arrived is None or arrived.done():
            raise httptools.HttpParserError("an answer nobody asked for")
        try:
            self.response = WireResponse(self, status, headers)
        except aiohttp.ClientPayloadError as exc:
            self.close(exc)
            return
        arrived.set_result(self.response)

    def on_body(self, body: bytes) -> None:
        response = self.response
        if response is not None:
            response._feed(body)

    def on_message_complete(self) -> None:
        response = self.response
        if response is not None and self.parser.get_status_code() >= 200:
            response._end()

    # -- used by the pool and the response -------------------------------------

    def send(self, data: bytes) -> asyncio.Future[WireResponse]:
        assert self.transport is not None
        self.response = None
        arrived = self._arrived = self.loop.create_future()
        self.transport.write(data)
        return arrived

    def pause(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def done_with(self) -> None:
        """The answer was read to its end: back to the pool, if the upstream keeps it open."""
        self.response = None
        self._arrived = None
        if self.closed or not self._keep_alive:
            self.close()
        else:
            self.pool._put_back(self)

    def close(self, error: BaseException | None = None) -> None:
        """Our side ends the connection: whatever it was receiving is abandoned, and
        anyone still waiting for it is told, with ``error`` if given (an answer that
        is not one), else that the connection was closed (the client closing)."""
        response, arrived = self.response, self._arrived
        self.response = self._arrived = None
        gone = error or aiohttp.ClientConnectionError("the connection was closed")
        if arrived is not None and not arrived.done():
            arrived.set_exception(gone)
        if response is not None:
            response._fail(gone)  # nothing once it is complete or has failed already
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()
        self.pool._lost(self)


class UpstreamClient:
    """Pooled keep-alive HTTP/1.1 connections to one provider's upstreams.

    ``limit`` connections at most are open (in use or idle); a request
    beyond them waits for one to come back.  A connection idle ``idle_s``
    is closed.  One client per provider, used from one event loop.
    """

    def __init__(
        self,
        *,
        limit: int,
        connect_timeout_s: float,
        idle_s: float = 15.0,
        ssl_context: ssl.SSLContext | None = None,
        egress: Egress = DIRECT,
    ) -> None:
        self.limit = limit
        self.connect_timeout_s = connect_timeout_s
        self.idle_s = idle_s
        self.egress = egress
        self._ssl = ssl_context
        self._idle: dict[_Key, list[_Connection]] = {}
        #: Open connections, and a placeholder for each connect under way.
        self._open: set[object] = set()
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        #: Each (URL, headers) pair's target and request head up to the body's length.
        self._prepared: cachetools.FIFOCache[_Request, tuple[_Target, bytes]]
        self._prepared = cachetools.FIFOCache(_PREPARED_CACHE)
        self._sweep: asyncio.TimerHandle | None = None
        self._closed = False

    @property
    def open_connections(self) -> int:
        return len(self._open)

    async def post(self, url: str, headers: Mapping[str, str], payload: bytes) -> WireResponse:
        """POST ``payload``; return once the answer's headers have arrived."""
        request = (url, tuple(headers.items()))
        try:
            target, block = self._prepared[request]
        except KeyError:
            target, block = self._prepare(request)
        connection = await self._acquire(target)
        try:
            response = await connection.send(b"%s%d\r\n\r\n%s" % (block, len(payload), payload))
        except BaseException:
            connection.close()
            raise
        return response

    async def close(self) -> None:
        self._closed = True
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for connection in list(self._open):
            if isinstance(connection, _Connection):
                connection.close()
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    # -- requests --------------------------------------------------------------

    def _prepare(self, request: _Request) -> tuple[_Target, bytes]:
        """Where ``request``'s URL goes, and its head up to the body's length (made once)."""
        url, items = request
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise aiohttp.InvalidURL(url)
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        default_port = parts.port is None or port == (443 if tls else 80)
        host = parts.hostname
        host_header = (f"[{host}]" if ":" in host else host) + ("" if default_port else f":{port}")
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        _check_header_text(path, "the URL")
        proxy = self.egress.proxy_for(host, port, tls)
        lines = [f"POST {path} HTTP/1.1\r\n", f"Host: {host_header}\r\n"]
        if proxy is not None and not tls:
            # Forwarded by the proxy: the absolute form says where to (RFC 9112 §3.2.2).
            lines[0] = f"POST http://{host_header}{path} HTTP/1.1\r\n"
            if proxy.authorization is not None:
                lines.append(f"Proxy-Authorization: {proxy.authorization}\r\n")
        names = set()
        for name, value in items:
            _check_header_text(name, "a header name")
            _check_header_text(value, f"header {name}")
            lowered = name.lower()
            if lowered in _OWN_HEADERS:
                raise ValueError(f"header {name} is the HTTP client's to set")
            names.add(lowered)
            lines.append(f"{name}: {value}\r\n")
        if "accept-encoding" not in names:
            lines.append(f"Accept-Encoding: {_ACCEPT_ENCODING}\r\n")
        lines.append("Content-Length: ")
        prepared = (_Target(host, port, tls, proxy), "".join(lines).encode("latin-1"))
        self._prepared[request] = prepared
        return prepared

    # -- the pool --------------------------------------------------------------

    async def _acquire(self, target: _Target) -> _Connection:
        key = target.key
        while True:
            if self._closed:
                raise aiohttp.ClientConnectionError("the provider is closed")
            idle = self._idle.get(key)
            if idle:
                connection = idle.pop()
                if not connection.closed:
                    return connection
                continue
            if len(self._open) >= self.limit:
                self._evict_idle()  # an idle connection to another host gives up its place
            if len(self._open) < self.limit:
                return await self._connect(target)
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()  # pass the turn on: we are not taking it
                raise
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)

    async def _connect(self, target: _Target) -> _Connection:
        context: ssl.SSLContext | None = None
        if target.tls:
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            context = self._ssl
        # Counted before the connect: concurrent connects must not overshoot the limit.
        placeholder = object()
        self._open.add(placeholder)
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                connection = await self._open_connection(target, context)
        except BaseException as exc:
            self._open.discard(placeholder)
            self._wake_one()
            if isinstance(exc, TimeoutError):
                via = f" through {target.proxy.shown}" if target.proxy is not None else ""
                raise aiohttp.ConnectionTimeoutError(
                    f"connecting to {target.host}:{target.port}{via} took over "
                    f"{self.connect_timeout_s:g} s"
                ) from None
            raise
        self._open.discard(placeholder)
        if self._closed or connection.closed:
            connection.close()
            self._wake_one()
            raise aiohttp.ServerDisconnectedError()
        self._open.add(connection)
        return connection

    async def _open_connection(
        self, target: _Target, context: ssl.SSLContext | None
    ) -> _Connection:
        proxy = target.proxy
        if proxy is None:
            _, connection = await asyncio.get_running_loop().create_connection(
                lambda: _Connection(self, target.key),
                target.host,
                target.port,
                ssl=context,
                server_hostname=target.host if context is not None else None,
            )
        elif context is None:
            _, connection = await connect_proxy(
                proxy, lambda: _Connection(self, target.key, via=proxy)
            )
        else:
            connection = _Connection(self, target.key)
            await open_tunnel(proxy, target.host, target.port, connection, context)
        return connection

    def _evict_idle(self) -> None:
        for idle in self._idle.values():
            while idle:
                connection = idle.pop()
                if not connection.closed:
                    connection.close()
                    return

    def _put_back(self, connection: _Connection) -> None:
        connection.idle_since = connection.loop.time()
        self._idle.setdefault(connection.key, []).append(connection)
        self._wake_one()
        if self._sweep is None:
            self._sweep = connection.loop.call_later(self.idle_s, self._expire)

    def _lost(self, connection: _Connection) -> None:
        if connection in self._open:
            self._open.discard(connection)
            self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _expire(self) -> None:
        self._sweep = None
        loop = asyncio.get_running_loop()
        cutoff = loop.time() - self.idle_s
        left = False
        for key, idle in list(self._idle.items()):
            keep = []
            for connection in idle:
                if connection.closed:
                    continue
                if connection.idle_since <= cutoff:
                    connection.close()
                else:
                    keep.append(connection)
            if keep:
                self._idle[key] = keep
                left = True
            else:
                del self._idle[key]
        if left and not self._closed:
            self._sweep = loop.call_later(self.idle_s / 2, self._expire)


def _check_header_text(text: str, what: str) -> None:
    if "\r" in text or "\n" in text or "\0" in text:
        raise ValueError(f"{what} contains a line break")
